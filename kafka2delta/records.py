"""The records that travel through the daemon, in the order a message meets them. Pure data: no I/O.

``ConsumedBatch`` (one consume call) → ``PartitionMessages`` (one partition's messages, as columns)
→ ``ProcessedPartition`` (what the stages made of them: rows, ``DeadLetter`` records, skips) →
buffered and committed with an ``OffsetRange`` per file. ``Stage`` names the step a dead letter
failed at; it is the one list of stage names (mypy checks every use).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Literal, NamedTuple, TypeVar

import pyarrow as pa

T = TypeVar("T")

Stage = Literal["deserialize", "transform", "route", "coerce", "write"]
"""Where a message failed: decoding its bytes, a transform or the filter, choosing its table by
``[routing] expression``, fitting it to the table schema, or Parquet refusing its row. Dead letters,
metrics and logs carry it."""

Header = tuple[str, bytes | None]


class TopicPartition(NamedTuple):
    """One partition of one topic: what the loop keeps state, buffers and txns for."""

    topic: str
    partition: int

    def __str__(self) -> str:
        """``topic[partition]``, as every log line about the partition says it."""
        return f"{self.topic}[{self.partition}]"


@dataclass(kw_only=True)
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

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

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
            topic=self.topic,
            partition=self.partition,
            offsets=[self.offsets[i] for i in indices],
            payloads=[self.payloads[i] for i in indices],
            timestamps_ms=[self.timestamps_ms[i] for i in indices],
            keys=pick(self.keys),
            headers=pick(self.headers),
            timestamp_types=pick(self.timestamp_types),
        )

    def split(self, count: int) -> tuple[PartitionMessages, PartitionMessages]:
        """The first ``count`` messages, and the rest."""
        return self.select(range(count)), self.select(range(count, len(self)))

    def where(self, index: int) -> str:
        """``topic[partition]@offset`` of the message at ``index``: every log line about it says this."""
        return f"{self.topic}[{self.partition}]@{self.offsets[index]}"


@dataclass
class ConsumedBatch:
    """One consume call: messages grouped by topic partition, plus end-of-partition and range events."""

    partitions: dict[TopicPartition, PartitionMessages] = field(default_factory=dict)
    end_offsets: dict[TopicPartition, int] = field(default_factory=dict)
    out_of_range: list[TopicPartition] = field(default_factory=list)
    count: int = 0


@dataclass(frozen=True)
class DeadLetter:
    """A message that failed a stage: recorded in the dead-letter table, never dropped silently."""

    topic: str
    partition: int
    offset: int
    stage: Stage
    reason: str
    payload: bytes
    key: bytes | None = None
    timestamp_ms: int | None = None
    payload_json: str | None = None
    """The message as JSON text when it parsed: the JSON payload itself, or the decoded document."""
    table: str | None = None
    """The table the message was bound for, when known (the ``table`` column of the dead-letter table)."""

    @property
    def where(self) -> str:
        return f"{self.topic}[{self.partition}]@{self.offset}"


def payload_json(payload: bytes, document: Any = None) -> str | None:
    """The JSON text shown in ``payload_json``: the decoded document if there is one, else the payload
    if it is valid JSON, else None."""
    try:
        if document is not None:
            return json.dumps(document, default=_json_default, ensure_ascii=False, separators=(",", ":"))
        json.loads(payload)
        return payload.decode("utf-8")
    except (ValueError, UnicodeDecodeError, RecursionError):  # not JSON, or too deep to show
        return None


def _json_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    return repr(value)


@dataclass(kw_only=True)
class ProcessedPartition:
    """What became of every message of a :class:`PartitionMessages`."""

    topic: str
    partition: int
    rows: pa.Table
    """Rows in the pipeline's schema at the end of the call, in offset order."""
    first_offset: int
    last_offset: int
    max_timestamp_ms: int
    row_offsets: list[int] = field(default_factory=list)
    """The Kafka offset of each row."""
    dead_letters: list[DeadLetter] = field(default_factory=list)
    skipped_empty: int = 0
    skipped_filtered: int = 0
    unknown_fields: int = 0
    """Values dropped because the table has no column for them (``schema_evolution = "none"``)."""
    added_columns: list[str] = field(default_factory=list)
    """Columns (dotted paths) this batch added to the schema (``schema_evolution = "merge"``)."""
    row_timestamps_ms: pa.Array | None = None
    """The Kafka timestamp (epoch ms, int64) of each row, aligned with ``row_offsets`` (end-to-end latency)."""
    row_deletes: pa.Array | None = None
    """Upsert tables: whether each row deletes its key (bool, aligned with ``row_offsets``); None: no deletes."""

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


@dataclass(frozen=True)
class OffsetRange:
    """The first and last Kafka offsets (inclusive) a file or a commit covers for one partition."""

    first: int
    last: int
