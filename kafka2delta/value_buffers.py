"""Buffers of coerced rows, one per partition and table, and the flush decision (pure; the clock is passed in).

A buffer also tracks the offsets of messages that became dead letters or skips: they advance the
partition's txn version in the next commit even when they add no row. A lane of an unpartitioned append table
encodes its rows into its next file's Parquet row groups as they arrive (:mod:`kafka2delta.encoded_rows`), so
what it holds is mostly compressed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from kafka2delta.encoded_rows import EncodedFile, EncodedRows, RowGroups
from kafka2delta.errors import RowGroupRefused
from kafka2delta.records import DeadLetter, ProcessedPartition, TopicPartition
from kafka2delta.schema import conform


@dataclass
class PartitionBuffer:
    tp: TopicPartition
    table: str
    """The URI of the table these rows go to."""
    first_offset: int
    last_offset: int
    first_arrival: float
    tables: list[pa.Table] = field(default_factory=list)
    """The rows not encoded yet (all of them for a lane that does not encode), in arrival order after ``encoded``."""
    encoded: EncodedRows | None = None
    """The rows encoded so far into the next file's row groups (the first rows)."""
    encodable: bool = True
    """False once a piece came with another schema than the encoded rows' (the flush conforms them as Arrow)."""
    pending_rows: int = 0
    pending_nbytes: int = 0
    """Rows in ``tables`` and their Arrow bytes."""
    row_offsets: list[pa.Array | range] = field(default_factory=list)
    """The Kafka offset of each buffered row, a piece at a time; a piece holding every offset of its span is a
    ``range`` (8 bytes a row less: a catch-up's flush holds over a million rows)."""
    row_timestamps_ms: list[pa.Array] = field(default_factory=list)
    """The Kafka timestamp (epoch ms) of each buffered row, aligned with ``row_offsets`` when every piece had them."""
    row_deletes: list[pa.Array] = field(default_factory=list)
    """Upsert tables: whether each buffered row deletes its key, aligned with ``row_offsets``."""
    dead_letters: list[DeadLetter] = field(default_factory=list)
    dead_letter_bytes: int = 0
    """What ``dead_letters`` hold: each one's payload, its JSON text, key and reason."""
    messages: int = 0
    rows: int = 0
    nbytes: int = 0
    """Arrow bytes of every buffered row, encoded or not (the size of the file, uncompressed)."""
    max_timestamp_ms: int = 0
    filtered: int = 0
    unknown_fields: int = 0

    @property
    def held_bytes(self) -> int:
        """The memory the rows take: their encoded bytes, the Arrow bytes of the rest, and each row's offset and
        Kafka timestamp (as much as an encoded 250-B event itself); and the dead letters' (found by review: a
        partition of bad messages grew past the bound unseen)."""
        encoded = self.encoded.nbytes if self.encoded is not None else 0
        return encoded + self.pending_nbytes + 16 * self.rows + self.dead_letter_bytes

    def to_table(self, schema: pa.Schema) -> pa.Table:
        """The buffered rows in ``schema`` (pieces buffered before a column was added get nulls)."""
        with self._naming_the_lane():
            pieces = ([self.encoded.read()] if self.encoded is not None else []) + self.tables
        return pa.concat_tables([conform(t, schema) for t in pieces]) if pieces else schema.empty_table()

    def encode(self, groups: RowGroups) -> None:
        """Encode the rows not encoded yet as the next row group once they fill one. Raises
        :class:`RowGroupRefused` (the rows encoded before are then lost: the lane must be read again)."""
        if self.pending_rows >= groups.rows or self.pending_nbytes >= groups.nbytes:
            self._encode_pending(groups.compression)

    def encoded_file(self, schema: pa.Schema) -> EncodedFile | None:
        """The whole file, the rows left encoded as its last row group, when every row could be encoded in
        ``schema``; None: the flush writes the rows as Arrow. Raises :class:`RowGroupRefused`."""
        if self.encoded is None:
            return None
        self._encode_pending(self.encoded.compression)
        if self.tables or not self.encoded.schema.equals(schema):
            return None
        with self._naming_the_lane():
            return self.encoded.finish()

    def _encode_pending(self, compression: str) -> None:
        if not self.encodable or not self.tables:
            return
        schema = self.encoded.schema if self.encoded is not None else self.tables[0].schema
        if any(not piece.schema.equals(schema) for piece in self.tables):
            self.encodable = False  # a column was added meanwhile: the flush conforms every row as Arrow
            return
        group = pa.concat_tables(self.tables)
        with self._naming_the_lane():
            if self.encoded is None:
                self.encoded = EncodedRows.start(group, compression)
            else:
                self.encoded.add(group)
        self.tables, self.pending_rows, self.pending_nbytes = [], 0, 0

    @contextmanager
    def _naming_the_lane(self) -> Iterator[None]:
        """A refusal of the encoded rows names this buffer's lane: the loop reads its partition again."""
        try:
            yield
        except RowGroupRefused as refused:
            raise RowGroupRefused(refused.reason, self.tp, self.table) from refused

    def offsets(self) -> pa.Array:
        """The Kafka offset of each buffered row, aligned with :meth:`to_table`."""
        pieces = [
            pa.array(np.arange(p.start, p.stop, dtype=np.int64)) if isinstance(p, range) else p
            for p in self.row_offsets
        ]
        return pa.concat_arrays(pieces) if pieces else pa.array([], pa.int64())

    def timestamps(self) -> pa.Array | None:
        """The Kafka timestamp of each buffered row, aligned with :meth:`to_table`; None when a piece had none."""
        if sum(len(a) for a in self.row_timestamps_ms) != self.rows:
            return None
        return pa.concat_arrays(self.row_timestamps_ms) if self.row_timestamps_ms else pa.array([], pa.int64())

    def deletes(self) -> pa.Array:
        """Whether each buffered row deletes its key (upsert tables), aligned with :meth:`to_table`."""
        return pa.concat_arrays(self.row_deletes) if self.row_deletes else pa.array([False] * self.rows, pa.bool_())

    def reject_rows(self, positions: list[int], schema: pa.Schema) -> None:
        """Take rows out of the buffer (Parquet refused them; they became dead letters)."""
        keep = pa.array(sorted(set(range(self.rows)) - set(positions)), pa.int64())
        table, offsets = self.to_table(schema).take(keep), self.offsets().take(keep)
        stamps = self.timestamps()
        self.row_timestamps_ms = [stamps.take(keep)] if stamps is not None else []
        self.row_deletes = [self.deletes().take(keep)] if self.row_deletes else []
        self.tables, self.row_offsets, self.rows = [table], [offsets], table.num_rows
        self.encoded, self.encodable = None, False  # written as Arrow, as it was checked
        self.pending_rows, self.pending_nbytes = table.num_rows, table.nbytes


