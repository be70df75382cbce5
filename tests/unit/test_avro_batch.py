"""The Avro column lane (``serialization/avro_batch.py``) and Protobuf's against the per-message lane they
stand in for.

Whatever the bytes — valid datums of random schemas, or truncated, padded, flipped, unframed, of a wrong or
unknown schema id — a batch read through the column lane must give every message the outcome the
per-message lane gives it: the same row values, or the same dead letter with the same reason.
"""

from __future__ import annotations

import io
import itertools
import json
import os
from functools import cache
from typing import Any
from unittest import mock

import fastavro
import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafka2delta.config import FormatConfig
from kafka2delta.registry import RegisteredSchema, SchemaReference
from kafka2delta.serialization import Decoded, Deserializer, build_deserializer
from kafka2delta.serialization import avro as avro_module
from kafka2delta.serialization import protobuf as protobuf_module
from kafka2delta.serialization.avro import COLUMN_LANE_MIN_MESSAGES, AvroSchema, avro_to_arrow
from kafka2delta.serialization.avro_batch import PADDING, ColumnReader, column_reader, lay_out
from kafka2delta.serialization.typed import Shape, TypedGroup, typed_decode
from tests.support.decode_lanes import CORRUPTIONS, assert_agree, corrupt, identical, note_lane, same
from tests.support.protobuf import compile_with_protoc, message_class
from tests.support.serialization import (
    COMMON_PROTO,
    EVENT_PROTO,
    MemoryRegistry,
    confluent,
    messages,
)

SETTINGS = settings(
    max_examples=int(os.environ.get("K2D_HYPOTHESIS_EXAMPLES", "60")),  # 3000 for a longer fuzzing run
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
BATCH = 2 * COLUMN_LANE_MIN_MESSAGES + 6


# --- random schemas and their values ------------------------------------------------------------------

_names = itertools.count()


def _name(prefix: str) -> str:
    return f"{prefix}{next(_names)}"


_PRIMITIVES = ["null", "boolean", "int", "long", "float", "double", "string", "bytes"]


def _types(depth: int) -> st.SearchStrategy[Any]:
    """Avro types the column lane reads, and a few it does not (so whole schemas fall back too)."""
    leaves: list[st.SearchStrategy[Any]] = [
        *[st.sampled_from(_PRIMITIVES)] * 6,
        st.builds(
            lambda n: {"type": "enum", "name": _name("E"), "symbols": [f"S{i}" for i in range(n)]},
            st.integers(1, 4),
        ),
        st.builds(lambda size: {"type": "fixed", "name": _name("F"), "size": size}, st.integers(0, 20)),
        st.sampled_from(
            [
                {"type": "array", "items": "long"},  # not read by the column lane
                {"type": "int", "logicalType": "date"},  # neither
            ]
        ),
    ]
    simple = st.one_of(*leaves)
    if depth <= 0:
        return st.one_of(simple, simple.map(lambda t: ["null", t] if t != "null" else "null"))
    nested = _records(depth - 1)
    return st.one_of(
        simple,
        nested,
        st.one_of(simple, nested).map(lambda t: ["null", t] if t != "null" else "null"),
        st.one_of(simple, nested).map(lambda t: [t, "null"] if t != "null" else "null"),
    )


def _records(depth: int) -> st.SearchStrategy[dict[str, Any]]:
    return st.lists(_types(depth), min_size=1, max_size=5).map(
        lambda types: {
            "type": "record",
            "name": _name("R"),
            "fields": [{"name": f"f{i}", "type": t} for i, t in enumerate(types)],
        }
    )


def _values(schema: Any) -> st.SearchStrategy[Any]:
    if isinstance(schema, list):
        return st.one_of(*(_values(branch) for branch in schema))
    kind = schema["type"] if isinstance(schema, dict) else schema
    if isinstance(schema, dict) and schema.get("logicalType") == "date":
        return st.integers(-10_000, 10_000)
    match kind:
        case "null":
            return st.none()
        case "boolean":
            return st.booleans()
        case "int":
            return st.integers(-(2**31), 2**31 - 1)
        case "long":
            return st.integers(-(2**63), 2**63 - 1)
        case "float":
            return st.floats(width=32)
        case "double":
            return st.floats()
        case "string":
            return st.text(max_size=20)
        case "bytes":
            return st.binary(max_size=20)
        case "enum":
            return st.sampled_from(schema["symbols"])
        case "fixed":
            return st.binary(min_size=schema["size"], max_size=schema["size"])
        case "array":
            return st.lists(_values(schema["items"]), max_size=3)
        case "record":
            return st.fixed_dictionaries({f["name"]: _values(f["type"]) for f in schema["fields"]})
    raise AssertionError(schema)


def _datum(parsed: Any, value: Any) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, parsed, value)
    return out.getvalue()


