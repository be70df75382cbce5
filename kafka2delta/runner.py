"""The loop. It reads like the product's paragraph:

assignment (start each partition at the table's txn version + 1) → fetch a batch → drop offsets
already taken → deserialize, transform, coerce (the pure pipeline) → buffer → when the first of
latency / records / bytes is reached: write Parquet, commit the dead letters to their table, make
ONE Delta commit with the files and a txn per partition → then, for lag tools only, commit Kafka
group offsets.

The commit order, and what a crash between two steps leaves behind:

1. Parquet files written           → crash: orphan files, never referenced; replay rewrites them.
2. dead-letter commit (own txns)   → crash: replay reads which offsets in (main txn, dead-letter txn]
                                     are dead letters already and takes them as final.
3. Delta commit (files + txns)     → the point of no return; replay starts after the txn versions.
4. Kafka group offsets (async)     → crash: lag tools lag a little; recovery never reads them.

Steps 1-3 are :class:`kafka2delta.committer.Committer`'s; what is said about a commit afterwards
(metrics, status page, log lines) is :class:`kafka2delta.progress.Progress`'s. A commit conflict
(another writer moved a partition's txn) drops that partition's data and seeks to the table's
version + 1; a schema change made by someone else drops every pending partition's data, refits the
stages to the new schema and replays. A transient storage error retries with backoff, offsets held.
The loop sees Kafka and Delta only through the Protocols of :mod:`kafka2delta.edges`.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from functools import partial

from kafka2delta import faults
from kafka2delta.assignment import PartitionState
from kafka2delta.committer import Committer, PendingCommit
from kafka2delta.config import Config
from kafka2delta.coordinator import Coordinator, Turn
from kafka2delta.edges import DeadLetterProducer, DeadLetterStore, Source, TableWriter
from kafka2delta.errors import CommitConflict, RetryableError, SchemaChanged
from kafka2delta.metrics import Metrics
from kafka2delta.offsets import LogicalOffset, start_position
from kafka2delta.pipeline import Pipeline
from kafka2delta.progress import Progress
from kafka2delta.records import ConsumedBatch, PartitionMessages, ProcessedPartition
from kafka2delta.retries import Retrier
from kafka2delta.status import Status, StatusBoard, liveness_window_s
from kafka2delta.value_buffers import FlushLimits, ValueBuffers

logger = logging.getLogger(__name__)

_TURN_RETRY_S = 0.2  # between two refused coordinator turns (not our turn yet)
_KAFKA_MAX_POLL_INTERVAL_MS = 300_000  # librdkafka's default max.poll.interval.ms
# Flushes that give up instead of waiting for a refused turn: what they hold is replayed (by the next owner).
_ONE_TURN_REASONS = frozenset({"revoke", "shutdown"})


class Ingestor:
    """Runs the loop for one topic into one table; also the source's rebalance listener."""

    def __init__(
        self,
        config: Config,
        *,
        source: Source,
        writer: TableWriter,
        pipeline: Pipeline,
        dead_letters: DeadLetterStore,
        metrics: Metrics,
        dead_letter_topic: DeadLetterProducer | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        wall_clock: Callable[[], float] = time.time,
        coordinator: Coordinator | None = None,
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
        # With [coordinator] join_ingest: every Delta commit inside a turn named "ingest" (see _flush).
        self._coordinator = coordinator
        self._next_idle_turn = 0.0
        # Waiting for a turn does not poll Kafka: give the flush up well before the group evicts us.
        max_poll_ms = float(config.kafka.settings.get("max.poll.interval.ms", _KAFKA_MAX_POLL_INTERVAL_MS))
        self._max_turn_wait_s = max_poll_ms / 1000 / 2
        self._buffers = ValueBuffers(
            FlushLimits(
                allowed_latency_s=ingest.allowed_latency_s,
                max_messages_per_file=ingest.max_messages_per_file,
                min_bytes_per_file=ingest.min_bytes_per_file,
                max_buffered_bytes=ingest.max_buffered_bytes,
            )
        )
        # One state per assigned partition: created in assigned(), dropped in _forget(), nowhere else.
        self._partitions: dict[int, PartitionState] = {}
        # Scoped to one consume call, by partition number (kafka2delta.assignment says why not per state):
        # partitions re-positioned since it began (the messages it returns for them are stale), and the
        # seeks decided inside its rebalance callbacks (made once it returns).
        self._resynced: set[int] = set()
        self._deferred_seeks: dict[int, int | LogicalOffset] = {}
        # For --until-caught-up, kept across re-assignments: the high watermark when a partition was first
        # assigned, and the end-of-partition events seen.
        self._targets: dict[int, int] = {}
        self._reached: dict[int, int] = {}
        self._in_rebalance = False
        self._stop_requested = False
        self._failed = False
        # What /healthz, /readyz and the status page show: written here, read by the HTTP threads.
        self._board = StatusBoard(
            self._topic,
            config.app_id,
            config.kafka.group_id,
            writer.uri,
            dead_letters.uri,
            liveness_window_s(ingest.allowed_latency_s, config.kafka.consume_timeout_s),
            clock=clock,
            wall_clock=wall_clock,
        )
        self._board.table_reachable(writer.version)
        self._retrier = Retrier(max_retries=ingest.max_commit_retries, metrics=metrics, board=self._board, sleep=sleep)
        self._committer = Committer(
            app_id=config.app_id,
            topic=self._topic,
            writer=writer,
            dead_letters=dead_letters,
            dead_letter_topic=dead_letter_topic,
            pipeline=pipeline,
            metrics=metrics,
            retrier=self._retrier,
            clock=clock,
        )
        self._progress = Progress(
            topic=self._topic,
            metrics=metrics,
            board=self._board,
            clock=clock,
            wall_clock=wall_clock,
            interval_s=ingest.progress_interval_s,
            max_messages_per_file=ingest.max_messages_per_file,
        )

    # --- the loop -----------------------------------------------------------------------

    def request_stop(self) -> None:
        """Stop fetching; the loop flushes, commits and returns (SIGTERM/SIGINT)."""
        self._stop_requested = True
        self._board.set_state("stopping")

    def status(self) -> Status:
        """A snapshot for the HTTP endpoints; thread-safe (the loop publishes, this only reads)."""
        return self._board.snapshot()

    def run(self, until_caught_up: bool = False) -> None:
        self._board.set_state("running")
        self._source.start(self)
        try:
            while not self._stop_requested:
                self._board.loop_turned()
                batch = self._consume()
                self._accept(batch)
                reason = self._buffers.flush_reason(self._clock())
                if reason:
                    self._flush(reason)
                elif self._coordinator is not None and not self._buffers:
                    self._idle_turn()
                if until_caught_up and self._caught_up():
                    self._flush("caught_up")  # no need to wait for the latency limit
                    if self._caught_up():  # a conflict in that flush would have moved us back
                        logger.info("caught up with the high watermarks seen at start: %s", self._targets)
                        break
                self._progress.maybe_log(self._progress_line)
            self._flush("shutdown")
        except BaseException as exc:
            self._failed = True  # closing must not commit from a broken state
            self._board.set_state("failed", f"{type(exc).__name__}: {exc}")
            raise
        finally:
            logger.info("stopping: %s", self._progress_line())
            self._source.close()
            if not self._failed:
                self._board.set_state("stopped")

    def _consume(self) -> ConsumedBatch:
        # Cleared before the call: a rebalance callback inside it may resync (seek) a partition, and the
        # messages of that partition this very call returns were fetched before the seek.
        self._resynced.clear()
        timeout = self._config.kafka.consume_timeout_s
        due = self._buffers.seconds_until_due(self._clock())
        if due is not None:
            timeout = min(timeout, max(due, 0.001))
        size = self._config.kafka.consume_batch_size
        return self._retrier.run("consume", lambda: self._source.consume(size, timeout))

    def _accept(self, batch: ConsumedBatch) -> None:
        # Resyncs made by a rebalance callback during that consume(): this batch's messages of those
        # partitions were fetched before the seek (they are in _resynced and skipped below).
        for partition, target in self._deferred_seeks.items():
            if partition in self._partitions:
                self._source.seek(partition, target)
        self._deferred_seeks.clear()
        for partition in batch.out_of_range:
            self._offset_out_of_range(partition)
        now = self._clock()
        for partition, messages in batch.partitions.items():
            state = self._partitions.get(partition)
            if state is None or partition in self._resynced:
                continue  # fetched before a revoke, or before a seek: not to be taken
            fresh = self._drop_taken(messages, state.position)
            self._metrics.consumed(self._topic, partition, len(fresh))
            # A file closes at exactly max_messages_per_file: cut the batch where the buffer fills.
            # A flush that resyncs this partition makes the rest of its messages stale: stop there.
            while len(fresh) and partition not in self._resynced:
                room = self._buffers.room(partition)
                piece, fresh = (fresh, fresh.select([])) if len(fresh) <= room else fresh.split(room)
                processed = self._process(piece, state)
                self._metrics.skipped(self._topic, partition, "empty", processed.skipped_empty)
                self._metrics.skipped(self._topic, partition, "filtered", processed.skipped_filtered)
                self._metrics.unknown_fields(self._topic, processed.unknown_fields)
                self._buffers.add(processed, len(piece), now)
                state.position = processed.last_offset
                self._progress.taken(len(piece))
                if self._buffers.room(partition) == 0:
                    self._flush("records")
                    now = self._clock()
        self._reached.update(batch.end_offsets)
        self._metrics.buffered(self._buffers.buffered_messages, self._buffers.buffered_bytes)

    def _drop_taken(self, messages: PartitionMessages, position: int | None) -> PartitionMessages:
        """Drop offsets already committed or buffered (a replayed fetch, a seek back)."""
        if position is None or messages.offsets[0] > position:
            return messages
        keep = [i for i, offset in enumerate(messages.offsets) if offset > position]
        self._metrics.skipped(self._topic, messages.partition, "duplicate", len(messages) - len(keep))
        return messages.select(keep)

    def _process(self, piece: PartitionMessages, state: PartitionState) -> ProcessedPartition:
        """Run the pipeline on ``piece``, except messages that are dead letters already: recorded by a
        dead-letter commit whose main commit a crash lost. They are final; they only advance the txn."""
        recorded = state.recorded_dead_letters
        todo = piece
        if recorded:
            todo = piece.select([i for i, offset in enumerate(piece.offsets) if offset not in recorded])
            self._metrics.skipped(self._topic, piece.partition, "dead_letter_recorded", len(piece) - len(todo))
        if len(todo):
            processed = self._retrier.run("processing", partial(self._pipeline.process, todo))
            self._count_stages(processed, len(todo))
        else:
            processed = ProcessedPartition(
                partition=piece.partition,
                rows=self._pipeline.schema.empty_table(),
                first_offset=piece.offsets[0],
                last_offset=piece.offsets[-1],
                max_timestamp_ms=max(piece.timestamps_ms),
            )
        processed.first_offset, processed.last_offset = piece.offsets[0], piece.offsets[-1]
        return processed

    def _count_stages(self, processed: ProcessedPartition, messages: int) -> None:
        """Deserialized and failed-per-stage counts of one processed piece (per dead letter, not per message)."""
        failed = Counter(letter.stage for letter in processed.dead_letters)
        for stage, count in failed.items():
            self._metrics.failed(self._topic, stage, count)
        self._metrics.deserialized(self._topic, messages - processed.skipped_empty - failed["deserialize"])

    def _caught_up(self) -> bool:
        """Every assigned partition has been taken up to the high watermark it had when first assigned."""
        if not self._partitions:
            return False
        for partition, state in self._partitions.items():
            target = self._targets[partition]
            taken = state.position is not None and state.position + 1 >= target
            if not taken and self._reached.get(partition, -1) < target:
                return False
        return True

    # --- flush: when, and inside which coordinator turn -------------------------------------

    def _flush(self, reason: str, partitions: set[int] | None = None) -> None:
        if self._coordinator is None or not self._held(partitions):
            self._flush_now(reason, partitions)
            return
        turn = self._wait_for_turn(reason)
        if turn is None:
            self._give_up_flush(reason, partitions)
            return
        with turn:
            self._flush_now(reason, partitions)
        self._next_idle_turn = self._clock() + self._config.ingest.allowed_latency_s

    def _wait_for_turn(self, reason: str) -> Turn | None:
        """The coordinator's ``ingest`` turn; waits while it is refused (lock busy, another job's turn). None
        (give the flush up) for a revoke or shutdown flush, once a stop is requested, or after half of Kafka's
        ``max.poll.interval.ms``: the consumer is not polled meanwhile and must stay in its group."""
        assert self._coordinator is not None
        coordinator, started, refusals = self._coordinator, self._clock(), 0
        while True:
            turn = self._retrier.run("coordinator turn", lambda: coordinator.turn("ingest"))
            if turn is not None:
                if refusals:
                    logger.info("coordinator: got the ingest turn after %.1f s", self._clock() - started)
                return turn
            refusals += 1
            refused_by = "lock_busy" if coordinator.last_skip == "lock busy" else "order"
            self._metrics.coordinator_skip(self._topic, refused_by)
            if reason in _ONE_TURN_REASONS or self._stop_requested:
                return None
            if self._clock() - started >= self._max_turn_wait_s:
                logger.warning(
                    "coordinator: no ingest turn in %.0f s (half of max.poll.interval.ms): %s",
                    self._clock() - started,
                    coordinator.last_skip,
                )
                return None
            if refusals == 1 or refusals % 50 == 0:
                logger.info("coordinator: waiting for the ingest turn (%s flush): %s", reason, coordinator.last_skip)
            self._board.loop_turned()  # waiting for our turn on purpose is alive
            self._sleep(_TURN_RETRY_S)

    def _give_up_flush(self, reason: str, partitions: set[int] | None) -> None:
        """No turn: commit nothing. Each partition goes back to its committed offset (a revoked one is replayed
        by its next owner), so no later commit can skip these messages."""
        dropped = self._buffers.take(partitions)
        logger.warning(
            "coordinator: no ingest turn for the %s flush (%s); %d buffered messages of %s not committed, "
            "they will be read again from the committed offsets",
            reason,
            self._coordinator.last_skip if self._coordinator else "",
            sum(buffer.messages for buffer in dropped.values()),
            ", ".join(f"{self._topic}[{p}]" for p in dropped),
        )
        for partition in dropped:
            self._resync(partition)

    def _held(self, partitions: set[int] | None) -> list[int]:
        """The partitions among ``partitions`` (None: all) that hold a buffer."""
        held = self._buffers.partitions()
        return held if partitions is None else [p for p in held if p in partitions]

    def _idle_turn(self) -> None:
        """Nothing to commit: register an empty ``ingest`` turn now and then, so that a strict order does not
        wait for ingestion on a quiet topic. Never waits for the lock."""
        coordinator, now = self._coordinator, self._clock()
        if coordinator is None or "ingest" not in coordinator.order or now < self._next_idle_turn:
            return
        self._next_idle_turn = now + self._config.ingest.allowed_latency_s
        turn = self._retrier.run("coordinator turn", lambda: coordinator.turn("ingest", lock_timeout_s=0.0))
        if turn is not None:
            with turn:
                pass

    # --- flush: write, commit, record -------------------------------------------------------

    def _flush_now(self, reason: str, partitions: set[int] | None = None) -> None:
        """Commit the buffers of ``partitions`` (None: every buffered one), then record the commit."""
        pending = PendingCommit(self._buffers.take(partitions))
        started = self._clock()
        version = self._commit(reason, pending)
        if version is None:
            return  # nothing was buffered, or every partition was dropped (conflicts)
        taken = pending.buffers
        for partition, buffer in taken.items():
            state = self._partitions[partition]
            state.committed = buffer.last_offset
            if state.recorded_dead_letters and buffer.last_offset >= max(state.recorded_dead_letters):
                state.recorded_dead_letters = set()  # the main txn covers them now
        faults.point("after_delta_commit")
        faults.point("before_kafka_commit")
        self._source.commit_group_offsets({p: b.last_offset + 1 for p, b in taken.items()})
        faults.point("after_kafka_commit")
        self._progress.committed(
            reason=reason,
            version=version,
            taken=taken,
            files=pending.actions(),
            flush_seconds=self._clock() - started,
            commit_seconds=self._committer.commit_seconds,
            buffers=self._buffers,
        )
        self._publish_partitions()

    def _commit(self, reason: str, pending: PendingCommit) -> int | None:
        """The committer's steps 1-3, until they land or nothing is left to commit: a conflicting partition is
        dropped and resynced, a schema change refits the stages and replays, a storage error backs off."""
        attempt = 0
        while pending.buffers:
            try:
                return self._committer.commit(pending, self._partitions)
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
                    self._resync(partition)
            except SchemaChanged as changed:
                self._schema_changed(changed, pending)
            except RetryableError as exc:
                attempt += 1
                self._metrics.commit_retry(self._topic)
                self._retrier.backoff(attempt, f"commit ({reason})", exc)
        return None

    def _schema_changed(self, changed: SchemaChanged, pending: PendingCommit) -> None:
        """Another writer changed the schema: drop what was fitted to the old one, refit, replay it."""
        schema = changed.schema
        logger.warning(
            "the schema of %s changed under us: dropping %d pending messages of partitions %s and replaying them; "
            "new schema: %s",
            self._writer.uri,
            sum(b.messages for b in pending.buffers.values()),
            sorted(pending.buffers),
            schema,
        )
        self._metrics.schema_change(self._topic)
        self._committer.adopt_schema(schema)
        for partition in list(pending.buffers):
            pending.drop(partition)
            self._resync(partition)
        # Everything else buffered was fitted to the old schema too.
        for partition in list(self._partitions):
            if partition in self._buffers:
                self._resync(partition)

    # --- positions --------------------------------------------------------------------------

    def _resync(self, partition: int) -> None:
        """Forget what we hold for ``partition`` and fetch again from the main table's txn version + 1."""
        self._buffers.drop(partition)
        self._resynced.add(partition)
        state = self._partitions.get(partition)
        if state is None:
            return
        main, letters, recorded = self._read_offsets([partition])
        state.committed = state.position = main[partition]
        state.dead_letters_committed = letters[partition]
        state.recorded_dead_letters = recorded.get(partition, set())
        reset = LogicalOffset(self._config.kafka.auto_offset_reset)
        target = reset if state.committed is None else state.committed + 1
        if self._in_rebalance:
            # Inside a rebalance callback, consume() may already hold fresh messages fetched after a seek
            # made here, indistinguishable from stale ones: seek once it has returned (see _accept).
            self._deferred_seeks[partition] = target
        else:
            self._source.seek(partition, target)

    def _read_offsets(
        self, partitions: list[int]
    ) -> tuple[dict[int, int | None], dict[int, int | None], dict[int, set[int]]]:
        """The main and dead-letter txn versions of ``partitions``, and per partition the offsets after the
        main one that the dead-letter table already holds (non-empty only after a crash between the two
        commits)."""
        main = self._retrier.run("reading txn versions", lambda: self._writer.committed_offsets(partitions))
        letters = self._retrier.run(
            "reading dead-letter txn versions", lambda: self._dead_letters.committed_offsets(partitions)
        )
        recorded: dict[int, set[int]] = {}
        for partition in partitions:
            last_letter, committed = letters[partition], main[partition]
            if last_letter is not None and (committed is None or last_letter > committed):
                recorded[partition] = self._retrier.run(
                    "reading recorded dead letters",
                    partial(self._dead_letters.recorded_offsets, partition, committed, last_letter),
                )
                logger.warning(
                    "%s[%d]: the dead-letter table is ahead of the table (%s > %s): %d dead letters recorded "
                    "before a crash are final and will not be processed again",
                    self._topic,
                    partition,
                    last_letter,
                    committed,
                    len(recorded[partition]),
                )
        return main, letters, recorded

    def _offset_out_of_range(self, partition: int) -> None:
        """The broker deleted the offset we were fetching (retention) while we ran."""
        state = self._partitions.get(partition)
        if state is None:
            return
        low, high = self._retrier.run("watermarks", lambda: self._source.watermarks(partition))
        decision = start_position(
            state.position,
            low,
            high,
            self._config.kafka.auto_offset_reset,
            self._config.kafka.missing_offset_policy,
            f"{self._topic}[{partition}]",
        )
        self._metrics.offset_out_of_range(self._topic, partition)
        logger.error("%s", decision.reason)
        if isinstance(decision.offset, int):
            state.position = decision.offset - 1
        self._resynced.add(partition)
        self._source.seek(partition, decision.offset)

    # --- rebalance listener (called inside consume) --------------------------------------

    def assigned(self, partitions: list[int]) -> dict[int, int | LogicalOffset]:
        self._metrics.rebalance("assigned", len(partitions))
        faults.point("in_assign")
        # Retry here: if this callback failed, the client would assign without our offsets.
        committed, letters, recorded = self._read_offsets(partitions)
        starts: dict[int, int | LogicalOffset] = {}
        for partition in sorted(partitions):
            low, high = self._retrier.run("watermarks", partial(self._source.watermarks, partition))
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
            self._partitions[partition] = PartitionState(
                partition=partition,
                committed=committed[partition],
                dead_letters_committed=letters[partition],
                position=decision.offset - 1 if isinstance(decision.offset, int) else None,
                high_watermark=high,
                recorded_dead_letters=recorded.get(partition, set()),
            )
            self._targets.setdefault(partition, high)
            starts[partition] = decision.offset
        self._metrics.assigned(len(self._partitions))
        self._publish_partitions()
        return starts

    def revoked(self, partitions: list[int]) -> None:
        self._metrics.rebalance("revoked", len(partitions))
        owned = {p for p in partitions if p in self._partitions}
        faults.point("in_revoke")
        if owned and not self._failed:
            logger.info("revoked %s: committing what is buffered for them", sorted(owned))
            self._in_rebalance = True
            try:
                self._flush("revoke", owned)
            finally:
                self._in_rebalance = False
        self._forget(owned)

    def lost(self, partitions: list[int]) -> None:
        self._metrics.rebalance("lost", len(partitions))
        owned = {p for p in partitions if p in self._partitions}
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
            self._partitions.pop(partition, None)
        self._metrics.assigned(len(self._partitions))
        self._metrics.unassigned(self._topic, partitions)
        self._publish_partitions()

    # --- what the daemon shows ----------------------------------------------------------------

    def _publish_partitions(self) -> dict[int, int]:
        """Refresh each partition's high watermark from the consumer's cache (no broker round trip), then
        the lag gauges and the status page; return the lags."""
        for partition, state in self._partitions.items():
            try:
                _, high = self._source.watermarks(partition, cached=True)
            except RetryableError:
                high = -1  # no fetch response yet
            if high >= 0:
                state.high_watermark = high
        return self._progress.publish_partitions(self._partitions, self._buffers)

    def _progress_line(self) -> str:
        return self._progress.line(self._publish_partitions(), self._writer.version, self._buffers.buffered_messages)
