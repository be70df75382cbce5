"""Where each assigned partition starts, read back from the Delta logs (the only record of progress): the txn
versions of the partition in each of its tables and in the dead-letter table, and the offsets a dead-letter
commit recorded before a crash took its table commit away. With ``[routing] expression``, also the empty
commits that give a partition's tables their first txn before any of its messages is taken (DESIGN.md,
invariant 11)."""

from __future__ import annotations

import logging
from functools import partial

from kafka2delta.errors import CommitConflict, SchemaChanged, TableNotCreated
from kafka2delta.offsets import LogicalOffset, first_offset
from kafka2delta.records import TopicPartition
from kafka2delta.retries import Retrier
from kafka2delta.tables import Tables, TopicTables

logger = logging.getLogger(__name__)

_MARK_ATTEMPTS = 3  # another daemon wrote (txns or schema): what it wrote is read back, the rest marked again


class Positions:
    def __init__(self, *, tables: Tables, retrier: Retrier, auto_offset_reset: str) -> None:
        self._tables = tables
        self._retrier = retrier
        self._auto_offset_reset = auto_offset_reset

    def read(
        self, uris: list[str], partitions: list[TopicPartition]
    ) -> tuple[
        dict[TopicPartition, dict[str, int | None]], dict[TopicPartition, int | None], dict[TopicPartition, set[int]]
    ]:
        """The txn versions of ``partitions`` in each of the tables ``uris`` and in the dead-letter table, and
        per partition the offsets after the tables' lowest version that the dead-letter table already holds
        (non-empty only after a crash between the two commits)."""
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
        versions: dict[TopicPartition, dict[str, int | None]] = {}
        recorded: dict[TopicPartition, set[int]] = {}
        for tp in partitions:
            versions[tp] = {uri: found[uri][tp] for uri in uris}
            held = [version for version in versions[tp].values() if version is not None]
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
        return versions, letters, recorded

    def mark_starts(
        self,
        tables: TopicTables,
        versions: dict[TopicPartition, dict[str, int | None]],
        watermarks: dict[TopicPartition, tuple[int, int]],
    ) -> None:
        """Give each table of a partition split by ``[routing] expression`` a txn before any of the partition's
        messages is taken: an empty commit at the version the partition starts from. From then on a table that
        holds nothing of a partition its other tables hold something of can only be one added since (DESIGN.md:
        a crash between two tables' first commits would otherwise be mistaken for it, and lose rows)."""
        for uri in tables.uris:
            for _ in range(_MARK_ATTEMPTS):
                if not self._mark_table(uri, versions, watermarks):
                    break

    def _mark_table(
        self,
        uri: str,
        versions: dict[TopicPartition, dict[str, int | None]],
        watermarks: dict[TopicPartition, tuple[int, int]],
    ) -> bool:
        """One attempt for one table; True when partitions of it are still unmarked (another writer's commit
        conflicted with ours: what it wrote is read back, and the rest is marked again; or it changed the schema:
        the writer has read the new one, and the next attempt commits under it)."""
        starts: dict[TopicPartition, int] = {}
        for tp, held in versions.items():
            if held[uri] is not None:
                continue
            known = [version for version in held.values() if version is not None]
            low, high = watermarks[tp]
            starts[tp] = min(known) if known else first_offset(LogicalOffset(self._auto_offset_reset), low, high) - 1
        if not starts:
            return False
        table = self._tables[uri]
        try:
            self._retrier.run("marking partition starts", partial(table.committer.mark_starts, starts))
        except TableNotCreated:
            return False  # created with its first rows, which then commit before the other tables' (see _flush)
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
