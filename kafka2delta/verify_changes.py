"""``kafka2delta verify`` for an upsert table: per key, the table holds the last change of each key, and
nothing else.

The check reads the table (rows and txn versions from one snapshot), then every partition of the topic
from its low watermark up to the table's txn version (what the table says it has applied), runs those
messages through the daemon's own stages (the same config: envelope, key, transforms, coercion), collapses
them to the last change per key (by partition, then offset), and compares: keys the table lacks, keys it
holds that no change left standing, and keys whose values differ (the columns named). Dead letters are
checked too: every message the stages reject must be in the dead-letter table. A topic whose retention
deleted early changes cannot be checked this way (``low`` above 0 is reported and the check fails).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTopicPartition
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from kafka2delta.changes import DELETE_FLAG, DELETED_COLUMN, last_changes_of
from kafka2delta.changes.collapse import UNAVAILABLE_FLAG
from kafka2delta.config import Config
from kafka2delta.errors import ConfigError, RetryableError
from kafka2delta.kafka import topic_partitions
from kafka2delta.pipeline import Pipeline
from kafka2delta.records import PartitionMessages
from kafka2delta.routing import TableSpec

_SHOWN = 10


@dataclass
class ChangesReport:
    topic: str
    table: str
    table_version: int | None
    txns: dict[int, int | None]
    low: dict[int, int]
    keys: int = 0
    """Keys the changes leave standing (rows the table should hold)."""
    missing: list[Any] = field(default_factory=list)
    extra: list[Any] = field(default_factory=list)
    different: list[tuple[Any, list[str]]] = field(default_factory=list)
    """Keys whose row differs, with the columns that differ."""
    dead_letters_missing: list[tuple[int, int]] = field(default_factory=list)
    messages: int = 0

    @property
    def ok(self) -> bool:
        retained = all(low == 0 for low in self.low.values())
        return retained and not (self.missing or self.extra or self.different or self.dead_letters_missing)

    def to_json(self) -> str:
        return json.dumps(
            {
                "topic": self.topic,
                "table": self.table,
                "mode": "upsert",
                "ok": self.ok,
                "table_version": self.table_version,
                "txns": {str(p): v for p, v in self.txns.items()},
                "messages_applied": self.messages,
                "keys": self.keys,
                "missing_keys": [repr(k) for k in self.missing],
                "extra_keys": [repr(k) for k in self.extra],
                "different": [{"key": repr(k), "columns": c} for k, c in self.different],
                "dead_letters_missing": self.dead_letters_missing,
                "low_watermarks": {str(p): v for p, v in self.low.items()},
            },
            indent=2,
        )

    def render(self) -> str:
        lines = [
            f"topic {self.topic} → upsert table {self.table} (version {self.table_version})",
            f"  {self.messages} messages applied (up to the txn versions {self.txns}), {self.keys} keys standing",
        ]
        truncated = {p: low for p, low in self.low.items() if low}
        if truncated:
            lines.append(f"  NOT CHECKABLE: retention deleted the first changes of partitions {truncated}")
        for label, keys in (("missing keys", self.missing), ("extra keys", self.extra)):
            if keys:
                lines.append(f"  {label}: {len(keys)} (e.g. {', '.join(repr(k) for k in keys[:_SHOWN])})")
        if self.different:
            shown = "; ".join(f"{k!r}: {c}" for k, c in self.different[:_SHOWN])
            lines.append(f"  rows that differ: {len(self.different)} ({shown})")
        if self.dead_letters_missing:
            lines.append(f"  dead letters not recorded: {self.dead_letters_missing[:_SHOWN]}")
        lines.append("  OK: the table holds the last change of each key, and nothing else" if self.ok else "  FAILED")
        return "\n".join(lines)


def check_upsert_table(
    config: Config,
    spec: TableSpec,
    topic: str,
    settings: Mapping[str, str],
    dead_letters_of_topic: pc.Expression,
    pipeline_factory: Callable[[pa.Schema, TableSpec], Pipeline] | None,
) -> ChangesReport:
    """:func:`check_changes` for the upsert table ``topic`` goes to (``dead_letters_of_topic`` selects the topic's
    rows of its dead-letter table); ConfigError without the daemon's stages."""
    if pipeline_factory is None:
        raise ConfigError(f"{spec.route}.mode", "verify needs the daemon's stages to check an upsert table")
    options = config.table.storage_options
    return check_changes(
        spec,
        topic,
        config.kafka.bootstrap_servers,
        settings,
        options,
        topic_partitions(config.kafka.bootstrap_servers, topic, settings),
        partial(dead_letter_offsets, spec.dead_letter_uri, options, dead_letters_of_topic),
        pipeline_factory,
    )


