"""``verify`` of an upsert table tells what later commits not made by the daemon (``jobs ttl``, ``jobs mutate``, anyone's
DELETE or UPDATE) did to its keys from the daemon's faults."""

import datetime as dt
import json
from functools import partial
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import CommitProperties, DeltaTable, write_deltalake

from kafka2delta.cli import build_pipeline
from kafka2delta.config import Config
from kafka2delta.records import TopicPartition
from kafka2delta.verify import check
from kafka2delta.verify_changes import ChangesReport, _unique
from kafka2delta.verify_later_changes import KeyCommit, _typed
from tests.support.debezium import SourceTable, change_batch, change_config, field
from tests.support.runner import TopicsSource, ingest_until_caught_up
from tests.support.verify_consumer import serve_topics

P0 = TopicPartition("cdc", 0)
DAEMON = CommitProperties(custom_metadata={"kafka2delta": {"operation": "merge"}})
"""A commit marked as the daemon's: what a fault of the daemon itself would commit."""


def _ingested(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, changes: list[tuple[int, str]]) -> Config:
    """An upsert table (key ``id``, column ``name``) the daemon wrote from ``changes``, in that order; the topic
    served to the checker."""
    config = change_config(tmp_path, "upsert", K2D_TABLE__SCHEMA=json.dumps({"id": "long", "name": "string"}))
    records = [(f'{{"id": {i}}}'.encode(), json.dumps({"id": i, "name": n}).encode()) for i, n in changes]
    ingest_until_caught_up(config, TopicsSource([change_batch(P0, 0, records)], {P0: len(records)}))
    serve_topics(monkeypatch, {"cdc": {0: [(i, value, key) for i, (key, value) in enumerate(records)]}})
    return config


def _check(config: Config) -> ChangesReport:
    [report] = check(config, None, partial(build_pipeline, config))
    assert isinstance(report, ChangesReport)
    return report


def test_keys_later_jobs_deleted_or_changed_are_counted_not_faults_until_vacuum_removes_their_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _ingested(tmp_path, monkeypatch, [(1, "a"), (2, "b"), (3, "c"), (2, "b2"), (4, "d"), (5, "e")])
    table = DeltaTable(str(tmp_path / "table"))
    table.delete("id = 3")  # a GDPR delete, as jobs ttl makes
    deleting = table.version()
    table.update(updates={"name": "'masked'"}, predicate="id = 1")  # a jobs mutate UPDATE
    masking = table.version()
    table.update(updates={"name": "'x'"}, predicate="id = 4")
    table.delete("id = 4")  # changed, then deleted
    deleting_changed = table.version()
    table.optimize.compact()  # rewrites every row: deletes and changes none
    report = _check(config)
    assert report.ok, report.render()
    assert (report.missing, report.different) == ([], [])
    assert (report.deleted_later, report.changed_later) == ([3, 4], [1])
    assert report.later_commits == {
        deleting: KeyCommit("DELETE", 1),
        masking: KeyCommit("UPDATE", 1),
        deleting_changed: KeyCommit("DELETE", 1),
    }
    text = report.render()
    assert f"the commits not made by the daemon that left them so: v{deleting} DELETE 1, v{masking} UPDATE 1" in text
    assert "(matched by value: a key looked for has no value unique to its change" in text
    assert text.splitlines()[-1] == (
        "  OK: the table holds the last change of each key, and nothing else (deleted later 2, changed later 1)"
    )
    data = json.loads(report.to_json())
    assert data["ok"] and data["deleted_later_keys"] == ["3", "4"] and data["changed_later_keys"] == ["1"]
    assert data["later_commits"][str(deleting)] == {"operation": "DELETE", "keys": 1}

    # Beside them, the daemon's own faults still fail the check.
    table.delete("id = 2", commit_properties=DAEMON)
    table.update(updates={"name": "'zzz'"}, predicate="id = 5", commit_properties=DAEMON)
    report = _check(config)
    assert not report.ok and report.missing == [2] and [k for k, _ in report.different] == [5]
    assert report.deleted_later == [3, 4] and report.changed_later == [1]
    assert report.render().splitlines()[-1] == "  FAILED: missing 1, different 1 (deleted later 2, changed later 1)"

    # Once VACUUM has removed the files a job's commit removed, what it did cannot be told from a loss.
    table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    report = _check(config)
    assert not report.ok and 3 in report.missing and 3 not in report.deleted_later
    assert report.later_unreadable[deleting] == "its files were vacuumed"
    assert f"what v{deleting} deleted or changed cannot be told from faults (its files were vacuumed)" in (
        report.render()
    )


