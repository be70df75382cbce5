"""Metrics, health, the status page and JSON logs of a real daemon on the real broker.

Good and bad messages (each failing stage, empty payloads) go to a 3-partition topic; the daemon, with
``[metrics] port`` set, ingests them. Then ``/metrics`` must count exactly what happened, ``/healthz`` and
``/readyz`` answer 200, ``/status.json`` shows the committed offsets, and the status page, loaded in headless
Chromium (Debian's ``chromium``, installed by ``dev/tools.py`` when missing: a failure to install fails the
test), shows the partitions, the commits and the dead letters; its screenshot is saved under the test's tmp
dir (and copied to ``docs/status-page.png`` when ``K2D_UPDATE_DOCS=1``, to refresh the README's picture).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.harness import Message, Setup, wait_for
from tests.support.observability import ensure_tools, free_port, http_get, scrape, total

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOT_COPY = ROOT / "docs" / "status-page.png"
SCHEMA = {"id": "string not null", "seq": "long", "ts": "timestamp", "day": "date"}
TRANSFORMS = {"day": "substr(ts, `0`, `10`)"}
REGISTRY_PASSWORD = "obs-registry-s3cr3t"
PARTITIONS = 3
GOOD_PER_PARTITION = 300
# Per partition: payload for bad message n, and the stage that fails it (None: skipped as empty).
BAD = {
    "deserialize": (lambda n: b'{"id": "x%d",' % n, 5),
    "transform": (lambda n: b'{"id": "t%d", "ts": 12345}' % n, 3),
    "coerce": (lambda n: b'{"seq": %d, "ts": "2026-11-22T10:00:00Z"}' % n, 4),
    "empty": (lambda n: b"", 2),
}


def chromium_command(chromium: str, profile: Path, *args: str) -> list[str]:
    # No network beyond the page: no sync, no component updates, no QUIC, a fresh profile.
    return [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-extensions",
        f"--user-data-dir={profile}",
        *args,
    ]


def produce_mix(setup: Setup, start: int = 0) -> dict[str, int]:
    """Good and bad messages interleaved on every partition; returns the count of each kind."""
    messages = []
    counts = {"good": 0, **dict.fromkeys(BAD, 0)}
    for partition in range(PARTITIONS):
        bad = [(kind, make(n)) for kind, (make, many) in BAD.items() for n in range(many)]
        for seq in range(start, start + GOOD_PER_PARTITION):
            value = json.dumps({"id": f"p{partition}-{seq}", "seq": seq, "ts": "2026-11-22T10:00:00.5Z"}).encode()
            messages.append(Message(partition, value))
            counts["good"] += 1
            if seq % 20 == 7 and bad:
                kind, payload = bad.pop()
                messages.append(Message(partition, payload))
                counts[kind] += 1
        assert not bad
    setup.topic.produce_messages(messages)
    return counts


def test_metrics_health_status_page_and_json_logs(
    setup_factory: Callable[..., Setup], daemon_factory: Callable[..., Any], tmp_path: Path
) -> None:
    chromium = ensure_tools("chromium")["chromium"]
    port = free_port()
    setup = setup_factory(
        PARTITIONS,
        schema=SCHEMA,
        sections={
            "transforms": TRANSFORMS,
            "metrics": {"port": port, "host": "127.0.0.1"},
            "logging": {"format": "json"},
            "schema_registry": {"username": "ingest", "password": REGISTRY_PASSWORD},
        },
        allowed_latency_s=1.0,
        progress_interval_s=1.0,
    )
    first = produce_mix(setup)
    base = f"http://127.0.0.1:{port}"
    daemon = daemon_factory(setup)
    # A second round once the first is committed: several commits to show, and latency of live traffic.
    wait_for(
        lambda: (
            daemon.process.poll() is not None or total(scrape(base), "kafka2delta_rows_written_total") == first["good"]
        ),
        90,
        "the first round committed",
    )
    second = produce_mix(setup, start=GOOD_PER_PARTITION)
    counts = {kind: first[kind] + second[kind] for kind in first}
    per_partition = counts["good"] // PARTITIONS + 2 * sum(many for _, many in BAD.values())
    failed = {stage: counts[stage] for stage in ("deserialize", "transform", "coerce")}

    def settled() -> bool:
        samples = scrape(base)
        lags = [
            samples.get(("kafka2delta_consumer_lag", (("partition", str(p)), ("topic", setup.topic.name))))
            for p in range(PARTITIONS)
        ]
        return (
            total(samples, "kafka2delta_rows_written_total") == counts["good"]
            and total(samples, "kafka2delta_messages_dead_lettered_total") == sum(failed.values())
            and lags == [0.0] * PARTITIONS
        )

    wait_for(lambda: daemon.process.poll() is not None or settled(), 90, "all rows written and lag 0")
    assert daemon.process.poll() is None, daemon.log()[-3000:]

    # --- /metrics: what happened, counted exactly ----------------------------------------
    samples = scrape(base)
    topic = setup.topic.name
    assert total(samples, "kafka2delta_messages_consumed_total") == PARTITIONS * per_partition
    assert total(samples, "kafka2delta_rows_written_total", topic=topic, partition="1") == 2 * GOOD_PER_PARTITION
    for stage, count in failed.items():
        assert total(samples, "kafka2delta_messages_dead_lettered_total", stage=stage) == count, stage
        assert total(samples, "kafka2delta_messages_failed_total", stage=stage) == count, stage
    assert total(samples, "kafka2delta_messages_skipped_total", reason="empty") == counts["empty"]
    assert total(samples, "kafka2delta_messages_deserialized_total") == (
        PARTITIONS * per_partition - counts["empty"] - counts["deserialize"]
    )
    latency = "kafka2delta_end_to_end_latency_seconds"
    assert total(samples, f"{latency}_count", topic=topic) == counts["good"]  # one observation per row
    assert total(samples, f"{latency}_bucket", topic=topic, le="+Inf") == counts["good"]
    assert total(samples, f"{latency}_bucket", topic=topic, le="120.0") == counts["good"]
    assert 0 < total(samples, f"{latency}_sum", topic=topic) < 120 * counts["good"]
    table = setup.table_uri  # the table label: its route's name, or (here) its URI
    assert total(samples, "kafka2delta_rows_per_commit_sum", table=table) == counts["good"]
    commits = total(samples, "kafka2delta_commits_total", table=table)
    assert commits >= 2 and total(samples, "kafka2delta_commit_duration_seconds_count", table=table) == commits
    assert total(samples, "kafka2delta_flush_duration_seconds_count", table=table) == commits
    files = total(samples, "kafka2delta_files_written_total", table=table)
    assert files >= PARTITIONS and total(samples, "kafka2delta_file_size_bytes_count", table=table) == files
    assert total(samples, "kafka2delta_bytes_written_total", table=table) > 0
    assert total(samples, "kafka2delta_assigned_partitions") == PARTITIONS
    assert total(samples, "kafka2delta_rebalances_total", event="assigned") == PARTITIONS
    assert total(samples, "kafka2delta_buffered_messages") == 0
    assert total(samples, "kafka2delta_last_committed_version") == setup.table().version()
    assert 0 <= total(samples, "kafka2delta_seconds_since_last_commit") < 60
    assert total(samples, "kafka2delta_last_commit_timestamp_seconds") > 1.7e9
    assert total(samples, "kafka2delta_build_info") == 1
    assert total(samples, "kafka2delta_commit_conflicts_total") == 0
    code, content_type, _ = http_get(f"{base}/metrics", accept="application/openmetrics-text; version=1.0.0")
    assert code == 200 and content_type.startswith("application/openmetrics-text")

    # --- health, readiness, status.json --------------------------------------------------
    code, _, body = http_get(f"{base}/healthz")
    assert code == 200, body
    code, _, body = http_get(f"{base}/readyz")
    assert code == 200, body
    code, _, body = http_get(f"{base}/status.json")
    status = json.loads(body)
    assert code == 200 and status["state"] == "running" and status["live"] and status["ready"]
    assert status["topic"] == topic and status["table_uri"] == setup.table_uri
    assert status["dead_letter_table_uri"] == setup.dead_letter_uri
    assert status["table_version"] == setup.table().version()
    assert [(p["partition"], p["committed_offset"], p["lag"]) for p in status["partitions"]] == [
        (p, per_partition - 1, 0) for p in range(PARTITIONS)
    ]
    assert status["dead_letters_by_stage"] == failed
    assert status["commits"] and len(status["commits"]) <= 20
    if len(status["commits"]) < 20:  # all of them: their rows and dead letters add up
        assert sum(c["rows"] for c in status["commits"]) == counts["good"]
        assert sum(c["dead_letters"] for c in status["commits"]) == sum(failed.values())
    last_offsets: dict[int, int] = {}
    for commit in status["commits"]:
        for partition, (_, last) in commit["offsets"].items():
            last_offsets[int(partition)] = max(last, last_offsets.get(int(partition), -1))
    assert last_offsets == dict.fromkeys(range(PARTITIONS), per_partition - 1)

    # --- the status page in headless Chromium --------------------------------------------
    profile = tmp_path / "chromium-profile"
    dom = subprocess.run(
        chromium_command(chromium, profile, "--dump-dom", f"{base}/"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert dom.returncode == 0 and "<html" in dom.stdout, dom.stderr[-3000:]
    page = dom.stdout
    for partition in range(PARTITIONS):
        assert f"<tr><td>{partition}</td><td>{per_partition - 1:,}</td>" in page, page
    assert page.count(f"{topic}[") >= PARTITIONS  # the commit list's offset ranges
    assert f"..{per_partition - 1}" in page  # the last commit of a partition ends at its last offset
    for stage, count in failed.items():
        assert f"<td>{stage}</td><td>{count}</td>" in page, stage
    assert setup.dead_letter_uri in page and ">live<" in page and ">ready<" in page
    screenshot = tmp_path / "status-page.png"
    shot = subprocess.run(
        chromium_command(chromium, profile, f"--screenshot={screenshot}", "--window-size=1200,900", f"{base}/"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shot.returncode == 0 and screenshot.exists(), shot.stderr[-3000:]
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and screenshot.stat().st_size > 10_000
    if os.environ.get("K2D_UPDATE_DOCS") == "1":
        shutil.copyfile(screenshot, SCREENSHOT_COPY)

    # --- a clean stop; JSON log lines with message positions and no secret ---------------
    assert daemon.stop() == 0
    log = daemon.log()
    assert REGISTRY_PASSWORD not in log
    records = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    assert records and len(records) == len([line for line in log.splitlines() if line.strip()]), log[-2000:]
    letters = [r for r in records if r["message"].startswith("dead letter ")]
    assert letters and all({"topic", "partition", "offset"} <= set(r) for r in letters)
    assert all(f"{r['topic']}[{r['partition']}]@{r['offset']}" in r["message"] for r in letters)
    assert any("serving /metrics" in r["message"] for r in records)
