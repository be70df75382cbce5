"""What ``kafka2delta verify`` reads, apart from the daemon: a topic with its own consumer, and tables at one version.

The topic is read with a fresh group id, its partitions assigned (no group joined, nothing committed), between
offsets given per partition. A segment deleted by retention while it is read stops the check (exit 3) instead of
jumping to the end of the partition. A table is read at ONE version: its txn versions and its rows together.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType  # type: ignore[attr-defined]  # no __all__ there
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from kafka2delta import records
from kafka2delta.errors import ConfigError, RetryableError
from kafka2delta.kafka import new_consumer
from kafka2delta.offsets import mark_in_force, start_mark_id
from kafka2delta.records import PartitionMessages
from kafka2delta.writer import legacy_txn_owner

logger = logging.getLogger(__name__)


# --- the topic -----------------------------------------------------------------------------------


class Deadline:
    """``--timeout``: the time left for the whole check (None: no bound)."""

    def __init__(self, timeout_s: float | None) -> None:
        self.timeout_s = timeout_s
        self._end = None if timeout_s is None else time.monotonic() + timeout_s

    def wait(self, cap: float, what: Callable[[], str]) -> float:
        """How long the next wait may be, at most ``cap``; RetryableError naming ``what()`` when the time is up."""
        if self._end is None:
            return cap
        left = self._end - time.monotonic()
        if left <= 0:
            raise RetryableError(f"{what()}: timed out after {self.timeout_s} s")
        return min(cap, left)


def verify_consumer(bootstrap_servers: str, settings: Mapping[str, str]) -> Consumer:
    return new_consumer(
        {
            **settings,
            "bootstrap.servers": bootstrap_servers,
            # Its own group (never joined: partitions are assigned), nothing committed.
            "group.id": f"kafka2delta-verify-{uuid.uuid4().hex[:12]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            # librdkafka's default jumps to the end when retention deletes the segment being read: every later row
            # would then look unexpected (found by review).
            "auto.offset.reset": "error",
        }
    )


def watermarks(
    consumer: Consumer, topic: str, partitions: Iterable[int], deadline: Deadline
) -> dict[int, tuple[int, int]]:
    """``(low, high)`` of each partition, from the broker now."""
    found = {}
    for partition in partitions:
        wait = deadline.wait(30, lambda: f"watermarks of {topic}[{partition}]")  # noqa: B023 (called at once)
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=wait)
        found[partition] = (int(low), int(high))
    return found


def read_partitions(
    consumer: Consumer, topic: str, ranges: Mapping[int, tuple[int, int]], deadline: Deadline, batch_size: int
) -> Iterator[list[Any]]:
    """The messages of ``topic`` at offsets ``[start, stop)`` of each partition of ``ranges``, a consume call's
    worth at a time, until every partition is read to its stop (or its end, on a transactional topic)."""
    todo = {p for p, (start, stop) in ranges.items() if stop > start}
    reached = {p: start for p, (start, _) in ranges.items()}
    consumer.assign([TopicPartition(topic, p, ranges[p][0]) for p in sorted(todo)])

    def unread() -> str:
        where = ", ".join(f"{p} (at {reached[p]} of {ranges[p][1]})" for p in sorted(todo))
        return f"reading {topic}; partitions {where}"

    try:
        while todo:
            taken = []
            for message in consumer.consume(batch_size, timeout=deadline.wait(1.0, unread)):
                partition, error = int(message.partition() or 0), message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        todo.discard(partition)
                        continue
                    if error.code() == KafkaError._AUTO_OFFSET_RESET:
                        raise RetryableError(
                            f"reading {topic}[{partition}] at {reached.get(partition)}: retention deleted offsets "
                            f"while verify read them; run it again ({error.str()})"
                        )
                    raise RetryableError(f"reading {topic}[{partition}]: {error.str()}")
                offset, stop = int(message.offset() or 0), ranges[partition][1]
                if partition in todo and offset < stop:
                    taken.append(message)
                    reached[partition] = offset + 1
                if offset + 1 >= stop:
                    todo.discard(partition)
            if taken:
                yield taken
    except KafkaException as exc:
        raise RetryableError(f"reading {topic}: {exc}") from exc


def partition_messages(topic: str, partition: int, messages: Sequence[Any]) -> PartitionMessages:
    """Consumed messages of one partition as the daemon's stages take them."""
    return PartitionMessages(
        topic=topic,
        partition=partition,
        offsets=[m.offset() for m in messages],
        payloads=[m.value() for m in messages],
        timestamps_ms=[m.timestamp()[1] for m in messages],
        keys=[m.key() for m in messages],
        headers=[m.headers() for m in messages],
        timestamp_types=[m.timestamp()[0] for m in messages],
    )


def is_compacted(bootstrap_servers: str, topic: str, settings: Mapping[str, str], deadline: Deadline) -> bool:
    """Whether ``topic``'s ``cleanup.policy`` compacts it (offsets inside ``[low, high)`` may be gone); False when
    the broker will not say (the check then counts rows at compacted offsets as unexpected, and says why)."""
    # librdkafka's own lines through Python logging (masked), as every client of the daemon's.
    client: dict[str, Any] = {
        **settings,
        "bootstrap.servers": bootstrap_servers,
        "logger": logging.getLogger("kafka2delta.librdkafka"),
    }
    admin = AdminClient(client)
    resource = ConfigResource(ResourceType.TOPIC, topic)
    wait = deadline.wait(30, lambda: f"cleanup.policy of {topic}")
    try:
        entries = admin.describe_configs([resource], request_timeout=wait)[resource].result(timeout=wait)
    except (KafkaException, TimeoutError) as exc:
        logger.warning(
            "cannot read cleanup.policy of %s (%s): rows at offsets compaction removed count as unexpected", topic, exc
        )
        return False
    policy = entries.get("cleanup.policy")
    return policy is not None and "compact" in str(policy.value or "")


