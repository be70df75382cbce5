"""Vacuum removes the Parquet files a killed daemon wrote but never committed, and nothing committed (CLI); on a
partitioned table whose partition values need escaping too."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from kafka2delta.cli import _parser
from kafka2delta.config import load_config
from kafka2delta.errors import ConfigError
from kafka2delta.spark import commands
from kafka2delta.spark.maintenance import vacuum
from kafka2delta.spark.tables import data_files, referenced_paths
from tests.support.chaos import crash_leaving_orphans
from tests.support.harness import Daemon, Setup, assert_exactly_once

pytestmark = pytest.mark.integration


def test_vacuum_deletes_a_killed_daemons_orphans_only(
    spark: Any,
    setup_factory: Callable[..., Setup],
    daemon_factory: Callable[..., Daemon],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The ``maintain vacuum`` command line, run in this process (its session is the suite's: no JVM start of
    its own; ``tests/unit/test_cli.py`` runs the refusals as a process)."""
    setup = setup_factory(2, max_messages_per_file=50)
    # Every file is two hours old: only the retention tells orphans apart by age, so committed files are
    # just as old, and vacuum must keep them because the log references them.
    produced, orphans, committed = crash_leaving_orphans(setup, daemon_factory)

    argv = ["maintain", "vacuum", "-c", str(setup.config_path), "--retain-hours", "1", "--json", "--dead-letters"]
    assert commands.run(_parser().parse_args(argv), load_config(setup.config_path, {})) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert len(lines) == 2, lines
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

    # Too short a retention could delete a live daemon's file before its commit: refused.
    short = _parser().parse_args(["maintain", "vacuum", "-c", str(setup.config_path), "--retain-hours", "0"])
    with pytest.raises(ConfigError, match="--retain-hours"):
        commands.run(short, load_config(setup.config_path, {}))


def test_vacuum_of_a_partitioned_table_compares_log_and_storage_paths_alike(spark: Any, tmp_path: Path) -> None:
    """A partition value with a space and a colon is ``p=a%20b%3Ac`` on storage and ``p=a%2520b%253Ac`` in the
    log: no false "committed files missing", and a removed daemon file is not counted as an orphan."""
    uri = str(tmp_path / "table")
    write_deltalake(uri, pa.table({"p": ["a b:c", "x", "a b:c"], "v": [1, 2, 3]}), partition_by=["p"])
    directory = Path(uri) / "p=a%20b%3Ac"
    assert directory.is_dir()
    committed_file = next(directory.glob("*.parquet"))
    # A daemon file committed (version 1) and removed (version 2) two hours ago: vacuum deletes it, and it is
    # no orphan (an add action of the log names it).
    removed = directory / "events-0-0-9-0123456789ab.zstd.parquet"
    shutil.copy(committed_file, removed)
    old_ms = int((time.time() - 2 * 3600) * 1000)
    log_path = "p=a%2520b%253Ac/" + removed.name
    add = {"path": log_path, "partitionValues": {"p": "a b:c"}, "size": removed.stat().st_size}
    commits = [
        {"add": {**add, "modificationTime": old_ms, "dataChange": True}},
        {"remove": {**add, "deletionTimestamp": old_ms, "dataChange": True, "extendedFileMetadata": True}},
    ]
    for version, action in enumerate(commits, start=1):
        info = {"commitInfo": {"timestamp": old_ms, "operation": "WRITE", "operationParameters": {}}}
        lines = [json.dumps(info), json.dumps(action)]
        (Path(uri) / "_delta_log" / f"{version:020d}.json").write_text("\n".join(lines) + "\n")
    # A killed daemon's file, never committed: the one orphan.
    shutil.copy(committed_file, directory / "events-1-0-9-abcdef012345.zstd.parquet")
    old = time.time() - 2 * 3600
    for f in data_files(uri):
        os.utime(os.path.join(uri, f.path), (old, old))
    report = vacuum(spark, uri, retain_hours=1)
    print(f"\nvacuum: {report.text()}")
    assert report.details["deleted"] == 2 and report.details["orphans"] == 1
    assert report.details["committed_files"] == 2
    committed = referenced_paths(uri)
    assert str(committed_file.relative_to(uri)) in committed  # in storage form
    assert {f.path for f in data_files(uri)} == committed
    assert sorted(DeltaTable(uri).to_pyarrow_table().column("v").to_pylist()) == [1, 2, 3]
