"""Random SIGKILLs: two daemon instances in one consumer group on 8 partitions, messages (with poison)
arriving all along; again and again one instance, picked at random, is killed at a random moment and
restarted after a random pause. Full form: 20+ kills over 1,000,000 messages."""

from __future__ import annotations

import os
import random
import time

from tests.support.chaos import (
    FAST_GROUP,
    ChaosProducer,
    ChaosResult,
    chaos_setup,
    check,
    drain,
    scale,
    stop,
    wait_committed,
)


def test_random_sigkills_two_instances_one_group(setup_factory, daemon_factory, chaos_result: ChaosResult) -> None:
    partitions = 8
    per_partition = scale(5_000, 125_000)  # 40,000 / 1,000,000 messages
    kills = scale(4, 22)
    seed = int(os.environ.get("K2D_CHAOS_SEED") or random.randrange(1 << 30))
    rng = random.Random(seed)
    chaos_result.scenario = "random SIGKILLs, 2 instances in one group, 8 partitions"
    chaos_result.notes = f"seed {seed} (K2D_CHAOS_SEED={seed} replays the same kill times)"
    setup = chaos_setup(
        setup_factory, partitions, max_messages_per_file=scale(2_000, 20_000), allowed_latency_s=scale(1, 2)
    )
    # The producer spreads the messages over the whole run: kills land while messages still arrive.
    producer = ChaosProducer(setup.topic, per_partition, every=97, chunk=scale(250, 2_500), pause_s=scale(6, 25) / 10)
    daemons = [daemon_factory(setup, env=FAST_GROUP) for _ in range(2)]
    wait_committed(setup)
    done = 0
    while done < kills:
        time.sleep(rng.uniform(1.0, scale(3, 6)))
        victim = rng.randrange(2)
        daemon = daemons[victim]
        if daemon.process.poll() is not None:
            raise AssertionError(f"daemon {victim} exited by itself: {daemon.log()[-3000:]}")
        daemon.kill()
        done += 1
        chaos_result.fault("daemon SIGKILL")
        time.sleep(rng.uniform(0.0, scale(3, 5)))  # the pause before its restart
        daemons[victim] = daemon_factory(setup, env=FAST_GROUP)
    produced = producer.join()
    for daemon in daemons:
        stop(daemon, 300)
    drain(daemon_factory, setup, timeout=900)
    chaos_result.verdict = check(setup)
    assert chaos_result.verdict.messages == produced
