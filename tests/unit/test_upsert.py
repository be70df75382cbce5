"""Upsert tables on real local Delta tables with an in-memory source: the last change per key lands in ONE
MERGE commit with the txns, replays change nothing, deletes (tombstones, Debezium ``d``, soft), a primary-key
change, Debezium's logical types, tables created from the Connect schema and evolving with it, dead letters."""

from __future__ import annotations

import base64
import datetime as dt
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from kafka2delta.changes import last_changes
from kafka2delta.changes.connect import convert, fit_to_column
from kafka2delta.config import Config
from kafka2delta.coordinator import Coordinator, FileBackend
from kafka2delta.errors import ConfigError, MessageError
from kafka2delta.records import ConsumedBatch, TopicPartition
from tests.support.debezium import SourceTable, change_batch, change_config, decimal_bytes, field
from tests.support.runner import TopicsSource, ingest_until_caught_up

P0, P1 = TopicPartition("cdc", 0), TopicPartition("cdc", 1)


def config(tmp_path: Path, **env: str) -> Config:
    return change_config(tmp_path, "upsert", **{"K2D_INGEST__MAX_COMMIT_RETRIES": "3", **env})


def plain(tp: TopicPartition, first: int, changes: list[tuple[int, dict[str, Any] | None]]) -> ConsumedBatch:
    return change_batch(
        tp,
        first,
        [(json.dumps({"id": key}).encode(), None if row is None else json.dumps(row).encode()) for key, row in changes],
    )


def rows(tmp_path: Path, sort: str = "id") -> list[dict[str, Any]]:
    return DeltaTable(str(tmp_path / "table")).to_pyarrow_table().sort_by(sort).to_pylist()


SCHEMA = json.dumps({"id": "long", "name": "string"})


def test_the_table_holds_the_last_change_of_each_key_and_the_txn_in_one_commit(tmp_path: Path) -> None:
    cfg = config(tmp_path, K2D_TABLE__SCHEMA=SCHEMA)
    first = plain(P0, 0, [(1, {"id": 1, "name": "a"}), (2, {"id": 2, "name": "b"}), (1, {"id": 1, "name": "a2"})])
    second = plain(P0, 3, [(2, None), (3, {"id": 3, "name": "c"})])
    metrics = ingest_until_caught_up(cfg, TopicsSource([first, second], {P0: 5}))
    assert rows(tmp_path) == [{"id": 1, "name": "a2"}, {"id": 3, "name": "c"}]
    merged = {
        action: metrics.registry.get_sample_value(
            "kafka2delta_merged_rows_total", {"table": str(tmp_path / "table"), "action": action}
        )
        for action in ("inserted", "deleted")
    }
    assert merged == {"inserted": 2.0, "deleted": 0.0}  # key 2 was inserted and deleted within the flush
    table = DeltaTable(str(tmp_path / "table"))
    assert table.transaction_version("cdc-0") == 4
    last = table.history(1)[0]
    assert last["operation"] == "MERGE"
    assert last["kafka2delta"]["offsets"] == {"0": [0, 4]} and last["kafka2delta"]["mode"] == "upsert"
    assert last["kafka2delta"]["changes"] == 3  # keys 1, 2 (deleted) and 3
    assert table.schema().to_arrow().field("id").nullable is False  # a key column is never null


def test_a_flush_that_changes_no_row_still_moves_the_txn(tmp_path: Path) -> None:
    """Found by review: delta-rs commits nothing for a MERGE that changes nothing (here the tombstones of keys the
    table lacks, as Debezium's that follow their delete into the next flush), so the txn stayed behind; the next
    flush took that for another writer's commit and dropped its changes, forever at a fixed flush boundary."""
    cfg = config(tmp_path, K2D_TABLE__SCHEMA=SCHEMA)
    ingest_until_caught_up(cfg, TopicsSource([plain(P0, 0, [(1, {"id": 1, "name": "a"})])], {P0: 1}))
    ingest_until_caught_up(cfg, TopicsSource([plain(P0, 1, [(8, None), (9, None)])], {P0: 3}))
    assert DeltaTable(str(tmp_path / "table")).transaction_version("cdc-0") == 2
    source = TopicsSource([plain(P0, 3, [(3, {"id": 3, "name": "c"})])], {P0: 4})
    ingest_until_caught_up(cfg, source)
    assert source.seeks == [] and rows(tmp_path) == [{"id": 1, "name": "a"}, {"id": 3, "name": "c"}]
    assert DeltaTable(str(tmp_path / "table")).transaction_version("cdc-0") == 3


