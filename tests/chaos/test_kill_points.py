"""SIGKILL at every instrumented step of the commit order and of a rebalance, then a restart in the
same consumer group: exactly once, every poison message a dead letter.

The daemon kills itself at the named point (``K2D_FAULT_INJECT=<point>:<nth hit>``, see
:mod:`kafka2delta.faults`) while messages still arrive. (Moved here from
``tests/integration/test_crash.py`` and extended to every point.)
"""

from __future__ import annotations

import pytest

from tests.support.chaos import (
    FAST_GROUP,
    ChaosProducer,
    ChaosResult,
    chaos_setup,
    check,
    drain,
    poisoned,
    scale,
    stop,
    wait_committed,
)
from tests.support.harness import wait_for

COMMIT_POINTS = [
    "after_parquet_write",
    "after_dead_letter_commit",
    "after_delta_commit",
    "before_kafka_commit",
    "after_kafka_commit",
]


@pytest.mark.parametrize("point", COMMIT_POINTS)
def test_kill_at_commit_step_then_restart(setup_factory, daemon_factory, chaos_result: ChaosResult, point: str) -> None:
    per_partition = scale(2_000, 50_000)
    setup = chaos_setup(setup_factory, 3, max_messages_per_file=scale(400, 5_000), allowed_latency_s=0.5)
    chaos_result.scenario = f"SIGKILL at `{point}`, restart in the same group"
    # Half is there at start, half arrives while the daemon runs, crashes and restarts.
    setup.topic.produce(per_partition // 2, payload=poisoned(50))
    producer = ChaosProducer(setup.topic, per_partition // 2, start=per_partition // 2, chunk=scale(100, 1_000))
    hits = scale(3, 6)
    crashed = daemon_factory(setup, env={**FAST_GROUP, "K2D_FAULT_INJECT": f"{point}:{hits}"})
    assert crashed.wait(300) == -9, crashed.log()[-3000:]
    assert f"fault injection: SIGKILL at {point}" in crashed.log()
    chaos_result.fault(f"SIGKILL at {point}")
    before = setup.txn_versions()
    assert any(v is not None for v in before.values()), "commits landed before the crash"
    if point == "after_parquet_write":
        referenced = {p.split("/")[-1] for p in setup.table().get_add_actions(flatten=True).column("path").to_pylist()}
        on_disk = {p.name for p in (setup.tmp_path / "table").rglob("*.parquet") if "_delta_log" not in str(p)}
        assert on_disk - referenced, "the crash should leave orphan files that were never committed"
    if point == "after_dead_letter_commit":
        letters = setup.dead_letter_txn_versions()
        assert any((letters[p] or -1) > (before[p] or -1) for p in letters), "dead letters ahead of the table"
    # Restart in the same group while the producer still runs, then drain.
    restarted = daemon_factory(setup, env=FAST_GROUP)
    wait_committed(setup, len(setup.ids()) + 1)
    producer.join()
    stop(restarted)
    drain(daemon_factory, setup)
    chaos_result.verdict = check(setup)


@pytest.mark.parametrize("point", ["in_revoke", "in_assign"])
def test_kill_during_rebalance_then_restart(
    setup_factory, daemon_factory, chaos_result: ChaosResult, point: str
) -> None:
    """A second daemon joins the group (the first revokes partitions) and, for ``in_assign``, leaves
    again (the first is given them back); the first dies inside that rebalance callback."""
    per_partition = scale(3_000, 50_000)
    setup = chaos_setup(setup_factory, 4, max_messages_per_file=scale(500, 5_000), allowed_latency_s=0.5)
    chaos_result.scenario = f"SIGKILL during a rebalance (`{point}`), restart"
    producer = ChaosProducer(setup.topic, per_partition, chunk=scale(100, 1_000))
    # in_assign: hit 1 is the first assignment at start, hit 2 the one after the second daemon leaves.
    first = daemon_factory(setup, env={**FAST_GROUP, "K2D_FAULT_INJECT": f"{point}:{1 if point == 'in_revoke' else 2}"})
    wait_committed(setup)
    second = daemon_factory(setup, env=FAST_GROUP)
    if point == "in_assign":
        wait_for(lambda: "assigned " in second.log(), 120, "the second daemon's assignment")
        # A commit with both daemons in the group; on a slow machine the producer may be done by now.
        before = len(setup.ids())
        wait_for(lambda: producer.done() or len(setup.ids()) > before, 240, "a commit with both daemons in the group")
        stop(second)
    assert first.wait(180) == -9, first.log()[-3000:]
    assert f"fault injection: SIGKILL at {point}" in first.log()
    chaos_result.fault(f"SIGKILL at {point}")
    if point == "in_assign":
        second = daemon_factory(setup, env=FAST_GROUP)  # the restart
    else:
        first = daemon_factory(setup, env=FAST_GROUP)  # the restart; both in the group again
    producer.join()
    for daemon in (first, second):
        if daemon.process.poll() is None:
            stop(daemon)
    drain(daemon_factory, setup)
    chaos_result.verdict = check(setup)
