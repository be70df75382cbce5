"""The checker's comparison, on synthetic topic offsets and table contents."""

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
from deltalake import write_deltalake

from kafka2delta.cli import build_pipeline
from kafka2delta.config import load_config
from kafka2delta.records import PartitionMessages
from kafka2delta.schema import parse_schema
from kafka2delta.verify import Report, TopicOffsets, compare, log_gaps, pipeline_filter


def pairs(*items: tuple[int, int]) -> pa.Table:
    return pa.table(
        {
            "partition": pa.array([p for p, _ in items], pa.int64()),
            "offset": pa.array([o for _, o in items], pa.int64()),
        }
    )


def topic(offsets: dict[int, list[int]], skipped: dict[int, list[int]] | None = None) -> TopicOffsets:
    skipped = skipped or {}
    return TopicOffsets(
        low={p: min(o, default=0) for p, o in offsets.items()},
        high={p: max(o, default=-1) + 1 for p, o in offsets.items()},
        offsets={p: np.array(o, np.int64) for p, o in offsets.items()},
        skipped={p: np.array(skipped.get(p, []), np.int64) for p in offsets},
    )


def test_exactly_once_is_ok() -> None:
    reports = compare(
        topic({0: [0, 1, 2, 3], 1: [0, 1]}, {0: [3]}),
        pairs((0, 0), (0, 2), (1, 0), (1, 1)),
        pairs((0, 1)),
        {0: 3, 1: 1},
    )
    report = Report("t", "/t", "/t_dead_letters", reports)
    assert report.ok and report.lost == report.duplicated == 0
    assert (reports[0].rows, reports[0].dead_letters, reports[0].skipped, reports[0].pending) == (2, 1, 1, 0)
    assert "OK: lost 0, duplicated 0" in report.render()


def test_loss_duplicates_both_and_unexpected_are_found_and_pending_is_not_loss() -> None:
    reports = compare(
        topic({0: list(range(10))}),
        pairs((0, 0), (0, 0), (0, 1), (0, 2), (0, 42)),
        pairs((0, 2), (0, 4), (0, 4)),
        {0: 6},  # offsets 7..9 are not committed yet
    )
    [partition] = reports
    assert partition.missing == [3, 5, 6]
    assert partition.duplicated == [0, 4]
    assert partition.in_both == [2]
    assert partition.unexpected == [42]
    assert partition.pending == 3
    report = Report("t", "/t", "/d", reports)
    assert not report.ok and report.lost == 3 and report.duplicated == 2
    assert "FAILED: lost 3, duplicated 2" in report.render()


def test_nothing_committed_means_everything_pending() -> None:
    [partition] = compare(topic({0: [0, 1]}), pairs(), pairs(), {0: None})
    assert partition.pending == 2 and partition.ok


def test_log_gaps(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    for _ in range(4):
        write_deltalake(uri, pa.table({"a": [1]}), mode="append")
    assert log_gaps(uri, {}) == []
    (tmp_path / "t" / "_delta_log" / "00000000000000000002.json").unlink()
    assert log_gaps(uri, {}) == [2]


def test_offsets_before_the_low_watermark_are_counted_not_flagged_and_dlq_txns_are_reported() -> None:
    offsets = topic({0: [5, 6, 7]})
    [partition] = compare(offsets, pairs((0, 2), (0, 5), (0, 6)), pairs((0, 3), (0, 7)), {0: 7}, {0: 7})
    assert partition.ok and partition.before_low == 2 and partition.unexpected == []
    assert partition.dead_letter_committed == 7
    assert "deleted by retention" in Report("t", "/t", "/d", [partition]).render()


def test_the_failed_summary_names_partitions_and_offsets() -> None:
    reports = compare(
        topic({0: list(range(4)), 1: list(range(3))}), pairs((0, 0), (0, 0), (1, 0)), pairs(), {0: 1, 1: 2}
    )
    report = Report("t", "/t", "/d", reports, table_version=4)
    text = report.render()
    summary = text.splitlines()[-1]
    assert summary.startswith("FAILED: lost 3, duplicated 1")
    assert "missing 0:[1]" in summary and "duplicated 0:[0]" in summary and "missing 1:[1, 2]" in summary
    data = json.loads(report.to_json())
    assert (data["lost"], data["duplicated_total"], data["rows"], data["table_version"]) == (3, 1, 3, 4)
    assert data["partitions"][1]["missing"] == [1, 2]


def test_pipeline_filter_gives_only_the_filtered_offsets(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(
        '[kafka]\nbootstrap_servers = "127.0.0.1:9092"\ntopic = "t"\n'
        f'[table]\nuri = "{tmp_path / "t"}"\nmetadata_columns = ["partition", "offset"]\n'
        '[table.schema]\nid = "string not null"\ntype = "string"\n'
        "[filter]\nexpression = \"type != 'heartbeat'\"\n"
    )
    config = load_config(path, {})
    pipeline = build_pipeline(config, parse_schema(config.create_schema_columns()))
    messages = PartitionMessages(
        "t",
        0,
        [10, 11, 12, 13, 14],
        [b'{"id": "a", "type": "click"}', b'{"id": "b", "type": "heartbeat"}', b"{not json", None, b'{"type": "x"}'],
        [0] * 5,
    )
    assert pipeline_filter(pipeline)(messages) == [11]