def check_changes(
    spec: TableSpec,
    topic: str,
    bootstrap_servers: str,
    settings: Mapping[str, str],
    storage_options: Mapping[str, str],
    partitions: list[int],
    dead_letters: Callable[[], set[tuple[int, int]]],
    pipeline_factory: Callable[[pa.Schema, TableSpec], Pipeline],
) -> ChangesReport:
    """The upsert table of ``spec`` against ``topic``'s changes up to its txn versions. ``dead_letters`` gives
    the ``(partition, offset)`` pairs the dead-letter table holds for the topic."""
    assert spec.changes is not None
    key = list(spec.changes.key)
    try:
        table = DeltaTable(spec.uri, storage_options=dict(storage_options) or None)
        prefix = spec.txn_ids.prefix(topic)
        txns = {p: table.transaction_version(f"{prefix}-{p}") for p in partitions}
        rows = table.to_pyarrow_table()
        version: int | None = table.version()
        schema = pa.schema(table.schema().to_arrow())
    except TableNotFoundError:
        txns, rows, version, schema = dict.fromkeys(partitions), pa.table({}), None, pa.schema([])
    except (DeltaError, OSError) as exc:
        raise RetryableError(f"reading {spec.uri}: {exc}") from exc
    recorded = dead_letters()
    upto = {p: v for p, v in txns.items() if v is not None}
    messages, low = read_changes(bootstrap_servers, topic, settings, upto)
    report = ChangesReport(topic, spec.name, version, txns, low, messages=sum(len(m) for m in messages))
    pipeline = pipeline_factory(schema, spec)
    pieces: list[pa.Table] = []
    deletes: list[pa.Array] = []
    for piece in messages:
        processed = pipeline.process(piece)
        for letter in processed.dead_letters:
            if (letter.partition, letter.offset) not in recorded:
                report.dead_letters_missing.append((letter.partition, letter.offset))
        if processed.rows.num_rows:
            pieces.append(processed.rows)
            flags = processed.row_deletes
            deletes.append(flags if flags is not None else pa.array([False] * processed.rows.num_rows))
    expected_schema = pipeline.schema
    soft = spec.changes.delete_mode == "soft"
    # As the daemon collapses a flush (a whole history is one flush here): unchanged TOASTed values filled from
    # the key's earlier changes (found by review: they were compared as the placeholder).
    changes = (
        last_changes_of(pa.concat_tables(pieces, promote_options="permissive"), pa.concat_arrays(deletes), spec.changes)
        if pieces
        else None
    )
    expected: dict[Any, dict[str, Any]] = {}
    if changes is not None:
        for row in changes.to_pylist():
            deleted = row.pop(DELETE_FLAG)
            if deleted and not soft:
                continue
            expected[_key(row, key)] = row
    actual = {_key(row, key): row for row in rows.to_pylist()} if rows.num_rows else {}
    report.keys = len(expected)
    report.missing = sorted((k for k in expected if k not in actual), key=repr)
    report.extra = sorted((k for k in actual if k not in expected), key=repr)
    compared = [c for c in expected_schema.names if c in schema.names]
    for k in sorted(set(expected) & set(actual), key=repr):
        want, got = expected[k], actual[k]
        if soft and want.get(DELETED_COLUMN):
            compared_here = [c for c in compared if c in key or c == DELETED_COLUMN]
        else:
            compared_here = compared
        # A TOASTed value no change in the history gave (retention deleted it) is the table's to keep.
        differs = [c for c in compared_here if want.get(c) != got.get(c) and not want.get(UNAVAILABLE_FLAG + c)]
        if differs:
            report.different.append((k, differs))
    return report


def _key(row: Mapping[str, Any], key: list[str]) -> Any:
    return row[key[0]] if len(key) == 1 else tuple(row[c] for c in key)


def read_changes(
    bootstrap_servers: str, topic: str, settings: Mapping[str, str], upto: Mapping[int, int], batch: int = 10_000
) -> tuple[list[PartitionMessages], dict[int, int]]:
    """Every message of ``topic`` from each partition's low watermark to ``upto[p]`` (inclusive), in pieces of
    one partition; and the low watermarks."""
    consumer = Consumer(
        {
            **settings,
            "bootstrap.servers": bootstrap_servers,
            "group.id": f"kafka2delta-verify-{uuid.uuid4().hex[:12]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    pieces: list[PartitionMessages] = []
    low: dict[int, int] = {}
    try:
        for partition in upto:
            low[partition], _ = consumer.get_watermark_offsets(KafkaTopicPartition(topic, partition), timeout=30)
        todo = {p for p, last in upto.items() if last >= low[p]}
        consumer.assign([KafkaTopicPartition(topic, p, low[p]) for p in sorted(todo)])
        taken: dict[int, list[Any]] = {p: [] for p in todo}
        while todo:
            for message in consumer.consume(batch, timeout=1.0):
                error = message.error()
                partition, offset = int(message.partition() or 0), int(message.offset() or 0)
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        todo.discard(partition)
                        continue
                    raise RetryableError(f"reading {topic}[{partition}]: {error.str()}")
                if partition in todo and offset <= upto[partition]:
                    taken[partition].append(message)
                if offset >= upto[partition]:
                    todo.discard(partition)
        for partition, found in sorted(taken.items()):
            for start in range(0, len(found), batch):
                chunk = found[start : start + batch]
                pieces.append(
                    PartitionMessages(
                        topic,
                        partition,
                        [m.offset() for m in chunk],
                        [m.value() for m in chunk],
                        [m.timestamp()[1] for m in chunk],
                        [m.key() for m in chunk],
                        [m.headers() for m in chunk],
                        [m.timestamp()[0] for m in chunk],
                    )
                )
    except KafkaException as exc:
        raise RetryableError(f"reading {topic} from {bootstrap_servers}: {exc}") from exc
    finally:
        consumer.close()
    return pieces, low


def dead_letter_offsets(uri: str, storage_options: Mapping[str, str], where: pc.Expression) -> set[tuple[int, int]]:
    """``(partition, offset)`` of the dead letters in ``uri`` that ``where`` selects."""
    try:
        table = DeltaTable(uri, storage_options=dict(storage_options) or None)
    except TableNotFoundError:
        return set()
    except (DeltaError, OSError) as exc:
        raise RetryableError(f"reading {uri}: {exc}") from exc
    rows = table.to_pyarrow_dataset().to_table(columns=["partition", "offset"], filter=where)
    return set(zip(rows.column("partition").to_pylist(), rows.column("offset").to_pylist(), strict=True))
