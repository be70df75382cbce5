"""Per-partition buffers of coerced rows, and the flush decision (pure; the clock is passed in).

A buffer also tracks the offsets of messages that became dead letters or skips: they advance the
partition's txn version in the next commit even when they add no row.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from kafka2delta.records import DeadLetter, ProcessedPartition
from kafka2delta.schema import conform


@dataclass
class PartitionBuffer:
    partition: int
    first_offset: int
    last_offset: int
    first_arrival: float
    tables: list[pa.Table] = field(default_factory=list)
    row_offsets: list[pa.Array] = field(default_factory=list)
    row_timestamps_ms: list[pa.Array] = field(default_factory=list)
    """The Kafka timestamp (epoch ms) of each buffered row, aligned with ``row_offsets`` when every piece had them."""
    dead_letters: list[DeadLetter] = field(default_factory=list)
    messages: int = 0
    rows: int = 0
    nbytes: int = 0
    max_timestamp_ms: int = 0
    filtered: int = 0
    unknown_fields: int = 0

    def to_table(self, schema: pa.Schema) -> pa.Table:
        """The buffered rows in ``schema`` (pieces buffered before a column was added get nulls)."""
        return pa.concat_tables([conform(t, schema) for t in self.tables]) if self.tables else schema.empty_table()

    def offsets(self) -> pa.Array:
        """The Kafka offset of each buffered row, aligned with :meth:`to_table`."""
        return pa.concat_arrays(self.row_offsets) if self.row_offsets else pa.array([], pa.int64())

    def timestamps(self) -> pa.Array | None:
        """The Kafka timestamp of each buffered row, aligned with :meth:`to_table`; None when a piece had none."""
        if sum(len(a) for a in self.row_timestamps_ms) != self.rows:
            return None
        return pa.concat_arrays(self.row_timestamps_ms) if self.row_timestamps_ms else pa.array([], pa.int64())

    def reject_rows(self, positions: list[int], schema: pa.Schema) -> None:
        """Take rows out of the buffer (Parquet refused them; they became dead letters)."""
        keep = pa.array(sorted(set(range(self.rows)) - set(positions)), pa.int64())
        table, offsets = self.to_table(schema).take(keep), self.offsets().take(keep)
        stamps = self.timestamps()
        self.row_timestamps_ms = [stamps.take(keep)] if stamps is not None else []
        self.tables, self.row_offsets, self.rows = [table], [offsets], table.num_rows


@dataclass(frozen=True)
class FlushLimits:
    allowed_latency_s: float
    max_messages_per_file: int
    min_bytes_per_file: int
    max_buffered_bytes: int


class ValueBuffers:
    def __init__(self, limits: FlushLimits) -> None:
        self._limits = limits
        self._buffers: dict[int, PartitionBuffer] = {}

    def add(self, processed: ProcessedPartition, message_count: int, now: float) -> None:
        buffer = self._buffers.get(processed.partition)
        if buffer is None:
            buffer = PartitionBuffer(processed.partition, processed.first_offset, processed.last_offset, now)
            self._buffers[processed.partition] = buffer
        buffer.last_offset = processed.last_offset
        buffer.messages += message_count
        buffer.dead_letters.extend(processed.dead_letters)
        buffer.max_timestamp_ms = max(buffer.max_timestamp_ms, processed.max_timestamp_ms)
        buffer.filtered += processed.skipped_filtered
        buffer.unknown_fields += processed.unknown_fields
        if processed.rows.num_rows:
            buffer.tables.append(processed.rows)
            buffer.row_offsets.append(pa.array(processed.row_offsets, pa.int64()))
            if processed.row_timestamps_ms is not None:
                buffer.row_timestamps_ms.append(processed.row_timestamps_ms)
            buffer.rows += processed.rows.num_rows
            buffer.nbytes += processed.rows.nbytes

    def room(self, partition: int) -> int:
        """Messages ``partition`` can still take before its file is full."""
        buffer = self._buffers.get(partition)
        return self._limits.max_messages_per_file - (buffer.messages if buffer else 0)

    def flush_reason(self, now: float) -> str | None:
        """Why the buffers must be committed now (the first limit reached), or None."""
        if not self._buffers:
            return None
        limits = self._limits
        if any(b.messages >= limits.max_messages_per_file for b in self._buffers.values()):
            return "records"
        if any(b.nbytes >= limits.min_bytes_per_file for b in self._buffers.values()):
            return "bytes"
        if self.buffered_bytes >= limits.max_buffered_bytes:
            return "buffer_bytes"
        if now - min(b.first_arrival for b in self._buffers.values()) >= limits.allowed_latency_s:
            return "latency"
        return None

    def seconds_until_due(self, now: float) -> float | None:
        if not self._buffers:
            return None
        oldest = min(b.first_arrival for b in self._buffers.values())
        return max(0.0, oldest + self._limits.allowed_latency_s - now)

    def take(self, partitions: set[int] | None = None) -> dict[int, PartitionBuffer]:
        """Remove and return the buffers of ``partitions`` (all when None)."""
        chosen = set(self._buffers) if partitions is None else partitions & set(self._buffers)
        return {p: self._buffers.pop(p) for p in sorted(chosen)}

    def drop(self, partition: int) -> PartitionBuffer | None:
        return self._buffers.pop(partition, None)

    @property
    def buffered_bytes(self) -> int:
        return sum(b.nbytes for b in self._buffers.values())

    @property
    def buffered_messages(self) -> int:
        return sum(b.messages for b in self._buffers.values())

    def partitions(self) -> list[int]:
        """The partitions that hold a buffer."""
        return list(self._buffers)

    def __contains__(self, partition: int) -> bool:
        return partition in self._buffers

    def __bool__(self) -> bool:
        return bool(self._buffers)