# Corruptions of a framed payload; each keeps the message's fate for the per-message lane to decide.
# --- the two lanes --------------------------------------------------------------------------------------


def _deserializer(registry: MemoryRegistry | None, **settings: Any) -> Deserializer:
    deserializer = build_deserializer(FormatConfig(type="avro", **settings), registry, "events")  # type: ignore[arg-type]
    deserializer.set_read_schema(pa.schema([]))
    return deserializer


def _per_message(deserializer: Deserializer, payloads: list[bytes]) -> Decoded:
    """The batch decoded the way it was before the column lane (one fastavro call per message)."""
    with mock.patch.object(avro_module, "COLUMN_LANE_MIN_MESSAGES", 10**9):
        return deserializer.decode(messages(payloads), range(len(payloads)))


def check_batch(deserializer: Deserializer, payloads: list[bytes]) -> Decoded:
    """The column lane's batch gives each message the per-message lane's outcome (and the same table)."""
    assert len(payloads) >= COLUMN_LANE_MIN_MESSAGES
    batch = deserializer.decode(messages(payloads), range(len(payloads)))
    assert_agree(batch, _per_message(deserializer, payloads), payloads)
    return batch


@st.composite
def _batches(draw: st.DrawFn, schemas: int = 1) -> tuple[list[Any], list[bytes]]:
    """Random record schemas (ids 1, 2), and a batch of their datums, some corrupted."""
    drawn = [draw(_records(2)) for _ in range(schemas)]
    parsed = [fastavro.parse_schema(schema) for schema in drawn]
    values = [draw(st.lists(_values(schema), min_size=1, max_size=6)) for schema in drawn]
    size = schemas * BATCH
    corruptions = draw(st.lists(CORRUPTIONS, min_size=size, max_size=size))
    payloads = []
    for i, corruption in enumerate(corruptions):
        k = i % schemas
        payload = confluent(k + 1, _datum(parsed[k], values[k][i % len(values[k])]))
        payloads.append(corrupt(payload, corruption))
    return drawn, payloads


def _registry(schemas: list[Any]) -> MemoryRegistry:
    registry = MemoryRegistry()
    for i, schema in enumerate(schemas):
        registry.add(i + 1, schema)
    if len(schemas) == 1:
        registry.add(2, {"type": "record", "name": "Other", "fields": [{"name": "x", "type": "long"}]})
    return registry


@SETTINGS
@given(_batches())
def test_column_lane_agrees_with_the_per_message_lane(batch: tuple[list[Any], list[bytes]]) -> None:
    schemas, payloads = batch
    note_lane(check_batch(_deserializer(_registry(schemas)), payloads))


