"""Batch shapes shared by the pure stages: the messages of one partition, and what became of them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import pyarrow as pa

from kafka2delta.errors import MessageError

T = TypeVar("T")


Header = tuple[str, bytes | None]


@dataclass
class PartitionMessages:
    """Messages of one partition from one consume call, as columns (offsets ascending).

    ``keys``, ``headers`` and ``timestamp_types`` may be None when a source does not provide them
    (unit tests); the accessors then answer "no key", "no headers", "create time".
    """

    topic: str
    partition: int
    offsets: list[int]
    payloads: list[bytes | None]
    timestamps_ms: list[int]
    keys: list[bytes | None] | None = None
    headers: list[list[Header] | None] | None = None
    timestamp_types: list[int] | None = None
    """Kafka's timestamp type per message: 0 create time, 1 log-append time, -1 not available."""

    def __len__(self) -> int:
        return len(self.offsets)

    def key(self, index: int) -> bytes | None:
        return self.keys[index] if self.keys is not None else None

    def header_list(self, index: int) -> list[Header]:
        found = self.headers[index] if self.headers is not None else None
        return found or []

    def timestamp_type(self, index: int) -> int:
        return self.timestamp_types[index] if self.timestamp_types is not None else 0

    def select(self, indices: Sequence[int]) -> PartitionMessages:
        def pick(values: list[T] | None) -> list[T] | None:
            return None if values is None else [values[i] for i in indices]

        return PartitionMessages(
            self.topic,
            self.partition,
            [self.offsets[i] for i in indices],
            [self.payloads[i] for i in indices],
            [self.timestamps_ms[i] for i in indices],
            pick(self.keys),
            pick(self.headers),
            pick(self.timestamp_types),
        )

    def split(self, count: int) -> tuple[PartitionMessages, PartitionMessages]:
        """The first ``count`` messages, and the rest."""
        return self.select(range(count)), self.select(range(count, len(self)))

    def where(self, index: int) -> str:
        """``topic[partition]@offset`` of the message at ``index``: every log line about it says this."""
        return f"{self.topic}[{self.partition}]@{self.offsets[index]}"


@dataclass
class StageResult:
    """Rows that passed a stage, with the input index of each row, and the messages that failed."""

    rows: pa.Table
    indices: list[int]
    failures: list[tuple[int, MessageError]] = field(default_factory=list)


def isolate_failures(
    indices: list[int],
    attempt: Callable[[list[int]], T],
    error_types: tuple[type[Exception], ...],
) -> tuple[list[tuple[list[int], T]], list[tuple[int, Exception]]]:
    """Run ``attempt`` on all ``indices``; where it fails, bisect until each failing index stands alone.

    The fast path is one vectorised call for the whole batch; a batch with ``k`` bad messages costs
    about ``k * log2(n)`` extra calls, so one poison message never costs a per-message pass.
    Returns the successful (indices, result) pieces in input order and the (index, error) failures.
    """
    good: list[tuple[list[int], T]] = []
    bad: list[tuple[int, Exception]] = []
    pending: list[list[int]] = [indices] if indices else []
    while pending:
        chunk = pending.pop()
        try:
            good.append((chunk, attempt(chunk)))
        except error_types as exc:
            if len(chunk) == 1:
                bad.append((chunk[0], exc))
            else:
                middle = len(chunk) // 2
                # Push the second half first so the first half is handled first: order is kept.
                pending.append(chunk[middle:])
                pending.append(chunk[:middle])
    good.sort(key=lambda piece: piece[0][0])
    bad.sort(key=lambda failure: failure[0])
    return good, bad
