"""TxnVersions: the txn versions the daemon reads before each commit, folded in from new commits only, always equal
to what delta-rs reads from the whole log."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pa_fs
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from kafka2delta.txn_versions import TxnVersions

APP_IDS = [f"app-{p}" for p in range(6)]


def _commit(uri: str, txns: dict[str, int]) -> None:
    properties = CommitProperties(app_transactions=[Transaction(app_id, v) for app_id, v in txns.items()])
    write_deltalake(uri, pa.table({"a": [1]}), mode="append", commit_properties=properties)


def _from_delta_rs(uri: str) -> dict[str, int | None]:
    table = DeltaTable(uri)
    return {app_id: table.transaction_version(app_id) for app_id in APP_IDS}


def test_versions_follow_other_writers_commits_exactly(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    _commit(uri, {"app-0": 0})
    reader = DeltaTable(uri)
    txns = TxnVersions(pa_fs.LocalFileSystem(), uri)
    rng = random.Random(7)
    for step in range(40):
        chosen = rng.sample(APP_IDS, rng.randint(0, 3))
        _commit(uri, {app_id: step * 10 + rng.randint(0, 9) for app_id in chosen})
        if rng.random() < 0.4:  # several commits land between two reads, as with other writers
            reader.update_incremental()
            asked = rng.sample(APP_IDS, rng.randint(1, len(APP_IDS)))
            expected = _from_delta_rs(uri)
            assert txns.read(reader, asked) == {app_id: expected[app_id] for app_id in asked}
            assert txns.version == reader.version()
    reader.update_incremental()
    assert txns.read(reader, APP_IDS) == _from_delta_rs(uri)


def test_a_replaced_table_is_read_again(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    for version in range(3):
        _commit(uri, {"app-1": version})
    txns = TxnVersions(pa_fs.LocalFileSystem(), uri)
    assert txns.read(DeltaTable(uri), ["app-1"]) == {"app-1": 2}
    shutil.rmtree(uri)
    _commit(uri, {"app-2": 5})  # a new table, at version 0
    assert txns.read(DeltaTable(uri), ["app-1", "app-2"]) == {"app-1": None, "app-2": 5}


def test_a_missing_commit_falls_back_to_the_snapshot(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    uri = str(tmp_path / "t")
    _commit(uri, {"app-1": 0})
    reader = DeltaTable(uri)
    txns = TxnVersions(pa_fs.LocalFileSystem(), uri)
    assert txns.read(reader, ["app-1"]) == {"app-1": 0}
    caplog.set_level("INFO", logger="kafka2delta.txn_versions")
    for version in range(1, 4):
        _commit(uri, {"app-1": version, "app-3": version})
    DeltaTable(uri).create_checkpoint()
    (Path(uri) / "_delta_log" / f"{1:020d}.json").unlink()  # cleaned up: the checkpoint holds its txns
    reader.update_incremental()
    assert txns.read(reader, ["app-1", "app-3"]) == {"app-1": 3, "app-3": 3}
    assert txns.version == 3
    assert "commit 1 of" in caplog.text and "is gone" in caplog.text