@settings(SETTINGS, max_examples=max(1, SETTINGS.max_examples // 3))
@given(_batches(schemas=2))
def test_two_writer_schemas_in_one_batch(batch: tuple[list[Any], list[bytes]]) -> None:
    schemas, payloads = batch
    note_lane(check_batch(_deserializer(_registry(schemas)), payloads))


@SETTINGS
@given(_records(2).flatmap(lambda schema: st.tuples(st.just(schema), st.lists(_values(schema), min_size=1))))
def test_valid_datums_are_never_declined(drawn: tuple[Any, list[Any]]) -> None:
    """Every valid datum of a schema the lane reads is read, and equals fastavro's value."""
    schema, values = drawn
    parsed = AvroSchema.parse(schema)
    reader = column_reader(parsed.parsed, parsed.named)
    if reader is None:
        return  # the schema holds a type the lane leaves to fastavro
    assert reader.arrow == avro_to_arrow(schema)
    datums = [_datum(parsed.parsed, value) for value in values]
    table, bad = _read(reader, datums)
    assert not bad.any()
    expected = [fastavro.schemaless_reader(io.BytesIO(datum), parsed.parsed, None) for datum in datums]
    assert same(table.to_pylist(), expected)
    assert identical(table, pa.Table.from_struct_array(pa.array(expected, type=reader.arrow)))


def _read(reader: ColumnReader, datums: list[bytes]) -> tuple[pa.Table, npt.NDArray[np.bool_]]:
    datums_laid = lay_out(datums, 0)
    return reader.read(datums_laid.buffer, datums_laid.starts, datums_laid.ends)


@SETTINGS
@given(st.lists(st.binary(max_size=12), min_size=1, max_size=40))
def test_strings_are_utf8_exactly_when_python_says_so(contents: list[bytes]) -> None:
    """Arrow's UTF-8 check declines exactly the strings Python's strict decoder (fastavro's) refuses."""
    parsed = AvroSchema.parse({"type": "record", "name": "S", "fields": [{"name": "s", "type": "string"}]})
    reader = column_reader(parsed.parsed, parsed.named)
    assert reader is not None
    datums = [_datum("bytes", content) for content in contents]  # a string is written as bytes are
    table, bad = _read(reader, datums)
    column = table.column("s")
    for i, (content, declined) in enumerate(zip(contents, bad.tolist(), strict=True)):
        try:
            text = content.decode("utf-8")
        except UnicodeDecodeError:
            assert declined
            continue
        assert not declined
        assert column[i].as_py() == text


@SETTINGS
@given(st.lists(st.binary(max_size=30), min_size=1, max_size=30))
def test_random_bytes_are_read_or_declined_never_misread(datums: list[bytes]) -> None:
    """Any bytes: a datum the lane does not decline is one fastavro reads whole, to the same value."""
    schema = {
        "type": "record",
        "name": "Any",
        "fields": [
            {"name": "a", "type": "int"},
            {"name": "b", "type": ["null", "string"]},
            {"name": "c", "type": {"type": "enum", "name": "C", "symbols": ["X", "Y"]}},
            {"name": "d", "type": "float"},
            {"name": "e", "type": {"type": "fixed", "name": "E", "size": 2}},
            {"name": "f", "type": "boolean"},
        ],
    }
    parsed = AvroSchema.parse(schema)
    reader = column_reader(parsed.parsed, parsed.named)
    assert reader is not None
    table, bad = _read(reader, datums)
    for i, (datum, declined) in enumerate(zip(datums, bad.tolist(), strict=True)):
        if declined:
            continue
        stream = io.BytesIO(datum)
        value = fastavro.schemaless_reader(stream, parsed.parsed, None)
        assert stream.tell() == len(datum)
        assert same(table.slice(i, 1).to_pylist()[0], value)


# --- examples -------------------------------------------------------------------------------------------

EVENT = {
    "type": "record",
    "name": "Event",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "user", "type": {"type": "record", "name": "User", "fields": [{"name": "id", "type": "long"}]}},
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
}


def _events(count: int) -> list[bytes]:
    parsed = fastavro.parse_schema(EVENT)
    values = [{"id": f"e{i}", "amount": i / 4, "user": {"id": i}, "note": None if i % 3 else "n"} for i in range(count)]
    return [confluent(1, _datum(parsed, value)) for value in values]


def test_a_clean_batch_takes_the_column_lane_without_documents() -> None:
    registry = MemoryRegistry()
    registry.add(1, EVENT)
    decoded = check_batch(_deserializer(registry), _events(BATCH))
    assert decoded.fast == list(range(BATCH))
    assert decoded.documents == {}  # read as columns: no per-message dict
    assert decoded.table.column("note").to_pylist()[:4] == ["n", None, None, "n"]
    assert registry.calls == 1


def test_bad_datums_are_the_per_message_lanes_dead_letters_and_shift_nothing() -> None:
    registry = MemoryRegistry()
    registry.add(1, EVENT)
    payloads = _events(BATCH)
    payloads[3] = payloads[3][:-2]  # truncated
    payloads[4] = payloads[4] + b"\x00\x02"  # trailing bytes (which would pass for the next datum's start)
    payloads[5] = confluent(77, payloads[5][5:])  # unknown schema id
    payloads[6] = b"\x01" + payloads[6][1:]  # not the wire format
    decoded = check_batch(_deserializer(registry), payloads)
    reasons = {position: error.reason for position, error in decoded.failures}
    assert sorted(reasons) == [3, 4, 5, 6]
    assert reasons[4] == "2 trailing bytes after the Avro datum"
    assert reasons[5] == "schema id 77 is not in the registry"
    assert decoded.fast == [p for p in range(BATCH) if p not in reasons]
    assert decoded.table.column("id").to_pylist()[3:5] == ["e7", "e8"]


def test_bare_datums_of_the_schema_file(tmp_path: Any) -> None:
    avsc = tmp_path / "event.avsc"
    avsc.write_text(json.dumps(EVENT))
    payloads = [payload[5:] for payload in _events(BATCH)]
    payloads[1] = payloads[1] + b"\x01"
    decoded = check_batch(_deserializer(None, avro_schema_file=str(avsc)), payloads)
    assert [position for position, _ in decoded.failures] == [1]


def test_lay_out_reads_confluent_headers_as_the_per_message_lane_does() -> None:
    payloads: list[bytes | None] = [confluent(7, b"ab"), b"\x00\x00", None, confluent(2**32 - 1, b""), b"\x05abcd"]
    laid = lay_out(payloads, 5)
    assert laid.schema_ids == [7, 2**32 - 1]
    assert laid.schemas.tolist() == [0, -1, -1, 1, -1]
    assert laid.buffer.endswith(bytes(PADDING))
    assert laid.buffer[laid.starts[0] : laid.ends[0]] == b"ab"
    assert laid.starts[3] == laid.ends[3]


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "record", "name": "Empty", "fields": []},
        {"type": "record", "name": "A", "fields": [{"name": "x", "type": {"type": "map", "values": "long"}}]},
        {"type": "record", "name": "U", "fields": [{"name": "x", "type": ["int", "string"]}]},
        {
            "type": "record",
            "name": "T",
            "fields": [{"name": "x", "type": {"type": "long", "logicalType": "timestamp-millis"}}],
        },
        {"type": "record", "name": "N", "fields": [{"name": "next", "type": ["null", "N"]}]},
        "string",
    ],
)
def test_schemas_the_column_lane_leaves_to_fastavro(schema: Any) -> None:
    parsed = AvroSchema.parse(schema)
    assert column_reader(parsed.parsed, parsed.named) is None


