"""Offset bookkeeping, pure: txn app ids, where a partition starts, and what a failed commit means.

The table's ``txn`` action ``<app_id>-<partition>`` holds the last offset whose outcome is final
(a row, a dead letter or a counted skip). Nothing else is trusted for recovery; Kafka group offsets
are written after each commit for lag tools only.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from kafka2delta.errors import FatalError


def txn_app_id(app_id: str, partition: int) -> str:
    return f"{app_id}-{partition}"


class LogicalOffset(Enum):
    """A start position that is not a number: the broker resolves it."""

    EARLIEST = "earliest"
    LATEST = "latest"


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
    expected: dict[int, int | None],
    ours: dict[int, int],
    in_log: dict[int, int | None],
) -> dict[int, CommitOutcome]:
    """After an ambiguous or failed commit, say per partition what the log shows happened."""
    outcome = {}
    for partition, version in in_log.items():
        if version == ours[partition]:
            outcome[partition] = CommitOutcome.COMMITTED
        elif version == expected[partition]:
            outcome[partition] = CommitOutcome.NOT_COMMITTED
        else:
            outcome[partition] = CommitOutcome.MOVED
    return outcome
