"""Ingestion, mutation, TTL and compaction together on one table: with the coordinator no commit conflicts and the
expected final table; without it the conflicts happen (counted), and replays still keep the table right.

The short run takes K2D_SPARK_CONCURRENCY_S seconds per mode (default 30); ``make spark-soak`` runs it for
several minutes. Ingestion is the real daemon; with the coordinator it joins it (``[coordinator] join_ingest``) and makes
each commit in an ``ingest`` turn, without it its blind appends run free.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from prometheus_client.parser import text_string_to_metric_families

from kafka2delta.config import CoordinatorConfig
from kafka2delta.coordinator import Coordinator, NoBackend, open_coordinator
from kafka2delta.spark.errors import ConflictingCommit
from kafka2delta.spark.jobs import StreamingJob
from kafka2delta.spark.maintenance import optimize
from kafka2delta.spark.tables import check_writable
from tests.support.harness import Daemon, Message, Setup, Topic, wait_for
from tests.support.spark_jobs import OLD_TS, SCHEMA, config, delete, event, forget, jobs_section, update

pytestmark = pytest.mark.integration

DURATION_S = float(os.environ.get("K2D_SPARK_CONCURRENCY_S", "30"))
ORDER = ("ingest", "mutate", "ttl", "optimize")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class DaemonIngest:
    """The real daemon (``kafka2delta ingest``) on the events topic, inside the coordinator when it joins it."""

    def __init__(self, setup: Setup, daemon_factory: Callable[..., Daemon], port: int) -> None:
        self.setup, self.port = setup, port
        self.daemon = daemon_factory(setup)
        wait_for(lambda: DeltaTable.is_deltatable(setup.table_uri), 60, "the daemon to create the table")

    def committed(self) -> int:
        version = self.setup.txn_versions()[0]
        return -1 if version is None else version

    def metrics(self) -> dict[str, float]:
        """Sums per metric family of the daemon's /metrics (read before it stops)."""
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10).read().decode()
        sums: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
        return sums

    def stop(self) -> int:
        assert self.daemon.process.poll() is None, self.daemon.log()[-3000:]
        return self.daemon.stop(120)


