"""Z-order: a point query on a column with many values reads far fewer files (by the log's min/max stats)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import write_deltalake

from kafka2delta.spark.maintenance import optimize
from kafka2delta.spark.tables import add_actions, check_writable, files_matching, table_stats

FILES, ROWS_PER_FILE = 40, 2500


def _points_scanned(uri: str, points: list[int]) -> float:
    actions = add_actions(uri)
    return sum(files_matching(actions, "customer_id", p) for p in points) / len(points)


def test_zorder_cuts_the_files_a_point_query_scans(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "zorder")
    rng = random.Random(7)
    ids: list[int] = []
    for f in range(FILES):  # arrival order: every file holds customers from the whole range
        batch = [rng.randrange(1_000_000) for _ in range(ROWS_PER_FILE)]
        ids += batch
        write_deltalake(
            uri,
            pa.table(
                {
                    "customer_id": pa.array(batch, pa.int64()),
                    "seq": pa.array(range(f * ROWS_PER_FILE, (f + 1) * ROWS_PER_FILE), pa.int64()),
                }
            ),
            mode="append",
        )
    points = rng.sample(ids, 50)
    before = table_stats(uri)
    scanned_before = _points_scanned(uri, points)

    report = optimize(spark, uri, zorder_by=["customer_id"], target_file_size=before.bytes // FILES)
    after = table_stats(uri)
    scanned_after = _points_scanned(uri, points)
    factor = scanned_before / scanned_after
    print(
        f"\nz-order: {report.text()}\nfiles {before.files} -> {after.files}; a point query on customer_id scans "
        f"{scanned_before:.1f} -> {scanned_after:.2f} files on average over {len(points)} values: {factor:.0f}x fewer"
    )
    assert after.rows == before.rows == FILES * ROWS_PER_FILE
    assert scanned_before > 0.9 * FILES
    assert factor >= 10
    check_writable(uri)
    # deltalake (the daemon's writer) appends to the Z-ordered table.
    write_deltalake(
        uri, pa.table({"customer_id": pa.array([1], pa.int64()), "seq": pa.array([-1], pa.int64())}), mode="append"
    )
    assert table_stats(uri).rows == after.rows + 1
