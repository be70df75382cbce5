"""The job coordinator on its two real backends: an fcntl lock file and a real ZooKeeper."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kafka2delta.config import CoordinatorConfig
from kafka2delta.coordinator import Coordinator, open_coordinator, resource_name

Factory = Callable[..., Coordinator]


@pytest.fixture(params=["file", "zookeeper"])
def coordinators(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Factory]:
    """Coordinators on one fresh resource, each with its own lock handle / ZooKeeper session (like processes)."""
    resource = f"r-{uuid.uuid4().hex[:8]}"
    created: list[Coordinator] = []
    if request.param == "zookeeper":
        hosts = request.getfixturevalue("zookeeper_hosts")
        base = {"backend": "zookeeper", "hosts": hosts, "session_timeout_s": 4.0}
    else:
        base = {"backend": "file", "lock_dir": str(tmp_path / "locks")}

    def make(**settings: object) -> Coordinator:
        config = CoordinatorConfig(**{**base, "resource": resource, "lock_timeout_s": 0.5, **settings})  # type: ignore[arg-type]
        coordinator = open_coordinator(config, "unused")
        created.append(coordinator)
        return coordinator

    yield make
    for coordinator in created:
        coordinator.close()


def test_one_turn_at_a_time(coordinators: Factory) -> None:
    first, second = coordinators(), coordinators()
    turn = first.turn("optimize")
    assert turn is not None
    started = time.monotonic()
    assert second.turn("mutate") is None  # time-bounded: skips, does not fail
    assert second.last_skip == "lock busy"
    assert 0.4 < time.monotonic() - started < 5
    with turn:
        pass
    again = second.turn("mutate")
    assert again is not None
    with again:
        pass
    last = first.last()
    assert last is not None and (last.job, last.sequence) == ("mutate", 2)


def test_predecessor_order_is_a_cycle(coordinators: Factory) -> None:
    order = ("ingest", "mutate", "ttl")
    jobs = {name: coordinators(order=order) for name in order}
    ran: list[str] = []
    # Each job tries in the "wrong" order; only the expected successor of the last registration runs.
    for _ in range(3):
        for name in ("ttl", "mutate", "ingest"):
            turn = jobs[name].turn(name)
            if turn is None:
                assert jobs[name].last_skip.startswith("waiting for")
                continue
            with turn:
                ran.append(name)
    assert ran[:1] == ["ttl"]  # nothing registered yet: whoever comes first
    for previous, current in itertools.pairwise(ran):
        assert order.index(current) == (order.index(previous) + 1) % len(order)
    assert ran == ["ttl", "ingest", "mutate", "ttl", "ingest"]


def test_failed_turn_does_not_register_and_outsiders_only_lock(coordinators: Factory) -> None:
    coordinator = coordinators(order=("mutate", "ttl"))
    with pytest.raises(RuntimeError), coordinator.turn("mutate"):  # type: ignore[union-attr]
        raise RuntimeError("job failed")
    assert coordinator.last() is None
    turn = coordinator.turn("vacuum")  # not in the order: lock only, never registers
    assert turn is not None
    with turn:
        pass
    assert coordinator.last() is None


def test_stale_predecessor_is_bypassed_after_order_timeout(coordinators: Factory) -> None:
    strict = coordinators(order=("a", "b", "c"))
    with strict.turn("a"):  # type: ignore[union-attr]
        pass
    assert strict.turn("c") is None  # waits for b
    lenient = coordinators(order=("a", "b", "c"), order_timeout_s=0.2)
    time.sleep(0.3)
    turn = lenient.turn("c")
    assert turn is not None
    turn.release()


def test_threads_never_overlap(coordinators: Factory) -> None:
    inside = 0
    overlaps = 0
    turns = 0
    guard = threading.Lock()

    def worker(name: str) -> None:
        nonlocal inside, overlaps, turns
        coordinator = coordinators(lock_timeout_s=2.0)
        for _ in range(8):
            turn = coordinator.turn(name)
            if turn is None:
                continue
            with turn:
                with guard:
                    inside += 1
                    overlaps += inside > 1
                time.sleep(0.01)
                with guard:
                    inside -= 1
                    turns += 1

    threads = [threading.Thread(target=worker, args=(f"job{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert (overlaps, turns) == (0, 32)


def test_zookeeper_lock_of_a_dead_session_is_released(zookeeper_hosts: str) -> None:
    config = CoordinatorConfig(
        backend="zookeeper",
        hosts=zookeeper_hosts,
        resource=f"r-{uuid.uuid4().hex[:8]}",
        lock_timeout_s=0.5,
        session_timeout_s=2.0,
    )
    crashed = open_coordinator(config, "unused")
    assert crashed.turn("optimize") is not None
    crashed._backend._client.stop()  # type: ignore[attr-defined]  # the process "dies": no release
    crashed._backend._client.close()  # type: ignore[attr-defined]
    survivor = open_coordinator(config, "unused")
    try:
        turn = survivor.turn("mutate", lock_timeout_s=10)
        assert turn is not None
        turn.release()
    finally:
        survivor.close()


def test_resource_name_is_safe_and_stable() -> None:
    name = resource_name("s3://bucket/path/events/")
    assert name == resource_name("s3://bucket/path/events")
    assert name.startswith("events-") and "/" not in name
