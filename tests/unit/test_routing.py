"""Routing (pure): which table each topic goes to, how its txns are named, and the config rules that keep
routes unambiguous."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kafka2delta.config import Config, load_config, table_key
from kafka2delta.errors import ConfigError
from kafka2delta.records import TopicPartition
from kafka2delta.routing import Routes


def config(**env: str) -> Config:
    return load_config(
        None, environ={"K2D_KAFKA__BOOTSTRAP_SERVERS": "b:9092", "K2D_DEAD_LETTERS__TABLE_URI": "/lake/_dlq", **env}
    )


def test_one_topic_one_table_keeps_todays_ids() -> None:
    routes = Routes(config(K2D_KAFKA__TOPIC="events", K2D_TABLE__URI="/lake/events"))
    spec = routes.table_for("events")
    assert (spec.uri, spec.name, spec.route) == ("/lake/events", "/lake/events", "table")
    assert spec.txn_ids.main(TopicPartition("events", 3)) == "events-3"
    assert routes.dead_letter_txn_ids("events").dead_letters(TopicPartition("events", 3)) == "events-dlq-3"
    explicit = Routes(config(K2D_KAFKA__TOPIC="events", K2D_TABLE__URI="/lake/e", K2D_TABLE__APP_ID="ingest"))
    assert explicit.table_for("events").txn_ids.main(TopicPartition("events", 3)) == "ingest-3"


def test_a_table_named_by_its_uri_is_named_without_its_password() -> None:
    """Found by review: the name labels metrics (served as they are) and fills the dead letters' ``table`` column."""
    uri = "https://admin:hunter2@delta.example.com/tables/events"
    spec = Routes(config(K2D_KAFKA__TOPIC="events", K2D_TABLE__URI=uri)).table_for("events")
    assert (spec.uri, spec.name) == (uri, "https://admin:***@delta.example.com/tables/events")


def test_a_uri_template_gives_each_topic_its_table() -> None:
    routes = Routes(config(K2D_KAFKA__TOPICS="orders,refunds", K2D_TABLE__URI="s3://lake/raw/{topic}"))
    orders, refunds = routes.table_for("orders"), routes.table_for("refunds")
    assert (orders.uri, refunds.uri) == ("s3://lake/raw/orders", "s3://lake/raw/refunds")
    assert not orders.txn_ids.multi_topic  # one topic per table: the ids stay <topic>-<partition>
    assert orders.txn_ids.main(TopicPartition("orders", 0)) == "orders-0"


def test_one_table_for_several_topics_names_the_topic_in_its_txns() -> None:
    routes = Routes(config(K2D_KAFKA__TOPICS="orders,refunds", K2D_TABLE__URI="/lake/all", K2D_TABLE__APP_ID="shop"))
    spec = routes.table_for("refunds")
    assert spec.txn_ids.multi_topic
    assert spec.txn_ids.main(TopicPartition("refunds", 1)) == "shop-refunds-1"
    assert spec.txn_ids.legacy_main(TopicPartition("refunds", 1)) == "shop-1"  # the ids of a one-topic past
    default = Routes(config(K2D_KAFKA__TOPIC_PATTERN="^cdc\\.", K2D_TABLE__URI="/lake/all"))
    assert default.table_for("cdc.x").txn_ids.main(TopicPartition("cdc.x", 1)) == "cdc.x-1"


def test_routes_first_match_wins_and_table_takes_the_rest() -> None:
    routes = Routes(
        config(
            K2D_KAFKA__TOPIC_PATTERN="^cdc\\.shop\\.",
            K2D_TABLE__URI="/lake/raw/{topic}",
            K2D_TABLE__SCHEMA='{"id": "string"}',
            K2D_TABLE__METADATA_COLUMNS="partition,offset",
            K2D_ROUTES='[{"name": "orders", "topic": "cdc.shop.orders", "uri": "/lake/orders",'
            ' "schema": {"id": "long not null", "total": "decimal(10,2)"}, "partition_by": ["id"]},'
            ' {"name": "audit", "topic_pattern": "\\\\.audit_", "uri": "/lake/audit", "schema_evolution": "merge"}]',
        )
    )
    orders = routes.table_for("cdc.shop.orders")
    assert (orders.name, orders.uri, orders.partition_by, orders.route) == (
        "orders",
        "/lake/orders",
        ("id",),
        "routes[0]",
    )
    assert dict(orders.columns) == {
        "id": "long not null",
        "total": "decimal(10,2)",
        "kafka_partition": "int",
        "kafka_offset": "long",
    }
    audit = routes.table_for("cdc.shop.audit_2026")
    assert (audit.name, audit.schema_evolution, audit.txn_ids.multi_topic) == ("audit", "merge", True)
    rest = routes.table_for("cdc.shop.customers")
    assert (rest.uri, rest.route, rest.schema_evolution) == ("/lake/raw/cdc.shop.customers", "table", "none")