def test_a_job_that_deleted_an_earlier_row_of_the_key_does_not_explain_a_lost_last_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The row a job took out must be the one the key's last change left, not any row of the key."""
    config = _ingested(tmp_path, monkeypatch, [(1, "a"), (2, "b")])
    table = DeltaTable(str(tmp_path / "table"))
    earlier = table.to_pyarrow_table().filter(pc.field("id") == 1)
    write_deltalake(table, earlier.set_column(1, "name", pa.array(["an earlier a"])), mode="append")
    table.delete("name = 'an earlier a'")  # a job deleting a row of key 1 that is not its last change
    table.delete("id = 1", commit_properties=DAEMON)  # the daemon losing the last change
    report = _check(config)
    assert not report.ok and report.missing == [1] and report.deleted_later == [], report.render()
    assert report.render().splitlines()[-1] == "  FAILED: missing 1"


def test_a_key_a_job_deleted_and_the_daemon_wrote_again_is_checked_as_any_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A later change of a key a job deleted is the key's last change: the daemon must have written it."""
    config = _ingested(tmp_path, monkeypatch, [(1, "a")])
    table = DeltaTable(str(tmp_path / "table"))
    table.delete("id = 1")
    assert _check(config).deleted_later == [1]
    records = [(b'{"id": 1}', b'{"id": 1, "name": "a"}'), (b'{"id": 1}', b'{"id": 1, "name": "a2"}')]
    ingest_until_caught_up(config, TopicsSource([change_batch(P0, 1, records[1:])], {P0: 2}))
    serve_topics(monkeypatch, {"cdc": {0: [(i, value, key) for i, (key, value) in enumerate(records)]}})
    report = _check(config)
    assert report.ok and report.deleted_later == [], report.render()
    DeltaTable(str(tmp_path / "table")).update(updates={"name": "'zzz'"}, predicate="id = 1", commit_properties=DAEMON)
    report = _check(config)
    assert not report.ok and [k for k, _ in report.different] == [1] and report.changed_later == []


@pytest.mark.parametrize("kind", ["long", "timestamp"])
def test_a_partitioned_tables_keys_are_read_with_their_partition_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    config = change_config(
        tmp_path,
        "upsert",
        K2D_TABLE__SCHEMA=json.dumps({"id": "long", "name": "string", "region": kind}),
        K2D_TABLE__PARTITION_BY="region",
    )
    regions = [i % 2 if kind == "long" else f"2024-05-0{1 + i % 2}T10:20:30Z" for i in (1, 2, 3)]
    records = [
        (f'{{"id": {i}}}'.encode(), json.dumps({"id": i, "name": "n", "region": r}).encode())
        for i, r in zip((1, 2, 3), regions, strict=True)
    ]
    ingest_until_caught_up(config, TopicsSource([change_batch(P0, 0, records)], {P0: len(records)}))
    serve_topics(monkeypatch, {"cdc": {0: [(i, value, key) for i, (key, value) in enumerate(records)]}})
    table = DeltaTable(str(tmp_path / "table"))
    assert table.metadata().partition_columns == ["region"]
    table.update(updates={"name": "'masked'"}, predicate="id = 3")
    table.delete("id = 2")
    report = _check(config)
    assert report.ok and report.deleted_later == [2] and report.changed_later == [3], report.render()


