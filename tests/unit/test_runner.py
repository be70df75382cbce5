"""The loop with an in-memory Kafka source and a real local Delta table: retries and conflicts."""

from __future__ import annotations

import json
import logging
import threading
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, Field
from deltalake.schema import PrimitiveType
from deltalake.transaction import AddAction
from prometheus_client import generate_latest

from kafka2delta.config import FormatConfig, load_config
from kafka2delta.dead_letters import DeadLetterTable
from kafka2delta.errors import FatalError, RetryableError
from kafka2delta.metrics import Metrics
from kafka2delta.offsets import LogicalOffset, TxnIds
from kafka2delta.pipeline import Pipeline
from kafka2delta.records import ConsumedBatch, DeadLetter, OffsetRange, PartitionMessages, TopicPartition
from kafka2delta.runner import Ingestor
from kafka2delta.serialization import build_deserializer
from kafka2delta.tables import OpenedTable
from kafka2delta.writer import DeltaWriter
from tests.support.runner import SCHEMA, FakeSource, LogSource, RecordingDeadLetters, batch, make

TXN = TxnIds()  # the default: each partition's txn id is <topic>-<partition> ("t-0")
T0, T1 = TopicPartition("t", 0), TopicPartition("t", 1)


def rows_of(ids: list[str]) -> Any:
    return pa.table({"id": ids}, schema=SCHEMA)


class FlakyWriter(DeltaWriter):
    """A real DeltaWriter whose first commit fails with a storage error before anything lands (a subclass, so
    mypy checks every override against the edge)."""

    files_written = 0
    failures_left = 1

    def write_files(self, tp: TopicPartition, offsets: OffsetRange, rows: pa.Table) -> list[AddAction]:
        self.files_written += 1
        return super().write_files(tp, offsets, rows)

    def commit(self, *args: Any, **kwargs: Any) -> int:
        if self.failures_left:
            self.failures_left -= 1
            raise RetryableError("S3 said 503")
        return super().commit(*args, **kwargs)


def test_storage_error_is_retried_without_rewriting_or_rerecording(tmp_path: Path) -> None:
    writer = FlakyWriter.open(str(tmp_path / "t"), {}, TXN.main, "snappy", 10, SCHEMA)
    source = FakeSource([batch(0, 0, 10, bad_every=5), batch(1, 0, 10)], [0, 1], high=10)
    sink = RecordingDeadLetters(tmp_path)
    ingestor, metrics = make(tmp_path, source, writer, sink)
    ingestor.run(until_caught_up=True)

    table = DeltaTable(str(tmp_path / "t"))
    ids = table.to_pyarrow_table().column("id").to_pylist()
    assert len(ids) == len(set(ids)) == 18
    assert table.transaction_version("t-0") == 9 and table.transaction_version("t-1") == 9
    assert sink.offsets() == [(0, 0), (0, 5)]  # recorded once, despite the retry
    assert sink.commits == 1
    assert writer.files_written == 2  # one per partition, reused by the retry
    assert source.group_offsets == [{0: 10, 1: 10}]
    text = generate_latest(metrics.registry).decode()
    assert "kafka2delta_storage_retries_total 1.0" in text
    assert 'kafka2delta_messages_dead_lettered_total{stage="deserialize",topic="t"} 2.0' in text


def make_timed(
    tmp_path: Path, source: FakeSource, writer: Any, sleep: Callable[[float], None], now: list[float], **ingest: str
) -> tuple[Ingestor, Metrics]:
    """The loop of ``make`` on a hand-moved clock (``now[0]``), its backoff sleeping through ``sleep``."""
    return make(tmp_path, source, writer, RecordingDeadLetters(tmp_path), sleep=sleep, clock=lambda: now[0], **ingest)


