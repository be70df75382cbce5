"""Protobuf in the AWS Glue Schema Registry's wire format: Glue's message index (the type's place among the
schema's message types sorted by full name), through the real Glue edge against moto's Glue API in process.

Each message must decode alone as it does in a batch large enough for the column lanes, whatever its
neighbours; what is not Glue's Protobuf is a dead letter naming why."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from google.type import date_pb2  # type: ignore[import-untyped]
from moto import mock_aws

from kafka2delta.config import FormatConfig, SchemaRegistryConfig
from kafka2delta.records import TopicPartition
from kafka2delta.registry_glue import GlueRegistry
from kafka2delta.serialization import Deserializer, build_deserializer, glue_message_order
from kafka2delta.serialization import protobuf as protobuf_module
from tests.support.debezium import change_batch, change_config
from tests.support.glue import AWS_PROTOS, REGION, GlueSchemas, glue_client, glue_frame, glue_protobuf
from tests.support.protobuf import compile_with_protoc, message_class
from tests.support.runner import TopicsSource, ingest_until_caught_up
from tests.support.serialization import confluent, messages

# Event sorts first, so Glue writes it as index 0 (one 0 byte), the column lanes' case.
V1 = """syntax = "proto3";
package shop;
message Order { string id = 1; repeated Line lines = 2; message Line { string sku = 1; int32 quantity = 2; } }
message Event { string id = 1; double amount = 2; User user = 3; map<string, int64> counts = 4; }
message User { int64 id = 1; }
"""
V2 = V1.replace("map<string, int64> counts = 4; }", "map<string, int64> counts = 4; optional string color = 5; }")
UNKNOWN = uuid.UUID("00000000-0000-4000-8000-00000000beef")
BATCH = 2 * protobuf_module.COLUMN_LANE_MIN_MESSAGES


@pytest.fixture
def glue() -> Iterator[GlueSchemas]:
    with mock_aws():
        yield GlueSchemas(glue_client())


def deserializer() -> Deserializer:
    edge = GlueRegistry(SchemaRegistryConfig(type="glue", region=REGION))
    return build_deserializer(FormatConfig(type="protobuf"), edge, "events")


def classes(text: str) -> dict[str, Any]:
    pool = compile_with_protoc({"shop.proto": text}, "shop.proto")
    names = ("Event", "Event.CountsEntry", "Order", "Order.Line", "User")
    return {name: message_class(pool, f"shop.{name}") for name in names}


def event(cls: Any, i: int, **extra: Any) -> Any:
    return cls(id=f"e{i}", amount=i / 2, user={"id": i}, counts={"k": i}, **extra)


def test_glue_counts_message_types_sorted_by_full_name() -> None:
    # AWS's MessageIndexFinder documents this file as B = 0, B.A = 1, B.A.D = 2, B.C = 3.
    pool = compile_with_protoc(
        {"b.proto": "syntax = 'proto3'; message B { message C {} message A { message D {} } }"}, "b.proto"
    )
    top = [pool.FindMessageTypeByName("B")]
    assert [d.full_name for d in glue_message_order(top)] == ["B", "B.A", "B.A.D", "B.C"]
    # Map entries are message types too, where protoc declares them.
    shop = compile_with_protoc({"shop.proto": V1}, "shop.proto").FindFileByName("shop.proto")
    names = [d.full_name for d in glue_message_order(list(shop.message_types_by_name.values()))]
    assert names == ["shop.Event", "shop.Event.CountsEntry", "shop.Order", "shop.Order.Line", "shop.User"]


def test_protobuf_in_glue_wire_format_in_both_lanes(glue: GlueSchemas) -> None:
    v1, v2 = glue.register("events", V1, "PROTOBUF"), glue.register("events", V2, "PROTOBUF")
    old, new = classes(V1), classes(V2)
    payloads = [glue_protobuf(v1, event(old["Event"], i), zlib_compressed=i % 3 == 0) for i in range(BATCH)]
    payloads += [glue_protobuf(v2, event(new["Event"], i, color="red" if i % 2 else None)) for i in range(BATCH)]
    order = old["Order"](id="o1", lines=[{"sku": "a", "quantity": 2}])
    payloads += [
        glue_protobuf(v1, old["User"](id=7)),  # index 4
        glue_protobuf(v2, order, zlib_compressed=True),  # index 2, nested messages inside
        glue_protobuf(v1, old["Order"].Line(sku="b", quantity=1)),  # index 3, a nested type
    ]
    lanes = deserializer()
    decoded = lanes.decode(messages(payloads), range(len(payloads)))
    assert decoded.failures == [] and decoded.typed
    column_lanes = [position for position in decoded.fast if position not in decoded.documents]
    assert column_lanes == list(range(2 * BATCH))  # every Event, and nothing else
    rows = dict(zip(decoded.fast, decoded.table.to_pylist(), strict=True))
    # One table for the topic: the columns of every message type, null where a type has none.
    assert rows[3] == {
        **dict.fromkeys(decoded.table.column_names),
        **{"id": "e3", "amount": 1.5, "user": {"id": 3}, "counts": [("k", 3)]},
    }
    assert rows[BATCH + 1]["color"] == "red" and rows[BATCH + 2]["color"] is None
    assert decoded.documents[2 * BATCH] == {"id": 7}
    assert decoded.documents[2 * BATCH + 1] == {"id": "o1", "lines": [{"sku": "a", "quantity": 2}]}
    assert decoded.documents[2 * BATCH + 2] == {"sku": "b", "quantity": 1}
    # Alone, through the per-message lane, each message decodes to the same values.
    one_by_one = deserializer()
    for position in (0, 3, BATCH + 1, BATCH + 2):
        alone = one_by_one.decode(messages([payloads[position]]), [0])
        assert alone.table.to_pylist()[0].items() <= rows[position].items()


def test_what_is_not_glue_protobuf_is_a_dead_letter(glue: GlueSchemas) -> None:
    version = glue.register("events", V1, "PROTOBUF")
    avro = glue.register("avro-events", {"type": "record", "name": "E", "fields": []})
    good = event(classes(V1)["Event"], 1)
    body = good.SerializeToString()
    bad = [
        confluent(1, body, b"\x00"),  # Confluent's framing
        glue_frame(version, b"\x09" + body),  # index 9: the file has 5 message types
        glue_frame(version, b""),  # no index
        glue_frame(version, b"\xff" * 11),  # a varint longer than 10 bytes
        glue_frame(UNKNOWN, b"\x00" + body),
        glue_frame(avro, b"\x00" + body),
        glue_frame(version, b"\x00" + body[:-1]),  # truncated inside a field
        b"\x03\x00",  # the start of a header, last in the batch
    ]
    # Enough good messages around them for the column lanes, and the bad ones among them and last.
    payloads = [glue_protobuf(version, good)] * BATCH + bad + [glue_protobuf(version, good)] * BATCH + bad
    decoded = deserializer().decode(messages(payloads), range(len(payloads)))
    assert decoded.fast == [*range(BATCH), *range(BATCH + len(bad), 2 * BATCH + len(bad))]
    reasons = {position: error.reason for position, error in decoded.failures}
    expected = [
        "not Glue wire format: header version byte 0x00, expected 0x03",
        f"message index 9 does not exist in schema version {version} (5 message types)",
        "truncated: the message index ends early",
        "not Glue wire format: a message index varint is longer than 10 bytes",
        f"schema version {UNKNOWN} is not in the Glue schema registry",
        f"schema version {avro} is a AVRO schema, not PROTOBUF",
        "not a valid protobuf message shop.Event",
        "truncated: 2 bytes, the Glue header needs 18",
    ]
    for first in (BATCH, 2 * BATCH + len(bad)):
        found = [reasons[first + i] for i in range(len(bad))]
        assert [reason[: len(text)] for reason, text in zip(found, expected, strict=True)] == expected


def test_google_types_are_built_in_and_an_unknown_import_is_named(glue: GlueSchemas) -> None:
    # AWS's serde resolves google/type/*.proto without a reference, as Confluent's does; Glue holds no
    # references, so any other import is a dead letter naming it.
    typed = """syntax = "proto3";
