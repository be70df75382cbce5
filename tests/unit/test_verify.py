"""The checker's comparison, on synthetic topic offsets and table contents."""

import json
import time
from collections.abc import Mapping
from concurrent.futures import Future
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest.mock import Mock

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from confluent_kafka import KafkaError, KafkaException
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from kafka2delta import verify, verify_deletes, verify_reading
from kafka2delta.cli import build_pipeline
from kafka2delta.config import Config, load_config
from kafka2delta.errors import RetryableError
from kafka2delta.records import PartitionMessages, TopicPartition
from kafka2delta.schema import parse_schema
from kafka2delta.verify import (
    EXIT_FAILED,
    EXIT_UNCHECKED,
    Report,
    TopicOffsets,
    check,
    command,
    compare,
    log_gaps,
    pipeline_filter,
    read_topic,
    rows_beyond_txn,
)
from kafka2delta.verify_changes import ChangesReport, dead_letter_offsets
from kafka2delta.verify_deletes import DeletingCommit
from kafka2delta.verify_reading import Deadline, is_compacted, read_table
from kafka2delta.writer import LEGACY_OWNER_PROPERTY
from tests.support.debezium import change_batch, change_config
from tests.support.runner import TopicsSource, ingest_until_caught_up, messages_of, tables_config
from tests.support.verify_consumer import serve_topics

P0 = TopicPartition("cdc", 0)
AUTO_OFFSET_RESET = KafkaError._AUTO_OFFSET_RESET


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
        topic="t",
        partition=0,
        offsets=[10, 11, 12, 13, 14],
        payloads=[
            b'{"id": "a", "type": "click"}',
            b'{"id": "b", "type": "heartbeat"}',
            b"{not json",
            None,
            b'{"type": "x"}',
        ],
        timestamps_ms=[0] * 5,
    )
    assert pipeline_filter(pipeline)(messages) == [11, 13]  # filtered, and the empty payload the stages skip


# --- found by review (2026-11-28): each of these passed wrongly or crashed before --------------------------------


def test_rows_and_dead_letters_of_partitions_the_topic_lacks_are_unexpected() -> None:
    reports = compare(topic({0: [0]}), pairs((0, 0), (5, 3), (5, 3)), pairs((7, 1)), {0: 0})
    assert [(p.partition, p.unexpected) for p in reports] == [(0, []), (5, [3]), (7, [1])]
    assert not Report("t", "/t", "/d", reports).ok


def test_on_a_compacted_topic_rows_at_removed_offsets_are_counted_not_flagged() -> None:
    offsets = topic({0: [0, 3, 4]})  # compaction removed 1 and 2
    rows = pairs((0, 0), (0, 1), (0, 2), (0, 3), (0, 4), (0, 9))
    [plain] = compare(offsets, rows, pairs(), {0: 4})
    assert plain.unexpected == [1, 2, 9]
    offsets.compacted = True
    [compacted] = compare(offsets, rows, pairs(), {0: 4})
    assert compacted.unexpected == [9] and compacted.compacted == 2  # offset 9 is past the high watermark


def test_rows_after_their_tables_txn_fail_the_check() -> None:
    [partition] = compare(
        topic({0: [0, 1, 2]}), pairs((0, 0), (0, 2)), pairs((0, 1)), {0: 1}, beyond_txn={0: np.array([2])}
    )
    assert partition.beyond_txn == [2] and not partition.ok
    assert "beyond_txn 0:[2]" in Report("t", "/t", "/d", [partition]).render().splitlines()[-1]


