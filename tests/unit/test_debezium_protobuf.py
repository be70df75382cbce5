"""Debezium change events through Confluent's Protobuf converter (``key.converter`` and ``value.converter`` both
``ProtobufConverter``): keys and values in the Confluent wire format, read through a registry on loopback, into an
upsert and a changelog table typed by the envelope's ``after`` image (not by the first batch's values)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from kafka2delta.config import Config
from kafka2delta.records import TopicPartition
from tests.support.debezium import change_batch, change_config
from tests.support.protobuf import compile_with_protoc, message_class
from tests.support.registry import FakeRegistry
from tests.support.runner import TopicsSource, ingest_until_caught_up
from tests.support.serialization import confluent

# The shape the converter gives a Debezium envelope: the row images and the source block as nested messages.
ENVELOPE = """
syntax = "proto3";
package shop.public.orders;
import "google/protobuf/timestamp.proto";

message Envelope {
  Value before = 1;
  Value after = 2;
  Source source = 3;
  string op = 4;
  optional int64 ts_ms = 5;

  message Value {
    int32 id = 1;
    optional string note = 2;
    map<string, int64> counts = 3;
    google.protobuf.Timestamp placed_at = 4;
  }
  message Source {
    string connector = 1;
    int64 ts_ms = 2;
    optional int64 lsn = 3;
  }
}
"""
KEY = 'syntax = "proto3"; package shop.public.orders; message Key { int32 id = 1; }'
VALUE_ID, KEY_ID = 31, 32
P0 = TopicPartition("cdc", 0)
PLACED = dt.datetime(2026, 11, 27, 9, 30, tzinfo=dt.UTC)

Envelope = message_class(compile_with_protoc({"orders.proto": ENVELOPE}, "orders.proto"), "shop.public.orders.Envelope")
Key = message_class(compile_with_protoc({"key.proto": KEY}, "key.proto"), "shop.public.orders.Key")


@pytest.fixture
def registry(fake_registry: FakeRegistry) -> FakeRegistry:
    fake_registry.state.register(VALUE_ID, ENVELOPE, "PROTOBUF")
    fake_registry.state.register(KEY_ID, KEY, "PROTOBUF")
    return fake_registry


def row(order_id: int, note: str | None = None, **counts: int) -> dict[str, Any]:
    image: dict[str, Any] = {"id": order_id, "counts": counts}
    image["placed_at"] = {"seconds": int(PLACED.timestamp()) + order_id}
    if note is not None:
        image["note"] = note
    return image


def event(op: str, lsn: int, *, before: dict[str, Any] | None = None, after: dict[str, Any] | None = None) -> bytes:
    message = Envelope(op=op, ts_ms=lsn, source={"connector": "postgresql", "ts_ms": 1_700_000_000_000, "lsn": lsn})
    if before is not None:
        message.before.CopyFrom(Envelope.Value(**before))
    if after is not None:
        message.after.CopyFrom(Envelope.Value(**after))
    return confluent(VALUE_ID, message.SerializeToString(), b"\x00")


def key(order_id: int) -> bytes:
    return confluent(KEY_ID, Key(id=order_id).SerializeToString(), b"\x00")


def changes() -> list[tuple[bytes, bytes | None]]:
    """Order 1 created then updated (its note first null), order 2 created, deleted and tombstoned, order 3
    created with no note at all (no value of the first batch says ``note`` is a string), order 4 created and then
    deleted by a tombstone alone (its ``d`` compacted away): only the Protobuf key names what it deletes."""
    return [
        (key(1), event("c", 10, after=row(1))),
        (key(2), event("c", 11, after=row(2, a=1))),
        (key(4), event("c", 12, after=row(4))),
        (key(1), event("u", 13, before=row(1), after=row(1, "gift", a=2, b=3))),
        (key(2), event("d", 14, before=row(2, a=1))),
        (key(2), None),  # the tombstone that follows a delete
        (key(3), event("r", 15, after=row(3))),
        (key(4), None),
    ]


def protobuf_config(tmp_path: Path, mode: str, registry: FakeRegistry, **env: str) -> Config:
    return change_config(
        tmp_path,
        mode,
        K2D_FORMAT__TYPE="protobuf",
        K2D_FORMAT__KEY="protobuf",
        K2D_FORMAT__ENVELOPE="debezium",
        K2D_SCHEMA_REGISTRY__URL=registry.url,
        **env,
    )


ROW_SCHEMA = [
    pa.field("id", pa.int32(), nullable=False),
    ("note", pa.string()),
    ("counts", pa.map_(pa.string(), pa.int64())),
    ("placed_at", pa.timestamp("us", "UTC")),
]


def test_an_upsert_table_is_typed_by_the_after_image_and_protobuf_keys_delete(
    tmp_path: Path, registry: FakeRegistry
) -> None:
    cfg = protobuf_config(tmp_path, "upsert", registry, K2D_TABLE__CHANGE_COLUMNS="op,lsn")
    ingest_until_caught_up(cfg, TopicsSource([change_batch(P0, 0, changes()[:3])], {P0: 3}))
    # Typed by the message type from the first flush, where no change has a value for note yet.
    schema = pa.schema(DeltaTable(str(tmp_path / "table")).schema().to_arrow())
    assert schema == pa.schema([*ROW_SCHEMA, ("_op", pa.string()), ("_lsn", pa.int64())])
    ingest_until_caught_up(cfg, TopicsSource([change_batch(P0, 3, changes()[3:])], {P0: 8}))
    table = DeltaTable(str(tmp_path / "table"))
    assert pa.schema(table.schema().to_arrow()) == schema
    rows = table.to_pyarrow_table().sort_by("id").to_pylist()
    for found in rows:
        found["counts"] = sorted(found["counts"])  # (a Protobuf map has no order)
    assert rows == [
        {
            "id": 1,
            "note": "gift",
            "counts": [("a", 2), ("b", 3)],
            "placed_at": PLACED + dt.timedelta(seconds=1),
            "_op": "u",
            "_lsn": 13,
        },
        {"id": 3, "note": None, "counts": [], "placed_at": PLACED + dt.timedelta(seconds=3), "_op": "r", "_lsn": 15},
    ]
    assert table.transaction_version("cdc-0") == 7
    assert DeltaTable(str(tmp_path / "dlq")).to_pyarrow_table().num_rows == 0  # every key decoded, every event read


def test_a_changelog_keeps_every_change_and_the_before_image_typed_as_the_row(
    tmp_path: Path, registry: FakeRegistry
) -> None:
    cfg = protobuf_config(tmp_path, "changelog", registry, K2D_TABLE__BEFORE_IMAGE="true")
    metrics = ingest_until_caught_up(cfg, TopicsSource([change_batch(P0, 0, changes())], {P0: 8}))
    table = DeltaTable(str(tmp_path / "table"))
    schema = pa.schema(table.schema().to_arrow())
    assert schema.field("_before").type == pa.struct([pa.field("id", pa.int32()), *ROW_SCHEMA[1:]])
    got = table.to_pyarrow_table().sort_by("kafka_offset").to_pylist()
    assert [(r["id"], r["_op"], r["_lsn"], r["note"], r["kafka_offset"]) for r in got] == [
        (1, "c", 10, None, 0),
        (2, "c", 11, None, 1),
        (4, "c", 12, None, 2),
        (1, "u", 13, "gift", 3),
        (2, "d", 14, None, 4),
        (3, "r", 15, None, 6),
    ]
    skipped = metrics.registry.get_sample_value(
        "kafka2delta_messages_skipped_total", {"topic": "cdc", "partition": "0", "reason": "empty"}
    )
    assert skipped == 2.0  # the tombstones: a changelog records the delete events
    assert got[3]["_before"]["counts"] == [] and got[4]["_before"]["counts"] == [("a", 1)]


# Two versions of a smaller envelope: v2 adds a member to a message nested in the row.
NESTED_V1 = """syntax = "proto3";
package shop.public.users;
message Envelope {
  Value before = 1;
  Value after = 2;
  string op = 4;
  message Value { int32 id = 1; Address address = 2; map<string, int64> counts = 3; }
  message Address { string street = 1; }
}
"""
NESTED_V2 = NESTED_V1.replace("string street = 1; }", "string street = 1; string zip = 2; }")
NESTED_IDS = (33, 34)


def nested_event(
    version: int, op: str, *, before: dict[str, Any] | None = None, after: dict[str, Any] | None = None
) -> bytes:
    text = (NESTED_V1, NESTED_V2)[version - 1]
    envelope = message_class(compile_with_protoc({"users.proto": text}, "users.proto"), "shop.public.users.Envelope")
    message = envelope(op=op, before=before, after=after)
    return confluent(NESTED_IDS[version - 1], message.SerializeToString(), b"\x00")


@pytest.mark.parametrize("mode", ["changelog", "upsert"])
def test_a_member_a_new_version_adds_to_a_nested_message_lands_and_changelog_deletes_are_typed(
    tmp_path: Path, registry: FakeRegistry, mode: str
) -> None:
    """Found by review: the rows of two versions in one batch were typed by the first one's nested message (the
    second's new member silently dropped), and a changelog's delete events were typed by their values (a first
    batch of deletes made ``counts`` a struct of its keys, and later keys were lost)."""
    for schema_id, text in zip(NESTED_IDS, (NESTED_V1, NESTED_V2), strict=True):
        registry.state.register(schema_id, text, "PROTOBUF")
    before_image = str(mode == "changelog").lower()
    cfg = protobuf_config(
        tmp_path, mode, registry, K2D_TABLE__BEFORE_IMAGE=before_image, K2D_TABLE__SCHEMA_EVOLUTION="merge"
    )
    first = [(key(1), nested_event(1, "d", before={"id": 1, "address": {"street": "s1"}, "counts": {"a": 1}}))]
    metrics = ingest_until_caught_up(cfg, TopicsSource([change_batch(P0, 0, first)], {P0: 1}))
    skipped = metrics.registry.get_sample_value(
        "kafka2delta_messages_skipped_total", {"topic": "cdc", "partition": "0", "reason": "empty"}
    )
    assert skipped == (1 if mode == "upsert" else None)  # an upsert's delete before any column: nothing to delete
    second = [
        (key(2), nested_event(1, "c", after={"id": 2, "address": {"street": "s2"}})),
        (key(3), nested_event(2, "c", after={"id": 3, "address": {"street": "s3", "zip": "Z3"}, "counts": {"c": 3}})),
        (key(2), nested_event(1, "u", before={"id": 2, "counts": {"b": 2}}, after={"id": 2, "counts": {"b": 3}})),
    ]
    ingest_until_caught_up(cfg, TopicsSource([change_batch(P0, 1, second)], {P0: 4}))
    table = DeltaTable(str(tmp_path / "table"))
    schema = pa.schema(table.schema().to_arrow())
    address = pa.struct([("street", pa.string()), ("zip", pa.string())])
    assert schema.field("address").type == address
    assert schema.field("counts").type == pa.map_(pa.string(), pa.int64())
    rows = {(r["id"], r.get("_op")): r for r in table.to_pyarrow_table().to_pylist()}
    assert DeltaTable(str(tmp_path / "dlq")).to_pyarrow_table().num_rows == 0
    if mode == "upsert":
        assert sorted(rows) == [(2, None), (3, None)]
        assert rows[3, None]["address"] == {"street": "s3", "zip": "Z3"} and rows[3, None]["counts"] == [("c", 3)]
        assert rows[2, None]["counts"] == [("b", 3)] and rows[2, None]["address"] is None
        return
    assert schema.field("_before").type == pa.struct(
        [("id", pa.int32()), ("address", address), ("counts", pa.map_(pa.string(), pa.int64()))]
    )
    assert sorted(rows) == [(1, "d"), (2, "c"), (2, "u"), (3, "c")]
    assert rows[1, "d"]["_before"] == {"id": 1, "address": {"street": "s1", "zip": None}, "counts": [("a", 1)]}
    assert rows[3, "c"]["address"] == {"street": "s3", "zip": "Z3"}
    assert rows[2, "u"]["_before"]["counts"] == [("b", 2)] and rows[2, "u"]["counts"] == [("b", 3)]
