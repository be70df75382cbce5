"""The loop with in-memory edges: a scripted Kafka source and a dead-letter table that counts its commits.

The fakes subclass the Protocols of :mod:`kafka2delta.edges`, so mypy checks that they still match the
real edges.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from deltalake import DeltaTable

from kafka2delta.cli import build_router, open_dead_letters, open_table
from kafka2delta.config import Config, FormatConfig, load_config
from kafka2delta.dead_letters import DeadLetterTable
from kafka2delta.edges import DeadLetterStore, RebalanceListener, Source, TableWriter
from kafka2delta.metrics import Metrics
from kafka2delta.offsets import LogicalOffset, TxnIds
from kafka2delta.pipeline import Pipeline
from kafka2delta.records import ConsumedBatch, DeadLetter, PartitionMessages, TopicPartition
from kafka2delta.routing import Routes, TableSpec
from kafka2delta.runner import Ingestor
from kafka2delta.schema import parse_schema
from kafka2delta.serialization import build_deserializer
from kafka2delta.tables import OpenedTable

SCHEMA = parse_schema({"id": "string not null"})


class FakeSource(Source):
    """Serves scripted batches of one topic (``t``), then empty ones; remembers seeks and group-offset commits
    by partition number."""

    def __init__(self, batches: list[ConsumedBatch], partitions: list[int], high: int, topic: str = "t") -> None:
        self.batches = batches
        self.topic = topic
        self.partitions = partitions
        self.high = high
        self.starts: dict[int, int | LogicalOffset] = {}
        self.seeks: list[tuple[int, int | LogicalOffset]] = []
        self.group_offsets: list[dict[int, int]] = []

    def tp(self, partition: int) -> TopicPartition:
        return TopicPartition(self.topic, partition)

    def start(self, listener: RebalanceListener) -> None:
        starts = listener.assigned([self.tp(p) for p in self.partitions])
        self.starts = {tp.partition: start for tp, start in starts.items()}

    def consume(self, max_messages: int, timeout: float) -> ConsumedBatch:
        batch = self.batches.pop(0) if self.batches else ConsumedBatch()
        batch.end_offsets = {} if self.batches else {self.tp(p): self.high for p in self.partitions}
        return batch

    def watermarks(self, tp: TopicPartition, cached: bool = False) -> tuple[int, int]:
        return 0, self.high

    def seek(self, tp: TopicPartition, start: int | LogicalOffset) -> None:
        self.seeks.append((tp.partition, start))

    def commit_group_offsets(self, next_offsets: Mapping[TopicPartition, int]) -> None:
        self.group_offsets.append({tp.partition: offset for tp, offset in next_offsets.items()})

    def close(self) -> None:
        pass


class LogSource(FakeSource):
    """A one-partition fake broker (``t``, partition 0): serves its log from the current position and honours
    seeks. Each consume serves ``chunk`` messages (None: as many as asked); the partition's end is reported by the
    consume after its last message, or with it (``end_with_last``: librdkafka may do either)."""

    def __init__(
        self, payloads: list[bytes], chunk: int | None = None, end_with_last: bool = False, latest: int | None = None
    ) -> None:
        super().__init__([], [0], high=len(payloads))
        self.log = payloads
        self.chunk = chunk
        self.end_with_last = end_with_last
        self.latest = latest
        """Where "latest" is when the consumer first fetches from it (None: no test starts this source there)."""
        self.position = 0

    def start(self, listener: RebalanceListener) -> None:
        super().start(listener)
        self.position = self._offset(self.starts[0])

    def consume(self, max_messages: int, timeout: float) -> ConsumedBatch:
        offsets = list(range(self.position, min(self.position + (self.chunk or max_messages), len(self.log))))
        self.position += len(offsets)
        at_end = not offsets or (self.end_with_last and self.position >= len(self.log))
        batch = ConsumedBatch(end_offsets={self.tp(0): len(self.log)} if at_end else {})
        if offsets:
            payloads: list[bytes | None] = [self.log[o] for o in offsets]
            batch.partitions = {
                self.tp(0): PartitionMessages(
                    topic="t", partition=0, offsets=offsets, payloads=payloads, timestamps_ms=[0] * len(offsets)
                )
            }
        return batch

    def seek(self, tp: TopicPartition, start: int | LogicalOffset) -> None:
        super().seek(tp, start)
        self.position = self._offset(start)

    def _offset(self, start: int | LogicalOffset) -> int:
        if start is LogicalOffset.LATEST and self.latest is not None:
            return self.latest
        assert start is LogicalOffset.EARLIEST or isinstance(start, int), start  # no table version: the start
        return 0 if isinstance(start, LogicalOffset) else start


class TopicsSource(Source):
    """Serves scripted batches of any topics, then empty ones (end of partition at ``highs``); remembers
    seeks and group-offset commits by topic partition."""

    def __init__(self, batches: list[ConsumedBatch], highs: Mapping[TopicPartition, int]) -> None:
        self.batches = batches
        self.highs = dict(highs)
        self.starts: dict[TopicPartition, int | LogicalOffset] = {}
        self.seeks: list[tuple[TopicPartition, int | LogicalOffset]] = []
        self.group_offsets: dict[TopicPartition, int] = {}

    def start(self, listener: RebalanceListener) -> None:
        self.starts = listener.assigned(sorted(self.highs))

    def consume(self, max_messages: int, timeout: float) -> ConsumedBatch:
        batch = self.batches.pop(0) if self.batches else ConsumedBatch()
        batch.end_offsets = {} if self.batches else dict(self.highs)
        return batch

    def watermarks(self, tp: TopicPartition, cached: bool = False) -> tuple[int, int]:
        return 0, self.highs[tp]

    def seek(self, tp: TopicPartition, start: int | LogicalOffset) -> None:
        self.seeks.append((tp, start))

    def commit_group_offsets(self, next_offsets: Mapping[TopicPartition, int]) -> None:
        self.group_offsets.update(next_offsets)

    def close(self) -> None:
        pass


def docs(prefix: str, first: int, count: int) -> list[dict[str, Any]]:
    """``{"id": "<prefix><offset>"}`` for ``count`` offsets from ``first``."""
    return [{"id": f"{prefix}{offset}"} for offset in range(first, first + count)]


def ids(uri: Path) -> list[str]:
    """The ``id`` of every row of the table at ``uri``, sorted."""
    return sorted(DeltaTable(str(uri)).to_pyarrow_table().column("id").to_pylist())


def messages_of(tp: TopicPartition, first: int, documents: Sequence[dict[str, Any]]) -> ConsumedBatch:
    """``documents`` as JSON messages of ``tp`` from offset ``first``."""
    payloads: list[bytes | None] = [json.dumps(document).encode() for document in documents]
    offsets = list(range(first, first + len(payloads)))
    messages = PartitionMessages(
        topic=tp.topic, partition=tp.partition, offsets=offsets, payloads=payloads, timestamps_ms=[0] * len(offsets)
    )
    return ConsumedBatch(partitions={tp: messages})


class RecordingDeadLetters(DeadLetterStore):
    """The real dead-letter table, counting its commits."""

    def __init__(self, tmp_path: Path) -> None:
        self.table = DeadLetterTable.open(str(tmp_path / "dlq"), {}, TxnIds().prefix, "snappy", 10)
        self.commits = 0

    @property
    def uri(self) -> str:
        return self.table.uri

    def committed_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]:
        return self.table.committed_offsets(partitions)

    def recorded_offsets(self, tp: TopicPartition, after: int | None, upto: int) -> set[int]:
        return self.table.recorded_offsets(tp, after, upto)

    def start_marks(self, table: str, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]:
        return self.table.start_marks(table, partitions)

    def mark_starts(self, table: str, starts: Mapping[TopicPartition, int]) -> int:
        self.commits += 1
        return self.table.mark_starts(table, starts)

    def commit(
        self,
        letters: Mapping[TopicPartition, Sequence[DeadLetter]],
        expected: Mapping[TopicPartition, int | None],
        versions: Mapping[TopicPartition, int],
        metadata: dict[str, Any],
    ) -> int:
        self.commits += 1
        return self.table.commit(letters, expected, versions, metadata)

    def offsets(self) -> list[tuple[int, int]]:
        """(partition, offset) of every dead letter in the table."""
        rows = DeltaTable(self.uri).to_pyarrow_table().to_pylist()
        return sorted((r["partition"], r["offset"]) for r in rows)


def batch(partition: int, first: int, count: int, bad_every: int = 0) -> ConsumedBatch:
    """Messages ``first``.. of ``partition`` in topic ``t``, ``{"id": "p<partition>-<offset>"}``; every
    ``bad_every``-th offset is broken JSON."""
    offsets = list(range(first, first + count))
    payloads: list[bytes | None] = [
        b"{broken" if bad_every and o % bad_every == 0 else json.dumps({"id": f"p{partition}-{o}"}).encode()
        for o in offsets
    ]
    messages = PartitionMessages(
        topic="t", partition=partition, offsets=offsets, payloads=payloads, timestamps_ms=[0] * count
    )
    return ConsumedBatch(partitions={TopicPartition("t", partition): messages})


def no_sleep(seconds: float) -> None:
    """Backoff that does not wait (unit tests)."""


def make(
    tmp_path: Path,
    source: Source,
    writer: TableWriter,
    sink: DeadLetterStore,
    *,
    sleep: Callable[[float], None] = no_sleep,
    clock: Callable[[], float] = time.monotonic,
    **ingest: str,
) -> tuple[Ingestor, Metrics]:
    """The loop for topic ``t`` into ``writer`` (``<tmp_path>/t``) with ``[ingest]`` overrides; backoff does not
    sleep unless ``sleep`` does."""
    environ = {
        "K2D_KAFKA__BOOTSTRAP_SERVERS": "unused:1",
        "K2D_KAFKA__TOPIC": "t",
        "K2D_TABLE__URI": str(tmp_path / "t"),
        "K2D_INGEST__MAX_COMMIT_RETRIES": "3",
    }
    environ.update({f"K2D_INGEST__{key.upper()}": value for key, value in ingest.items()})
    config = load_config(None, environ=environ)
    metrics = Metrics()
    pipeline = Pipeline(build_deserializer(FormatConfig(), None, "t"), SCHEMA)
    ingestor = Ingestor(
        config,
        source=source,
        tables=lambda spec: OpenedTable(writer=writer, pipeline=pipeline),
        dead_letters=sink,
        metrics=metrics,
        sleep=sleep,
        clock=clock,
    )
    return ingestor, metrics


def daemon_loop(
    config: Config,
    source: Source,
    opener: Callable[[TableSpec], OpenedTable] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[Ingestor, Metrics]:
    """The loop of ``config`` as the daemon builds it (its real tables, opened by ``opener`` or as the daemon opens
    them) over ``source``; no sleeping between retries."""
    routes = Routes(config)
    metrics = Metrics()
    ingestor = Ingestor(
        config,
        source=source,
        tables=opener or (lambda spec: open_table(config, spec)),
        routes=routes,
        dead_letters=open_dead_letters(config, routes),
        metrics=metrics,
        router=(lambda: build_router(config)) if config.routing.expression else None,
        dead_letter_opener=lambda uri: open_dead_letters(config, routes, uri),
        sleep=no_sleep,
        clock=clock,
    )
    return ingestor, metrics


def ingest_until_caught_up(
    config: Config, source: Source, opener: Callable[[TableSpec], OpenedTable] | None = None
) -> Metrics:
    """:func:`daemon_loop` run until caught up."""
    ingestor, metrics = daemon_loop(config, source, opener)
    ingestor.run(until_caught_up=True)
    return metrics


def tables_config(tmp_path: Path, **env: str) -> Config:
    """A multi-table daemon's config on local paths (dead letters in ``<tmp_path>/dlq``): ``id`` a required
    string, topic, partition and offset recorded; ``env`` adds the topics and tables."""
    return load_config(
        None,
        environ={
            "K2D_KAFKA__BOOTSTRAP_SERVERS": "unused:1",
            "K2D_TABLE__SCHEMA": '{"id": "string not null"}',
            "K2D_TABLE__METADATA_COLUMNS": "topic,partition,offset",
            "K2D_DEAD_LETTERS__TABLE_URI": str(tmp_path / "dlq"),
            "K2D_INGEST__MAX_COMMIT_RETRIES": "3",
            **env,
        },
    )


def expression_config(tmp_path: Path) -> Config:
    """Topic ``e`` split by ``[routing] expression = "kind"`` into the tables ``clicks`` and ``orders``."""
    routes = [
        {"name": "clicks", "uri": str(tmp_path / "clicks")},
        {"name": "orders", "uri": str(tmp_path / "orders")},
    ]
    return tables_config(tmp_path, K2D_KAFKA__TOPIC="e", K2D_ROUTES=json.dumps(routes), K2D_ROUTING__EXPRESSION="kind")
