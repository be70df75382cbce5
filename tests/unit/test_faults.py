"""The ``inside_merge`` fault point: a SIGKILL between the files of a delta-rs MERGE and its commit, which
happen in one call outside Python."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from kafka2delta import faults
from tests.support.harness import ROOT

MERGES_UNTIL_KILLED = textwrap.dedent(
    """
    import logging, sys
    import pyarrow as pa
    from deltalake import DeltaTable
    from kafka2delta import faults

    logging.basicConfig(level=logging.INFO)
    faults.arm("inside_merge:2")
    for key in range(1, 21):  # a MERGE that commits before the kill (~1 in 6 here) leaves the point armed
        table = DeltaTable(sys.argv[1])
        changes = pa.table({"id": [key, 1000 + key], "v": ["changed", "new"]})
        with faults.watching_files("inside_merge", table.table_uri, table.version() + 1):
            (
                table.merge(changes, "s.id = t.id", source_alias="s", target_alias="t")
                .when_matched_update({"v": "s.v"})
                .when_not_matched_insert({"id": "s.id", "v": "s.v"})
                .execute()
            )
        print("merged key", key, flush=True)
    """
)


@pytest.fixture
def disarmed() -> Iterator[None]:
    yield
    faults._armed, faults._remaining_hits = None, 0


def test_a_merge_is_killed_after_its_file_is_written_and_before_its_commit(tmp_path: Path) -> None:
    # The kill follows the watcher's last look at the log by microseconds; were the thread descheduled between the
    # two while delta-rs commits, the kill would land after the commit: another run then settles it.
    for attempt in range(3):
        table_dir = tmp_path / f"attempt-{attempt}"
        write_deltalake(table_dir, pa.table({"id": list(range(100)), "v": ["old"] * 100}))
        run = subprocess.run(
            [sys.executable, "-c", MERGES_UNTIL_KILLED, str(table_dir)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == -9, run.stdout + run.stderr
        merged = len(run.stdout.splitlines())
        assert merged >= 1, "the first MERGE is not the armed hit"
        line = run.stderr.splitlines()[-1]  # a kill line not followed by its "missed" line
        assert "SIGKILL at inside_merge" in line, run.stderr
        assert f"version {merged + 1} not committed" in line
        table = DeltaTable(table_dir)
        if table.version() == merged + 1:
            continue
        assert table.version() == merged, "the killed MERGE must not have committed"
        written = Path(line.split("(")[1].split(" written")[0])
        assert written.exists() and written.parent == table_dir
        assert not any(written.name in commit.read_text() for commit in (table_dir / "_delta_log").glob("*.json"))
        rows = {row["id"]: row["v"] for row in table.to_pyarrow_table().to_pylist()}
        killed = merged + 1
        assert (rows[merged], rows[1000 + merged], rows[killed], 1000 + killed in rows) == (
            "changed",
            "new",
            "old",
            False,
        )
        return
    pytest.fail("three kills in a row landed after their MERGE's commit")


def test_a_call_that_commits_before_any_file_keeps_the_point_armed(
    tmp_path: Path, disarmed: None, caplog: pytest.LogCaptureFixture
) -> None:
    table_dir = tmp_path / "a table"  # a space: file:// URIs quote it
    (table_dir / "_delta_log").mkdir(parents=True)
    faults.arm("inside_merge:2")
    with faults.watching_files("inside_merge", str(table_dir), 1):  # hit 1 of 2: not watched
        (table_dir / "part-0.parquet").write_bytes(b"written before the armed hit")
    assert faults._remaining_hits == 1
    with faults.watching_files("inside_merge", table_dir.as_uri(), 1):  # the armed hit commits, no new file
        (table_dir / "_delta_log" / f"{1:020d}.json").write_text("{}")
    assert (faults._armed, faults._remaining_hits) == ("inside_merge", 1)
    assert "inside_merge saw no new data file before the call ended; armed again" in caplog.text
    assert "stopped watching" not in caplog.text


def test_object_store_tables_are_not_watched(disarmed: None, caplog: pytest.LogCaptureFixture) -> None:
    faults.arm("inside_merge")
    with faults.watching_files("inside_merge", "s3://bucket/table", 1):
        pass
    assert "watches local tables only, not s3://bucket/table" in caplog.text
