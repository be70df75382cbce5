"""Storage faults while the daemon commits: the local table made read-only for a while; on S3 (moto's
server on loopback, behind a fault-injecting proxy) the server stopped and restarted mid-commit, and
every request answered with an error for a while. The daemon retries with backoff and holds its
offsets; afterwards nothing is lost or duplicated."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from deltalake import DeltaTable

from tests.support.chaos import (
    FAST_GROUP,
    ChaosProducer,
    ChaosResult,
    chaos_setup,
    check,
    drain,
    read_only,
    scale,
    stop,
    wait_committed,
)
from tests.support.harness import ROOT, Setup, wait_for


def _local_producer(setup: Setup) -> ChaosProducer:
    """Messages arrive until the faults are over (the cap only bounds a runaway test)."""
    return ChaosProducer(setup.topic, scale(20_000, 200_000), chunk=scale(100, 1_000), pause_s=scale(3, 10) / 10)


def _table_directories(setup: Setup) -> list[Path]:
    """Where a commit creates entries: both tables' directories and logs, once the dead-letter table exists."""
    wait_for(lambda: Path(setup.dead_letter_uri, "_delta_log").is_dir(), 60, "the dead-letter table")
    table, letters = Path(setup.table_uri), Path(setup.dead_letter_uri)
    return [table, table / "_delta_log", letters, letters / "_delta_log"]


def _wait_all_committed(setup: Setup, target: int, what: str) -> None:
    """Until rows plus dead letters reach ``target`` messages."""
    wait_for(lambda: len(setup.ids()) + len(setup.dead_letters()) >= target, 180, what)


def test_local_table_read_only_for_a_while(setup_factory, daemon_factory, chaos_result: ChaosResult) -> None:
    setup = chaos_setup(setup_factory, 3, max_messages_per_file=scale(500, 5_000), allowed_latency_s=0.5)
    chaos_result.scenario = "local table directory read-only for a while"
    producer = _local_producer(setup)
    daemon = daemon_factory(setup, env=FAST_GROUP)
    wait_committed(setup)
    directories = _table_directories(setup)
    for _ in range(scale(1, 3)):
        assert producer.running(), "the fault must come while messages still arrive"
        seconds = scale(8, 20)
        with read_only(*directories):
            # Read once no log entry can be created: a commit may land just before the chmod.
            versions = setup.txn_versions()
            chaos_result.fault(f"read-only {seconds} s")
            time.sleep(seconds)
            assert setup.txn_versions() == versions, "nothing can be committed while read-only"
            assert daemon.process.poll() is None, daemon.log()[-3000:]
        _wait_all_committed(setup, producer.produced, "commits after the fault")
    producer.stop()
    stop(daemon)
    retries = daemon.log().count("retrying in")
    assert retries > 0, "the daemon should have retried while the table was read-only"
    chaos_result.notes = f"{retries} retried operations logged"
    drain(daemon_factory, setup)
    chaos_result.verdict = check(setup)


