"""PostgreSQL → Debezium → kafka2delta changelog tables → ``jobs apply-changes`` (Spark, deletion vectors) →
current-state tables, with the daemon AND the Spark job SIGKILLed while a random workload runs: afterwards each
target equals ``SELECT * FROM`` its source table, row by row and value by value.

The workload of ``test_replication`` (three tables, a snapshot, inserts, updates, deletes, a primary-key change,
an added column). The daemon is killed as there (at its fault points, then from outside); the job applying
``accounts`` runs turn after turn meanwhile (``--available-now``, as a CronJob does): once it kills itself
right after a MERGE committed and before Spark recorded the micro-batch (the restart replays that batch: its
txn version makes it a no-op), once it is SIGKILLed from outside at a random moment. ``lines`` and ``tags`` are
applied meanwhile by the same job code in the test's own Spark session (each CLI turn starts a JVM: two fewer
starts save a minute of the 2 cores). Short form in ``make test`` (1,000 snapshot rows, 2 daemon kills); full
form with ``K2D_CHAOS=full`` (10,000 rows, 8 kills).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dev.connect.connect import ConnectClient, debezium_postgres_config
from dev.postgres.postgres import Database
from kafka2delta.config import load_config
from kafka2delta.coordinator import Coordinator, NoBackend
from kafka2delta.spark.apply_changes import ApplyChangesJob, resolve_options
from tests.support.chaos import ChaosResult
from tests.support.harness import ROOT, Daemon
from tests.support.replication import (
    KEYS,
    KilledDaemon,
    Workload,
    committed,
    compare_tables,
    config_text,
    high_watermarks,
    record_comparisons,
    run_workload,
    wait_for_snapshot,
    wait_quiet,
)

FULL = os.environ.get("K2D_CHAOS") == "full"
SNAPSHOT_ROWS = 10_000 if FULL else 1_000
KILLS = 8 if FULL else 2
OPERATIONS = 6_000 if FULL else 600
FAULTS = ("after_delta_commit:2", "after_parquet_write:2")
JOB_FAULT = "after_apply_merge:1"
"""The job kills itself after its first MERGE committed, before Spark's checkpoint records the micro-batch."""


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from kafka2delta.config import SparkConfig
    from kafka2delta.spark.session import get_session

    conf = {"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false"}
    session = get_session(SparkConfig(master="local[1]"), master=None, conf=conf, app_name="k2d-chaos-apply")
    yield session
    session.stop()


class Jobs:
    """``jobs apply-changes`` runs, each a process of its own, with their reports."""

    def __init__(self, tmp_path: Path, config: Path, prefix: str, env: dict[str, str]) -> None:
        self.tmp_path, self.config, self.prefix, self.env = tmp_path, config, prefix, env
        self.runs = iter(range(1000))
        self.started: list[Daemon] = []
        self.reports: list[dict[str, Any]] = []

    def target(self, name: str) -> str:
        return f"{self.tmp_path}/current/{name}"

    def source(self, name: str) -> str:
        return f"{self.tmp_path}/tables/{self.prefix}.{self.prefix}.{name}"

    def start(self, name: str, fault: str | None = None) -> Daemon:
        source = self.source(name)
        args = [
            sys.executable,
            "-m",
            "kafka2delta",
            "jobs",
            "apply-changes",
            "-c",
            str(self.config),
            "--source",
            source,
            "--target",
            self.target(name),
            "--job-name",
            f"apply-{name}",
            "--available-now",
            "--json",
        ]
        env = {**self.env, "K2D_FAULT_INJECT": fault} if fault else self.env
        job = Daemon(args, env, self.tmp_path / f"job-{name}-{next(self.runs)}.log")
        self.started.append(job)
        return job

    def kill_all(self) -> None:
        """Kill the turns still running (the test's teardown, after a failed assertion)."""
        for job in self.started:
            job.kill_if_running()

    def replays_skipped(self) -> int:
        """Micro-batches found already applied (by their txn version), in every turn's log, killed ones too."""
        logs = "".join(job.log() for job in self.started)
        return logs.count(": already applied (txn ") + logs.count(": Delta skipped the MERGE (txn ")

    def run(self, name: str, timeout: float = 600) -> dict[str, Any]:
        """One turn to its end (exit 0): its report."""
        job = self.start(name)
        status = job.wait(timeout)
        assert status == 0, job.log()[-4000:]
        report: dict[str, Any] = json.loads(next(line for line in job.log().splitlines() if line.startswith("{")))
        self.reports.append(report)
        return report

    def run_here(self, spark: Any, name: str) -> dict[str, Any]:
        """One turn in ``spark`` (this process's session): the CLI's job, under the CLI's job name and checkpoint."""
        config = load_config(self.config, {})
        options = resolve_options(config, source=self.source(name), target=self.target(name))
        job = ApplyChangesJob(
            spark, config, options, Coordinator(NoBackend(), options.target.uri), job_name=f"apply-{name}"
        )
        report: dict[str, Any] = json.loads(job.run(available_now=True).json())
        assert report["status"] == "ok", report
        self.reports.append(report)
        return report