# --- Protobuf: the same column lane idea (messages parsed as one, then a pa.array per field) ----------------


@cache
def _event_class() -> Any:
    pool = compile_with_protoc({"event.proto": EVENT_PROTO, "acme/common.proto": COMMON_PROTO}, "event.proto")
    return message_class(pool, "acme.events.Event")


def _protobuf_registry() -> MemoryRegistry:
    registry = MemoryRegistry()
    registry.subjects[("acme-common", 2)] = RegisteredSchema(20, "PROTOBUF", COMMON_PROTO)
    registry.add(21, EVENT_PROTO, "PROTOBUF", [SchemaReference("acme/common.proto", "acme-common", 2)])
    registry.add(22, 'syntax = "proto3"; message Small { int64 a = 1; string b = 2; }', "PROTOBUF")
    return registry


_users = st.fixed_dictionaries({"id": st.integers(-(2**63), 2**63 - 1), "country": st.text(max_size=4)})
_PROTO_EVENTS = st.fixed_dictionaries(
    {},
    optional={
        "id": st.text(max_size=8),
        "count": st.integers(-(2**63), 2**63 - 1),
        "amount": st.floats(),
        "kind": st.integers(0, 3),  # 3: a number the (open) enum does not name
        "user": _users,
        "tags": st.lists(st.text(max_size=3), max_size=3),
        "scores": st.dictionaries(st.text(max_size=3), st.integers(-(2**31), 2**31 - 1), max_size=2),
        "blob": st.binary(max_size=5),
        "big": st.integers(0, 2**64 - 1),
        "note": st.text(max_size=3),
        "small": st.integers(0, 2**32 - 1),
        "ratio": st.floats(width=32),
        "flag": st.booleans(),
        "friends": st.lists(_users, max_size=2),
        "text": st.text(max_size=3),
        "number": st.integers(-(2**31), 2**31 - 1),
        "delta": st.integers(-(2**31), 2**31 - 1),
    },
)


