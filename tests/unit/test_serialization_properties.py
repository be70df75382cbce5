"""Property tests: whatever the bytes, every deserializer accounts for every message, raises nothing
but dead letters, and the fast lane never disagrees with the reference lane about a message."""

from __future__ import annotations

import datetime as dt
import decimal
import gzip
import json
import math
import os
import uuid
from functools import cache
from typing import Any
from unittest import mock

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafka2delta.config import FormatConfig
from kafka2delta.errors import MessageError
from kafka2delta.registry import RegisteredSchema, SchemaReference
from kafka2delta.serialization import Decoded, Deserializer, JsonDeserializer, build_deserializer
from kafka2delta.serialization import json as json_format
from tests.support.protobuf import compile_with_protoc
from tests.support.serialization import (
    COMMON_PROTO,
    EVENT_PROTO,
    LOGICAL,
    NODE,
    READ_SCHEMA,
    V1,
    V2,
    MemoryRegistry,
    check_partition,
    confluent,
    event,
    framed_avro,
    full_event,
    messages,
)

# K2D_HYPOTHESIS_EXAMPLES=5000 for a longer fuzzing run.
SETTINGS = settings(
    max_examples=int(os.environ.get("K2D_HYPOTHESIS_EXAMPLES", "300")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@cache
def registry() -> MemoryRegistry:
    found = MemoryRegistry()
    found.add(1, V1)
    found.add(2, V2)
    found.add(3, LOGICAL)
    found.add(4, json.dumps("string"))
    found.add(5, NODE)
    found.subjects[("acme-common", 2)] = RegisteredSchema(20, "PROTOBUF", COMMON_PROTO)
    found.add(21, EVENT_PROTO, "PROTOBUF", [SchemaReference("acme/common.proto", "acme-common", 2)])
    return found


@cache
def deserializers() -> dict[str, Deserializer]:
    built: dict[str, Deserializer] = {}
    for name, config in {
        "json": FormatConfig(type="json"),
        "json-gzip": FormatConfig(type="json", gzip=True, key="json"),
        "raw": FormatConfig(type="raw", key="string"),
        "avro": FormatConfig(type="avro", key="avro"),
        "protobuf": FormatConfig(type="protobuf"),
    }.items():
        deserializer = build_deserializer(config, registry(), "events")  # type: ignore[arg-type]
        deserializer.set_read_schema(READ_SCHEMA if name.startswith("json") else pa.schema([("value", pa.string())]))
        built[name] = deserializer
    return built


def outcome(decoded: Decoded, position: int) -> tuple[str, Any]:
    """What became of one message: ("fast", row without nulls), ("slow", document) or ("dead", reason)."""
    for failed, error in decoded.failures:
        if failed == position:
            return "dead", error.reason
    if position in decoded.fast:
        row = decoded.table.slice(decoded.fast.index(position), 1).to_pylist()[0]
        return "fast", {key: value for key, value in row.items() if value is not None}
    return "slow", decoded.documents[position]


def check_all(payloads: list[bytes], keys: list[bytes | None] | None = None) -> None:
    batch = messages(payloads, keys)
    for name, deserializer in deserializers().items():
        decoded = deserializer.decode(batch, range(len(payloads)))  # only MessageErrors, inside
        check_partition(decoded, len(payloads))
        for position in range(len(payloads)):
            lane, value = outcome(decoded, position)
            alone = deserializer.decode(messages([payloads[position]], None if keys is None else [keys[position]]), [0])
            alone_lane, alone_value = outcome(alone, 0)
            # Neighbours change nothing about a message's fate (for these inputs, not even its lane).
            assert (lane == "dead") == (alone_lane == "dead"), (name, payloads[position])
            if lane == "dead":
                assert value == alone_value
            # The reference lane agrees: same dead letter, or a document.
            try:
                document = deserializer.document(batch, position)
            except MessageError as exc:
                assert lane == "dead", (name, payloads[position], exc)
                assert exc.reason == value
                continue
            assert lane != "dead", (name, payloads[position], value)
            if lane == "slow" or name in ("avro", "protobuf"):
                assert _nan_equal(document, decoded.documents.get(position, document))


def _nan_equal(left: Any, right: Any) -> bool:
    """Equality where NaN equals NaN (random Avro/Protobuf bytes decode to NaN doubles)."""
    if isinstance(left, float) and isinstance(right, float) and math.isnan(left) and math.isnan(right):
        return True
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(_nan_equal(left[k], right[k]) for k in left)
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(_nan_equal(a, b) for a, b in zip(left, right, strict=True))
    return bool(left == right)


def _prefix(schema_id: int, indexes: bytes = b"") -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big") + indexes


random_bytes = st.binary(min_size=1, max_size=64)
framed = st.builds(
    lambda schema_id, indexes, body: _prefix(schema_id, indexes) + body,
    st.sampled_from([1, 2, 3, 4, 5, 21, 99]),
    st.sampled_from([b"", b"\x00", b"\x02\x02", b"\x04\x00\x04", b"\x02\x0a", b"\x01"]),
    st.binary(max_size=48),
)


@cache
def valid_payloads() -> list[bytes]:
    """Well-formed messages of every format, to be mutated."""
    pool = compile_with_protoc({"event.proto": EVENT_PROTO, "acme/common.proto": COMMON_PROTO}, "event.proto")
    logical = {
        "day": dt.date(2024, 5, 1),
        "at_ms": dt.datetime(2024, 5, 1, tzinfo=dt.UTC),
        "at_us": dt.datetime(2024, 5, 1, tzinfo=dt.UTC),
        "local_ms": dt.datetime(2024, 5, 1),
        "price": decimal.Decimal("1.25"),
        "fixed_price": decimal.Decimal("2.500"),
        "huge": decimal.Decimal("1.00000"),
        "uid": uuid.UUID(int=7),
        "t_ms": dt.time(1),
        "t_us": dt.time(2),
        "blob": b"b",
        "hash": b"abcd",
        "small": 1,
        "ratio": 0.5,
        "flag": False,
        "tags": ["t"],
        "scores": {"a": 1},
        "maybe_time": None,
        "times": [],
    }
    return [
        framed_avro(1, V1, event(1)),
        framed_avro(2, V2, event(2, note="n")),
        framed_avro(3, LOGICAL, logical),
        framed_avro(4, "string", "key"),
        confluent(21, full_event(pool).SerializeToString(), b"\x00"),
        json.dumps(event(3)).encode(),
    ]


def _mutate(payload: bytes, kind: str, where: int, noise: bytes) -> bytes:
    where %= len(payload) + 1
    if kind == "truncate":
        return payload[:where] or payload
    if kind == "append":
        return payload + noise
    if kind == "flip":
        index = where % len(payload)
        return payload[:index] + bytes([payload[index] ^ (noise[0] if noise else 0xFF)]) + payload[index + 1 :]
    return payload[:where] + noise + payload[where:]


mutated = st.builds(
    _mutate,
    st.integers(0, 5).map(lambda i: valid_payloads()[i]),
    st.sampled_from(["none", "truncate", "append", "flip", "insert"]),
    st.integers(0, 1000),
    st.binary(min_size=1, max_size=4),
)


@SETTINGS
@given(st.lists(st.one_of(random_bytes, framed, mutated), min_size=1, max_size=6))
def test_random_bytes_are_dead_letters_or_rows(payloads: list[bytes]) -> None:
    check_all(payloads)


@SETTINGS
@given(
    st.lists(
        st.tuples(st.one_of(random_bytes, framed), st.one_of(st.none(), random_bytes, framed)), min_size=1, max_size=4
    )
)
def test_random_keys(pairs: list[tuple[bytes, bytes | None]]) -> None:
    check_all([payload for payload, _ in pairs], [key for _, key in pairs])


json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.dictionaries(
            st.sampled_from(["id", "amount", "count", "ts", "user", "country", "x", "y"]), children, max_size=4
        ),
    ),
    max_leaves=12,
)
json_objects = st.dictionaries(
    st.sampled_from(["id", "amount", "count", "ts", "user", "labels", "x", "y"]), json_values, max_size=5
)