def test_targets_equal_postgres_through_changelogs_apply_changes_and_sigkills(
    postgres: Database,
    kafka_connect: ConnectClient,
    kafka_bootstrap: str,
    tmp_path: Path,
    spark: Any,
    chaos_result: ChaosResult,
    request: pytest.FixtureRequest,
) -> None:
    prefix = f"apl{uuid.uuid4().hex[:8]}"
    workload = Workload(postgres, prefix, seed=20261126)
    workload.snapshot(SNAPSHOT_ROWS)
    tables = [f"{prefix}.{name}" for name in KEYS]
    topics = [f"{prefix}.{name}" for name in tables]
    kafka_connect.add_connector(
        prefix, debezium_postgres_config(postgres, topic_prefix=prefix, tables=tables, converter="json")
    )
    request.addfinalizer(lambda: kafka_connect.delete_connector(prefix))
    config_path = tmp_path / "config.toml"
    text = config_text(tmp_path, kafka_bootstrap, prefix, "json", None, mode="changelog")
    config_path.write_text(text + f'\n[jobs]\ncheckpoint_dir = "{tmp_path}/checkpoints"\ntrigger_interval_s = 1.0\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("K2D_")}
    wait_for_snapshot(kafka_bootstrap, topics)
    daemon = KilledDaemon(config_path, env, tmp_path, operations=OPERATIONS, kills=KILLS, faults=FAULTS, seed=11)
    request.addfinalizer(daemon.kill_all)
    committed(daemon.current)  # the changelog tables exist before the job reads one

    jobs = Jobs(tmp_path, config_path, prefix, env)
    request.addfinalizer(jobs.kill_all)
    workload_done = threading.Event()
    job_failures: list[str] = []
    job_kills = {"fault": 0, "outside": 0}

    def apply_meanwhile() -> None:
        """Turns of the accounts job while the workload runs: one killed at its fault point, one SIGKILLed. The
        micro-batch the fault interrupted runs again in the next turn that gets that far (the victim's or the
        last one's): skipped by its txn version."""
        try:
            killed = jobs.start("accounts", fault=JOB_FAULT)
            killed.wait(600)
            job_kills["fault"] += "fault injection: SIGKILL at after_apply_merge" in killed.log()
            delays = random.Random(13)
            for _ in range(5):  # a SIGKILL counts only if it found the turn's process still running
                victim = jobs.start("accounts")
                time.sleep(delays.uniform(8.0, 20.0))  # Spark is up, somewhere in its turn
                if victim.process.poll() is None:
                    victim.kill()
                    job_kills["outside"] += 1
                    break
                assert victim.wait() == 0, victim.log()[-4000:]  # the turn ended first: try again
            else:
                raise AssertionError("five turns of the job ended before a SIGKILL could find one running")
            while not workload_done.is_set():
                jobs.run("accounts")
        except AssertionError as exc:
            job_failures.append(str(exc))

    applying = threading.Thread(target=apply_meanwhile, daemon=True)
    applying.start()

    run_workload(workload, OPERATIONS, daemon.on_step)
    workload_done.set()  # the job's turn under way ends while the daemon catches up
    wait_quiet(kafka_bootstrap, topics)
    messages = sum(high_watermarks(kafka_bootstrap, topics).values())
    chaos_result.scenario = "apply-changes, PostgreSQL → Debezium → 3 changelog tables → Spark MERGE, SIGKILLs"
    fired = daemon.record_kills(chaos_result)
    # Each crash point was reached (a restart killed from outside before its fault fired would not test it).
    assert sorted(fired) == sorted(daemon.planned_faults), f"fault points that fired: {fired}"
    assert daemon.current.stop() == 0, daemon.current.log()[-3000:]
    final = daemon.start("--until-caught-up")
    assert final.wait(300) == 0, final.log()[-3000:]
    verify = subprocess.run(
        [sys.executable, "-m", "kafka2delta", "verify", "-c", str(config_path)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr  # each change once in its changelog
    here = [name for name in KEYS if name != "accounts"]
    for name in here:
        jobs.run_here(spark, name)  # while the accounts job's turns go on
    applying.join(900)
    assert not applying.is_alive() and not job_failures, job_failures
    chaos_result.fault("job SIGKILL at after_apply_merge", job_kills["fault"])
    chaos_result.fault("job SIGKILL", job_kills["outside"])
    assert job_kills == {"fault": 1, "outside": 1}

    jobs.run("accounts")
    with workload.connect() as conn:
        targets = {name: spark.read.format("delta").load(jobs.target(name)).toArrow() for name in KEYS}
        comparisons = [compare_tables(conn, name, target.to_pylist(), "json") for name, target in targets.items()]
    chaos_result.notes = f"{SNAPSHOT_ROWS:,} snapshot rows per table, {OPERATIONS:,} operations; "
    record_comparisons(chaos_result, comparisons, messages)
    for comparison in comparisons:
        comparison.check()
    replayed = jobs.replays_skipped()
    assert replayed >= 1, [report["details"] for report in jobs.reports]  # the interrupted one changed nothing
    properties = spark.sql(f"SHOW TBLPROPERTIES delta.`{jobs.target('accounts')}`").collect()
    assert {"key": "delta.enableDeletionVectors", "value": "true"} in [row.asDict() for row in properties]
    chaos_result.notes += (
        f"changelogs verified; {len(jobs.started) + len(here)} job turns, {replayed} replayed micro-batch(es) skipped"
    )
    print(
        f"\napply-changes replication: {SNAPSHOT_ROWS} snapshot rows per table, {OPERATIONS} operations, "
        f"{KILLS} daemon kills, 2 job kills (after a MERGE, from outside), {messages} change events, "
        f"{len(jobs.started) + len(here)} job turns ({replayed} replayed micro-batches skipped): every target equals its "
        "PostgreSQL table",
        flush=True,
    )
