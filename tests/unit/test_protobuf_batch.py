"""Protobuf's wire lane (``serialization/protobuf_batch.py``) against the protobuf library.

Whatever the bytes — messages of every field type the lane reads, or truncated, padded, flipped, with fields
out of order, repeated or unknown — a batch read through the wire lane must give every message the outcome the
per-message lane gives it (the same row values, or the same dead letter with the same reason), and a message a
standard serializer wrote must never be declined.
"""

from __future__ import annotations

import datetime as dt
import os
from functools import cache
from typing import Any
from unittest import mock

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafka2delta.config import FormatConfig
from kafka2delta.serialization import Decoded, Deserializer, build_deserializer, protobuf_batch, protobuf_to_arrow
from kafka2delta.serialization import protobuf as protobuf_module
from kafka2delta.serialization.avro_batch import lay_out
from kafka2delta.serialization.protobuf_batch import wire_reader
from tests.support.decode_lanes import CORRUPTIONS, assert_agree, corrupt, identical, note_lane, same
from tests.support.glue import AWS_PROTOS
from tests.support.protobuf import compile_with_protoc, message_class
from tests.support.serialization import MemoryRegistry, confluent, messages

SETTINGS = settings(
    max_examples=int(os.environ.get("K2D_HYPOTHESIS_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
BATCH = 2 * protobuf_module.COLUMN_LANE_MIN_MESSAGES + 6

# Every field type the wire lane reads; declared out of number order (the table follows the declaration).
# All comes first: the wire format's message indexes [0] name the file's first message.
WIRE_PROTO = """syntax = "proto3";
package wire;
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";
import "additionalTypes/decimal.proto";
import "metadata/metadata.proto";
enum Kind { KIND_UNSPECIFIED = 0; VIEW = 1; BUY = 2; }
message All {
  string far = 200;
  double d = 1; float f = 2; int64 i64 = 3; uint64 u64 = 4; int32 i32 = 5; fixed64 fx64 = 6; fixed32 fx32 = 7;
  bool b = 8; string s = 9; bytes by = 10; uint32 u32 = 11; Kind kind = 12; sfixed32 sf32 = 13;
  sfixed64 sf64 = 14; sint32 s32 = 15; sint64 s64 = 16; Inner inner = 17; google.protobuf.Timestamp at = 18;
  google.protobuf.Int64Value wrapped = 19; google.protobuf.StringValue wrapped_text = 20;
  optional int64 maybe = 21; optional string maybe_text = 22; google.protobuf.UInt64Value wrapped_u64 = 23;
  additionalTypes.Decimal rate = 24;
  additionalTypes.Decimal price = 25
      [(metadata.metadata_key) = "connect.decimal.scale", (metadata.metadata_value) = "2"];
}
message Deep { fixed32 f = 1; }
message Inner { string name = 1; sint64 delta = 2; Kind kind = 3; Deep deep = 4; }
"""
PROTO2 = """syntax = "proto2";
package old;
enum Color { RED = 1; GREEN = 2; }
message Old { optional int32 a = 1 [default = 5]; optional Color color = 2; optional string s = 3; }
"""
ALL_ID, OLD_ID, UNREAD_ID = 41, 42, 43


@cache
def _pool() -> Any:
    return compile_with_protoc({"wire.proto": WIRE_PROTO, **AWS_PROTOS}, "wire.proto")


def _registry() -> MemoryRegistry:
    registry = MemoryRegistry()
    registry.add(ALL_ID, WIRE_PROTO, "PROTOBUF")
    registry.add(OLD_ID, PROTO2, "PROTOBUF")
    registry.add(UNREAD_ID, 'syntax = "proto3"; message R { repeated int64 xs = 1; string s = 2; }', "PROTOBUF")
    return registry


def _deserializer() -> Deserializer:
    return build_deserializer(FormatConfig(type="protobuf"), _registry(), "events")  # type: ignore[arg-type]


_int32 = st.integers(-(2**31), 2**31 - 1)
_int64 = st.integers(-(2**63), 2**63 - 1)
_inner = st.fixed_dictionaries(
    {},
    optional={
        "name": st.text(max_size=4),
        "delta": _int64,
        "kind": st.integers(0, 2),
        "deep": st.fixed_dictionaries({}, optional={"f": st.integers(0, 2**32 - 1)}),
    },
)
_ALL = st.fixed_dictionaries(
    {},
    optional={
        "far": st.text(max_size=3),
        "d": st.floats(),
        "f": st.floats(width=32),
        "i64": _int64,
        "u64": st.integers(0, 2**64 - 1),
        "i32": _int32,
        "fx64": st.integers(0, 2**64 - 1),
        "fx32": st.integers(0, 2**32 - 1),
        "b": st.booleans(),
        "s": st.text(max_size=6),
        "by": st.binary(max_size=5),
        "u32": st.integers(0, 2**32 - 1),
        "kind": st.integers(0, 5),  # 3–5: numbers the (open) enum does not name
        "sf32": _int32,
        "sf64": _int64,
        "s32": _int32,
        "s64": _int64,
        "inner": _inner,
        # Seconds and nanos over Python's datetime range and past it (the library lane fails those).
        "at": st.tuples(st.integers(-(2**36), 2**38), st.integers(-(10**9), 10**9 - 1)),
        "wrapped": st.one_of(st.none(), _int64),
        "wrapped_text": st.one_of(st.none(), st.text(max_size=3)),
        "maybe": _int64,
        "maybe_text": st.text(max_size=3),
        "wrapped_u64": st.one_of(st.none(), st.integers(0, 2**64 - 1)),
        # AWS's Decimals (units, billionths): any at scale 9; at scale 2, cents, or finer (the library's dead letter).
        "rate": st.tuples(_int64, _int32),
        "price": st.tuples(_int64, st.one_of(st.integers(-99, 99).map(lambda cents: cents * 10**7), _int32)),
    },
)


def _all(values: dict[str, Any]) -> Any:
    message = message_class(_pool(), "wire.All")()
    for name, value in values.items():
        if name == "inner":
            for key, item in value.items():
                if key == "deep":
                    message.inner.deep.SetInParent()
                    message.inner.deep.f = item.get("f", 0)
                else:
                    setattr(message.inner, key, item)
            message.inner.SetInParent()
        elif name == "at":
            message.at.seconds, message.at.nanos = value
        elif name in ("rate", "price"):
            getattr(message, name).SetInParent()
            getattr(message, name).units, getattr(message, name).fraction = value
        elif name.startswith("wrapped"):
            getattr(message, name).SetInParent()
            if value is not None:
                getattr(message, name).value = value
        else:
            setattr(message, name, value)
    return message


def _body(values: dict[str, Any]) -> bytes:
    return bytes(_all(values).SerializeToString())


# Valid protobuf that no standard serializer writes: the library reads it, the wire lane declines it.
_REWRITES = st.one_of(
    st.just(("repeat", b"\x18\x05")),  # i64 again (the last value wins)
    st.just(("repeat", b"\x8a\x01\x02\x0a\x00")),  # inner again (the two are merged)
    st.just(("repeat", b"\xc2\x0c\x01z")),  # far (200) again
    st.just(("unknown", b"\xf8\x06\x01")),  # field 111: unknown
    st.just(("front", b"\x08\x07")),  # a field 1 (varint): wrong wire type for d, before the others
    st.just(("front", b"\xc2\x0c\x01a")),  # far (200) before the others
)


def _rewrite(body: bytes, rewrite: tuple[str, bytes]) -> bytes:
    how, extra = rewrite
    return extra + body if how == "front" else body + extra


def _payloads(events: list[dict[str, Any]], corruptions: list[Any]) -> list[bytes]:
    payloads = []
    for i, corruption in enumerate(corruptions):
        body = _body(events[i % len(events)])
        if isinstance(corruption[1], bytes):
            payloads.append(confluent(ALL_ID, _rewrite(body, corruption), b"\x00"))
        else:
            payloads.append(corrupt(confluent(ALL_ID, body, b"\x00"), corruption))
    return payloads


def _per_message(deserializer: Deserializer, payloads: list[bytes]) -> Decoded:
    with mock.patch.object(protobuf_module, "COLUMN_LANE_MIN_MESSAGES", 10**9):
        return deserializer.decode(messages(payloads), range(len(payloads)))


def _check(payloads: list[bytes]) -> Decoded:
    deserializer = _deserializer()
    batch = deserializer.decode(messages(payloads), range(len(payloads)))
    assert_agree(batch, _per_message(deserializer, payloads), payloads)
    return batch


@SETTINGS
@given(
    st.lists(_ALL, min_size=1, max_size=6),
    st.lists(st.one_of(CORRUPTIONS, _REWRITES), min_size=BATCH, max_size=BATCH),
)
def test_wire_lane_agrees_with_the_per_message_lane(events: list[dict[str, Any]], corruptions: list[Any]) -> None:
    note_lane(_check(_payloads(events, corruptions)))


@SETTINGS
@given(st.lists(_ALL, min_size=1, max_size=40))
def test_messages_a_serializer_wrote_are_never_declined(events: list[dict[str, Any]]) -> None:
    """Unless the library lane cannot read them either (a Timestamp past Python's datetimes)."""
    descriptor = _pool().FindMessageTypeByName("wire.All")
    reader = wire_reader(descriptor, protobuf_to_arrow(descriptor))
    assert reader is not None
    datums = lay_out([_body(values) for values in events], 0)
    table, declined = reader.read(datums.buffer, datums.starts, datums.ends)
    convert = protobuf_module._ProtoShapes().record(descriptor).fix
    assert convert is not None
    for i, values in enumerate(events):
        try:
            expected = convert(_all(values))
        except Exception:
            assert declined[i], values
            continue
        assert not declined[i], values
        assert same(table.slice(i, 1).to_pylist()[0], expected)
    kept = ~declined
    documents = [convert(_all(values)) for values, ok in zip(events, kept, strict=True) if ok]
    assert identical(table.filter(pa.array(kept)), pa.Table.from_pylist(documents, schema=pa.schema(reader.arrow)))


@SETTINGS
@given(st.lists(st.binary(max_size=24), min_size=BATCH, max_size=BATCH))
def test_random_bodies_are_read_or_declined_never_misread(bodies: list[bytes]) -> None:
    note_lane(_check([confluent(ALL_ID if i % 3 else OLD_ID, body, b"\x00") for i, body in enumerate(bodies)]))


def test_a_clean_batch_never_calls_the_protobuf_library() -> None:
    payloads = [
        confluent(ALL_ID, _body({"i64": i, "inner": {"name": f"n{i}"}, "at": (i, 5000)} if i % 2 else {}), b"\x00")
        for i in range(BATCH)
    ]
    with mock.patch.object(protobuf_module._ProtoMessage, "parse_many", side_effect=AssertionError("library lane")):
        decoded = _deserializer().decode(messages(payloads), range(len(payloads)))
    assert decoded.failures == [] and decoded.documents == {}
    assert decoded.fast == list(range(BATCH))
    assert decoded.table.column("i64").to_pylist()[:3] == [0, 1, 0]
    assert decoded.table.column("inner").to_pylist()[:2] == [
        None,
        {"name": "n1", "delta": 0, "kind": "KIND_UNSPECIFIED", "deep": None},
    ]
    assert decoded.table.column("at").to_pylist()[1] == dt.datetime(1970, 1, 1, 0, 0, 1, 5, tzinfo=dt.UTC)
    assert decoded.table.column_names[0] == "far"  # declaration order


def test_what_the_wire_lane_declines_the_library_lane_reads() -> None:
    """A field repeated, out of order or unknown, a negative int32 written in 5 bytes, an unnamed number of a
    closed (proto2) enum: valid protobuf that the library reads, and so must the batch."""
    payloads = [confluent(ALL_ID, _body({"i64": i, "s": "x"}), b"\x00") for i in range(BATCH)]
    payloads[1] = confluent(ALL_ID, _body({"i64": 1}) + b"\x18\x09", b"\x00")  # i64 again: 9 wins
    payloads[2] = confluent(ALL_ID, b"\x4a\x01y" + _body({"i64": 2}), b"\x00")  # s (9) before i64 (3)
    payloads[3] = confluent(ALL_ID, _body({"i64": 3}) + b"\xf8\x06\x01", b"\x00")  # unknown field 111
    payloads[4] = confluent(ALL_ID, b"\x28\xff\xff\xff\xff\x0f", b"\x00")  # i32 = -1 in 5 bytes
    decoded = _check(payloads)
    values = decoded.table.to_pylist()
    assert [values[i]["i64"] for i in range(4)] == [0, 9, 2, 3]
    assert values[2]["s"] == "y" and values[4]["i32"] == -1
    old = [confluent(OLD_ID, bytes([0x08, i % 100, 0x10, 1 + i % 3]), b"\x00") for i in range(BATCH)]  # color 3
    decoded = _check(old)
    assert decoded.table.column("color").to_pylist()[:3] == ["RED", "GREEN", None]  # 3 is an unknown field
    assert decoded.table.column("s").to_pylist()[0] is None  # proto2: unset is null, not its default


@pytest.mark.parametrize(
    "proto",
    [
        'syntax = "proto3"; message M { repeated int64 xs = 1; }',
        'syntax = "proto3"; message M { map<string, int64> m = 1; }',
        'syntax = "proto3"; message M { oneof o { int64 a = 1; string b = 2; } }',
        'syntax = "proto3"; message M { M next = 1; int64 v = 2; }',
        'syntax = "proto2"; message M { optional group G = 1 { optional int64 a = 2; } }',
        # A Decimal column finer than billionths (the lane reads scales up to 9, a Decimal's own resolution).
        'syntax = "proto3"; import "additionalTypes/decimal.proto"; import "metadata/metadata.proto";'
        ' message M { additionalTypes.Decimal d = 1 [(metadata.metadata_key) = "connect.decimal.scale",'
        ' (metadata.metadata_value) = "12"]; }',
    ],
)
def test_schemas_the_wire_lane_leaves_to_the_library(proto: str) -> None:
    descriptor = compile_with_protoc({"m.proto": proto, **AWS_PROTOS}, "m.proto").FindMessageTypeByName("M")
    assert wire_reader(descriptor, protobuf_to_arrow(descriptor)) is None


def test_a_schema_the_wire_lane_leaves_still_takes_the_library_lane() -> None:
    payloads = [confluent(UNREAD_ID, b"\x0a\x02\x01\x02\x12\x01s", b"\x00") for _ in range(BATCH)]
    decoded = _check(payloads)
    assert decoded.documents == {} and decoded.table.column("xs").to_pylist()[0] == [1, 2]


def test_small_batches_are_read_one_by_one() -> None:
    small = [confluent(ALL_ID, _body({"i64": i}), b"\x00") for i in range(protobuf_module.COLUMN_LANE_MIN_MESSAGES - 1)]
    decoded = _deserializer().decode(messages(small), range(len(small)))
    assert len(decoded.documents) == len(small)  # one by one, as dicts
    assert np.array_equal(decoded.table.column("i64").to_numpy(), np.arange(len(small)))


def test_what_the_library_refuses_the_wire_lane_declines() -> None:
    """Tags and lengths longer than 5 bytes are corrupt for the library (found by review): dead letters, as
    message by message. A field of a message type without fields (google.protobuf.Empty) reads as an empty struct."""
    registry = _registry()
    registry.add(
        44,
        'syntax = "proto3"; import "google/protobuf/empty.proto";'
        "message M { int64 a = 1; string s = 3; google.protobuf.Empty e = 2; }",
        "PROTOBUF",
    )
    deserializer = build_deserializer(FormatConfig(type="protobuf"), registry, "events")  # type: ignore[arg-type]
    payloads = [
        confluent(44, b"\x08" + bytes([i % 100]) + (b"\x12\x00" if i % 3 else b""), b"\x00") for i in range(BATCH)
    ]
    payloads[1] = confluent(44, b"\x88\x80\x80\x80\x80\x00\x05", b"\x00")  # field 1 behind a 6-byte tag
    payloads[2] = confluent(44, b"\x1a\x81\x80\x80\x80\x80\x00x", b"\x00")  # a string behind a 6-byte length
    payloads[4] = confluent(44, b"\x88\x80\x80\x80\x00\x05", b"\x00")  # a 5-byte tag: valid
    batch = deserializer.decode(messages(payloads), range(len(payloads)))
    assert_agree(batch, _per_message(deserializer, payloads), payloads)
    assert sorted(position for position, _ in batch.failures) == [1, 2]
    values = dict(zip(batch.fast, batch.table.to_pylist(), strict=True))
    assert values[4]["a"] == 5
    assert values[0]["e"] is None and values[5]["e"] == {}


def test_messages_nested_deeper_than_the_library_reads_keep_the_library_lane() -> None:
    chain = "".join(f"message M{k} {{ int64 v = 1; M{k + 1} next = 2; }}" for k in range(101))
    pool = compile_with_protoc({"m.proto": f'syntax = "proto3"; {chain} message M101 {{ int64 v = 1; }}'}, "m.proto")
    deep = pool.FindMessageTypeByName("M0")
    assert wire_reader(deep, protobuf_to_arrow(deep)) is None
    shallow = pool.FindMessageTypeByName(f"M{102 - protobuf_batch.MAX_MESSAGE_DEPTH}")  # 64 levels
    assert wire_reader(shallow, protobuf_to_arrow(shallow)) is not None