def test_a_struct_that_gains_a_member_keeps_its_values_in_the_rows_the_merge_copies(tmp_path: Path) -> None:
    """Found by review: with ``merge_schema``, delta-rs's MERGE nulled the struct of every row it copied (key 2,
    in the file key 1's change rewrote); the columns are now added in a commit of their own first."""
    cfg = config(tmp_path, K2D_TABLE__SCHEMA_EVOLUTION="merge", K2D_TABLE__SCHEMA=json.dumps({"id": "long"}))
    first: list[tuple[int, dict[str, Any] | None]] = [
        (1, {"id": 1, "addr": {"city": "a"}}),
        (2, {"id": 2, "addr": {"city": "b"}}),
    ]
    second: list[tuple[int, dict[str, Any] | None]] = [
        (1, {"id": 1, "addr": {"city": "a2", "zip": 5}}),
        (3, {"id": 3, "addr": {"city": "c", "zip": 7}}),
    ]
    ingest_until_caught_up(cfg, TopicsSource([plain(P0, 0, first)], {P0: 2}))
    ingest_until_caught_up(cfg, TopicsSource([plain(P0, 2, second)], {P0: 4}))
    assert rows(tmp_path) == [
        {"id": 1, "addr": {"city": "a2", "zip": 5}},
        {"id": 2, "addr": {"city": "b", "zip": None}},
        {"id": 3, "addr": {"city": "c", "zip": 7}},
    ]
    table = DeltaTable(str(tmp_path / "table"))
    assert table.transaction_version("cdc-0") == 3 and table.history(1)[0]["operation"] == "MERGE"


def test_a_row_that_moves_to_another_partition_is_updated_not_inserted_twice(tmp_path: Path) -> None:
    """Found by review: the MERGE bounded a non-key partition column by the batch's values, so key 1's row in its
    old partition (``new``) went unmatched and the change to ``done`` was inserted beside it."""
    schema = json.dumps({"id": "long", "status": "string"})
    cfg = config(tmp_path, K2D_TABLE__SCHEMA=schema, K2D_TABLE__PARTITION_BY="status")
    ingest_until_caught_up(cfg, TopicsSource([plain(P0, 0, [(1, {"id": 1, "status": "new"})])], {P0: 1}))
    ingest_until_caught_up(cfg, TopicsSource([plain(P0, 1, [(1, {"id": 1, "status": "done"})])], {P0: 2}))
    assert rows(tmp_path) == [{"id": 1, "status": "done"}]


def test_a_replay_of_committed_offsets_changes_nothing(tmp_path: Path) -> None:
    cfg = config(tmp_path, K2D_TABLE__SCHEMA=SCHEMA)
    changes = [(1, {"id": 1, "name": "a"}), (1, None), (2, {"id": 2, "name": "b"})]
    ingest_until_caught_up(cfg, TopicsSource([plain(P0, 0, changes)], {P0: 3}))
    version = DeltaTable(str(tmp_path / "table")).version()
    later = plain(P0, 3, [(2, {"id": 2, "name": "b2"})])
    # A source that serves the committed offsets again (a replay after a crash), then one new change.
    source = TopicsSource([plain(P0, 0, changes), later], {P0: 4})
    ingest_until_caught_up(cfg, source)
    assert rows(tmp_path) == [{"id": 2, "name": "b2"}]
    table = DeltaTable(str(tmp_path / "table"))
    assert table.version() == version + 1 and table.transaction_version("cdc-0") == 3
    assert source.starts == {P0: 3}


def test_last_change_is_by_partition_then_offset_across_partitions(tmp_path: Path) -> None:
    cfg = config(tmp_path, K2D_TABLE__SCHEMA=SCHEMA)
    batch = plain(P0, 0, [(1, {"id": 1, "name": "p0"})])
    batch.partitions.update(plain(P1, 0, [(1, {"id": 1, "name": "p1"}), (2, {"id": 2, "name": "p1"})]).partitions)
    ingest_until_caught_up(cfg, TopicsSource([batch], {P0: 1, P1: 2}))
    assert rows(tmp_path) == [{"id": 1, "name": "p1"}, {"id": 2, "name": "p1"}]
    table = DeltaTable(str(tmp_path / "table"))
    assert (table.transaction_version("cdc-0"), table.transaction_version("cdc-1")) == (0, 1)
    assert len(table.history()) == 2  # the create, then ONE merge for both partitions


def test_soft_deletes_keep_the_row_marked_and_change_columns_record_the_op(tmp_path: Path) -> None:
    cfg = config(tmp_path, K2D_TABLE__SCHEMA=SCHEMA, K2D_TABLE__DELETE_MODE="soft", K2D_TABLE__CHANGE_COLUMNS="op")
    ingest_until_caught_up(
        cfg, TopicsSource([plain(P0, 0, [(1, {"id": 1, "name": "a"}), (2, {"id": 2, "name": "b"})])], {P0: 2})
    )
    ingest_until_caught_up(cfg, TopicsSource([plain(P0, 2, [(1, None), (2, {"id": 2, "name": "b2"})])], {P0: 4}))
    assert rows(tmp_path) == [
        {"id": 1, "name": "a", "_op": "d", "_deleted": True},
        {"id": 2, "name": "b2", "_op": "u", "_deleted": False},
    ]


def test_a_message_that_cannot_be_read_is_a_dead_letter_and_the_keys_later_changes_apply(tmp_path: Path) -> None:
    cfg = config(tmp_path, K2D_TABLE__SCHEMA=json.dumps({"id": "long", "n": "int"}))
    bad = change_batch(P0, 1, [(b'{"id": 1}', b"{not json"), (b'{"id": 1}', b'{"id": 1, "n": "x"}')])
    batches = [plain(P0, 0, [(1, {"id": 1, "n": 1})]), bad, plain(P0, 3, [(1, {"id": 1, "n": 4})])]
    ingest_until_caught_up(cfg, TopicsSource(batches, {P0: 4}))
    assert rows(tmp_path) == [{"id": 1, "n": 4}]
    letters = DeltaTable(str(tmp_path / "dlq")).to_pyarrow_table().sort_by("offset").to_pylist()
    assert [(letter["offset"], letter["stage"]) for letter in letters] == [(1, "deserialize"), (2, "coerce")]