def test_a_job_that_kept_one_of_two_rows_of_a_key_explains_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The table held the key twice (the daemon's fault: a stale row beside the last change); a job deleting the last
    change's row left the stale one. Which row a commit kept cannot be told from two: not a change of the job's."""
    config = _ingested(tmp_path, monkeypatch, [(1, "a"), (2, "b")])
    table = DeltaTable(str(tmp_path / "table"))
    stale = table.to_pyarrow_table().filter(pc.field("id") == 1)
    write_deltalake(table, stale.set_column(1, "name", pa.array(["old"])), mode="append", commit_properties=DAEMON)
    table.optimize.compact()  # both rows of key 1 in one file
    table.delete("name = 'a'")
    report = _check(config)
    assert not report.ok and [k for k, _ in report.different] == [1] and report.changed_later == [], report.render()


def test_with_the_offset_column_a_key_whose_last_change_repeats_a_deleted_row_is_not_matched_by_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = change_config(
        tmp_path,
        "upsert",
        K2D_TABLE__SCHEMA=json.dumps({"id": "long", "name": "string"}),
        K2D_TABLE__METADATA_COLUMNS="partition,offset",
    )
    records = [(b'{"id": 1}', b'{"id": 1, "name": "a"}')]
    ingest_until_caught_up(config, TopicsSource([change_batch(P0, 0, records)], {P0: 1}))
    DeltaTable(str(tmp_path / "table")).delete("id = 1")  # a job
    records += [(b'{"id": 1}', b'{"id": 1, "name": "b"}'), (b'{"id": 1}', b'{"id": 1, "name": "a"}')]
    ingest_until_caught_up(config, TopicsSource([change_batch(P0, 1, records[1:])], {P0: 3}))
    serve_topics(monkeypatch, {"cdc": {0: [(i, value, key) for i, (key, value) in enumerate(records)]}})
    assert _check(config).ok
    DeltaTable(str(tmp_path / "table")).delete("id = 1", commit_properties=DAEMON)  # the daemon losing it
    report = _check(config)
    assert not report.ok and report.missing == [1] and report.deleted_later == [], report.render()
    assert "matched by value" not in report.render()


ITEMS = SourceTable("items", [field("id", "int64", optional=False), field("name", "string")], ["id"])


def _soft_debezium(tmp_path: Path) -> Config:
    return change_config(
        tmp_path,
        "upsert",
        K2D_FORMAT__ENVELOPE="debezium",
        K2D_TABLE__DELETE_MODE="soft",
        K2D_TABLE__CHANGE_COLUMNS="op,source_ts,lsn",
        K2D_TABLE__SCHEMA_EVOLUTION="merge",  # the table from the Connect schema
    )


def test_soft_deletes_earlier_tombstone_a_job_purged_does_not_explain_a_lost_last_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tombstones keep the row's data: they are told apart by the change columns the delete sets (its _lsn)."""
    config = _soft_debezium(tmp_path)
    records = [
        ITEMS.event("c", {"id": 1, "name": "a"}, lsn=10),
        ITEMS.event("d", {"id": 1, "name": "a"}, lsn=20),
        ITEMS.event("c", {"id": 1, "name": "b"}, lsn=30),
        ITEMS.event("d", {"id": 1, "name": "b"}, lsn=40),
    ]
    ingest_until_caught_up(config, TopicsSource([change_batch(P0, 0, records[:2])], {P0: 2}))
    DeltaTable(str(tmp_path / "table")).delete("id = 1")  # a job purging the tombstone
    ingest_until_caught_up(config, TopicsSource([change_batch(P0, 2, records[2:])], {P0: 4}))
    serve_topics(monkeypatch, {"cdc": {0: [(i, value, key) for i, (key, value) in enumerate(records)]}})
    assert _check(config).ok
    DeltaTable(str(tmp_path / "table")).delete("id = 1", commit_properties=DAEMON)  # the daemon losing the tombstone
    report = _check(config)
    assert not report.ok and report.missing == [1] and report.deleted_later == [], report.render()


@pytest.mark.parametrize(
    ("debezium_tombstone", "kept"),
    [(False, (0, 2)), (True, (0, 3))],
    ids=["the delete event kept", "only Debezium's tombstone kept"],
)
def test_a_tombstone_a_job_purged_after_compaction_took_its_upsert_has_no_row_to_mark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, debezium_tombstone: bool, kept: tuple[int, ...]
) -> None:
    """Found by review: the expected tombstone, made from the delete alone (the topic compacted the upsert away), has
    none of the data the table's tombstone kept; with Debezium's tombstone after the delete, compaction keeps that
    (no value) and drops the delete event: the expected row has no _lsn, the table's tombstone kept the delete's.
    Either way the key has no upsert read and no row (a job purged it): nothing to mark, no fault."""
    config = _soft_debezium(tmp_path)
    records: list[tuple[bytes, bytes | None]] = [
        ITEMS.event("c", {"id": 2, "name": "b"}, lsn=10),
        ITEMS.event("c", {"id": 1, "name": "a"}, lsn=20),
        ITEMS.event("d", {"id": 1, "name": "a"}, lsn=30),
    ]
    if debezium_tombstone:
        records.append((ITEMS.key_bytes({"id": 1}), None))
    ingest_until_caught_up(config, TopicsSource([change_batch(P0, 0, records)], {P0: len(records)}))
    DeltaTable(str(tmp_path / "table")).delete("id = 1")  # jobs ttl purging the tombstone
    served = [(i, value, key) for i, (key, value) in enumerate(records) if i in kept]  # what compaction left
    serve_topics(monkeypatch, {"cdc": {0: served}}, compacted=True)
    report = _check(config)
    assert report.ok and report.unmarked == [1] and report.deleted_later == [], report.render()


