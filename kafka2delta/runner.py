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

A commit conflict (another writer moved a partition's txn) drops that partition's data and seeks
to the table's version + 1; a schema change made by someone else drops every pending partition's
data, refits the stages to the new schema and replays. A transient storage error retries with
backoff, offsets held.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol, TypeVar

import pyarrow as pa
from deltalake.transaction import AddAction

from kafka2delta import faults
from kafka2delta.batches import PartitionMessages
from kafka2delta.config import Config
from kafka2delta.coordinator import Coordinator, Turn
from kafka2delta.dead_letters import DeadLetter, payload_json
from kafka2delta.errors import CommitConflict, FatalError, RetryableError, SchemaChanged
from kafka2delta.kafka import ConsumedBatch, KafkaSource
from kafka2delta.metrics import CommitStats, Metrics
from kafka2delta.offsets import LogicalOffset, start_position
from kafka2delta.pipeline import WRITE_STAGE, Pipeline, ProcessedPartition
from kafka2delta.schema import evolve
from kafka2delta.serialization import STAGE as DESERIALIZE_STAGE
from kafka2delta.status import CommitRecord, Status, StatusBoard, liveness_window_s
from kafka2delta.value_buffers import FlushLimits, PartitionBuffer, ValueBuffers
from kafka2delta.writer import DeltaWriter, OffsetRange, RowsRejected

logger = logging.getLogger(__name__)

_MAX_BACKOFF_S = 30.0
_LOGGED_DEAD_LETTERS = 10  # per commit; the rest are in the dead-letter table and the metrics
# Retried operations that do not touch the tables (readiness only reports the table's).
_NOT_TABLE_OPERATIONS = frozenset({"consume", "watermarks", "processing", "coordinator turn"})
_TURN_RETRY_S = 0.2  # between two refused coordinator turns (not our turn yet)
_KAFKA_MAX_POLL_INTERVAL_MS = 300_000  # librdkafka's default max.poll.interval.ms
# Flushes that give up instead of waiting for a refused turn: what they hold is replayed (by the next owner).
_ONE_TURN_REASONS = frozenset({"revoke", "shutdown"})
T = TypeVar("T")


class DeadLetterStore(Protocol):
    """The dead-letter table as the loop sees it (see :class:`kafka2delta.dead_letters.DeadLetterTable`)."""

    @property
    def uri(self) -> str: ...

    def committed_offsets(self, partitions: Iterable[int]) -> dict[int, int | None]: ...

    def recorded_offsets(self, partition: int, after: int | None, upto: int) -> set[int]: ...

    def commit(
        self,
        letters: Mapping[int, Sequence[DeadLetter]],
        expected: Mapping[int, int | None],
        versions: Mapping[int, int],
        metadata: dict[str, Any],
    ) -> int: ...


class DeadLetterProducer(Protocol):
    def produce(self, letters: Sequence[DeadLetter]) -> None: ...


class Ingestor:
    """Runs the loop for one topic into one table; also the source's rebalance listener."""

    def __init__(
        self,
        config: Config,
        source: KafkaSource,
        writer: DeltaWriter,
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
        # With [coordinator] join_ingest: every Delta commit inside a turn named "ingest" (see _flush).
        self._coordinator = coordinator
        self._next_idle_turn = 0.0
        # Waiting for a turn does not poll Kafka: give the flush up well before the group evicts us.
        max_poll_ms = float(config.kafka.settings.get("max.poll.interval.ms", _KAFKA_MAX_POLL_INTERVAL_MS))
        self._max_turn_wait_s = max_poll_ms / 1000 / 2
        self._topic = config.kafka.topic
        self._source = source
        self._writer = writer
        self._pipeline = pipeline
        self._dead_letters = dead_letters
        self._dead_letter_topic = dead_letter_topic
        self._metrics = metrics
        # The table schema the pipeline was last fitted to; a different one at commit time is someone else's change.
        self._table_schema: pa.Schema = writer.schema
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
        # Per assigned partition: the txn versions in the main and dead-letter tables, the last offset taken
        # (committed or buffered), and the offsets after the main txn that are dead letters already.
        self._committed: dict[int, int | None] = {}
        self._dead_letters_committed: dict[int, int | None] = {}
        self._positions: dict[int, int | None] = {}
        self._recorded: dict[int, set[int]] = {}
        # For --until-caught-up: the high watermark when a partition was first assigned, and end-of-partition events.
        self._targets: dict[int, int] = {}
        self._reached: dict[int, int] = {}
        # Partitions re-positioned (seek) while a consumed batch is being taken: the rest of it is stale.
        self._resynced: set[int] = set()
        self._deferred_seeks: dict[int, int | LogicalOffset] = {}
        self._in_rebalance = False
        self._stop_requested = False
        self._failed = False
        self._progress = _Progress(clock, ingest.progress_interval_s)
        # What /healthz, /readyz and the status page show: written here, read by the HTTP threads.
        self._wall_clock = wall_clock
        self._highs: dict[int, int] = {}  # last known high watermark per assigned partition
        self._commit_seconds = 0.0  # the Delta commit of the last attempt
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
                self._progress.maybe_log(self._status_line)
            self._flush("shutdown")
        except BaseException as exc:
            self._failed = True  # closing must not commit from a broken state
            self._board.set_state("failed", f"{type(exc).__name__}: {exc}")
            raise
        finally:
            logger.info("stopping: %s", self._status_line())
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
        return self._retrying("consume", lambda: self._source.consume(self._config.kafka.consume_batch_size, timeout))

    def _accept(self, batch: ConsumedBatch) -> None:
        # Resyncs made by a rebalance callback during that consume(): this batch's messages of those
        # partitions were fetched before the seek (they are in _resynced and skipped below).
        for partition, target in self._deferred_seeks.items():
            if partition in self._positions:
                self._source.seek(partition, target)
        self._deferred_seeks.clear()
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
                processed = self._process(piece)
                self._metrics.skipped(self._topic, partition, "empty", processed.skipped_empty)
                self._metrics.skipped(self._topic, partition, "filtered", processed.skipped_filtered)
                self._metrics.unknown_fields(self._topic, processed.unknown_fields)
                self._buffers.add(processed, len(piece), now)
                self._positions[partition] = processed.last_offset
                self._progress.messages += len(piece)
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

    def _process(self, piece: PartitionMessages) -> ProcessedPartition:
        """Run the pipeline on ``piece``, except messages that are dead letters already: recorded by a
        dead-letter commit whose main commit a crash lost. They are final; they only advance the txn."""
        recorded = self._recorded.get(piece.partition)
        todo = piece
        if recorded:
            todo = piece.select([i for i, offset in enumerate(piece.offsets) if offset not in recorded])
            self._metrics.skipped(self._topic, piece.partition, "dead_letter_recorded", len(piece) - len(todo))
        if len(todo):
            processed = self._retrying("processing", partial(self._pipeline.process, todo))
            self._count_stages(processed, len(todo))
        else:
            processed = ProcessedPartition(
                piece.partition, self._pipeline.schema.empty_table(), [], [], 0, 0, 0, max(piece.timestamps_ms)
            )
        processed.first_offset, processed.last_offset = piece.offsets[0], piece.offsets[-1]
        return processed

    def _count_stages(self, processed: ProcessedPartition, messages: int) -> None:
        """Deserialized and failed-per-stage counts of one processed piece (per dead letter, not per message)."""
        failed = Counter(letter.stage for letter in processed.dead_letters)
        for stage, count in failed.items():
            self._metrics.failed(self._topic, stage, count)
        self._metrics.deserialized(self._topic, messages - processed.skipped_empty - failed[DESERIALIZE_STAGE])

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
            turn = self._retrying("coordinator turn", lambda: coordinator.turn("ingest"))
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
        turn = self._retrying("coordinator turn", lambda: coordinator.turn("ingest", lock_timeout_s=0.0))
        if turn is not None:
            with turn:
                pass

    def _flush_now(self, reason: str, partitions: set[int] | None = None) -> None:
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
                    self._resync(partition)
            except SchemaChanged as changed:
                self._schema_changed(changed, pending)
            except RetryableError as exc:
                attempt += 1
                self._metrics.commit_retry(self._topic)
                self._backoff(attempt, f"commit ({reason})", exc)
        else:
            return
        taken = pending.buffers
        for partition, buffer in taken.items():
            self._committed[partition] = buffer.last_offset
            recorded = self._recorded.get(partition)
            if recorded and buffer.last_offset >= max(recorded):
                del self._recorded[partition]  # the main txn covers them now
        faults.point("after_delta_commit")
        faults.point("before_kafka_commit")
        self._source.commit_group_offsets({p: b.last_offset + 1 for p, b in taken.items()})
        faults.point("after_kafka_commit")
        seconds = self._clock() - started
        rows = {p: b.rows for p, b in taken.items()}
        files = [action for actions in pending.files.values() for action in actions]
        stamps = [stamp for b in taken.values() for stamp in b.row_timestamps_ms]
        self._metrics.committed(
            self._topic,
            CommitStats(reason, version, rows, [a.size for a in files], seconds, self._commit_seconds, stamps),
        )
        letters = sum(len(b.dead_letters) for b in taken.values())
        self._metrics.buffered(self._buffers.buffered_messages, self._buffers.buffered_bytes)
        record = CommitRecord(
            version,
            self._wall_clock(),
            reason,
            {p: (b.first_offset, b.last_offset) for p, b in taken.items()},
            sum(rows.values()),
            letters,
            seconds,
        )
        self._board.committed(record, Counter(letter.stage for b in taken.values() for letter in b.dead_letters))
        self._lags()
        self._progress.commits += 1
        self._progress.rows += sum(rows.values())
        self._progress.dead_letters += letters
        self._progress.filtered += sum(b.filtered for b in taken.values())
        self._progress.unknown_fields += sum(b.unknown_fields for b in taken.values())
        logger.info(
            "committed version %d (%s): %s, %d rows, %d dead letters, %d filtered in %.3f s",
            version,
            reason,
            ", ".join(f"{self._topic}[{p}]@{b.first_offset}..{b.last_offset}" for p, b in taken.items()),
            sum(rows.values()),
            letters,
            sum(b.filtered for b in taken.values()),
            seconds,
        )

    def _commit(self, pending: _PendingCommit) -> int:
        """Steps 1-3 of the commit order. What an earlier attempt already did is not done again."""
        if not pending.schema_checked:
            self._check_schema()
            pending.schema_checked = True
        schema = self._pipeline.schema
        evolving = not schema.equals(self._table_schema, check_metadata=False)
        self._write_files(pending, schema, evolving)
        faults.point("after_parquet_write")
        self._commit_dead_letters(pending)
        faults.point("after_dead_letter_commit")
        taken = pending.buffers
        # A zombie's dead-letter commit for our partitions means it took some of these offsets as dead
        # letters: committing our outcome for them too would put an offset in both tables. Resync instead.
        in_dead_letters = self._dead_letters.committed_offsets(list(taken))
        moved = {p: v for p, v in in_dead_letters.items() if v != self._dead_letters_committed[p]}
        if moved:
            raise CommitConflict(moved)
        ranges = {p: OffsetRange(b.first_offset, b.last_offset) for p, b in taken.items()}
        metadata = {
            "app_id": self._config.app_id,
            "topic": self._topic,
            "offsets": {str(p): [r.first, r.last] for p, r in ranges.items()},
            "rows": sum(b.rows for b in taken.values()),
            "dead_letters": sum(len(b.dead_letters) for b in taken.values()),
        }
        expected = {p: self._committed[p] for p in taken}
        versions = {p: r.last for p, r in ranges.items()}
        started = self._clock()
        if not evolving:
            actions = [action for partition in taken for action in pending.files[partition]]
            version = self._writer.commit(actions, expected, versions, metadata)
            self._commit_seconds = self._clock() - started
            return version
        rows = pa.concat_tables([b.to_table(schema) for b in taken.values()]) if taken else schema.empty_table()
        added = evolve(self._table_schema, schema, inferred=False).added
        metadata["added_columns"] = added
        version = self._writer.commit_evolution(rows, expected, versions, metadata)
        self._commit_seconds = self._clock() - started
        self._metrics.columns_added(self._topic, len(added))
        logger.info("schema evolution committed in version %d: the table schema is now %s", version, schema)
        self._table_schema = self._writer.schema
        self._pipeline.set_schema(self._writer.schema)
        return version

    def _write_files(self, pending: _PendingCommit, schema: pa.Schema, evolving: bool) -> None:
        """Step 1: Parquet files per Kafka partition; rows Parquet refuses become dead letters (stage write).

        An evolution commit writes its files in step 3 (delta-rs does): here its rows are only checked.
        """
        for partition, buffer in pending.buffers.items():
            if partition in pending.files:
                continue
            offsets = OffsetRange(buffer.first_offset, buffer.last_offset)
            while True:
                rows = buffer.to_table(schema)
                try:
                    if evolving:
                        self._writer.check_rows(rows)
                        pending.files[partition] = []
                    else:
                        pending.files[partition] = (
                            self._writer.write_files(self._topic, partition, offsets, rows) if buffer.rows else []
                        )
                    break
                except RowsRejected as rejected:
                    self._reject_rows(partition, buffer, rows, rejected, schema)

    def _reject_rows(
        self, partition: int, buffer: PartitionBuffer, rows: pa.Table, rejected: RowsRejected, schema: pa.Schema
    ) -> None:
        row_offsets = buffer.offsets().to_pylist()
        for index, exc in rejected.failures:
            row = rows.slice(index, 1).to_pylist()[0]
            letter = DeadLetter(
                self._topic,
                partition,
                row_offsets[index],
                WRITE_STAGE,
                str(exc),
                b"",
                payload_json=payload_json(b"", row),
            )
            buffer.dead_letters.append(letter)
            logger.warning("%s: Parquet refused the row: %s", letter.where, exc)
        self._metrics.failed(self._topic, WRITE_STAGE, len(rejected.failures))
        buffer.reject_rows([index for index, _ in rejected.failures], schema)

    def _commit_dead_letters(self, pending: _PendingCommit) -> None:
        """Step 2: the dead letters of the pending partitions, with their own txns, before the main commit."""
        letters = {
            p: b.dead_letters
            for p, b in pending.buffers.items()
            if b.dead_letters and p not in pending.letters_recorded
        }
        if not letters:
            return
        flat = [letter for batch in letters.values() for letter in batch]
        if self._dead_letter_topic is not None and not pending.letters_produced:
            self._dead_letter_topic.produce(flat)  # at least once: before the table commit
            pending.letters_produced = True
        expected = {p: self._dead_letters_committed[p] for p in letters}
        # Normally the batch's last offset; a replay that records inside an older window never lowers it.
        versions = {p: max(pending.buffers[p].last_offset, _or_minus_one(expected[p])) for p in letters}
        # Inside an older window the txn does not move, so it cannot tell whether an ambiguous commit
        # landed: there, the table itself is asked (before, to skip what landed; after, to confirm).
        unmoved = [p for p in letters if versions[p] == expected[p]]
        for partition in unmoved:
            landed = self._recorded_among(partition, letters[partition])
            letters[partition] = [letter for letter in letters[partition] if letter.offset not in landed]
        metadata = {
            "app_id": self._config.app_id,
            "topic": self._topic,
            "offsets": {str(p): [pending.buffers[p].first_offset, pending.buffers[p].last_offset] for p in letters},
            "dead_letters": len(flat),
        }
        self._dead_letters.commit(letters, expected, versions, metadata)
        for partition in unmoved:
            if len(self._recorded_among(partition, letters[partition])) != len(letters[partition]):
                raise RetryableError(f"dead letters of {self._topic}[{partition}] did not land in the commit")
        for partition, version in versions.items():
            self._dead_letters_committed[partition] = version
        pending.letters_recorded.update(letters)
        stages = Counter(letter.stage for letter in flat)
        for stage, count in stages.items():
            self._metrics.dead_lettered(self._topic, stage, count)
        for letter in flat[:_LOGGED_DEAD_LETTERS]:
            logger.warning("dead letter %s stage=%s reason=%s", letter.where, letter.stage, letter.reason)
        if len(flat) > _LOGGED_DEAD_LETTERS:
            logger.warning(
                "… and %d more dead letters in %s (by stage: %s)",
                len(flat) - _LOGGED_DEAD_LETTERS,
                self._dead_letters.uri,
                dict(stages),
            )

    def _recorded_among(self, partition: int, letters: Sequence[DeadLetter]) -> set[int]:
        """The offsets of ``letters`` the dead-letter table holds."""
        if not letters:
            return set()
        offsets = {letter.offset for letter in letters}
        found = self._retrying(
            "reading recorded dead letters",
            partial(self._dead_letters.recorded_offsets, partition, min(offsets) - 1, max(offsets)),
        )
        return offsets & found

    def _check_schema(self) -> None:
        """Raise SchemaChanged when someone else changed the table's schema since the stages were fitted."""
        latest = self._retrying("reading the table schema", self._writer.refresh_schema)
        if not latest.equals(self._table_schema, check_metadata=False):
            raise SchemaChanged(self._writer.uri, latest)

    def _schema_changed(self, changed: SchemaChanged, pending: _PendingCommit) -> None:
        """Another writer changed the schema: drop what was fitted to the old one, refit, replay it."""
        schema = changed.schema
        assert isinstance(schema, pa.Schema)
        logger.warning(
            "the schema of %s changed under us: dropping %d pending messages of partitions %s and replaying them; "
            "new schema: %s",
            self._writer.uri,
            sum(b.messages for b in pending.buffers.values()),
            sorted(pending.buffers),
            schema,
        )
        self._metrics.schema_change(self._topic)
        self._table_schema = schema
        self._pipeline.set_schema(schema)
        for partition in list(pending.buffers):
            pending.drop(partition)
            self._resync(partition)
        # Everything else buffered was fitted to the old schema too.
        for partition in list(self._positions):
            if partition in self._buffers:
                self._resync(partition)

    def _resync(self, partition: int) -> None:
        """Forget what we hold for ``partition`` and fetch again from the main table's txn version + 1."""
        self._buffers.drop(partition)
        self._resynced.add(partition)
        if partition not in self._positions:
            return
        main, recorded = self._read_offsets([partition])
        committed = main[partition]
        self._committed[partition] = committed
        self._positions[partition] = committed
        if recorded.get(partition):
            self._recorded[partition] = recorded[partition]
        else:
            self._recorded.pop(partition, None)
        reset = LogicalOffset(self._config.kafka.auto_offset_reset)
        target = reset if committed is None else committed + 1
        if self._in_rebalance:
            # Inside a rebalance callback, consume() may already hold fresh messages fetched after a seek
            # made here, indistinguishable from stale ones: seek once it has returned (see _accept).
            self._deferred_seeks[partition] = target
        else:
            self._source.seek(partition, target)

    def _read_offsets(self, partitions: list[int]) -> tuple[dict[int, int | None], dict[int, set[int]]]:
        """The main txn versions of ``partitions``, and per partition the offsets after it that the
        dead-letter table already holds (non-empty only after a crash between the two commits)."""
        main = self._retrying("reading txn versions", lambda: self._writer.committed_offsets(partitions))
        letters = self._retrying(
            "reading dead-letter txn versions", lambda: self._dead_letters.committed_offsets(partitions)
        )
        recorded: dict[int, set[int]] = {}
        for partition in partitions:
            self._dead_letters_committed[partition] = letters[partition]
            last_letter, committed = letters[partition], main[partition]
            if last_letter is not None and (committed is None or last_letter > committed):
                recorded[partition] = self._retrying(
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
        return main, recorded

    def _backoff(self, attempt: int, what: str, exc: Exception) -> None:
        limit = self._config.ingest.max_commit_retries
        self._metrics.storage_retry()
        if what not in _NOT_TABLE_OPERATIONS:
            self._board.table_unreachable(f"{what}: {exc}")
        self._board.loop_turned()  # waiting on purpose is alive; /readyz tells the table is not reachable
        if attempt > limit:
            raise FatalError(f"{what} still failing after {limit} retries: {exc}") from exc
        delay = min(_MAX_BACKOFF_S, 0.5 * 2 ** (attempt - 1))
        logger.warning("%s failed (attempt %d of %d), retrying in %.1f s: %s", what, attempt, limit, delay, exc)
        self._sleep(delay)

    def _retrying(self, what: str, operation: Callable[[], T]) -> T:
        attempt = 0
        while True:
            try:
                result = operation()
            except RetryableError as exc:
                attempt += 1
                self._backoff(attempt, what, exc)
            else:
                if attempt and what not in _NOT_TABLE_OPERATIONS:
                    self._board.table_reachable()
                return result

    # --- rebalance listener (called inside consume) --------------------------------------

    def assigned(self, partitions: list[int]) -> dict[int, int | LogicalOffset]:
        self._metrics.rebalance("assigned", len(partitions))
        faults.point("in_assign")
        # Retry here: if this callback failed, the client would assign without our offsets.
        committed, recorded = self._read_offsets(partitions)
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
            if recorded.get(partition):
                self._recorded[partition] = recorded[partition]
            self._targets.setdefault(partition, high)
            self._highs[partition] = high
            starts[partition] = decision.offset
        self._metrics.assigned(len(self._positions))
        self._lags()
        return starts

    def revoked(self, partitions: list[int]) -> None:
        self._metrics.rebalance("revoked", len(partitions))
        owned = {p for p in partitions if p in self._positions}
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
            self._dead_letters_committed.pop(partition, None)
            self._positions.pop(partition, None)
            self._recorded.pop(partition, None)
            self._highs.pop(partition, None)
        self._metrics.assigned(len(self._positions))
        self._metrics.unassigned(self._topic, partitions)
        self._lags()

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

    def _lags(self) -> dict[int, int]:
        """Lag per assigned partition from the consumer's cached high watermarks (no broker round trip);
        also updates the lag gauges and what the status page shows. Called after commits, rebalances and
        with each progress line."""
        lags: dict[int, int] = {}
        for partition, committed in sorted(self._committed.items()):
            try:
                _, high = self._source.watermarks(partition, cached=True)
            except RetryableError:
                high = -1  # no fetch response yet
            if high >= 0:
                self._highs[partition] = high
            known = self._highs.get(partition)
            if known is None:
                continue
            # A cached watermark may trail what we already took: never a negative lag.
            lags[partition] = max(0, known - (committed + 1 if committed is not None else 0))
            self._metrics.lag(self._topic, partition, lags[partition])
        full = self._config.ingest.max_messages_per_file
        buffered = {p: full - self._buffers.room(p) for p in self._committed if p in self._buffers}
        self._board.partitions(self._committed, self._highs, buffered, self._buffers.buffered_bytes)
        return lags

    def _status_line(self) -> str:
        lags = [f"{partition}:{lag}" for partition, lag in self._lags().items()]
        return (
            f"{self._progress.rate():.0f} msg/s, {self._progress.messages} messages, {self._progress.rows} rows in "
            f"{self._progress.commits} commits, {self._progress.dead_letters} dead letters, "
            f"{self._progress.filtered} filtered, {self._progress.unknown_fields} unknown field values dropped, "
            f"table version {self._writer.version}, buffered {self._buffers.buffered_messages}, "
            f"lag {{{', '.join(lags)}}}"
        )


def _or_minus_one(version: int | None) -> int:
    return -1 if version is None else version


@dataclass
class _PendingCommit:
    """One flush's work, kept across retries so no file is written and no dead letter recorded twice."""

    buffers: dict[int, PartitionBuffer]
    files: dict[int, list[AddAction]] = field(default_factory=dict)
    letters_recorded: set[int] = field(default_factory=set)
    letters_produced: bool = False
    schema_checked: bool = False

    def drop(self, partition: int) -> PartitionBuffer | None:
        self.files.pop(partition, None)
        self.letters_recorded.discard(partition)
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
        self.dead_letters = 0
        self.filtered = 0
        self.unknown_fields = 0

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