def test_a_topic_no_route_takes_is_a_config_error_naming_routes() -> None:
    routes = Routes(config(K2D_KAFKA__TOPICS="a,b", K2D_ROUTES='[{"topic": "a", "uri": "/lake/a"}]'))
    assert routes.table_for("a").uri == "/lake/a"
    with pytest.raises(ConfigError, match="routes: no route takes topic 'b'"):
        routes.table_for("b")


def test_two_routes_to_one_table_share_it_and_must_agree_on_its_app_id() -> None:
    shared = '[{"topic": "a", "uri": "/lake/x"}, {"topic": "b", "uri": "/lake/x"}]'
    routes = Routes(config(K2D_KAFKA__TOPICS="a,b", K2D_ROUTES=shared))
    assert routes.table_for("a").txn_ids.multi_topic and routes.table_for("b").txn_ids.multi_topic
    clash = '[{"topic": "a", "uri": "/lake/x", "app_id": "one"}, {"topic": "b", "uri": "/lake/x", "app_id": "two"}]'
    with pytest.raises(ConfigError, match=r"routes\[1\]\.app_id"):
        Routes(config(K2D_KAFKA__TOPICS="a,b", K2D_ROUTES=clash))


def test_the_default_dead_letter_table_of_a_template_sits_beside_the_topic_tables() -> None:
    assert config(
        K2D_KAFKA__TOPICS="a,b", K2D_TABLE__URI="s3://lake/raw/{topic}", K2D_DEAD_LETTERS__TABLE_URI=""
    ).dead_letter_table_uri == ("s3://lake/raw/_dead_letters")
    assert (
        config(K2D_KAFKA__TOPIC="a", K2D_TABLE__URI="/lake/a", K2D_DEAD_LETTERS__TABLE_URI="").dead_letter_table_uri
        == "/lake/a_dead_letters"
    )


@pytest.mark.parametrize(
    ("env", "key", "problem"),
    [
        ({"K2D_KAFKA__TOPIC": "a", "K2D_KAFKA__TOPICS": "b"}, "kafka.topics", "only one of"),
        ({"K2D_KAFKA__TOPIC_PATTERN": "(unclosed"}, "kafka.topic_pattern", "not a regular expression"),
        ({"K2D_KAFKA__TOPICS": "a,a"}, "kafka.topics", "lists a topic twice"),
        ({"K2D_KAFKA__TOPICS": "a,b c"}, "kafka.topics[1]", "is not a Kafka topic name"),
        ({"K2D_KAFKA__TOPIC": "a", "K2D_TABLE__URI": "/lake/{stream}"}, "table.uri", "unknown placeholder {stream}"),
        ({"K2D_KAFKA__TOPICS": "a", "K2D_ROUTES": '[{"uri": "/x"}]'}, "routes[0].topic", "required"),
        ({"K2D_KAFKA__TOPICS": "a", "K2D_ROUTES": '[{"topic": "z", "uri": "/x"}]'}, "routes[0].topic", "not among"),
        (
            {"K2D_KAFKA__TOPICS": "a", "K2D_ROUTES": '[{"topic": "a", "topic_pattern": "a", "uri": "/x"}]'},
            "routes[0].topic_pattern",
            "not both",
        ),
        ({"K2D_KAFKA__TOPICS": "a", "K2D_ROUTES": '[{"topic": "a"}]'}, "routes[0].uri", "required"),
        ({"K2D_KAFKA__TOPICS": "a", "K2D_ROUTES": '{"topic": "a"}'}, "routes (from K2D_ROUTES)", "JSON array"),
        (
            {"K2D_KAFKA__TOPICS": "a", "K2D_ROUTES": '[{"topic": "a", "uri": "/x", "colour": "red"}]'},
            "routes[0].colour",
            "unknown key",
        ),
    ],
)
def test_route_and_subscription_errors_name_the_key(env: dict[str, str], key: str, problem: str) -> None:
    env = {"K2D_TABLE__URI": "/lake/t", **env} if "K2D_ROUTES" not in env else env
    with pytest.raises(ConfigError) as raised:
        config(**env)
    assert raised.value.key == key and problem in raised.value.problem