def test_soft_tombstones_without_change_columns_are_told_apart_by_their_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by review: with no _lsn, a purged earlier tombstone (its data a) does not explain a lost last one (b)."""
    schema = json.dumps({"id": "long", "name": "string"})
    config = change_config(tmp_path, "upsert", K2D_TABLE__SCHEMA=schema, K2D_TABLE__DELETE_MODE="soft")
    records: list[tuple[bytes, bytes | None]] = [
        (b'{"id": 1}', b'{"id": 1, "name": "a"}'),
        (b'{"id": 1}', None),
        (b'{"id": 1}', b'{"id": 1, "name": "b"}'),
        (b'{"id": 1}', None),
    ]
    for first in range(4):  # a flush each: each tombstone keeps its upsert's data
        ingest_until_caught_up(
            config, TopicsSource([change_batch(P0, first, records[first : first + 1])], {P0: first + 1})
        )
        if first == 1:
            DeltaTable(str(tmp_path / "table")).delete("id = 1")  # a job purging the first tombstone
    serve_topics(monkeypatch, {"cdc": {0: [(i, value, key) for i, (key, value) in enumerate(records)]}})
    assert _check(config).ok
    DeltaTable(str(tmp_path / "table")).delete("id = 1", commit_properties=DAEMON)  # the daemon losing the last one
    report = _check(config)
    assert not report.ok and report.missing == [1] and report.deleted_later == [], report.render()


def test_a_row_is_matched_exactly_only_with_a_value_unique_to_its_change() -> None:
    compared = ["id", "name", "kafka_offset", "_lsn", "_deleted"]
    assert _unique({"id": 1, "kafka_offset": 4}, compared, soft=False)
    assert _unique({"id": 1, "_lsn": 40}, compared, soft=False)
    assert not _unique({"id": 1, "_lsn": None}, compared, soft=False)  # a source without positions
    assert not _unique({"id": 1, "kafka_offset": 4, "_deleted": True}, compared, soft=True)  # the upsert's offset
    assert _unique({"id": 1, "_lsn": 40, "_deleted": True}, compared, soft=True)
    assert not _unique({"id": 1, "kafka_offset": 4}, ["id", "name"], soft=False)  # not a column of the table


def test_partition_values_take_their_columns_types_in_spark_and_delta_rs_forms() -> None:
    schema = pa.schema([("at", pa.timestamp("us", tz="UTC")), ("n", pa.int64())])
    for text in ("2024-05-01T10:20:30.000000Z", "2024-05-01 10:20:30.000000"):
        typed = _typed(pa.table({"at": [text], "n": ["7"]}), schema)
        assert typed.to_pylist() == [{"at": dt.datetime(2024, 5, 1, 10, 20, 30, tzinfo=dt.UTC), "n": 7}]


def test_a_key_a_job_deleted_then_inserted_again_is_changed_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _ingested(tmp_path, monkeypatch, [(1, "a"), (2, "b")])
    table = DeltaTable(str(tmp_path / "table"))
    table.delete("id = 1")
    again = pa.table({"id": pa.array([1], pa.int64()), "name": pa.array(["again"])})
    table.merge(again, "t.id = s.id", source_alias="s", target_alias="t").when_not_matched_insert_all().execute()
    report = _check(config)
    assert report.ok and report.changed_later == [1] and report.deleted_later == [], report.render()


def test_a_soft_delete_of_a_key_the_table_never_held_is_no_missing_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by review: the soft MERGE marks only a row it holds, so a delete whose insert was a dead letter (or came
    before the topic's history) leaves no row; verify reported the key missing."""
    schema = json.dumps({"id": "long", "name": "string"})
    config = change_config(tmp_path, "upsert", K2D_TABLE__SCHEMA=schema, K2D_TABLE__DELETE_MODE="soft")
    records: list[tuple[bytes, bytes | None]] = [
        (b'{"id": 1}', b'{"id": 1, "name": "a"}'),
        (b'{"id": 7}', b"not json"),  # a dead letter
        (b'{"id": 7}', None),
        (b'{"id": 9}', None),  # a key the topic never upserted
        (b'{"id": 1}', None),
    ]
    ingest_until_caught_up(config, TopicsSource([change_batch(P0, 0, records)], {P0: len(records)}))
    assert sorted(DeltaTable(str(tmp_path / "table")).to_pyarrow_table().column("id").to_pylist()) == [1]
    serve_topics(monkeypatch, {"cdc": {0: [(i, value, key) for i, (key, value) in enumerate(records)]}})
    report = _check(config)
    assert report.ok and report.unmarked == [7, 9] and report.keys == 1, report.render()
    assert "soft deletes with no upsert read and no row: 2 (e.g. 7, 9; nothing to mark)" in report.render()
    assert json.loads(report.to_json())["soft_deletes_without_row_keys"] == ["7", "9"]

    DeltaTable(str(tmp_path / "table")).delete("id = 1", commit_properties=DAEMON)  # the daemon losing a tombstone
    report = _check(config)
    assert not report.ok and report.missing == [1] and report.unmarked == [7, 9], report.render()