def _proto_payload(fields: dict[str, Any]) -> bytes:
    message = _event_class()(**{k: v for k, v in fields.items() if k not in ("user", "friends")})
    if "user" in fields:
        message.user.id, message.user.country = fields["user"]["id"], fields["user"]["country"]
    for friend in fields.get("friends", []):
        message.friends.add(**friend)
    return confluent(21, message.SerializeToString(), b"\x00")


def _corrupt_protobuf(payload: bytes, corruption: tuple[str, int]) -> bytes:
    how, n = corruption
    if how == "schema":  # another schema's first message (it may even parse), or an unknown id
        return confluent(22 if n == 2 else n, payload[5:])
    if how == "varint":  # message indexes other than [0]
        return payload[:5] + bytes([2 * (1 + n % 3), 2]) + payload[6:]
    return corrupt(payload, corruption)


@SETTINGS
@given(
    st.lists(_PROTO_EVENTS, min_size=1, max_size=6),
    st.lists(CORRUPTIONS, min_size=BATCH, max_size=BATCH),
)
def test_protobuf_column_lane_agrees_with_the_per_message_lane(
    events: list[dict[str, Any]], corruptions: list[tuple[str, int]]
) -> None:
    payloads = [_corrupt_protobuf(_proto_payload(events[i % len(events)]), c) for i, c in enumerate(corruptions)]
    registry = _protobuf_registry()
    deserializer = build_deserializer(FormatConfig(type="protobuf"), registry, "events")  # type: ignore[arg-type]
    batch = deserializer.decode(messages(payloads), range(len(payloads)))
    with mock.patch.object(protobuf_module, "COLUMN_LANE_MIN_MESSAGES", 10**9):
        reference = deserializer.decode(messages(payloads), range(len(payloads)))
    assert_agree(batch, reference, payloads)
    note_lane(batch)


def test_a_clean_protobuf_batch_takes_the_column_lane() -> None:
    payloads = [
        _proto_payload({"id": f"e{i}", "user": {"id": i, "country": "FR"}} if i % 2 else {}) for i in range(BATCH)
    ]
    payloads[5] = payloads[5] + b"\xff"  # a truncated tag: not a protobuf message
    deserializer = build_deserializer(FormatConfig(type="protobuf"), _protobuf_registry(), "events")  # type: ignore[arg-type]
    decoded = deserializer.decode(messages(payloads), range(len(payloads)))
    assert [position for position, _ in decoded.failures] == [5]
    assert decoded.documents == {}
    assert decoded.table.column("user").to_pylist()[:2] == [None, {"id": 1, "country": "FR"}]


