"""The broker killed (SIGKILL) and restarted mid-stream, briefly and for longer than the consumer
group's session timeout. These tests get a broker of their own (the session's is shared)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dev.kafka.broker import LocalBroker
from dev.local_server import pick_ports
from tests.support.chaos import (
    FAST_GROUP,
    FULL,
    ChaosProducer,
    ChaosResult,
    chaos_setup,
    check,
    drain,
    scale,
    stop,
    wait_committed,
)
from tests.support.harness import wait_for

SESSION_TIMEOUT_S = int(FAST_GROUP["K2D_KAFKA__SETTINGS__SESSION_TIMEOUT_MS"]) / 1000


@pytest.fixture(scope="module")
def private_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    port, controller_port = pick_ports(None, None)
    broker = LocalBroker(tmp_path_factory.mktemp("chaos-kafka"), port, controller_port)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="module")
def kafka_bootstrap(private_broker: Any) -> str:
    """Overrides the session's broker for this module: these tests kill theirs."""
    return str(private_broker.bootstrap_servers)


def _outage(broker: Any, seconds: float, result: ChaosResult) -> None:
    broker.kill()
    result.fault("broker SIGKILL")
    time.sleep(seconds)
    started = time.monotonic()
    broker.start(fresh=False)
    result.fault("broker restart")
    result.notes += f"broker down {seconds:.0f} s (+{time.monotonic() - started:.1f} s start-up); "


@pytest.mark.parametrize(
    "down_s",
    [
        # The short form runs the long outage only: it is a kill and a restart mid-stream too.
        pytest.param(2.0, id="brief", marks=pytest.mark.skipif(not FULL, reason="full form only (make chaos)")),
        pytest.param(scale(2, 3) * SESSION_TIMEOUT_S, id="longer_than_session_timeout"),
    ],
)
def test_broker_killed_and_restarted(
    setup_factory, daemon_factory, private_broker: Any, chaos_result: ChaosResult, tmp_path: Path, down_s: float
) -> None:
    per_partition = scale(6_000, 60_000)
    outages = scale(1, 3)
    chaos_result.scenario = (
        "broker SIGKILL, restart after 2 s"
        if down_s < SESSION_TIMEOUT_S
        else f"broker SIGKILL, down {down_s:.0f} s (> session timeout {SESSION_TIMEOUT_S:.0f} s)"
    )
    setup = chaos_setup(setup_factory, 4, max_messages_per_file=scale(1_000, 10_000), allowed_latency_s=0.5)
    producer = ChaosProducer(setup.topic, per_partition, chunk=scale(200, 1_000), pause_s=scale(5, 20) / 10)
    daemons = [daemon_factory(setup, env=FAST_GROUP) for _ in range(2)]
    wait_committed(setup)
    for _ in range(outages):
        assert producer.running(), "the fault must come while messages still arrive"
        _outage(private_broker, down_s, chaos_result)
        # The daemons go on once the broker is back: everything produced until then gets committed.
        target = producer.produced
        wait_for(
            lambda t=target: len(setup.ids()) + len(setup.dead_letters()) >= t, 300, f"{target} messages committed"
        )
        for daemon in daemons:
            assert daemon.process.poll() is None, daemon.log()[-3000:]
    producer.join()
    for daemon in daemons:
        stop(daemon, 300)
    logs = "".join(daemon.log() for daemon in daemons)
    if down_s > SESSION_TIMEOUT_S:
        chaos_result.notes += f"partitions lost by the daemons: {logs.count('without notice')}; "
    drain(daemon_factory, setup)
    chaos_result.verdict = check(setup)
    assert chaos_result.verdict.messages >= producer.produced  # a producer retry may write a message twice
