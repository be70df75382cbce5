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

Steps 1-3 are :class:`kafka2delta.committer.Committer`'s, one committer per table
(:mod:`kafka2delta.tables`; each topic partition goes to one table, :mod:`kafka2delta.routing`): a flush
commits its tables one after the other, then the group offsets of every partition it committed. What is
said about a commit afterwards (metrics, status page, log lines) is :class:`kafka2delta.progress.Progress`'s.
A commit conflict (another writer moved a partition's txn) drops that partition's data and seeks to the table's
version + 1; a schema change made by someone else drops every pending partition's data, refits the
stages to the new schema and replays. A transient storage error retries with backoff, offsets held.
The loop sees Kafka and Delta only through the Protocols of :mod:`kafka2delta.edges`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from functools import partial

from kafka2delta import faults
from kafka2delta.assignment import PartitionState
from kafka2delta.committer import PendingCommit
from kafka2delta.config import Config
from kafka2delta.edges import DeadLetterProducer, DeadLetterStore, Source
from kafka2delta.errors import CommitConflict, RetryableError, RowGroupRefused, SchemaChanged, TableNotCreated
from kafka2delta.logs import Redactor
from kafka2delta.metrics import Metrics
from kafka2delta.offsets import LogicalOffset, first_offset, start_position
from kafka2delta.positions import Positions
from kafka2delta.progress import Progress
from kafka2delta.records import ConsumedBatch, PartitionMessages, ProcessedPartition, TopicPartition
from kafka2delta.retries import Retrier
from kafka2delta.routing import Routes
from kafka2delta.splitting import after, empty_outcome, merged, split
from kafka2delta.status import Status, StatusBoard, liveness_window_s
from kafka2delta.tables import DeadLetterOpener, RouterOpener, TableOpener, Tables, TableSink, TopicTables
from kafka2delta.turns import IngestTurns
from kafka2delta.value_buffers import FlushLimits, PartitionBuffer, ValueBuffers

logger = logging.getLogger(__name__)

_KAFKA_MAX_POLL_INTERVAL_MS = 300_000  # librdkafka's default max.poll.interval.ms


class Ingestor:
    """Runs the loop for the subscribed topics into their tables; also the source's rebalance listener."""

    def __init__(
        self,
        config: Config,
        *,
        source: Source,
        tables: TableOpener,
        dead_letters: DeadLetterStore,
        metrics: Metrics,
        routes: Routes | None = None,
        dead_letter_topic: DeadLetterProducer | None = None,
        router: RouterOpener | None = None,
        dead_letter_opener: DeadLetterOpener | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        wall_clock: Callable[[], float] = time.time,
        redact: Callable[[str], str] | None = None,
    ) -> None:
        if config.routing.expression and router is None:
            raise ValueError("[routing] expression is set: the Ingestor needs its router")
        self._config = config
        self._source = source
        self._metrics = metrics
        self._clock = clock
        self._sleep = sleep
        ingest = config.ingest
        self._buffers = ValueBuffers(
            FlushLimits(
                allowed_latency_s=ingest.allowed_latency_s,
                max_messages_per_file=ingest.max_messages_per_file,
                min_bytes_per_file=ingest.min_bytes_per_file,
                max_buffered_bytes=ingest.max_buffered_bytes,
            )
        )
        # One state per assigned partition: created in assigned(), dropped in _forget(), nowhere else.
        self._partitions: dict[TopicPartition, PartitionState] = {}
        # Scoped to one consume call, by topic partition (kafka2delta.assignment says why not per state):
        # partitions re-positioned since it began (the messages it returns for them are stale), and the
        # seeks decided inside its rebalance callbacks (made once it returns).
        self._resynced: set[TopicPartition] = set()
        self._resynced_in_flush: set[TopicPartition] = set()
        """Partitions resynced by a commit of the flush under way: its later tables must not commit them."""
        self._deferred_seeks: dict[TopicPartition, int | LogicalOffset] = {}
        # For --until-caught-up, kept across re-assignments: the high watermark when a partition was first
        # assigned, and the end-of-partition events seen.
        self._targets: dict[TopicPartition, int] = {}
        self._reached: dict[TopicPartition, int] = {}
        self._in_rebalance = False
        self._stop_requested: str | None = None  # what asked for the stop (a signal's name), once one did
        self._failed = False
        # What /healthz, /readyz and the status page show: written here, read by the HTTP threads.
        self._board = StatusBoard(
            ", ".join(config.kafka.subscription()),
            config.table.app_id or config.kafka.topic,
            config.kafka.group_id,
            config.table.uri or "(routes)",
            dead_letters.uri,
            liveness_window_s(ingest.allowed_latency_s, config.kafka.consume_timeout_s),
            clock=clock,
            wall_clock=wall_clock,
            redact=redact if redact is not None else Redactor(config.secret_values()),  # cli.py gives the logs'
        )
        self._board.table_reachable()
        self._retrier = Retrier(
            max_retries=ingest.max_commit_retries,
            retry_after_stop_s=ingest.retry_after_stop_s,
            metrics=metrics,
            board=self._board,
            sleep=sleep,
            clock=clock,
        )
        self._tables = Tables(
            routes=routes if routes is not None else Routes(config),
            opener=tables,
            dead_letters=dead_letters,
            dead_letter_topic=dead_letter_topic,
            metrics=metrics,
            retrier=self._retrier,
            board=self._board,
            clock=clock,
            ingest=ingest,
            router=router,
            dead_letter_opener=dead_letter_opener,
        )
        # Waiting for a coordinator turn does not poll Kafka: give the flush up well before the group evicts us.
        max_poll_ms = float(config.kafka.settings.get("max.poll.interval.ms", _KAFKA_MAX_POLL_INTERVAL_MS))
        self._turns = IngestTurns(
            retrier=self._retrier,
            metrics=metrics,
            board=self._board,
            max_wait_s=max_poll_ms / 1000 / 2,
            idle_interval_s=ingest.allowed_latency_s,
            stopping=self.stopping,
            clock=clock,
            sleep=sleep,
        )
        self._positions = Positions(
            tables=self._tables,
            retrier=self._retrier,
            auto_offset_reset=config.kafka.auto_offset_reset,
        )
        self._progress = Progress(
            metrics=metrics,
            board=self._board,
            clock=clock,
            wall_clock=wall_clock,
            interval_s=ingest.progress_interval_s,
            max_messages_per_file=ingest.max_messages_per_file,
            table_commits_per_s=ingest.table_commits_per_s,
        )

    # --- the loop -----------------------------------------------------------------------

    def request_stop(self, by: str = "a stop request") -> None:
        """Stop fetching; the loop flushes, commits and returns (SIGTERM/SIGINT). Safe in a signal handler: it
        only sets fields (the stop, and the retrier's deadline from the clock's reading, which takes no lock).
        The handler interrupts the loop wherever it is, perhaps inside the status board's lock or halfway through
        writing a log line; taking that lock again would hang, and logging again raises ("reentrant call"), losing
        the stop. The loop says it and updates the board once it sees the field."""
        self._retrier.stop_requested()
        self._stop_requested = by

    def stopping(self) -> bool:
        return self._stop_requested is not None

    def _say_stopping(self) -> None:
        logger.info("received %s: flushing, committing and stopping", self._stop_requested)
        self._board.set_state("stopping")

    def status(self) -> Status:
        """A snapshot for the HTTP endpoints; thread-safe (the loop publishes, this only reads)."""
        return self._board.snapshot()

    def run(self, until_caught_up: bool = False) -> None:
        self._board.set_state("running")
        self._source.start(self)
        try:
            while self._stop_requested is None:
                self._board.loop_turned()
                batch = self._consume()
                self._accept(batch)
                due = self._buffers.due(self._clock())
                if due:
                    self._flush(due.reasons)
                elif not self._buffers:
                    self._turns.idle(self._tables)
                    self._positions.write_unmade_marks(self._partitions, now=self._clock(), at_once=False)
                if until_caught_up and self._caught_up():
                    self._flush("caught_up")  # no need to wait for the latency limit
                    if self._caught_up():  # a conflict in that flush would have moved us back
                        logger.info("caught up with the high watermarks seen at start: %s", _by_name(self._targets))
                        break
                self._progress.maybe_log(self._progress_line)
                for uri in self._tables.close_unused(self._partitions):
                    self._buffers.set_latency(uri, 0.0)  # a reopened table starts from allowed_latency_s again
            if self._stop_requested is not None:
                self._say_stopping()
            self._flush("shutdown")
            self._positions.write_unmade_marks(self._partitions, now=self._clock(), at_once=True)
        except BaseException as exc:
            self._failed = True  # closing must not commit from a broken state
            self._board.set_state("failed", f"{type(exc).__name__}: {exc}")
            raise
        finally:
            logger.info("stopping: %s", self._progress_line())
            self._source.close()
            self._tables.close()
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

        def consume() -> ConsumedBatch:
            # A stop during the retries of a failing consume: the loop ends at its next check, and the retry
            # time after the stop is left to the shutdown flush's commit.
            return ConsumedBatch() if self._stop_requested is not None else self._source.consume(size, timeout)

        return self._retrier.run("consume", consume)

    def _accept(self, batch: ConsumedBatch) -> None:
        # Resyncs made by a rebalance callback during that consume(): this batch's messages of those
        # partitions were fetched before the seek (they are in _resynced and skipped below).
        for tp, target in self._deferred_seeks.items():
            if tp in self._partitions:
                self._source.seek(tp, target)
        self._deferred_seeks.clear()
        for tp in batch.out_of_range:
            self._offset_out_of_range(tp)
        now = self._clock()
        for tp, messages in batch.partitions.items():
            state = self._partitions.get(tp)
            if state is None or tp in self._resynced:
                continue  # fetched before a revoke, or before a seek: not to be taken
            fresh = self._drop_taken(messages, state.position)
            self._metrics.consumed(tp.topic, tp.partition, len(fresh))
            # A file closes at exactly max_messages_per_file: cut the batch where the buffer fills.
            # A flush that resyncs this partition makes the rest of its messages stale: stop there.
            while len(fresh) and tp not in self._resynced:
                room = self._buffers.room(tp)
                piece, fresh = (fresh, fresh.select([])) if len(fresh) <= room else fresh.split(room)
                outcomes = self._process(piece, state)
                try:
                    for uri, processed in outcomes.items():
                        self._metrics.skipped(tp.topic, tp.partition, "empty", processed.skipped_empty)
                        self._metrics.skipped(tp.topic, tp.partition, "filtered", processed.skipped_filtered)
                        self._metrics.unknown_fields(tp.topic, processed.unknown_fields)
                        row_groups = self._tables[uri].row_groups(self._config.ingest)
                        self._buffers.add(processed, len(piece), now, uri, row_groups)
                except RowGroupRefused as refused:
                    self._row_group_refused(refused)
                    break
                state.position = piece.offsets[-1]
                self._progress.taken(len(piece))
                if self._buffers.room(tp) == 0:
                    self._flush(dict.fromkeys(self._buffers.tables_of(tp), "records"))
                    now = self._clock()
        # A partition resynced meanwhile reads again from before the end this batch reached.
        self._reached.update({tp: end for tp, end in batch.end_offsets.items() if tp not in self._resynced})
        self._metrics.buffered(self._buffers.buffered_messages, self._buffers.buffered_bytes)

    def _drop_taken(self, messages: PartitionMessages, position: int | None) -> PartitionMessages:
        """Drop offsets already committed or buffered (a replayed fetch, a seek back)."""
        if position is None or messages.offsets[0] > position:
            return messages
        keep = [i for i, offset in enumerate(messages.offsets) if offset > position]
        self._metrics.skipped(messages.topic, messages.partition, "duplicate", len(messages) - len(keep))
        return messages.select(keep)

    def _process(self, piece: PartitionMessages, state: PartitionState) -> dict[str, ProcessedPartition]:
        """What ``piece`` gives each of the partition's tables (by URI; every table gets an outcome, maybe
        empty, so every table's txn moves on), less what a table already holds. Messages that are dead letters
        already (recorded by a dead-letter commit whose table commit a crash lost) are final: they only
        advance the txns."""
        tables = self._tables.for_topic(piece.topic)
        recorded = state.recorded_dead_letters
        todo = piece
        if recorded:
            todo = piece.select([i for i, offset in enumerate(piece.offsets) if offset not in recorded])
            counted = sum(1 for offset in piece.offsets if offset in recorded and offset in state.counted_dead_letters)
            self._metrics.skipped(
                piece.topic, piece.partition, "dead_letter_recorded", len(piece) - len(todo) - counted
            )
        outcomes: dict[str, ProcessedPartition] = {}
        if len(todo):
            outcomes = (
                self._route(todo, tables) if tables.router else {tables.home.spec.uri: self._run(tables.home, todo)}
            )
            self._progress.processed(piece.topic, outcomes.values(), len(todo))
        result = {}
        for uri in state.tables:
            held = state.holds(uri)
            if held is not None and held >= piece.offsets[-1]:
                # The table holds every offset of the piece already (a replay from a lower table's version
                # after a crash between their commits): no lane, so its txn can never be moved back.
                continue
            outcome = outcomes.get(uri) or empty_outcome(piece, self._tables[uri].pipeline.schema)
            outcome.first_offset, outcome.last_offset = piece.offsets[0], piece.offsets[-1]
            result[uri] = after(outcome, state.holds(uri))
        return result

    def _run(self, table: TableSink, messages: PartitionMessages) -> ProcessedPartition:
        return self._retrier.run("processing", partial(table.pipeline.process, messages))

    def _route(self, messages: PartitionMessages, tables: TopicTables) -> dict[str, ProcessedPartition]:
        """``[routing] expression``: split the messages by route, then run each table's pipeline on its share;
        the router's dead letters and skips go with the home table's outcome."""
        assert tables.router is not None
        routes = {name: sink.spec.uri for name, sink in tables.by_route.items()}
        parts = self._retrier.run("routing", partial(split, messages, tables.router, routes))
        outcomes = {uri: self._run(self._tables[uri], share) for uri, share in parts.messages.items()}
        home = tables.home.spec.uri
        outcomes[home] = merged(
            outcomes.get(home) or empty_outcome(messages, tables.home.pipeline.schema), parts.routed
        )
        return outcomes

    def _caught_up(self) -> bool:
        """Every assigned partition has been taken up to the high watermark it had when first assigned."""
        if not self._partitions:
            return False
        for tp, state in self._partitions.items():
            target = self._targets[tp]
            taken = state.position is not None and state.position + 1 >= target
            if not taken and self._reached.get(tp, -1) < target:
                return False
        return True

    # --- flush: each table in its turn ------------------------------------------------------

    def _flush(self, reasons: str | Mapping[str, str], partitions: set[TopicPartition] | None = None) -> None:
        """Commit the buffers of the tables ``reasons`` names, each for its reason (a table committed first with them:
        the first one's), or of ``partitions`` (None: all), table by table; then record the Kafka group offsets of
        what every table of a partition has committed (for lag tools only)."""
        tables: frozenset[str] | None = None
        if not isinstance(reasons, str):
            tables = frozenset(reasons) | self._first_commits(frozenset(reasons))
            reasons = {uri: reasons.get(uri, next(iter(reasons.values()))) for uri in tables}
        taken = self._buffers.take(tables, partitions)
        # A table's first commit for a partition goes first: after a crash between the commits, a table
        # holding nothing of a partition then means a route added since, never rows lost (DESIGN.md).
        order = sorted(
            taken, key=lambda uri: (not any(self._partitions[tp].tables[uri] is None for tp in taken[uri]), uri)
        )
        committed: set[TopicPartition] = set()
        # Not _resynced, which may already hold the partition (an out-of-range seek in the same turn): only a
        # resync by this flush's own commits says its positions were read again.
        self._resynced_in_flush = set()
        for tp in self._positions.mark_first_commits(order, taken, self._partitions):
            self._resync(tp)  # no mark, no crash-safe commit: read again (its buffers taken are dropped below)
        for index, uri in enumerate(order):
            if index:
                faults.point("between_table_commits")
            # A partition resynced by an earlier table's commit (a conflict, no turn) is read again from its
            # tables' lowest version: its other tables must not commit past that either.
            dropped = self._resynced_in_flush
            buffers = {tp: buffer for tp, buffer in taken[uri].items() if tp not in dropped}
            if buffers:
                reason = reasons if isinstance(reasons, str) else reasons[uri]
                committed |= self._flush_table(reason, self._tables[uri], buffers)
        self._positions.settle_marks(order, taken, self._partitions, self._resynced_in_flush)
        offsets = {tp: self._partitions[tp].committed for tp in committed if tp in self._partitions}
        if any(offset is not None for offset in offsets.values()):
            faults.point("before_kafka_commit")
            self._source.commit_group_offsets({tp: last + 1 for tp, last in offsets.items() if last is not None})
            faults.point("after_kafka_commit")
        if taken:
            self._metrics.buffered(self._buffers.buffered_messages, self._buffers.buffered_bytes)
            self._publish_partitions()

    def _first_commits(self, tables: frozenset[str]) -> set[str]:
        """The other tables of the partitions ``tables`` will commit that hold nothing of them yet."""
        extra: set[str] = set()
        for tp in self._buffers.partitions():
            lanes = self._buffers.tables_of(tp)
            if lanes & tables:
                extra |= {uri for uri in lanes if self._partitions[tp].tables.get(uri, 0) is None}
        return extra - tables

    def _flush_table(
        self, reason: str, table: TableSink, buffers: dict[TopicPartition, PartitionBuffer]
    ) -> set[TopicPartition]:
        """One table's commit, inside its coordinator's ``ingest`` turn when it joins one (:mod:`kafka2delta.turns`)."""
        if table.coordinator is None:
            return self._commit_table(reason, table, buffers)
        turn = self._turns.wait(reason, table)
        if turn is None:
            self._give_up_flush(reason, table, buffers)
            return set()
        with turn:
            committed = self._commit_table(reason, table, buffers)
        self._turns.committed(table)
        return committed

    def _give_up_flush(self, reason: str, table: TableSink, buffers: dict[TopicPartition, PartitionBuffer]) -> None:
        """No turn: commit nothing. Each partition goes back to its committed offset (a revoked one is replayed
        by its next owner), so no later commit can skip these messages."""
        logger.warning(
            "coordinator: no ingest turn for the %s flush (%s); %d buffered messages of %s not committed, "
            "they will be read again from the committed offsets",
            reason,
            table.coordinator.last_skip if table.coordinator else "",
            sum(buffer.messages for buffer in buffers.values()),
            ", ".join(str(tp) for tp in buffers),
        )
        for tp in buffers:
            self._resync(tp)

    def _pace(self, table: TableSink, version: int) -> None:
        """After a commit: how long the table's buffers may wait now (longer when its writers share a budget)."""
        before = table.pacer.interval_s
        interval = table.pacer.committed(version, self._clock())
        self._buffers.set_latency(table.spec.uri, interval)
        self._progress.paced(table.name, writers=table.pacer.writers, interval_s=interval, before_s=before)

    # --- flush: write, commit, record (one table) --------------------------------------------

    def _commit_table(
        self, reason: str, table: TableSink, buffers: dict[TopicPartition, PartitionBuffer]
    ) -> set[TopicPartition]:
        """Commit ``buffers`` to ``table``, then record the commit; the partitions committed."""
        pending = PendingCommit(buffers)
        started = self._clock()
        version = self._commit(reason, table, pending)
        if version is None:
            if pending.buffers:  # the table could not be made yet: its dead letters alone were committed
                self._positions.mark_unmade(table.spec.uri, pending.buffers, self._partitions, now=self._clock())
                for tp in pending.buffers:
                    self._partitions[tp].forget_covered_dead_letters()
            return set()  # every partition was dropped (conflicts), or nothing could be committed yet
        taken = pending.buffers
        for tp, buffer in taken.items():
            state = self._partitions[tp]
            before = state.tables[table.spec.uri]
            state.tables[table.spec.uri] = max(buffer.last_offset, before if before is not None else -1)
            state.forget_covered_dead_letters()
        faults.point("after_delta_commit")
        self._pace(table, version)
        self._progress.committed(
            table=table.name,
            reason=reason,
            version=version,
            taken=taken,
            files=pending.actions(),
            dead_letters=pending.recorded_letters(),
            flush_seconds=self._clock() - started,
            commit_seconds=table.committer.commit_seconds,
        )
        return set(taken)

    def _commit(self, reason: str, table: TableSink, pending: PendingCommit) -> int | None:
        """The committer's steps 1-3, until they land or nothing is left to commit: a conflicting partition is
        dropped and resynced, a schema change refits the stages and replays, a storage error backs off."""
        attempt = 0
        while pending.buffers:
            try:
                return table.committer.commit(pending, self._partitions)
            except CommitConflict as conflict:
                for tp, in_log in conflict.partitions.items():
                    dropped = pending.drop(tp)
                    self._metrics.commit_conflict(tp, table.name)
                    logger.warning(
                        "%s: another writer committed up to offset %s; dropping our %d messages and resyncing",
                        tp,
                        in_log,
                        dropped.messages if dropped else 0,
                    )
                    self._resync(tp)
            except RowGroupRefused as refused:
                self._row_group_refused(refused, pending)
            except SchemaChanged as changed:
                self._schema_changed(changed, table, pending)
            except TableNotCreated as exc:
                # No row yet to create the table from: its dead letters are recorded; the partitions' offsets are
                # marked (Positions.mark_unmade), then committed with their first rows (a crash replays from the mark).
                logger.debug("%s", exc)
                return None
            except RetryableError as exc:
                attempt += 1
                self._metrics.commit_retry(table.name)
                self._retrier.backoff(attempt, f"commit ({reason})", exc)
        return None

    def _schema_changed(self, changed: SchemaChanged, table: TableSink, pending: PendingCommit) -> None:
        """Another writer changed the schema: drop what was fitted to the old one, refit, replay it."""
        schema = changed.schema
        logger.warning(
            "the schema of %s changed under us: dropping %d pending messages of partitions %s and replaying them; "
            "new schema: %s",
            table.writer.uri,
            sum(b.messages for b in pending.buffers.values()),
            ", ".join(str(tp) for tp in sorted(pending.buffers)),
            schema,
        )
        self._metrics.schema_change(table.name)
        table.committer.adopt_schema(schema)
        for tp in list(pending.buffers):
            pending.drop(tp)
            self._resync(tp)
        # Everything else buffered for this table was fitted to the old schema too.
        for tp in self._buffers.partitions():
            if table.spec.uri in self._buffers.tables_of(tp):
                self._resync(tp)

    def _row_group_refused(self, refused: RowGroupRefused, pending: PendingCommit | None = None) -> None:
        """Parquet refused a row group encoded while buffered: the lane's encoded rows went with the writer."""
        assert refused.tp is not None
        if pending is not None:
            pending.drop(refused.tp)
        logger.warning("%s; reading the partition again, its rows kept as Arrow until their commit", refused)
        self._buffers.keep_plain(refused.tp, refused.table)
        self._resync(refused.tp)

    # --- positions --------------------------------------------------------------------------

    def _resync(self, tp: TopicPartition) -> None:
        """Forget what we hold for ``tp`` and fetch again from its tables' lowest txn version + 1."""
        self._buffers.drop(tp)
        self._resynced.add(tp)
        self._resynced_in_flush.add(tp)
        self._reached.pop(tp, None)  # the end it reached is ahead of where it reads again
        state = self._partitions.get(tp)
        if state is None:
            return
        versions, letters, recorded, marks = self._positions.read(list(state.tables), [tp])
        state.tables = versions[tp]
        state.start_marks = marks.get(tp, {})
        state.position = state.committed
        state.dead_letters_committed = letters[tp]
        state.recorded_dead_letters = recorded.get(tp, set())
        reset = LogicalOffset(self._config.kafka.auto_offset_reset)
        # Nothing held: from where reading began ("latest" now would skip what was taken since: found by review).
        start = state.start if reset is LogicalOffset.LATEST else reset
        target = start if state.committed is None else state.committed + 1
        if self._in_rebalance:
            # Inside a rebalance callback, consume() may already hold fresh messages fetched after a seek
            # made here, indistinguishable from stale ones: seek once it has returned (see _accept).
            self._deferred_seeks[tp] = target
        else:
            self._source.seek(tp, target)

    def _offset_out_of_range(self, tp: TopicPartition) -> None:
        """The broker deleted the offset we were fetching (retention) while we ran."""
        state = self._partitions.get(tp)
        if state is None:
            return
        low, high = self._retrier.run("watermarks", lambda: self._source.watermarks(tp))
        # Nothing taken yet, from latest: the start given at the assignment (the end read then, an offset), which the
        # broker may have lost since (found by review: taken for "latest" again, not counted).
        given = state.position is None and self._config.kafka.auto_offset_reset == "latest"
        decision = start_position(
            state.start - 1 if given else state.position,
            low,
            high,
            self._config.kafka.auto_offset_reset,
            self._config.kafka.missing_offset_policy,
            str(tp),
        )
        if decision.out_of_range:
            self._metrics.offset_out_of_range(tp.topic, tp.partition)
            logger.error("%s", decision.reason)
        else:  # a report older than a seek since, or from earliest (found by review: logged as an error, counted)
            start = first_offset(decision.offset, low, high)
            logger.info("%s: reported out of range, but %d is in [%d, %d] now: reading on", tp, start, low, high)
        if isinstance(decision.offset, int):
            state.position = decision.offset - 1
        state.start = first_offset(decision.offset, low, high)
        self._resynced.add(tp)
        self._source.seek(tp, decision.offset)

    # --- rebalance listener (called inside consume) --------------------------------------

    def assigned(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int | LogicalOffset]:
        self._metrics.rebalance("assigned", len(partitions))
        self._board.joined_group()
        faults.point("in_assign")
        # Retry here: if this callback failed, the client would assign without our offsets.
        by_topic: dict[str, list[TopicPartition]] = {}
        for tp in sorted(partitions):
            by_topic.setdefault(tp.topic, []).append(tp)
        starts: dict[TopicPartition, int | LogicalOffset] = {}
        for topic, tps in by_topic.items():
            tables = self._tables.for_topic(topic)
            versions, letters, recorded, marks = self._positions.read(tables.uris, tps)
            watermarks = {tp: self._retrier.run("watermarks", partial(self._source.watermarks, tp)) for tp in tps}
            if len(tables.uris) > 1:
                self._positions.mark_starts(tables, versions, marks, watermarks)
            for tp in tps:
                state = PartitionState(
                    tp=tp,
                    home=tables.home.spec.uri,
                    tables=versions[tp],
                    dead_letters_committed=letters[tp],
                    position=None,
                    high_watermark=-1,
                    recorded_dead_letters=recorded.get(tp, set()),
                    start_marks=marks.get(tp, {}),
                )
                low, high = watermarks[tp]
                decision = start_position(
                    state.committed,
                    low,
                    high,
                    self._config.kafka.auto_offset_reset,
                    self._config.kafka.missing_offset_policy,
                    str(tp),
                )
                if decision.out_of_range:
                    self._metrics.offset_out_of_range(tp.topic, tp.partition)
                    logger.error("%s", decision.reason)
                else:
                    logger.info(
                        "assigned %s → %s: starting at %s (%s)",
                        tp,
                        ", ".join(self._tables[uri].name for uri in tables.uris),
                        decision.offset.value if isinstance(decision.offset, LogicalOffset) else decision.offset,
                        decision.reason,
                    )
                state.position = decision.offset - 1 if isinstance(decision.offset, int) else None
                state.high_watermark = high
                state.start = first_offset(decision.offset, low, high)
                self._partitions[tp] = state
                self._targets.setdefault(tp, high)
                # Latest as the end read here, where the marks and the lag count from, not the broker's at its first
                # fetch (found by review: messages in between went to some tables only, by a replay).
                starts[tp] = state.start if decision.offset is LogicalOffset.LATEST else decision.offset
        self._metrics.assigned(len(self._partitions))
        self._publish_partitions()
        return starts

    def revoked(self, partitions: list[TopicPartition]) -> None:
        self._metrics.rebalance("revoked", len(partitions))
        owned = {tp for tp in partitions if tp in self._partitions}
        faults.point("in_revoke")
        if owned and not self._failed:
            logger.info("revoked %s: committing what is buffered for them", ", ".join(str(tp) for tp in sorted(owned)))
            self._in_rebalance = True
            try:
                self._flush("revoke", partitions=owned)
                self._positions.write_unmade_marks(self._partitions, now=self._clock(), at_once=True)
            finally:
                self._in_rebalance = False
        self._forget(owned)

    def lost(self, partitions: list[TopicPartition]) -> None:
        self._metrics.rebalance("lost", len(partitions))
        self._board.left_group()
        owned = {tp for tp in partitions if tp in self._partitions}
        for tp in owned:
            dropped = self._buffers.drop(tp)
            logger.warning(
                "lost %s without notice: dropping %d buffered messages (the next owner replays them from the log)",
                tp,
                max((buffer.messages for buffer in dropped), default=0),
            )
        self._forget(owned)

    def _forget(self, partitions: set[TopicPartition]) -> None:
        for tp in partitions:
            self._buffers.drop(tp)
            self._partitions.pop(tp, None)
        self._metrics.assigned(len(self._partitions))
        self._metrics.unassigned(partitions)
        self._publish_partitions()

    # --- what the daemon shows ----------------------------------------------------------------

    def _publish_partitions(self) -> dict[TopicPartition, int]:
        """Refresh each partition's high watermark from the consumer's cache (no broker round trip), then
        the lag gauges and the status page; return the lags."""
        for tp, state in self._partitions.items():
            try:
                _, high = self._source.watermarks(tp, cached=True)
            except RetryableError:
                high = -1  # no fetch response yet
            if high >= 0:
                state.high_watermark = high
        names = {tp: self._tables[state.home].name for tp, state in self._partitions.items()}
        return self._progress.publish_partitions(self._partitions, self._buffers, names)

    def _progress_line(self) -> str:
        return self._progress.line(self._publish_partitions(), self._buffers.buffered_messages)


def _by_name(values: dict[TopicPartition, int]) -> dict[str, int]:
    return {str(tp): value for tp, value in sorted(values.items())}