def test_a_group_read_as_columns_that_cannot_join_the_table_gets_documents() -> None:
    """Two writer schemas give field ``x`` two types: the smaller group goes to the reference lane, with
    documents decoded for it (its rows were read as columns, so it had none)."""
    as_long = {"type": "record", "name": "X", "fields": [{"name": "x", "type": "long"}]}
    as_text = {"type": "record", "name": "X", "fields": [{"name": "x", "type": "string"}]}
    registry = MemoryRegistry()
    registry.add(1, as_long)
    registry.add(2, as_text)
    payloads = [confluent(1, _datum(fastavro.parse_schema(as_long), {"x": i})) for i in range(BATCH)]
    payloads += [confluent(2, _datum(fastavro.parse_schema(as_text), {"x": str(i)})) for i in range(BATCH - 1)]
    decoded = check_batch(_deserializer(registry), payloads)
    assert decoded.fast == list(range(BATCH))
    assert decoded.documents == {BATCH + i: {"x": str(i)} for i in range(BATCH - 1)}


def test_a_conflict_between_writer_schemas_is_settled_by_group_not_by_piece() -> None:
    """The larger writer-schema group keeps the typed lane even when its rows come in two pieces (some read
    as columns, some one by one): the rule both lanes share, so which lane read a row cannot change it."""
    long_type = pa.struct([pa.field("x", pa.int64())])
    text_type = pa.struct([pa.field("x", pa.string())])
    columns = pa.Table.from_struct_array(pa.array([{"x": i} for i in range(40)], long_type))
    as_long = TypedGroup(Shape(long_type, None, False), list(range(40, 70)), [{"x": i} for i in range(40, 70)])
    as_long.columns = (list(range(40)), columns)
    as_text = TypedGroup(Shape(text_type, None, False), list(range(70, 120)), [{"x": str(i)} for i in range(50)])
    decoded = typed_decode([as_long, as_text], [], lambda position: {"x": position})
    assert decoded.fast == list(range(70))  # 70 rows against 50, though no single piece of it exceeds 50
    assert decoded.table.column("x").to_pylist() == list(range(70))
    assert sorted(set(decoded.documents) - set(decoded.fast)) == list(range(70, 120))


def test_protobuf_messages_with_required_fields_keep_the_dict_lane() -> None:
    registry = MemoryRegistry()
    registry.add(30, 'syntax = "proto2"; message Old { required int64 a = 1; optional string b = 2; }', "PROTOBUF")
    deserializer = build_deserializer(FormatConfig(type="protobuf"), registry, "events")  # type: ignore[arg-type]
    payloads = [confluent(30, b"\x08" + bytes([i % 100]), b"\x00") for i in range(BATCH)]
    decoded = deserializer.decode(messages(payloads), range(len(payloads)))
    assert decoded.failures == []
    assert len(decoded.documents) == BATCH  # decoded one by one, as dicts


@pytest.mark.parametrize("reader_note", ["string", {"type": "string", "logicalType": "uuid"}])
def test_a_reader_schema_file_like_the_writer_schema(tmp_path: Any, reader_note: Any) -> None:
    """A reader schema of the same canonical form is not resolved to: the column lane reads when its Arrow type
    is the reader's (not when only a logical type tells them apart)."""
    reader = {**EVENT, "fields": [*EVENT["fields"][:3], {"name": "note", "type": ["null", reader_note]}]}
    avsc = tmp_path / "event.avsc"
    avsc.write_text(json.dumps(reader))
    registry = MemoryRegistry()
    registry.add(1, EVENT)
    payloads = _events(BATCH)
    payloads[2] = payloads[2][:-1]
    decoded = check_batch(_deserializer(registry, avro_schema_file=str(avsc)), payloads)
    assert [position for position, _ in decoded.failures] == [2]
    assert (decoded.documents == {}) == (reader_note == "string")