def test_a_row_without_its_key_columns_takes_them_from_the_kafka_key(tmp_path: Path) -> None:
    cfg = config(tmp_path, K2D_TABLE__SCHEMA=SCHEMA)
    typed = {"schema": {"type": "struct", "fields": [{"field": "name", "type": "string", "optional": True}]}}
    batch = change_batch(
        P0,
        0,
        [
            (None, None),
            (None, b'{"name": "no key anywhere"}'),
            (b'{"other": 1}', b'{"name": "a key without id"}'),
            (b'{"id": 5}', b'{"name": "id from the key"}'),
            (b'{"id": 6}', b'{"id": null, "name": "null id, from the key"}'),
            (b'{"id": 7}', b'{"id": 8, "name": "the value wins"}'),
            (b'{"id": 9}', json.dumps({**typed, "payload": {"name": "typed by the Connect schema"}}).encode()),
        ],
    )
    ingest_until_caught_up(cfg, TopicsSource([batch], {P0: 7}))
    assert rows(tmp_path) == [
        {"id": 5, "name": "id from the key"},
        {"id": 6, "name": "null id, from the key"},
        {"id": 8, "name": "the value wins"},
        {"id": 9, "name": "typed by the Connect schema"},
    ]
    letters = DeltaTable(str(tmp_path / "dlq")).to_pyarrow_table().sort_by("offset").to_pylist()
    assert [letter["offset"] for letter in letters] == [0, 1, 2]
    assert "no key to delete" in letters[0]["error"]
    for letter in letters[1:]:
        assert "no value for the key column(s) ['id'], nor has its Kafka key" in letter["error"], letter["error"]


ORDERS = SourceTable(
    "orders",
    [
        field("id", "int64", optional=False),
        field(
            "amount",
            "bytes",
            logical="org.apache.kafka.connect.data.Decimal",
            scale="2",
            connect_decimal_precision="10",
        ),
        field("ratio", "struct", logical="io.debezium.data.VariableScaleDecimal")
        | {"fields": [field("scale", "int32", optional=False), field("value", "bytes", optional=False)]},
        field("day", "int32", logical="io.debezium.time.Date"),
        field("at", "int64", logical="io.debezium.time.MicroTime"),
        field("created", "int64", logical="io.debezium.time.MicroTimestamp"),
        field("updated", "string", logical="io.debezium.time.ZonedTimestamp"),
        field("doc", "string", logical="io.debezium.data.Json"),
        field("uid", "string", logical="io.debezium.data.Uuid"),
        {"type": "array", "items": {"type": "string", "optional": True}, "optional": True, "field": "tags"},
        field("note", "string"),
    ],
    key=["id"],
)


def order(order_id: int, note: str | None = "n") -> dict[str, Any]:
    return {
        "id": order_id,
        "amount": decimal_bytes(-12345),
        "ratio": {"scale": 3, "value": decimal_bytes(1500)},
        "day": 19_723,
        "at": 3_723_000_001,
        "created": 1_700_000_000_123_456,
        "updated": "2023-11-14T22:13:20.5+02:00",
        "doc": '{"a": [1, 2]}',
        "uid": "6f1c0a52-4e1b-4a36-9d8e-3f5b2a1c0d9e",
        "tags": ["x", None],
        "note": note,
    }