def test_storage_outage_longer_than_the_retry_budget(setup_factory, daemon_factory, chaos_result: ChaosResult) -> None:
    """The table stays unwritable past ``ingest.max_commit_retries``: the daemon exits 1 naming the
    operation (its orchestrator restarts it), holding no offset it did not commit; the restart, once
    storage is back, replays from the Delta log."""
    setup = chaos_setup(setup_factory, 3, max_messages_per_file=scale(500, 5_000), allowed_latency_s=0.5)
    chaos_result.scenario = "local table read-only past the retry budget: exit 1, restart"
    budget = {"K2D_INGEST__MAX_COMMIT_RETRIES": "2"}  # backoff 0.5 s + 1 s, then the daemon gives up
    producer = _local_producer(setup)
    daemon = daemon_factory(setup, env={**FAST_GROUP, **budget})
    wait_committed(setup)
    directories = _table_directories(setup)
    exits: list[int] = []
    operations: list[str] = []
    for _ in range(scale(1, 3)):
        assert producer.running(), "the fault must come while messages still arrive"
        with read_only(*directories):
            versions = setup.txn_versions()  # after the chmod: a commit may land just before it
            chaos_result.fault("read-only until the daemon gives up")
            exits.append(daemon.wait(60))
            assert setup.txn_versions() == versions, "nothing can be committed while read-only"
        log = daemon.log()
        assert exits[-1] == 1, log[-3000:]
        given_up = re.search(r"fatal: (.+?) still failing after 2 retries", log)
        assert given_up, log[-3000:]
        operations.append(given_up.group(1))
        # What an orchestrator does: start it again, now that the storage is back.
        daemon = daemon_factory(setup, env={**FAST_GROUP, **budget})
        chaos_result.fault("daemon restart")
        _wait_all_committed(setup, producer.produced, "commits after the restart")
    # SIGTERM during the outage, the retry budget far from used up: the daemon retries for
    # ingest.retry_after_stop_s more, then exits 1 (without the bound it would retry for minutes: 10 retries).
    stop(daemon)
    daemon = daemon_factory(setup, env={**FAST_GROUP, "K2D_INGEST__RETRY_AFTER_STOP_S": "3"})
    wait_for(lambda: "assigned " in daemon.log(), 120, "the new daemon's assignment")  # its loop and handler run
    assert producer.running(), "the fault must come while messages still arrive"
    with read_only(*directories):
        versions = setup.txn_versions()
        chaos_result.fault("read-only, then SIGTERM while retrying")
        wait_for(lambda: "retrying in" in daemon.log(), 60, "a retried commit")
        stopped = time.monotonic()
        exits.append(daemon.stop(60))
        stop_s = time.monotonic() - stopped
        assert setup.txn_versions() == versions, "nothing can be committed while read-only"
    log = daemon.log()
    assert exits[-1] == 1, log[-3000:]
    assert "still failing 3 s after the stop request (ingest.retry_after_stop_s)" in log, log[-3000:]
    assert stop_s < 20, f"the stop took {stop_s:.1f} s"  # 3 s of retries, one last attempt and the exit
    daemon = daemon_factory(setup, env=FAST_GROUP)
    chaos_result.fault("daemon restart")
    _wait_all_committed(setup, producer.produced, "commits after the restart")
    producer.stop()
    stop(daemon)
    chaos_result.notes = (
        f"daemon exit codes {exits}; gave up on: {'; '.join(operations)}; stopped during the outage in {stop_s:.1f} s"
    )
    drain(daemon_factory, setup)
    chaos_result.verdict = check(setup)


# --- S3 ---------------------------------------------------------------------------------------


