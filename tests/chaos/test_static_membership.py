"""Restarts without rebalance storms: two daemons in one group on 8 partitions, messages arriving all along;
again and again one daemon, picked at random, is SIGKILLed and restarted at once (as a kubelet restarts a
crashed container), first as plain group members, then with static membership (``group.instance.id``, what the
Helm chart's StatefulSet gives each pod: its name).

A plain member that comes back is a new member: the dead one keeps its partitions until the broker gives up on
it (``session.timeout.ms``), so they stand still that long. A static member that comes back under its old
``group.instance.id`` takes its partitions back at once, without a rebalance. Per kill, the time to recover is
from the kill until every partition has committed again; the figures go in the chaos result's notes. Both
runs end exact (lost 0, duplicated 0).
"""

from __future__ import annotations

import os
import random
import statistics
import time
from functools import partial
from pathlib import Path

from tests.support.chaos import (
    ChaosProducer,
    ChaosResult,
    Verdict,
    chaos_setup,
    check,
    drain,
    scale,
    stop,
    wait_committed,
)
from tests.support.harness import Daemon, Setup, wait_for

# librdkafka's default (45 s) in the full form; shorter in the default suite.
SESSION_TIMEOUT_MS = scale(15_000, 45_000)
PARTITIONS = 8


def test_sigkilled_daemons_recover_faster_with_static_membership(
    setup_factory, daemon_factory, chaos_result: ChaosResult, tmp_path: Path
) -> None:
    kills = scale(1, 8)  # the short form: one kill per mode shows the difference (15 s against ~3)
    seed = int(os.environ.get("K2D_CHAOS_SEED") or random.randrange(1 << 30))
    chaos_result.scenario = "random SIGKILLs of 2 daemons, restarted at once: plain members, then static members"
    figures = {
        mode: run(
            mode, kills, random.Random(seed), partial(setup_factory, table_uri=str(tmp_path / mode)), daemon_factory
        )
        for mode in MODES
    }
    for mode, (recoveries, _, verdict) in figures.items():
        chaos_result.fault(f"daemon SIGKILL ({mode})", len(recoveries))
        chaos_result.verdict = verdict
    chaos_result.notes = f"seed {seed}; session.timeout.ms {SESSION_TIMEOUT_MS}; " + "; ".join(
        f"{mode}: recovery per kill {', '.join(f'{r:.1f}' for r in recoveries)} s "
        f"(median {statistics.median(recoveries):.1f} s), {rate:,.0f} msg/s committed while killing"
        for mode, (recoveries, rate, _) in figures.items()
    )
    print(chaos_result.notes)
    plain, static = (statistics.median(figures[mode][0]) for mode in MODES)
    # A plain member's partitions wait out the session timeout; a static one's only the restart.
    assert plain >= SESSION_TIMEOUT_MS / 1000 * 0.8, chaos_result.notes
    assert static < plain / 2, chaos_result.notes


MODES = ("plain", "static")


def run(mode: str, kills: int, rng: random.Random, setup_factory, daemon_factory) -> tuple[list[float], float, Verdict]:
    setup = chaos_setup(setup_factory, PARTITIONS, max_messages_per_file=2_000, allowed_latency_s=1)
    # Steady arrivals (~1,600 msg/s) for as long as the kills last: every partition has something to commit.
    producer = ChaosProducer(setup.topic, per_partition=10_000_000, every=97, chunk=50, pause_s=0.25)

    def start(index: int) -> Daemon:
        env = {"K2D_KAFKA__SETTINGS__SESSION_TIMEOUT_MS": str(SESSION_TIMEOUT_MS)}
        if mode == "static":
            env["K2D_KAFKA__SETTINGS__GROUP_INSTANCE_ID"] = f"k2d-{index}"
        return daemon_factory(setup, env=env)

    daemons = [start(0), start(1)]
    wait_committed(setup)
    wait_for(lambda: all(v is not None for v in committed(setup).values()), 120, "every partition committed")
    recoveries = []
    first = committed(setup)
    started = time.monotonic()
    for _ in range(kills):
        # Kill a daemon that holds partitions: one waiting for its assignment (a rebalance under way) leaves nothing
        # standing, and the short form's one kill then shows no wait (a clean-clone run: 1.3 s).
        wait_for(lambda: all("assigned " in daemon.log() for daemon in daemons), 120, "both daemons assigned")
        settled = committed(setup)
        wait_for(lambda settled=settled: progressed(setup, settled), 120, "every partition committing")
        time.sleep(rng.uniform(1.0, 3.0))
        wait_for(lambda: any(holds_partitions(daemon) for daemon in daemons), 120, "a daemon holding partitions")
        victim = rng.choice([index for index, daemon in enumerate(daemons) if holds_partitions(daemon)])
        if daemons[victim].process.poll() is not None:
            raise AssertionError(f"daemon {victim} exited by itself: {daemons[victim].log()[-3000:]}")
        daemons[victim].kill()
        killed_at = time.monotonic()
        # Read once the victim is dead: read before, a commit of its landing during the read (the table read takes a
        # while on a busy machine) passed for the recovery (a clean-clone run: 0.1 s for a plain member).
        before = committed(setup)
        daemons[victim] = start(victim)
        wait_for(lambda before=before: progressed(setup, before), 180, "every partition committing again")
        recoveries.append(time.monotonic() - killed_at)
    last = committed(setup)
    rate = sum(last[p] - first[p] for p in first) / (time.monotonic() - started)
    producer.stop()
    for daemon in daemons:
        stop(daemon, 300)
    drain(daemon_factory, setup, timeout=600)
    return recoveries, rate, check(setup)


def holds_partitions(daemon: Daemon) -> bool:
    """Whether the daemon's last rebalance event was an assignment (each assigned partition logs a line)."""
    log = daemon.log()
    return log.rfind("assigned ") > max(log.rfind("revoked "), log.rfind(" without notice: dropping"))


def committed(setup: Setup) -> dict[int, int]:
    return {p: -1 if v is None else v for p, v in setup.txn_versions().items()}


def progressed(setup: Setup, before: dict[int, int]) -> bool:
    now = committed(setup)
    return all(now[p] > before[p] for p in before)