def _encodings(value: Any) -> st.SearchStrategy[bytes]:
    compact = json.dumps(value, separators=(",", ":")).encode()
    return st.sampled_from(
        [
            compact,
            json.dumps(value, indent=2).encode(),
            json.dumps(value, ensure_ascii=False).encode(),
            b" " + compact + b"\n",
            compact[:-1] if len(compact) > 1 else compact,
            compact + compact,  # two values in one payload: beside an empty one, Arrow's row count once matched
            b" " if len(compact) % 2 else b"",
        ]
    )


@SETTINGS
@given(st.lists(st.one_of(json_objects, json_values).flatmap(_encodings), min_size=1, max_size=8))
def test_random_json(payloads: list[bytes]) -> None:
    check_all(payloads)
    # gzip-compressed, the same JSON goes through the same lanes.
    deserializer = deserializers()["json-gzip"]
    decoded = deserializer.decode(messages([gzip.compress(p) for p in payloads]), range(len(payloads)))
    check_partition(decoded, len(payloads))
    plain = deserializers()["json"].decode(messages(payloads), range(len(payloads)))
    assert [position for position, _ in decoded.failures] == [position for position, _ in plain.failures]


@SETTINGS
@given(st.lists(st.one_of(json_objects, json_values).flatmap(_encodings), min_size=2, max_size=8))
def test_parallel_reads_give_what_one_read_gives(payloads: list[bytes]) -> None:
    # Cutting a batch into parts read at once must change nothing: same rows, same inferred types, same lanes.
    deserializer = deserializers()["json"]
    batch = messages(payloads)
    whole = deserializer.decode(batch, range(len(payloads)))
    with (
        mock.patch.object(json_format, "PARALLEL_READ_MIN_BYTES", 0),
        mock.patch.object(json_format, "PARALLEL_READ_MIN_AVERAGE_BYTES", 0),
    ):
        parted = deserializer.decode(batch, range(len(payloads)))
    check_partition(parted, len(payloads))
    assert [outcome(parted, p) for p in range(len(payloads))] == [outcome(whole, p) for p in range(len(payloads))]
    assert parted.table.schema == whole.table.schema
    assert parted.table.to_pylist() == whole.table.to_pylist()


