from pathlib import Path

import pytest

from kafka2delta.config import MASK, is_secret_key, load_config, without_credentials
from kafka2delta.config.masking import uri_secrets
from kafka2delta.errors import ConfigError

MINIMAL = """
[kafka]
bootstrap_servers = "127.0.0.1:9092"
topic = "events"
[table]
uri = "/tmp/events"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_defaults_and_app_id(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, MINIMAL), environ={})
    assert config.kafka.group_id == "kafka2delta"
    assert config.ingest.allowed_latency_s == 5.0
    assert config.app_id == "events"


def test_example_config_is_valid() -> None:
    example = Path(__file__).parents[2] / "config.example.toml"
    config = load_config(example, environ={})
    assert config.table.schema["id"] == "string not null"


def test_environment_overrides_file_and_needs_no_file() -> None:
    env = {
        "K2D_KAFKA__BOOTSTRAP_SERVERS": "b:9092",
        "K2D_KAFKA__TOPIC": "t",
        "K2D_TABLE__URI": "/data/t",
        "K2D_INGEST__ALLOWED_LATENCY_S": "1.5",
        "K2D_INGEST__MAX_MESSAGES_PER_FILE": "1_000",
        "K2D_TABLE__PARTITION_BY": "date,country",
        "K2D_TABLE__SCHEMA": '{"id": "string", "date": "date", "country": "string"}',
        "K2D_KAFKA__SETTINGS__SASL_PASSWORD": "hunter22",
        "K2D_TABLE__STORAGE_OPTIONS__AWS_REGION": "eu-west-1",
        "K2D_TEST_BOOTSTRAP_SERVERS": "ignored: not a config key",
    }
    config = load_config(None, environ=env)
    assert config.ingest.allowed_latency_s == 1.5
    assert config.ingest.max_messages_per_file == 1000
    assert config.table.partition_by == ("date", "country")
    assert config.kafka.settings == {"sasl.password": "hunter22"}
    assert config.table.storage_options == {"AWS_REGION": "eu-west-1"}
    assert config.masked()["kafka"]["settings"]["sasl.password"] == MASK
    assert "hunter22" in config.secret_values()


GLUE_RAW = {"K2D_FORMAT__TYPE": "raw", "K2D_SCHEMA_REGISTRY__TYPE": "glue", "K2D_SCHEMA_REGISTRY__REGION": "eu-west-1"}


@pytest.mark.parametrize(
    ("text", "env", "key", "words"),
    [
        (MINIMAL + "[ingest]\nallowed_latency = 3\n", {}, "ingest.allowed_latency", "unknown key"),
        (MINIMAL + "[ingest]\nmax_messages_per_file = 'many'\n", {}, "ingest.max_messages_per_file", "an integer"),
        (MINIMAL.replace('topic = "events"', ""), {}, "kafka.topic", "required key missing"),
        (MINIMAL + "[ingest]\ncompression = 'lz4'\n", {}, "ingest.compression", "'snappy', 'zstd'"),
        (MINIMAL + "[ingest]\nallowed_latency_s = 0\n", {}, "ingest.allowed_latency_s", "positive"),
        (MINIMAL, {"K2D_INGEST__TABLE_COMMITS_PER_S": "-1"}, "ingest.table_commits_per_s", "0 (no budget)"),
        (MINIMAL, {"K2D_INGEST__RETRY_AFTER_STOP_S": "-1"}, "ingest.retry_after_stop_s", "give up at the next failure"),
        (MINIMAL + "[bogus]\nx = 1\n", {}, "bogus", "unknown section"),
        (MINIMAL, {"K2D_INGEST__MIN_BYTES_PER_FILE": "lots"}, "K2D_INGEST__MIN_BYTES_PER_FILE", "an integer"),
        (MINIMAL + "[table.schema]\nid = 'uuid'\n", {}, "table.schema", "unknown type"),
        (MINIMAL + "[table.schema]\nid = 'string'\n[table]\n", {}, "--config", "not valid TOML"),
        (MINIMAL + "[kafka.settings]\n'group.id' = 'x'\n", {}, "kafka.settings.group.id", "[kafka]"),
        (
            MINIMAL + "[kafka.settings]\n'auto.offset.reset' = 'latest'\n",
            {},
            "kafka.settings.auto.offset.reset",
            "kafka.auto_offset_reset",
        ),
        (
            MINIMAL + "[kafka.settings]\n'enable.partition.eof' = 'true'\n",
            {},
            "kafka.settings.enable.partition.eof",
            "[kafka]",
        ),
        (
            MINIMAL + "[kafka.settings]\n'isolation.level' = 'read_uncommitted'\n",
            {},
            "kafka.settings.isolation.level",
            "aborted",
        ),
        (MINIMAL, {"K2D_FORMAT__KEY": "protobuf"}, "format.key", "protobuf keys need a schema registry"),
        (MINIMAL, {**GLUE_RAW, "K2D_FORMAT__KEY": "json"}, "schema_registry.type", "avro and protobuf keys"),
        # A misspelt section in the environment is not silently ignored.
        (MINIMAL, {"K2D_SCHEMAREGISTRY__URL": "http://r:8081"}, "K2D_SCHEMAREGISTRY__URL", "unknown section"),
        (MINIMAL, {"K2D_ROUTES__0__URI": "/t"}, "K2D_ROUTES__0__URI", "one JSON value in K2D_ROUTES"),
        # nan passes every range check (nan <= 0 is false): refused as no number.
        (MINIMAL, {"K2D_INGEST__ALLOWED_LATENCY_S": "nan"}, "ingest.allowed_latency_s", "a number"),
        (MINIMAL + "[schema_registry]\ntimeout_s = inf\n", {}, "schema_registry.timeout_s", "a number"),
        (MINIMAL, {"K2D_INGEST__UNUSED_TABLE_CLOSE_S": "-1"}, "ingest.unused_table_close_s", "close at once"),
        (MINIMAL, {"K2D_JOBS__DEAD_LETTER_RETENTION_DAYS": "0.5"}, "jobs.dead_letter_retention_days", "at least 1 day"),
        # Table URIs that name no place of their own.
        (MINIMAL, {"K2D_TABLE__URI": "file://"}, "table.uri", "the root directory"),
        (MINIMAL, {"K2D_TABLE__URI": "/"}, "table.uri", "the root directory"),
        (MINIMAL, {"K2D_TABLE__URI": "file://data/t"}, "table.uri", "names the host 'data'"),
        (MINIMAL, {"K2D_TABLE__URI": "file://localhost/"}, "table.uri", "the root directory"),
        (MINIMAL, {"K2D_TABLE__URI": "s3://"}, "table.uri", "names no bucket"),
        (MINIMAL, {"K2D_TABLE__URI": "az:///t/{topic}"}, "table.uri", "names no bucket"),
        (MINIMAL, {"K2D_DEAD_LETTERS__TABLE_URI": "gs://"}, "dead_letters.table_uri", "names no bucket"),
        (
            MINIMAL,
            {"K2D_ROUTES": '[{"topic": "events", "uri": "/t", "dead_letter_table_uri": "file:///"}]'},
            "routes[0].dead_letter_table_uri",
            "the root directory",
        ),
        (MINIMAL, {"K2D_TABLE__URI": "s3://lake/"}, "dead_letters.table_uri", "another bucket, s3://lake_dead_letters"),
        (MINIMAL, {"K2D_TABLE__URI": "s3://lake-{topic}/t"}, "dead_letters.table_uri", "default would be s3://_dead"),
    ],
)
def test_errors_name_the_key(tmp_path: Path, text: str, env: dict[str, str], key: str, words: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_config(write(tmp_path, text), environ=env)
    assert key in str(raised.value)
    assert words in str(raised.value)


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"K2D_TABLE__URI": "file://admin:hunter2@nas/x/t"}, "names the host 'nas'"),
        ({"K2D_TABLE__URI": "//admin:hunter2@nas"}, "the root directory"),
        ({"K2D_TABLE__URI": "s3://admin:hunter2@"}, "a table at the root of a bucket"),
        ({"K2D_ROUTES": '{"uri": "s3://k:hunter2@lake/t"}'}, "expected a JSON array, got a JSON dict"),
    ],
)
def test_errors_at_load_never_print_a_password(tmp_path: Path, env: dict[str, str], words: str) -> None:
    """Found by review: they are printed before the log's masking exists."""
    with pytest.raises(ConfigError) as raised:
        load_config(write(tmp_path, MINIMAL), environ=env)
    assert words in str(raised.value) and "hunter2" not in str(raised.value)


