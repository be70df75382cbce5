"""Steps 1-3 of the commit order for one table, what a flush does between taking the buffers and the
Kafka group offsets:

1. Parquet files per Kafka partition (rows Parquet refuses become dead letters, stage ``write``);
2. the dead letters, with their own txns, in the dead-letter table (and the optional topic);
3. ONE Delta commit holding the files and a txn per partition (with the new schema when the pipeline
   added columns, ``schema_evolution = "merge"``).

A :class:`PendingCommit` remembers what an attempt already did, so a retry never writes a file or
records a dead letter twice. The outcome of a failed attempt is an exception the loop handles:
:class:`CommitConflict` (another writer moved a txn), :class:`SchemaChanged` (another writer changed
the schema) or :class:`RetryableError` (nothing happened, or the log says so).

Dead letters are counted (``messages_dead_lettered_total``) once the main commit covering them lands, not when
their own commit does: a partition dropped after it (a conflict, a schema change) is read again, and the replay
takes its recorded letters as final and counts them as skips (``dead_letter_recorded``). Letters another process
recorded first (a zombie, inside an older window) are not recorded again, and are counted as such skips too.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cache, partial
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from kafka2delta import faults
from kafka2delta.assignment import PartitionState
from kafka2delta.changes import ChangeOptions, last_changes, last_changes_of
from kafka2delta.edges import DeadLetterProducer, DeadLetterStore, TableWriter
from kafka2delta.errors import CommitConflict, RetryableError, RowsRejected, SchemaChanged, TableNotCreated
from kafka2delta.metrics import Metrics
from kafka2delta.pipeline import Pipeline
from kafka2delta.records import DeadLetter, OffsetRange, TopicPartition, payload_json
from kafka2delta.retries import Retrier
from kafka2delta.schema import evolve
from kafka2delta.value_buffers import PartitionBuffer

if TYPE_CHECKING:
    from deltalake.transaction import AddAction

logger = logging.getLogger(__name__)

_LOGGED_DEAD_LETTERS = 10  # per commit; the rest are in the dead-letter table and the metrics


@dataclass
class PendingCommit:
    """One flush's work, kept across retries so no file is written and no dead letter recorded twice."""

    buffers: dict[TopicPartition, PartitionBuffer]
    files: dict[TopicPartition, list[AddAction]] = field(default_factory=dict)
    letters: dict[TopicPartition, list[DeadLetter]] = field(default_factory=dict)
    """By partition, the dead letters this flush recorded (a partition is here once its dead-letter commit landed)."""
    letters_found: dict[TopicPartition, list[DeadLetter]] = field(default_factory=dict)
    """By partition, the dead letters found recorded already by another writer (a zombie), not recorded again."""
    letters_sent: dict[TopicPartition, set[int]] = field(default_factory=dict)
    """The offsets of the letters a failed attempt sent to the dead-letter table (it may have landed)."""
    letters_produced: bool = False
    schema_checked: bool = False

    def drop(self, tp: TopicPartition) -> PartitionBuffer | None:
        """Forget ``tp``: its data will be read again (its recorded dead letters then count as skips)."""
        self.files.pop(tp, None)
        self.letters.pop(tp, None)
        self.letters_found.pop(tp, None)
        self.letters_sent.pop(tp, None)
        return self.buffers.pop(tp, None)

    def actions(self) -> list[AddAction]:
        """The files of every partition still pending."""
        return [action for actions in self.files.values() for action in actions]

    def recorded_letters(self) -> list[DeadLetter]:
        """The dead letters this flush recorded, of the partitions still pending."""
        return [letter for tp, letters in self.letters.items() if tp in self.buffers for letter in letters]


