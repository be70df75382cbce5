"""Ingestion, mutation, TTL and compaction together on one table: with the coordinator no commit conflicts and the
expected final table; without it the conflicts happen (counted), and replays still keep the table right.

The short run takes K2D_SPARK_CONCURRENCY_S seconds per mode (default 30); ``make spark-soak`` runs it for
several minutes. Ingestion here is a stand-in that commits like the daemon (rows plus the partition's txn in one
delta-rs commit) inside ``coordinator.turn("ingest")``, which is what the daemon will do once runner.py joins
the coordinator; test_compaction.py runs the real daemon next to compaction.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, TopicPartition
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError

from kafka2delta.config import CoordinatorConfig
from kafka2delta.coordinator import Coordinator, NoBackend, open_coordinator
from kafka2delta.spark.errors import ConflictingCommit
from kafka2delta.spark.jobs import StreamingJob
from kafka2delta.spark.maintenance import optimize
from kafka2delta.spark.tables import check_writable
from tests.integration.conftest import Message, Setup, Topic, wait_for
from tests.spark.jobs_support import OLD_TS, SCHEMA, config, delete, event, forget, jobs_section, update

pytestmark = pytest.mark.integration

DURATION_S = float(os.environ.get("K2D_SPARK_CONCURRENCY_S", "30"))
ORDER = ("ingest", "mutate", "ttl", "optimize")
ARROW = pa.schema(
    [
        ("id", pa.string()),
        ("lead_id", pa.string()),
        ("contact_id", pa.string()),
        ("subject_id", pa.string()),
        ("ts", pa.timestamp("us", tz="UTC")),
    ]
)


class Ingester:
    """Consumes the events topic (1 partition) and appends like the daemon: rows + txn ``<app>-0`` in one commit."""

    def __init__(self, topic: Topic, uri: str, app_id: str, coordinator: Coordinator) -> None:
        self.uri, self.txn, self.coordinator = uri, f"{app_id}-0", coordinator
        self.conflicts = self.commits = 0
        version = DeltaTable(uri).transaction_version(self.txn)
        self.committed = -1 if version is None else version
        self.consumer = Consumer(
            {"bootstrap.servers": topic.bootstrap, "group.id": f"g-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False}
        )
        self.consumer.assign([TopicPartition(topic.name, 0, self.committed + 1)])
        self.pending: list[tuple[int, dict[str, Any]]] = []

    def step(self) -> None:
        for message in self.consumer.consume(1000, timeout=0.2):
            if message.error() is None:
                self.pending.append((message.offset(), json.loads(message.value())))
        turn = self.coordinator.turn("ingest")
        if turn is None:
            return
        with turn:
            if not self.pending:
                return
            rows = [dict(r, ts=dt.datetime.fromisoformat(r["ts"].replace("Z", "+00:00"))) for _, r in self.pending]
            last = self.pending[-1][0]
            try:
                write_deltalake(
                    self.uri,
                    pa.Table.from_pylist(rows, ARROW),
                    mode="append",
                    commit_properties=CommitProperties(app_transactions=[Transaction(self.txn, last)]),
                )
            except CommitFailedError:
                self.conflicts += 1
                return
            self.commits += 1
            self.committed = last
            self.pending.clear()

    def close(self) -> None:
        self.consumer.close()


def _run(
    spark: Any,
    tmp_path: Path,
    topic_factory: Callable[[int], Topic],
    setup_factory: Callable[..., Setup],
    coordinated: bool,
    zookeeper_hosts: str,
) -> dict[str, Any]:
    events_topic, mutations, gdpr = topic_factory(1), topic_factory(1), topic_factory(1)
    checkpoints = tmp_path / "checkpoints"
    setup = setup_factory(1, schema=SCHEMA, sections={"jobs": jobs_section(mutations.name, gdpr.name, checkpoints)})
    uri = setup.table_uri
    write_deltalake(uri, ARROW.empty_table(), mode="overwrite")
    cfg = config(setup.config_path)
    resource = f"concurrency-{uuid.uuid4().hex[:8]}"

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
    ingester = Ingester(events_topic, uri, events_topic.name, coordinator())
    jobs = [StreamingJob(spark, cfg, name, coordinator()) for name in ("mutate", "ttl")]
    optimize_stats = {"runs": 0, "conflicts": 0}
    optimizer = coordinator()
    errors: list[BaseException] = []

    def guarded(body: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                body()
            except BaseException as exc:
                errors.append(exc)
                stop.set()

        return run

    def ingest_loop() -> None:
        while not stop.is_set():
            ingester.step()
            time.sleep(1.0)

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
        threading.Thread(target=guarded(ingest_loop)),
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
        wait_for(lambda t=target: ingester.committed >= t or stop.is_set(), 120, f"phase {phase} ingested")
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
    ingester.close()
    for participant in (ingester.coordinator, optimizer, *(job.coordinator for job in jobs)):
        participant.close()
    conflicts = {
        "ingest": ingester.conflicts,
        "mutate": jobs[0].stats.conflicts,
        "ttl": jobs[1].stats.conflicts,
        "optimize": optimize_stats["conflicts"],
    }
    turns = {
        "ingest_commits": ingester.commits,
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
    zookeeper_hosts: str,
) -> None:
    result = _run(spark, tmp_path, topic_factory, setup_factory, True, zookeeper_hosts)
    assert result["total_conflicts"] == 0
    assert result["phases"] >= 2 and min(result["turns"].values()) >= 1


def test_without_the_coordinator_conflicts_happen(
    spark: Any,
    tmp_path: Path,
    topic_factory: Callable[[int], Topic],
    setup_factory: Callable[..., Setup],
    zookeeper_hosts: str,
) -> None:
    result = _run(spark, tmp_path, topic_factory, setup_factory, False, zookeeper_hosts)
    assert result["total_conflicts"] > 0
