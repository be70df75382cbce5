"""Where each assigned partition starts, read back from the Delta logs (the only record of progress): the txn
versions of the partition in each of its tables and in the dead-letter table, and the offsets a dead-letter
commit recorded before a crash took its table commit away. With ``[routing] expression``, also the empty
commits that give a partition's tables their first txn before any of its messages is taken (DESIGN.md,
invariant 11), and the start marks the dead-letter table keeps for tables that cannot take one (no schema: made
by their first rows), written and retired by the flush that needs them."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from functools import partial
from typing import NamedTuple

from kafka2delta.assignment import PartitionState
from kafka2delta.edges import DeadLetterStore
from kafka2delta.errors import CommitConflict, SchemaChanged, TableNotCreated
from kafka2delta.offsets import RETIRED_MARK, LogicalOffset, first_offset
from kafka2delta.records import TopicPartition
from kafka2delta.retries import Retrier
from kafka2delta.tables import Tables, TopicTables
from kafka2delta.value_buffers import PartitionBuffer

logger = logging.getLogger(__name__)

_MARK_ATTEMPTS = 3  # another daemon wrote (txns or schema): what it wrote is read back, the rest marked again
UNMADE_MARK_INTERVAL_S = 60.0
"""How often a table not made yet is marked at most (:meth:`Positions.mark_unmade`), but at a stop or a revoke: each
mark is a commit of the dead-letter table every daemon shares (found by review: one per flush doubled them)."""

Marks = dict[TopicPartition, dict[str, int]]
"""Per partition, the start marks of tables that hold no txn for it (:attr:`PartitionState.start_marks`)."""

MarksToWrite = dict[tuple[str, str], dict[TopicPartition, int]]
"""Start marks to write, by (table, home table: its dead-letter table keeps them), per partition."""


class ReadBack(NamedTuple):
    versions: dict[TopicPartition, dict[str, int | None]]
    """Each partition's txn version in each of its tables (None: none)."""
    dead_letters: dict[TopicPartition, int | None]
    """Each partition's txn version in the dead-letter table."""
    recorded: dict[TopicPartition, set[int]]
    """Offsets after a partition's lowest version that the dead-letter table already holds."""
    marks: Marks
    """The start marks of the tables without a txn for a partition (``[routing] expression``, and a table that
    could not be made yet: :meth:`Positions.mark_unmade`)."""


