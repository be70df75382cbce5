"""The maintain/jobs commands in-process (the session fixture's SparkSession is the active one): a job that
cannot get the coordinator's lock skips its turn and exits 0; a table the daemon could not write is refused."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from kafka2delta.cli import _parser
from kafka2delta.config import load_config
from kafka2delta.coordinator import open_coordinator
from kafka2delta.spark import commands
from kafka2delta.spark.errors import TableNotWritable


def _config(tmp_path: Path, table: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(
        "\n".join(
            [
                "[kafka]",
                'bootstrap_servers = "127.0.0.1:1"',
                'topic = "events"',
                "[table]",
                f"uri = {json.dumps(table)}",
                "[coordinator]",
                'backend = "file"',
                f"lock_dir = {json.dumps(str(tmp_path / 'locks'))}",
                "lock_timeout_s = 0.3",
            ]
        )
    )
    return path


def test_busy_lock_skips_the_turn_with_exit_0(spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    table = str(tmp_path / "table")
    now = dt.datetime.now(dt.UTC)
    write_deltalake(table, pa.table({"a": [1, 2, 3], "ts": pa.array([now] * 3, pa.timestamp("us", tz="UTC"))}))
    config_path = _config(tmp_path, table)
    config = load_config(config_path, {})
    holder = open_coordinator(config.coordinator, table)
    turn = holder.turn("ingest")
    assert turn is not None
    try:
        for argv in (["maintain", "optimize"], ["jobs", "ttl", "--available-now"]):
            args = _parser().parse_args([*argv, "-c", str(config_path), "--json"])
            if argv[0] == "jobs":  # ttl without a topic: retention only
                config = load_config(config_path, {"K2D_JOBS__RETENTION_COLUMN": "ts", "K2D_JOBS__RETENTION_DAYS": "1"})
            assert commands.run(args, config) == 0
            report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
            assert (report["status"], report["reason"]) == ("skipped", "lock busy"), report
    finally:
        turn.release()
        holder.close()
    args = _parser().parse_args(["maintain", "optimize", "-c", str(config_path)])
    assert commands.run(args, load_config(config_path, {})) == 0
    assert capsys.readouterr().out.startswith(f"optimize {table}: ok in ")


def test_a_table_with_deletion_vectors_is_refused(spark: Any, tmp_path: Path) -> None:
    table = str(tmp_path / "dv")
    write_deltalake(table, pa.table({"a": [1, 2, 3]}))
    spark.sql(f"ALTER TABLE delta.`{table}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')").collect()
    config_path = _config(tmp_path, table)
    args = _parser().parse_args(["maintain", "optimize", "-c", str(config_path)])
    with pytest.raises(TableNotWritable, match="deletionVectors"):
        commands.run(args, load_config(config_path, {}))


def _small_files(uri: str, files: int) -> None:
    for n in range(files):
        write_deltalake(uri, pa.table({"a": [n, n + 1]}), mode="append")


def test_maintain_covers_every_table_of_a_routed_config(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``table.uri = lake/{topic}``: maintain finds every table beside the template (not the dead-letter table,
    nor a directory that is no table); ``--table`` takes URIs and globs; one table that fails is reported and
    the others are still done (exit 1)."""
    lake = tmp_path / "lake"
    for name in ("a", "b", "_dead_letters"):
        _small_files(str(lake / name), 3)
    (lake / "notes").mkdir()
    config_path = _config(tmp_path, str(lake / "{topic}"))
    config = load_config(config_path, {"K2D_KAFKA__TOPIC": "", "K2D_KAFKA__TOPICS": "a,b"})

    def maintain(*extra: str) -> tuple[int, dict[str, dict[str, Any]]]:
        args = _parser().parse_args(["maintain", "optimize", "-c", str(config_path), "--json", *extra])
        code = commands.run(args, config)
        reports = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
        return code, {Path(report["table"]).name: report for report in reports}

    code, reports = maintain()
    assert code == 0 and sorted(reports) == ["a", "b"]
    assert {name: (r["status"], r["files_before"], r["files_after"]) for name, r in reports.items()} == {
        "a": ("ok", 3, 1),
        "b": ("ok", 3, 1),
    }

    _small_files(str(lake / "b"), 2)
    code, reports = maintain("--table", str(lake / "b"), "--dead-letters")
    assert code == 0 and sorted(reports) == ["_dead_letters", "b"]
    assert (reports["b"]["files_before"], reports["_dead_letters"]["files_before"]) == (3, 3)

    spark.sql(f"ALTER TABLE delta.`{lake / 'a'}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')").collect()
    _small_files(str(lake / "b"), 2)
    code, reports = maintain("--table", str(lake / "*"))
    assert code == 1
    assert reports["a"]["status"] == "failed" and "deletionVectors" in reports["a"]["reason"]
    assert (reports["b"]["status"], reports["b"]["files_after"]) == ("ok", 1)
    assert "_dead_letters" not in reports and "notes" not in reports
