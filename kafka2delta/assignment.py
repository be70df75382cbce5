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


@dataclass(kw_only=True)
class PartitionState:
    partition: int
    committed: int | None
    """The main table's txn version: the last offset whose outcome is final (None: nothing committed)."""
    dead_letters_committed: int | None
    """The dead-letter table's txn version: every dead letter up to this offset is recorded."""
    position: int | None
    """The last offset taken, committed or buffered (None: nothing yet; the start is auto_offset_reset)."""
    high_watermark: int
    """The last known high watermark (the broker's at assignment, then the consumer's cached one)."""
    recorded_dead_letters: set[int] = field(default_factory=set)
    """Offsets after ``committed`` that are dead letters already (a crash came between the dead-letter
    commit and the main one): final, never processed again; they only advance the main txn."""

    def lag(self) -> int:
        """Messages the broker holds beyond what is committed; never negative (a cached watermark may trail)."""
        return max(0, self.high_watermark - (self.committed + 1 if self.committed is not None else 0))
