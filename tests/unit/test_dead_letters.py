"""The dead-letter table on local storage: its schema, its own txns, and the window read after a crash."""

import base64
import json
from pathlib import Path

import pytest
from deltalake import DeltaTable, Field
from deltalake.schema import PrimitiveType

from kafka2delta.dead_letters import DEAD_LETTER_SCHEMA, DeadLetterTable
from kafka2delta.errors import CommitConflict, RetryableError
from kafka2delta.offsets import TxnIds
from kafka2delta.records import DeadLetter, Stage, TopicPartition, payload_json

P0, P1 = TopicPartition("events", 0), TopicPartition("events", 1)


def letter(partition: int, offset: int, stage: Stage = "deserialize") -> DeadLetter:
    payload = b'{"id": %d' % offset
    return DeadLetter("events", partition, offset, stage, "broken", payload, b"k", 1_700_000_000_123, None)


def open_table(tmp_path: Path) -> DeadLetterTable:
    return DeadLetterTable.open(str(tmp_path / "dlq"), {}, TxnIds("app").prefix, "snappy", 10)


def test_commit_records_rows_and_txns(tmp_path: Path) -> None:
    table = open_table(tmp_path)
    assert table.committed_offsets([P0, P1]) == {P0: None, P1: None}
    table.commit({P0: [letter(0, 3), letter(0, 7, "coerce")]}, {P0: None}, {P0: 9}, {"topic": "events"})
    delta = DeltaTable(str(tmp_path / "dlq"))
    assert delta.metadata().partition_columns == ["date"]
    assert delta.transaction_version("app-dlq-0") == 9
    rows = sorted(delta.to_pyarrow_table().to_pylist(), key=lambda r: r["offset"])
    assert [(r["partition"], r["offset"], r["stage"], r["error"]) for r in rows] == [
        (0, 3, "deserialize", "broken"),
        (0, 7, "coerce", "broken"),
    ]
    assert base64.b64decode(rows[0]["key_base64"]) == b"k"
    assert base64.b64decode(rows[0]["payload_base64"]) == b'{"id": 3'
    assert rows[0]["timestamp"].timestamp() == 1_700_000_000.123
    assert rows[0]["date"] == rows[0]["ingested_at"].date()
    assert [f.name for f in DEAD_LETTER_SCHEMA] == delta.schema().to_arrow().names


def test_recorded_offsets_reads_only_the_window(tmp_path: Path) -> None:
    table = open_table(tmp_path)
    table.commit({P0: [letter(0, 3)], P1: [letter(1, 4)]}, {P0: None, P1: None}, {P0: 5, P1: 5}, {})
    table.commit({P0: [letter(0, 8), letter(0, 9)]}, {P0: 5}, {P0: 12}, {})
    assert table.recorded_offsets(P0, 5, 12) == {8, 9}
    assert table.recorded_offsets(P0, None, 12) == {3, 8, 9}
    assert table.recorded_offsets(P1, 3, 5) == {4}
    assert table.recorded_offsets(P0, 9, 12) == set()


def test_a_zombie_cannot_record_the_same_range_twice(tmp_path: Path) -> None:
    first, zombie = open_table(tmp_path), open_table(tmp_path)
    first.commit({P0: [letter(0, 1)]}, {P0: None}, {P0: 5}, {})
    with pytest.raises(CommitConflict):
        zombie.commit({P0: [letter(0, 1)]}, {P0: None}, {P0: 5}, {})
    assert len(DeltaTable(str(tmp_path / "dlq")).to_pyarrow_table()) == 1


def test_payload_json_prefers_the_document_and_falls_back_to_the_payload() -> None:
    assert payload_json(b"\x00\x01", {"a": b"\x01", "n": 1}) == json.dumps({"a": "AQ==", "n": 1}, separators=(",", ":"))
    assert payload_json(b'{"a": 1}') == '{"a": 1}'
    assert payload_json(b"[1, 2]") == "[1, 2]"
    assert payload_json(b"{broken") is None
    assert payload_json(b'"\xff"') is None


def test_an_altered_dead_letter_table_is_written_into_while_our_columns_remain(tmp_path: Path) -> None:
    table = open_table(tmp_path)
    table.commit({P0: [letter(0, 1)]}, {P0: None}, {P0: 1}, {})
    DeltaTable(str(tmp_path / "dlq")).alter.add_columns([Field("triaged_by", PrimitiveType("string"), nullable=True)])
    table.commit({P0: [letter(0, 2)]}, {P0: 1}, {P0: 2}, {})
    rows = DeltaTable(str(tmp_path / "dlq")).to_pyarrow_table().to_pylist()
    assert sorted(r["offset"] for r in rows) == [1, 2] and all(r["triaged_by"] is None for r in rows)


def test_apps_sharing_a_dead_letter_table_do_not_see_each_others_letters(tmp_path: Path) -> None:
    ours = open_table(tmp_path)
    theirs = DeadLetterTable.open(str(tmp_path / "dlq"), {}, TxnIds("other-app").prefix, "snappy", 10)
    theirs.commit({P0: [letter(0, 3)]}, {P0: None}, {P0: 5}, {})
    ours.commit({P0: [letter(0, 4)]}, {P0: None}, {P0: 5}, {})
    assert ours.recorded_offsets(P0, None, 5) == {4}
    assert theirs.recorded_offsets(P0, None, 5) == {3}
    apps = {r["offset"]: r["app_id"] for r in DeltaTable(str(tmp_path / "dlq")).to_pyarrow_table().to_pylist()}
    assert apps == {3: "other-app", 4: "app"}


def test_a_failed_commit_replaying_an_older_window_beside_a_moving_partition_is_retried(tmp_path: Path) -> None:
    """Found by review: P0 records inside its older window (its txn stays 7), P1 moves 0 → 9; a transient error
    read as "landed for P0 only" (the log holds 7, both ours and expected) stopped the daemon instead of retrying."""
    table = open_table(tmp_path)
    table.commit({P0: [letter(0, 4)], P1: []}, {P0: None, P1: None}, {P0: 7, P1: 0}, {})
    delta = table._writer._table

    def reset(*args: object, **kwargs: object) -> None:
        raise OSError("connection reset")

    delta.create_write_transaction = reset  # type: ignore[method-assign]
    with pytest.raises(RetryableError, match="failed commit"):
        table.commit({P0: [letter(0, 5)], P1: [letter(1, 3)]}, {P0: 7, P1: 0}, {P0: 7, P1: 9}, {})
    assert table.committed_offsets([P0, P1]) == {P0: 7, P1: 0}