# --- the tables ----------------------------------------------------------------------------------


@dataclass
class TableSnapshot:
    """One version of a table: its txn versions and the ``(partition, offset)`` of its rows."""

    uri: str
    version: int | None
    """None: the table does not exist."""
    schema: pa.Schema | None
    txns: dict[int, int | None]
    rows: pa.Table
    untraced: int = 0
    """Rows with no partition or offset (written before ``metadata_columns`` named them): not checkable."""


def read_table(
    uri: str,
    storage_options: Mapping[str, str],
    app_id: str,
    partitions: Iterable[int],
    partition_column: str,
    offset_column: str,
    where: Callable[[pa.Schema], pc.Expression | None] | None = None,
    *,
    topic: str | None = None,
    legacy_app_id: str | None = None,
) -> TableSnapshot:
    """Txn versions ``<app_id>-<p>`` (``app_id``: the table's txn prefix for the topic, see
    :class:`kafka2delta.offsets.TxnIds`) and rows from ONE version of the table (an absent table is empty).
    Where a partition has no such txn, ``<legacy_app_id>-<p>`` counts when ``topic`` owns the table's one-topic
    ids (the daemon moves them to the new ids the first time it runs; verify may come first)."""
    partitions = list(partitions)
    try:
        table = DeltaTable(uri, storage_options=dict(storage_options) or None)
    except TableNotFoundError:
        return TableSnapshot(uri, None, None, dict.fromkeys(partitions), no_offsets())
    except (DeltaError, OSError) as exc:
        raise RetryableError(f"reading {uri}: {exc}") from exc
    try:
        schema = pa.schema(table.schema().to_arrow())
        for column in (partition_column, offset_column):
            if column not in schema.names:
                raise ConfigError(
                    "table.metadata_columns",
                    f"{uri} has no column {column!r}: verify needs the partition and offset of every row",
                )
        txns = txn_versions(table, uri, app_id, partitions, topic=topic, legacy_app_id=legacy_app_id)
        rows = table.to_pyarrow_dataset().to_table(
            columns=[partition_column, offset_column], filter=where(schema) if where else None
        )
    except (DeltaError, OSError) as exc:
        raise RetryableError(f"reading {uri}: {exc}") from exc
    pairs = offset_pairs(rows, partition_column, offset_column)
    return TableSnapshot(uri, table.version(), schema, txns, pairs, untraced=rows.num_rows - pairs.num_rows)


def start_marks(
    uri: str, storage_options: Mapping[str, str], prefix: str, topic: str, tables: Iterable[str], partitions: list[int]
) -> dict[tuple[str, int], int]:
    """The start marks the dead-letter table at ``uri`` holds for ``topic``'s partitions in ``tables`` (``prefix``:
    its txn prefix for the topic; retired marks left out), by (table, partition). While a table holds no txn of a
    partition it holds it up to its mark: after a crash between two new tables' first commits (DESIGN.md, invariant
    11) the rows of the one not made yet are pending, not lost."""
    try:
        table = DeltaTable(uri, storage_options=dict(storage_options) or None)
    except TableNotFoundError:
        return {}
    except (DeltaError, OSError) as exc:
        raise RetryableError(f"reading {uri}: {exc}") from exc
    marks: dict[tuple[str, int], int] = {}
    try:
        for name in tables:
            for p in partitions:
                mark = mark_in_force(
                    table.transaction_version(start_mark_id(prefix, name, records.TopicPartition(topic, p)))
                )
                if mark is not None:
                    marks[name, p] = mark
    except (DeltaError, OSError) as exc:
        raise RetryableError(f"reading the start marks in {uri}: {exc}") from exc
    return marks


def offset_pairs(rows: pa.Table, partition_column: str, offset_column: str) -> pa.Table:
    """``partition`` and ``offset`` (int64) of the rows that record both (rows written before the metadata columns
    were turned on have nulls there)."""
    rows = rows.filter(pc.and_(rows.column(partition_column).is_valid(), rows.column(offset_column).is_valid()))
    return pa.table(
        {
            "partition": rows.column(partition_column).cast(pa.int64()),
            "offset": rows.column(offset_column).cast(pa.int64()),
        }
    )


def txn_versions(
    table: DeltaTable,
    uri: str,
    app_id: str,
    partitions: Iterable[int],
    *,
    topic: str | None = None,
    legacy_app_id: str | None = None,
) -> dict[int, int | None]:
    """The txn version ``<app_id>-<p>`` of each partition; where there is none, ``<legacy_app_id>-<p>`` when
    ``topic`` owns the table's one-topic ids (as :class:`kafka2delta.writer.DeltaWriter` reads them)."""
    txns = {p: table.transaction_version(f"{app_id}-{p}") for p in partitions}
    if legacy_app_id is not None and topic is not None:
        older = {p: table.transaction_version(f"{legacy_app_id}-{p}") for p, v in txns.items() if v is None}
        if any(v is not None for v in older.values()) and legacy_txn_owner(table, uri)[0] == topic:
            txns.update((p, v) for p, v in older.items() if v is not None)
    return txns


def no_offsets() -> pa.Table:
    """An empty table of ``partition`` and ``offset`` pairs."""
    return pa.table({"partition": pa.array([], pa.int64()), "offset": pa.array([], pa.int64())})


def dead_letter_filter(app_ids: str | Iterable[str], topic: str) -> pc.Expression:
    """The dead letters of ``topic`` written under one of ``app_ids``."""
    ids = [app_ids] if isinstance(app_ids, str) else list(app_ids)
    return pc.field("app_id").isin(ids) & (pc.field("topic") == topic)
