"""Offset bookkeeping, pure: txn app ids, where a partition starts, and what a failed commit means.

A table's ``txn`` action for a topic partition (see :class:`TxnIds`) holds the last offset whose
outcome is final (a row, a dead letter or a counted skip). Nothing else is trusted for recovery; Kafka
group offsets are written after each commit for lag tools only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

from kafka2delta.config import table_key
from kafka2delta.errors import FatalError
from kafka2delta.records import TopicPartition

K = TypeVar("K", bound=Hashable)


RETIRED_MARK = -2
"""A start mark (:meth:`kafka2delta.dead_letters.DeadLetterTable.mark_starts`) no longer in force: marks are the
offset before a start, never below -1."""


def mark_in_force(mark: int | None) -> int | None:
    """A start mark's txn version as read from the log: the mark, or None when there is none or it was retired."""
    return mark if mark is not None and mark > RETIRED_MARK else None


def start_mark_id(prefix: str, table: str, tp: TopicPartition) -> str:
    """The txn app id, in the dead-letter table whose prefix for ``tp``'s topic is ``prefix``, of the start mark of
    ``tp`` in ``table``: ``<prefix>-<topic>-start-<hash of the table's URI>-<partition>`` (every spelling of the
    table, one id)."""
    digest = hashlib.sha256(table_key(table).encode()).hexdigest()[:12]
    return f"{prefix}-{tp.topic}-start-{digest}-{tp.partition}"


@dataclass(frozen=True)
class TxnIds:
    """How one table names the txn app id of each topic partition that writes it: ``<prefix>-<partition>``
    in the table, ``<prefix>-dlq-<partition>`` in the dead-letter table.

    The prefix is the topic itself when ``app_id`` is empty (whether one topic writes the table or
    several), ``app_id`` when only one topic can write the table, and ``<app_id>-<topic>`` when several
    can. Tables written by one topic therefore keep the ids they always had (``<app_id>-<partition>``,
    ``app_id`` defaulting to the topic), and a table that more topics may write never mixes two topics'
    offsets under one id.
    """

    app_id: str = ""
    multi_topic: bool = False

    def prefix(self, topic: str) -> str:
        if not self.app_id:
            return topic
        return f"{self.app_id}-{topic}" if self.multi_topic else self.app_id

    def main(self, tp: TopicPartition) -> str:
        return f"{self.prefix(tp.topic)}-{tp.partition}"

    def dead_letters(self, tp: TopicPartition) -> str:
        return f"{self.prefix(tp.topic)}-dlq-{tp.partition}"

    def app_ids(self, topic: str) -> tuple[str, ...]:
        """The ``app_id`` values ``topic``'s dead letters may carry: today's prefix, and the app id they had
        before several topics could write the table (rows written then keep it)."""
        return (self.prefix(topic), self.app_id) if self.app_id and self.multi_topic else (self.prefix(topic),)

    @property
    def legacy_prefix(self) -> str | None:
        """The prefix a table's ids had before several topics could write it (only differs with an explicit
        app_id)."""
        return self.app_id if self.app_id and self.multi_topic else None

    def legacy_main(self, tp: TopicPartition) -> str | None:
        return None if self.legacy_prefix is None else f"{self.legacy_prefix}-{tp.partition}"

    def legacy_dead_letters(self, tp: TopicPartition) -> str | None:
        return None if self.legacy_prefix is None else f"{self.legacy_prefix}-dlq-{tp.partition}"


class LogicalOffset(Enum):
    """A start position that is not a number: the broker resolves it."""

    EARLIEST = "earliest"
    LATEST = "latest"


def first_offset(offset: int | LogicalOffset, low: int, high: int) -> int:
    """The offset a start position reads first: ``earliest`` the low watermark, ``latest`` the high one."""
    if isinstance(offset, int):
        return offset
    return low if offset is LogicalOffset.EARLIEST else high


@dataclass(frozen=True)
class StartDecision:
    """Where a newly assigned partition starts, and why."""

    offset: int | LogicalOffset
    reason: str
    out_of_range: bool = False


def start_position(
    committed: int | None,
    low_watermark: int,
    high_watermark: int,
    auto_offset_reset: str,
    missing_offset_policy: str,
    where: str,
) -> StartDecision:
    """Decide the first offset to fetch for a partition from the table's committed offset.

    ``committed`` is the txn version (last final offset, inclusive), so the start is ``committed + 1``;
    offset 0 committed means start at 1. With no txn, ``auto_offset_reset`` decides. A start outside
    ``[low_watermark, high_watermark]`` means retention deleted messages (or the topic was recreated):
    ``missing_offset_policy`` says whether to stop or jump, and the decision is flagged so the caller
    logs and counts it.
    """
    if committed is None:
        return StartDecision(
            LogicalOffset(auto_offset_reset), f"no offset in the table: auto_offset_reset={auto_offset_reset}"
        )
    start = committed + 1
    if low_watermark <= start <= high_watermark:
        return StartDecision(start, f"table txn version {committed}")
    problem = (
        f"{where}: the table's next offset {start} is outside the broker's range [{low_watermark}, {high_watermark}]"
        + (" (deleted by retention)" if start < low_watermark else " (topic recreated or truncated?)")
    )
    if missing_offset_policy == "fail":
        raise FatalError(f"{problem}; set kafka.missing_offset_policy to 'earliest' or 'latest' to go on")
    jump = low_watermark if missing_offset_policy == "earliest" else high_watermark
    return StartDecision(jump, f"{problem}; missing_offset_policy={missing_offset_policy}: starting at {jump}", True)


class CommitOutcome(Enum):
    COMMITTED = "committed"  # the log holds exactly our versions: an ambiguous error was a success
    NOT_COMMITTED = "not_committed"  # the log still holds the versions we started from: retry
    MOVED = "moved"  # someone else committed these partitions: drop our data, resync


def classify_commit(
    expected: Mapping[K, int | None],
    ours: Mapping[K, int],
    in_log: Mapping[K, int | None],
) -> dict[K, CommitOutcome]:
    """After an ambiguous or failed commit, say per partition what the log shows happened. A partition the commit
    did not move (a replay inside an older window: ours == expected) cannot tell and is left out unless it
    moved: the commit is atomic, so the others say for it too (and with none left, the caller asks the table)."""
    outcome = {}
    for partition, version in in_log.items():
        if ours[partition] == expected[partition] and version == expected[partition]:
            continue
        if version == ours[partition]:
            outcome[partition] = CommitOutcome.COMMITTED
        elif version == expected[partition]:
            outcome[partition] = CommitOutcome.NOT_COMMITTED
        else:
            outcome[partition] = CommitOutcome.MOVED
    return outcome
