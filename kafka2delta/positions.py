"""Where each assigned partition starts, read back from the Delta logs (the only record of progress): the txn
versions of the partition in each of its tables and in the dead-letter table, and the offsets a dead-letter
commit recorded before a crash took its table commit away. With ``[routing] expression``, also the empty
commits that give a partition's tables their first txn before any of its messages is taken (DESIGN.md,
invariant 11), and for a table that cannot take one (no schema, not created yet) the start mark the dead-letter
table keeps for it instead."""

from __future__ import annotations

import logging
from functools import partial
from typing import NamedTuple

from kafka2delta.errors import CommitConflict, SchemaChanged, TableNotCreated
from kafka2delta.offsets import LogicalOffset, first_offset
from kafka2delta.records import TopicPartition
from kafka2delta.retries import Retrier
from kafka2delta.tables import Tables, TopicTables

logger = logging.getLogger(__name__)

_MARK_ATTEMPTS = 3  # another daemon wrote (txns or schema): what it wrote is read back, the rest marked again

Marks = dict[TopicPartition, dict[str, int]]
"""Per partition, the start marks of tables that hold no txn for it (:attr:`PartitionState.start_marks`)."""


class ReadBack(NamedTuple):
    versions: dict[TopicPartition, dict[str, int | None]]
    """Each partition's txn version in each of its tables (None: none)."""
    dead_letters: dict[TopicPartition, int | None]
    """Each partition's txn version in the dead-letter table."""
    recorded: dict[TopicPartition, set[int]]
    """Offsets after a partition's lowest version that the dead-letter table already holds."""
    marks: Marks
    """The start marks of the tables without a txn for a partition (``[routing] expression`` only)."""


class Positions:
    def __init__(self, *, tables: Tables, retrier: Retrier, auto_offset_reset: str) -> None:
        self._tables = tables
        self._retrier = retrier
        self._auto_offset_reset = auto_offset_reset

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
        for uri in uris if len(uris) > 1 else []:  # only a partition split across tables has marks
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
        messages is taken: an empty commit at the version the partition starts from, or for a table that does not
        exist yet (no schema: made by its first rows) a start mark in the dead-letter table (into ``marks``). From
        then on a table that holds nothing of a partition its other tables hold something of can only be one added
        since (DESIGN.md: a crash between two tables' first commits would otherwise be mistaken for it, and lose
        rows)."""
        for uri in tables.uris:
            for _ in range(_MARK_ATTEMPTS):
                if not self._mark_table(tables, uri, versions, marks, watermarks):
                    break

    def _mark_table(
        self,
        tables: TopicTables,
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
            return self._mark_in_dead_letters(tables, uri, starts, marks)
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

    def _mark_in_dead_letters(
        self, tables: TopicTables, uri: str, starts: dict[TopicPartition, int], marks: Marks
    ) -> bool:
        """The start marks of a table that does not exist yet, kept by the partitions' dead-letter table; True when
        some are still missing (another process marked or changed that table meanwhile: read back, marked again)."""
        dead_letters = tables.home.dead_letters
        try:
            self._retrier.run("marking partition starts", partial(dead_letters.mark_starts, uri, starts))
        except (CommitConflict, SchemaChanged) as exc:
            logger.info("%s: marking partition starts in %s met another writer (%s)", uri, dead_letters.uri, exc)
        found = self._retrier.run("reading start marks", partial(dead_letters.start_marks, uri, list(starts)))
        for tp, mark in found.items():
            if mark is not None:
                marks.setdefault(tp, {})[uri] = mark
        return any(mark is None for mark in found.values())