class Committer:
    """Commits flushes into one table (any of the topics routed to it) and the dead-letter table."""

    def __init__(
        self,
        *,
        app_id: str,
        multi_topic: bool,
        name: str,
        writer: TableWriter,
        dead_letters: DeadLetterStore,
        dead_letter_topic: DeadLetterProducer | None,
        pipeline: Pipeline,
        metrics: Metrics,
        retrier: Retrier,
        clock: Callable[[], float],
    ) -> None:
        self._app_id = app_id
        self._multi_topic = multi_topic
        self.name = name
        """The table as metrics and logs name it (its route's name, or its URI)."""
        self.uri = writer.uri
        self._writer = writer
        self._dead_letters = dead_letters
        self._dead_letter_topic = dead_letter_topic
        self._pipeline = pipeline
        self._metrics = metrics
        self._retrier = retrier
        self._clock = clock
        self.table_schema: pa.Schema = writer.schema
        """The table schema the pipeline was last fitted to; a different one at commit time is someone else's."""
        self.commit_seconds = 0.0
        """The Delta commit of the last attempt, alone."""

    def commit(self, pending: PendingCommit, partitions: Mapping[TopicPartition, PartitionState]) -> int:
        """Steps 1-3 for ``pending``; returns the table version. What an earlier attempt did is not done again.

        ``partitions`` holds the txn versions the batch started from (read) and, once the dead letters
        are committed, their new dead-letter txn versions (written). The dead letters are counted once the
        main commit lands (or when the table cannot be created yet: they are final then, the partitions' offsets
        being marked, then committed with their first rows).
        """
        try:
            version = self._commit(pending, partitions)
        except TableNotCreated:
            # Final already (no main txn to wait for): counted now, and remembered, so that a replay taking them
            # as recorded (after another writer created the table: SchemaChanged) does not count them again.
            self._count_dead_letters(pending)
            for tp, letters in pending.letters.items():
                if tp in pending.buffers:
                    partitions[tp].counted_dead_letters.update(letter.offset for letter in letters)
            raise
        self._count_dead_letters(pending)
        return version

    def _commit(self, pending: PendingCommit, partitions: Mapping[TopicPartition, PartitionState]) -> int:
        if not pending.schema_checked:
            self._check_schema()
            pending.schema_checked = True
        schema = self._pipeline.schema
        evolving = not schema.equals(self.table_schema, check_metadata=False)
        # An evolution commit or a MERGE writes its files itself (delta-rs): here its rows are only checked.
        changes = self._pipeline.changes
        changes = changes if changes is not None and changes.upsert else None  # a changelog appends
        self._write_files(pending, schema, evolving or changes is not None)
        faults.point("after_parquet_write")
        self._commit_dead_letters(pending, partitions)
        faults.point("after_dead_letter_commit")
        taken = pending.buffers
        # A zombie's dead-letter commit for our partitions means it took some of these offsets as dead
        # letters: committing our outcome for them too would put an offset in both tables. Resync instead.
        in_dead_letters = self._dead_letters.committed_offsets(list(taken))
        moved = {p: v for p, v in in_dead_letters.items() if v != partitions[p].dead_letters_committed}
        if moved:
            raise CommitConflict(moved)
        ranges = {tp: OffsetRange(b.first_offset, b.last_offset) for tp, b in taken.items()}
        metadata = self._metadata(ranges)
        metadata["rows"] = sum(b.rows for b in taken.values())
        metadata["dead_letters"] = len(pending.recorded_letters())
        expected = {p: partitions[p].tables[self.uri] for p in taken}
        # A txn never moves back (a lane behind its table's version would otherwise undo later commits).
        versions = {p: max(r.last, _or_minus_one(expected[p])) for p, r in ranges.items()}
        started = self._clock()
        if changes is not None:
            source = self._last_changes(taken, schema, changes)
            metadata.update(mode="upsert", changes=source.num_rows)
            faults.point("before_merge")
            version = self._writer.merge(source, changes, expected, versions, metadata, evolve=evolving)
            self.commit_seconds = self._clock() - started
            self._report_merge(version, source.num_rows)
            if evolving:
                self._evolved(version, schema)
            return version
        if not evolving:
            actions = [action for partition in taken for action in pending.files[partition]]
            version = self._writer.commit(actions, expected, versions, metadata)
            self.commit_seconds = self._clock() - started
            return version
        rows = pa.concat_tables([b.to_table(schema) for b in taken.values()]) if taken else schema.empty_table()
        added = evolve(self.table_schema, schema, inferred=False).added
        metadata["added_columns"] = added
        version = self._writer.commit_evolution(rows, expected, versions, metadata)
        self.commit_seconds = self._clock() - started
        self._evolved(version, schema)
        return version

    def _report_merge(self, version: int, changes: int) -> None:
        stats = self._writer.last_merge
        self._metrics.merged(self.name, stats)
        logger.info(
            "merged %d changes into version %d of %s: %d inserted, %d updated, %d deleted; %d files rewritten "
            "(%d rows copied), %d skipped by the key bounds",
            changes,
            version,
            self.name,
            stats.get("num_target_rows_inserted", 0),
            stats.get("num_target_rows_updated", 0),
            stats.get("num_target_rows_deleted", 0),
            stats.get("num_target_files_removed", 0),
            stats.get("num_target_rows_copied", 0),
            stats.get("num_target_files_skipped_during_scan", 0),
        )

    def _evolved(self, version: int, schema: pa.Schema) -> None:
        added = evolve(self.table_schema, schema, inferred=False).added
        self._metrics.columns_added(self.name, len(added))
        logger.info("schema evolution committed in version %d: the table schema is now %s", version, schema)
        self.adopt_schema(self._writer.schema)

    @staticmethod
    def _last_changes(
        taken: Mapping[TopicPartition, PartitionBuffer],
        schema: pa.Schema,
        changes: ChangeOptions,
    ) -> pa.Table:
        """The MERGE source: the buffered changes of every partition, collapsed to the last change per key
        (by partition, then offset). A delete whose key the table cannot hold (null) matches nothing: left out."""
        key = changes.key
        ordered = [taken[tp] for tp in sorted(taken)]
        rows = pa.concat_tables([b.to_table(schema) for b in ordered]) if ordered else schema.empty_table()
        deletes = pa.concat_arrays([b.deletes() for b in ordered]) if ordered else pa.array([], pa.bool_())
        if any(column not in rows.column_names for column in key):
            return last_changes(rows.slice(0, 0), deletes.slice(0, 0), [])
        keyed = pc.is_valid(rows.column(key[0]))
        for column in key[1:]:
            keyed = pc.and_(keyed, pc.is_valid(rows.column(column)))
        return last_changes_of(rows.filter(keyed), deletes.filter(keyed), changes)

    def mark_starts(self, starts: Mapping[TopicPartition, int]) -> int:
        """An empty commit giving partitions that have no txn in this table their first one (``starts``: the
        offset before each partition's first message), before any message is taken."""
        metadata = self._metadata({tp: OffsetRange(start + 1, start) for tp, start in starts.items()})
        metadata["rows"] = 0
        metadata["marks_start"] = True
        return self._writer.commit([], dict.fromkeys(starts), dict(starts), metadata)

    def adopt_schema(self, schema: pa.Schema) -> None:
        """Fit the stages to ``schema`` from now on (our evolution commit, or another writer's change)."""
        self.table_schema = schema
        self._pipeline.set_schema(schema)

    def _check_schema(self) -> None:
        """Raise SchemaChanged when someone else changed the table's schema since the stages were fitted."""
        latest = self._retrier.run("reading the table schema", self._writer.refresh_schema)
        if not latest.equals(self.table_schema, check_metadata=False):
            raise SchemaChanged(self._writer.uri, latest)

    # --- step 1: files ------------------------------------------------------------------------

    def _write_files(self, pending: PendingCommit, schema: pa.Schema, evolving: bool) -> None:
        """Parquet files per Kafka partition; rows Parquet refuses become dead letters (stage write).

        A small flush (:data:`PARALLEL_WRITE_MAX_BYTES`: many partitions at a steady rate) writes its partitions'
        files side by side, since on an object store each file costs round trips that dwarf encoding it; a
        large one (a catch-up) writes them one by one, since Parquet encoders working together hold their pages
        in memory together (+130-170 MB peak RSS on the catch-up bench, for no gain on local disk). A failure is
        raised once every other partition's write has ended, and the files that were written stay in
        ``pending``, so a retry writes only the rest.
        An evolution commit writes its files in step 3 (delta-rs does): here its rows are only checked.
        """
        todo = [(partition, buffer) for partition, buffer in pending.buffers.items() if partition not in pending.files]
        if len(todo) < 2 or sum(buffer.nbytes for _, buffer in todo) > PARALLEL_WRITE_MAX_BYTES:
            for partition, buffer in todo:
                pending.files[partition] = self._partition_files(partition, buffer, schema, evolving)
            return
        pool = _file_writers()
        futures = [(p, pool.submit(self._partition_files, p, buffer, schema, evolving)) for p, buffer in todo]
        failure: BaseException | None = None
        for partition, future in futures:
            try:
                pending.files[partition] = future.result()
            except Exception as exc:  # raised below, after the other partitions' writes have ended
                failure = failure or exc
        if failure is not None:
            raise failure

    def _partition_files(
        self, partition: TopicPartition, buffer: PartitionBuffer, schema: pa.Schema, evolving: bool
    ) -> list[AddAction]:
        """One partition's files (none for an evolution commit, whose rows are only checked): the file its rows
        were encoded into while buffered, or else a file written from them now."""
        offsets = OffsetRange(buffer.first_offset, buffer.last_offset)
        encoded = buffer.encoded_file(schema) if not evolving and buffer.rows else None
        if encoded is not None:
            return self._writer.put_file(partition, offsets, encoded)
        while True:
            rows = buffer.to_table(schema)  # reads the encoded rows back, if any
            try:
                if evolving:
                    self._writer.check_rows(rows)
                    return []
                return self._writer.write_files(partition, offsets, rows) if buffer.rows else []
            except RowsRejected as rejected:
                self._reject_rows(partition, buffer, rows, rejected, schema)

    def _reject_rows(
        self, tp: TopicPartition, buffer: PartitionBuffer, rows: pa.Table, rejected: RowsRejected, schema: pa.Schema
    ) -> None:
        row_offsets = buffer.offsets().to_pylist()
        for index, exc in rejected.failures:
            row = rows.slice(index, 1).to_pylist()[0]
            letter = DeadLetter(
                topic=tp.topic,
                partition=tp.partition,
                offset=row_offsets[index],
                stage="write",
                reason=str(exc),
                payload=b"",
                payload_json=payload_json(b"", row),
                table=self.name,
            )
            buffer.dead_letters.append(letter)
            logger.warning("%s: Parquet refused the row: %s", letter.where, exc)
        self._metrics.failed(tp.topic, "write", len(rejected.failures))
        buffer.reject_rows([index for index, _ in rejected.failures], schema)

    # --- step 2: dead letters -----------------------------------------------------------------

    def _commit_dead_letters(self, pending: PendingCommit, partitions: Mapping[TopicPartition, PartitionState]) -> None:
        """The dead letters of the pending partitions, with their own txns, before the main commit."""
        letters = {p: b.dead_letters for p, b in pending.buffers.items() if b.dead_letters and p not in pending.letters}
        if not letters:
            return
        expected = {p: partitions[p].dead_letters_committed for p in letters}
        # Normally the batch's last offset; a replay that records inside an older window never lowers it.
        versions = {p: max(pending.buffers[p].last_offset, _or_minus_one(expected[p])) for p in letters}
        # Inside an older window the txn does not move, so it cannot tell whether an ambiguous commit landed, nor
        # whether a zombie already recorded a letter there (found by review): for letters at or below the txn,
        # the table itself is asked (before, to skip what landed; after, where the txn stays, to confirm).
        landed_ours: dict[TopicPartition, list[DeadLetter]] = {}
        found: dict[TopicPartition, list[DeadLetter]] = {}
        for partition, batch in letters.items():
            window = _or_minus_one(expected[partition])
            landed = self._recorded_among(partition, [letter for letter in batch if letter.offset <= window])
            # What an earlier attempt of this flush sent is ours (that commit landed, its outcome was lost); the
            # rest another writer recorded (found by review: counted as ours, a zombie's letters counted twice).
            sent = pending.letters_sent.get(partition, set())
            landed_ours[partition] = [letter for letter in batch if letter.offset in landed and letter.offset in sent]
            found[partition] = [letter for letter in batch if letter.offset in landed and letter.offset not in sent]
            letters[partition] = [letter for letter in batch if letter.offset not in landed]
        recording = [letter for batch in letters.values() for letter in batch]
        if self._dead_letter_topic is not None and not pending.letters_produced:
            self._dead_letter_topic.produce(recording)  # at least once: before the table commit
            pending.letters_produced = True
        unmoved = [p for p in letters if versions[p] == expected[p]]
        metadata = self._metadata(
            {tp: OffsetRange(pending.buffers[tp].first_offset, pending.buffers[tp].last_offset) for tp in letters}
        )
        metadata["dead_letters"] = len(recording)  # this commit's own: not those found recorded already
        for partition, batch in letters.items():
            pending.letters_sent.setdefault(partition, set()).update(letter.offset for letter in batch)
        self._dead_letters.commit(letters, expected, versions, metadata)
        for partition in unmoved:
            if len(self._recorded_among(partition, letters[partition])) != len(letters[partition]):
                raise RetryableError(f"dead letters of {partition} did not land in the commit")
        for partition, version in versions.items():
            partitions[partition].dead_letters_committed = version
        for partition, batch in letters.items():
            pending.letters[partition] = landed_ours[partition] + batch
            pending.letters_found[partition] = found[partition]
        self._log_dead_letters([letter for p in letters for letter in pending.letters[p]])

    def _recorded_among(self, partition: TopicPartition, letters: Sequence[DeadLetter]) -> set[int]:
        """The offsets of ``letters`` the dead-letter table holds."""
        if not letters:
            return set()
        offsets = {letter.offset for letter in letters}
        found = self._retrier.run(
            "reading recorded dead letters",
            partial(self._dead_letters.recorded_offsets, partition, min(offsets) - 1, max(offsets)),
        )
        return offsets & found

    def _count_dead_letters(self, pending: PendingCommit) -> None:
        """The main commit covering ``pending``'s dead letters landed: count them, each once (``dead_lettered``,
        and those another writer had recorded as ``dead_letter_recorded`` skips)."""
        counts = Counter((letter.topic, letter.stage) for letter in pending.recorded_letters())
        for (topic, stage), count in counts.items():
            self._metrics.dead_lettered(topic, stage, count)
        for tp, found in pending.letters_found.items():
            if tp in pending.buffers:
                self._metrics.skipped(tp.topic, tp.partition, "dead_letter_recorded", len(found))

    def _log_dead_letters(self, letters: Sequence[DeadLetter]) -> None:
        stages = Counter(letter.stage for letter in letters)
        for letter in letters[:_LOGGED_DEAD_LETTERS]:
            logger.warning("dead letter %s stage=%s reason=%s", letter.where, letter.stage, letter.reason)
        if len(letters) > _LOGGED_DEAD_LETTERS:
            logger.warning(
                "… and %d more dead letters in %s (by stage: %s)",
                len(letters) - _LOGGED_DEAD_LETTERS,
                self._dead_letters.uri,
                dict(stages),
            )

    def _metadata(self, ranges: Mapping[TopicPartition, OffsetRange]) -> dict[str, Any]:
        """The commit's ``commitInfo.kafka2delta``: the app id, whether its txn ids name the topic
        (``multi_topic``), and the offset range of each topic partition (``topics``; with one topic also
        ``topic`` and ``offsets``, as releases before 0.2 wrote them)."""
        topics: dict[str, dict[str, list[int]]] = {}
        for tp, r in sorted(ranges.items()):
            topics.setdefault(tp.topic, {})[str(tp.partition)] = [r.first, r.last]
        metadata: dict[str, Any] = {"app_id": self._app_id, "multi_topic": self._multi_topic, "topics": topics}
        if len(topics) == 1:
            ((topic, offsets),) = topics.items()
            metadata.update(topic=topic, offsets=offsets)
        return metadata


def _or_minus_one(version: int | None) -> int:
    return -1 if version is None else version


FILE_WRITE_THREADS = 8
"""Parquet files written at once (one per Kafka partition of a flush); shared by every table's committer, whose
flushes take turns in the loop."""
PARALLEL_WRITE_MAX_BYTES = 32 * 1024 * 1024
"""Largest flush (Arrow bytes of its rows) whose files are written side by side."""


@cache
def _file_writers() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=FILE_WRITE_THREADS, thread_name_prefix="k2d-parquet")