@dataclass(frozen=True)
class FlushLimits:
    allowed_latency_s: float
    max_messages_per_file: int
    min_bytes_per_file: int
    max_buffered_bytes: int


@dataclass(frozen=True)
class Due:
    """What must be committed now: per table (URI), the first limit it reached (found by review: every table due
    was counted under the first table's reason)."""

    reasons: dict[str, str]


Lane = tuple[TopicPartition, str]
"""A buffer's key: a partition's messages bound for one table (its URI)."""


class ValueBuffers:
    """One buffer per lane. A partition has one lane per table its messages can go to; every lane of a
    partition covers the same offsets (a piece adds its offsets to each), so each table's txn moves on
    even when the piece held no row for it.

    Flushing is per table: a table is due when one of its files is full (``max_messages_per_file``,
    ``min_bytes_per_file``) or one of its partitions has waited ``allowed_latency_s``; when all buffers
    together reach ``max_buffered_bytes``, the largest tables are due until half of it is left."""

    def __init__(self, limits: FlushLimits) -> None:
        self._limits = limits
        self._buffers: dict[Lane, PartitionBuffer] = {}
        self._latency: dict[str, float] = {}
        """Tables whose commits wait longer than ``allowed_latency_s`` (a commit budget shared with other writers)."""
        self._plain: set[Lane] = set()
        """Lanes whose rows stay Arrow until their next commit (Parquet refused one of their row groups)."""

    def set_latency(self, table: str, seconds: float) -> None:
        """How long ``table``'s buffers may wait from now on (``allowed_latency_s`` or longer)."""
        if seconds > self._limits.allowed_latency_s:
            self._latency[table] = seconds
        else:
            self._latency.pop(table, None)

    def _waits(self, buffer: PartitionBuffer) -> float:
        return self._latency.get(buffer.table, self._limits.allowed_latency_s)

    def add(
        self,
        processed: ProcessedPartition,
        message_count: int,
        now: float,
        table: str,
        row_groups: RowGroups | None = None,
    ) -> None:
        """Buffer ``processed`` for ``table``; with ``row_groups``, encode the lane's rows as they fill a row group.
        Raises :class:`RowGroupRefused` naming the lane, whose rows stay Arrow from then on until their commit."""
        tp = processed.topic_partition
        buffer = self._buffers.get((tp, table))
        if buffer is None:
            buffer = PartitionBuffer(tp, table, processed.first_offset, processed.last_offset, now)
            self._buffers[(tp, table)] = buffer
        buffer.last_offset = processed.last_offset
        buffer.messages += message_count
        buffer.dead_letters.extend(processed.dead_letters)
        buffer.dead_letter_bytes += sum(
            len(letter.payload) + len(letter.payload_json or "") + len(letter.key or b"") + len(letter.reason)
            for letter in processed.dead_letters
        )
        buffer.max_timestamp_ms = max(buffer.max_timestamp_ms, processed.max_timestamp_ms)
        buffer.filtered += processed.skipped_filtered
        buffer.unknown_fields += processed.unknown_fields
        if processed.rows.num_rows:
            buffer.tables.append(processed.rows)
            given = processed.row_offsets
            # One row per message, in offset order: offsets that span exactly the row count are all of that span.
            whole = given[-1] - given[0] + 1 == len(given)
            buffer.row_offsets.append(range(given[0], given[-1] + 1) if whole else pa.array(given, pa.int64()))
            if processed.row_timestamps_ms is not None:
                buffer.row_timestamps_ms.append(processed.row_timestamps_ms)
            if processed.row_deletes is not None or buffer.row_deletes:
                if not buffer.row_deletes and buffer.rows:  # the pieces before held upserts only
                    buffer.row_deletes.append(pa.array([False] * buffer.rows, pa.bool_()))
                deletes = processed.row_deletes
                buffer.row_deletes.append(
                    deletes if deletes is not None else pa.array([False] * processed.rows.num_rows, pa.bool_())
                )
            buffer.rows += processed.rows.num_rows
            buffer.nbytes += processed.rows.nbytes
            buffer.pending_rows += processed.rows.num_rows
            buffer.pending_nbytes += processed.rows.nbytes
            if row_groups is not None and (tp, table) not in self._plain:
                try:
                    buffer.encode(row_groups)
                except RowGroupRefused:
                    self.keep_plain(tp, table)
                    raise

    def keep_plain(self, tp: TopicPartition, table: str) -> None:
        """Keep the rows of a lane as Arrow until its next commit (Parquet refused one of its row groups)."""
        self._plain.add((tp, table))

    def room(self, tp: TopicPartition) -> int:
        """Messages ``tp`` can still take before a file of it is full."""
        taken = max((b.messages for (lane_tp, _), b in self._buffers.items() if lane_tp == tp), default=0)
        return self._limits.max_messages_per_file - taken

    def tables_of(self, tp: TopicPartition) -> frozenset[str]:
        """The tables ``tp`` holds buffers for."""
        return frozenset(table for lane_tp, table in self._buffers if lane_tp == tp)

    def due(self, now: float) -> Due | None:
        """The tables to commit now, and why (each table's first limit reached, in the order checked), or None."""
        if not self._buffers:
            return None
        limits = self._limits
        checks: list[tuple[str, set[str]]] = [
            ("records", {b.table for b in self._buffers.values() if b.messages >= limits.max_messages_per_file}),
            ("bytes", {b.table for b in self._buffers.values() if b.nbytes >= limits.min_bytes_per_file}),
            ("buffer_bytes", self._largest_tables()),
            ("latency", {b.table for b in self._buffers.values() if now - b.first_arrival >= self._waits(b)}),
        ]
        reasons: dict[str, str] = {}
        for reason, tables in checks:
            for table in sorted(tables):
                reasons.setdefault(table, reason)
        return Due(reasons) if reasons else None

    def _largest_tables(self) -> set[str]:
        """Over the global bound: the largest tables, until what is left is under half of it."""
        total = self.buffered_bytes
        if total < self._limits.max_buffered_bytes:
            return set()
        by_table: dict[str, int] = {}
        for buffer in self._buffers.values():
            by_table[buffer.table] = by_table.get(buffer.table, 0) + buffer.held_bytes
        chosen: set[str] = set()
        for table, nbytes in sorted(by_table.items(), key=lambda item: (-item[1], item[0])):
            if total < self._limits.max_buffered_bytes / 2:
                break
            chosen.add(table)
            total -= nbytes
        return chosen

    def seconds_until_due(self, now: float) -> float | None:
        if not self._buffers:
            return None
        return max(0.0, min(b.first_arrival + self._waits(b) for b in self._buffers.values()) - now)

    def take(
        self, tables: frozenset[str] | None = None, partitions: set[TopicPartition] | None = None
    ) -> dict[str, dict[TopicPartition, PartitionBuffer]]:
        """Remove and return the buffers of ``tables`` and of ``partitions`` (all when both are None), by table."""
        everything = tables is None and partitions is None
        chosen = sorted(
            lane
            for lane in self._buffers
            if everything
            or (tables is not None and lane[1] in tables)
            or (partitions is not None and lane[0] in partitions)
        )
        taken: dict[str, dict[TopicPartition, PartitionBuffer]] = {}
        for tp, table in chosen:
            taken.setdefault(table, {})[tp] = self._buffers.pop((tp, table))
            self._plain.discard((tp, table))
        return taken

    def drop(self, tp: TopicPartition) -> list[PartitionBuffer]:
        """Remove the buffers of every lane of ``tp``."""
        # Its lanes stay plain (_plain): a resync drops them and reads the same rows again.
        return [self._buffers.pop(lane) for lane in [lane for lane in self._buffers if lane[0] == tp]]

    @property
    def buffered_bytes(self) -> int:
        """The memory the buffers take (:attr:`PartitionBuffer.held_bytes`)."""
        return sum(b.held_bytes for b in self._buffers.values())

    @property
    def buffered_messages(self) -> int:
        """Messages held, counted once per partition (every lane of a partition covers the same messages)."""
        by_tp: dict[TopicPartition, int] = {}
        for (tp, _), buffer in self._buffers.items():
            by_tp[tp] = max(by_tp.get(tp, 0), buffer.messages)
        return sum(by_tp.values())

    def partitions(self) -> list[TopicPartition]:
        """The partitions that hold a buffer."""
        return sorted({tp for tp, _ in self._buffers})

    def __contains__(self, tp: TopicPartition) -> bool:
        return any(lane_tp == tp for lane_tp, _ in self._buffers)

    def __bool__(self) -> bool:
        return bool(self._buffers)
