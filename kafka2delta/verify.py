"""An independent exactly-once checker: the topic, read with its own consumer, against both tables.

``kafka2delta verify -c config.toml`` reads every partition of the topic from its low to its high
watermark (no consumer group, nothing committed), the main table's metadata columns (partition and
offset of each row, see ``table.metadata_columns``) and the dead-letter table, and reports per
partition: messages produced, rows, dead letters, expected skips (empty payloads, and messages the
configured filter drops), missing offsets, duplicated offsets, offsets present in both tables, rows
at offsets the topic does not hold; plus gaps in the Delta log versions. Offsets after the main
table's txn version are not final yet: they are reported as pending, never as missing.

It shares no state with the daemon; it only reuses the deserializer and transforms to tell which
messages the filter drops.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from kafka2delta.batches import PartitionMessages
from kafka2delta.errors import ConfigError, MessageError, RetryableError
from kafka2delta.offsets import txn_app_id
from kafka2delta.writer import log_versions

_SHOWN = 20  # offsets listed per problem in the text report (the JSON report has them all)


@dataclass
class PartitionReport:
    partition: int
    low: int
    """First offset on the broker (earlier ones were deleted by retention)."""
    high: int
    """High watermark when the check started: offsets [low, high) were read."""
    produced: int
    committed: int | None
    """The main table's txn version: offsets up to it are final."""
    rows: int
    dead_letters: int
    skipped: int
    """Final offsets that are expected in neither table: empty payloads and filtered messages."""
    pending: int
    """Offsets after the txn version (the daemon has not committed them yet)."""
    missing: list[int] = field(default_factory=list)
    duplicated: list[int] = field(default_factory=list)
    in_both: list[int] = field(default_factory=list)
    unexpected: list[int] = field(default_factory=list)
    """Rows or dead letters at offsets the topic does not hold (or another topic's, mislabelled)."""

    @property
    def ok(self) -> bool:
        return not (self.missing or self.duplicated or self.in_both or self.unexpected)


@dataclass
class Report:
    topic: str
    table_uri: str
    dead_letter_uri: str
    partitions: list[PartitionReport]
    log_gaps: list[int] = field(default_factory=list)
    """Versions missing between the oldest and newest commit file of the main table's log."""
    dead_letter_log_gaps: list[int] = field(default_factory=list)

    @property
    def lost(self) -> int:
        return sum(len(p.missing) for p in self.partitions)

    @property
    def duplicated(self) -> int:
        return sum(len(p.duplicated) for p in self.partitions)

    @property
    def ok(self) -> bool:
        return all(p.ok for p in self.partitions) and not self.log_gaps and not self.dead_letter_log_gaps

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        data.update(ok=self.ok, lost=self.lost, duplicated_total=self.duplicated)
        return json.dumps(data, indent=2)

    def render(self) -> str:
        lines = [
            f"topic {self.topic} → table {self.table_uri} (dead letters: {self.dead_letter_uri})",
            f"{'partition':>9} {'produced':>10} {'committed':>10} {'rows':>10} {'dead':>7} {'skipped':>8} "
            f"{'pending':>8} {'missing':>8} {'dup':>6} {'both':>6} {'unexp':>6}",
        ]
        for p in self.partitions:
            lines.append(
                f"{p.partition:>9} {p.produced:>10} {'-' if p.committed is None else p.committed:>10} {p.rows:>10} "
                f"{p.dead_letters:>7} {p.skipped:>8} {p.pending:>8} {len(p.missing):>8} {len(p.duplicated):>6} "
                f"{len(p.in_both):>6} {len(p.unexpected):>6}"
            )
            for name in ("missing", "duplicated", "in_both", "unexpected"):
                offsets: list[int] = getattr(p, name)
                if offsets:
                    more = f" … ({len(offsets)} in all)" if len(offsets) > _SHOWN else ""
                    lines.append(f"{'':>9} {name} offsets: {offsets[:_SHOWN]}{more}")
        if self.log_gaps:
            lines.append(f"gaps in the table's log versions: {self.log_gaps[:_SHOWN]}")
        if self.dead_letter_log_gaps:
            lines.append(f"gaps in the dead-letter table's log versions: {self.dead_letter_log_gaps[:_SHOWN]}")
        verdict = "OK" if self.ok else "FAILED"
        lines.append(f"{verdict}: lost {self.lost}, duplicated {self.duplicated}")
        return "\n".join(lines)