def test_a_soft_tombstone_whose_every_change_compaction_removed_is_no_extra_key_on_a_compacted_topic_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by review: compaction keeps a deleted key's tombstone until delete.retention.ms, then nothing of the key;
    the table keeps its marked row, which was reported extra."""
    schema = json.dumps({"id": "long", "name": "string"})
    config = change_config(tmp_path, "upsert", K2D_TABLE__SCHEMA=schema, K2D_TABLE__DELETE_MODE="soft")
    records: list[tuple[bytes, bytes | None]] = [
        (b'{"id": 2}', b'{"id": 2, "name": "b"}'),
        (b'{"id": 1}', b'{"id": 1, "name": "a"}'),
        (b'{"id": 1}', None),
        (b'{"id": 3}', b'{"id": 3, "name": "c"}'),
    ]
    ingest_until_caught_up(config, TopicsSource([change_batch(P0, 0, records)], {P0: len(records)}))
    served = [(i, value, key) for i, (key, value) in enumerate(records) if i not in (1, 2)]
    serve_topics(monkeypatch, {"cdc": {0: served}}, compacted=True)
    report = _check(config)
    assert report.ok and report.compacted_away == [1] and report.extra == [], report.render()
    assert "tombstones whose key compaction left no change of: 1 (e.g. 1; the table keeps the marked row)" in (
        report.render()
    )
    assert json.loads(report.to_json())["tombstones_compacted_away_keys"] == ["1"]

    DeltaTable(str(tmp_path / "table")).update(
        updates={"_deleted": "false"}, predicate="id = 1", commit_properties=DAEMON
    )
    assert _check(config).extra == [1]  # a row no change left standing, unmarked: still a fault
    DeltaTable(str(tmp_path / "table")).update(
        updates={"_deleted": "true"}, predicate="id = 1", commit_properties=DAEMON
    )
    serve_topics(monkeypatch, {"cdc": {0: served}}, compacted=False)
    report = _check(config)
    assert not report.ok and report.extra == [1] and report.compacted_away == [], report.render()