def test_a_table_read_counts_rows_without_offsets_and_takes_the_one_topic_txn_ids_of_its_owner(
    tmp_path: Path,
) -> None:
    uri = str(tmp_path / "t")
    rows = pa.table(
        {
            "kafka_topic": ["t", "t", "t"],
            "kafka_partition": pa.array([0, None, 0], pa.int64()),
            "kafka_offset": pa.array([0, None, 2], pa.int64()),
        }
    )
    write_deltalake(uri, rows, commit_properties=CommitProperties(app_transactions=[Transaction("shop-0", 2)]))
    DeltaTable(uri).alter.set_table_properties({LEGACY_OWNER_PROPERTY: "t"}, raise_if_not_exists=False)
    # A second topic joined the table (ids shop-<topic>-<p>); the daemon has not run since to move the old ids.
    snapshot = read_table(uri, {}, "shop-t", [0], "kafka_partition", "kafka_offset", topic="t", legacy_app_id="shop")
    assert snapshot.txns == {0: 2} and snapshot.untraced == 1 and snapshot.rows.num_rows == 2
    other = read_table(uri, {}, "shop-u", [0], "kafka_partition", "kafka_offset", topic="u", legacy_app_id="shop")
    assert other.txns == {0: None}  # another topic's: not this one's offsets
    assert {p: o.tolist() for p, o in rows_beyond_txn(snapshot).items()} == {0: []}
    assert {p: o.tolist() for p, o in rows_beyond_txn(other).items()} == {0: [0, 2]}  # rows past a txn it lacks


def test_retention_deleting_offsets_mid_read_stops_the_check_naming_the_partition(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made = serve_topics(
        monkeypatch, {"t": {0: [(0, b"a", None), (1, b"b", None)]}}, fail_at={0: (1, AUTO_OFFSET_RESET)}
    )
    with pytest.raises(RetryableError, match=r"t\[0\] at 1: retention deleted offsets"):
        read_topic("unused:1", "t", {"auto.offset.reset": "earliest"})
    # The broker says so only when asked to: librdkafka's default jumps to the end of the partition.
    assert made[0].settings["auto.offset.reset"] == "error"


class FakeAdmin:
    """The AdminClient's describe_configs, answering one topic's cleanup.policy (or failing)."""

    def __init__(self, policy: str | None, failure: Exception | None = None) -> None:
        self.policy, self.failure = policy, failure

    def __call__(self, settings: Mapping[str, Any]) -> "FakeAdmin":
        assert settings["bootstrap.servers"] == "unused:1" and "logger" in settings
        return self

    def describe_configs(self, resources: list[Any], request_timeout: float) -> dict[Any, Future[Any]]:
        future: Future[Any] = Future()
        if self.failure is not None:
            future.set_exception(self.failure)
        else:
            entries = {} if self.policy is None else {"cleanup.policy": SimpleNamespace(value=self.policy)}
            future.set_result(entries)
        return {resources[0]: future}


@pytest.mark.parametrize(
    ("admin", "compacted"),
    [
        (FakeAdmin("compact"), True),
        (FakeAdmin("compact,delete"), True),
        (FakeAdmin("delete"), False),
        (FakeAdmin(None), False),
        (FakeAdmin(None, KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))), False),
        (FakeAdmin(None, TimeoutError()), False),
    ],
)
def test_the_cleanup_policy_says_whether_a_topic_is_compacted(
    monkeypatch: pytest.MonkeyPatch, admin: FakeAdmin, compacted: bool
) -> None:
    monkeypatch.setattr(verify_reading, "AdminClient", admin)
    assert is_compacted("unused:1", "t", {}, Deadline(None)) is compacted


def _upsert_config(tmp_path: Path, **env: str) -> Config:
    return change_config(tmp_path, "upsert", K2D_TABLE__SCHEMA=json.dumps({"id": "long", "name": "string"}), **env)


def test_an_upsert_table_holding_a_key_twice_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = _upsert_config(tmp_path)
    records = [(b'{"id": 1}', b'{"id": 1, "name": "a"}'), (b'{"id": 2}', b'{"id": 2, "name": "b"}')]
    ingest_until_caught_up(config, TopicsSource([change_batch(P0, 0, records)], {P0: 2}))
    serve_topics(monkeypatch, {"cdc": {0: [(i, value, key) for i, (key, value) in enumerate(records)]}})
    [report] = check(config, None, partial(build_pipeline, config))
    assert report.ok, report.render()
    # What verify exists to catch: an insert where an update was due.
    table = DeltaTable(str(tmp_path / "table"))
    write_deltalake(table, table.to_pyarrow_table().filter(pc.field("id") == 1), mode="append")
    [report] = check(config, None, partial(build_pipeline, config))
    assert isinstance(report, ChangesReport) and report.duplicated == [1] and not report.ok
    assert report.render().splitlines()[-1] == "  FAILED: duplicated 1"