def test_routes_from_toml(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(
        """
[kafka]
bootstrap_servers = "b:9092"
topics = ["orders", "refunds"]

[[routes]]
name = "orders"
topic = "orders"
uri = "/lake/orders"

[[routes]]
topic = "refunds"
uri = "/lake/refunds"
metadata_columns = ["topic", "partition", "offset"]

[dead_letters]
table_uri = "/lake/_dead_letters"
"""
    )
    routes = Routes(load_config(path, environ={}))
    assert routes.table_for("orders").name == "orders"
    refunds = routes.table_for("refunds")
    assert (refunds.name, refunds.metadata_columns) == ("/lake/refunds", ("topic", "partition", "offset"))


def test_routes_without_a_table_uri_need_a_dead_letter_table() -> None:
    with pytest.raises(ConfigError, match=r"dead_letters\.table_uri: required when only \[\[routes\]\]"):
        load_config(
            None,
            environ={
                "K2D_KAFKA__BOOTSTRAP_SERVERS": "b:9092",
                "K2D_KAFKA__TOPICS": "a",
                "K2D_ROUTES": '[{"topic": "a", "uri": "s3://lake/a"}]',
            },
        )


def test_dead_letter_txns_name_the_topic_in_a_daemon_of_several_topics() -> None:
    """One dead-letter table takes every topic of the daemon: with an explicit app id and a table per topic,
    the topics must not share dead-letter txn ids (each one's commit would move the other's)."""
    routes = Routes(config(K2D_KAFKA__TOPICS="a,b", K2D_TABLE__URI="/lake/{topic}", K2D_TABLE__APP_ID="shop"))
    ids = {t: routes.dead_letter_txn_ids(t).dead_letters(TopicPartition(t, 0)) for t in "ab"}
    assert ids == {"a": "shop-a-dlq-0", "b": "shop-b-dlq-0"}
    assert routes.table_for("a").txn_ids.main(TopicPartition("a", 0)) == "shop-0"  # its own table: unchanged
    # The ids such a topic had as the daemon's only topic are still read (a daemon that gained topics).
    assert routes.dead_letter_txn_ids("a").legacy_dead_letters(TopicPartition("a", 0)) == "shop-dlq-0"
    single = Routes(config(K2D_KAFKA__TOPIC="a", K2D_TABLE__URI="/lake/a", K2D_TABLE__APP_ID="shop"))
    assert single.dead_letter_txn_ids("a").dead_letters(TopicPartition("a", 0)) == "shop-dlq-0"


def test_routes_writing_one_table_must_make_it_the_same_way() -> None:
    """One table has one schema, partitioning, evolution mode and set of metadata columns: a second route to
    it with others would be silently ignored, so the config is refused naming the route."""
    routes = '[{"topic": "a", "uri": "/lake/all"}, {"topic": "b", "uri": "/lake/all", "partition_by": ["day"]}]'
    with pytest.raises(ConfigError, match=r"routes\[1\]: writes the same table /lake/all as routes\[0\]"):
        Routes(config(K2D_KAFKA__TOPICS="a,b", K2D_ROUTES=routes, K2D_TABLE__SCHEMA='{"day": "string"}'))
    same = '[{"name": "A", "topic": "a", "uri": "/lake/all"}, {"name": "B", "topic": "b", "uri": "/lake/all"}]'
    assert Routes(config(K2D_KAFKA__TOPICS="a,b", K2D_ROUTES=same)).table_for("b").uri == "/lake/all"


def test_a_template_tables_uri_and_a_route_reaching_one_table_are_refused_at_start() -> None:
    """Found by review: ``/lake/{topic}`` for orders and a route of payments to ``/lake/orders`` wrote one table
    under one txn id per partition (``shop-0``): each topic's commit passed for the other's, messages lost."""
    collide = '[{"topic": "payments", "uri": "/lake/orders"}]'
    with pytest.raises(ConfigError) as raised:
        Routes(
            config(
                K2D_KAFKA__TOPICS="orders,payments",
                K2D_TABLE__URI="/lake/{topic}",
                K2D_TABLE__APP_ID="shop",
                K2D_ROUTES=collide,
            )
        )
    assert raised.value.key == "routes[0]"
    assert all(word in raised.value.problem for word in ("'payments'", "/lake/orders", "table", "'orders'", "shop-0"))


def test_a_pattern_topic_reaching_a_routes_table_another_way_is_refused_when_it_is_resolved() -> None:
    routes = Routes(
        config(
            K2D_KAFKA__TOPIC_PATTERN="^",
            K2D_TABLE__URI="/lake/{topic}",
            K2D_TABLE__APP_ID="shop",
            K2D_ROUTES='[{"topic_pattern": "^pay", "uri": "file:///lake/orders/"}]',
        )
    )
    assert routes.table_for("payments").txn_ids.main(TopicPartition("payments", 0)) == "shop-payments-0"
    assert routes.table_for("payouts").uri == "file:///lake/orders/"  # one table for several topics: fine
    with pytest.raises(ConfigError, match=r"^table: takes topic 'orders' to /lake/orders, which routes\[0\]"):
        routes.table_for("orders")


def test_two_spellings_of_one_uri_are_one_table() -> None:
    """Found by review: ``s3://lake/all`` and ``s3://lake/all/`` were two tables to the checks (other app ids
    accepted, txn ids without the topic)."""
    clash = '[{"topic": "a", "uri": "s3://lake/all"}, {"topic": "b", "uri": "s3://lake/all/", "app_id": "other"}]'
    with pytest.raises(ConfigError, match=r"routes\[1\]\.app_id: 'other' differs from routes\[0\]'s 'shop'"):
        Routes(config(K2D_KAFKA__TOPICS="a,b", K2D_TABLE__APP_ID="shop", K2D_ROUTES=clash))
    relative = Path("lake/all").resolve()
    shared = json.dumps([{"topic": "a", "uri": "lake/all"}, {"topic": "b", "uri": f"{relative}/"}])
    routes = Routes(config(K2D_KAFKA__TOPICS="a,b", K2D_TABLE__APP_ID="shop", K2D_ROUTES=shared))
    assert [routes.table_for(t).txn_ids.main(TopicPartition(t, 0)) for t in "ab"] == ["shop-a-0", "shop-b-0"]
    assert [table_key(routes.table_for(t).uri) for t in "ab"] == [str(relative)] * 2
    # s3a:// is s3://, and a scheme's case does not matter: one table (before, two to these checks).
    clash = '[{"topic": "a", "uri": "s3a://lake/all"}, {"topic": "b", "uri": "S3://lake/all/", "app_id": "other"}]'
    with pytest.raises(ConfigError, match=r"routes\[1\]\.app_id: 'other' differs from routes\[0\]'s 'shop'"):
        Routes(config(K2D_KAFKA__TOPICS="a,b", K2D_TABLE__APP_ID="shop", K2D_ROUTES=clash))


def test_a_table_cannot_be_a_dead_letter_table() -> None:
    with pytest.raises(ConfigError, match=r"^table\.uri: takes topic 'a' to s3://lake/a, which is the dead-letter"):
        Routes(config(K2D_KAFKA__TOPIC="a", K2D_TABLE__URI="s3://lake/a", K2D_DEAD_LETTERS__TABLE_URI="s3://lake/a/"))
    pattern = config(
        K2D_KAFKA__TOPIC_PATTERN="^", K2D_TABLE__URI="s3://lake/raw/{topic}", K2D_DEAD_LETTERS__TABLE_URI=""
    )
    routes = Routes(pattern)
    assert routes.table_for("orders").uri == "s3://lake/raw/orders"
    with pytest.raises(ConfigError, match=r"'_dead_letters' to s3://lake/raw/_dead_letters, .*dead_letters\.table_uri"):
        routes.table_for("_dead_letters")
    own = '[{"topic": "a", "uri": "/lake/a", "dead_letter_table_uri": "/lake/b"}, {"topic": "b", "uri": "/lake/b"}]'
    with pytest.raises(ConfigError, match=r"^routes\[1\]\.uri: .*routes\[0\]\.dead_letter_table_uri"):
        Routes(config(K2D_KAFKA__TOPICS="a,b", K2D_ROUTES=own))


def test_tables_of_a_topic_are_every_table_it_can_reach_once() -> None:
    routes = [
        {"name": "clicks", "uri": "/lake/clicks"},
        {"name": "orders", "uri": "/lake/orders"},
        {"name": "orders_too", "uri": "/lake/orders/"},
    ]
    by_expression = Routes(config(K2D_KAFKA__TOPIC="e", K2D_ROUTES=json.dumps(routes), K2D_ROUTING__EXPRESSION="kind"))
    assert [spec.uri for spec in by_expression.tables_of("e")] == ["/lake/clicks", "/lake/orders"]
    named = '[{"name": "A", "topic": "a", "uri": "/lake/a"}, {"name": "B", "topic": "b", "uri": "/lake/b"}]'
    by_topic = Routes(config(K2D_KAFKA__TOPICS="a,b", K2D_ROUTES=named))  # names without an expression: labels
    assert [spec.uri for spec in by_topic.tables_of("b")] == ["/lake/b"]


def test_a_route_takes_transforms_and_a_filter_of_its_own(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(
        """
[kafka]
bootstrap_servers = "b:9092"
topics = ["orders", "clicks", "refunds"]

[table]
uri = "/lake/{topic}"

[transforms]
id = "order_id"

[filter]
expression = "amount > `0`"

[[routes]]
topic = "clicks"
uri = "/lake/clicks"
filter = "page != 'health'"
[routes.transforms]
id = "click.id"
"user.country" = "substr(geo.country, `0`, `2`)"

[[routes]]
topic = "refunds"
uri = "/lake/refunds"
"""
    )
    loaded = load_config(path, environ={})
    routes = Routes(loaded)
    clicks, refunds, orders = (routes.table_for(topic) for topic in ("clicks", "refunds", "orders"))
    assert clicks.transforms == (("id", "click.id"), ("user.country", "substr(geo.country, `0`, `2`)"))
    assert (clicks.filter, clicks.transforms_key, clicks.filter_key) == (
        "page != 'health'",
        "routes[0].transforms",
        "routes[0].filter",
    )
    # A route that gives none keeps the daemon's, as [table] does.
    for spec in (refunds, orders):
        assert (spec.transforms, spec.filter) == ((("id", "order_id"),), "amount > `0`")
        assert (spec.transforms_key, spec.filter_key) == ("transforms", "filter.expression")
    assert any(
        "route 0: topic clicks → /lake/clicks, its own transforms: 2, its own filter: page" in s
        for s in loaded.summary()
    )


@pytest.mark.parametrize(
    ("routes", "env", "key", "problem"),
    [
        ('[{"topic": "a", "uri": "/l/a", "transforms": {"id": "a.["}}]', {}, r"routes\[0\]\.transforms\.id", "invalid"),
        ('[{"topic": "a", "uri": "/l/a", "transforms": {"kafka.x": "a"}}]', {}, r"routes\[0\]\.transforms\.kafka", ""),
        ('[{"topic": "a", "uri": "/l/a", "transforms": {"id": 3}}]', {}, r"routes\[0\]\.transforms\.id", "expected"),
        ('[{"topic": "a", "uri": "/l/a", "transforms": "id"}]', {}, r"routes\[0\]\.transforms", "expected a table"),
        ('[{"topic": "a", "uri": "/l/a", "filter": "nope("}]', {}, r"routes\[0\]\.filter", "invalid JMESPath"),
        ('[{"topic": "a", "uri": "/l/a", "filter": "unknown(x)"}]', {}, r"routes\[0\]\.filter", "unknown function"),
        (
            '[{"name": "a", "uri": "/l/a", "transforms": {"id": "x"}}]',
            {"K2D_ROUTING__EXPRESSION": "type"},
            r"routes\[0\]\.transforms",
            r"not with \[routing\] expression",
        ),
        (
            '[{"name": "a", "uri": "/l/a", "filter": "x"}]',
            {"K2D_ROUTING__EXPRESSION": "type"},
            r"routes\[0\]\.filter",
            r"not with \[routing\] expression",
        ),
        (
            '[{"topic": "a", "uri": "/l/a", "mode": "upsert", "key": ["id"], "transforms": {"id": "x"}}]',
            {"K2D_FORMAT__KEY": "json"},
            r"routes\[0\]\.transforms",
            r"\['id'\] write key column",
        ),
    ],
)
def test_a_routes_transforms_and_filter_are_checked_at_start_naming_the_route(
    routes: str, env: dict[str, str], key: str, problem: str
) -> None:
    with pytest.raises(ConfigError, match=rf"{key}.*{problem}"):
        config(K2D_KAFKA__TOPICS="a", K2D_ROUTES=routes, **env)


def test_the_daemons_transforms_are_checked_at_start() -> None:
    with pytest.raises(ConfigError, match=r"transforms\.id: invalid JMESPath"):
        config(K2D_KAFKA__TOPIC="a", K2D_TABLE__URI="/l/a", K2D_TRANSFORMS='{"id": "a.["}')


def test_routes_writing_one_table_must_transform_and_filter_the_same_way() -> None:
    """One table has one pipeline: two routes to it with other transforms would run the first one's."""
    differ = [
        '{"topic": "a", "uri": "/lake/all", "transforms": {"id": "a_id"}}',
        '{"topic": "b", "uri": "/lake/all", "filter": "ok"}',
    ]
    with pytest.raises(ConfigError, match=r"routes\[1\]: writes the same table /lake/all .* transforms or filter"):
        Routes(config(K2D_KAFKA__TOPICS="a,b", K2D_ROUTES=f"[{', '.join(differ)}]"))
    same = '{"topic": "b", "uri": "/lake/all", "transforms": {"id": "a_id"}}'
    routes = Routes(config(K2D_KAFKA__TOPICS="a,b", K2D_ROUTES=f"[{differ[0]}, {same}]"))
    assert routes.table_for("b").transforms == (("id", "a_id"),)


def test_a_route_takes_a_format_of_its_own_whole(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(
        """
[kafka]
bootstrap_servers = "b:9092"
topics = ["orders", "logs", "profiles"]

[table]
uri = "/lake/{topic}"

[format]
type = "json"
gzip = true
key = "string"

[[routes]]
topic = "logs"
uri = "/lake/logs"
[routes.format]
type = "raw"
raw_column = "line"

[[routes]]
topic = "profiles"
uri = "/lake/profiles"
mode = "upsert"
key = ["id"]
schema = { id = "long not null", name = "string" }
[routes.format]
key = "json"
envelope = "debezium"
[routes.coercions]
epoch_unit = "us"
epoch_units = { updated = "s" }
"""
    )
    loaded = load_config(path, environ={})
    routes = Routes(loaded)
    logs, profiles, orders = (routes.table_for(topic) for topic in ("logs", "profiles", "orders"))
    # A route's format is whole: what it leaves out takes the defaults (no gzip, no key), not [format]'s.
    assert (logs.format.type, logs.format.raw_column, logs.format.gzip, logs.format.key) == (
        "raw",
        "line",
        False,
        "none",
    )
    assert logs.format_key == "routes[0].format"
    assert profiles.changes is not None and profiles.changes.envelope == "debezium"
    assert (profiles.coercions.epoch_unit, dict(profiles.coercions.epoch_units)) == ("us", {"updated": "s"})
    assert (logs.coercions, orders.coercions) == (loaded.coercions, loaded.coercions)
    assert (orders.format, orders.format_key) == (loaded.format, "format")
    assert any("route 0: topic logs → /lake/logs, format raw, key none" in line for line in loaded.summary())


@pytest.mark.parametrize(
    ("routes", "env", "key", "problem"),
    [
        ('[{"topic": "a", "uri": "/l/a", "format": {"type": "xml"}}]', {}, r"routes\[0\]\.format\.type", "one of"),
        ('[{"topic": "a", "uri": "/l/a", "format": "raw"}]', {}, r"routes\[0\]\.format", "expected a table"),
        ('[{"topic": "a", "uri": "/l/a", "format": {"typ": "raw"}}]', {}, r"routes\[0\]\.format\.typ", "unknown key"),
        ('[{"topic": "a", "uri": "/l/a", "format": {"type": "avro"}}]', {}, r"routes\[0\]\.format\.type", "registry"),
        (
            '[{"topic": "a", "uri": "/l/a", "format": {"type": "avro", "gzip": true}}]',
            {"K2D_SCHEMA_REGISTRY__URL": "http://r:8081"},
            r"routes\[0\]\.format\.gzip",
            "json and raw",
        ),
        (
            '[{"topic": "a", "uri": "/l/a", "format": {"envelope": "debezium"}}]',
            {},
            r"routes\[0\]\.format\.envelope",
            "only used with table.mode",
        ),
        (
            '[{"topic": "a", "uri": "/l/a", "mode": "upsert", "key": ["id"], "format": {"type": "json"}}]',
            {"K2D_FORMAT__KEY": "json"},
            r"routes\[0\]\.format\.key",
            "read the key of a delete",
        ),
        (
            '[{"topic": "a", "uri": "/l/a", "mode": "upsert", "key": ["id"], "format": {"type": "raw", "key": "json"}}]',
            {},
            r"routes\[0\]\.format\.type",
            "not raw",
        ),
        (
            '[{"name": "a", "uri": "/l/a", "format": {"type": "raw"}}]',
            {"K2D_ROUTING__EXPRESSION": "type"},
            r"routes\[0\]\.format",
            r"not with \[routing\] expression",
        ),
        (
            '[{"name": "a", "uri": "/l/a", "coercions": {"epoch_unit": "s"}}]',
            {"K2D_ROUTING__EXPRESSION": "type"},
            r"routes\[0\]\.coercions",
            r"not with \[routing\] expression",
        ),
        (
            '[{"topic": "a", "uri": "/l/a", "coercions": {"epoch_units": {"at": "h"}}}]',
            {},
            r"routes\[0\]\.coercions\.epoch_units\.at",
            "expected one of",
        ),
        ('[{"topic": "a", "uri": "/l/a", "coercions": {"epoch_unit": "h"}}]', {}, r"routes\[0\]\.coercions", "one of"),
    ],
)
def test_a_routes_format_is_checked_at_start_naming_the_route(
    routes: str, env: dict[str, str], key: str, problem: str
) -> None:
    with pytest.raises(ConfigError, match=rf"{key}.*{problem}"):
        config(K2D_KAFKA__TOPICS="a", K2D_ROUTES=routes, **env)


def test_the_daemons_change_format_keys_are_free_when_only_routes_formats_read_changes() -> None:
    """[format]'s envelope is checked against the tables that read [format]: a route with its own format is not one."""
    routes = '[{"topic": "a", "uri": "/l/a", "mode": "upsert", "key": ["id"], "format": {"key": "json"}}]'
    with pytest.raises(ConfigError, match=r"^format\.envelope: is only used"):
        config(K2D_KAFKA__TOPICS="a", K2D_ROUTES=routes, K2D_FORMAT__ENVELOPE="debezium")
    assert Routes(config(K2D_KAFKA__TOPICS="a", K2D_ROUTES=routes)).table_for("a").format.key == "json"


def test_a_route_opts_out_of_the_daemons_transforms_and_filter_with_empty_ones() -> None:
    routes = '[{"topic": "a", "uri": "/l/a", "transforms": {}, "filter": ""}, {"topic": "b", "uri": "/l/b"}]'
    loaded = config(
        K2D_KAFKA__TOPICS="a,b", K2D_ROUTES=routes, K2D_TRANSFORMS='{"id": "x.id"}', K2D_FILTER__EXPRESSION="ok"
    )
    none, daemons = Routes(loaded).table_for("a"), Routes(loaded).table_for("b")
    assert (none.transforms, none.filter, none.transforms_key, none.filter_key) == (
        (),
        "",
        "routes[0].transforms",
        "routes[0].filter",
    )
    assert (daemons.transforms, daemons.filter) == ((("id", "x.id"),), "ok")
    assert any("its own transforms: none, its own filter: none" in line for line in loaded.summary())
    with pytest.raises(ConfigError, match=r"routes\[0\]\.filter: expected a JMESPath expression string"):
        config(K2D_KAFKA__TOPICS="a", K2D_ROUTES='[{"topic": "a", "uri": "/l/a", "filter": 3}]')
