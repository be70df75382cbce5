"""Vacuum removes the Parquet files a killed daemon wrote but never committed, and nothing committed (CLI)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from kafka2delta.spark.tables import data_files, referenced_paths
from tests.integration.conftest import ROOT, Daemon, Setup, assert_exactly_once

pytestmark = pytest.mark.integration


def test_vacuum_deletes_a_killed_daemons_orphans_only(
    setup_factory: Callable[..., Setup], daemon_factory: Callable[..., Daemon]
) -> None:
    setup = setup_factory(2, max_messages_per_file=50)
    produced = setup.topic.produce(100)
    crashed = daemon_factory(setup, env={"K2D_FAULT_INJECT": "after_parquet_write"})
    assert crashed.wait(120) == -9  # SIGKILLed itself after writing Parquet, before committing
    orphans = {f.path for f in data_files(setup.table_uri)} - referenced_paths(setup.table_uri)
    assert orphans, "the crash left no uncommitted file"
    assert daemon_factory(setup, "--until-caught-up").wait(120) == 0  # replays into new files
    committed = referenced_paths(setup.table_uri)
    assert not orphans & committed
    # Every file is two hours old: only the retention tells orphans apart by age, so committed files are
    # just as old, and vacuum must keep them because the log references them.
    old = time.time() - 2 * 3600
    for f in data_files(setup.table_uri):
        os.utime(os.path.join(setup.table_uri, f.path), (old, old))

    env = {k: v for k, v in os.environ.items() if not k.startswith("K2D_")}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kafka2delta",
            "maintain",
            "vacuum",
            "-c",
            str(setup.config_path),
            "--retain-hours",
            "1",
            "--json",
            "--dead-letters",
            "--master",
            "local[1]",
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            "spark.databricks.delta.snapshotPartitions=2",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 2, result.stdout[-3000:] + result.stderr[-3000:]
    report, dead_letters = (json.loads(line) for line in lines)
    assert dead_letters["table"] == setup.dead_letter_uri and dead_letters["status"] == "ok"
    print(f"\nvacuum: {report}")
    assert report["status"] == "ok"
    assert report["details"]["orphans"] == len(orphans)
    assert report["details"]["deleted"] == len(orphans)
    remaining = {f.path for f in data_files(setup.table_uri)}
    assert remaining == committed
    assert_exactly_once(setup, produced)

    # The daemon appends after vacuum.
    produced += setup.topic.produce(20, start=100)
    assert daemon_factory(setup, "--until-caught-up").wait(120) == 0
    assert_exactly_once(setup, produced)

    # Too short a retention could delete a live daemon's file before its commit: refused, exit 2.
    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "kafka2delta",
            "maintain",
            "vacuum",
            "-c",
            str(setup.config_path),
            "--retain-hours",
            "0",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert refused.returncode == 2 and "--retain-hours" in refused.stderr
