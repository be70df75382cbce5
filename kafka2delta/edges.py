"""The edges as the loop sees them: small Protocols, in the order a message travels.

``Source`` (Kafka) → the pure stages → ``TableWriter`` (the Delta table) and ``DeadLetterStore``
(the dead-letter table, with an optional ``DeadLetterProducer`` for the dead-letter topic). The real
edges (:class:`kafka2delta.kafka.KafkaSource`, :class:`kafka2delta.writer.DeltaWriter`,
:class:`kafka2delta.dead_letters.DeadLetterTable`, :class:`kafka2delta.kafka.DeadLetterTopic`) satisfy
them where the CLI wires them up; the in-memory fakes of ``tests/support`` satisfy them too, and
mypy checks both. The loop (:mod:`kafka2delta.runner`) imports these, never the edges themselves.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

from kafka2delta.changes import ChangeOptions
from kafka2delta.offsets import LogicalOffset
from kafka2delta.records import ConsumedBatch, DeadLetter, OffsetRange, TopicPartition

if TYPE_CHECKING:
    from deltalake.transaction import AddAction

    from kafka2delta.encoded_rows import EncodedFile


class RebalanceListener(Protocol):
    """What the source calls back inside ``consume`` when the group's assignment changes."""

    def assigned(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int | LogicalOffset]:
        """Partitions given to us; return where each starts."""
        ...

    def revoked(self, partitions: list[TopicPartition]) -> None:
        """Partitions taken from us in an orderly way: commit what is buffered for them now."""
        ...

    def lost(self, partitions: list[TopicPartition]) -> None:
        """Partitions taken from us without notice: another owner may already commit them."""
        ...

    def stopping(self) -> bool:
        """True once a stop was asked for (SIGTERM): the source stops waiting for the broker at start."""
        ...


class Source(Protocol):
    """The subscribed topics of a consumer group: messages in, positions set by the loop, lag for the gauges."""

    def start(self, listener: RebalanceListener) -> None:
        """Join the group; the listener decides where each assigned partition starts."""
        ...

    def consume(self, max_messages: int, timeout: float) -> ConsumedBatch:
        """Up to ``max_messages`` messages, grouped by partition (rebalance callbacks run inside)."""
        ...

    def seek(self, tp: TopicPartition, start: int | LogicalOffset) -> None:
        """Fetch ``tp`` from ``start`` next (a resync after a conflict or a schema change)."""
        ...

    def commit_group_offsets(self, next_offsets: Mapping[TopicPartition, int]) -> None:
        """Record progress in the group for lag tools only; recovery never reads it."""
        ...

    def watermarks(self, tp: TopicPartition, cached: bool = False) -> tuple[int, int]:
        """(low, high) watermarks; ``cached`` answers from the last fetch without a broker round trip."""
        ...

    def close(self) -> None: ...


class TableWriter(Protocol):
    """The Delta table: Parquet files, then ONE commit holding the files and a txn per partition."""

    schema: pa.Schema
    """The table schema as of the last refresh or commit."""

    @property
    def uri(self) -> str: ...

    @property
    def version(self) -> int: ...

    def refresh_schema(self) -> pa.Schema:
        """Read the newest table version and return its schema."""
        ...

    def committed_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]:
        """The txn versions of ``partitions`` in the newest table version."""
        ...

    def write_files(self, tp: TopicPartition, offsets: OffsetRange, rows: pa.Table) -> list[AddAction]:
        """Parquet files for the rows of one Kafka partition; RowsRejected names rows Parquet refuses."""
        ...

    def put_file(self, tp: TopicPartition, offsets: OffsetRange, encoded: EncodedFile) -> list[AddAction]:
        """Put a file encoded while its rows were buffered (unpartitioned tables); RetryableError."""
        ...

    def check_rows(self, rows: pa.Table) -> None:
        """RowsRejected when Parquet refuses some rows (for commits delta-rs writes itself)."""
        ...

    def commit(
        self,
        actions: Sequence[AddAction],
        expected: Mapping[TopicPartition, int | None],
        versions: Mapping[TopicPartition, int],
        metadata: dict[str, Any],
    ) -> int:
        """Commit ``actions`` with the txn ``versions``; CommitConflict, SchemaChanged or RetryableError."""
        ...

    def commit_evolution(
        self,
        rows: pa.Table,
        expected: Mapping[TopicPartition, int | None],
        versions: Mapping[TopicPartition, int],
        metadata: dict[str, Any],
    ) -> int:
        """Commit ``rows`` whose schema adds columns, the new schema and the txns in one commit."""
        ...

    def merge(
        self,
        changes: pa.Table,
        options: ChangeOptions,
        expected: Mapping[TopicPartition, int | None],
        versions: Mapping[TopicPartition, int],
        metadata: dict[str, Any],
        *,
        evolve: bool,
    ) -> int:
        """Upsert tables: apply the last change per key and the txns in one MERGE commit."""
        ...

    @property
    def last_merge(self) -> dict[str, Any]:
        """delta-rs's metrics of the last MERGE (rows and files touched)."""
        ...


class DeadLetterStore(Protocol):
    """The dead-letter table, with its own txn per partition (committed before the main table's)."""

    @property
    def uri(self) -> str: ...

    def committed_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]: ...

    def recorded_offsets(self, tp: TopicPartition, after: int | None, upto: int) -> set[int]:
        """Offsets in (after, upto] of ``tp`` that are dead letters in the table."""
        ...

    def start_marks(self, table: str, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]:
        """Where partitions start in ``table``, a table that did not exist when they were marked (None: no mark)."""
        ...

    def mark_starts(self, table: str, starts: Mapping[TopicPartition, int]) -> int: ...

    def commit(
        self,
        letters: Mapping[TopicPartition, Sequence[DeadLetter]],
        expected: Mapping[TopicPartition, int | None],
        versions: Mapping[TopicPartition, int],
        metadata: dict[str, Any],
    ) -> int: ...


class DeadLetterProducer(Protocol):
    """The optional dead-letter topic (at least once: produced before the table commit)."""

    def produce(self, letters: Sequence[DeadLetter]) -> None: ...