@dataclass
class TopicOffsets:
    """What the topic holds, per partition: the offsets read and those expected in neither table."""

    low: dict[int, int]
    high: dict[int, int]
    offsets: dict[int, np.ndarray]
    skipped: dict[int, np.ndarray]


Skip = Callable[[PartitionMessages], bool]
"""Given one message (as a PartitionMessages of one), whether it is expected in neither table (filtered)."""


def read_topic(
    bootstrap_servers: str,
    topic: str,
    settings: Mapping[str, str],
    is_skipped: Skip | None = None,
    batch_size: int = 10_000,
) -> TopicOffsets:
    """Read every partition from its low watermark to the high watermark seen now."""
    consumer = Consumer(
        {
            **settings,
            "bootstrap.servers": bootstrap_servers,
            "group.id": "kafka2delta-verify",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        metadata = consumer.list_topics(topic, timeout=30).topics.get(topic)
        if metadata is None or metadata.error is not None:
            raise ConfigError("kafka.topic", f"topic {topic!r} does not exist")
        partitions = sorted(metadata.partitions)
        low: dict[int, int] = {}
        high: dict[int, int] = {}
        for partition in partitions:
            low[partition], high[partition] = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=30
            )
        todo = {p for p in partitions if high[p] > low[p]}
        consumer.assign([TopicPartition(topic, p, low[p]) for p in sorted(todo)])
        offsets: dict[int, list[int]] = {p: [] for p in partitions}
        skipped: dict[int, list[int]] = {p: [] for p in partitions}
        while todo:
            for message in consumer.consume(batch_size, timeout=1.0):
                _take(message, topic, high, todo, offsets, skipped, is_skipped)
        return TopicOffsets(
            low,
            high,
            {p: np.array(found, np.int64) for p, found in offsets.items()},
            {p: np.array(sorted(found), np.int64) for p, found in skipped.items()},
        )
    except KafkaException as exc:
        raise RetryableError(f"reading {topic} from {bootstrap_servers}: {exc}") from exc
    finally:
        consumer.close()


def _take(
    message: Any,
    topic: str,
    high: Mapping[int, int],
    todo: set[int],
    offsets: dict[int, list[int]],
    skipped: dict[int, list[int]],
    is_skipped: Skip | None,
) -> None:
    partition, offset = message.partition(), message.offset()
    error = message.error()
    if error is not None:
        if error.code() == KafkaError._PARTITION_EOF:
            todo.discard(partition)
            return
        raise RetryableError(f"reading {topic}[{partition}]: {error.str()}")
    if partition not in todo or offset >= high[partition]:
        if offset + 1 >= high[partition]:
            todo.discard(partition)
        return
    offsets[partition].append(offset)
    payload = message.value()
    if not payload:
        skipped[partition].append(offset)
    elif is_skipped is not None:
        single = PartitionMessages(
            topic, partition, [offset], [payload], [message.timestamp()[1]], [message.key()], [message.headers()], [0]
        )
        if is_skipped(single):
            skipped[partition].append(offset)
    if offset + 1 >= high[partition]:
        todo.discard(partition)


def table_offsets(
    uri: str,
    storage_options: Mapping[str, str],
    partition_column: str,
    offset_column: str,
    where: pa.compute.Expression | None = None,
) -> pa.Table:
    """``(partition, offset)`` of every row of a table (``where`` restricts rows), or an empty table."""
    try:
        table = DeltaTable(uri, storage_options=dict(storage_options))
    except TableNotFoundError:
        return pa.table({"partition": pa.array([], pa.int64()), "offset": pa.array([], pa.int64())})
    except (DeltaError, OSError) as exc:
        raise RetryableError(f"reading {uri}: {exc}") from exc
    names = pa.schema(table.schema().to_arrow()).names
    for column in (partition_column, offset_column):
        if column not in names:
            raise ConfigError(
                "table.metadata_columns",
                f"{uri} has no column {column!r}: verify needs the partition and offset of every row",
            )
    rows = table.to_pyarrow_dataset().to_table(columns=[partition_column, offset_column], filter=where)
    return pa.table(
        {
            "partition": rows.column(partition_column).cast(pa.int64()),
            "offset": rows.column(offset_column).cast(pa.int64()),
        }
    )


def committed_versions(
    uri: str, storage_options: Mapping[str, str], app_id: str, partitions: Iterable[int]
) -> dict[int, int | None]:
    try:
        table = DeltaTable(uri, storage_options=dict(storage_options))
    except TableNotFoundError:
        return dict.fromkeys(partitions)
    return {p: table.transaction_version(txn_app_id(app_id, p)) for p in partitions}


def compare(
    topic: TopicOffsets,
    rows: pa.Table,
    dead_letters: pa.Table,
    committed: Mapping[int, int | None],
) -> list[PartitionReport]:
    """Per partition: what the topic holds against the rows and dead letters."""
    reports = []
    row_groups = _by_partition(rows)
    letter_groups = _by_partition(dead_letters)
    for partition in sorted(topic.offsets):
        produced = topic.offsets[partition]
        row_offsets = row_groups.get(partition, np.empty(0, np.int64))
        letter_offsets = letter_groups.get(partition, np.empty(0, np.int64))
        done = committed.get(partition)
        final = produced[produced <= done] if done is not None else produced[:0]
        skipped = np.intersect1d(topic.skipped[partition], final)
        outcome = np.concatenate([row_offsets, letter_offsets])
        expected = np.setdiff1d(final, skipped)
        allowed = np.setdiff1d(produced, skipped)  # offsets where a row or a dead letter may be
        reports.append(
            PartitionReport(
                partition=partition,
                low=topic.low[partition],
                high=topic.high[partition],
                produced=int(produced.size),
                committed=done,
                rows=int(row_offsets.size),
                dead_letters=int(letter_offsets.size),
                skipped=int(skipped.size),
                pending=int(produced.size - final.size),
                missing=_ints(np.setdiff1d(expected, outcome)),
                duplicated=_ints(np.union1d(_repeated(row_offsets), _repeated(letter_offsets))),
                in_both=_ints(np.intersect1d(row_offsets, letter_offsets)),
                unexpected=_ints(np.setdiff1d(np.union1d(row_offsets, letter_offsets), allowed)),
            )
        )
    return reports


def _by_partition(table: pa.Table) -> dict[int, np.ndarray]:
    if table.num_rows == 0:
        return {}
    partitions = table.column("partition").to_numpy()
    offsets = table.column("offset").to_numpy()
    return {int(p): offsets[partitions == p] for p in np.unique(partitions)}


def _repeated(offsets: np.ndarray) -> np.ndarray:
    values, counts = np.unique(offsets, return_counts=True)
    return values[counts > 1]


def _ints(values: np.ndarray) -> list[int]:
    return [int(v) for v in values]


def log_gaps(uri: str, storage_options: Mapping[str, str]) -> list[int]:
    """Versions missing between the oldest and the newest commit file of a table's log."""
    versions = log_versions(uri, storage_options)
    if not versions:
        return []
    present = set(versions)
    return [v for v in range(min(versions), max(versions) + 1) if v not in present]


def dead_letter_filter(app_id: str, topic: str) -> pa.compute.Expression:
    return (pc.field("app_id") == app_id) & (pc.field("topic") == topic)


def skip_by_filter(document: Callable[[PartitionMessages], Any]) -> Skip:
    """A :data:`Skip` from a function that returns the transformed document or None when filtered;
    a message the stages reject is a dead letter, not a skip."""

    def is_skipped(messages: PartitionMessages) -> bool:
        try:
            return document(messages) is None
        except MessageError:
            return False

    return is_skipped