@pytest.mark.parametrize(
    ("uri", "dead_letters"),
    [
        ("s3://lake/raw/{topic}", "s3://lake/raw/_dead_letters"),
        ("{topic}", "_dead_letters"),  # was "{topic/_dead_letters"
        ("/{topic}", "/_dead_letters"),  # was the relative "_dead_letters"
        ("s3://lake/orders", "s3://lake/orders_dead_letters"),
    ],
)
def test_the_default_dead_letter_table(uri: str, dead_letters: str) -> None:
    config = load_config(
        None, environ={"K2D_KAFKA__BOOTSTRAP_SERVERS": "k:1", "K2D_KAFKA__TOPIC": "t", "K2D_TABLE__URI": uri}
    )
    assert config.dead_letter_table_uri == dead_letters


@pytest.mark.parametrize("key", ["avro", "protobuf"])
def test_glue_decodes_the_keys_of_raw_values(tmp_path: Path, key: str) -> None:
    config = load_config(write(tmp_path, MINIMAL), environ={**GLUE_RAW, "K2D_FORMAT__KEY": key})
    assert config.format.key == key


def test_secret_values_never_printed_in_errors(tmp_path: Path) -> None:
    text = MINIMAL + "[kafka.settings]\n'sasl.password' = 12345678\n"
    config = load_config(write(tmp_path, text), environ={})  # numbers become strings
    assert config.kafka.settings["sasl.password"] == "12345678"
    with pytest.raises(ConfigError) as raised:
        load_config(write(tmp_path, MINIMAL + "[kafka.settings]\n'sasl.password' = ['s3cr3t']\n"), environ={})
    assert "s3cr3t" not in str(raised.value)
    # A key whose name says secret is masked in a conversion error too, and a whole mapping never echoed.
    with pytest.raises(ConfigError) as raised:
        load_config(write(tmp_path, MINIMAL + "[schema_registry]\npassword = 12345678\n"), environ={})
    assert "12345678" not in str(raised.value) and "schema_registry.password" in str(raised.value)
    environ = {"K2D_TABLE__STORAGE_OPTIONS": '{"AWS_SECRET_ACCESS_KEY": "s3cr3t"}'}
    with pytest.raises(ConfigError) as raised:
        load_config(write(tmp_path, MINIMAL), environ=environ)
    assert "s3cr3t" not in str(raised.value) and "table.storage_options" in str(raised.value)
    # A registry URL written without its scheme keeps its password out of the error.
    with pytest.raises(ConfigError) as raised:
        load_config(write(tmp_path, MINIMAL), environ={"K2D_SCHEMA_REGISTRY__URL": "u:s3cr3t@registry:8081"})
    assert "s3cr3t" not in str(raised.value) and "registry:8081" in str(raised.value)


