"""The MERGE predicate of upsert tables: key equality plus the bounds that let delta-rs skip files, and a MERGE
that rewrites only the files holding the batch's keys (real local Delta table)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, write_deltalake

from kafka2delta.changes import DELETE_FLAG, ChangeOptions
from kafka2delta.merging import literal, merge_changes, merge_predicate


def test_the_predicate_bounds_orderable_keys_and_lists_key_partition_values() -> None:
    source = pa.table(
        {
            "id": pa.array([5, 1, 9], pa.int64()),
            "code": ["a", "b'c", "a"],
            "day": [dt.date(2024, 1, 2), dt.date(2024, 1, 1), dt.date(2024, 1, 2)],
            "status": ["new", "done", "new"],
            DELETE_FLAG: [False, False, True],
        }
    )
    predicate = merge_predicate(source, ["id", "code", "day"], ["day", "status"])
    assert predicate == (
        "t.`id` = s.`id` AND t.`code` = s.`code` AND t.`day` = s.`day` AND t.`id` >= 1 AND t.`id` <= 9 AND "
        "t.`day` >= DATE '2024-01-01' AND t.`day` <= DATE '2024-01-02' AND "
        "t.`day` IN (DATE '2024-01-02', DATE '2024-01-01')"
    )
    # A partition column outside the key bounds nothing: a row may move to another of its values (found by review:
    # bounding it by the new value inserted the key a second time).
    assert "status" not in merge_predicate(source, ["id"], ["status"])
    assert literal("it's") == "'it''s'"


def test_a_merge_rewrites_only_the_files_whose_key_range_holds_a_change(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    for start in range(0, 1000, 100):  # ten files of 100 keys each
        rows = pa.table({"id": pa.array(range(start, start + 100), pa.int64()), "v": ["old"] * 100})
        write_deltalake(uri, rows, mode="append")
    changes = pa.table({"id": pa.array([150, 151], pa.int64()), "v": ["new", None], DELETE_FLAG: [False, True]})
    table = DeltaTable(uri)
    metrics = merge_changes(
        table,
        changes,
        ChangeOptions(key=("id",)),
        partition_by=[],
        compression="snappy",
        properties=CommitProperties(),
    )
    assert metrics["num_target_files_removed"] == 1 and metrics["num_target_files_skipped_during_scan"] == 9
    rows = {r["id"]: r["v"] for r in DeltaTable(uri).to_pyarrow_table().to_pylist()}
    assert len(rows) == 999 and rows[150] == "new" and 151 not in rows and rows[152] == "old"


def test_a_soft_delete_without_a_position_keeps_the_rows_and_leaves_a_deleted_row_alone(tmp_path: Path) -> None:
    """Found by review: Debezium's tombstone after a delete event (no position) blanked the row's _source_ts and
    _lsn, and rewrote a row the delete event had already marked."""
    uri = str(tmp_path / "t")
    at = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    target = pa.table(
        {
            "id": pa.array([1, 2], pa.int64()),
            "_op": ["d", "u"],
            "_source_ts": pa.array([at, at], pa.timestamp("us", tz="UTC")),
            "_lsn": pa.array([7, 5], pa.int64()),
            "_deleted": [True, False],
        }
    )
    write_deltalake(uri, target)
    tombstones = target.select(["id"]).append_column("_op", pa.array(["d", "d"]))
    for name in ("_source_ts", "_lsn"):
        tombstones = tombstones.append_column(target.schema.field(name), pa.nulls(2, target.schema.field(name).type))
    tombstones = tombstones.append_column("_deleted", pa.array([True, True])).append_column(
        DELETE_FLAG, pa.array([True, True])
    )
    options = ChangeOptions(key=("id",), delete_mode="soft", change_columns=("op", "source_ts", "lsn"))
    metrics = merge_changes(
        DeltaTable(uri), tombstones, options, partition_by=[], compression="snappy", properties=CommitProperties()
    )
    assert metrics["num_target_rows_updated"] == 1  # row 2 only: row 1 was deleted already
    assert DeltaTable(uri).to_pyarrow_table().sort_by("id").to_pylist() == [
        {"id": 1, "_op": "d", "_source_ts": at, "_lsn": 7, "_deleted": True},
        {"id": 2, "_op": "d", "_source_ts": at, "_lsn": 5, "_deleted": True},
    ]