def _run(
    spark: Any,
    tmp_path: Path,
    topic_factory: Callable[[int], Topic],
    setup_factory: Callable[..., Setup],
    daemon_factory: Callable[..., Daemon],
    coordinated: bool,
    zookeeper_hosts: str,
) -> dict[str, Any]:
    mutations, gdpr = topic_factory(1), topic_factory(1)
    checkpoints = tmp_path / "checkpoints"
    resource = f"concurrency-{uuid.uuid4().hex[:8]}"
    port = free_port()
    sections: dict[str, dict[str, Any]] = {
        "jobs": jobs_section(mutations.name, gdpr.name, checkpoints),
        "metrics": {"host": "127.0.0.1", "port": port},
    }
    if coordinated:
        sections["coordinator"] = {
            "backend": "zookeeper",
            "hosts": zookeeper_hosts,
            "resource": resource,
            "order": list(ORDER),
            "lock_timeout_s": 2.0,
            "join_ingest": True,
        }
    setup = setup_factory(1, schema=SCHEMA, sections=sections, allowed_latency_s=0.5)
    events_topic, uri = setup.topic, setup.table_uri
    cfg = config(setup.config_path)

    def coordinator() -> Coordinator:
        if not coordinated:
            return Coordinator(NoBackend(), resource)
        return open_coordinator(
            CoordinatorConfig(
                backend="zookeeper", hosts=zookeeper_hosts, resource=resource, order=ORDER, lock_timeout_s=2.0
            ),
            uri,
        )

    stop = threading.Event()
    ingester = DaemonIngest(setup, daemon_factory, port)
    jobs = [StreamingJob(spark, cfg, name, coordinator()) for name in ("mutate", "ttl")]
    optimize_stats = {"runs": 0, "conflicts": 0}
    optimizer = coordinator()
    errors: list[BaseException] = []

    def guarded(body: Callable[..., None]) -> Callable[[], None]:
        def run() -> None:
            try:
                body()
            except BaseException as exc:
                errors.append(exc)
                stop.set()

        return run

    def optimize_loop() -> None:
        session = spark.newSession()
        while not stop.is_set():
            turn = optimizer.turn("optimize")
            if turn is not None:
                try:
                    with turn:
                        optimize(session, uri, target_file_size=1 << 20)
                        optimize_stats["runs"] += 1
                except ConflictingCommit:
                    optimize_stats["conflicts"] += 1
            stop.wait(1.0)

    threads = [
        threading.Thread(target=guarded(optimize_loop)),
        *(threading.Thread(target=guarded(lambda j=j: j.run(stop=stop, interval_s=0.5))) for j in jobs),
    ]
    for thread in threads:
        thread.start()

    # Phases: events for new leads and subjects; once they are committed, requests about them.
    produced: dict[str, dict[str, Any]] = {}
    requests: list[tuple[str, str, str]] = []
    started, phase = time.monotonic(), 0
    while time.monotonic() - started < DURATION_S and not stop.is_set():
        phase_started = time.monotonic()
        batch = [event(f"k{phase}-{i}", f"L{phase}-{i % 4}", f"U{phase}-{i % 3}", old=i % 5 == 4) for i in range(20)]
        events_topic.produce_messages([Message(0, json.dumps(e).encode()) for e in batch])
        produced.update({e["id"]: e for e in batch})
        target = len(produced) - 1
        wait_for(lambda t=target: ingester.committed() >= t or stop.is_set(), 120, f"phase {phase} ingested")
        mutations.produce_messages(
            [
                Message(0, update(f"L{phase}-0", f"C{phase}-0")),
                Message(0, update(f"L{phase}-1", f"C{phase}-1")),
                Message(0, delete(f"L{phase}-2")),
            ]
        )
        gdpr.produce_messages([Message(0, forget(f"U{phase}-0"))])
        stop.wait(max(0.0, 2.0 - (time.monotonic() - phase_started)))  # at most a phase every 2 s
        requests += [("update", f"L{phase}-0", f"C{phase}-0"), ("update", f"L{phase}-1", f"C{phase}-1")]
        requests += [("delete", f"L{phase}-2", ""), ("forget", f"U{phase}-0", "")]
        phase += 1
    stop.set()
    for thread in threads:
        thread.join(300)
    if errors:
        raise errors[0]
    daemon_metrics = ingester.metrics()
    assert ingester.stop() == 0, ingester.daemon.log()[-3000:]
    for participant in (optimizer, *(job.coordinator for job in jobs)):
        participant.close()
    conflicts = {
        # A conflict that moved our txn resyncs; any other failed commit is retried: both are conflicts here.
        "ingest": int(
            daemon_metrics.get("kafka2delta_commit_conflicts_total", 0)
            + daemon_metrics.get("kafka2delta_commit_retries_total", 0)
        ),
        "mutate": jobs[0].stats.conflicts,
        "ttl": jobs[1].stats.conflicts,
        "optimize": optimize_stats["conflicts"],
    }
    turns = {
        "ingest_commits": int(daemon_metrics.get("kafka2delta_commits_total", 0)),
        "ingest_turns_refused": int(daemon_metrics.get("kafka2delta_coordinator_turns_refused_total", 0)),
        "mutate": jobs[0].stats.turns,
        "ttl": jobs[1].stats.turns,
        "optimize": optimize_stats["runs"],
    }
    # Finish what is pending, one job after the other, then compare with the model.
    for name in ("mutate", "ttl"):
        StreamingJob(spark, cfg, name, Coordinator(NoBackend(), resource)).run(available_now=True)
    expected: dict[str, tuple[Any, ...]] = {
        i: (e["lead_id"], None, e["subject_id"]) for i, e in produced.items() if e["ts"] != OLD_TS
    }
    for op, key, value in requests:
        for i, (lead, _contact, subject) in list(expected.items()):
            if op == "update" and lead == key:
                expected[i] = (lead, value, subject)
            elif (op == "delete" and lead == key) or (op == "forget" and subject == key):
                del expected[i]
    table = DeltaTable(uri).to_pyarrow_table(columns=["id", "lead_id", "contact_id", "subject_id"]).to_pylist()
    actual = {r["id"]: (r["lead_id"], r["contact_id"], r["subject_id"]) for r in table}
    check_writable(uri)
    result = {
        "coordinated": coordinated,
        "seconds": round(time.monotonic() - started),
        "phases": phase,
        "events": len(produced),
        "requests": len(requests),
        "conflicts": conflicts,
        "total_conflicts": sum(conflicts.values()),
        "turns": turns,
        "rows": len(actual),
        "duplicates": len(table) - len(actual),
        "equal_to_model": actual == expected,
    }
    print(f"\nconcurrency: {json.dumps(result)}")
    assert len(table) == len(actual), "duplicate rows"
    assert actual == expected
    return result


def test_with_the_coordinator_no_conflicts(
    spark: Any,
    tmp_path: Path,
    topic_factory: Callable[[int], Topic],
    setup_factory: Callable[..., Setup],
    daemon_factory: Callable[..., Daemon],
    zookeeper_hosts: str,
) -> None:
    result = _run(spark, tmp_path, topic_factory, setup_factory, daemon_factory, True, zookeeper_hosts)
    assert result["total_conflicts"] == 0
    assert result["phases"] >= 2
    assert min(v for k, v in result["turns"].items() if k != "ingest_turns_refused") >= 1


def test_without_the_coordinator_conflicts_happen(
    spark: Any,
    tmp_path: Path,
    topic_factory: Callable[[int], Topic],
    setup_factory: Callable[..., Setup],
    daemon_factory: Callable[..., Daemon],
    zookeeper_hosts: str,
) -> None:
    result = _run(spark, tmp_path, topic_factory, setup_factory, daemon_factory, False, zookeeper_hosts)
    assert result["total_conflicts"] > 0
