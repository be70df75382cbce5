"""The HTTP endpoints against in-memory snapshots: a hand-fed status board, then a real loop run with an
in-memory Kafka source (its status() snapshot and its metrics)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from prometheus_client import CollectorRegistry, Counter

from kafka2delta.errors import FatalError
from kafka2delta.logs import Redactor
from kafka2delta.offsets import TxnIds
from kafka2delta.records import ConsumedBatch, PartitionMessages, TopicPartition
from kafka2delta.status import CommitRecord, Status, StatusBoard, StatusServer, liveness_window_s, render_page
from kafka2delta.writer import DeltaWriter
from tests.support.runner import SCHEMA, FakeSource, RecordingDeadLetters, make

E0, E1, E2 = (TopicPartition("events", p) for p in range(3))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def board(clock: Clock, topic: str = "events") -> StatusBoard:
    return StatusBoard(
        topic,
        "app",
        "group",
        "s3://user:hunter2-pw@bucket/table",
        "/data/table_dead_letters",
        liveness_window_s(5.0, 0.2),
        clock=clock,
        wall_clock=lambda: 1_800_000_000.0,
    )


def get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], error.read().decode()


@pytest.fixture
def served() -> Iterator[tuple[StatusBoard, Clock, str]]:
    clock = Clock()
    registry = CollectorRegistry()
    Counter("kafka2delta_example", "an example", registry=registry).inc(3)
    status_board = board(clock)
    server = StatusServer("127.0.0.1", 0, registry, status_board.snapshot).start()
    try:
        yield status_board, clock, f"http://127.0.0.1:{server.port}"
    finally:
        server.close()


def test_liveness_window_is_derived_from_latency_and_consume_timeout() -> None:
    assert liveness_window_s(5.0, 0.2) == 60.0
    assert liveness_window_s(60.0, 0.2) == 180.0
    assert liveness_window_s(1.0, 10.0) == 100.0


def test_metrics_endpoint_serves_the_registry(served: tuple[StatusBoard, Clock, str]) -> None:
    _, _, base = served
    code, content_type, body = get(f"{base}/metrics")
    assert code == 200 and content_type.startswith("text/plain")
    assert "kafka2delta_example_total 3.0" in body


def test_healthz_follows_the_loop(served: tuple[StatusBoard, Clock, str]) -> None:
    status_board, clock, base = served
    status_board.set_state("running")
    status_board.loop_turned()
    clock.now += 59
    code, content_type, body = get(f"{base}/healthz")
    assert (code, content_type, json.loads(body)["status"]) == (200, "application/json", "ok")
    clock.now += 2  # 61 s without a turn: over the 60 s window
    code, _, body = get(f"{base}/healthz")
    assert code == 503 and "has not turned for 61 s" in json.loads(body)["reason"]
    status_board.loop_turned()
    assert get(f"{base}/healthz")[0] == 200
    status_board.set_state("failed", "FatalError: boom")
    code, _, body = get(f"{base}/healthz")
    assert code == 503 and "boom" in json.loads(body)["reason"]


def test_an_idle_member_of_the_group_is_ready(served: tuple[StatusBoard, Clock, str]) -> None:
    # More replicas than partitions: a rollout waits for each new pod to be ready, and would stall on this one.
    status_board, _, base = served
    status_board.set_state("running")
    assert get(f"{base}/readyz")[0] == 503  # not in the group yet
    status_board.joined_group()  # an assignment of no partition
    code, _, body = get(f"{base}/readyz")
    assert code == 200 and json.loads(body)["reason"] == "in the consumer group, no partition assigned (idle)"
    status_board.table_unreachable("commit (latency): S3 said 503")
    assert get(f"{base}/readyz")[0] == 503
    status_board.table_reachable()
    status_board.left_group()  # its assignment lost: not ready until the group gives one again
    assert get(f"{base}/readyz")[0] == 503


def test_readyz_needs_partitions_and_a_reachable_table(served: tuple[StatusBoard, Clock, str]) -> None:
    status_board, _, base = served
    code, _, body = get(f"{base}/readyz")
    assert code == 503 and json.loads(body)["reason"] == "no partition assigned"
    status_board.partitions({E0: 9, E1: None}, {E0: 10, E1: 4}, {E0: 0, E1: 4}, {}, 0)
    assert get(f"{base}/readyz")[0] == 200
    status_board.table_unreachable("commit (latency): S3 said 503")
    code, _, body = get(f"{base}/readyz")
    assert code == 503 and "S3 said 503" in json.loads(body)["reason"]
    status_board.table_reachable()
    assert get(f"{base}/readyz")[0] == 200


def feed(status_board: StatusBoard) -> None:
    status_board.set_state("running")
    status_board.partitions({E0: 99, E1: None, E2: 41}, {E0: 100, E1: 7, E2: 50}, {E0: 0, E1: 7, E2: 8}, {E2: 3}, 4096)
    for version in range(1, 26):
        status_board.committed(
            CommitRecord(
                version, 1_800_000_000.0 + version, "latency", {E0: (version * 4, version * 4 + 3)}, 4, 0, 0.1
            ),
            {},
        )
    status_board.committed(
        CommitRecord(26, 1_800_000_100.0, "records", {E0: (96, 99), E2: (30, 41)}, 14, 2, 0.25),
        {"deserialize": 1, "coerce": 1},
    )
    status_board.committed(CommitRecord(27, 1_800_000_200.0, "latency", {E2: (42, 42)}, 0, 1, 0.01), {"coerce": 1})


def test_status_json_has_partitions_commits_and_dead_letters(served: tuple[StatusBoard, Clock, str]) -> None:
    status_board, _, base = served
    feed(status_board)
    code, content_type, body = get(f"{base}/status.json")
    assert (code, content_type) == (200, "application/json")
    data = json.loads(body)
    assert data["table_uri"] == "s3://user:***@bucket/table"  # never a password
    assert data["dead_letter_table_uri"] == "/data/table_dead_letters"
    assert data["table_version"] == 27 and data["state"] == "running" and data["ready"] is True
    partitions = {p["partition"]: p for p in data["partitions"]}
    assert partitions[0]["committed_offset"] == 99 and partitions[0]["lag"] == 0
    assert partitions[0]["last_commit_version"] == 26
    assert partitions[1]["committed_offset"] is None and partitions[1]["lag"] == 7
    assert partitions[2]["lag"] == 8 and partitions[2]["buffered_messages"] == 3
    assert partitions[2]["last_commit_version"] == 27
    assert partitions[1]["last_commit_time"] is None
    assert len(data["commits"]) == 20  # the recent ones only, newest first
    assert [c["version"] for c in data["commits"][:3]] == [27, 26, 25]
    assert data["commits"][1]["offsets"] == {"0": [96, 99], "2": [30, 41]}
    assert data["commits"][1]["rows"] == 14 and data["commits"][1]["dead_letters"] == 2
    assert data["dead_letters_by_stage"] == {"coerce": 2, "deserialize": 1}
    assert data["buffered_messages"] == 3 and data["buffered_bytes"] == 4096


def test_status_page_is_self_contained_and_shows_the_state(served: tuple[StatusBoard, Clock, str]) -> None:
    status_board, _, base = served
    feed(status_board)
    code, content_type, page = get(f"{base}/")
    assert code == 200 and content_type == "text/html; charset=utf-8"
    assert "<script" not in page and "src=" not in page and "http://" not in page and "https://" not in page
    assert "hunter2-pw" not in page
    assert page.count("<tr><td>") >= 3 + 20 + 2  # partitions, commits, stages
    assert "events[0]@96..99<br>events[2]@30..41" in page
    assert "<td>deserialize</td><td>1</td>" in page and "<td>coerce</td><td>2</td>" in page
    assert "/data/table_dead_letters" in page and "2027-01-15" in page  # a commit time, UTC
    assert get(f"{base}/nowhere")[0] == 404


def test_the_page_escapes_what_it_shows() -> None:
    clock = Clock()
    status_board = board(clock, topic="<b>t</b>")
    status_board.partitions({E0: 1}, {}, {}, {}, 0)
    page = render_page(status_board.snapshot())
    assert "<b>t</b>" not in page and "&lt;b&gt;t&lt;/b&gt;" in page


def test_a_port_in_use_is_a_fatal_error_naming_the_key() -> None:
    clock = Clock()
    first = StatusServer("127.0.0.1", 0, CollectorRegistry(), board(clock).snapshot)
    try:
        with pytest.raises(FatalError, match=r"metrics\.port"):
            StatusServer("127.0.0.1", first.port, CollectorRegistry(), board(clock).snapshot)
    finally:
        first.close()


class TimedSource(FakeSource):
    """FakeSource whose messages carry Kafka timestamps 2 s in the past."""

    def consume(self, max_messages: int, timeout: float) -> ConsumedBatch:
        consumed = super().consume(max_messages, timeout)
        stamp = int(time.time() * 1000) - 2000
        for messages in consumed.partitions.values():
            messages.timestamps_ms = [stamp] * len(messages)
        return consumed


def timed_batch(partition: int, first: int, payloads: list[bytes]) -> ConsumedBatch:
    offsets = list(range(first, first + len(payloads)))
    return ConsumedBatch(
        partitions={
            TopicPartition("t", partition): PartitionMessages(
                topic="t",
                partition=partition,
                offsets=offsets,
                payloads=list(payloads),
                timestamps_ms=[0] * len(payloads),
            )
        }
    )


def sample(metrics: Any, name: str, **labels: str) -> float | None:
    value: float | None = metrics.registry.get_sample_value(name, labels)
    return value


def test_a_loop_run_feeds_the_snapshot_and_the_metrics(tmp_path: Path) -> None:
    good = [json.dumps({"id": f"m{i}"}).encode() for i in range(8)]
    p0 = [*good[:3], b"{broken", b"", *good[3:5]]  # offsets 0..6: 5 rows, 1 dead letter, 1 empty
    p1 = [good[5], b'{"id": null}', good[6], good[7]]  # offsets 0..3: 3 rows, 1 coerce dead letter
    source = TimedSource([timed_batch(0, 0, p0), timed_batch(1, 0, p1)], [0, 1], high=7)
    writer = DeltaWriter.open(str(tmp_path / "t"), {}, TxnIds().main, "snappy", 10, SCHEMA)
    ingestor, metrics = make(tmp_path, source, writer, RecordingDeadLetters(tmp_path))
    ingestor.run(until_caught_up=True)

    status: Status = ingestor.status()
    assert status.state == "stopped" and status.table_error is None
    assert status.table_uri == str(tmp_path / "t") and status.dead_letter_table_uri.endswith("dlq")
    by_partition = {p.partition: p for p in status.partitions}
    assert by_partition[0].committed_offset == 6 and by_partition[0].lag == 0
    assert by_partition[1].committed_offset == 3 and by_partition[1].lag == 3  # high 7, 4 taken
    assert status.commits and status.commits[0].rows == 8 and status.commits[0].dead_letters == 2
    assert dict(status.commits[0].offsets) == {TopicPartition("t", 0): (0, 6), TopicPartition("t", 1): (0, 3)}
    assert dict(status.dead_letters_by_stage) == {"coerce": 1, "deserialize": 1}
    assert status.readiness()[0] is False  # stopped

    assert sample(metrics, "kafka2delta_messages_consumed_total", topic="t", partition="0") == 7
    assert sample(metrics, "kafka2delta_messages_deserialized_total", topic="t") == 9  # 11 - 1 empty - 1 broken
    assert sample(metrics, "kafka2delta_messages_failed_total", topic="t", stage="deserialize") == 1
    assert sample(metrics, "kafka2delta_messages_failed_total", topic="t", stage="coerce") == 1
    assert sample(metrics, "kafka2delta_messages_dead_lettered_total", topic="t", stage="coerce") == 1
    table = str(tmp_path / "t")
    assert sample(metrics, "kafka2delta_rows_written_total", topic="t", partition="1", table=table) == 3
    assert sample(metrics, "kafka2delta_rows_per_commit_sum", table=table) == 8
    assert sample(metrics, "kafka2delta_end_to_end_latency_seconds_count", topic="t", table=table) == 8
    assert sample(metrics, "kafka2delta_end_to_end_latency_seconds_bucket", topic="t", table=table, le="1.0") == 0
    assert sample(metrics, "kafka2delta_end_to_end_latency_seconds_bucket", topic="t", table=table, le="5.0") == 8
    assert sample(metrics, "kafka2delta_consumer_lag", topic="t", partition="1") == 3
    assert sample(metrics, "kafka2delta_last_committed_version", table=table) == status.table_version
    assert sample(metrics, "kafka2delta_file_size_bytes_count", table=table) == 2
    assert sample(metrics, "kafka2delta_buffered_bytes") == 0


def test_every_text_the_board_serves_is_redacted() -> None:
    """The board's redact (the log redactor, in the daemon) masks what /readyz, /healthz, /status.json and the
    page show: a table error or failure carrying a SAS signature, and any name or URI that holds a secret."""
    signature = "Zk9v+YmFy/c2VjcmV0LXNpZ25hdHVyZQ=="
    encoded = quote(signature, safe="")
    clock = Clock()
    status_board = StatusBoard(
        "events",
        "app",
        "group",
        f"az://c/t?sig={encoded}",
        "/data/table_dead_letters",
        liveness_window_s(5.0, 0.2),
        clock=clock,
        redact=Redactor([f"sv=2022-11-02&sig={encoded}", "hunter2-pw"]),
    )
    status_board.partitions({E0: 9}, {E0: 10}, {E0: 0}, {}, 0, {E0: "hunter2-pw-table"})
    status_board.table_opened("hunter2-pw-table", f"az://c/t?sig={signature}", 3)
    offsets = {TopicPartition("hunter2-pw", 0): (0, 9)}
    status_board.committed(CommitRecord(4, 1_800_000_000.0, "hunter2-pw", offsets, 10, 0, 0.1, "hunter2-pw"), {})
    status_board.table_unreachable(f"commit (latency): PUT https://a.blob.core.windows.net/c/t?sig={encoded}&sv=1")
    server = StatusServer("127.0.0.1", 0, CollectorRegistry(), status_board.snapshot).start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        code, _, body = get(f"{base}/readyz")
        assert code == 503 and "?sig=***&sv=1" in json.loads(body)["reason"]
        status_board.set_state("failed", f"FatalError: GET /c?sig={signature} refused")
        code, _, body = get(f"{base}/healthz")
        assert code == 503 and json.loads(body)["reason"] == "the loop failed: FatalError: GET /c?sig=*** refused"
        shown = [get(f"{base}{path}")[2] for path in ("/readyz", "/healthz", "/status.json", "/")]
    finally:
        server.close()
    for text in shown:
        assert "c2VjcmV0LXNpZ25hdHVyZQ" not in text and "hunter2" not in text, text
    data = json.loads(shown[2])
    assert data["table_uri"] == "az://c/t?sig=***" and data["tables"][0]["name"] == "***-table"
    assert data["commits"][0]["topics"] == {"***": {"0": [0, 9]}} and data["commits"][0]["reason"] == "***"
