"""CommitPacer: a fleet of writers sharing one table's log settles at the table's commit budget; one writer alone
keeps its allowed latency."""

from __future__ import annotations

import heapq

import pytest

from kafka2delta.pacing import MAX_INTERVAL_S, CommitPacer


def _fleet(writers: int, allowed_latency_s: float, budget: float, seconds: float = 600.0) -> tuple[float, float]:
    """Writers each committing when their interval has passed, one log: (table commits/s over the last third,
    the writers' mean interval at the end)."""
    pacers = [CommitPacer(allowed_latency_s=allowed_latency_s, table_commits_per_s=budget) for _ in range(writers)]
    # Start times spread over one interval, as pods that joined at different moments.
    due = [(allowed_latency_s * i / writers, i) for i in range(writers)]
    heapq.heapify(due)
    version, commits = 0, []
    while due[0][0] < seconds:
        now, i = heapq.heappop(due)
        version += 1
        commits.append(now)
        heapq.heappush(due, (now + pacers[i].committed(version), i))
    late = [t for t in commits if t >= seconds * 2 / 3]
    return len(late) / (seconds / 3), sum(p.interval_s for p in pacers) / writers


@pytest.mark.parametrize("writers", [1, 2, 8])
def test_under_the_budget_every_writer_keeps_its_allowed_latency(writers: int) -> None:
    rate, interval = _fleet(writers, allowed_latency_s=1.0, budget=10.0)
    assert interval == 1.0
    assert rate == pytest.approx(writers, rel=0.05)


@pytest.mark.parametrize("writers", [32, 64])
def test_over_the_budget_the_fleet_settles_at_it(writers: int) -> None:
    rate, interval = _fleet(writers, allowed_latency_s=1.0, budget=10.0)
    assert rate == pytest.approx(10.0, rel=0.1)
    assert interval == pytest.approx(writers / 10.0, rel=0.1)


def test_no_budget_and_the_longest_wait() -> None:
    rate, interval = _fleet(32, allowed_latency_s=1.0, budget=0.0)
    assert rate == pytest.approx(32.0, rel=0.05) and interval == 1.0
    crowded = CommitPacer(allowed_latency_s=1.0, table_commits_per_s=1.0)
    for version in range(0, 10_000, 1000):  # a thousand commits of others between two of ours
        crowded.committed(version)
    assert crowded.interval_s == MAX_INTERVAL_S


def test_a_replaced_table_starts_the_count_again() -> None:
    pacer = CommitPacer(allowed_latency_s=1.0, table_commits_per_s=10.0)
    for version in range(0, 900, 100):
        pacer.committed(version)
    assert pacer.interval_s == 10.0
    pacer.committed(3)  # version went back: a new table
    assert pacer.committed(4) == 1.0 and pacer.writers == 1.0
