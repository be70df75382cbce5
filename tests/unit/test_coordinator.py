"""The coordinator's order rules on the file backend (ZooKeeper: tests/spark/test_coordinator.py)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from kafka2delta.coordinator import Coordinator, CoordinatorError, FileBackend, Registration


def make(tmp_path: Path, order: tuple[str, ...] = ("ingest", "mutate", "optimize")) -> Coordinator:
    return Coordinator(FileBackend(tmp_path, "table"), "table", order=order, lock_timeout_s=0.5)


def run(coordinator: Coordinator, job: str) -> bool:
    turn = coordinator.turn(job)
    if turn is None:
        return False
    with turn:
        return True


def test_a_job_may_follow_itself_but_not_skip_its_predecessor(tmp_path: Path) -> None:
    first, second = make(tmp_path), make(tmp_path)  # two replicas of the daemon
    assert run(first, "ingest") and run(second, "ingest") and run(first, "ingest")
    assert not run(first, "optimize") and first.last_skip == "waiting for mutate (last: ingest)"
    assert run(first, "mutate") and not run(second, "ingest")
    last = first.last()
    assert last is not None and (last.job, last.sequence) == ("mutate", 4)


def test_a_registration_outside_the_order_does_not_stall_the_cycle(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert run(make(tmp_path, order=()), "nightly-compaction")  # a job configured without an order registers
    with caplog.at_level(logging.WARNING):
        assert run(make(tmp_path), "optimize")
    assert "'nightly-compaction' on table is not in coordinator.order" in caplog.text


class FailingRegistry(FileBackend):
    def write_last(self, registration: Registration) -> None:
        raise CoordinatorError("ZooKeeper connection lost")


def test_a_turn_whose_registration_fails_is_not_reported_as_failed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    coordinator = Coordinator(FailingRegistry(tmp_path, "table"), "table", order=("ingest", "mutate"))
    turn = coordinator.turn("ingest")
    assert turn is not None
    with caplog.at_level(logging.ERROR), turn:
        pass  # the job's commit landed here
    assert turn.registration is None and coordinator.last() is None
    assert "ingest: ran, but could not register the turn on table: ZooKeeper connection lost" in caplog.text
    assert run(coordinator, "ingest")  # the lock was released