package shop;
import "google/type/date.proto";
import "google/type/money.proto";
message Payment { google.type.Date day = 1; google.type.Money amount = 2; }
"""
    version = glue.register("payments", typed, "PROTOBUF")
    unknown = glue.register(
        "acme", 'syntax = "proto3"; import "acme/money.proto"; message D { acme.Money m = 1; }', "PROTOBUF"
    )
    google = Path(date_pb2.__file__).parent  # the producer's copies of Google's files
    files = {
        "p.proto": typed,
        **{f"google/type/{n}.proto": (google / f"{n}.proto").read_text() for n in ("date", "money")},
    }
    payment = message_class(compile_with_protoc(files, "p.proto"), "shop.Payment")
    message = payment(day={"year": 2026, "month": 11, "day": 27}, amount={"currency_code": "EUR", "units": 3})
    payloads = [glue_protobuf(version, message), glue_frame(unknown, b"\x00")]
    decoded = deserializer().decode(messages(payloads), range(len(payloads)))
    assert decoded.table.to_pylist() == [
        {"day": {"year": 2026, "month": 11, "day": 27}, "amount": {"currency_code": "EUR", "units": 3, "nanos": 0}}
    ]
    [(position, error)] = decoded.failures
    assert position == 1 and 'Import "acme/money.proto" was not found' in error.reason


PRICES = """syntax = "proto3";
package shop;
import "additionalTypes/decimal.proto";
import "metadata/metadata.proto";
message Price {
  string id = 1;
  additionalTypes.Decimal amount = 2
      [(metadata.metadata_key) = "connect.decimal.scale", (metadata.metadata_value) = "2"];
  additionalTypes.Decimal rate = 3;
  repeated additionalTypes.Decimal history = 4;
}
"""


def test_aws_decimals_land_as_decimals_at_the_scale_their_metadata_names(glue: GlueSchemas) -> None:
    """``additionalTypes.Decimal`` (units + billionths) → decimal128(19 + s, s): s from the field's
    ``connect.decimal.scale``, else 9. One batch big enough for the column lanes, and each message alone; a value
    with more decimal places than its column is a dead letter naming the field, in both."""
    version = glue.register("prices", PRICES, "PROTOBUF")
    files = {"p.proto": PRICES, **AWS_PROTOS}
    price = message_class(compile_with_protoc(files, "p.proto"), "shop.Price")

    def priced(i: int) -> Any:
        # -89.5678 is units -89 and fraction -567,800,000, as AWS's converter writes it.
        rate = {"units": -i, "fraction": -567_800_000, "precision": 8, "scale": 6}
        amount = {"units": i, "fraction": (i % 100) * 10_000_000}
        return price(id=f"p{i}", amount=amount, rate=rate, history=[{"units": 2**63 - 1, "fraction": 999_999_999}])

    inexact = price(id="bad", amount={"units": 1, "fraction": 1})  # 1.000000001 has 9 places, the column 2
    payloads = [glue_protobuf(version, priced(i)) for i in range(BATCH)]
    payloads.insert(5, glue_protobuf(version, inexact))
    for decoded in (
        deserializer().decode(messages(payloads), range(len(payloads))),
        *(deserializer().decode(messages([payload]), [0]) for payload in payloads[4:7]),
    ):
        reasons = [error.reason for _, error in decoded.failures]
        assert reasons in ([], ["amount: additionalTypes.Decimal 1.000000001 has more than 2 decimal places"])
        if not len(decoded.table):
            continue  # the inexact message alone
        assert decoded.table.schema.field("amount").type == pa.decimal128(21, 2)
        assert decoded.table.schema.field("rate").type == pa.decimal128(28, 9)
        assert decoded.table.schema.field("history").type == pa.list_(pa.decimal128(28, 9))
        rows = {row["id"]: row for row in decoded.table.to_pylist()}
        for i in (4, 5, 77):
            if len(rows) > 1 or f"p{i}" in rows:
                assert rows[f"p{i}"]["amount"] == Decimal(f"{i}.{i % 100:02d}")
                assert rows[f"p{i}"]["rate"] == -Decimal(f"{i}.5678")
                assert rows[f"p{i}"]["history"] == [Decimal("9223372036854775807.999999999")]
    whole = deserializer().decode(messages(payloads), range(len(payloads)))
    assert len(whole.table) == BATCH and [position for position, _ in whole.failures] == [5]
    # Without the inexact one (which sends its batch one by one, to find it), the library's column lane reads
    # them all (the repeated field keeps them from the wire lane, which tests/unit/test_protobuf_batch.py checks).
    exact = deserializer().decode(messages(payloads[:5] + payloads[6:]), range(BATCH))
    assert exact.failures == [] and exact.fast == list(range(BATCH)) and not exact.documents
    assert exact.table.equals(whole.table)


@pytest.mark.parametrize(
    ("decimal", "value"),
    [
        ("string value = 1;", {"value": "1.5"}),
        ("optional int64 units = 1; optional int32 fraction = 2;", {"units": 1, "fraction": None}),
        ("repeated int64 units = 1; int32 fraction = 2;", {"units": [1, 2], "fraction": 0}),
        ("int64 units = 1; int32 fraction = 2; string currency = 5;", {"units": 1, "fraction": 0, "currency": "EUR"}),
    ],
)
def test_a_schema_s_own_additional_types_decimal_stays_a_message(
    glue: GlueSchemas, decimal: str, value: dict[str, Any]
) -> None:
    """Only AWS's exact shape (four plain fields) is read as a number; a message merely named so keeps its fields
    (found by review: optional members were misread by the wire lane, a repeated one stopped the pipeline)."""
    own = f'syntax = "proto3"; package additionalTypes; message Decimal {{ {decimal} }} message Amount {{ Decimal d = 1; }}'
    version = glue.register("own", own, "PROTOBUF")
    row = message_class(compile_with_protoc({"o.proto": own}, "o.proto"), "additionalTypes.Amount")
    given = {name: item for name, item in value.items() if item is not None}
    payloads = [glue_protobuf(version, row(d=given))] * BATCH
    decoded = deserializer().decode(messages(payloads), range(BATCH))  # Amount sorts first: the column lanes
    assert decoded.failures == [] and not decoded.documents and decoded.table.to_pylist()[:1] == [{"d": value}]
    alone = deserializer().decode(messages(payloads[:1]), [0])
    assert alone.failures == [] and alone.table.to_pylist() == [{"d": value}]


def test_protobuf_keys_in_glue_wire_format(glue: GlueSchemas) -> None:
    """``format.key = "protobuf"``: a key's message type found by Glue's index (User is the last of V1's five)."""
    version = glue.register("events-key", V1, "PROTOBUF")
    edge = GlueRegistry(SchemaRegistryConfig(type="glue", region=REGION))
    keyed = build_deserializer(FormatConfig(type="raw", key="protobuf"), edge, "events")
    key = glue_protobuf(version, classes(V1)["User"](id=7), zlib_compressed=True)
    decoded = keyed.decode(messages([b"anything", b"else"], [key, glue_frame(UNKNOWN, b"\x00")]), [0, 1])
    assert decoded.keys == [{"id": 7}, None]
    assert [(position, error.reason) for position, error in decoded.failures] == [
        (1, f"key: schema version {UNKNOWN} is not in the Glue schema registry")
    ]


def test_an_upsert_table_of_glue_protobuf_changes_with_tombstones_last(glue: GlueSchemas, tmp_path: Path) -> None:
    """The loop over a real Delta table: a batch big enough for the column lanes whose last messages are tombstones
    (a null value deletes its key) and a payload that is only the start of Glue's header (a dead letter)."""
    version = glue.register("events", V1, "PROTOBUF")
    cls = classes(V1)["Event"]
    keys = [f'{{"id": "e{i % 100}"}}'.encode() for i in range(200)]
    changes: list[tuple[bytes | None, bytes | None]] = [
        (key, glue_protobuf(version, cls(id=f"e{i % 100}", amount=i / 2, user={"id": i}, counts={"k": i})))
        for i, key in enumerate(keys)
    ]  # every key twice: the second change (i + 100) wins
    changes += [(f'{{"id": "e{i}"}}'.encode(), None) for i in range(10)] + [(keys[50], b"\x03")]
    cfg = change_config(
        tmp_path,
        "upsert",
        K2D_FORMAT__TYPE="protobuf",
        K2D_SCHEMA_REGISTRY__TYPE="glue",
        K2D_SCHEMA_REGISTRY__REGION=REGION,
    )
    tp = TopicPartition("cdc", 0)
    ingest_until_caught_up(cfg, TopicsSource([change_batch(tp, 0, changes)], {tp: len(changes)}))
    table = DeltaTable(str(tmp_path / "table"))
    rows = {row["id"]: row for row in table.to_pyarrow_table().to_pylist()}
    assert sorted(rows) == sorted(f"e{i}" for i in range(10, 100))
    # Typed by the message type, as an append table is: the map a map, not a struct of the first keys seen.
    assert pa.schema(table.schema().to_arrow()) == pa.schema(
        [
            pa.field("id", pa.string(), nullable=False),
            ("amount", pa.float64()),
            ("user", pa.struct([("id", pa.int64())])),
            ("counts", pa.map_(pa.string(), pa.int64())),
        ]
    )
    assert rows["e42"] == {"id": "e42", "amount": 71.0, "user": {"id": 142}, "counts": [("k", 142)]}
    assert rows["e50"]["amount"] == 75.0  # the dead letter does not touch its key's row
    letters = DeltaTable(str(tmp_path / "dlq")).to_pyarrow_table().to_pylist()
    assert [(letter["offset"], letter["stage"]) for letter in letters] == [(210, "deserialize")]
    assert "truncated: 1 bytes, the Glue header needs 18" in letters[0]["error"]
    assert table.transaction_version("cdc-0") == 210
