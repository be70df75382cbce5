"""Which table each topic's messages go to (pure): the ``[[routes]]``, then ``[table]``, resolved per topic.

A route takes a topic by name or pattern (the first route that matches wins; ``[table]``, when it has a
URI, takes every other subscribed topic). Its table URI may hold ``{topic}``: a topic name is always a
safe path segment (Kafka allows only ASCII letters, digits, ``.``, ``_`` and ``-``, and neither ``.`` nor
``..``), so the name is used as it is. With ``[routing] expression`` the routes are chosen per message
instead: the expression's value is a route's ``name``, among the routes that match the message's topic.

A table's txn ids name the topic whenever more than one topic can write the table
(:class:`kafka2delta.offsets.TxnIds`): a URI without ``{topic}`` reached by a pattern, by several routes,
by the routes of an expression, or by ``[table]`` under a multi-topic subscription. URIs are compared as
:func:`table_key` spells them, and every table a topic resolves to is checked against the tables resolved
before (:meth:`Routes.tables_of`): a table reached again must be reached the same way, and no table may be a
dead-letter table. A ``{topic}`` URI can only be checked once the topic is known, so for a topic pattern
that check comes when the topic's tables are opened.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from kafka2delta.changes import CHANGELOG_METADATA, ChangeOptions
from kafka2delta.config import (
    METADATA_COLUMNS,
    TOPIC_PLACEHOLDER,
    CoercionConfig,
    Config,
    FormatConfig,
    RouteConfig,
    table_key,
    without_credentials,
)
from kafka2delta.errors import ConfigError
from kafka2delta.offsets import TxnIds
from kafka2delta.records import TopicPartition
from kafka2delta.schema import is_required
from kafka2delta.transforms import FILTER_KEY


@dataclass(frozen=True, kw_only=True)
class TableSpec:
    """One table as the routes resolve it for a topic: where it is, how it is made, how it names its txns."""

    name: str
    """The ``table`` label of metrics and status: the route's name, or the table URI (its credentials masked)."""
    uri: str
    txn_ids: TxnIds
    columns: Mapping[str, str]
    """The columns a new table gets (with the metadata columns); empty: the first batch's (see README "Routing")."""
    partition_by: tuple[str, ...]
    schema_evolution: str
    metadata_columns: tuple[str, ...]
    route: str
    """The route's key in the config (``routes[2]``, or ``table``), for errors."""
    dead_letter_uri: str
    """The dead-letter table of the topics this table takes (a route's own, or the daemon's)."""
    changes: ChangeOptions | None = None
    """Upsert and changelog tables: the mode, key, envelope, delete mode and change columns; None: append."""
    format: FormatConfig
    """How the table's messages are decoded: the route's ``[routes.format]``, or ``[format]``."""
    format_key: str
    """Where :attr:`format` was configured, for errors (``routes[2].format`` when the route gives one)."""
    coercions: CoercionConfig
    """How values are fitted to the table's types: the route's ``[routes.coercions]``, or ``[coercions]``."""
    transforms: tuple[tuple[str, str], ...]
    """The route's transforms, or ``[transforms]``."""
    filter: str
    """The route's filter expression, or ``filter.expression``."""
    transforms_key: str
    """Where :attr:`transforms` and :attr:`filter` were configured, for errors and dead letters
    (``routes[2].transforms`` and ``routes[2].filter`` when the route gives them)."""
    filter_key: str

    @property
    def settings(self) -> tuple[object, ...]:
        """How the table is made and written, beyond where it is and how it names its txns."""
        columns = tuple(sorted(self.columns.items()))
        made = (columns, self.partition_by, self.schema_evolution, self.metadata_columns, self.changes)
        return (*made, self.format, self.coercions, self.transforms, self.filter)


@dataclass(frozen=True)
class _Route:
    key: str
    config: RouteConfig
    multi_topic: bool