def test_credentials_in_uris_are_masked_and_redacted(tmp_path: Path) -> None:
    environ = {
        "K2D_SCHEMA_REGISTRY__URL": "http://ingest:reg%40pass@registry:8081",
        "K2D_TABLE__URI": "abfss://lake@account.dfs.core.windows.net/events",
        "K2D_DEAD_LETTERS__TABLE_URI": "https://tokenvalue0123456789@files.example/letters",
    }
    config = load_config(write(tmp_path, MINIMAL), environ=environ)
    masked = config.masked()
    assert masked["schema_registry"]["url"] == f"http://ingest:{MASK}@registry:8081"
    # As written and decoded; a lone user name (https://admin@…) is no secret: it would mask the word everywhere.
    assert {"reg%40pass", "reg@pass", "tokenvalue0123456789"} <= set(config.secret_values())
    assert masked["dead_letters"]["table_uri"] == f"https://{MASK}@files.example/letters"
    # An Azure URI's user part is its container, not a secret: it stays readable.
    assert masked["table"]["uri"] == "abfss://lake@account.dfs.core.windows.net/events"
    assert "lake" not in config.secret_values()
    summary = "\n".join(config.summary())
    assert "reg%40pass" not in summary and "tokenvalue" not in summary and "abfss://lake@account" in summary
    admin = load_config(write(tmp_path, MINIMAL), environ={"K2D_SCHEMA_REGISTRY__URL": "https://admin@registry:8081"})
    assert "admin" not in admin.secret_values()


