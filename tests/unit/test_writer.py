"""The Delta edge on a local table: files + txn in one commit, conflicts between two writers."""

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, Field
from deltalake.exceptions import CommitFailedError
from deltalake.schema import PrimitiveType

from kafka2delta.errors import CommitConflict, ConfigError, RowsRejected, SchemaChanged
from kafka2delta.offsets import TxnIds
from kafka2delta.records import OffsetRange, TopicPartition
from kafka2delta.schema import parse_schema
from kafka2delta.writer import DeltaWriter

P0, P1 = TopicPartition("e", 0), TopicPartition("e", 1)

SCHEMA = parse_schema({"id": "string not null", "country": "string", "ts": "timestamp"})


def open_writer(uri: Path, partition_by: tuple[str, ...] = (), interval: int = 10) -> DeltaWriter:
    return DeltaWriter.open(str(uri), {}, TxnIds("app").main, "snappy", interval, SCHEMA, partition_by)


def rows(ids: list[str], country: str | None = "FR") -> pa.Table:
    return pa.table(
        {"id": ids, "country": [country] * len(ids), "ts": pa.array([None] * len(ids), pa.timestamp("us", "UTC"))},
        schema=SCHEMA,
    )


def test_creates_table_and_commits_files_with_offsets(tmp_path: Path) -> None:
    writer = open_writer(tmp_path / "t")
    assert writer.committed_offsets([P0, P1]) == {P0: None, P1: None}
    files = writer.write_files(TopicPartition("events", 0), OffsetRange(0, 2), rows(["a", "b", "c"]))
    assert files[0].path.startswith("events-0-0-2-")
    version = writer.commit(files, {P0: None, P1: None}, {P0: 2, P1: 9}, {"topic": "events"})
    table = DeltaTable(str(tmp_path / "t"))
    assert version == table.version() == 1
    assert table.transaction_version("app-0") == 2
    assert table.transaction_version("app-1") == 9  # a txn-only advance (all dead letters) is committed too
    assert sorted(table.to_pyarrow_table().column("id").to_pylist()) == ["a", "b", "c"]
    assert table.history(1)[0]["kafka2delta"] == {"topic": "events", "read_version": 0}  # the version it read
    stats = json.loads(files[0].stats)
    assert stats["numRecords"] == 3 and stats["minValues"]["id"] == "a" and stats["maxValues"]["id"] == "c"


def test_missing_table_without_schema_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"table\.schema"):
        DeltaWriter.open(str(tmp_path / "none"), {}, TxnIds("app").main, "snappy", 10, None)


