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


def test_every_spelling_of_a_table_takes_one_lock(tmp_path: Path) -> None:
    """The daemon (``join_ingest``: the table spec's URI), ``jobs apply-changes --target`` and ``maintain --table`` each
    name the table their own way; the coordinator's resource is the same for all, so they exclude each other."""
    import hashlib

    from kafka2delta.config import CoordinatorConfig, load_config, table_key
    from kafka2delta.coordinator import open_coordinator, resource_name
    from kafka2delta.routing import Routes

    table = tmp_path / "lake" / "t"
    spellings = [str(table), f"{table}/", f"file://{table}", f"file:{table}", f"file://localhost{table}"]
    relative = Path(*[".."] * len(Path.cwd().parts), *table.parts[1:])  # the same table, from the working directory
    spellings.append(str(relative))
    assert {table_key(uri) for uri in spellings} == {str(table.resolve())}
    assert len({resource_name(uri) for uri in spellings}) == 1
    assert resource_name("s3a://Bucket/t/") == resource_name("S3://Bucket/t")
    # A URI already spelled so keeps the name it had (a daemon and a job of the versions before share its lock).
    for uri in ("s3://bucket/path/events", str(table.resolve()), "abfss://c@acct.dfs.core.windows.net/t"):
        assert resource_name(uri) == f"{uri.rsplit('/', 1)[-1]}-{hashlib.sha256(uri.encode()).hexdigest()[:12]}"

    # The daemon's own name for it, from its routing (what cli.py hands open_coordinator), is the job's.
    config = load_config(
        None,
        {
            "K2D_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:1",
            "K2D_KAFKA__TOPIC": "t",
            "K2D_TABLE__URI": f"file://{tmp_path}/lake/{{topic}}/",
        },
    )
    daemon_uri = Routes(config).table_for("t").uri
    coordinators = CoordinatorConfig(backend="file", lock_dir=str(tmp_path / "locks"), lock_timeout_s=0.2)
    daemon = open_coordinator(coordinators, daemon_uri)
    job = open_coordinator(coordinators, f"{table}/")
    try:
        assert daemon.resource == job.resource == resource_name(str(table))
        turn = daemon.turn("ingest")
        assert turn is not None
        with turn:
            assert job.turn("apply-changes") is None and "busy" in job.last_skip  # one lock
    finally:
        daemon.close()
        job.close()