def test_a_stop_request_bounds_the_retries_of_a_failing_commit(tmp_path: Path) -> None:
    """SIGTERM while storage refuses every commit, in the middle of a 4-s backoff: the retries go on for
    ``ingest.retry_after_stop_s`` more (that backoff cut short), then the daemon gives up naming the key, having
    committed nothing (a restart replays from the log), rather than retrying for minutes past the orchestrator's
    grace period."""
    writer = FlakyWriter.open(str(tmp_path / "t"), {}, TXN.main, "snappy", 10, SCHEMA)
    writer.failures_left = 1_000
    source = FakeSource([batch(0, 0, 10)], [0], high=10)
    now = [100.0]
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        now[0] += seconds
        if len(sleeps) == 5:  # the first second of the fourth backoff (4 s) has passed
            ingestor.request_stop("SIGTERM")

    ingestor, metrics = make_timed(
        tmp_path, source, writer, sleep, now, max_commit_retries="100", retry_after_stop_s="2"
    )
    with pytest.raises(FatalError) as raised:
        ingestor.run(until_caught_up=True)

    assert str(raised.value).startswith(
        "commit (caught_up) still failing 2 s after the stop request (ingest.retry_after_stop_s), giving up"
    )
    # Backoffs of 0.5, 1, 2 and 4 s, slept in slices of 1 s; the stop at 104.5 leaves the fourth 2 s more.
    assert sleeps == [0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert now[0] == 106.5
    assert DeltaTable(str(tmp_path / "t")).transaction_version("t-0") is None
    assert source.group_offsets == []
    assert ingestor.status().state == "failed"
    assert metrics.registry.get_sample_value("kafka2delta_storage_retries_total") == 5


class FailingSource(FakeSource):
    """A source whose consume fails once its batches are served."""

    def consume(self, max_messages: int, timeout: float) -> ConsumedBatch:
        if not self.batches:
            raise RetryableError("broker unreachable")
        return super().consume(max_messages, timeout)


def test_a_stop_while_consume_fails_still_commits_what_is_buffered(tmp_path: Path) -> None:
    """The broker fails after a batch was buffered; a stop during consume's retries ends them at the next try, and
    the shutdown flush commits the buffered batch: consume does not use up the retry time after the stop."""
    writer = DeltaWriter.open(str(tmp_path / "t"), {}, TXN.main, "snappy", 10, SCHEMA)
    source = FailingSource([batch(0, 0, 10)], [0], high=1_000)
    now = [100.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds
        ingestor.request_stop("SIGTERM")

    ingestor, _ = make_timed(tmp_path, source, writer, sleep, now, retry_after_stop_s="0")
    ingestor.run()

    assert DeltaTable(str(tmp_path / "t")).transaction_version("t-0") == 9
    assert ingestor.status().state == "stopped"


def test_conflict_drops_the_moved_partition_and_commits_the_other(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    ours = DeltaWriter.open(uri, {}, TXN.main, "snappy", 10, SCHEMA)
    other = DeltaWriter.open(uri, {}, TXN.main, "snappy", 10, SCHEMA)

    class RacingSource(FakeSource):
        def consume(self, max_messages: int, timeout: float) -> ConsumedBatch:
            served = super().consume(max_messages, timeout)
            if served.partitions:
                # Another writer (a zombie's rival) commits partition 0 up to offset 4 meanwhile.
                files = other.write_files(T0, OffsetRange(0, 4), rows_of(["theirs"]))
                other.commit(files, {T0: None}, {T0: 4}, {})
            return served

    both = batch(0, 0, 5)
    both.partitions.update(batch(1, 0, 5).partitions)
    source = RacingSource([both], [0, 1], high=5)
    ingestor, metrics = make(tmp_path, source, ours, RecordingDeadLetters(tmp_path))
    ingestor.run(until_caught_up=True)

    table = DeltaTable(uri)
    assert sorted(table.to_pyarrow_table().column("id").to_pylist()) == [
        "p1-0",
        "p1-1",
        "p1-2",
        "p1-3",
        "p1-4",
        "theirs",
    ]
    assert table.transaction_version("t-0") == 4 and table.transaction_version("t-1") == 4
    assert (0, 5) in source.seeks  # resynced to the table's version + 1
    assert (
        f'kafka2delta_commit_conflicts_total{{partition="0",table="{uri}",topic="t"}} 1.0'
        in generate_latest(metrics.registry).decode()
    )


def test_messages_fetched_before_a_resync_are_not_taken(tmp_path: Path) -> None:
    """A conflict mid-batch seeks back; the rest of the batch is stale and must leave no gap."""
    uri = str(tmp_path / "t")

    class RacedWriter(FlakyWriter):
        def commit(self, *args: Any, **kwargs: Any) -> int:
            if self.failures_left:  # just before our first commit, a rival commits offsets 0..2
                self.failures_left = 0
                rows = rows_of([f"m{o}" for o in range(3)])
                rival.commit(rival.write_files(T0, OffsetRange(0, 2), rows), {T0: None}, {T0: 2}, {})
            return super().commit(*args, **kwargs)

    ours = RacedWriter.open(uri, {}, TXN.main, "snappy", 10, SCHEMA)
    rival = DeltaWriter.open(uri, {}, TXN.main, "snappy", 10, SCHEMA)
    log = [json.dumps({"id": f"m{o}"}).encode() for o in range(20)]

    source = LogSource(log)
    ingestor, _ = make(tmp_path, source, ours, RecordingDeadLetters(tmp_path), max_messages_per_file="5")
    ingestor.run(until_caught_up=True)

    table = DeltaTable(uri)
    ids = sorted(table.to_pyarrow_table().column("id").to_pylist(), key=lambda i: int(i[1:]))
    assert ids == [f"m{o}" for o in range(20)]  # no gap, no duplicate
    assert table.transaction_version("t-0") == 19
    assert source.seeks == [(0, 3)]


def test_dead_letters_recorded_before_a_crash_are_final_and_the_window_is_completed(tmp_path: Path) -> None:
    """A crash left dead letters 6 and 8 recorded (dead-letter txn 9) but the main table at 4. Since
    then the config changed: 6 and 8 would now be rows, 7 would now be a dead letter."""
    uri = str(tmp_path / "t")
    writer = DeltaWriter.open(uri, {}, TXN.main, "snappy", 10, SCHEMA)
    writer.commit(writer.write_files(T0, OffsetRange(0, 4), rows_of(["m0"])), {T0: None}, {T0: 4}, {})
    sink = RecordingDeadLetters(tmp_path)
    sink.table.commit(
        {T0: [DeadLetter("t", 0, o, "coerce", "old reason", b"{}") for o in (6, 8)]}, {T0: None}, {T0: 9}, {}
    )

    log = [json.dumps({"id": f"m{o}"}).encode() for o in range(10)]
    log[7] = b"{broken"
    source = LogSource(log)
    ingestor, metrics = make(tmp_path, source, writer, sink)
    ingestor.run(until_caught_up=True)

    table = DeltaTable(uri)
    assert sorted(table.to_pyarrow_table().column("id").to_pylist()) == ["m0", "m5", "m9"]
    assert table.transaction_version("t-0") == 9
    assert sink.offsets() == [(0, 6), (0, 7), (0, 8)]  # 7 recorded inside the old window, 6 and 8 not twice
    assert sink.table.committed_offsets([T0]) == {T0: 9}
    text = generate_latest(metrics.registry).decode()
    assert 'kafka2delta_messages_skipped_total{partition="0",reason="dead_letter_recorded",topic="t"} 2.0' in text


def counted(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def broken_at_7() -> list[bytes]:
    """Offsets 0..9 of ``t``-0, ``{"id": "m<offset>"}``; 7 is broken JSON (a dead letter, stage deserialize)."""
    log = [json.dumps({"id": f"m{o}"}).encode() for o in range(10)]
    log[7] = b"{broken"
    return log


def assert_7_counted_once_as_a_skip(metrics: Metrics, ingestor: Ingestor, rows: int) -> None:
    """7 was recorded by our dead-letter commit, then our main commit failed: the replay takes it as final. It is
    one skip, not also a dead letter (found by review: counted when the dead-letter commit landed, then skipped)."""
    dead = "kafka2delta_messages_dead_lettered_total"
    assert counted(metrics, dead, topic="t", stage="deserialize") is None
    skipped = "kafka2delta_messages_skipped_total"
    assert counted(metrics, skipped, topic="t", partition="0", reason="dead_letter_recorded") == 1
    assert (
        counted(metrics, "kafka2delta_rows_written_total", topic="t", partition="0", table=ingestor.status().table_uri)
        == rows
    )
    assert dict(ingestor.status().dead_letters_by_stage) == {}  # the status page counts it as our metrics do


def test_a_dead_letter_recorded_before_a_main_commit_conflict_is_counted_once(tmp_path: Path) -> None:
    """Our dead-letter commit records 7, then our main commit conflicts (a rival committed 0..2 meanwhile)."""
    uri = str(tmp_path / "t")

    class RacedWriter(FlakyWriter):
        def commit(self, *args: Any, **kwargs: Any) -> int:
            if self.failures_left:  # after our dead-letter commit, before our first main commit
                self.failures_left = 0
                rows = rows_of([f"m{o}" for o in range(3)])
                rival.commit(rival.write_files(T0, OffsetRange(0, 2), rows), {T0: None}, {T0: 2}, {})
            return super().commit(*args, **kwargs)

    ours = RacedWriter.open(uri, {}, TXN.main, "snappy", 10, SCHEMA)
    rival = DeltaWriter.open(uri, {}, TXN.main, "snappy", 10, SCHEMA)

    sink = RecordingDeadLetters(tmp_path)
    ingestor, metrics = make(tmp_path, LogSource(broken_at_7()), ours, sink)
    ingestor.run(until_caught_up=True)

    ids = DeltaTable(uri).to_pyarrow_table().column("id").to_pylist()
    assert sorted(ids, key=lambda i: int(i[1:])) == [f"m{o}" for o in range(10) if o != 7]
    assert sink.offsets() == [(0, 7)] and sink.commits == 1
    assert_7_counted_once_as_a_skip(metrics, ingestor, rows=6)  # 3..9 but 7: 0..2 are the rival's


def test_a_dead_letter_recorded_before_a_zombies_dead_letter_commit_is_counted_once(tmp_path: Path) -> None:
    """Our dead-letter commit records 7, then a zombie's moves the dead-letter txn (committer's check before the
    main commit): we resync."""
    uri = str(tmp_path / "t")
    writer = DeltaWriter.open(uri, {}, TXN.main, "snappy", 10, SCHEMA)
    writer.commit(writer.write_files(T0, OffsetRange(0, 4), rows_of(["m0"])), {T0: None}, {T0: 4}, {})
    zombie = DeadLetterTable.open(str(tmp_path / "dlq"), {}, TXN.prefix, "snappy", 10)

    class RacedDeadLetters(RecordingDeadLetters):
        def commit(self, *args: Any, **kwargs: Any) -> int:
            version = super().commit(*args, **kwargs)
            if self.commits == 1:
                zombie.commit({T0: [DeadLetter("t", 0, 11, "coerce", "zombie", b"{}")]}, {T0: 9}, {T0: 11}, {})
            return version

    sink = RacedDeadLetters(tmp_path)
    ingestor, metrics = make(tmp_path, LogSource(broken_at_7()), writer, sink)
    ingestor.run(until_caught_up=True)

    ids = DeltaTable(uri).to_pyarrow_table().column("id").to_pylist()
    assert sorted(ids) == ["m0", "m5", "m6", "m8", "m9"]
    assert sink.offsets() == [(0, 7), (0, 11)]
    assert counted(metrics, "kafka2delta_commit_conflicts_total", topic="t", partition="0", table=uri) == 1
    assert_7_counted_once_as_a_skip(metrics, ingestor, rows=4)


def test_a_dead_letter_recorded_before_a_schema_change_is_counted_once(tmp_path: Path) -> None:
    """Our dead-letter commit records 7, then someone adds a column before our main commit: we refit and replay."""
    uri = str(tmp_path / "t")

    class AlteredWriter(FlakyWriter):
        def commit(self, *args: Any, **kwargs: Any) -> int:
            if self.failures_left:
                self.failures_left = 0
                DeltaTable(uri).alter.add_columns([Field("x", PrimitiveType("string"), nullable=True)])
            return super().commit(*args, **kwargs)

    writer = AlteredWriter.open(uri, {}, TXN.main, "snappy", 10, SCHEMA)

    sink = RecordingDeadLetters(tmp_path)
    ingestor, metrics = make(tmp_path, LogSource(broken_at_7()), writer, sink)
    ingestor.run(until_caught_up=True)

    table = DeltaTable(uri)
    assert "x" in table.schema().to_arrow().names
    assert sorted(table.to_pyarrow_table().column("id").to_pylist()) == sorted(f"m{o}" for o in range(10) if o != 7)
    assert sink.offsets() == [(0, 7)]
    assert counted(metrics, "kafka2delta_schema_changes_total", table=uri) == 1
    assert_7_counted_once_as_a_skip(metrics, ingestor, rows=9)


def test_a_dead_letter_commit_whose_outcome_was_lost_is_counted_once_by_the_retry(tmp_path: Path) -> None:
    """Inside an older window (dead-letter txn 9, main 4) our dead-letter commit of 7 lands but reports a storage
    error: the retry finds 7 recorded, by itself, and records nothing again; 7 is one dead letter of ours."""
    uri = str(tmp_path / "t")
    writer = DeltaWriter.open(uri, {}, TXN.main, "snappy", 10, SCHEMA)
    writer.commit(writer.write_files(T0, OffsetRange(0, 4), rows_of(["m0"])), {T0: None}, {T0: 4}, {})

    class LostOutcome(RecordingDeadLetters):
        def commit(self, *args: Any, **kwargs: Any) -> int:
            version = super().commit(*args, **kwargs)
            if self.commits == 2:  # ours (the first is the crash's, below)
                raise RetryableError("committed, then reading the log failed")
            return version

    sink = LostOutcome(tmp_path)
    sink.commit({T0: [DeadLetter("t", 0, o, "coerce", "old reason", b"{}") for o in (6, 8)]}, {T0: None}, {T0: 9}, {})
    log = broken_at_7()
    log[6] = log[8] = b"{}"  # now rows; recorded as dead letters before a crash: final
    ingestor, metrics = make(tmp_path, LogSource(log), writer, sink)
    ingestor.run(until_caught_up=True)

    assert sorted(DeltaTable(uri).to_pyarrow_table().column("id").to_pylist()) == ["m0", "m5", "m9"]
    assert sink.offsets() == [(0, 6), (0, 7), (0, 8)]
    assert counted(metrics, "kafka2delta_messages_dead_lettered_total", topic="t", stage="deserialize") == 1
    skipped = "kafka2delta_messages_skipped_total"
    assert counted(metrics, skipped, topic="t", partition="0", reason="dead_letter_recorded") == 2
    assert counted(metrics, "kafka2delta_commit_retries_total", table=uri) == 1
    assert dict(ingestor.status().dead_letters_by_stage) == {"deserialize": 1}


def test_a_resync_inside_a_revoke_callback_neither_takes_stale_messages_nor_loses_fresh_ones(tmp_path: Path) -> None:
    """Someone changes the schema; the revoke callback's flush finds out and resyncs the partition we keep
    (p1). The consume() that ran the callback returns p1 messages fetched before that: not to be taken."""
    uri = str(tmp_path / "t")
    writer = DeltaWriter.open(uri, {}, TXN.main, "snappy", 10, SCHEMA)
    log = {p: [json.dumps({"id": f"p{p}-{o}"}).encode() for o in range(15)] for p in (0, 1)}

    class RevokingSource(FakeSource):
        def __init__(self) -> None:
            super().__init__([], [0, 1], high=15)
            self.position: dict[int, int] = {}
            self.calls = 0

        def start(self, listener: Any) -> None:
            self.listener = listener
            super().start(listener)
            self.position = {p: 0 for p in self.starts}

        def serve(self, partition: int, count: int) -> PartitionMessages:
            first = self.position[partition]
            offsets = list(range(first, min(first + count, 15)))
            self.position[partition] = first + len(offsets)
            return PartitionMessages(
                topic="t",
                partition=partition,
                offsets=offsets,
                payloads=[log[partition][o] for o in offsets],
                timestamps_ms=[0] * len(offsets),
            )

        def consume(self, max_messages: int, timeout: float) -> ConsumedBatch:
            self.calls += 1
            if self.calls == 1:
                return ConsumedBatch(partitions={T0: self.serve(0, 5), T1: self.serve(1, 5)})
            if self.calls == 2:
                stale = self.serve(1, 5)  # p1 5..9, queued before the rebalance op
                DeltaTable(uri).alter.add_columns([Field("x", PrimitiveType("string"), nullable=True)])
                self.listener.revoked([T0])
                return ConsumedBatch(partitions={T1: stale})
            if self.position.get(1, 15) < 15:
                return ConsumedBatch(partitions={T1: self.serve(1, 15)})
            return ConsumedBatch(end_offsets={T1: 15})

        def seek(self, tp: TopicPartition, start: int | LogicalOffset) -> None:
            super().seek(tp, start)
            self.position[tp.partition] = 0 if isinstance(start, LogicalOffset) else start

    source = RevokingSource()
    ingestor, metrics = make(tmp_path, source, writer, RecordingDeadLetters(tmp_path), allowed_latency_s="60")
    ingestor.run(until_caught_up=True)

    table = DeltaTable(uri)
    ids = table.to_pyarrow_table().column("id").to_pylist()
    assert sorted(i for i in ids if i.startswith("p1")) == sorted(f"p1-{o}" for o in range(15))
    assert len(ids) == len(set(ids))
    assert table.transaction_version("t-1") == 14
    assert source.seeks == [(1, LogicalOffset.EARLIEST)]  # p1 had nothing committed: replayed from its start
    assert "kafka2delta_schema_changes_total" in generate_latest(metrics.registry).decode()


def test_a_zombies_dead_letters_for_our_offsets_make_us_resync_not_commit_them_twice(tmp_path: Path) -> None:
    """A zombie (older config) records offset 7 as a dead letter while we hold 5..9 as rows: our main
    commit must not also make 7 a row."""
    uri = str(tmp_path / "t")
    writer = DeltaWriter.open(uri, {}, TXN.main, "snappy", 10, SCHEMA)
    writer.commit(writer.write_files(T0, OffsetRange(0, 4), rows_of(["m0"])), {T0: None}, {T0: 4}, {})
    sink = RecordingDeadLetters(tmp_path)
    zombie = DeadLetterTable.open(str(tmp_path / "dlq"), {}, TXN.prefix, "snappy", 10)
    log = [json.dumps({"id": f"m{o}"}).encode() for o in range(10)]

    class ZombieSource(LogSource):
        def consume(self, max_messages: int, timeout: float) -> ConsumedBatch:
            served = super().consume(max_messages, timeout)
            if served.partitions and not zombie.committed_offsets([T0])[T0]:
                zombie.commit({T0: [DeadLetter("t", 0, 7, "coerce", "zombie", b"{}")]}, {T0: None}, {T0: 9}, {})
            return served

    source = ZombieSource(log)
    ingestor, metrics = make(tmp_path, source, writer, sink)
    ingestor.run(until_caught_up=True)

    table = DeltaTable(uri)
    assert sorted(table.to_pyarrow_table().column("id").to_pylist()) == ["m0", "m5", "m6", "m8", "m9"]
    assert table.transaction_version("t-0") == 9
    assert sink.offsets() == [(0, 7)]
    assert (0, 5) in source.seeks
    assert (
        f'kafka2delta_commit_conflicts_total{{partition="0",table="{uri}",topic="t"}} 1.0'
        in generate_latest(metrics.registry).decode()
    )


def test_a_stop_request_takes_no_lock_and_logs_nothing_and_the_loop_says_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``request_stop`` runs in the SIGTERM handler, which interrupts the loop anywhere: inside the status
    board's lock (taking it again would hang) or halfway through a log line (logging again raises "reentrant
    call" and the stop is lost: seen as a daemon that ignored SIGTERM). The loop says it, flushes and stops."""
    ingestor: Ingestor | None = None

    class StoppedSource(FakeSource):
        def consume(self, max_messages: int, timeout: float) -> ConsumedBatch:
            assert ingestor is not None
            logged = len(caplog.records)
            with ingestor._board._lock, caplog.at_level(logging.DEBUG):  # the signal comes inside the lock
                asking = threading.Thread(target=ingestor.request_stop, args=("SIGTERM",))
                asking.start()
                asking.join(5)
                assert not asking.is_alive(), "request_stop waited for the board's lock"
                assert len(caplog.records) == logged, "request_stop logged"
            return super().consume(max_messages, timeout)

    writer = DeltaWriter.open(str(tmp_path / "t"), {}, TXN.main, "snappy", 10, SCHEMA)
    ingestor, _ = make(
        tmp_path, StoppedSource([batch(0, 0, 10)], [0], high=100), writer, RecordingDeadLetters(tmp_path)
    )
    with caplog.at_level(logging.INFO):
        ingestor.run()
    assert "received SIGTERM: flushing, committing and stopping" in caplog.messages
    assert DeltaTable(str(tmp_path / "t")).transaction_version("t-0") == 9  # the batch in hand was committed
    assert ingestor.status().state == "stopped"


def test_the_status_board_masks_the_configured_secrets_an_error_carries(tmp_path: Path) -> None:
    """object_store's errors carry request URIs; with a SAS token their signature is in the query, re-encoded.
    /readyz (the table's error) and the failure /healthz shows are masked with the config's secrets, as the logs
    are (the Ingestor makes the Redactor itself when the entry point gives it none)."""
    signature = "Zk9v+YmFy/c2VjcmV0LXNpZ25hdHVyZQ=="
    encoded = urllib.parse.quote(signature, safe="")
    config = load_config(
        None,
        environ={
            "K2D_KAFKA__BOOTSTRAP_SERVERS": "unused:1",
            "K2D_KAFKA__TOPIC": "t",
            "K2D_TABLE__URI": str(tmp_path / "t"),
            "K2D_TABLE__STORAGE_OPTIONS__AZURE_STORAGE_SAS_KEY": f"sv=2022-11-02&sp=racwl&sig={encoded}",
            "K2D_INGEST__MAX_COMMIT_RETRIES": "1",
        },
    )
    uri = f"https://a.blob.core.windows.net/c/t/_delta_log/00000000000000000000.json?sig={encoded}&sv=2022-11-02"

    class RefusingWriter(FlakyWriter):
        def commit(self, *args: Any, **kwargs: Any) -> int:
            raise RetryableError(f"PUT {uri}: 403 Forbidden")

    writer = RefusingWriter.open(str(tmp_path / "t"), {}, TXN.main, "snappy", 10, SCHEMA)
    pipeline = Pipeline(build_deserializer(FormatConfig(), None, "t"), SCHEMA)
    ingestor = Ingestor(
        config,
        source=FakeSource([batch(0, 0, 10)], [0], high=10),
        tables=lambda spec: OpenedTable(writer=writer, pipeline=pipeline),
        dead_letters=RecordingDeadLetters(tmp_path),
        metrics=Metrics(),
        sleep=lambda seconds: None,
    )
    with pytest.raises(FatalError) as raised:
        ingestor.run(until_caught_up=True)
    assert encoded in str(raised.value)  # the exception is not the board's: the log redactor masks it

    status = ingestor.status()
    shown = json.dumps(status.to_json())
    assert status.state == "failed" and "sig=***&sv=2022-11-02" in (status.table_error or "")
    assert status.failure is not None and "sig=***" in status.failure and "sig=***" in status.liveness()[1]
    assert encoded not in shown and signature not in shown and "c2VjcmV0LXNpZ25hdHVyZQ" not in shown


class RetainedSource(FakeSource):
    """A partition whose first 90 offsets retention deleted: the low watermark is 90."""

    def watermarks(self, tp: TopicPartition, cached: bool = False) -> tuple[int, int]:
        return 90, self.high


def test_lag_before_the_first_commit_counts_from_where_reading_began(tmp_path: Path) -> None:
    # Nothing committed yet: the lag is what lies between the start (earliest: the low watermark) and the high
    # watermark, not the high watermark itself (that reported 100 here, and NoCommit alerts on an idle topic).
    source = RetainedSource([], [0], high=100)
    writer = DeltaWriter.open(str(tmp_path / "t"), {}, TXN.main, "snappy", 10, SCHEMA)
    ingestor, metrics = make(tmp_path, source, writer, RecordingDeadLetters(tmp_path))
    ingestor.run(until_caught_up=True)
    assert source.starts == {0: LogicalOffset.EARLIEST}
    assert [p.lag for p in ingestor.status().partitions] == [10]
    assert metrics.registry.get_sample_value("kafka2delta_consumer_lag", {"topic": "t", "partition": "0"}) == 10
