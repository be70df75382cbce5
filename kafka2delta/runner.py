"""The loop. It reads like the product's paragraph:

assignment (start each partition at the table's txn version + 1) → fetch a batch → drop offsets
already taken → deserialize, coerce (the pure pipeline) → buffer → when the first of latency /
records / bytes is reached: write Parquet, record dead letters, make ONE Delta commit with the
files and a txn per partition → then, for lag tools only, commit Kafka group offsets.

The commit order, and what a crash between two steps leaves behind:

1. Parquet files written           → crash: orphan files, never referenced; replay rewrites them.
2. dead letters recorded           → crash: replay finds them recorded (the sink is idempotent).
3. Delta commit (files + txns)     → the point of no return; replay starts after the txn versions.
4. Kafka group offsets (async)     → crash: lag tools lag a little; recovery never reads them.

A commit conflict (another writer moved a partition's txn) drops that partition's data and seeks
to the table's version + 1. A transient storage error retries with backoff, offsets held.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

from deltalake.transaction import AddAction

from kafka2delta import faults
from kafka2delta.batches import PartitionMessages
from kafka2delta.config import Config
from kafka2delta.dead_letters import DeadLetterSink
from kafka2delta.errors import CommitConflict, FatalError, RetryableError
from kafka2delta.kafka import ConsumedBatch, KafkaSource
from kafka2delta.metrics import Metrics
from kafka2delta.offsets import LogicalOffset, start_position
from kafka2delta.pipeline import Pipeline
from kafka2delta.value_buffers import FlushLimits, PartitionBuffer, ValueBuffers
from kafka2delta.writer import DeltaWriter, OffsetRange

logger = logging.getLogger(__name__)

_MAX_BACKOFF_S = 30.0
T = TypeVar("T")


class Ingestor:
    """Runs the loop for one topic into one table; also the source's rebalance listener."""

    def __init__(
        self,
        config: Config,
        source: KafkaSource,
        writer: DeltaWriter,
        pipeline: Pipeline,
        dead_letters: DeadLetterSink,
        metrics: Metrics,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._config = config
        self._topic = config.kafka.topic
        self._source = source
        self._writer = writer
        self._pipeline = pipeline
        self._dead_letters = dead_letters
        self._metrics = metrics
        self._clock = clock
        self._sleep = sleep
        ingest = config.ingest
        self._buffers = ValueBuffers(
            FlushLimits(
                ingest.allowed_latency_s,
                ingest.max_messages_per_file,
                ingest.min_bytes_per_file,
                ingest.max_buffered_bytes,
            )
        )
        # Per assigned partition: the txn version in the table, and the last offset taken (committed or buffered).
        self._committed: dict[int, int | None] = {}
        self._positions: dict[int, int | None] = {}
        # For --until-caught-up: the high watermark when a partition was first assigned, and end-of-partition events.
        self._targets: dict[int, int] = {}
        self._reached: dict[int, int] = {}
        # Partitions re-positioned (seek) while a consumed batch is being taken: the rest of it is stale.
        self._resynced: set[int] = set()
        self._stop_requested = False
        self._failed = False
        self._progress = _Progress(clock, ingest.progress_interval_s)

    # --- the loop -----------------------------------------------------------------------

    def request_stop(self) -> None:
        """Stop fetching; the loop flushes, commits and returns (SIGTERM/SIGINT)."""
        self._stop_requested = True

    def run(self, until_caught_up: bool = False) -> None:
        self._source.start(self)
        try:
            while not self._stop_requested:
                batch = self._consume()
                self._accept(batch)
                reason = self._buffers.flush_reason(self._clock())
                if reason:
                    self._flush(reason)
                if until_caught_up and self._caught_up():
                    self._flush("caught_up")  # no need to wait for the latency limit
                    if self._caught_up():  # a conflict in that flush would have moved us back
                        logger.info("caught up with the high watermarks seen at start: %s", self._targets)
                        break
                self._progress.maybe_log(self._status_line)
            self._flush("shutdown")
        except BaseException:
            self._failed = True  # closing must not commit from a broken state
            raise
        finally:
            logger.info("stopping: %s", self._status_line())
            self._source.close()

    def _consume(self) -> ConsumedBatch:
        timeout = self._config.kafka.consume_timeout_s
        due = self._buffers.seconds_until_due(self._clock())
        if due is not None:
            timeout = min(timeout, max(due, 0.001))
        return self._retrying("consume", lambda: self._source.consume(self._config.kafka.consume_batch_size, timeout))

    def _accept(self, batch: ConsumedBatch) -> None:
        self._resynced.clear()
        for partition in batch.out_of_range:
            self._offset_out_of_range(partition)
        now = self._clock()
        for partition, messages in batch.partitions.items():
            if partition not in self._positions or partition in self._resynced:
                continue  # fetched before a revoke, or before a seek: not to be taken
            fresh = self._drop_taken(messages, self._positions[partition])
            self._metrics.consumed(self._topic, partition, len(fresh))
            # A file closes at exactly max_messages_per_file: cut the batch where the buffer fills.
            # A flush that resyncs this partition makes the rest of its messages stale: stop there.
            while len(fresh) and partition not in self._resynced:
                room = self._buffers.room(partition)
                piece, fresh = (fresh, fresh.select([])) if len(fresh) <= room else fresh.split(room)
                processed = self._pipeline.process(piece)
                self._metrics.skipped(self._topic, partition, "empty", processed.skipped_empty)
                self._buffers.add(processed, len(piece), now)
                self._positions[partition] = processed.last_offset
                self._progress.messages += len(piece)
                if self._buffers.room(partition) == 0:
                    self._flush("records")
                    now = self._clock()
        self._reached.update(batch.end_offsets)
        self._metrics.buffered(self._buffers.buffered_messages)

    def _drop_taken(self, messages: PartitionMessages, position: int | None) -> PartitionMessages:
        """Drop offsets already committed or buffered (a replayed fetch, a seek back)."""
        if position is None or messages.offsets[0] > position:
            return messages
        keep = [i for i, offset in enumerate(messages.offsets) if offset > position]
        self._metrics.skipped(self._topic, messages.partition, "duplicate", len(messages) - len(keep))
        return messages.select(keep)

    def _caught_up(self) -> bool:
        """Every assigned partition has been taken up to the high watermark it had when first assigned."""
        if not self._positions:
            return False
        for partition, position in self._positions.items():
            target = self._targets[partition]
            taken = position is not None and position + 1 >= target
            if not taken and self._reached.get(partition, -1) < target:
                return False
        return True

    # --- flush and commit ---------------------------------------------------------------

    def _flush(self, reason: str, partitions: set[int] | None = None) -> None:
        pending = _PendingCommit(self._buffers.take(partitions))
        started = self._clock()
        attempt = 0
        while pending.buffers:
            try:
                version = self._commit(pending)
                break
            except CommitConflict as conflict:
                for partition, in_log in conflict.partitions.items():
                    dropped = pending.drop(partition)
                    self._metrics.commit_conflict(self._topic, partition)
                    logger.warning(
                        "%s[%d]: another writer committed up to offset %s; dropping our %d messages and resyncing",
                        self._topic,
                        partition,
                        in_log,
                        dropped.messages if dropped else 0,
                    )
                    self._resync(partition, in_log)
            except RetryableError as exc:
                attempt += 1
                self._backoff(attempt, f"commit ({reason})", exc)
        else:
            return
        taken = pending.buffers
        for partition, buffer in taken.items():
            self._committed[partition] = buffer.last_offset
        faults.point("after_delta_commit")
        self._source.commit_group_offsets({p: b.last_offset + 1 for p, b in taken.items()})
        faults.point("after_kafka_commit")
        seconds = self._clock() - started
        rows = {p: b.rows for p, b in taken.items()}
        files = [action for actions in pending.files.values() for action in actions]
        self._metrics.committed(self._topic, reason, rows, len(files), sum(a.size for a in files), version, seconds)
        self._metrics.buffered(self._buffers.buffered_messages)
        self._progress.commits += 1
        self._progress.rows += sum(rows.values())
        logger.info(
            "committed version %d (%s): %s, %d rows, %d dead letters in %.3f s",
            version,
            reason,
            ", ".join(f"{self._topic}[{p}]@{b.first_offset}..{b.last_offset}" for p, b in taken.items()),
            sum(rows.values()),
            sum(len(b.dead_letters) for b in taken.values()),
            seconds,
        )

    def _commit(self, pending: _PendingCommit) -> int:
        """Steps 1-3 of the commit order. What an earlier attempt already did is not done again."""
        taken = pending.buffers
        for partition, buffer in taken.items():
            if partition not in pending.files:
                offsets = OffsetRange(buffer.first_offset, buffer.last_offset)
                rows = buffer.to_table(self._writer.schema)
                pending.files[partition] = (
                    self._writer.write_files(self._topic, partition, offsets, rows) if buffer.rows else []
                )
        faults.point("after_parquet_write")
        letters = [
            letter for p, buffer in taken.items() if p not in pending.letters_recorded for letter in buffer.dead_letters
        ]
        if letters:
            self._dead_letters.record(letters)
            for letter in letters:
                self._metrics.dead_lettered(self._topic, letter.stage)
        pending.letters_recorded.update(taken)
        faults.point("after_dead_letter_commit")
        ranges = {p: OffsetRange(b.first_offset, b.last_offset) for p, b in taken.items()}
        metadata = {
            "app_id": self._config.app_id,
            "topic": self._topic,
            "offsets": {str(p): [r.first, r.last] for p, r in ranges.items()},
            "rows": sum(b.rows for b in taken.values()),
            "dead_letters": sum(len(b.dead_letters) for b in taken.values()),
        }
        actions = [action for partition in taken for action in pending.files[partition]]
        return self._writer.commit(actions, {p: self._committed[p] for p in taken}, ranges, metadata)

    def _resync(self, partition: int, in_log: int | None) -> None:
        """Forget what we hold for ``partition`` and fetch again from the table's version + 1."""
        self._buffers.drop(partition)
        self._resynced.add(partition)
        if partition not in self._positions:
            return
        self._committed[partition] = in_log
        self._positions[partition] = in_log
        reset = LogicalOffset(self._config.kafka.auto_offset_reset)
        self._source.seek(partition, reset if in_log is None else in_log + 1)

    def _backoff(self, attempt: int, what: str, exc: Exception) -> None:
        limit = self._config.ingest.max_commit_retries
        self._metrics.storage_retry()
        if attempt > limit:
            raise FatalError(f"{what} still failing after {limit} retries: {exc}") from exc
        delay = min(_MAX_BACKOFF_S, 0.5 * 2 ** (attempt - 1))
        logger.warning("%s failed (attempt %d of %d), retrying in %.1f s: %s", what, attempt, limit, delay, exc)
        self._sleep(delay)

    def _retrying(self, what: str, operation: Callable[[], T]) -> T:
        attempt = 0
        while True:
            try:
                return operation()
            except RetryableError as exc:
                attempt += 1
                self._backoff(attempt, what, exc)

    # --- rebalance listener (called inside consume) --------------------------------------

    def assigned(self, partitions: list[int]) -> dict[int, int | LogicalOffset]:
        self._metrics.rebalance("assigned", len(partitions))
        # Retry here: if this callback failed, the client would assign without our offsets.
        committed = self._retrying("reading txn versions", lambda: self._writer.committed_offsets(partitions))
        starts: dict[int, int | LogicalOffset] = {}
        for partition in sorted(partitions):
            low, high = self._retrying("watermarks", partial(self._source.watermarks, partition))
            where = f"{self._topic}[{partition}]"
            decision = start_position(
                committed[partition],
                low,
                high,
                self._config.kafka.auto_offset_reset,
                self._config.kafka.missing_offset_policy,
                where,
            )
            if decision.out_of_range:
                self._metrics.offset_out_of_range(self._topic, partition)
                logger.error("%s", decision.reason)
            else:
                logger.info(
                    "assigned %s: starting at %s (%s)",
                    where,
                    decision.offset.value if isinstance(decision.offset, LogicalOffset) else decision.offset,
                    decision.reason,
                )
            self._committed[partition] = committed[partition]
            self._positions[partition] = decision.offset - 1 if isinstance(decision.offset, int) else None
            self._targets.setdefault(partition, high)
            starts[partition] = decision.offset
        self._metrics.assigned(len(self._positions))
        return starts

    def revoked(self, partitions: list[int]) -> None:
        self._metrics.rebalance("revoked", len(partitions))
        owned = {p for p in partitions if p in self._positions}
        faults.point("in_revoke")
        if owned and not self._failed:
            logger.info("revoked %s: committing what is buffered for them", sorted(owned))
            self._flush("revoke", owned)
        self._forget(owned)

    def lost(self, partitions: list[int]) -> None:
        self._metrics.rebalance("lost", len(partitions))
        owned = {p for p in partitions if p in self._positions}
        for partition in owned:
            dropped = self._buffers.drop(partition)
            logger.warning(
                "lost %s[%d] without notice: dropping %d buffered messages (the next owner replays them from the log)",
                self._topic,
                partition,
                dropped.messages if dropped else 0,
            )
        self._forget(owned)

    def _forget(self, partitions: set[int]) -> None:
        for partition in partitions:
            self._buffers.drop(partition)
            self._committed.pop(partition, None)
            self._positions.pop(partition, None)
        self._metrics.assigned(len(self._positions))

    def _offset_out_of_range(self, partition: int) -> None:
        """The broker deleted the offset we were fetching (retention) while we ran."""
        if partition not in self._positions:
            return
        low, high = self._retrying("watermarks", lambda: self._source.watermarks(partition))
        position = self._positions[partition]
        decision = start_position(
            position,
            low,
            high,
            self._config.kafka.auto_offset_reset,
            self._config.kafka.missing_offset_policy,
            f"{self._topic}[{partition}]",
        )
        self._metrics.offset_out_of_range(self._topic, partition)
        logger.error("%s", decision.reason)
        if isinstance(decision.offset, int):
            self._positions[partition] = decision.offset - 1
        self._resynced.add(partition)
        self._source.seek(partition, decision.offset)

    # --- progress -------------------------------------------------------------------------

    def _status_line(self) -> str:
        lags = []
        for partition, committed in sorted(self._committed.items()):
            try:
                _, high = self._source.watermarks(partition, cached=True)
            except RetryableError:
                continue  # no fetch response yet: no lag to show
            if high >= 0:
                lags.append(f"{partition}:{high - (committed + 1 if committed is not None else 0)}")
        return (
            f"{self._progress.rate():.0f} msg/s, {self._progress.messages} messages, {self._progress.rows} rows in "
            f"{self._progress.commits} commits, table version {self._writer.version}, "
            f"buffered {self._buffers.buffered_messages}, lag {{{', '.join(lags)}}}"
        )


@dataclass
class _PendingCommit:
    """One flush's work, kept across retries so no file is written and no dead letter recorded twice."""

    buffers: dict[int, PartitionBuffer]
    files: dict[int, list[AddAction]] = field(default_factory=dict)
    letters_recorded: set[int] = field(default_factory=set)

    def drop(self, partition: int) -> PartitionBuffer | None:
        self.files.pop(partition, None)
        return self.buffers.pop(partition, None)


class _Progress:
    """Counters for the periodic progress line."""

    def __init__(self, clock: Callable[[], float], interval_s: float) -> None:
        self._clock = clock
        self._interval_s = interval_s
        self._started = clock()
        self._last_logged = self._started
        self._last_messages = 0
        self.messages = 0
        self.rows = 0
        self.commits = 0

    def rate(self) -> float:
        elapsed = self._clock() - self._started
        return self.messages / elapsed if elapsed > 0 else 0.0

    def maybe_log(self, line: Callable[[], str]) -> None:
        now = self._clock()
        if now - self._last_logged >= self._interval_s:
            window = self.messages - self._last_messages
            logger.info(
                "progress: %.0f msg/s over the last %.0f s; %s",
                window / (now - self._last_logged),
                now - self._last_logged,
                line(),
            )
            self._last_logged = now
            self._last_messages = self.messages
