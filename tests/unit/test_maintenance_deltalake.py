"""``maintain`` through delta-rs on local tables: what its vacuum deletes and keeps, and what it refuses."""

import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from kafka2delta.errors import ConfigError
from kafka2delta.spark.maintenance_deltalake import optimize, vacuum
from kafka2delta.spark.tables import data_files, referenced_paths, vacuum_skips
from kafka2delta.writer import SPARK_ONLY_PROPERTY


def _table(tmp_path: Path) -> str:
    uri = str(tmp_path / "t")
    for n in range(3):
        write_deltalake(uri, pa.table({"id": [n * 2, n * 2 + 1], "p": ["a", "b"]}), mode="append", partition_by=["p"])
    return uri


def _age(uri: str, hours: float) -> None:
    old = time.time() - hours * 3600
    for root, _, files in os.walk(uri):
        for name in files:
            if "_delta_log" not in root:
                os.utime(os.path.join(root, name), (old, old))


def test_vacuum_deletes_old_orphans_and_keeps_committed_young_and_hidden_files(tmp_path: Path) -> None:
    uri = _table(tmp_path)
    orphans = ["p=a/part-00000-orphan.parquet", "notes.txt", "_change_data/cdc-0.parquet"]  # Spark deletes them too
    hidden = ["p=a/_tmp.parquet", "p=a/.part-0.crc", "nested/_delta_log/0.json", "_q=1/x.parquet"]
    for path in orphans + hidden:
        os.makedirs(os.path.dirname(os.path.join(uri, path)) or uri, exist_ok=True)
        Path(uri, path).write_bytes(b"x")
    _age(uri, 3)
    Path(uri, "p=b/part-00001-young.parquet").write_bytes(b"x")  # an uncommitted file of a live writer: too young
    committed = referenced_paths(uri)

    dry = vacuum(uri, retain_hours=1.5, dry_run=True)
    assert dry.details["would_delete"] == 3 and dry.details["retain_hours"] == "2"  # whole hours, rounded up
    assert all(Path(uri, path).exists() for path in orphans)
    report = vacuum(uri, retain_hours=1.5)
    assert report.status == "ok" and report.details["deleted"] == 3 and report.details["engine"] == "deltalake"
    assert not any(Path(uri, path).exists() for path in orphans)
    assert all(Path(uri, path).exists() for path in hidden) and Path(uri, "p=b/part-00001-young.parquet").exists()
    assert committed <= {f.path for f in data_files(uri)}


def test_vacuum_skips_hidden_names_at_any_depth_but_not_partition_directories_or_change_data() -> None:
    assert vacuum_skips("p=a/.x.crc") and vacuum_skips("a/b/_tmp") and vacuum_skips("_q=1/x.parquet")
    assert not vacuum_skips("_p=1/part-0.parquet", ["_p"]) and not vacuum_skips("_change_data/x.parquet")
    assert not vacuum_skips("p=a/part-0.parquet", ["p"]) and not vacuum_skips("part-0.parquet")


def _rewrite_log(uri: str, version: int, change: Callable[[dict[str, Any]], None]) -> None:
    entry = Path(uri, "_delta_log", f"{version:020d}.json")
    actions = [json.loads(line) for line in entry.read_text().splitlines()]
    for action in actions:
        change(action)
    entry.write_text("".join(json.dumps(action) + "\n" for action in actions))


def test_a_table_that_asks_vacuums_to_check_its_protocol_or_names_files_by_absolute_path_is_left_to_spark(
    tmp_path: Path,
) -> None:
    """Found by review: delta-rs's dry run checks no protocol (its real vacuum would refuse vacuumProtocolCheck),
    and an absolute path in the log escapes both its listing's comparison and the clash check."""
    checked = _table(tmp_path / "c")
    protocol = {"minReaderVersion": 3, "minWriterVersion": 7}
    features = {"readerFeatures": ["vacuumProtocolCheck"], "writerFeatures": ["vacuumProtocolCheck"]}

    def ask(action: dict[str, Any]) -> None:
        if "protocol" in action:
            action["protocol"] = {**protocol, **features}

    _rewrite_log(checked, 0, ask)
    with pytest.raises(ConfigError, match=r"--engine.*vacuumProtocolCheck"):
        vacuum(checked)
    cloned = _table(tmp_path / "a")

    def absolute(action: dict[str, Any]) -> None:
        if "add" in action:
            action["add"]["path"] = f"file://{cloned}/{action['add']['path']}"

    _rewrite_log(cloned, 1, absolute)
    with pytest.raises(ConfigError, match=r"--engine.*absolute path"):
        vacuum(cloned)


def test_spark_only_tables_partition_zorder_columns_and_a_retention_that_is_no_number_are_refused(
    tmp_path: Path,
) -> None:
    uri = _table(tmp_path)
    with pytest.raises(ConfigError, match=r"--zorder-by.*partition column"):
        optimize(uri, zorder_by=["p"])
    with pytest.raises(ConfigError, match=r"--zorder-by.*no top-level column missing"):
        optimize(uri, zorder_by=["missing"])
    with pytest.raises(ConfigError, match="--where"):
        optimize(uri, where="p = 'a'")
    for hours in (math.nan, math.inf, 0.5):
        with pytest.raises(ConfigError, match="--retain-hours"):
            vacuum(uri, retain_hours=hours)
    spark_only = _table(tmp_path / "s")
    # As Spark's CREATE TABLE … TBLPROPERTIES writes it (delta-rs creates no table with a property it does not know).
    first = Path(spark_only, "_delta_log", "00000000000000000000.json")
    actions = [json.loads(line) for line in first.read_text().splitlines()]
    for action in actions:
        if "metaData" in action:
            action["metaData"]["configuration"][SPARK_ONLY_PROPERTY] = "true"
    first.write_text("".join(json.dumps(action) + "\n" for action in actions))
    for run in (lambda: optimize(spark_only), lambda: vacuum(spark_only)):
        with pytest.raises(ConfigError, match=r"--engine.*Spark-only"):
            run()


def test_a_table_partitioned_by_a_column_starting_with_an_underscore_is_vacuumed_and_its_files_counted(
    tmp_path: Path,
) -> None:
    """Its partition directories (``_p=a``) are data, not hidden: the check after the vacuum found every committed
    file missing (the listing skipped them) and the report counted none."""
    uri = str(tmp_path / "t")
    for n in range(2):
        write_deltalake(uri, pa.table({"id": [n], "_p": ["a"]}), mode="append", partition_by=["_p"])
    Path(uri, "_p=a/part-00000-orphan.parquet").write_bytes(b"x")
    _age(uri, 3)
    committed = referenced_paths(uri)
    assert committed and all(path.startswith("_p=a/") for path in committed)

    report = vacuum(uri, retain_hours=2)
    assert report.status == "ok" and report.details["deleted"] == 1 and report.details["bytes_freed"] == 1
    assert report.files_before == 3 and report.files_after == 2
    assert not Path(uri, "_p=a/part-00000-orphan.parquet").exists() and all(Path(uri, p).exists() for p in committed)