@pytest.mark.parametrize(
    ("uri", "shown", "secret"),
    [
        ("https://u:pa/ss@registry:8081", f"https://u:{MASK}@registry:8081", "pa/ss"),
        ("https://u:pa?ss#x@registry:8081/api", f"https://u:{MASK}@registry:8081/api", "pa?ss#x"),
        ("https://registry:8081/v1@latest", "https://registry:8081/v1@latest", None),  # a port, a path with @
    ],
)
def test_a_password_with_an_unencoded_slash_question_mark_or_hash_is_masked(
    uri: str, shown: str, secret: str | None
) -> None:
    """Found by review: the URL's host part ends at that character, before the @, and nothing was masked."""
    assert without_credentials(uri) == shown
    assert uri_secrets(uri) == ([secret] if secret else [])


@pytest.mark.parametrize(
    ("key", "secret"),
    [
        ("sasl.password", True),
        ("ssl.key.pem", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("AWS_ACCESS_KEY_ID", True),
        ("sasl.oauthbearer.client.secret", True),
        ("sasl.oauthbearer.config", True),
        ("sasl.jaas.config", True),
        ("spark.hadoop.fs.azure.sas.lake.account.blob.core.windows.net", True),
        ("security.protocol", False),
        ("AWS_REGION", False),
        ("fetch.max.bytes", False),
    ],
)
def test_is_secret_key(key: str, secret: bool) -> None:
    assert is_secret_key(key) is secret


ROUTED = {
    "K2D_KAFKA__BOOTSTRAP_SERVERS": "b:9092",
    "K2D_KAFKA__TOPICS": "a,b",
    "K2D_DEAD_LETTERS__TABLE_URI": "/lake/_dlq",
    "K2D_ROUTES": '[{"name": "x", "topic": "a", "uri": "/lake/a"}, {"name": "y", "topic": "b", "uri": "/lake/b"}]',
}


def test_a_bad_routing_expression_is_refused_at_start_naming_its_key() -> None:
    """Found by review: it was compiled only with the router, at the first assignment, as
    ``transforms.__kafka2delta_route``."""
    with pytest.raises(ConfigError) as raised:
        load_config(None, environ={**ROUTED, "K2D_ROUTING__EXPRESSION": "kind["})
    assert raised.value.key == "routing.expression" and "incomplete expression" in raised.value.problem
    with pytest.raises(ConfigError, match=r"routing\.expression: unknown function nope\(\)"):
        load_config(None, environ={**ROUTED, "K2D_ROUTING__EXPRESSION": "nope(kind)"})


def test_the_routing_expression_is_stripped_once_for_validation_and_the_router() -> None:
    """Found by review: validation stripped it and the runtime did not, so "  " passed validation as no expression
    and then failed as one when the router compiled it."""
    assert load_config(None, environ={**ROUTED, "K2D_ROUTING__EXPRESSION": "  "}).routing.expression == ""
    assert load_config(None, environ={**ROUTED, "K2D_ROUTING__EXPRESSION": " kind\n"}).routing.expression == "kind"
