"""CommitPacer: a fleet of writers sharing one table's log settles at the table's commit budget; one writer alone
keeps its allowed latency. How the pace is told (gauges, a log line)."""

from __future__ import annotations

import heapq
import logging

import pytest

from kafka2delta.metrics import Metrics
from kafka2delta.pacing import MAX_INTERVAL_S, CommitPacer
from kafka2delta.progress import Progress
from kafka2delta.status import StatusBoard


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
        heapq.heappush(due, (now + pacers[i].committed(version, now), i))
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
    for second, version in enumerate(range(0, 10_000, 1000)):  # others commit a thousand times a second
        crowded.committed(version, float(second))
    assert crowded.interval_s == MAX_INTERVAL_S


def test_a_replaced_table_starts_the_count_again() -> None:
    pacer = CommitPacer(allowed_latency_s=1.0, table_commits_per_s=10.0)
    for second, version in enumerate(range(0, 900, 100)):  # 100 versions a second, 10 times the budget
        pacer.committed(version, float(second))
    assert pacer.interval_s == 10.0
    pacer.committed(3, 9.0)  # version went back: a new table
    assert pacer.committed(4, 10.0) == 1.0 and pacer.writers == 1.0


def test_a_writer_back_from_a_quiet_spell_does_not_take_the_commits_meanwhile_for_a_crowd() -> None:
    """Found by review: 10 writers committing every 5 s give the log 2 commits a second, a fifth of its budget; a
    writer whose partitions were quiet for 10 minutes saw ~1,200 versions over one commit of its own and waited ~16
    s for its next commits."""
    pacer = CommitPacer(allowed_latency_s=5.0, table_commits_per_s=10.0)
    now, version = 0.0, 0
    for _ in range(9):
        pacer.committed(version, now)
        now, version = now + 5.0, version + 10
    now, version = now + 600.0, version + 1200  # quiet: the others kept committing, 2 a second
    for _ in range(8):
        assert pacer.committed(version, now) == 5.0
        now, version = now + 5.0, version + 10


def test_the_pace_is_published_and_logged_when_it_moves_by_a_quarter(caplog: pytest.LogCaptureFixture) -> None:
    """Progress.paced: the interval and writers gauges after every commit; the log line (under
    kafka2delta.progress, beside the commit lines) only when the interval moved by a quarter, at least 0.5 s."""
    metrics = Metrics()
    board = StatusBoard("t", "app", "group", "/lake/t", "/lake/t_dead_letters", 10.0, clock=lambda: 0.0)
    progress = Progress(
        metrics=metrics,
        board=board,
        clock=lambda: 0.0,
        wall_clock=lambda: 0.0,
        interval_s=60.0,
        max_messages_per_file=1000,
        table_commits_per_s=2.0,
    )
    caplog.set_level(logging.INFO, logger="kafka2delta.progress")
    progress.paced("events", writers=8.0, interval_s=4.0, before_s=1.0)
    progress.paced("events", writers=8.0, interval_s=4.4, before_s=4.0)  # moved by a tenth: not said
    gauge = metrics.registry.get_sample_value
    assert gauge("kafka2delta_commit_interval_seconds", {"table": "events"}) == 4.4
    assert gauge("kafka2delta_table_writers", {"table": "events"}) == 8.0
    assert [(r.name, r.getMessage()) for r in caplog.records] == [
        (
            "kafka2delta.progress",
            "events: about 8.0 writers commit to it, budget 2 commits/s: committing every 4.0 s (was 1.0 s)",
        )
    ]
