"""What the loop knows about each partition assigned to it: one :class:`PartitionState` per partition.

A state is created when the partition is assigned (from the txn versions the tables hold) and dropped
when it is revoked or lost, both in :mod:`kafka2delta.runner`, and nowhere else. Two facts are kept
apart on purpose, keyed by partition number for the length of one ``consume`` call, not per state:
which partitions were re-positioned during the call (the messages it returns for them are stale), and
the seeks decided inside its rebalance callbacks. A partition revoked and assigned again within one
call gets a new state, yet its stale messages must still be skipped and its seek still made.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kafka2delta.records import TopicPartition


@dataclass(kw_only=True)
class PartitionState:
    tp: TopicPartition
    home: str
    """The URI of the partition's home table: the table of its topic's first route. Its commits also make the
    partition's dead letters final (they ride with the home table's flush)."""
    tables: dict[str, int | None]
    """Each table this partition's messages can go to (the home table first), with its txn version for the
    partition: the last offset whose outcome that table holds (None: nothing committed). Routing by topic:
    one table. By ``[routing] expression``: several, whose versions differ only after a crash between their
    commits, until each has committed again (each drops the offsets it already holds)."""
    dead_letters_committed: int | None
    """The dead-letter table's txn version: every dead letter up to this offset is recorded."""
    position: int | None
    """The last offset taken, committed or buffered (None: nothing yet; the start is auto_offset_reset's, ``start``)."""
    high_watermark: int
    """The last known high watermark (the broker's at assignment, then the consumer's cached one)."""
    start: int = 0
    """Where the partition began reading when no table held any of it (``auto_offset_reset``'s low or high
    watermark): the lag counts from here until the first commit, not from offset 0."""
    recorded_dead_letters: set[int] = field(default_factory=set)
    """Offsets after the home table's version that are dead letters already (a crash came between the
    dead-letter commit and the home table's): final, never processed again; they only advance the txns."""
    counted_dead_letters: set[int] = field(default_factory=set)
    """Dead letters counted in the metrics although no table's txn covers them yet (recorded while the table could
    not be created): a replay that finds them recorded does not count them again as skips."""
    start_marks: dict[str, int] = field(default_factory=dict)
    """For tables without a txn for the partition: where the partition was marked to start in them while they did
    not exist yet (the dead-letter table keeps these marks); such a table holds the outcomes up to its mark."""

    @property
    def committed(self) -> int | None:
        """The last offset every table holds the outcome of: the lowest version or start mark (None: no table holds
        any). A table holding nothing while the others hold something, with no mark, joined later (a route added
        since): it starts where the partition is."""
        held = [version for table in self.tables if (version := self.held(table)) is not None]
        return min(held) if held else None

    def forget_covered_dead_letters(self) -> None:
        """Drop the recorded and counted dead letters every table now holds (its txn or its mark covers them)."""
        committed = self.committed
        if committed is None:
            return
        if self.recorded_dead_letters and committed >= max(self.recorded_dead_letters):
            self.recorded_dead_letters = set()
        if self.counted_dead_letters and committed >= max(self.counted_dead_letters):
            self.counted_dead_letters = set()

    def holds(self, table: str) -> int | None:
        """The last offset whose outcome ``table`` holds (a table that joined later: where it started)."""
        version = self.held(table)
        return version if version is not None else self.committed

    def held(self, table: str) -> int | None:
        """``table``'s txn version for the partition, else its start mark (None: neither)."""
        version = self.tables[table]
        return version if version is not None else self.start_marks.get(table)

    def lag(self) -> int:
        """Messages the broker holds beyond what is committed; never negative (a cached watermark may trail)."""
        return max(0, self.high_watermark - (self.committed + 1 if self.committed is not None else self.start))