@pytest.mark.parametrize("schemas", [True, False], ids=["with-schema", "without-schema"])
def test_debezium_events_land_with_their_logical_types(tmp_path: Path, schemas: bool) -> None:
    env = {"K2D_FORMAT__ENVELOPE": "debezium", "K2D_TABLE__CHANGE_COLUMNS": "op,source_ts,lsn"}
    if schemas:
        env["K2D_TABLE__SCHEMA_EVOLUTION"] = "merge"  # the table is created from the Connect schema
    else:
        columns = {
            "id": "long",
            "amount": "decimal(10,2)",
            "ratio": "string",
            "day": "date",
            "at": "string",
            "created": "timestamp_ntz",
            "updated": "timestamp",
            "doc": "string",
            "uid": "string",
            "tags": "array<string>",
            "note": "string",
        }
        env["K2D_TABLE__SCHEMA"] = json.dumps(columns)
    cfg = config(tmp_path, **env)
    events = [
        ORDERS.event("r", order(1), lsn=10, schemas=schemas),
        ORDERS.event("c", order(2), lsn=11, schemas=schemas),
        ORDERS.event("u", order(1, note="changed"), lsn=12, schemas=schemas),
        ORDERS.event("d", {"id": 2, **dict.fromkeys(list(order(2))[1:])}, lsn=13, schemas=schemas),
        (ORDERS.key_bytes({"id": 2}, schemas), None),
        # A primary-key change: the delete of the old key, then the create of the new one.
        ORDERS.event("d", {"id": 1, **dict.fromkeys(list(order(1))[1:])}, lsn=14, schemas=schemas),
        (ORDERS.key_bytes({"id": 1}, schemas), None),
        ORDERS.event("c", order(7, note="moved"), lsn=14, schemas=schemas),
    ]
    ingest_until_caught_up(cfg, TopicsSource([change_batch(P0, 0, events)], {P0: len(events)}))
    table = DeltaTable(str(tmp_path / "table"))
    got = rows(tmp_path)
    assert len(got) == 1
    row = got[0]
    assert row["id"] == 7 and row["note"] == "moved"
    assert row["amount"] == Decimal("-123.45")
    assert row["ratio"] == "1.500"
    assert row["day"] == dt.date(2024, 1, 1)
    assert row["created"] == dt.datetime(2023, 11, 14, 22, 13, 20, 123456)
    assert row["updated"] == dt.datetime(2023, 11, 14, 20, 13, 20, 500000, tzinfo=dt.UTC)
    assert row["doc"] == '{"a": [1, 2]}' and row["uid"] == "6f1c0a52-4e1b-4a36-9d8e-3f5b2a1c0d9e"
    assert row["tags"] == ["x", None]
    assert row["_op"] == "c" and row["_lsn"] == 14
    assert row["_source_ts"] == dt.datetime.fromtimestamp(1_700_000_000.014, dt.UTC)
    schema = pa.schema(table.schema().to_arrow())
    if schemas:
        assert row["at"] == "01:02:03.000001"
        assert schema.names[0] == "id" and schema.field("id").nullable is False
        assert pa.types.is_decimal(schema.field("amount").type)
        assert (schema.field("amount").type.precision, schema.field("amount").type.scale) == (10, 2)
    assert table.transaction_version("cdc-0") == len(events) - 1


def test_a_column_added_in_the_source_becomes_a_column_earlier_rows_null(tmp_path: Path) -> None:
    cfg = config(tmp_path, K2D_FORMAT__ENVELOPE="debezium", K2D_TABLE__SCHEMA_EVOLUTION="merge")
    before = SourceTable("t", [field("id", "int32", optional=False), field("name", "string")], ["id"])
    after = SourceTable("t", [*before.columns, field("extra", "int64")], ["id"])
    first = [before.event("c", {"id": 1, "name": "a"}, lsn=1), before.event("c", {"id": 2, "name": "b"}, lsn=2)]
    ingest_until_caught_up(cfg, TopicsSource([change_batch(P0, 0, first)], {P0: 2}))
    second = [after.event("c", {"id": 3, "name": "c", "extra": 30}, lsn=3)]
    ingest_until_caught_up(cfg, TopicsSource([change_batch(P0, 2, second)], {P0: 3}))
    assert rows(tmp_path) == [
        {"id": 1, "name": "a", "extra": None},
        {"id": 2, "name": "b", "extra": None},
        {"id": 3, "name": "c", "extra": 30},
    ]
    schema = pa.schema(DeltaTable(str(tmp_path / "table")).schema().to_arrow())
    assert schema.field("id").nullable is False  # the key stays not null through the evolution


def test_a_column_the_connect_schema_declares_is_a_column_while_every_value_is_null(tmp_path: Path) -> None:
    """A replica has its source's columns: one null in every row so far (nobody fills it yet), and one the source
    added, are created from the Connect schema all the same. (Without a schema, a field waits for a value.)"""
    cfg = config(tmp_path, K2D_FORMAT__ENVELOPE="debezium", K2D_TABLE__SCHEMA_EVOLUTION="merge")
    source = SourceTable("t", [field("id", "int32", optional=False), field("legacy", "int64")], ["id"])
    added = SourceTable("t", [*source.columns, field("extra", "double")], ["id"])
    ingest_until_caught_up(
        cfg, TopicsSource([change_batch(P0, 0, [source.event("c", {"id": 1, "legacy": None})])], {P0: 1})
    )
    second = [added.event("u", {"id": 1, "legacy": None, "extra": None}, lsn=2)]
    ingest_until_caught_up(cfg, TopicsSource([change_batch(P0, 1, second)], {P0: 2}))
    assert rows(tmp_path) == [{"id": 1, "legacy": None, "extra": None}]
    schema = pa.schema(DeltaTable(str(tmp_path / "table")).schema().to_arrow())
    assert schema == pa.schema(
        [pa.field("id", pa.int32(), nullable=False), ("legacy", pa.int64()), ("extra", pa.float64())]
    )


def test_versions_of_one_batch_that_disagree_on_a_column_still_declare_the_others(tmp_path: Path) -> None:
    """Found by review: when a column changed type between two versions in one batch (so their rows take the
    per-message lane), a new table lost the columns both still declare while null, and the key's type."""
    cfg = config(tmp_path, K2D_FORMAT__ENVELOPE="debezium", K2D_TABLE__SCHEMA_EVOLUTION="merge")
    columns = [field("id", "int32", optional=False), field("c", "int32"), field("n", "string")]
    old = SourceTable("t", columns, ["id"])
    new = SourceTable("t", [columns[0], field("c", "string"), columns[2]], ["id"])
    batch = [old.event("c", {"id": 1, "c": 5, "n": None}), new.event("c", {"id": 2, "c": "x", "n": None}, lsn=2)]
    ingest_until_caught_up(cfg, TopicsSource([change_batch(P0, 0, batch)], {P0: 2}))
    schema = pa.schema(DeltaTable(str(tmp_path / "table")).schema().to_arrow())
    assert schema.field("id").type == pa.int32() and schema.field("n").type == pa.string()
    assert schema.names[0] == "id" and schema.field("c").type == pa.string()  # c typed by its values
    assert rows(tmp_path) == [{"id": 1, "c": "5", "n": None}, {"id": 2, "c": "x", "n": None}]


