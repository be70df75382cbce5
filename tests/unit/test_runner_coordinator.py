"""The daemon inside the job coordinator ([coordinator] join_ingest): each commit in an ``ingest`` turn, waiting
for its turn in a strict order, giving up a shutdown flush without a gap, and empty turns on a quiet topic."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from deltalake import DeltaTable
from prometheus_client import generate_latest

from kafka2delta.config import FormatConfig, load_config
from kafka2delta.coordinator import Coordinator, FileBackend
from kafka2delta.metrics import Metrics
from kafka2delta.offsets import LogicalOffset, TxnIds
from kafka2delta.pipeline import Pipeline
from kafka2delta.records import ConsumedBatch
from kafka2delta.runner import Ingestor
from kafka2delta.serialization import build_deserializer
from kafka2delta.tables import OpenedTable
from kafka2delta.writer import DeltaWriter
from tests.support.runner import SCHEMA, FakeSource, RecordingDeadLetters, batch

ORDER = ("ingest", "mutate", "optimize")


def coordinator(tmp_path: Path) -> Coordinator:
    return Coordinator(FileBackend(tmp_path / "locks", "table"), "table", order=ORDER, lock_timeout_s=1.0)


def register(tmp_path: Path, job: str) -> None:
    """Another process's job taking and finishing its turn."""
    with coordinator(tmp_path) as other:
        turn = other.turn(job)
        assert turn is not None, other.last_skip
        with turn:
            pass


def ingestor(
    tmp_path: Path,
    source: Any,
    sleep: Any,
    joined: Coordinator,
    clock: Callable[[], float] = time.monotonic,
    max_poll_ms: str = "300000",
) -> tuple[Ingestor, Metrics]:
    config = load_config(
        None,
        environ={
            "K2D_KAFKA__BOOTSTRAP_SERVERS": "unused:1",
            "K2D_KAFKA__TOPIC": "t",
            "K2D_KAFKA__SETTINGS__MAX_POLL_INTERVAL_MS": max_poll_ms,
            "K2D_TABLE__URI": str(tmp_path / "t"),
            "K2D_COORDINATOR__BACKEND": "file",
            "K2D_COORDINATOR__LOCK_DIR": str(tmp_path / "locks"),
            "K2D_COORDINATOR__JOIN_INGEST": "true",
        },
    )
    writer = DeltaWriter.open(str(tmp_path / "t"), {}, TxnIds().main, "snappy", 10, SCHEMA)
    metrics = Metrics()
    pipeline = Pipeline(build_deserializer(FormatConfig(), None, "t"), SCHEMA)
    sink = RecordingDeadLetters(tmp_path)
    daemon = Ingestor(
        config,
        source=source,
        tables=lambda spec: OpenedTable(writer=writer, pipeline=pipeline, coordinator=joined),
        dead_letters=sink,
        metrics=metrics,
        clock=clock,
        sleep=sleep,
    )
    return daemon, metrics


def refused(metrics: Metrics, reason: str) -> float:
    for line in generate_latest(metrics.registry).decode().splitlines():
        if line.startswith("kafka2delta_coordinator_turns_refused_total{") and f'reason="{reason}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_the_commit_waits_for_its_turn_in_the_order_then_registers(tmp_path: Path) -> None:
    register(tmp_path, "mutate")  # optimize must run before the next commit
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 3:
            register(tmp_path, "optimize")

    joined = coordinator(tmp_path)
    source = FakeSource([batch(0, 0, 10), batch(1, 0, 10)], [0, 1], high=10)
    daemon, metrics = ingestor(tmp_path, source, sleep, joined)
    daemon.run(until_caught_up=True)

    table = DeltaTable(str(tmp_path / "t"))
    assert table.to_pyarrow_table().num_rows == 20
    assert table.transaction_version("t-0") == 9 and table.transaction_version("t-1") == 9
    assert len(sleeps) == 3  # refused while optimize had not run, committed right after
    assert refused(metrics, "order") == 3
    last = joined.last()
    assert last is not None and last.job == "ingest" and last.sequence == 3


def test_a_shutdown_without_a_turn_commits_nothing_and_a_restart_takes_everything_once(tmp_path: Path) -> None:
    register(tmp_path, "mutate")  # optimize never runs: the daemon never gets its turn
    daemon: Ingestor | None = None

    def stop_while_waiting(seconds: float) -> None:
        assert daemon is not None
        daemon.request_stop()

    source = FakeSource([batch(0, 0, 10)], [0], high=10)
    daemon, _ = ingestor(tmp_path, source, stop_while_waiting, coordinator(tmp_path))
    daemon.run(until_caught_up=True)

    assert DeltaTable(str(tmp_path / "t")).transaction_version("t-0") is None
    assert (0, LogicalOffset.EARLIEST) in source.seeks  # went back to the committed offset: no later commit skips
    assert source.group_offsets == []

    register(tmp_path, "optimize")
    restarted, _ = ingestor(
        tmp_path, FakeSource([batch(0, 0, 10)], [0], high=10), lambda s: None, coordinator(tmp_path)
    )
    restarted.run(until_caught_up=True)
    ids = DeltaTable(str(tmp_path / "t")).to_pyarrow_table().column("id").to_pylist()
    assert sorted(ids) == sorted(f"p0-{o}" for o in range(10))


class QuietSource(FakeSource):
    """No messages; asks the loop to stop after a few fetches."""

    def __init__(self) -> None:
        super().__init__([], [0], high=0)
        self.fetches = 0
        self.listener: Any = None

    def start(self, listener: Any) -> None:
        self.listener = listener
        super().start(listener)

    def consume(self, max_messages: int, timeout: float) -> ConsumedBatch:
        self.fetches += 1
        if self.fetches == 3:
            self.listener.request_stop()
        return ConsumedBatch()


def test_a_quiet_topic_still_takes_empty_turns_so_the_order_keeps_cycling(tmp_path: Path) -> None:
    register(tmp_path, "optimize")  # ingestion is next
    joined = coordinator(tmp_path)
    daemon, _ = ingestor(tmp_path, QuietSource(), lambda s: None, joined)
    daemon.run()
    last = joined.last()
    assert last is not None and last.job == "ingest"
    assert DeltaTable(str(tmp_path / "t")).version() == 0  # registered, nothing committed


def test_the_wait_for_a_turn_is_bounded_so_the_consumer_stays_in_its_group(tmp_path: Path) -> None:
    register(tmp_path, "mutate")  # optimize never runs
    now = [0.0]
    daemon: Ingestor | None = None
    source = FakeSource([batch(0, 0, 10)], [0], high=10)

    def sleep(seconds: float) -> None:
        now[0] += seconds
        if source.seeks:  # gave the flush up and went back to the committed offset: enough
            assert daemon is not None
            daemon.request_stop()

    joined = coordinator(tmp_path)
    daemon, metrics = ingestor(tmp_path, source, sleep, joined, clock=lambda: now[0], max_poll_ms="2000")
    daemon.run(until_caught_up=True)

    assert source.seeks[0] == (0, LogicalOffset.EARLIEST)
    assert 1.0 <= now[0] < 1.5  # half of max.poll.interval.ms, then no more waiting
    assert DeltaTable(str(tmp_path / "t")).transaction_version("t-0") is None
    assert refused(metrics, "order") >= 5