def test_an_upsert_table_that_lost_a_key_gained_one_or_holds_a_stale_value_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _upsert_config(tmp_path)
    records = [
        (f'{{"id": {i}}}'.encode(), f'{{"id": {i}, "name": "{n}"}}'.encode()) for i, n in ((1, "a"), (2, "b"), (3, "c"))
    ]
    ingest_until_caught_up(config, TopicsSource([change_batch(P0, 0, records)], {P0: 3}))
    serve_topics(monkeypatch, {"cdc": {0: [(i, value, key) for i, (key, value) in enumerate(records)]}})
    [report] = check(config, None, partial(build_pipeline, config))
    assert report.ok, report.render()
    table = DeltaTable(str(tmp_path / "table"))
    # Commits marked as the daemon's: its own faults (another writer's DELETE or UPDATE would be a job's doing).
    daemon = CommitProperties(custom_metadata={"kafka2delta": {"operation": "merge"}})
    table.delete("id = 3", commit_properties=daemon)  # a change lost
    table.update(updates={"name": "'zzz'"}, predicate="id = 1", commit_properties=daemon)  # a change applied wrongly
    stray = table.to_pyarrow_table().filter(pc.field("id") == 2)
    write_deltalake(table, stray.set_column(0, "id", pa.array([99], pa.int64())), mode="append")  # no change made it
    [report] = check(config, None, partial(build_pipeline, config))
    assert isinstance(report, ChangesReport) and not report.ok, report.render()
    assert report.missing == [3] and report.extra == [99] and [key for key, _ in report.different] == [1]
    assert report.render().splitlines()[-1] == "  FAILED: missing 1, extra 1, different 1"


def test_an_upsert_table_several_topics_feed_is_checked_as_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = _upsert_config(tmp_path, K2D_KAFKA__TOPIC="", K2D_KAFKA__TOPICS="cdc,cdc2")
    first = [(b'{"id": 1}', b'{"id": 1, "name": "a"}')]
    second = [(b'{"id": 2}', b'{"id": 2, "name": "b"}'), (b'{"id": 2}', b'{"id": 2, "name": "c"}')]
    other = TopicPartition("cdc2", 0)
    batches = [change_batch(P0, 0, first), change_batch(other, 0, second)]
    ingest_until_caught_up(config, TopicsSource(batches, {P0: 1, other: 2}))
    served = {"cdc": {0: [(0, first[0][1], first[0][0])]}, "cdc2": {0: [(i, v, k) for i, (k, v) in enumerate(second)]}}
    serve_topics(monkeypatch, served)
    [report] = check(config, None, partial(build_pipeline, config))
    assert isinstance(report, ChangesReport)
    assert report.ok and report.keys == 2 and report.topic == "cdc, cdc2", report.render()


def test_a_changelog_without_an_envelope_writes_tombstones_as_rows_not_unexpected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = change_config(
        tmp_path,
        "changelog",
        K2D_FORMAT__ENVELOPE="none",
        K2D_TABLE__SCHEMA=json.dumps({"id": "long", "name": "string"}),
    )
    records = [(b'{"id": 1}', b'{"id": 1, "name": "a"}'), (b'{"id": 1}', None), (b'{"id": 4}', b'{"id": 4}')]
    ingest_until_caught_up(config, TopicsSource([change_batch(P0, 0, records)], {P0: 3}))
    serve_topics(monkeypatch, {"cdc": {0: [(i, value, key) for i, (key, value) in enumerate(records)]}})
    [report] = check(config, None, partial(build_pipeline, config))
    assert isinstance(report, Report) and report.ok, report.render()
    assert (report.partitions[0].rows, report.partitions[0].skipped) == (3, 0)


def test_the_timeout_bounds_an_upsert_check_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = _upsert_config(tmp_path)
    records = [(b'{"id": 1}', b'{"id": 1, "name": "a"}')]
    ingest_until_caught_up(config, TopicsSource([change_batch(P0, 0, records)], {P0: 1}))
    serve_topics(monkeypatch, {"cdc": {0: [(0, records[0][1], records[0][0])]}})
    assert command(config, False, 0.0, partial(build_pipeline, config)) == EXIT_UNCHECKED