@SETTINGS
@given(json_objects)
def test_fast_lane_values_equal_reference_values(value: dict[str, Any]) -> None:
    payload = json.dumps(value).encode()
    deserializer = deserializers()["json"]
    decoded = deserializer.decode(messages([payload]), [0])
    lane, found = outcome(decoded, 0)
    document = deserializer.document(messages([payload]), 0)
    assert lane != "dead"
    if lane == "slow":
        assert found == document
        return
    # Known columns come back exactly as the reference lane reads them (an int in the double column becomes the
    # nearest double, as the coercion stage makes of the reference lane's int: 2**53 + 1 → 2**53); unknown ones
    # are Arrow's inference (typed=False).
    for name in ("id", "amount", "count", "ts"):
        expected = document.get(name)
        if expected is not None:
            if name == "amount" and isinstance(expected, int) and not isinstance(expected, bool):
                expected = float(expected)
            assert found[name] == expected


@SETTINGS
@given(json_objects)
def test_screening_only_sets_aside_what_arrow_refuses_alone(value: dict[str, Any]) -> None:
    # The shortcut that skips the alone read must be exact: "certainly refused" implies refused.
    deserializer = deserializers()["json"]
    assert isinstance(deserializer, JsonDeserializer)
    payload = json.dumps(value).encode()
    if deserializer._refused_alone(payload) is not None:
        with pytest.raises((pa.ArrowInvalid, ValueError)):
            deserializer._read_chunk([payload])
