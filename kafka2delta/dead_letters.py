"""The dead-letter table (an edge): messages that failed a stage, never dropped, never blocking the stream.

The record itself is :class:`kafka2delta.records.DeadLetter`. Dead letters go to a dead-letter Delta
table, exactly once like the main table: each dead-letter commit carries a txn per Kafka partition
(``<app_id>-dlq-<partition>``) whose version means "every dead letter of this partition up to this
offset is recorded", and it is made BEFORE the main table's commit of the same batch. After a crash
between the two commits the replay finds, for offsets in (main txn, dead-letter txn], which ones are
already dead letters (:meth:`DeadLetterTable.recorded_offsets`) and takes them as final: no
duplicate dead letter, none lost, and no message both a row and a dead letter. Optionally each dead
letter is also produced to a Kafka topic (:class:`kafka2delta.kafka.DeadLetterTopic`; at least once:
it is produced before the table commit, so a retry can produce it twice).

The table also keeps the start marks of tables that do not exist yet (:meth:`DeadLetterTable.mark_starts`):
txns of their own, no rows.
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from kafka2delta.config import without_credentials
from kafka2delta.errors import FatalError, SchemaChanged
from kafka2delta.offsets import mark_in_force, start_mark_id
from kafka2delta.records import DeadLetter, OffsetRange, TopicPartition
from kafka2delta.writer import DeltaWriter, LegacyTxnId

logger = logging.getLogger(__name__)

DEAD_LETTER_SCHEMA = pa.schema(
    [
        pa.field("app_id", pa.string(), nullable=False),
        pa.field("topic", pa.string(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("key_base64", pa.string()),
        pa.field("payload_base64", pa.string()),
        pa.field("payload_json", pa.string()),
        pa.field("table", pa.string()),
        pa.field("stage", pa.string(), nullable=False),
        pa.field("error", pa.string(), nullable=False),
        pa.field("ingested_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("date", pa.date32(), nullable=False),
    ]
)
PARTITION_BY = ("date",)


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def dead_letter_rows(letters: Sequence[DeadLetter], app_id: str, ingested_at: dt.datetime) -> pa.Table:
    """The dead-letter table's rows for ``letters`` (``date`` is the UTC day they were recorded)."""
    count = len(letters)
    return pa.table(
        {
            "app_id": [app_id] * count,
            "topic": [letter.topic for letter in letters],
            "partition": [letter.partition for letter in letters],
            "offset": [letter.offset for letter in letters],
            "timestamp": pa.array(
                [
                    None if letter.timestamp_ms is None or letter.timestamp_ms < 0 else letter.timestamp_ms * 1000
                    for letter in letters
                ],
                pa.int64(),
            ).cast(pa.timestamp("us", tz="UTC")),
            "key_base64": [_b64(letter.key) for letter in letters],
            "payload_base64": [_b64(letter.payload) for letter in letters],
            "payload_json": [letter.payload_json for letter in letters],
            "table": [letter.table for letter in letters],
            "stage": [letter.stage for letter in letters],
            "error": [letter.reason for letter in letters],
            "ingested_at": pa.array([ingested_at] * count, pa.timestamp("us", tz="UTC")),
            "date": pa.array([ingested_at.date()] * count, pa.date32()),
        },
        schema=DEAD_LETTER_SCHEMA,
    )