class S3Process:
    """The S3 server and its fault proxy in a child process (tests/chaos/s3_server.py)."""

    def __init__(self, bucket: str, log: Path) -> None:
        self._log = open(log, "ab")  # noqa: SIM115 - closed in close()
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tests.chaos.s3_server", bucket],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            cwd=ROOT,
        )
        hello = json.loads(self._readline())
        self.endpoint: str = hello["endpoint"]
        self.proxy: str = hello["proxy"]
        self.options: dict[str, str] = hello["options"]
        self.faults = 0

    def _readline(self) -> str:
        assert self._process.stdout is not None
        line = self._process.stdout.readline()
        assert line, f"the S3 server process exited (code {self._process.poll()})"
        return line

    def command(self, name: str) -> None:
        assert self._process.stdin is not None
        self._process.stdin.write(name + "\n")
        self._process.stdin.flush()
        if name != "quit":
            self.faults = int(json.loads(self._readline())["faults"])

    def close(self) -> None:
        with contextlib.suppress(OSError, AssertionError):
            self.command("quit")
        try:
            self._process.wait(10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._log.close()


@pytest.fixture
def s3(tmp_path: Path) -> Iterator[S3Process]:
    server = S3Process("k2d-chaos", tmp_path / "s3-server.log")
    try:
        yield server
    finally:
        server.close()


@pytest.mark.parametrize("fault", ["server_restart", "errors"])
def test_s3_faults_mid_commit(
    setup_factory, daemon_factory, s3: S3Process, chaos_result: ChaosResult, fault: str
) -> None:
    uri = f"s3://k2d-chaos/{uuid.uuid4().hex[:8]}"
    # Few retries inside delta-rs (object_store), so the faults reach the daemon's own retry loop.
    options = {**s3.options, "AWS_ENDPOINT_URL": s3.proxy, "max_retries": "1", "retry_timeout": "3s"}
    setup = chaos_setup(
        setup_factory,
        3,
        table={"uri": uri},
        sections={"table.storage_options": options},
        max_messages_per_file=scale(500, 5_000),
        allowed_latency_s=0.5,
    )
    chaos_result.scenario = {
        "server_restart": "S3 server stopped and restarted mid-commit",
        "errors": "S3 answering 503 to every request for a while",
    }[fault]
    # Messages arrive until the faults are over (the cap only bounds a runaway test).
    producer = ChaosProducer(setup.topic, scale(20_000, 200_000), chunk=scale(100, 1_000), pause_s=scale(8, 10) / 10)
    daemon = daemon_factory(setup, env=FAST_GROUP)

    def committed() -> int:
        with contextlib.suppress(Exception):
            return _count(uri, s3.options)
        return 0

    wait_for(lambda: committed() > 0, 180, "a first commit on S3")
    for _ in range(scale(1, 4)):
        time.sleep(scale(2, 4))  # commits every ~0.5 s: the fault lands in one
        assert producer.running(), "the fault must come while messages still arrive"
        seconds = scale(5, 10)
        if fault == "server_restart":
            s3.command("stop")
            chaos_result.fault(f"S3 server stopped {seconds} s")
            time.sleep(seconds)
            s3.command("start")
        else:
            s3.command("fail")
            chaos_result.fault(f"S3 503s for {seconds} s")
            time.sleep(seconds)
            s3.command("heal")
        assert daemon.process.poll() is None, daemon.log()[-3000:]
        target = producer.produced
        wait_for(lambda t=target: committed() >= t, 300, "commits after the fault")
    producer.stop()
    stop(daemon, 300)
    retries = daemon.log().count("retrying in")
    chaos_result.notes = f"proxy answered {s3.faults} requests with a fault; {retries} retries logged by the daemon"
    drain(daemon_factory, setup)
    chaos_result.verdict = check(setup, s3.options, table_uri=uri)


def _count(uri: str, options: dict[str, str]) -> int:
    """Rows plus dead letters committed on S3."""
    rows = DeltaTable(uri, storage_options=options).to_pyarrow_dataset().count_rows()
    try:
        letters = DeltaTable(f"{uri}_dead_letters", storage_options=options).to_pyarrow_dataset().count_rows()
    except Exception:
        letters = 0
    return int(rows + letters)


def test_storage_error_right_after_a_landed_commit(tmp_path: Path, chaos_result: ChaosResult) -> None:
    """Storage fails between a commit that landed and the re-read of the log after it: a retryable
    error (it used to escape as a raw OSError and kill the daemon), and the retry finds its own txn
    versions in the log instead of committing again or taking them for another writer's."""
    import pyarrow as pa

    from kafka2delta.errors import RetryableError
    from kafka2delta.offsets import TxnIds
    from kafka2delta.records import OffsetRange, TopicPartition
    from kafka2delta.writer import DeltaWriter

    chaos_result.scenario = "storage error right after a landed commit (in-process)"
    schema = pa.schema([pa.field("id", pa.string(), nullable=False)])
    writer = DeltaWriter.open(str(tmp_path / "t"), {}, TxnIds("app").main, "snappy", 10, schema)
    table = writer._table
    real_update = table.update_incremental
    calls = 0

    def flaky() -> None:
        nonlocal calls
        calls += 1
        if calls == 2:  # 1: the txn check before the commit; 2: the re-read after it
            raise OSError("injected: storage went away right after the commit")
        real_update()

    table.update_incremental = flaky  # type: ignore[method-assign]
    t0 = TopicPartition("t", 0)
    actions = writer.write_files(t0, OffsetRange(0, 1), pa.table({"id": ["a", "b"]}, schema=schema))
    with pytest.raises(RetryableError, match="then reading the log failed"):
        writer.commit(actions, {t0: None}, {t0: 1}, {})
    chaos_result.fault("OSError after the commit")
    assert writer.commit(actions, {t0: None}, {t0: 1}, {}) == 1  # the retry: landed, nothing committed twice
    assert writer.committed_offsets([t0]) == {t0: 1}
    assert sorted(DeltaTable(str(tmp_path / "t")).to_pyarrow_table().column("id").to_pylist()) == ["a", "b"]