def test_an_upsert_table_retention_cut_is_not_checked_rather_than_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    cut = ChangesReport("cdc", "table", 3, {"cdc": {0: 9}}, {"cdc": {0: 5}})
    assert not cut.ok and not cut.checkable
    monkeypatch.setattr(verify, "check", lambda *args: [cut])
    assert command(Mock(), False, None) == EXIT_UNCHECKED
    cut.missing = [7]
    assert command(Mock(), False, None) == EXIT_FAILED


def test_a_dead_letter_table_storage_cannot_read_is_a_check_not_made(tmp_path: Path) -> None:
    uri = str(tmp_path / "dlq")
    write_deltalake(uri, pa.table({"partition": [0], "offset": [1], "topic": ["t"], "app_id": ["a"]}))
    for data in Path(uri).glob("*.parquet"):
        data.unlink()
    with pytest.raises(RetryableError, match="reading"):
        dead_letter_offsets(uri, {}, {"t": pc.field("topic") == "t"})


# --- rows a later commit deleted (jobs ttl, a mutate DELETE) ----------------------------------------


def _ingested_with_a_dead_letter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Config:
    """Topic a (2 partitions, offsets 0..5, and a dead letter at 1:6) ingested into <tmp_path>/a; verify reads a fake
    of the topic."""
    config = tables_config(tmp_path, K2D_KAFKA__TOPIC="a", K2D_TABLE__URI=str(tmp_path / "a"))
    a0, a1 = TopicPartition("a", 0), TopicPartition("a", 1)
    documents: dict[int, list[dict[str, Any]]] = {p: [{"id": f"p{p}-{o}"} for o in range(6)] for p in (0, 1)}
    documents[1].append({"x": 1})  # offset 6: no id, a dead letter
    batches = [
        messages_of(a0, 0, documents[0][:3]),
        messages_of(a1, 0, documents[1]),
        messages_of(a0, 3, documents[0][3:]),
    ]
    ingest_until_caught_up(config, TopicsSource(batches, {a0: 6, a1: 7}))
    served = {p: [(o, json.dumps(d).encode(), None) for o, d in enumerate(documents[p])] for p in (0, 1)}
    serve_topics(monkeypatch, {"a": served})
    [report] = check(config)
    assert isinstance(report, Report) and report.ok and report.deleted_by_version == {}
    return config


def test_rows_a_later_delete_took_out_are_counted_as_deleted_until_vacuum_removes_their_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A DELETE (as `jobs ttl` makes) takes rows out after the daemon wrote them: they are deleted, not lost, while
    the files it removed are on storage, and so is a dead letter erased by hand; compaction and an outside append
    change nothing; after VACUUM the report fails and says why."""
    config = _ingested_with_a_dead_letter(tmp_path, monkeypatch)
    uri = str(tmp_path / "a")
    DeltaTable(uri).delete("id IN ('p0-1', 'p0-4', 'p1-2')")
    deleting = DeltaTable(uri).version()
    letters = str(tmp_path / "dlq")
    DeltaTable(letters).delete("topic = 'a' AND \"offset\" = 6")
    erasing = DeltaTable(letters).version()
    DeltaTable(uri).optimize.compact()  # rewrites every row: deletes none
    write_deltalake(uri, DeltaTable(uri).to_pyarrow_table().slice(0, 0), mode="append")  # an outside commit
    [report] = check(config)
    assert isinstance(report, Report) and report.ok, report.render()
    assert [(p.partition, p.deleted, p.missing) for p in report.partitions] == [(0, 2, []), (1, 2, [])]
    assert report.deleted_by_version == {
        uri: {deleting: DeletingCommit("DELETE", 3)},
        letters: {erasing: DeletingCommit("DELETE", 1)},
    }
    assert report.deletes_unreadable == {uri: {}, letters: {}} and report.log_starts_at == {uri: 0, letters: 0}
    text = report.render()
    assert f"later commits deleted from {uri}: v{deleting} DELETE 3" in text
    assert text.splitlines()[-1] == "OK: lost 0, duplicated 0 (deleted later 4)"
    data = json.loads(report.to_json())
    assert data["deleted"] == 4 and data["deleted_by_version"][uri] == {
        str(deleting): {"operation": "DELETE", "rows": 3}
    }

    DeltaTable(uri).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    [report] = check(config)
    assert isinstance(report, Report) and not report.ok and report.lost == 3  # the dead letter's files are there
    assert report.deletes_unreadable == {uri: {deleting: "its files were vacuumed"}, letters: {}}
    assert (
        f"what v{deleting} of {uri} deleted cannot be told from lost rows (its files were vacuumed)" in report.render()
    )


def test_a_restore_that_took_rows_out_is_a_loss_not_a_deletion(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by review: every outside commit that removed files counted as deletions, so a RESTORE to before the
    daemon's commits (its txns stay, the daemon never writes those rows again) passed as OK."""
    config = _ingested_with_a_dead_letter(tmp_path, monkeypatch)
    uri = str(tmp_path / "a")
    DeltaTable(uri).restore(0)
    [report] = check(config)
    assert isinstance(report, Report) and not report.ok and report.lost > 0 and report.deleted_by_version[uri] == {}