def test_a_writer_that_loses_the_race_to_create_the_table_opens_the_winners(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Daemons started together on a new table: the loser's create fails (delta-rs: "protocol changed") after
    the winner's landed; it opens that table instead of stopping."""
    real_create = DeltaTable.create

    def lose_the_race(*args: Any, **kwargs: Any) -> DeltaTable:
        real_create(*args, **kwargs)  # the winner's version 0
        raise CommitFailedError("Failed to commit transaction: Protocol changed since last commit")

    monkeypatch.setattr(DeltaTable, "create", staticmethod(lose_the_race))
    writer = open_writer(tmp_path / "t")
    assert writer.version == 0 and writer.committed_offsets([P0]) == {P0: None}


def test_zombie_writer_cannot_commit_a_moved_partition(tmp_path: Path) -> None:
    first, zombie = open_writer(tmp_path / "t"), open_writer(tmp_path / "t")
    first.commit(first.write_files(TopicPartition("e", 0), OffsetRange(0, 9), rows(["a"])), {P0: None}, {P0: 9}, {})
    files = zombie.write_files(TopicPartition("e", 0), OffsetRange(0, 9), rows(["a-again"]))
    with pytest.raises(CommitConflict) as raised:
        zombie.commit(files, {P0: None}, {P0: 9}, {})
    assert raised.value.partitions == {P0: 9}
    table = DeltaTable(str(tmp_path / "t"))
    assert table.to_pyarrow_table().column("id").to_pylist() == ["a"]


def test_writers_of_different_partitions_both_commit(tmp_path: Path) -> None:
    one, two = open_writer(tmp_path / "t"), open_writer(tmp_path / "t")
    one.commit(one.write_files(TopicPartition("e", 0), OffsetRange(0, 0), rows(["p0"])), {P0: None}, {P0: 0}, {})
    two.commit(two.write_files(TopicPartition("e", 1), OffsetRange(0, 0), rows(["p1"])), {P1: None}, {P1: 0}, {})
    table = DeltaTable(str(tmp_path / "t"))
    assert sorted(table.to_pyarrow_table().column("id").to_pylist()) == ["p0", "p1"]


def test_partitioned_table_and_checkpoints(tmp_path: Path) -> None:
    writer = open_writer(tmp_path / "t", partition_by=("country",), interval=2)
    mixed = pa.concat_tables([rows(["a", "b"], "FR"), rows(["c"], "a/b c"), rows(["d"], None)])
    files = writer.write_files(TopicPartition("e", 0), OffsetRange(0, 3), mixed)
    assert len(files) == 3
    writer.commit(files, {P0: None}, {P0: 3}, {})
    writer.commit([], {P0: 3}, {P0: 4}, {})
    table = DeltaTable(str(tmp_path / "t"))
    assert table.metadata().partition_columns == ["country"]
    result = {r["id"]: r["country"] for r in table.to_pyarrow_table().to_pylist()}
    assert result == {"a": "FR", "b": "FR", "c": "a/b c", "d": None}
    assert (tmp_path / "t" / "_delta_log" / "00000000000000000002.checkpoint.parquet").exists()


def test_evolution_commit_adds_columns_files_and_txns_at_once(tmp_path: Path) -> None:
    writer = open_writer(tmp_path / "t")
    writer.commit(writer.write_files(TopicPartition("e", 0), OffsetRange(0, 0), rows(["a"])), {P0: None}, {P0: 0}, {})
    wider = pa.schema([*SCHEMA, pa.field("color", pa.string())])
    new_rows = pa.table(
        {"id": ["b"], "country": ["FR"], "ts": pa.array([None], SCHEMA.field("ts").type), "color": ["red"]}
    )
    version = writer.commit_evolution(new_rows.cast(wider), {P0: 0}, {P0: 1}, {"added_columns": ["color"]})
    table = DeltaTable(str(tmp_path / "t"))
    assert version == table.version() == 2
    assert pa.schema(table.schema().to_arrow()).names == ["id", "country", "ts", "color"]
    assert writer.schema.names == ["id", "country", "ts", "color"]
    assert table.transaction_version("app-0") == 1
    log = (tmp_path / "t" / "_delta_log" / "00000000000000000002.json").read_text()
    assert '"metaData"' in log and '"add"' in log and '"txn"' in log  # one commit
    assert {r["id"]: r["color"] for r in table.to_pyarrow_table().to_pylist()} == {"a": None, "b": "red"}


def test_a_schema_changed_by_another_writer_is_never_committed_over(tmp_path: Path) -> None:
    writer = open_writer(tmp_path / "t")
    files = writer.write_files(TopicPartition("e", 0), OffsetRange(0, 0), rows(["a"]))
    DeltaTable(str(tmp_path / "t")).alter.add_columns([Field("x", PrimitiveType("string"), nullable=True)])
    with pytest.raises(SchemaChanged) as raised:
        writer.commit(files, {P0: None}, {P0: 0}, {})
    assert raised.value.schema.names == ["id", "country", "ts", "x"]
    assert DeltaTable(str(tmp_path / "t")).transaction_version("app-0") is None


def test_rows_parquet_refuses_are_named_and_nothing_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    writer = open_writer(tmp_path / "t")
    real_write = pq.write_table

    def picky(table: pa.Table, where: object, **kwargs: object) -> None:
        if "poison" in table.column("id").to_pylist():
            raise pa.ArrowInvalid("cannot write poison")
        real_write(table, where, **kwargs)

    monkeypatch.setattr(pq, "write_table", picky)
    with pytest.raises(RowsRejected) as raised:
        writer.write_files(TopicPartition("e", 0), OffsetRange(0, 3), rows(["a", "poison", "b", "c"]))
    assert [index for index, _ in raised.value.failures] == [1]
    assert "cannot write poison" in str(raised.value.failures[0][1])


def test_s3_filesystem_takes_temporary_credentials_and_the_region_from_storage_options() -> None:
    from kafka2delta.writer import table_filesystem

    options = {
        "aws_access_key_id": "AKIA",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "AWS_SESSION_TOKEN": "token",
        "AWS_DEFAULT_REGION": "eu-west-1",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
    }
    filesystem, path = table_filesystem("s3://lake/events", options)
    assert path == "lake/events"
    settings = filesystem.__reduce__()[1][0]  # what the filesystem was built with
    assert (settings["session_token"], settings["region"]) == ("token", "eu-west-1")
    assert (settings["scheme"], settings["endpoint_override"]) == ("http", "127.0.0.1:9")


@pytest.mark.parametrize(
    "options",
    [
        # object_store's other names for the same settings: deltalake takes them all, so must the Parquet writer.
        {"endpoint": "http://127.0.0.1:9", "region": "eu-west-1", "access_key_id": "AKIA", "token": "token"},
        {"endpoint_url": "http://127.0.0.1:9", "aws_region": "eu-west-1", "AWS_ACCESS_KEY_ID": "AKIA"},
        {"AWS_ENDPOINT": "http://127.0.0.1:9", "default_region": "eu-west-1", "access_key_id": "AKIA"},
    ],
)
def test_s3_filesystem_takes_every_name_deltalake_takes(options: dict[str, str]) -> None:
    from kafka2delta.writer import table_filesystem

    filesystem, _ = table_filesystem("s3://lake/events", {**options, "secret_access_key": "secret"})
    settings = filesystem.__reduce__()[1][0]
    assert (settings["endpoint_override"], settings["region"], settings["access_key"]) == (
        "127.0.0.1:9",
        "eu-west-1",
        "AKIA",
    )
    assert settings["secret_key"] == "secret"
