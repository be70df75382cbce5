"""Command line: ``kafka2delta ingest | status | verify``. The only place besides config that reads the environment.

Exit codes: 0 done, 1 fatal error, 2 bad configuration.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import signal
import sys
from collections.abc import Sequence
from types import FrameType

import pyarrow as pa

from kafka2delta import __version__, faults, verify
from kafka2delta.coercions import CoercionOptions
from kafka2delta.config import Config, load_config
from kafka2delta.coordinator import open_coordinator
from kafka2delta.dead_letters import DeadLetterTable
from kafka2delta.errors import ConfigError, FatalError, Kafka2DeltaError, RetryableError
from kafka2delta.kafka import DeadLetterTopic, KafkaSource, high_watermarks, topic_partitions
from kafka2delta.logs import setup_logging
from kafka2delta.metrics import Metrics
from kafka2delta.offsets import txn_app_id
from kafka2delta.pipeline import Pipeline
from kafka2delta.registry import SchemaRegistry
from kafka2delta.runner import Ingestor
from kafka2delta.schema import parse_schema
from kafka2delta.serialization import build_deserializer
from kafka2delta.spark import commands as spark_commands
from kafka2delta.status import StatusServer
from kafka2delta.transforms import Transformer
from kafka2delta.writer import DeltaWriter

logger = logging.getLogger("kafka2delta")

EXIT_OK, EXIT_FATAL, EXIT_CONFIG = 0, 1, 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kafka2delta", description="Stream a Kafka topic into a Delta table exactly once."
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
    setup_logging(config.logging.level, config.logging.format, config.secret_values())
    try:
        if args.command == "ingest":
            return _ingest(config, args.until_caught_up)
        if args.command == "verify":
            return verify.command(config, args.json, args.timeout, lambda schema: build_pipeline(config, schema))
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


def _open_writer(config: Config, create: bool) -> DeltaWriter:
    columns = config.create_schema_columns()
    schema = parse_schema(columns) if config.table.schema and create else None
    return DeltaWriter.open(
        config.table.uri,
        config.table.storage_options,
        config.app_id,
        config.ingest.compression,
        config.table.checkpoint_interval,
        schema,
        config.table.partition_by,
    )


def build_pipeline(config: Config, table_schema: pa.Schema) -> Pipeline:
    """The stages as configured, fitted to ``table_schema``; a bad expression or format setting is a ConfigError."""
    registry = SchemaRegistry(config.schema_registry) if config.schema_registry.url else None
    deserializer = build_deserializer(config.format, registry, config.kafka.topic)
    transformer = Transformer(config.transforms + config.metadata_transforms, config.filter.expression)
    # kafka.timestamp is epoch milliseconds whatever unit the message's own epochs use.
    epoch_units = {**config.coercions.epoch_units, **({"kafka_timestamp": "ms"} if config.metadata_transforms else {})}
    options = CoercionOptions(config.coercions.epoch_unit, epoch_units)
    if config.format.type == "raw" and config.format.raw_column not in table_schema.names:
        raise ConfigError("format.raw_column", f"column {config.format.raw_column!r} is not in the table")
    return Pipeline(deserializer, table_schema, transformer, options, config.table.schema_evolution)


def _ingest(config: Config, until_caught_up: bool) -> int:
    fault = os.environ.get("K2D_FAULT_INJECT")
    if fault:
        faults.arm(fault)
    logger.info("kafka2delta %s starting", __version__)
    for line in config.summary():
        logger.info("  %s", line)
    logger.debug("full configuration (secrets masked): %s", config.masked())
    writer = _open_writer(config, create=True)
    metrics = Metrics()
    # Headers cost a little per message: read them only when an expression can see the kafka object.
    expressions = [expression for _, expression in config.transforms] + [config.filter.expression]
    with_headers = any("kafka" in expression for expression in expressions)
    source = KafkaSource(config.kafka, partition_eof=until_caught_up, with_headers=with_headers)
    pipeline = build_pipeline(config, writer.schema)
    dead_letters = DeadLetterTable.open(
        config.dead_letter_table_uri,
        config.table.storage_options,
        config.app_id,
        config.kafka.topic,
        config.ingest.compression,
        config.table.checkpoint_interval,
    )
    dead_letter_topic = (
        DeadLetterTopic(config.kafka.bootstrap_servers, config.kafka.settings, config.dead_letters.topic)
        if config.dead_letters.topic
        else None
    )
    # [coordinator] join_ingest: each commit in an "ingest" turn on the table's lock (kafka2delta.coordinator).
    coordinator = open_coordinator(config.coordinator, config.table.uri) if config.coordinator.join_ingest else None
    if coordinator is not None:
        logger.info("joined the job coordinator (%s) on %s", config.coordinator.backend, coordinator.resource)
    ingestor = Ingestor(
        config,
        source=source,
        writer=writer,
        pipeline=pipeline,
        dead_letters=dead_letters,
        metrics=metrics,
        dead_letter_topic=dead_letter_topic,
        coordinator=coordinator,
    )

    def stop(signum: int, frame: FrameType | None) -> None:
        logger.info("received %s: flushing, committing and stopping", signal.Signals(signum).name)
        ingestor.request_stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
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
        if coordinator is not None:
            coordinator.close()
    return EXIT_OK


def _status(config: Config) -> int:
    writer = _open_writer(config, create=False)
    partitions = topic_partitions(config.kafka.bootstrap_servers, config.kafka.topic, config.kafka.settings)
    committed = writer.committed_offsets(partitions)
    last_commit: dict[int, str] = {}
    for entry in writer.history(1000):
        info = entry.get("kafka2delta")
        if not isinstance(info, dict) or info.get("app_id") != config.app_id:
            continue
        when = dt.datetime.fromtimestamp(entry["timestamp"] / 1000, dt.UTC).isoformat(timespec="seconds")
        for partition in info.get("offsets", {}):
            last_commit.setdefault(int(partition), f"{when} (v{entry['version']})")
    watermarks = high_watermarks(config.kafka.bootstrap_servers, config.kafka.topic, partitions, config.kafka.settings)
    print(f"table {config.table.uri} version {writer.version}, topic {config.kafka.topic}, app id {config.app_id}")
    print(f"{'partition':>9} {'txn app id':<24} {'committed':>12} {'high wm':>12} {'lag':>10}  last commit")
    for partition in partitions:
        done = committed[partition]
        high = watermarks[partition]
        lag = high - (done + 1 if done is not None else 0)
        print(
            f"{partition:>9} {txn_app_id(config.app_id, partition):<24} {'-' if done is None else done:>12} "
            f"{high:>12} {lag:>10}  {last_commit.get(partition, '-')}"
        )
    return EXIT_OK