class Routes:
    def __init__(self, config: Config) -> None:
        self._config = config
        table = config.table
        declared = [(f"routes[{i}]", route) for i, route in enumerate(config.routes)]
        if table.uri:
            # [table] takes every subscribed topic the routes do not take.
            declared.append(("table", RouteConfig(uri=table.uri, app_id=table.app_id)))
        # A table (a URI without {topic}) more than one topic can reach: by several routes, or by one route
        # that takes several topics. A daemon of one topic keeps today's ids whatever the routes say.
        uris = Counter(table_key(self._uri(r)) for _, r in declared if TOPIC_PLACEHOLDER not in self._uri(r))
        one_topic_daemon = bool(config.kafka.topic)
        routes = []
        for key, route in declared:
            uri = self._uri(route)
            shared = TOPIC_PLACEHOLDER not in uri and (uris[table_key(uri)] > 1 or not route.topic)
            routes.append(_Route(key, route, shared and not one_topic_daemon))
        self._routes = routes
        self._one_topic_daemon = one_topic_daemon
        # Every dead-letter table, by table_key, with the key that names it (for errors).
        self._dead_letter_keys = {table_key(config.dead_letter_table_uri): "dead_letters.table_uri"}
        for key, route in declared:
            if route.dead_letter_table_uri:
                self._dead_letter_keys.setdefault(
                    table_key(route.dead_letter_table_uri), f"{key}.dead_letter_table_uri"
                )
        self._reached: dict[str, tuple[TableSpec, str]] = {}
        """Each table resolved so far, by table_key, with the spec and topic that first reached it."""
        self._check_app_ids()
        for topic in (config.kafka.topic,) if config.kafka.topic else config.kafka.topics:
            if self._first_route(topic) is not None:  # else an error when the topic is read (table_for)
                self.tables_of(topic)  # a listed topic's tables are checked at start

    def table_for(self, topic: str) -> TableSpec:
        """The table of ``topic`` (routing by topic); ConfigError naming ``routes`` when no route takes it."""
        route = self._first_route(topic)
        if route is None:
            raise ConfigError("routes", f"no route takes topic {topic!r} (and table.uri is empty)")
        return self._spec(route, topic)

    def tables_of(self, topic: str) -> list[TableSpec]:
        """Every table a topic can reach, one spec each: its table by topic, then with ``[routing] expression`` the
        other tables its routes name."""
        specs: dict[str, TableSpec] = {}
        for spec in [self.table_for(topic), *(self.tables_by_name(topic).values() if self._by_expression else ())]:
            specs.setdefault(table_key(spec.uri), spec)
        return list(specs.values())

    def tables_by_name(self, topic: str) -> dict[str, TableSpec]:
        """With ``[routing] expression``: the tables a message of ``topic`` may name, by route name."""
        return {
            route.config.name: self._spec(route, topic)
            for route in self._routes
            if route.config.name and route.config.takes(topic)
        }

    def dead_letter_prefix(self, topic: str) -> str:
        """The app id of ``topic``'s dead letters (the ``app_id`` column, and the dead-letter txn ids)."""
        return self.dead_letter_txn_ids(topic).prefix(topic)

    def dead_letter_app_ids(self, topic: str) -> tuple[str, ...]:
        """Every ``app_id`` ``topic``'s dead letters carry (see :meth:`TxnIds.app_ids`)."""
        return self.dead_letter_txn_ids(topic).app_ids(topic)

    @property
    def default_dead_letter_uri(self) -> str:
        """The daemon's dead-letter table (``dead_letters.table_uri`` or its default)."""
        return self._config.dead_letter_table_uri

    def dead_letter_uri(self, topic: str) -> str:
        """The dead-letter table of ``topic``: its first matching route's (the daemon's when none matches)."""
        route = self._first_route(topic)
        return self._config.dead_letter_table_uri if route is None else self._dead_letter_uri(route)

    def dead_letter_txn_ids(self, topic: str) -> TxnIds:
        """How ``topic``'s dead letters name their txns: with the first matching route's app id, so they stay the
        same for every message of the topic, and with the topic in them unless the daemon reads one topic (its
        dead-letter table takes every subscribed topic)."""
        route = self._first_route(topic)
        if route is None:
            return TxnIds()
        return TxnIds(route.config.app_id or self._config.table.app_id, not self._one_topic_daemon)

    # --- resolving --------------------------------------------------------------------------

    @property
    def _by_expression(self) -> bool:
        return bool(self._config.routing.expression)

    def _first_route(self, topic: str) -> _Route | None:
        """The route that takes ``topic`` when routing by topic (the first that matches)."""
        return next((route for route in self._routes if route.config.takes(topic)), None)

    def _uri(self, route: RouteConfig) -> str:
        return route.uri or self._config.table.uri

    def _txn_ids(self, route: _Route) -> TxnIds:
        return TxnIds(route.config.app_id or self._config.table.app_id, route.multi_topic)

    def _spec(self, route: _Route, topic: str) -> TableSpec:
        table, config = self._config.table, route.config
        uri = self._uri(config).replace(TOPIC_PLACEHOLDER, topic)
        metadata = config.metadata_columns or table.metadata_columns
        columns = dict(config.schema or table.schema)
        changes = self._changes(config)
        stages = config.stages(self._config)
        if changes is not None and not changes.upsert:  # a changelog row says where its change came from
            metadata = tuple(dict.fromkeys((*metadata, *CHANGELOG_METADATA)))
        if columns:
            for name in metadata:
                columns.setdefault(f"kafka_{name}", METADATA_COLUMNS[name])
            if changes is not None:
                for name, type_name in changes.table_columns().items():
                    columns.setdefault(name, type_name)
                for name in changes.key:  # a key column is never null
                    if not is_required(columns[name]):
                        columns[name] = f"{columns[name]} not null"
        spec = TableSpec(
            name=config.name or without_credentials(uri),  # a label and a dead letter's column: never a password
            uri=uri,
            txn_ids=self._txn_ids(route),
            columns=columns,
            partition_by=config.partition_by or table.partition_by,
            schema_evolution=config.schema_evolution or table.schema_evolution,
            metadata_columns=metadata,
            route=route.key,
            dead_letter_uri=self._dead_letter_uri(route),
            changes=changes,
            format=stages.format,
            format_key=f"{route.key}.format" if config.format else "format",
            coercions=stages.coercions,
            transforms=stages.transforms,
            filter=stages.filter,
            transforms_key=f"{route.key}.transforms" if config.transforms is not None else "transforms",
            filter_key=f"{route.key}.filter" if config.filter is not None else FILTER_KEY,
        )
        self._check_reach(spec, topic)
        return spec

    def _check_reach(self, spec: TableSpec, topic: str) -> None:
        """ConfigError when ``spec`` makes a dead-letter table a table, or reaches a table resolved before in
        another way (a ``{topic}`` URI equal to a route's, two spellings of one URI): under other txn ids, or under
        ids without the topic from another topic (both topics' partition p would share one txn, and one's commit
        would pass for the other's: messages lost), or with other settings or another dead-letter table."""
        key = table_key(spec.uri)
        shown = without_credentials(spec.uri)
        named_by = self._dead_letter_keys.get(key)
        if named_by is not None:
            raise ConfigError(
                f"{spec.route}.uri",
                f"takes topic {topic!r} to {shown}, which is the dead-letter table ({named_by}): give each its own",
            )
        first, first_topic = self._reached.setdefault(key, (spec, topic))
        if first is spec:
            return
        partition = (TopicPartition(first_topic, 0), TopicPartition(topic, 0))
        ids = (first.txn_ids.main(partition[0]), spec.txn_ids.main(partition[1]))
        if spec.txn_ids != first.txn_ids or (topic != first_topic and not spec.txn_ids.multi_topic):
            # Even ids that differ (no app_id: each names its topic) are refused: one table is one writer, with one
            # set of txn ids for every topic it takes (a multi-topic table, reached by one URI).
            differs = f"one-topic txn ids ({ids[1]!r} beside {ids[0]!r} for partition 0), not one multi-topic table's"
        elif spec.settings != first.settings:
            differs = (
                "other table settings (schema, partition_by, schema_evolution, metadata_columns, mode, format, "
                "coercions, transforms or filter)"
            )
        elif table_key(spec.dead_letter_uri) != table_key(first.dead_letter_uri):
            differs = f"another dead-letter table ({without_credentials(spec.dead_letter_uri)})"
        else:
            return
        raise ConfigError(
            spec.route,
            f"takes topic {topic!r} to {shown}, which {first.route} already writes for topic {first_topic!r}, with "
            f"{differs}: give one of them another table, or route both to it by one URI without {TOPIC_PLACEHOLDER}",
        )

    def _changes(self, config: RouteConfig) -> ChangeOptions | None:
        table = self._config.table
        mode = config.mode or table.mode
        if mode == "append":
            return None
        if not (config.key or table.key):
            raise ConfigError("table.key", f'required with mode = "{mode}" for the topics no route takes')
        fmt = config.stages(self._config).format
        envelope = fmt.envelope
        change_columns = config.change_columns or table.change_columns
        if mode == "changelog":
            change_columns = ("op", "source_ts", "lsn") if envelope == "debezium" else ("op",)
        return ChangeOptions(
            key=config.key or table.key,
            mode="changelog" if mode == "changelog" else "upsert",
            envelope=envelope,
            delete_mode="soft" if (config.delete_mode or table.delete_mode) == "soft" else "hard",
            change_columns=change_columns,
            before_image=table.before_image and mode == "changelog",
            decimal_handling=fmt.decimal_handling,
        )

    def _dead_letter_uri(self, route: _Route) -> str:
        return route.config.dead_letter_table_uri or self._config.dead_letter_table_uri

    def _how_made(self, route: _Route) -> tuple[object, ...]:
        """What a route says about its table beyond where it is: the settings one table can have only once."""
        table, config = self._config.table, route.config
        return (
            tuple(sorted((config.schema or table.schema).items())),
            config.partition_by or table.partition_by,
            config.schema_evolution or table.schema_evolution,
            config.metadata_columns or table.metadata_columns,
            config.mode or table.mode,
            config.key or table.key,
            config.delete_mode or table.delete_mode,
            config.change_columns or table.change_columns,
            *config.stages(self._config),
        )

    def _check_app_ids(self) -> None:
        """Two routes writing one table must name its txns the same way, and keep its dead letters in one table
        (with ``[routing] expression``, every route: a partition's dead letters have one txn)."""
        letters: dict[str, tuple[str, str]] = {}
        for route in self._routes:
            uri = "*" if self._by_expression else table_key(self._uri(route.config))
            earlier_letters = letters.setdefault(uri, (route.key, self._dead_letter_uri(route)))
            if table_key(earlier_letters[1]) != table_key(self._dead_letter_uri(route)):
                raise ConfigError(
                    f"{route.key}.dead_letter_table_uri",
                    f"{self._dead_letter_uri(route)!r} differs from {earlier_letters[0]}'s {earlier_letters[1]!r}"
                    + (
                        ", and [routing] expression"
                        if uri == "*"
                        else f", which writes the same table {without_credentials(self._uri(route.config))}"
                    ),
                )
        made: dict[str, tuple[str, tuple[object, ...]]] = {}
        for route in self._routes:
            uri = self._uri(route.config)
            if TOPIC_PLACEHOLDER in uri:
                continue
            how = self._how_made(route)
            earlier_how = made.setdefault(table_key(uri), (route.key, how))
            if earlier_how[1] != how:
                raise ConfigError(
                    route.key,
                    f"writes the same table {uri} as {earlier_how[0]} with other table settings (schema, "
                    "partition_by, schema_evolution, metadata_columns, mode, key, delete_mode, change_columns, "
                    "format, coercions, transforms or filter): give both routes the same ones (one table has one "
                    "pipeline)",
                )
        seen: dict[str, tuple[str, str]] = {}
        for route in self._routes:
            uri = self._uri(route.config)
            if TOPIC_PLACEHOLDER in uri:
                continue
            app_id = route.config.app_id or self._config.table.app_id
            earlier = seen.setdefault(table_key(uri), (route.key, app_id))
            if earlier[1] != app_id:
                raise ConfigError(
                    f"{route.key}.app_id",
                    f"{app_id!r} differs from {earlier[0]}'s {earlier[1]!r}, which writes the same table {uri}",
                )