def test_deletions_before_a_cleaned_up_log_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by review: once the log entry of a DELETE is cleaned up (delta.logRetentionDuration), its rows count as
    lost with nothing said."""
    config = _ingested_with_a_dead_letter(tmp_path, monkeypatch)
    uri = str(tmp_path / "a")
    DeltaTable(uri).delete("id = 'p0-1'")
    table = DeltaTable(uri)
    table.alter.set_table_properties({"delta.logRetentionDuration": "interval 0 seconds"})
    DeltaTable(uri).create_checkpoint()
    DeltaTable(uri).cleanup_metadata()
    [report] = check(config)
    first = report.log_starts_at[uri] if isinstance(report, Report) else -1
    assert isinstance(report, Report) and not report.ok and report.lost == 1 and first > 0, report.render()
    assert f"the log of {uri} has no entry for v{first - 1} (cleaned up, or a gap)" in report.render()


def test_the_log_is_read_newest_first_until_every_missing_offset_is_explained(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long log costs one read a version: pages of 2 here (1,000 in use); a recent DELETE that explains every
    missing offset spares the older entries, and one that does not sends the reader further back."""
    config = _ingested_with_a_dead_letter(tmp_path, monkeypatch)
    uri = str(tmp_path / "a")
    DeltaTable(uri).delete("id = 'p0-1'")
    old = DeltaTable(uri).version()
    for _ in range(3):
        write_deltalake(uri, DeltaTable(uri).to_pyarrow_table().slice(0, 0), mode="append")
    DeltaTable(uri).delete("id = 'p1-2'")
    recent = DeltaTable(uri).version()
    monkeypatch.setattr(verify_deletes, "_FIRST_PAGE", 2)
    read: list[int] = []
    log_entry = verify_deletes._log_entry

    def spy(filesystem: Any, root: str, version: int) -> Any:
        if root == uri:  # the main table's (the dead-letter table's short log is read first)
            read.append(version)
        return log_entry(filesystem, root, version)

    monkeypatch.setattr(verify_deletes, "_log_entry", spy)
    [report] = check(config)
    assert isinstance(report, Report) and report.ok, report.render()
    assert sorted(read, reverse=True)[:2] == [recent, recent - 1] and old in read  # a second page was read
    assert set(report.deleted_by_version[uri]) == {recent, old}

    # Only the recent DELETE's row is missing once the older one's is back: the first page explains it.
    schema = pa.schema(DeltaTable(uri).schema().to_arrow())
    row = {"id": "p0-1", "kafka_topic": "a", "kafka_partition": 0, "kafka_offset": 1}
    write_deltalake(uri, pa.Table.from_pylist([row], schema=schema), mode="append")
    read.clear()
    [report] = check(config)
    assert isinstance(report, Report) and report.ok, report.render()
    assert sorted(read) == [recent, recent + 1]  # the first page (the append, the recent DELETE) explains it all