class Positions:
    def __init__(self, *, tables: Tables, retrier: Retrier, auto_offset_reset: str) -> None:
        self._tables = tables
        self._retrier = retrier
        self._auto_offset_reset = auto_offset_reset
        self._unmade_marked: dict[str, float] = {}
        """When each table not made yet was last marked (:meth:`mark_unmade`), by URI."""
        self._unmade_ends: dict[str, dict[TopicPartition, tuple[str, int]]] = {}
        """Ends not marked yet, by table URI and partition: the partition's home table and its lane's end."""

    def read(self, uris: list[str], partitions: list[TopicPartition]) -> ReadBack:
        """The txn versions of ``partitions`` in each of the tables ``uris`` and in the dead-letter table, the start
        marks of the tables without one, and per partition the offsets after the tables' lowest version (or mark)
        that the dead-letter table already holds (non-empty only after a crash between the two commits)."""
        found = {
            uri: self._retrier.run(
                "reading txn versions", partial(self._tables[uri].writer.committed_offsets, partitions)
            )
            for uri in uris
        }
        # A partition's dead letters are in its home table's dead-letter table (every route of a topic shares it).
        dead_letters = self._tables[uris[0]].dead_letters
        letters = self._retrier.run(
            "reading dead-letter txn versions", lambda: dead_letters.committed_offsets(partitions)
        )
        marks: Marks = {}
        for uri in uris if len(uris) > 1 else [u for u in uris if not self._tables[u].spec.columns]:
            # A partition split across tables, or one whose table is made by its first rows (no schema): the only
            # ones with marks (reading them for every new table cost a log scan per partition: found by review).
            unmarked = [tp for tp in partitions if found[uri][tp] is None]
            if unmarked:
                read = partial(dead_letters.start_marks, uri, unmarked)
                for tp, mark in self._retrier.run("reading start marks", read).items():
                    if mark is not None:
                        marks.setdefault(tp, {})[uri] = mark
        versions: dict[TopicPartition, dict[str, int | None]] = {}
        recorded: dict[TopicPartition, set[int]] = {}
        for tp in partitions:
            versions[tp] = {uri: found[uri][tp] for uri in uris}
            held = [version for version in versions[tp].values() if version is not None]
            held += marks.get(tp, {}).values()
            start = min(held) if held else None
            last_letter = letters[tp]
            if last_letter is not None and (start is None or last_letter > start):
                recorded[tp] = self._retrier.run(
                    "reading recorded dead letters",
                    partial(dead_letters.recorded_offsets, tp, start, last_letter),
                )
                logger.warning(
                    "%s: the dead-letter table is ahead of the tables (%s > %s): %d dead letters recorded "
                    "before a crash are final and will not be processed again",
                    tp,
                    last_letter,
                    start,
                    len(recorded[tp]),
                )
        return ReadBack(versions, letters, recorded, marks)

    def mark_starts(
        self,
        tables: TopicTables,
        versions: dict[TopicPartition, dict[str, int | None]],
        marks: Marks,
        watermarks: dict[TopicPartition, tuple[int, int]],
    ) -> None:
        """Give each table of a partition split by ``[routing] expression`` a txn before any of the partition's
        messages is taken: an empty commit at the version the partition starts from (``marks``: the tables' start
        marks, read). From then on a table that holds nothing of a partition its other tables hold something of can
        only be one added since (DESIGN.md: a crash between two tables' first commits would otherwise be mistaken
        for it, and lose rows), or one that does not exist yet, which the flush marks when that matters."""
        for uri in tables.uris:
            for _ in range(_MARK_ATTEMPTS):
                if not self._mark_table(uri, versions, marks, watermarks):
                    break

    def _mark_table(
        self,
        uri: str,
        versions: dict[TopicPartition, dict[str, int | None]],
        marks: Marks,
        watermarks: dict[TopicPartition, tuple[int, int]],
    ) -> bool:
        """One attempt for one table; True when partitions of it are still unmarked (another writer's commit
        conflicted with ours: what it wrote is read back, and the rest is marked again; or it changed the schema:
        the writer has read the new one, and the next attempt commits under it)."""
        starts: dict[TopicPartition, int] = {}
        for tp, held in versions.items():
            if held[uri] is not None or uri in marks.get(tp, {}):
                continue
            known = [version for version in held.values() if version is not None]
            known += marks.get(tp, {}).values()
            low, high = watermarks[tp]
            starts[tp] = min(known) if known else first_offset(LogicalOffset(self._auto_offset_reset), low, high) - 1
        if not starts:
            return False
        table = self._tables[uri]
        try:
            self._retrier.run("marking partition starts", partial(table.committer.mark_starts, starts))
        except TableNotCreated:
            return False  # no table to hold the txn: marked by the flush whose commits could need it
        except CommitConflict as conflict:
            logger.info("%s: marking partition starts met another writer's commit (%s); reading it", uri, conflict)
        except SchemaChanged:
            # An empty commit fits any schema. The stages are not refitted here: the next flush's schema check
            # sees the change and replays what was fitted to the old one.
            logger.info("%s: marking partition starts met another writer's schema change; marking again", uri)
        found = self._retrier.run("reading txn versions", partial(table.writer.committed_offsets, list(starts)))
        for tp in starts:
            versions[tp][uri] = found[tp]
        return any(found[tp] is None for tp in starts)

    def _write_marks(
        self, marks: MarksToWrite, partitions: Mapping[TopicPartition, PartitionState]
    ) -> set[TopicPartition]:
        """Set the start marks (:data:`RETIRED_MARK` retires one) in the log, then in the partitions' states; the
        partitions whose marks could not be written (another process kept writing them: read back and tried again,
        up to 3 times)."""
        unwritten: set[TopicPartition] = set()
        for (uri, home), starts in marks.items():
            if not self._write_table_marks(self._tables[home].dead_letters, uri, starts):
                logger.warning(
                    "%s: could not write the start marks of %s (another writer kept writing them)", uri, list(starts)
                )
                unwritten |= set(starts)
                continue
            for tp, start in starts.items():
                if start == RETIRED_MARK:
                    partitions[tp].start_marks.pop(uri, None)
                else:
                    partitions[tp].start_marks[uri] = start
        return unwritten

    def _write_table_marks(self, dead_letters: DeadLetterStore, uri: str, starts: dict[TopicPartition, int]) -> bool:
        """Set the start marks of ``uri`` in ``dead_letters`` to ``starts``; whether they hold those values now."""
        wanted = {tp: None if start == RETIRED_MARK else start for tp, start in starts.items()}
        for _ in range(_MARK_ATTEMPTS):
            try:
                self._retrier.run("writing start marks", partial(dead_letters.mark_starts, uri, starts))
            except (CommitConflict, SchemaChanged) as exc:
                logger.info("%s: writing start marks in %s met another writer (%s)", uri, dead_letters.uri, exc)
            found = self._retrier.run("reading start marks", partial(dead_letters.start_marks, uri, list(starts)))
            if found == wanted:
                return True
        return False

    # --- start marks: the flush's ------------------------------------------------------------

    def mark_first_commits(
        self,
        order: list[str],
        taken: Mapping[str, Mapping[TopicPartition, PartitionBuffer]],
        partitions: Mapping[TopicPartition, PartitionState],
    ) -> set[TopicPartition]:
        """Before a flush commits ``order``: a table with neither a txn nor a mark for a partition (made by its
        first rows: it could take no empty commit) that commits rows of it after another table's commit of it
        gets a start mark first, at the offset the partition is held up to. A crash between the two commits would
        otherwise leave it taken for a route added since, and its rows lost (DESIGN.md, invariant 11). Returns
        the partitions whose marks could not be written: the flush must not commit them."""
        if len(order) < 2:
            return set()
        starts: MarksToWrite = {}
        for tp in sorted({tp for uri in order for tp in taken[uri]}):
            state = partitions[tp]
            lanes = [uri for uri in order if tp in taken[uri]]  # with rows or not: any commit of it counts
            new = [uri for uri in lanes[1:] if taken[uri][tp].rows and state.held(uri) is None]
            held = state.committed
            for uri in new:
                starts.setdefault((uri, state.home), {})[tp] = held if held is not None else state.start - 1
        return self._write_marks(starts, partitions)

    def mark_unmade(
        self,
        uri: str,
        buffers: Mapping[TopicPartition, PartitionBuffer],
        partitions: Mapping[TopicPartition, PartitionState],
        *,
        now: float,
    ) -> None:
        """After a flush whose table could not be made (no row yet: its dead letters alone were committed), mark the
        partitions that have no other table as held up to the lane's end: every message up to it is final (a dead
        letter recorded, or a skip), and nothing else would record it (found by review: each restart read such a
        partition again from ``auto_offset_reset``, loading every dead letter it ever recorded, and the counted ones
        were kept in memory for good). Marked by :meth:`write_unmade_marks`, once per
        :data:`UNMADE_MARK_INTERVAL_S` at most."""
        ends = self._unmade_ends.setdefault(uri, {})
        for tp, buffer in buffers.items():
            state = partitions.get(tp)
            if state is not None and list(state.tables) == [uri] and state.tables[uri] is None:
                ends[tp] = (state.home, buffer.last_offset)
        self.write_unmade_marks(partitions, now=now, at_once=False)

    def write_unmade_marks(
        self, partitions: Mapping[TopicPartition, PartitionState], *, now: float, at_once: bool
    ) -> None:
        """Write the ends :meth:`mark_unmade` holds of the tables last marked :data:`UNMADE_MARK_INTERVAL_S` ago
        (``at_once``: of every table, at a stop or a revoke), for the partitions still held whose table still has no
        txn. An end held back must not stay so (found by review: a mark left behind at a stop made the restart read
        again, or refuse to start once retention had passed it); one not written leaves the partition read again
        from its last mark, not lost."""
        for uri in list(self._unmade_ends):
            if not at_once and now - self._unmade_marked.get(uri, -UNMADE_MARK_INTERVAL_S) < UNMADE_MARK_INTERVAL_S:
                continue
            starts: MarksToWrite = {}
            for tp, (home, end) in self._unmade_ends.pop(uri).items():
                state = partitions.get(tp)
                if state is not None and state.tables.get(uri, 0) is None:
                    starts.setdefault((uri, home), {})[tp] = end
            if starts:
                self._unmade_marked[uri] = now
                self._write_marks(starts, partitions)

    def settle_marks(
        self,
        order: list[str],
        taken: Mapping[str, Mapping[TopicPartition, PartitionBuffer]],
        partitions: Mapping[TopicPartition, PartitionState],
        resynced: set[TopicPartition],
    ) -> None:
        """After a flush, retire the marks no longer needed: a marked table that now holds a txn for the partition
        needs its mark no more (retired in the log too, or it would come back if the table lost its txn: found by
        review). One that still holds none although its lane was in the flush had no rows to commit up to the
        lane's end; once that end has reached every other table's version, nothing of it can be pending (a replay
        after a crash had brought its rows back by then: found by review), and its mark is retired, else it would
        hold the partition back for good. A partition resynced by the flush keeps its marks (it is read again from
        them)."""
        retire: MarksToWrite = {}
        for uri in order:
            for tp, lane in taken[uri].items():
                state = partitions.get(tp)
                if state is None or uri not in state.start_marks or tp in resynced:
                    continue
                others = [v for other in state.tables if other != uri and (v := state.held(other)) is not None]
                if state.tables[uri] is not None or (others and lane.last_offset >= max(others)):
                    retire.setdefault((uri, state.home), {})[tp] = RETIRED_MARK
        self._write_marks(retire, partitions)  # one left unretired is retired by a later flush
