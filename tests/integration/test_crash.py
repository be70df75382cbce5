"""SIGKILL at each step of the commit order, then a restart: exactly once."""

import random
import time

import pytest

from tests.integration.conftest import BackgroundProducer, assert_exactly_once, wait_for


@pytest.mark.parametrize("point", ["after_parquet_write", "after_delta_commit", "after_kafka_commit"])
def test_kill_at_commit_step_then_restart(setup_factory, daemon_factory, point: str) -> None:
    setup = setup_factory(3, max_messages_per_file=400)
    produced = setup.topic.produce(per_partition=2000)
    crashed = daemon_factory(setup, "--until-caught-up", env={"K2D_FAULT_INJECT": f"{point}:3"})
    assert crashed.wait(120) == -9, crashed.log()[-3000:]
    assert f"fault injection: SIGKILL at {point}" in crashed.log()
    before = setup.txn_versions()
    assert any(v is not None for v in before.values())  # two commits landed before the third crashed
    if point == "after_parquet_write":
        referenced = {p.split("/")[-1] for p in setup.table().get_add_actions(flatten=True).column("path").to_pylist()}
        on_disk = {p.name for p in (setup.tmp_path / "table").rglob("*.parquet") if "_delta_log" not in str(p)}
        assert on_disk - referenced, "the crash should leave orphan files that were never committed"

    restarted = daemon_factory(setup, "--until-caught-up")
    assert restarted.wait(180) == 0, restarted.log()[-3000:]
    assert_exactly_once(setup, produced)
    assert setup.txn_versions() == {p: 1999 for p in range(3)}


def test_kill_at_a_random_moment_then_restart(setup_factory, daemon_factory) -> None:
    setup = setup_factory(3, max_messages_per_file=300, allowed_latency_s=0.3)
    producer = BackgroundProducer(setup.topic, per_partition=6000)
    daemon = daemon_factory(setup)
    wait_for(lambda: bool(setup.ids()), 90, "a first commit")
    time.sleep(random.uniform(0.0, 2.0))
    assert daemon.process.poll() is None, "the daemon must still be running when it is killed"
    daemon.kill()
    killed_at = setup.txn_versions()
    produced = producer.join()
    restarted = daemon_factory(setup, "--until-caught-up")
    assert restarted.wait(180) == 0, restarted.log()[-3000:]
    assert_exactly_once(setup, produced)
    assert setup.txn_versions() == {p: 5999 for p in range(3)}, killed_at
