"""Command line: ``kafka2delta ingest | status | verify``. The only place besides config that reads the environment.

Exit codes: 0 done, 1 fatal error, 2 bad configuration.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from functools import partial
from types import FrameType

import pyarrow as pa

from kafka2delta import __version__, faults, startup, verify
from kafka2delta.changes import ChangeDeserializer
from kafka2delta.coercions import CoercionOptions
from kafka2delta.config import Config, load_config
from kafka2delta.coordinator import open_coordinator
from kafka2delta.dead_letters import DeadLetterTable
from kafka2delta.deferred_tables import DeferredTable, open_delta_table
from kafka2delta.errors import ConfigError, FatalError, Kafka2DeltaError, RetryableError
from kafka2delta.kafka import DeadLetterTopic, KafkaSource, high_watermarks, subscribed_topics, topic_partitions
from kafka2delta.logs import Redactor, setup_logging
from kafka2delta.metrics import Metrics
from kafka2delta.pipeline import Pipeline
from kafka2delta.records import TopicPartition
from kafka2delta.registry import SchemaRegistry
from kafka2delta.registry_glue import GlueRegistry
from kafka2delta.routing import Routes, TableSpec
from kafka2delta.runner import Ingestor
from kafka2delta.schema import parse_schema
from kafka2delta.serialization import Deserializer, build_deserializer, build_key_decoder
from kafka2delta.spark import commands as spark_commands
from kafka2delta.splitting import ROUTE_COLUMN, ROUTE_SCHEMA
from kafka2delta.status import StatusServer
from kafka2delta.tables import OpenedTable
from kafka2delta.transforms import Transformer
from kafka2delta.writer import DeltaWriter

logger = logging.getLogger("kafka2delta")

EXIT_OK, EXIT_FATAL, EXIT_CONFIG = 0, 1, 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kafka2delta", description="Stream Kafka topics into Delta tables exactly once."
    )
    parser.add_argument("--version", action="version", version=f"kafka2delta {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    ingest = commands.add_parser("ingest", help="run the ingest daemon")
    ingest.add_argument("-c", "--config", help="TOML config file (K2D_* environment variables override it)")
    ingest.add_argument(
        "--until-caught-up",
        action="store_true",
        help="stop once every assigned partition reaches the high watermark seen at start, everything committed",
    )
    status = commands.add_parser("status", help="per partition: committed offset in the table, high watermark, lag")
    status.add_argument("-c", "--config", help="TOML config file (K2D_* environment variables override it)")
    check = commands.add_parser(
        "verify",
        help="check the topic against the table and the dead-letter table: lost, duplicated (exit 1 on any)",
    )
    check.add_argument("-c", "--config", help="TOML config file (K2D_* environment variables override it)")
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    check.add_argument("--timeout", type=float, default=None, metavar="S", help="give up reading the topic after S s")
    spark_commands.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"kafka2delta: config error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    redact = Redactor(config.secret_values())  # the logs' and the status page's
    setup_logging(config.logging.level, config.logging.format, redact)
    if args.command != "ingest":
        startup.release()  # only the daemon's start-up turns a stop signal into a clean exit
    try:
        if args.command == "ingest":
            return _ingest(config, args.until_caught_up, redact)
        if args.command == "verify":
            return verify.command(config, args.json, args.timeout, partial(build_pipeline, config))
        if args.command in spark_commands.COMMANDS:
            return spark_commands.run(args, config)
        return _status(config)
    except ConfigError as exc:
        logger.error("config error: %s", exc)
        return EXIT_CONFIG
    except (FatalError, RetryableError) as exc:
        logger.error("fatal: %s", exc)
        return EXIT_FATAL
    except Kafka2DeltaError as exc:
        logger.error("fatal: %s", exc)
        return EXIT_FATAL


def open_table(config: Config, spec: TableSpec) -> OpenedTable:
    """A routed table as the daemon writes it: the Delta table (created from the route's columns when it does
    not exist, or later from its first rows when it has none), its pipeline, and its coordinator."""
    if not spec.columns and spec.format.type in ("json", "raw") and spec.schema_evolution != "merge":
        raise ConfigError(
            f"{spec.route}.schema",
            f'table {spec.uri} has no schema: give one, or set schema_evolution = "merge" to take it from the '
            "first batch",
        )
    writer = open_table_writer(config, spec, create=True)
    coordinator = open_coordinator(config.coordinator, spec.uri) if config.coordinator.join_ingest else None
    if coordinator is not None:
        logger.info("joined the job coordinator (%s) on %s", config.coordinator.backend, coordinator.resource)
    return OpenedTable(writer=writer, pipeline=build_pipeline(config, writer.schema, spec), coordinator=coordinator)


def open_table_writer(config: Config, spec: TableSpec, create: bool) -> DeltaWriter | DeferredTable:
    """The Delta edge of a routed table (``create=False``: an existing one only; ConfigError otherwise)."""
    schema = parse_schema(dict(spec.columns)) if spec.columns and create else None
    return open_delta_table(
        spec.uri,
        config.table.storage_options,
        spec.txn_ids.main,
        config.ingest.compression,
        config.table.checkpoint_interval,
        schema,
        spec.partition_by,
        spec.txn_ids.legacy_main,
        defer=create,
    )


def open_registry(config: Config) -> SchemaRegistry | GlueRegistry | None:
    """The schema-registry edge of ``[schema_registry]`` (None when none is configured)."""
    if config.schema_registry.type == "glue":
        return GlueRegistry(config.schema_registry)
    return SchemaRegistry(config.schema_registry) if config.schema_registry.url else None


def build_pipeline(config: Config, table_schema: pa.Schema, spec: TableSpec | None = None) -> Pipeline:
    """The stages as configured, fitted to ``table_schema`` (of ``spec``'s table; default: ``[table]``'s);
    a bad expression or format setting is a ConfigError."""
    registry = open_registry(config)
    fmt, fmt_at = (spec.format, spec.format_key) if spec is not None else (config.format, "format")
    try:
        deserializer: Deserializer = build_deserializer(fmt, registry, config.kafka.topic)
    except ConfigError as exc:  # it names [format]'s keys: name the route's where the format is its own
        raise ConfigError(exc.key.replace("format", fmt_at, 1), exc.problem) from exc
    changes = spec.changes if spec is not None else None
    if changes is not None:
        deserializer = ChangeDeserializer(deserializer, build_key_decoder(fmt, registry), changes)
    metadata_columns = spec.metadata_columns if spec is not None else config.table.metadata_columns
    metadata = tuple((f"kafka_{name}", f"kafka.{name}") for name in metadata_columns)
    if spec is None:
        transformer = Transformer(config.transforms + metadata, config.filter.expression)
    else:
        transformer = Transformer(
            spec.transforms + metadata, spec.filter, key=spec.transforms_key, filter_key=spec.filter_key
        )
    # kafka.timestamp is epoch milliseconds whatever unit the message's own epochs use.
    coercions = spec.coercions if spec is not None else config.coercions
    epoch_units = {**coercions.epoch_units, **({"kafka_timestamp": "ms"} if metadata else {})}
    options = CoercionOptions(coercions.epoch_unit, epoch_units)
    if fmt.type == "raw" and fmt.raw_column not in table_schema.names and table_schema.names:
        raise ConfigError(f"{fmt_at}.raw_column", f"column {fmt.raw_column!r} is not in the table")
    evolution = spec.schema_evolution if spec is not None else config.table.schema_evolution
    return Pipeline(
        deserializer,
        table_schema,
        transformer,
        options,
        "merge" if evolution == "merge" else "none",
        table=spec.name if spec is not None else None,
        changes=changes,
        # A table created from its first batch takes that batch's fields (Avro/Protobuf: its writer schema).
        creates_table=spec is not None and not spec.columns,
    )


def build_router(config: Config) -> Pipeline:
    """The route stage's pipeline (``[routing] expression``): decode and transform as the tables do, then put the
    expression's value in the router's one column."""
    registry = open_registry(config)
    deserializer = build_deserializer(config.format, registry, config.kafka.topic)
    transformer = Transformer((*config.transforms, (ROUTE_COLUMN, config.routing.expression)), config.filter.expression)
    options = CoercionOptions(config.coercions.epoch_unit, dict(config.coercions.epoch_units))
    return Pipeline(deserializer, ROUTE_SCHEMA, transformer, options, "none")


def _ingest(config: Config, until_caught_up: bool, redact: Callable[[str], str] | None = None) -> int:
    faults.arm_from_environment()
    logger.info("kafka2delta %s starting", __version__)
    for line in config.summary():
        logger.info("  %s", line)
    logger.debug("full configuration (secrets masked): %s", config.masked())
    metrics = Metrics()
    routes = Routes(config)
    # Headers cost a little per message: read them only when an expression can see the kafka object.
    expressions = [expression for _, expression in config.transforms] + [config.filter.expression]
    expressions.append(config.routing.expression)
    for route in config.routes:
        expressions += [expression for _, expression in route.transforms or ()] + [route.filter or ""]
    with_headers = any("kafka" in expression for expression in expressions)
    source = KafkaSource(config.kafka, partition_eof=until_caught_up, with_headers=with_headers)
    dead_letters = open_dead_letters(config, routes)
    dead_letter_topic = (
        DeadLetterTopic(config.kafka.bootstrap_servers, config.kafka.settings, config.dead_letters.topic)
        if config.dead_letters.topic
        else None
    )
    ingestor = Ingestor(
        config,
        source=source,
        tables=lambda spec: open_table(config, spec),
        routes=routes,
        dead_letters=dead_letters,
        metrics=metrics,
        dead_letter_topic=dead_letter_topic,
        router=(lambda: build_router(config)) if config.routing.expression else None,
        dead_letter_opener=lambda uri: open_dead_letters(config, routes, uri),
        redact=redact,
    )

    def stop(signum: int, frame: FrameType | None) -> None:
        ingestor.request_stop(signal.Signals(signum).name)  # no lock, no log line here: see request_stop

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    early = startup.received()
    if early is not None:  # came during start-up, and its exception was swallowed on the way (startup.received)
        logger.warning("received %s during start-up: stopping now that the loop is ready", early)
        ingestor.request_stop(early)
    # /metrics, /healthz, /readyz and the status page; the server threads only read the loop's snapshots.
    server = (
        StatusServer(config.metrics.host, config.metrics.port, metrics.registry, ingestor.status).start()
        if config.metrics.port
        else None
    )
    try:
        ingestor.run(until_caught_up=until_caught_up)
    finally:
        if server is not None:
            server.close()
    return EXIT_OK


def open_dead_letters(config: Config, routes: Routes, uri: str | None = None) -> DeadLetterTable:
    """The daemon's dead-letter table (or a route's own, ``uri``); each topic's app id (txn ids, ``app_id``
    column) from its route."""

    def legacy(tp: TopicPartition) -> str | None:
        return routes.dead_letter_txn_ids(tp.topic).legacy_dead_letters(tp)

    return DeadLetterTable.open(
        uri or config.dead_letter_table_uri,
        config.table.storage_options,
        routes.dead_letter_prefix,
        config.ingest.compression,
        config.table.checkpoint_interval,
        legacy,
        routes.dead_letter_app_ids,
        lambda topic: routes.dead_letter_txn_ids(topic).multi_topic,
    )


def _status(config: Config) -> int:
    """Per table and topic partition: the txn version in the table, the high watermark, the lag (with
    ``[routing] expression``, every table a topic's messages can go to)."""
    settings = config.kafka.settings
    routes = Routes(config)
    for topic in subscribed_topics(config.kafka.bootstrap_servers, config.kafka, settings):
        partitions = [
            TopicPartition(topic, p) for p in topic_partitions(config.kafka.bootstrap_servers, topic, settings)
        ]
        watermarks = high_watermarks(
            config.kafka.bootstrap_servers, topic, [tp.partition for tp in partitions], settings
        )
        for spec in routes.tables_of(topic):
            _status_table(config, spec, topic, partitions, watermarks)
    return EXIT_OK


def _status_table(
    config: Config, spec: TableSpec, topic: str, partitions: list[TopicPartition], watermarks: dict[int, int]
) -> None:
    try:
        writer: DeltaWriter | DeferredTable | None = open_table_writer(config, spec, create=False)
    except ConfigError:
        writer = None  # not created yet
    committed = writer.committed_offsets(partitions) if writer is not None else dict.fromkeys(partitions)
    last_commit: dict[int, str] = {}
    for entry in writer.history(1000) if isinstance(writer, DeltaWriter) else []:
        info = entry.get("kafka2delta")
        if not isinstance(info, dict):
            continue
        when = dt.datetime.fromtimestamp(entry["timestamp"] / 1000, dt.UTC).isoformat(timespec="seconds")
        offsets = info.get("topics", {}).get(topic) or (info.get("offsets", {}) if info.get("topic") == topic else {})
        for partition in offsets:
            last_commit.setdefault(int(partition), f"{when} (v{entry['version']})")
    version = writer.version if writer is not None else "(not created)"
    print(f"table {spec.uri} version {version}, topic {topic}")
    print(f"{'partition':>9} {'txn app id':<32} {'committed':>12} {'high wm':>12} {'lag':>10}  last commit")
    for tp in partitions:
        done = committed[tp]
        high = watermarks[tp.partition]
        lag = high - (done + 1 if done is not None else 0)
        print(
            f"{tp.partition:>9} {spec.txn_ids.main(tp):<32} {'-' if done is None else done:>12} "
            f"{high:>12} {lag:>10}  {last_commit.get(tp.partition, '-')}"
        )