def test_a_commit_without_commit_info_does_not_shift_what_older_entries_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by review: deltalake's history() skips a commit without commitInfo (the protocol makes it optional) and
    numbers the older entries one too high, so a DELETE's rows were read from the overwrite after it and a real
    loss passed as deleted. The entries are read by their own version now."""
    config = _ingested_with_a_dead_letter(tmp_path, monkeypatch)
    uri = str(tmp_path / "a")
    DeltaTable(uri).delete("id = 'p0-1'")
    deleting = DeltaTable(uri).version()
    current = DeltaTable(uri).to_pyarrow_table()
    write_deltalake(uri, current.filter(pc.field("id") != "p0-5"), mode="overwrite")  # p0-5 lost
    bare = tmp_path / "a" / "_delta_log" / f"{DeltaTable(uri).version() + 1:020d}.json"
    bare.write_text(json.dumps({"txn": {"appId": "by-hand", "version": 1, "lastUpdated": 0}}) + "\n")
    [report] = check(config)
    assert isinstance(report, Report) and report.lost == 1 and report.partitions[0].missing == [5], report.render()
    assert report.deleted_by_version[uri] == {deleting: DeletingCommit("DELETE", 1)}


def test_rows_of_files_without_the_topic_column_are_not_another_topics_deletions(tmp_path: Path) -> None:
    """Found by review: a file written before `kafka_topic` existed had no filter applied, so when a DELETE took it
    out, the rows of the topic that wrote it explained another topic's missing offsets in a table both write."""
    uri = str(tmp_path / "shared")
    write_deltalake(uri, pa.table({"kafka_partition": [0, 0], "kafka_offset": [0, 1]}))  # topic a, before the column
    later = pa.table({"kafka_partition": [0], "kafka_offset": [0], "kafka_topic": ["b"]})
    write_deltalake(uri, later, mode="append", schema_mode="merge")
    write_deltalake(uri, later.slice(0, 0), mode="overwrite", predicate="kafka_topic = 'b'")  # b's row: deleted
    DeltaTable(uri).delete("kafka_topic IS NULL")  # a's rows
    topic_b = lambda schema: pc.field("kafka_topic") == "b"  # noqa: E731  # a table several topics write
    found = verify_deletes.deleted_rows(
        uri, {}, DeltaTable(uri).version(), "kafka_partition", "kafka_offset", topic_b, ("kafka_topic",),
        {0: np.array([0, 1], np.int64)}, Deadline(None),
    )  # fmt: skip
    assert {p: o.tolist() for p, o in found.offsets.items()} == {0: [0]}  # b's row, by the overwrite with a predicate
    assert [c.operation for c in found.by_version.values()] == ["WRITE"] and found.unreadable == {}


def test_the_timeout_bounds_reading_the_files_of_deleting_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by review: the log's entries were checked against --timeout, the deleting commits' data files no more."""
    uri = str(tmp_path / "t")
    for n in range(4):
        write_deltalake(
            uri, pa.table({"kafka_partition": [0] * 3, "kafka_offset": [3 * n, 3 * n + 1, 3 * n + 2]}), mode="append"
        )
    for n in range(4):
        DeltaTable(uri).delete(f"kafka_offset = {3 * n}")
    data_file = verify_deletes.data_file

    def slow(*args: Any) -> pa.Table:
        time.sleep(0.2)
        return data_file(*args)

    monkeypatch.setattr(verify_deletes, "data_file", slow)
    missing = {0: np.array([0, 3, 6, 9], np.int64)}

    def deleted(deadline: Deadline) -> verify_deletes.Deletions:
        version = DeltaTable(uri).version()
        return verify_deletes.deleted_rows(
            uri, {}, version, "kafka_partition", "kafka_offset", lambda schema: None, (), missing, deadline
        )

    assert set(deleted(Deadline(None)).by_version) == {4, 5, 6, 7}
    with pytest.raises(RetryableError, match=r"reading the data files of .* at version \d+: timed out after 0.5 s"):
        deleted(Deadline(0.5))
