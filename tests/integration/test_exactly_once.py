"""20,000 messages over 3 partitions land exactly once, with offsets in the Delta log."""

import itertools
import json
import subprocess
import sys

import pyarrow.parquet as pq

from tests.support.harness import ROOT, assert_exactly_once


def test_20000_messages_over_3_partitions_exactly_once(setup_factory, daemon_factory) -> None:
    setup = setup_factory(3, max_messages_per_file=3000)
    produced = setup.topic.produce(per_partition=20_000 // 3 + 1)
    # Consumed 400 messages at a time, so that a file's rows arrive in many pieces.
    daemon = daemon_factory(setup, "--until-caught-up", env={"K2D_KAFKA__CONSUME_BATCH_SIZE": "400"})
    assert daemon.wait(180) == 0, daemon.log()[-3000:]

    assert_exactly_once(setup, produced)
    per_partition = 20_000 // 3 + 1
    assert setup.txn_versions() == {p: per_partition - 1 for p in range(3)}

    # Every commit records which offsets it holds, and the ranges tile each partition with no gap or overlap.
    covered: dict[str, list[tuple[int, int]]] = {}
    for entry in setup.table().history():
        info = entry.get("kafka2delta")
        if info:
            assert info["app_id"] == setup.app_id and info["topic"] == setup.topic.name
            for partition, (first, last) in info["offsets"].items():
                covered.setdefault(partition, []).append((first, last))
    for ranges in covered.values():
        ranges.sort()
        assert ranges[0][0] == 0 and ranges[-1][1] == per_partition - 1
        assert all(nxt[0] == prev[1] + 1 for prev, nxt in itertools.pairwise(ranges)), ranges
    assert any(len(r) > 1 for r in covered.values())  # max_messages_per_file split the work into several commits

    # Files are named by topic, partition and offset range. Rows are encoded into the next file's row groups as
    # they are buffered, each time ingest.row_group_rows (500 in the suites) have arrived: a full file (3,000
    # rows, in pieces of at most 400) holds several.
    for action in setup.table().get_add_actions(flatten=True).column("path").to_pylist():
        assert str(action).startswith(f"{setup.topic.name}-"), action
    groups = [pq.ParquetFile(path).metadata.num_row_groups for path in setup.table().file_uris()]
    assert max(groups) >= 3, groups

    assert "committed version" in daemon.log()

    status = subprocess.run(
        [sys.executable, "-m", "kafka2delta", "status", "-c", str(setup.config_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert status.returncode == 0, status.stderr
    lines = [line.split() for line in status.stdout.splitlines()[2:]]
    assert [(int(cols[0]), int(cols[2]), int(cols[3]), int(cols[4])) for cols in lines] == [
        (p, per_partition - 1, per_partition, 0) for p in range(3)
    ]
    json.dumps(status.stdout)  # printable