def test_a_truncate_is_a_dead_letter_that_says_why(tmp_path: Path) -> None:
    cfg = config(tmp_path, K2D_FORMAT__ENVELOPE="debezium", K2D_TABLE__SCHEMA=SCHEMA)
    truncate = json.dumps({"before": None, "after": None, "op": "t", "source": {"ts_ms": 1}}).encode()
    ingest_until_caught_up(cfg, TopicsSource([change_batch(P0, 0, [(None, truncate)])], {P0: 1}))
    (letter,) = DeltaTable(str(tmp_path / "dlq")).to_pyarrow_table().to_pylist()
    assert "TRUNCATE" in letter["error"]


@pytest.mark.parametrize(
    ("env", "key", "says"),
    [
        ({"K2D_TABLE__KEY": ""}, "table.key", "required"),
        ({"K2D_FORMAT__KEY": "none"}, "format.key", "tombstone"),
        ({"K2D_TABLE__SCHEMA": SCHEMA, "K2D_TABLE__KEY": "nope"}, "table.key", "not in the table schema"),
        ({"K2D_TABLE__CHANGE_COLUMNS": "lsn"}, "table.change_columns", "debezium"),
        # Found by review: a delete carries only the key, and skips the transforms.
        ({"K2D_TABLE__SCHEMA": json.dumps({"id": "long", "name": "string not null"})}, "table.schema", "nullable"),
        ({"K2D_TRANSFORMS": json.dumps({"id": "other_id"})}, "transforms", "a delete could not match"),
        ({"K2D_TABLE__MODE": "append"}, "table.key", "upsert"),
        (
            {"K2D_TABLE__MODE": "append", "K2D_TABLE__KEY": "", "K2D_FORMAT__ENVELOPE": "debezium"},
            "format.envelope",
            "",
        ),
        (
            {"K2D_TABLE__MODE": "append", "K2D_TABLE__KEY": "", "K2D_FORMAT__DECIMAL_HANDLING": "precise"},
            "format.decimal_handling",
            "upsert",
        ),
        (
            {"K2D_FORMAT__DECIMAL_HANDLING": "exact"},
            "format.decimal_handling (from K2D_FORMAT__DECIMAL_HANDLING)",
            "auto",
        ),
    ],
)
def test_upsert_settings_are_checked_at_start_naming_the_key(
    tmp_path: Path, env: dict[str, str], key: str, says: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        config(tmp_path, **env)
    assert raised.value.key == key and says in raised.value.problem


def test_an_unchanged_toasted_value_keeps_the_rows_value(tmp_path: Path) -> None:
    cfg = config(
        tmp_path,
        K2D_FORMAT__ENVELOPE="debezium",
        K2D_TABLE__SCHEMA=json.dumps({"id": "long", "doc": "string", "note": "string"}),
    )
    table = SourceTable(
        "t", [field("id", "int64", optional=False), field("doc", "string"), field("note", "string")], ["id"]
    )
    ingest_until_caught_up(
        cfg, TopicsSource([change_batch(P0, 0, [table.event("c", {"id": 1, "doc": "x" * 3000, "note": "a"})])], {P0: 1})
    )
    unchanged = {"id": 1, "doc": "__debezium_unavailable_value", "note": "b"}
    ingest_until_caught_up(cfg, TopicsSource([change_batch(P0, 1, [table.event("u", unchanged)])], {P0: 2}))
    assert rows(tmp_path) == [{"id": 1, "doc": "x" * 3000, "note": "b"}]


PLACEHOLDER = "__debezium_unavailable_value"


def test_unchanged_toasted_bytes_and_arrays_keep_the_rows_values_and_a_new_row_gets_null(tmp_path: Path) -> None:
    """Found by review: only strings were kept (a bytea or text[] column got the placeholder written over its
    value), and an update of a key the table lacked inserted the placeholder text itself."""
    cfg = config(tmp_path, K2D_FORMAT__ENVELOPE="debezium", K2D_TABLE__SCHEMA_EVOLUTION="merge")
    tags = field("tags", "array") | {"items": {"type": "string", "optional": True}}
    table = SourceTable(
        "t", [field("id", "int64", optional=False), field("doc", "string"), field("blob", "bytes"), tags], ["id"]
    )
    first = {"id": 1, "doc": "D", "blob": base64.b64encode(b"REAL").decode(), "tags": ["a", "b"]}
    ingest_until_caught_up(cfg, TopicsSource([change_batch(P0, 0, [table.event("c", first)])], {P0: 1}))
    unchanged = {
        "id": 1,
        "doc": PLACEHOLDER,
        "blob": base64.b64encode(PLACEHOLDER.encode()).decode(),
        "tags": [PLACEHOLDER],
    }
    unknown = {"id": 2, "doc": PLACEHOLDER, "blob": None, "tags": None}
    second = [table.event("u", unchanged, lsn=1), table.event("u", unknown, lsn=2)]
    ingest_until_caught_up(cfg, TopicsSource([change_batch(P0, 1, second)], {P0: 3}))
    assert rows(tmp_path) == [
        {"id": 1, "doc": "D", "blob": b"REAL", "tags": ["a", "b"]},
        {"id": 2, "doc": None, "blob": None, "tags": None},
    ]


def test_a_column_added_beside_a_toasted_value_adds_only_the_column(tmp_path: Path) -> None:
    """Found by review: the MERGE source's flag for a TOASTed value no change had filled became a table column
    when the same flush added a column; the next such flush then crashed delta-rs (a duplicate column)."""
    cfg = config(tmp_path, K2D_FORMAT__ENVELOPE="debezium", K2D_TABLE__SCHEMA_EVOLUTION="merge")
    columns = [field("id", "int64", optional=False), field("doc", "string")]
    old, new = SourceTable("t", columns, ["id"]), SourceTable("t", [*columns, field("extra", "string")], ["id"])
    ingest_until_caught_up(cfg, TopicsSource([change_batch(P0, 0, [old.event("c", {"id": 1, "doc": "D"})])], {P0: 1}))
    for offset, extra in ((1, "x"), (2, "y")):
        toasted = new.event("u", {"id": 1, "doc": PLACEHOLDER, "extra": extra}, lsn=offset)
        ingest_until_caught_up(cfg, TopicsSource([change_batch(P0, offset, [toasted])], {P0: offset + 1}))
    assert DeltaTable(str(tmp_path / "table")).schema().to_arrow().names == ["id", "doc", "extra"]
    assert rows(tmp_path) == [{"id": 1, "doc": "D", "extra": "y"}]


def test_unchanged_toasted_values_of_every_type_debezium_sends_keep_the_rows_values(tmp_path: Path) -> None:
    """Found by review: Debezium's placeholder for an int[], bigint[] or date[] (its bytes as numbers), an hstore
    (a map, or JSON text), a uuid[] (a name-based UUID) or a bytea[] was written over the row's value."""
    cfg = config(tmp_path, K2D_FORMAT__ENVELOPE="debezium", K2D_TABLE__SCHEMA_EVOLUTION="merge")
    date = {"type": "int32", "optional": True, "name": "io.debezium.time.Date"}
    columns: dict[str, dict[str, Any]] = {
        "ints": {"type": "array", "items": {"type": "int32", "optional": True}},
        "longs": {"type": "array", "items": {"type": "int64", "optional": True}},
        "days": {"type": "array", "items": date},
        "hstore": {"type": "map", "keys": {"type": "string"}, "values": {"type": "string", "optional": True}},
        "hstore_json": {"type": "string", "name": "io.debezium.data.Json"},
        "uuids": {"type": "array", "items": {"type": "string", "optional": True, "name": "io.debezium.data.Uuid"}},
        "blobs": {"type": "array", "items": {"type": "bytes", "optional": True}},
    }
    source = SourceTable(
        "t",
        [field("id", "int64", optional=False), field("note", "string")]
        + [{**schema, "optional": True, "field": name} for name, schema in columns.items()],
        ["id"],
    )
    values = {
        "ints": [1, 2],
        "longs": [2**40],
        "days": [19_723],
        "hstore": {"a": "1"},
        "hstore_json": '{"a":"1"}',
        "uuids": ["6f1c0a52-4e1b-4a36-9d8e-3f5b2a1c0d9e"],
        "blobs": [base64.b64encode(b"REAL").decode()],
    }
    first = source.event("c", {"id": 1, "note": "a", **values})
    ingest_until_caught_up(cfg, TopicsSource([change_batch(P0, 0, [first])], {P0: 1}))
    placeholder = list(PLACEHOLDER.encode())
    toasted = {
        "ints": placeholder,
        "longs": placeholder,
        "days": placeholder,
        "hstore": {PLACEHOLDER: PLACEHOLDER},
        "hstore_json": json.dumps({PLACEHOLDER: PLACEHOLDER}, separators=(",", ":")),
        "uuids": ["b68a35a7-17ad-35b3-af2a-ae46edb4545a"],  # Java: UUID.nameUUIDFromBytes(placeholder bytes)
        "blobs": [base64.b64encode(PLACEHOLDER.encode()).decode()],
    }
    second = [source.event("u", {"id": 1, "note": "b", **toasted}, lsn=1), source.event("u", {"id": 2, **toasted})]
    ingest_until_caught_up(cfg, TopicsSource([change_batch(P0, 1, second)], {P0: 3}))
    kept, new = rows(tmp_path)
    assert kept == {
        "id": 1,
        "note": "b",
        "ints": [1, 2],
        "longs": [2**40],
        "days": [dt.date(2024, 1, 1)],
        "hstore": [("a", "1")],
        "hstore_json": '{"a":"1"}',
        "uuids": ["6f1c0a52-4e1b-4a36-9d8e-3f5b2a1c0d9e"],
        "blobs": [b"REAL"],
    }
    assert new == {"id": 2, "note": None, **dict.fromkeys(columns)}  # a row the table lacked: no value to keep


def test_an_unchanged_toasted_map_takes_the_keys_earlier_value_in_the_flush() -> None:
    hstore = pa.map_(pa.string(), pa.string())
    changes = pa.table({"id": [1, 1], "h": pa.array([[("a", "1")], [(PLACEHOLDER, PLACEHOLDER)]], hstore)})
    collapsed = last_changes(changes, pa.array([False, False]), ["id"], PLACEHOLDER)
    assert collapsed.column("h").to_pylist() == [[("a", "1")]]


@pytest.mark.parametrize("split", [(3,), (2, 1), (1, 1, 1)], ids=["one-flush", "tombstone-alone", "each-alone"])
def test_a_soft_delete_keeps_the_delete_events_position_after_its_tombstone(
    tmp_path: Path, split: tuple[int, ...]
) -> None:
    """Found by review: the tombstone Debezium writes after a delete event (no source, no position) blanked the
    deleted row's _source_ts and _lsn, in one flush or in the next."""
    cfg = config(
        tmp_path,
        K2D_FORMAT__ENVELOPE="debezium",
        K2D_TABLE__DELETE_MODE="soft",
        K2D_TABLE__CHANGE_COLUMNS="op,source_ts,lsn",
        K2D_TABLE__SCHEMA_EVOLUTION="merge",
    )
    source = SourceTable("t", [field("id", "int64", optional=False), field("doc", "string")], ["id"])
    key, delete = source.event("d", {"id": 1, "doc": "x"}, lsn=7)
    changes = [source.event("c", {"id": 1, "doc": "x"}, lsn=1), (key, delete), (key, None)]
    offset = 0
    for size in split:
        batch = change_batch(P0, offset, changes[offset : offset + size])
        offset += size
        ingest_until_caught_up(cfg, TopicsSource([batch], {P0: offset}))
    deleted_at = dt.datetime.fromtimestamp(1_700_000_000.007, dt.UTC)
    assert rows(tmp_path) == [{"id": 1, "doc": "x", "_op": "d", "_source_ts": deleted_at, "_lsn": 7, "_deleted": True}]
    table = DeltaTable(str(tmp_path / "table"))
    if split[-1] == 1:  # the tombstone alone: the deleted row is not rewritten, the txn still moves
        assert table.history(1)[0]["operation"] != "MERGE"
    assert table.transaction_version("cdc-0") == 2


def test_a_schemaless_decimal_reads_as_format_decimal_handling_says() -> None:
    """Found by review: base64 made of digits ("1234", the bytes d7 6d f8) was read as the number 1234; and a fix
    reading every text without a "." as base64 turned string mode's "100" (a numeric without scale) into an error
    and "1234" into -26588.24. Only the setting (Debezium's decimal.handling.mode) tells them apart."""
    amount = pa.decimal128(10, 2)
    as_bytes = Decimal(int.from_bytes(base64.b64decode("1234"), "big", signed=True)) / 100
    assert fit_to_column("1234", amount, "amount", "precise") == as_bytes == Decimal("-26588.24")
    assert fit_to_column("1234", amount, "amount", "string") == Decimal(1234)
    assert fit_to_column("1234", amount, "amount") == Decimal(1234)  # auto: a number first
    assert fit_to_column("AJg=", amount, "amount") == Decimal("1.52")  # auto: base64 when it is no number
    assert fit_to_column("12.50", amount, "amount", "string") == Decimal("12.50")
    with pytest.raises(MessageError, match="amount: 'AJg=' is not a decimal number"):
        fit_to_column("AJg=", amount, "amount", "string")
    with pytest.raises(MessageError, match="amount: bytes are not base64"):
        fit_to_column("100", amount, "amount", "precise")
    with pytest.raises(MessageError, match="not base64"):
        fit_to_column("NaN", amount, "amount")  # never a number a decimal column holds


def test_a_value_its_column_cannot_read_is_a_dead_letter_not_a_stop(tmp_path: Path) -> None:
    """Found by review: reading a schema-less value by its column's type ran outside the per-message lane, so a
    decimal that was no number stopped the daemon, and again at every restart."""
    cfg = config(
        tmp_path,
        K2D_TABLE__SCHEMA=json.dumps({"id": "long", "amount": "decimal(12,2)"}),
        K2D_FORMAT__DECIMAL_HANDLING="string",
    )
    messages = [
        (b'{"id": 1}', b'{"id": 1, "amount": "100"}'),
        (b'{"id": 2}', b'{"id": 2, "amount": "a!"}'),
        (b'{"id": 3}', b'{"id": 3, "amount": "12.5"}'),
    ]
    ingest_until_caught_up(cfg, TopicsSource([change_batch(P0, 0, messages)], {P0: 3}))
    assert rows(tmp_path) == [{"id": 1, "amount": Decimal("100.00")}, {"id": 3, "amount": Decimal("12.50")}]
    letters = DeltaTable(str(tmp_path / "dlq")).to_pyarrow_table().to_pylist()
    assert [(r["offset"], r["stage"]) for r in letters] == [(1, "deserialize")]
    assert "amount: 'a!' is not a decimal number" in letters[0]["error"]


def test_a_decimal_wider_than_delta_holds_is_text_in_plain_notation() -> None:
    """Found by review: str() wrote a zero with scale 20 as '0E-20'."""
    wide = field(
        "n", "bytes", logical="org.apache.kafka.connect.data.Decimal", scale="20", connect_decimal_precision="40"
    )
    assert convert(decimal_bytes(0), wide, "n") == "0.00000000000000000000"
    assert convert(decimal_bytes(-5), wide, "n") == "-0.00000000000000000005"


@pytest.mark.parametrize("flushes", [1, 2])
def test_a_soft_delete_and_a_toasted_update_end_alike_in_one_flush_or_two(tmp_path: Path, flushes: int) -> None:
    """Found by review: in one flush, a soft delete after its key's insert left no row (two flushes: the row,
    marked), and a toasted update after a soft delete took the delete's null as the value (two flushes: kept)."""
    cfg = config(
        tmp_path,
        K2D_FORMAT__ENVELOPE="debezium",
        K2D_TABLE__DELETE_MODE="soft",
        K2D_TABLE__CHANGE_COLUMNS="op",
        K2D_TABLE__SCHEMA_EVOLUTION="merge",
    )
    source = SourceTable("t", [field("id", "int64", optional=False), field("doc", "string")], ["id"])
    changes = [
        source.event("c", {"id": 5, "doc": "x"}, lsn=1),
        source.event("d", {"id": 5, "doc": "x"}, lsn=2),
        source.event("c", {"id": 6, "doc": "D"}, lsn=3),
        source.event("d", {"id": 6, "doc": "D"}, lsn=4),
        source.event("u", {"id": 6, "doc": PLACEHOLDER}, lsn=5),
    ]
    if flushes == 1:
        batches = [change_batch(P0, 0, changes)]
    else:
        batches = [change_batch(P0, offset, [change]) for offset, change in enumerate(changes)]
    for batch in batches:
        last = batch.partitions[P0].offsets[-1]
        ingest_until_caught_up(cfg, TopicsSource([batch], {P0: last + 1}))
    assert rows(tmp_path) == [
        {"id": 5, "doc": "x", "_op": "d", "_deleted": True},
        {"id": 6, "doc": "D", "_op": "u", "_deleted": False},
    ]


def test_minus_zero_and_zero_are_one_float_key() -> None:
    """Found by review: Arrow's group_by kept them apart, and delta-rs's MERGE then failed on every retry (two
    source rows for one target row)."""
    rows = pa.table({"k": pa.array([0.0, -0.0, 1.5]), "v": ["a", "b", "c"]})
    collapsed = last_changes(rows, pa.array([False, False, False]), ["k"])
    assert collapsed.select(["k", "v"]).to_pylist() == [{"k": 0.0, "v": "b"}, {"k": 1.5, "v": "c"}]


def test_upsert_commits_take_the_coordinators_ingest_turn(tmp_path: Path) -> None:
    locks = tmp_path / "locks"
    cfg = config(
        tmp_path,
        K2D_TABLE__SCHEMA=SCHEMA,
        K2D_COORDINATOR__BACKEND="file",
        K2D_COORDINATOR__LOCK_DIR=str(locks),
        K2D_COORDINATOR__RESOURCE="cdc",
        K2D_COORDINATOR__JOIN_INGEST="true",
    )
    ingest_until_caught_up(cfg, TopicsSource([plain(P0, 0, [(1, {"id": 1, "name": "a"})])], {P0: 1}))
    ingest_until_caught_up(cfg, TopicsSource([plain(P0, 1, [(1, None)])], {P0: 2}))
    assert rows(tmp_path) == []
    with Coordinator(FileBackend(str(locks), "cdc"), "cdc") as coordinator:
        last = coordinator.last()
    assert last is not None and last.job == "ingest" and last.sequence == 2


def test_a_key_column_from_the_kafka_key_types_a_new_table_or_is_a_dead_letter(tmp_path: Path) -> None:
    """A typed row (here by its Connect schema) without its key column, for a table created from its first rows:
    the column is typed by the key's value; a value Arrow cannot type is a dead letter, not a stop."""
    cfg = config(tmp_path, K2D_TABLE__SCHEMA_EVOLUTION="merge")
    typed = {"schema": {"type": "struct", "fields": [{"field": "name", "type": "string", "optional": True}]}}
    value = json.dumps({**typed, "payload": {"name": "typed"}}).encode()
    keys = [b'{"id": 1180591620717411303424}', b'{"id": {}}', b'{"id": [null]}', b'{"id": 7}']
    batch = change_batch(P0, 0, [(key, value) for key in keys])
    ingest_until_caught_up(cfg, TopicsSource([batch], {P0: 4}))
    assert rows(tmp_path) == [{"id": 7, "name": "typed"}]
    assert DeltaTable(str(tmp_path / "table")).schema().to_arrow().field("id").type == pa.int64()
    letters = DeltaTable(str(tmp_path / "dlq")).to_pyarrow_table().sort_by("offset").to_pylist()
    assert [(letter["offset"], letter["stage"]) for letter in letters] == [
        (0, "deserialize"),
        (1, "deserialize"),
        (2, "deserialize"),
    ]
    assert "the Kafka key's 'id' has no Arrow type" in letters[0]["error"], letters[0]["error"]
    for letter in letters[1:]:
        assert "has no type Parquet can write" in letter["error"], letter["error"]