class DeadLetterTable:
    """The daemon's dead-letter Delta table, with its own txn per topic partition."""

    def __init__(
        self,
        writer: DeltaWriter,
        prefix: Callable[[str], str],
        app_ids: Callable[[str], Sequence[str]] | None = None,
        names_topic: Callable[[str], bool] | None = None,
    ) -> None:
        """``app_ids``: every ``app_id`` a topic's dead letters carry (default: its prefix alone);
        ``names_topic``: whether a topic's dead-letter txn ids name the topic (default: no)."""
        self._app_ids = app_ids or (lambda topic: (prefix(topic),))
        self._names_topic = names_topic or (lambda topic: False)
        self._writer = writer
        self._prefix = prefix

    @classmethod
    def open(
        cls,
        uri: str,
        storage_options: Mapping[str, str],
        prefix: Callable[[str], str],
        compression: str,
        checkpoint_interval: int,
        legacy_txn_id: LegacyTxnId | None = None,
        app_ids: Callable[[str], Sequence[str]] | None = None,
        names_topic: Callable[[str], bool] | None = None,
    ) -> DeadLetterTable:
        """Open (or create) the table. ``prefix`` gives each topic's app id (the ``app_id`` column, and the txn
        app ids ``<prefix>-dlq-<partition>``; see :class:`kafka2delta.offsets.TxnIds`). A table made by an
        earlier release gets the ``table`` column it lacks (nullable: its older rows read null there)."""

        def txn_id(tp: TopicPartition) -> str:
            return f"{prefix(tp.topic)}-dlq-{tp.partition}"

        writer = DeltaWriter.open(
            uri,
            storage_options,
            txn_id,
            compression,
            checkpoint_interval,
            DEAD_LETTER_SCHEMA,
            PARTITION_BY,
            legacy_txn_id,
        )
        missing = [f for f in DEAD_LETTER_SCHEMA if f.nullable and f.name not in writer.schema.names]
        if missing:
            writer.add_nullable_columns(missing)
            logger.info("added columns %s to the dead-letter table %s", [f.name for f in missing], uri)
        return cls(writer, prefix, app_ids, names_topic)

    @property
    def uri(self) -> str:
        return self._writer.uri

    def committed_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]:
        return self._writer.committed_offsets(partitions)

    def start_marks(self, table: str, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]:
        """Where each partition starts in ``table`` as :meth:`mark_starts` recorded it (None: no mark, or retired)."""
        return {tp: mark_in_force(mark) for tp, mark in self._marks(table).committed_offsets(partitions).items()}

    def mark_starts(self, table: str, starts: Mapping[TopicPartition, int]) -> int:
        """Record where partitions start in ``table`` (the last offset before it, or :data:`RETIRED_MARK`: no mark
        any more), a table of ``[routing] expression`` with no txn for them: one made by its first rows, whose first
        commit would follow another such table's in a flush (DESIGN.md, invariant 11). A txn-only commit here, app
        ids ``<prefix>-<topic>-start-<table hash>-<partition>``, read back while ``table`` holds no txn of its own
        for the partition. Conditional on the marks read just before; raises like :meth:`commit` (CommitConflict:
        another process marked them meanwhile)."""
        metadata = {"operation": "mark starts", "table": without_credentials(table), "rows": 0, "marks_start": True}
        marks = self._marks(table)
        # A txn-only commit fits any schema, but is checked against it too: the view takes the table's own, and the
        # dead-letter writer keeps its (its commits must still see another writer's change: found by review).
        marks.refresh_schema()
        return marks.commit([], marks.committed_offsets(starts), dict(starts), metadata)

    def _marks(self, table: str) -> DeltaWriter:
        return self._writer.under_txn_ids(lambda tp: start_mark_id(self._prefix(tp.topic), table, tp))

    def recorded_offsets(self, tp: TopicPartition, after: int | None, upto: int) -> set[int]:
        """Offsets in (after, upto] of ``tp`` that are dead letters in the table."""
        predicate = (
            pc.field("app_id").isin(list(self._app_ids(tp.topic)))
            & (pc.field("topic") == tp.topic)
            & (pc.field("partition") == tp.partition)
            & (pc.field("offset") <= upto)
        )
        if after is not None:
            predicate = predicate & (pc.field("offset") > after)
        found = self._writer.scan(["offset"], predicate)
        return set(found.column("offset").to_pylist())

    def commit(
        self,
        letters: Mapping[TopicPartition, Sequence[DeadLetter]],
        expected: Mapping[TopicPartition, int | None],
        versions: Mapping[TopicPartition, int],
        metadata: dict[str, Any],
    ) -> int:
        """Record ``letters`` (by topic partition) and set the partitions' txns to ``versions`` in one commit.

        Raises CommitConflict, SchemaChanged (the table was altered) or RetryableError like the main table.
        """
        # Whether *these* txn ids name the topic (the caller's metadata says so of its main table's): a later start
        # that must find which topic wrote one-topic txn ids looks for commits without it (found by review).
        metadata = {**metadata, "multi_topic": any(self._names_topic(tp.topic) for tp in versions)}
        now = dt.datetime.now(dt.UTC)
        actions = []
        for tp, batch in sorted(letters.items()):
            if batch:
                offsets = OffsetRange(min(lt.offset for lt in batch), max(lt.offset for lt in batch))
                rows = dead_letter_rows(batch, self._prefix(tp.topic), now)
                actions += self._writer.write_files(tp, offsets, rows)
        try:
            return self._writer.commit(actions, expected, versions, metadata)
        except SchemaChanged as changed:
            # Someone altered the dead-letter table. Our files stay valid as long as every column we
            # write is still there with its type (added columns read as null for our rows).
            schema = changed.schema
            missing = [
                f.name for f in DEAD_LETTER_SCHEMA if f.name not in schema.names or schema.field(f.name).type != f.type
            ]
            if missing:
                raise FatalError(
                    f"the dead-letter table {self.uri} was altered: columns {missing} are gone or retyped"
                ) from changed
            logger.warning("the dead-letter table %s was altered (now %s); committing into it", self.uri, schema)
            return self._writer.commit(actions, expected, versions, metadata)
