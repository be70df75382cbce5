"""Deserializers (stage ``deserialize``): JSON, Avro, Protobuf, raw, keys; fast lane vs reference lane."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import gzip
import json
import os
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pytest
from google.protobuf import descriptor_pb2  # type: ignore[import-untyped]

import kafka2delta.serialization.json as json_format
from kafka2delta import serialization
from kafka2delta.config import FormatConfig, SchemaRegistryConfig
from kafka2delta.errors import ConfigError, MessageError, RetryableError
from kafka2delta.registry import RegisteredSchema, SchemaReference, SchemaRegistry
from kafka2delta.serialization import (
    MAX_DECOMPRESSED_BYTES,
    Decoded,
    Deserializer,
    JsonDeserializer,
    avro_to_arrow,
    build_deserializer,
    protobuf_to_arrow,
)
from kafka2delta.serialization.json import _nests_deeper
from tests.support.protobuf import compile_with_protoc, message_class
from tests.support.registry import FakeRegistry
from tests.support.serialization import (
    COMMON_PROTO,
    EVENT_PROTO,
    LOGICAL,
    NODE,
    READ_SCHEMA,
    V1,
    V2,
    MemoryRegistry,
    avro_datum,
    check_partition,
    confluent,
    event,
    framed_avro,
    full_event,
    messages,
)

# --- helpers -------------------------------------------------------------------------------------


def decode_all(
    deserializer: Deserializer, payloads: Sequence[bytes], keys: Sequence[bytes | None] | None = None
) -> Decoded:
    return deserializer.decode(messages(payloads, keys), range(len(payloads)))


def reasons(decoded: Decoded) -> dict[int, str]:
    return {position: error.reason for position, error in decoded.failures}


def rows(decoded: Decoded) -> dict[int, dict[str, Any]]:
    return dict(zip(decoded.fast, decoded.table.to_pylist(), strict=True))


# --- JSON ----------------------------------------------------------------------------------------


def json_deserializer(**settings: Any) -> JsonDeserializer:
    deserializer = build_deserializer(FormatConfig(type="json", **settings), None, "events")
    assert isinstance(deserializer, JsonDeserializer)
    deserializer.set_read_schema(READ_SCHEMA)
    return deserializer


GOOD = [
    b'{"id":"a","amount":1.5,"count":2,"ts":"2024-05-01T10:00:00Z","user":{"id":7,"country":"FR"},"extra":"x"}',
    b'{"id":"b","amount":3,"user":null}',
]


def test_json_good_messages_are_one_table() -> None:
    deserializer = json_deserializer()
    decoded = decode_all(deserializer, GOOD)
    check_partition(decoded, 2)
    assert deserializer.reads == 1
    assert decoded.typed is False
    assert decoded.keys is None
    assert decoded.documents == {}
    schema = decoded.table.schema
    assert schema.field("id").type == pa.string()
    assert schema.field("amount").type == pa.float64()
    assert schema.field("user").type == pa.struct([("id", pa.int64()), ("country", pa.string())])
    assert schema.field("extra").type == pa.string()  # unknown: inferred
    assert "labels" not in schema.names
    assert rows(decoded) == {
        0: {
            "id": "a",
            "amount": 1.5,
            "count": 2,
            "ts": "2024-05-01T10:00:00Z",
            "user": {"id": 7, "country": "FR"},
            "extra": "x",
        },
        1: {"id": "b", "amount": 3.0, "count": None, "ts": None, "user": None, "extra": None},
    }


def test_a_large_json_batch_is_read_in_parallel_parts_as_one_read_would() -> None:
    # 3,000 events of ~1.5 KB: over PARALLEL_READ_MIN_BYTES, so two parts read at once on the reader threads.
    payloads = [
        json.dumps({"id": f"e{i}", "amount": i / 4, "count": i, "note": "n" * 1500}).encode() for i in range(3000)
    ]
    deserializer = json_deserializer()
    decoded = decode_all(deserializer, payloads)
    check_partition(decoded, 3000)
    assert deserializer.reads == json_format.PARALLEL_READS == 2
    assert decoded.fast == list(range(3000))
    one = json_deserializer()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(json_format, "PARALLEL_READ_MIN_BYTES", 1 << 40)
        whole = decode_all(one, payloads)
    assert one.reads == 1
    assert decoded.table.schema == whole.table.schema
    assert decoded.table.to_pylist() == whole.table.to_pylist()


@pytest.mark.parametrize(
    ("first", "second", "reads"),
    [
        # The parts infer int64 and double for the unknown "x": one read of all gives double everywhere.
        (b'{"id":"a","x":1}', b'{"id":"b","x":1.5}', 3),
        # Parts that read alone but conflict (string, number): one read fails as a whole, then bisection.
        (b'{"id":"a","x":"s"}', b'{"id":"b","x":2}', 5),
    ],
)
def test_parts_whose_types_differ_are_read_again_as_one(
    monkeypatch: pytest.MonkeyPatch, first: bytes, second: bytes, reads: int
) -> None:
    monkeypatch.setattr(json_format, "PARALLEL_READ_MIN_BYTES", 0)
    monkeypatch.setattr(json_format, "PARALLEL_READ_MIN_AVERAGE_BYTES", 0)
    parted = json_deserializer()
    decoded = decode_all(parted, [first, second])
    assert parted.reads == reads
    monkeypatch.setattr(json_format, "PARALLEL_READ_MIN_BYTES", 1 << 40)
    whole = decode_all(json_deserializer(), [first, second])
    assert (decoded.fast, decoded.documents, rows(decoded)) == (whole.fast, whole.documents, rows(whole))
    assert decoded.table.schema == whole.table.schema


def test_a_part_that_fails_sends_the_batch_to_one_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json_format, "PARALLEL_READ_MIN_BYTES", 0)
    monkeypatch.setattr(json_format, "PARALLEL_READ_MIN_AVERAGE_BYTES", 0)
    payloads = [b'{"id":"a"}', b'{"id":"b"}', b'{"id":"c"}', b"{not json", b'{"id":"e"}', b'{"id":"f"}']
    deserializer = json_deserializer()
    decoded = decode_all(deserializer, payloads)
    assert decoded.fast == [0, 1, 2, 4, 5]
    assert reasons(decoded)[3].startswith("invalid JSON")
    # Two parts, the whole batch, then its error names a row: that message alone, then the rest.
    assert deserializer.reads == 5


def parted_and_whole(
    monkeypatch: pytest.MonkeyPatch, payloads: list[bytes], read_schema: pa.Schema = READ_SCHEMA
) -> tuple[Decoded, Decoded]:
    """The batch decoded as parts read at once, and as one read."""
    found = []
    reads = []
    monkeypatch.setattr(json_format, "PARALLEL_READ_MIN_AVERAGE_BYTES", 0)
    for minimum in (0, 1 << 40):
        monkeypatch.setattr(json_format, "PARALLEL_READ_MIN_BYTES", minimum)
        deserializer = json_deserializer()
        deserializer.set_read_schema(read_schema)
        found.append(decode_all(deserializer, payloads))
        reads.append(deserializer.reads)
    assert reads[0] > reads[1]  # the parts were read
    return found[0], found[1]


@pytest.mark.parametrize(
    "payloads",
    [
        # Each half reads on its own, but one read of the survivors infers other types (review of the parts).
        [b"not json", b'{"x":1,"p":"a"}', b'{"x":"s","p":"b"}', b'{"x":"t"}'],
        [b"not json", b'{"t":"2020-01-01T00:00:00"}', b'{"t":"abc"}', b'{"t":"def"}'],
        [b"not json", b'{"s":{"a":1}}', b'{"s":{"a":[1]}}', b'{"q":1}'],
        # [null, null] fails validation alone, not beside a list of numbers.
        [b'{"l":[1],"p":"a"}', b'{"l":[2],"p":"b"}', b'{"l":[null,null]}', b'{"z":1}'],
    ],
)
def test_parts_never_change_a_lane_or_a_type(monkeypatch: pytest.MonkeyPatch, payloads: list[bytes]) -> None:
    parted, whole = parted_and_whole(monkeypatch, payloads)
    assert (parted.fast, parted.documents, reasons(parted)) == (whole.fast, whole.documents, reasons(whole))
    assert parted.table.schema == whole.table.schema
    assert rows(parted) == rows(whole)


def test_empty_objects_without_a_read_schema(monkeypatch: pytest.MonkeyPatch) -> None:
    # A route with no schema yet reads with an empty schema: a column-less table must keep one row per payload.
    parted, whole = parted_and_whole(monkeypatch, [b'{"p":"a","q":"b"}', b"{}", b"{}", b"not json"], pa.schema([]))
    for decoded in (parted, whole):
        assert decoded.fast == [0, 1, 2]
        assert rows(decoded) == {0: {"p": "a", "q": "b"}, 1: {"p": None, "q": None}, 2: {"p": None, "q": None}}
        assert reasons(decoded)[3].startswith("invalid JSON")


@pytest.mark.parametrize("empty", [b"", b" ", b"\n\t"])
def test_a_payload_of_two_objects_never_lends_one_to_an_empty_payload(
    monkeypatch: pytest.MonkeyPatch, empty: bytes
) -> None:
    for decoded in parted_and_whole(monkeypatch, [b'{"id":"a"}', b'{"id":"b"}{"id":"c"}', empty]):
        assert decoded.fast == [0]
        assert rows(decoded)[0]["id"] == "a"
        assert reasons(decoded)[1].startswith("invalid JSON")
        assert reasons(decoded)[2] == "payload holds no JSON value"


def test_payloads_with_no_json_value_are_set_aside_before_any_read() -> None:
    payloads = [b'{"id":"%d"}' % i for i in range(1000)]
    payloads[500], payloads[700] = b"", b" \n"
    deserializer = json_deserializer()
    decoded = decode_all(deserializer, payloads)
    assert reasons(decoded) == {500: "payload holds no JSON value", 700: "payload holds no JSON value"}
    assert len(decoded.fast) == 998
    assert deserializer.reads == 1  # no bisection to find them


def test_json_positions_subset() -> None:
    deserializer = json_deserializer()
    batch = messages([GOOD[0], b"not json", GOOD[1]])
    decoded = deserializer.decode(batch, [0, 2])
    assert decoded.fast == [0, 2]
    assert decoded.failures == []


def test_json_pretty_printed_payload() -> None:
    pretty = json.dumps({"id": "p", "user": {"id": 1, "country": "DE"}}, indent=2).encode()
    decoded = decode_all(json_deserializer(), [GOOD[0], pretty, GOOD[1]])
    check_partition(decoded, 3)
    assert decoded.fast == [0, 1, 2]
    assert rows(decoded)[1]["user"] == {"id": 1, "country": "DE"}


def test_json_two_objects_in_one_payload_is_a_dead_letter() -> None:
    decoded = decode_all(json_deserializer(), [GOOD[0], b'{"id":"x"}{"id":"y"}', b'{"id":"z"}\n{"id":"w"}', GOOD[1]])
    check_partition(decoded, 4)
    assert decoded.fast == [0, 3]
    assert reasons(decoded)[1].startswith("invalid JSON: unexpected content after document")
    assert reasons(decoded)[2].startswith("invalid JSON: unexpected content after document")


def test_json_unterminated_object_does_not_swallow_its_neighbour() -> None:
    decoded = decode_all(json_deserializer(), [b'{"id":"a","user":{"id":1', b'{"id":"b"}', b'{"id":"c"'])
    check_partition(decoded, 3)
    assert decoded.fast == [1]
    assert rows(decoded)[1]["id"] == "b"
    assert set(reasons(decoded)) == {0, 2}
    assert all(reason.startswith("invalid JSON") for reason in reasons(decoded).values())


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"[1, 2]", "payload is a JSON array, not an object"),
        (b'"text"', "payload is a JSON string, not an object"),
        (b"12.5", "payload is a JSON number, not an object"),
        (b"true", "payload is a JSON boolean, not an object"),
        (b"null", "payload is JSON null, not an object"),
        (b"   ", "payload holds no JSON value"),
        (b'{"id": "caf\xc3\xa9 \xff"}', "payload is not valid UTF-8: invalid start byte at byte 14"),
        (b'{"id": nope}', "invalid JSON: invalid literal"),
        (b'{"amount": NaN}', "invalid JSON: unexpected character"),
        (b'{"amount": -Infinity}', "invalid JSON"),
        (b'{"amount": 1e400}', "invalid JSON: number is infinity"),
        (b'{"id": "\\ud800"}', "invalid JSON: no low surrogate"),
        (b'{"id": 1,}', "invalid JSON"),
    ],
)
def test_json_bad_payloads_are_dead_letters(payload: bytes, reason: str) -> None:
    deserializer = json_deserializer()
    decoded = decode_all(deserializer, [GOOD[0], payload, GOOD[1]])
    check_partition(decoded, 3)
    assert decoded.fast == [0, 2]
    assert reasons(decoded)[1].startswith(reason), reasons(decoded)[1]
    with pytest.raises(MessageError) as caught:
        deserializer.document(messages([payload]), 0)
    assert caught.value.reason == reasons(decoded)[1]


def test_json_utf8_bom_takes_the_slow_lane() -> None:
    # Arrow accepts a BOM only at the very start of its input, so never in our reads; the reference
    # lane skips it (RFC 8259 allows a parser to), so the message is a document wherever it stands.
    payload = b'\xef\xbb\xbf{"id":"bom"}'
    deserializer = json_deserializer()
    for batch in ([payload], [GOOD[1], payload], [payload, GOOD[1]]):
        decoded = decode_all(deserializer, batch)
        check_partition(decoded, len(batch))
        assert decoded.documents == {batch.index(payload): {"id": "bom"}}
    assert deserializer.document(messages([payload]), 0) == {"id": "bom"}


@pytest.mark.parametrize(
    ("payload", "document"),
    [
        # Arrow refuses these for the read schema; the coercion stage will convert them.
        (b'{"id":"s","amount":"12"}', {"id": "s", "amount": "12"}),
        (b'{"id":"s","ts":1714557600000}', {"id": "s", "ts": 1714557600000}),
        (b'{"id":"s","count":1.0}', {"id": "s", "count": 1.0}),
        (b'{"id":"s","user":{"id":"7"}}', {"id": "s", "user": {"id": "7"}}),
        (b'{"id":"s","id":"t"}', {"id": "t"}),  # duplicated key: the last one wins
        (b'{"id":"s","count":123456789012345678901234567890}', {"id": "s", "count": 123456789012345678901234567890}),
    ],
)
def test_json_messages_arrow_refuses_take_the_slow_lane(payload: bytes, document: dict[str, Any]) -> None:
    deserializer = json_deserializer()
    decoded = decode_all(deserializer, [GOOD[0], payload, GOOD[1]])
    check_partition(decoded, 3)
    assert decoded.fast == [0, 2]
    assert decoded.documents == {1: document}
    assert deserializer.document(messages([payload]), 0) == document


def test_json_big_integers_are_exact_in_the_reference_lane() -> None:
    value = 10**37 + 1  # decimal(38,0) needs it exact: orjson alone would give a float
    document = serialization.parse_json_object(b'{"n": %d, "m": -%d, "f": 0.1}' % (value, value))
    assert document == {"n": value, "m": -value, "f": 0.1}
    assert isinstance(document["n"], int)


def test_json_one_bad_message_in_ten_thousand_costs_few_reads() -> None:
    payloads = [b'{"id":"m%d","amount":%d.5,"user":{"id":%d,"country":"FR"}}' % (i, i, i) for i in range(10_000)]
    for bad, reason in ((b'{"id": oops}', "invalid JSON"), (b'{"id":"x","amount":"12"}', None)):
        batch = list(payloads)
        batch[6_789] = bad
        deserializer = json_deserializer()
        decoded = decode_all(deserializer, batch)
        check_partition(decoded, 10_000)
        assert len(decoded.fast) == 9_999
        # Bisection alone would cost about 2·log2(n) ≈ 27 reads; the row named by Arrow's error costs 3.
        assert deserializer.reads <= 4, deserializer.reads
        if reason:
            assert reasons(decoded)[6_789].startswith(reason)
        else:
            assert decoded.documents == {6_789: {"id": "x", "amount": "12"}}


def test_json_scattered_bad_messages_cost_about_k_log_n_reads() -> None:
    payloads = [b'{"id":"m%d"}' % i for i in range(4096)]
    bad = [5, 700, 1500, 2222, 3000, 3001, 3333, 4000, 4095, 123, 2048, 77]
    for index in bad:
        payloads[index] = b'{"id": oops'
    deserializer = json_deserializer()
    decoded = decode_all(deserializer, payloads)
    check_partition(decoded, 4096)
    assert sorted(reasons(decoded)) == sorted(bad)
    assert deserializer.reads <= 2 * len(bad) * 12 + 1


def test_json_epoch_timestamps_take_the_slow_lane_without_one_read_each() -> None:
    payloads = [b'{"id":"m%d","ts":%d}' % (i, 1714557600000 + i) for i in range(5_000)]
    payloads[10] = b'{"id":"text","ts":"2024-05-01T10:00:00Z"}'
    deserializer = json_deserializer()
    decoded = decode_all(deserializer, payloads)
    check_partition(decoded, 5_000)
    assert decoded.fast == [10]
    assert decoded.documents[0] == {"id": "m0", "ts": 1714557600000}
    assert len(decoded.documents) == 4_999
    assert deserializer.reads < 50


def test_json_inference_conflicts_in_unknown_fields() -> None:
    # x is unknown: Arrow infers it per read. A string and a number cannot share one column, so the
    # smaller side takes the slow lane; every value stays what the message says.
    payloads = [b'{"id":"a","x":"text"}', b'{"id":"b","x":1}', b'{"id":"c","x":2}', b'{"id":"d","x":2.5}']
    decoded = decode_all(json_deserializer(), payloads)
    check_partition(decoded, 4)
    assert decoded.fast == [1, 2, 3]
    assert decoded.table.schema.field("x").type == pa.float64()  # int64 + double promote to double
    assert [row["x"] for row in decoded.table.to_pylist()] == [1.0, 2.0, 2.5]
    assert decoded.documents == {0: {"id": "a", "x": "text"}}


def test_json_lane_and_value_do_not_depend_on_neighbours() -> None:
    deserializer = json_deserializer()
    candidates = [
        *GOOD,
        b'{"id":"s","amount":"12"}',
        b'{"id": oops}',
        b"[1]",
        b'{"id":"e","ts":1714557600000}',
        json.dumps({"id": "p", "count": 3}, indent=1).encode(),
        b'{"id":"u","user":{"id":1,"country":"JP"},"tags":["a","b"]}',
    ]
    alone = [decode_all(deserializer, [payload]) for payload in candidates]
    batch = candidates * 3
    mixed = decode_all(deserializer, batch)
    check_partition(mixed, len(batch))
    mixed_rows = rows(mixed)
    mixed_reasons = reasons(mixed)
    for position, payload in enumerate(batch):
        single = alone[position % len(candidates)]
        if single.fast:
            expected = {k: v for k, v in rows(single)[0].items() if v is not None}
            assert {k: v for k, v in mixed_rows[position].items() if v is not None} == expected, payload
        elif single.documents:
            assert mixed.documents[position] == single.documents[0]
        else:
            assert mixed_reasons[position] == reasons(single)[0]


def test_json_gzip() -> None:
    deserializer = json_deserializer(gzip=True)
    payloads = [gzip.compress(GOOD[0]), GOOD[1], gzip.compress(b"[]"), gzip.compress(GOOD[1])[:-6]]
    payloads.append(gzip.compress(GOOD[1]) + gzip.compress(b'{"id":"second member"}'))
    decoded = decode_all(deserializer, payloads)
    check_partition(decoded, 5)
    assert decoded.fast == [0]
    assert rows(decoded)[0]["id"] == "a"
    assert reasons(decoded)[1] == "payload is not gzip: it starts with 0x7b 0x22, expected 0x1f 0x8b"
    assert reasons(decoded)[2] == "payload is a JSON array, not an object"
    assert reasons(decoded)[3].startswith("payload is not gzip")
    # Two gzip members are one stream (as gunzip reads them): two JSON objects, a dead letter.
    assert reasons(decoded)[4].startswith("invalid JSON")
    assert deserializer.document(messages([payloads[0]]), 0)["id"] == "a"


def test_json_gzip_bomb_is_a_dead_letter() -> None:
    bomb = gzip.compress(b" " * (MAX_DECOMPRESSED_BYTES + 1), compresslevel=9)
    assert len(bomb) < 200_000
    decoded = decode_all(json_deserializer(gzip=True), [bomb, gzip.compress(GOOD[1])])
    check_partition(decoded, 2)
    assert reasons(decoded) == {0: "gzip payload inflates beyond 64 MiB"}
    assert decoded.fast == [1]


def test_json_without_read_schema_infers_everything() -> None:
    deserializer = build_deserializer(FormatConfig(type="json"), None, "events")
    decoded = decode_all(deserializer, [b'{"a":1,"b":{"c":"x"}}'])
    assert rows(decoded) == {0: {"a": 1, "b": {"c": "x"}}}


def test_json_readable_drops_maps_at_any_depth() -> None:
    schema = pa.schema(
        [
            ("m", pa.map_(pa.string(), pa.int64())),
            ("s", pa.struct([("m", pa.map_(pa.string(), pa.int64())), ("k", pa.int64())])),
            ("l", pa.list_(pa.map_(pa.string(), pa.int64()))),
            ("k", pa.int64()),
        ]
    )
    assert serialization.json_readable(schema) == pa.schema([("s", pa.struct([("k", pa.int64())])), ("k", pa.int64())])


# --- keys ----------------------------------------------------------------------------------------


def test_keys_none_means_no_key_work() -> None:
    decoded = decode_all(json_deserializer(), GOOD, keys=[b"\xff", b"k"])
    assert decoded.keys is None
    assert decoded.failures == []


def test_string_keys() -> None:
    deserializer = json_deserializer(key="string")
    decoded = decode_all(deserializer, [GOOD[0], GOOD[1], GOOD[0]], keys=[b"k1", None, b"bad \xff key"])
    check_partition(decoded, 3)
    assert decoded.keys == ["k1", None, None]
    assert decoded.fast == [0, 1]
    assert reasons(decoded) == {2: "key: key is not valid UTF-8: invalid start byte at byte 4"}
    with pytest.raises(MessageError, match=r"^deserialize: key: "):
        deserializer.document(messages([GOOD[0]], keys=[b"\xff"]), 0)


def test_json_keys() -> None:
    decoded = decode_all(
        json_deserializer(key="json"), [GOOD[0]] * 4, keys=[b'{"tenant": 1}', b"42", b'"text"', b"{nope"]
    )
    check_partition(decoded, 4)
    assert decoded.keys == [{"tenant": 1}, 42, "text", None]
    assert reasons(decoded)[3].startswith("key: invalid JSON")


def test_avro_keys() -> None:
    registry = MemoryRegistry()
    registry.add(1, json.dumps("string"))
    registry.add(2, {"type": "record", "name": "K", "fields": [{"name": "tenant", "type": "int"}]})
    deserializer = build_deserializer(FormatConfig(type="json", key="avro"), registry, "events")  # type: ignore[arg-type]
    keys = [
        framed_avro(1, "string", "user-1"),
        framed_avro(2, {"type": "record", "name": "K", "fields": [{"name": "tenant", "type": "int"}]}, {"tenant": 3}),
        b"plain",
        confluent(9, b"\x02"),
        None,
    ]
    decoded = decode_all(deserializer, [GOOD[1]] * 5, keys=keys)
    check_partition(decoded, 5)
    assert decoded.keys == ["user-1", {"tenant": 3}, None, None, None]
    assert reasons(decoded) == {
        2: "key: not Confluent wire format: magic byte 0x70, expected 0x00",
        3: "key: schema id 9 is not in the registry",
    }


def test_key_formats_need_what_they_need() -> None:
    with pytest.raises(ConfigError, match=r"format\.key"):
        build_deserializer(FormatConfig(type="json", key="avro"), None, "events")
    with pytest.raises(ConfigError, match=r"format\.type"):
        build_deserializer(FormatConfig(type="protobuf"), None, "events")


# --- raw -----------------------------------------------------------------------------------------


def test_raw_string_column() -> None:
    deserializer = build_deserializer(FormatConfig(type="raw", raw_column="line"), None, "events")
    deserializer.set_read_schema(pa.schema([("line", pa.string()), ("other", pa.int64())]))
    decoded = decode_all(deserializer, [b"hello", "h\u00e9".encode(), b"ab\xffcd", b"{not json}"])
    check_partition(decoded, 4)
    assert decoded.typed is True
    assert decoded.table.schema == pa.schema([("line", pa.string())])
    assert rows(decoded) == {0: {"line": "hello"}, 1: {"line": "h\u00e9"}, 3: {"line": "{not json}"}}
    assert reasons(decoded) == {2: "payload is not valid UTF-8: invalid start byte at byte 2"}
    assert deserializer.document(messages([b"x"]), 0) == {"line": "x"}


def test_raw_binary_column_and_gzip() -> None:
    deserializer = build_deserializer(FormatConfig(type="raw", gzip=True), None, "events")
    deserializer.set_read_schema(pa.schema([("value", pa.binary())]))
    decoded = decode_all(deserializer, [gzip.compress(b"\x00\xff"), b"plain"])
    check_partition(decoded, 2)
    assert decoded.table.schema == pa.schema([("value", pa.binary())])
    assert rows(decoded) == {0: {"value": b"\x00\xff"}}
    assert reasons(decoded)[1].startswith("payload is not gzip")


# --- Avro ----------------------------------------------------------------------------------------


def avro_registry() -> MemoryRegistry:
    registry = MemoryRegistry()
    registry.add(1, V1)
    registry.add(2, V2)
    registry.add(3, 'syntax = "proto3"; message M {}', "PROTOBUF")
    return registry


def avro_deserializer(registry: Any, **settings: Any) -> Deserializer:
    return build_deserializer(FormatConfig(type="avro", **settings), registry, "events")


def test_avro_v1_and_v2_in_one_batch() -> None:
    registry = avro_registry()
    payloads = [
        framed_avro(1, V1, event(0)),
        framed_avro(2, V2, event(1, note="hi")),
        framed_avro(1, V1, event(2)),
        framed_avro(2, V2, event(3, note=None)),
    ]
    decoded = decode_all(avro_deserializer(registry), payloads)
    check_partition(decoded, 4)
    assert decoded.typed is True
    assert decoded.fast == [0, 1, 2, 3]
    assert decoded.table.schema == pa.schema(
        [
            ("id", pa.string()),
            ("amount", pa.float64()),
            ("kind", pa.string()),
            ("user", pa.struct([("id", pa.int64())])),
            ("note", pa.string()),
        ]
    )
    assert [row["note"] for row in decoded.table.to_pylist()] == [None, "hi", None, None]
    assert rows(decoded)[2] == {**event(2), "note": None}
    # Every record is a document too.
    assert decoded.documents == {0: event(0), 1: event(1, note="hi"), 2: event(2), 3: event(3, note=None)}
    assert registry.calls == 2  # one lookup per schema id, then cached


def test_avro_v2_field_is_a_column_even_when_all_null() -> None:
    decoded = decode_all(avro_deserializer(avro_registry()), [framed_avro(2, V2, event(1))])
    assert decoded.table.schema.field("note").type == pa.string()
    assert decoded.table.column("note").to_pylist() == [None]


def test_avro_bad_payloads_are_dead_letters() -> None:
    registry = avro_registry()
    good = framed_avro(1, V1, event(0))
    payloads = [
        good,
        b'{"id": 1}',
        b"\x00\x00\x01",
        good[:-3],
        good + b"\x00\x01",
        framed_avro(42, V1, event(0)),
        confluent(3, b""),
        confluent(1, b"\x06e\xff\xfe" + good[9:]),
        confluent(1, good[5:7] + b"\x08"),
    ]
    decoded = decode_all(avro_deserializer(registry), payloads)
    check_partition(decoded, len(payloads))
    assert decoded.fast == [0]
    found = reasons(decoded)
    assert found[1] == "not Confluent wire format: magic byte 0x7b, expected 0x00"
    assert found[2] == "truncated: 3 bytes, the Confluent header needs 5"
    assert found[3].startswith("truncated Avro datum")
    assert found[4] == "2 trailing bytes after the Avro datum"
    assert found[5] == "schema id 42 is not in the registry"
    assert found[6] == "schema id 3 is a PROTOBUF schema, not AVRO"
    assert found[7].startswith("an Avro string is not valid UTF-8")
    assert "not a valid Avro datum" in found[8] or "truncated" in found[8]
    for position, reason in found.items():
        with pytest.raises(MessageError) as caught:
            avro_deserializer(registry).document(messages(payloads), position)
        assert caught.value.reason == reason


def test_avro_registry_outage_is_raised_not_dead_lettered() -> None:
    registry = avro_registry()
    registry.down = True
    deserializer = avro_deserializer(registry)
    with pytest.raises(RetryableError):
        decode_all(deserializer, [framed_avro(1, V1, event(0))])
    with pytest.raises(RetryableError):
        deserializer.document(messages([framed_avro(1, V1, event(0))]), 0)
    registry.down = False  # back: the same messages decode
    assert decode_all(deserializer, [framed_avro(1, V1, event(0))]).fast == [0]


def test_avro_through_the_http_registry(fake_registry: FakeRegistry) -> None:
    fake_registry.state.register(1, json.dumps(V1))
    registry = SchemaRegistry(SchemaRegistryConfig(url=fake_registry.url))
    deserializer = avro_deserializer(registry)
    payloads = [framed_avro(1, V1, event(i)) for i in range(100)] + [framed_avro(5, V1, event(0))] * 100
    decoded = decode_all(deserializer, payloads)
    check_partition(decoded, 200)
    assert len(decoded.fast) == 100
    assert set(reasons(decoded).values()) == {"schema id 5 is not in the registry"}
    assert fake_registry.state.requests == ["/schemas/ids/1", "/schemas/ids/5"]
    fake_registry.shutdown()
    fake_registry.server_close()
    with pytest.raises(RetryableError):
        decode_all(
            avro_deserializer(SchemaRegistry(SchemaRegistryConfig(url=fake_registry.url, timeout_s=1))), payloads
        )


def write_schema_file(schema: Any) -> str:
    handle, path = tempfile.mkstemp(suffix=".avsc")
    with os.fdopen(handle, "w") as file:
        json.dump(schema, file)
    return path


def test_avro_reader_schema_file() -> None:
    registry = avro_registry()
    # The reader drops "kind", adds a field with a default, and widens nothing.
    reader = {
        "type": "record",
        "name": "Event",
        "namespace": "acme",
        "fields": [
            {"name": "id", "type": "string"},
            {"name": "amount", "type": "double"},
            {"name": "note", "type": ["null", "string"], "default": None},
            {"name": "source", "type": "string", "default": "kafka"},
        ],
    }
    path = write_schema_file(reader)
    try:
        deserializer = avro_deserializer(registry, avro_schema_file=path)
        payloads = [framed_avro(1, V1, event(0)), framed_avro(2, V2, event(1, note="n"))]
        decoded = decode_all(deserializer, payloads)
    finally:
        os.unlink(path)
    check_partition(decoded, 2)
    assert decoded.table.schema.names == ["id", "amount", "note", "source"]
    assert decoded.table.to_pylist() == [
        {"id": "e0", "amount": 0.5, "note": None, "source": "kafka"},
        {"id": "e1", "amount": 1.5, "note": "n", "source": "kafka"},
    ]


def test_avro_reader_schema_resolution_error_is_a_dead_letter() -> None:
    registry = avro_registry()
    reader = {"type": "record", "name": "Event", "namespace": "acme", "fields": [{"name": "missing", "type": "long"}]}
    path = write_schema_file(reader)
    try:
        decoded = decode_all(avro_deserializer(registry, avro_schema_file=path), [framed_avro(1, V1, event(0))])
    finally:
        os.unlink(path)
    assert reasons(decoded)[0].startswith("the writer schema does not resolve to the reader schema")


def test_avro_bare_datums_with_the_schema_file() -> None:
    path = write_schema_file(V1)
    try:
        deserializer = avro_deserializer(None, avro_schema_file=path)
    finally:
        os.unlink(path)
    decoded = decode_all(deserializer, [avro_datum(V1, event(0)), avro_datum(V1, event(1))[:-2]])
    check_partition(decoded, 2)
    assert rows(decoded) == {0: event(0)}
    assert reasons(decoded)[1].startswith("truncated Avro datum")


def test_avro_schema_file_errors_name_the_key() -> None:
    with pytest.raises(ConfigError, match=r"format\.avro_schema_file"):
        avro_deserializer(None, avro_schema_file="/nonexistent/schema.avsc")
    path = write_schema_file({"type": "record", "name": "X", "fields": [{"name": "a", "type": "nope"}]})
    try:
        with pytest.raises(ConfigError, match=r"format\.avro_schema_file"):
            avro_deserializer(None, avro_schema_file=path)
    finally:
        os.unlink(path)


def test_avro_to_arrow_types() -> None:
    assert avro_to_arrow(LOGICAL) == pa.struct(
        [
            ("day", pa.date32()),
            ("at_ms", pa.timestamp("us", "UTC")),
            ("at_us", pa.timestamp("us", "UTC")),
            ("local_ms", pa.timestamp("us")),
            ("price", pa.decimal128(10, 2)),
            ("fixed_price", pa.decimal128(12, 3)),
            ("huge", pa.string()),
            ("uid", pa.string()),
            ("t_ms", pa.int64()),
            ("t_us", pa.int64()),
            ("blob", pa.binary()),
            ("hash", pa.binary()),
            ("small", pa.int32()),
            ("ratio", pa.float32()),
            ("flag", pa.bool_()),
            ("tags", pa.list_(pa.string())),
            ("scores", pa.map_(pa.string(), pa.int64())),
            ("maybe_time", pa.int64()),
            ("times", pa.list_(pa.int64())),
        ]
    )
    assert avro_to_arrow("string") == pa.string()
    assert avro_to_arrow('["long", "null"]') == pa.int64()
    assert avro_to_arrow(["null", "string", "long"]) == pa.string()  # no faithful type: slow lane
    recursive = {
        "type": "record",
        "name": "Node",
        "fields": [{"name": "value", "type": "int"}, {"name": "next", "type": ["null", "Node"]}],
    }
    assert avro_to_arrow(recursive) == pa.struct([("value", pa.int32()), ("next", pa.string())])
    reused = {
        "type": "record",
        "name": "Pair",
        "fields": [
            {"name": "a", "type": {"type": "record", "name": "P", "fields": [{"name": "x", "type": "int"}]}},
            {"name": "b", "type": "P"},
        ],
    }
    assert avro_to_arrow(reused) == pa.struct(
        [("a", pa.struct([("x", pa.int32())])), ("b", pa.struct([("x", pa.int32())]))]
    )


def test_avro_logical_values() -> None:
    uid = uuid.UUID("12345678-1234-5678-1234-567812345678")
    value = {
        "day": dt.date(2024, 5, 1),
        "at_ms": dt.datetime(2024, 5, 1, 10, 0, 0, 123000, tzinfo=dt.UTC),
        "at_us": dt.datetime(2024, 5, 1, 10, 0, 0, 123456, tzinfo=dt.UTC),
        "local_ms": dt.datetime(2024, 5, 1, 12, 0, 0, 5000),
        "price": decimal.Decimal("12.34"),
        "fixed_price": decimal.Decimal("-1.500"),
        "huge": decimal.Decimal("123456789012345678901234567890123456789012345.12345"),
        "uid": uid,
        "t_ms": dt.time(1, 2, 3, 4000),
        "t_us": dt.time(23, 59, 59, 999999),
        "blob": b"\x00\x01",
        "hash": b"abcd",
        "small": -5,
        "ratio": 0.5,
        "flag": True,
        "tags": ["a"],
        "scores": {"k": 1},
        "maybe_time": dt.time(0, 0, 1),
        "times": [dt.time(0, 0, 0, 7)],
    }
    registry = MemoryRegistry()
    registry.add(1, LOGICAL)
    decoded = decode_all(avro_deserializer(registry), [framed_avro(1, LOGICAL, value)])
    check_partition(decoded, 1)
    assert decoded.table.schema == pa.schema(list(avro_to_arrow(LOGICAL)))
    expected = {
        **value,
        "uid": str(uid),
        "huge": "123456789012345678901234567890123456789012345.12345",
        "t_ms": 3_723_004_000,
        "t_us": 86_399_999_999,
        "maybe_time": 1_000_000,
        "times": [7],
    }
    assert decoded.documents[0] == expected
    row = decoded.table.to_pylist()[0]
    assert row == {**expected, "scores": [("k", 1)]}


def test_avro_unions_and_recursion_take_the_slow_lane() -> None:
    union = {
        "type": "record",
        "name": "U",
        "fields": [{"name": "id", "type": "string"}, {"name": "value", "type": ["null", "string", "long"]}],
    }
    registry = MemoryRegistry()
    registry.add(1, union)
    registry.add(2, V1)
    payloads = [framed_avro(1, union, {"id": "a", "value": 5}), framed_avro(2, V1, event(0))]
    decoded = decode_all(avro_deserializer(registry), payloads)
    check_partition(decoded, 2)
    assert decoded.fast == [1]
    assert decoded.documents[0] == {"id": "a", "value": 5}
    # The union field is typed string for schema evolution.
    assert decoded.table.schema.field("value").type == pa.string()


def test_avro_non_record_values_are_dead_letters() -> None:
    registry = MemoryRegistry()
    registry.add(1, json.dumps("string"))
    decoded = decode_all(avro_deserializer(registry), [framed_avro(1, "string", "text")])
    assert reasons(decoded) == {0: "the Avro value is a string, not a record"}


def test_avro_value_arrow_refuses_takes_the_slow_lane() -> None:
    # A decimal wider than its declared precision: fastavro reads it, Arrow refuses it.
    schema = {
        "type": "record",
        "name": "D",
        "fields": [{"name": "d", "type": {"type": "bytes", "logicalType": "decimal", "precision": 4, "scale": 0}}],
    }
    registry = MemoryRegistry()
    registry.add(1, schema)
    wide = confluent(
        1,
        avro_datum(
            {"type": "record", "name": "D", "fields": [{"name": "d", "type": "bytes"}]},
            {"d": (10**6).to_bytes(4, "big")},
        ),
    )
    decoded = decode_all(avro_deserializer(registry), [framed_avro(1, schema, {"d": decimal.Decimal(12)}), wide])
    check_partition(decoded, 2)
    assert decoded.fast == [0]
    assert decoded.documents[1] == {"d": decimal.Decimal(10**6)}


def test_avro_references() -> None:
    user = {"type": "record", "name": "User", "namespace": "acme", "fields": [{"name": "id", "type": "long"}]}
    order = {"type": "record", "name": "Order", "namespace": "acme", "fields": [{"name": "user", "type": "acme.User"}]}
    registry = MemoryRegistry()
    registry.subjects[("user-value", 1)] = RegisteredSchema(10, "AVRO", json.dumps(user))
    registry.add(11, order, references=[SchemaReference("acme.User", "user-value", 1)])
    writer = {**order, "fields": [{"name": "user", "type": user}]}
    decoded = decode_all(avro_deserializer(registry), [framed_avro(11, writer, {"user": {"id": 5}})])
    assert rows(decoded) == {0: {"user": {"id": 5}}}
    assert decoded.table.schema.field("user").type == pa.struct([("id", pa.int64())])


def test_avro_lane_and_value_do_not_depend_on_neighbours() -> None:
    registry = avro_registry()
    candidates = [
        framed_avro(1, V1, event(0)),
        framed_avro(2, V2, event(1, note="x")),
        b"\x07junk",
        framed_avro(42, V1, event(0)),
        framed_avro(1, V1, event(3))[:-1],
    ]
    deserializer = avro_deserializer(registry)
    batch = candidates * 2
    mixed = decode_all(deserializer, batch)
    check_partition(mixed, len(batch))
    for position, payload in enumerate(batch):
        single = decode_all(deserializer, [payload])
        if single.fast:
            assert position in mixed.fast
            assert mixed.documents[position] == single.documents[0]
        else:
            assert reasons(mixed)[position] == reasons(single)[0]


# --- Protobuf ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def proto_pool() -> Any:
    return compile_with_protoc({"event.proto": EVENT_PROTO, "acme/common.proto": COMMON_PROTO}, "event.proto")


proto_class = message_class


def proto_registry() -> MemoryRegistry:
    registry = MemoryRegistry()
    registry.subjects[("acme-common", 2)] = RegisteredSchema(20, "PROTOBUF", COMMON_PROTO)
    registry.add(21, EVENT_PROTO, "PROTOBUF", [SchemaReference("acme/common.proto", "acme-common", 2)])
    registry.add(22, V1)
    registry.add(23, 'syntax = "proto3"; message Broken { strin id = 1; }', "PROTOBUF")
    return registry


def test_protobuf_to_arrow(proto_pool: Any) -> None:
    user = pa.struct([("id", pa.int64()), ("country", pa.string())])
    assert protobuf_to_arrow(proto_pool.FindMessageTypeByName("acme.events.Event")) == pa.struct(
        [
            ("id", pa.string()),
            ("count", pa.int64()),
            ("amount", pa.float64()),
            ("kind", pa.string()),
            ("user", user),
            ("tags", pa.list_(pa.string())),
            ("scores", pa.map_(pa.string(), pa.int32())),
            ("at", pa.timestamp("us", "UTC")),
            ("blob", pa.binary()),
            ("big", pa.decimal128(20, 0)),
            ("note", pa.string()),
            ("price", pa.struct([("currency", pa.string()), ("units", pa.int64())])),
            ("small", pa.int64()),
            ("ratio", pa.float32()),
            ("flag", pa.bool_()),
            ("friends", pa.list_(user)),
            ("by_name", pa.map_(pa.string(), user)),
            ("maybe", pa.int64()),
            ("text", pa.string()),
            ("number", pa.int32()),
            ("delta", pa.int32()),
        ]
    )
    assert protobuf_to_arrow(proto_pool.FindMessageTypeByName("acme.events.Node")) == pa.struct(
        [("value", pa.int32()), ("next", pa.string())]
    )


def test_protobuf_messages(proto_pool: Any) -> None:
    registry = proto_registry()
    deserializer = build_deserializer(FormatConfig(type="protobuf"), registry, "events")  # type: ignore[arg-type]
    event_class = proto_class(proto_pool, "acme.events.Event")
    other_class = proto_class(proto_pool, "acme.events.Other")
    payloads = [
        confluent(21, full_event(proto_pool).SerializeToString(), b"\x00"),
        confluent(21, event_class().SerializeToString(), b"\x00"),
        confluent(21, other_class(name="o").SerializeToString(), b"\x02\x02"),  # indexes [1]
    ]
    decoded = decode_all(deserializer, payloads)
    check_partition(decoded, 3)
    assert decoded.typed is True
    assert decoded.fast == [0, 1, 2]
    full = {
        "id": "x",
        "count": 2**40,
        "amount": 1.5,
        "kind": "VIEW",
        "user": {"id": 7, "country": "FR"},
        "tags": ["a", "b"],
        "scores": {"k": 3},
        "at": dt.datetime(2023, 11, 14, 22, 13, 20, 123456, tzinfo=dt.UTC),
        "blob": b"",
        "big": 2**64 - 1,
        "note": "n",
        "price": {"currency": "EUR", "units": 0},
        "small": 2**32 - 1,
        "ratio": 0.25,
        "flag": True,
        "friends": [{"id": 1, "country": "DE"}],
        "by_name": {"bob": {"id": 9, "country": ""}},
        "maybe": 11,
        "text": None,
        "number": 4,
        "delta": -3,
    }
    assert decoded.documents[0] == full
    # Unset: proto3 scalars are their default, messages/optional/oneof/wrappers are null.
    empty = {
        "id": "",
        "count": 0,
        "amount": 0.0,
        "kind": "KIND_UNSPECIFIED",
        "user": None,
        "tags": [],
        "scores": {},
        "at": None,
        "blob": b"",
        "big": 0,
        "note": None,
        "price": None,
        "small": 0,
        "ratio": 0.0,
        "flag": False,
        "friends": [],
        "by_name": {},
        "maybe": None,
        "text": None,
        "number": None,
        "delta": 0,
    }
    assert decoded.documents[1] == empty
    assert decoded.documents[2] == {"name": "o"}
    table_rows = rows(decoded)
    assert table_rows[0]["at"] == full["at"]
    assert table_rows[0]["big"] == decimal.Decimal(2**64 - 1)
    assert table_rows[0]["scores"] == [("k", 3)]
    assert table_rows[2]["name"] == "o" and table_rows[2]["id"] is None
    assert decoded.table.schema.field("at").type == pa.timestamp("us", "UTC")
    assert deserializer.document(messages(payloads), 0) == full


def test_protobuf_nested_message_index(proto_pool: Any) -> None:
    registry = proto_registry()
    deserializer = build_deserializer(FormatConfig(type="protobuf"), registry, "events")  # type: ignore[arg-type]
    # Event's nested types in declaration order: ScoresEntry (from the map field), ByNameEntry, User, …
    nested = proto_pool.FindMessageTypeByName("acme.events.Event").nested_types
    user_index = [n.name for n in nested].index("User")
    user = proto_class(proto_pool, "acme.events.Event.User")(id=5, country="JP")
    indexes = bytes([4, 0, user_index * 2])  # count 2, [0, user_index], zigzag
    decoded = decode_all(deserializer, [confluent(21, user.SerializeToString(), indexes)])
    assert rows(decoded) == {0: {"id": 5, "country": "JP"}}


def test_protobuf_bad_payloads_are_dead_letters(proto_pool: Any) -> None:
    registry = proto_registry()
    deserializer = build_deserializer(FormatConfig(type="protobuf"), registry, "events")  # type: ignore[arg-type]
    good = full_event(proto_pool).SerializeToString()
    payloads = [
        confluent(21, good, b"\x00"),
        b"\x08\x01",
        b"\x00\x00\x00",
        confluent(21, b"", b"\x02"),  # count 1, index missing
        confluent(21, good, b"\x02\x0a"),  # index [5]
        confluent(21, good[: good.index(b"EUR") + 1], b"\x00"),  # truncated inside a field
        confluent(21, b"\xff\xff\xff", b"\x00"),  # garbage
        confluent(99, good, b"\x00"),
        confluent(22, good, b"\x00"),
        confluent(23, good, b"\x00"),
        confluent(21, b"", b"\x04\x00\x7e"),  # [0, 63]: no such nested type
    ]
    decoded = decode_all(deserializer, payloads)
    check_partition(decoded, len(payloads))
    assert decoded.fast == [0]
    found = reasons(decoded)
    assert found[1] == "not Confluent wire format: magic byte 0x08, expected 0x00"
    assert found[2] == "truncated: 3 bytes, the Confluent header needs 5"
    assert found[3] == "truncated: the Confluent message-index array ends early"
    assert found[4] == "message index [5] does not exist in schema id 21 (3 top-level message types)"
    assert found[5].startswith("not a valid protobuf message acme.events.Event")
    assert found[6].startswith("not a valid protobuf message acme.events.Event")
    assert found[7] == "schema id 99 is not in the registry"
    assert found[8] == "schema id 22 is a AVRO schema, not PROTOBUF"
    assert found[9] == 'schema id 23 does not compile: kafka2delta_schema_23.proto:1:37: "strin" is not defined.'
    assert found[10].startswith("message index [0, 63] does not exist")


def test_protobuf_registry_outage_is_raised(proto_pool: Any) -> None:
    registry = proto_registry()
    registry.down = True
    deserializer = build_deserializer(FormatConfig(type="protobuf"), registry, "events")  # type: ignore[arg-type]
    payload = confluent(21, full_event(proto_pool).SerializeToString(), b"\x00")
    with pytest.raises(RetryableError):
        decode_all(deserializer, [payload])
    registry.down = False
    assert decode_all(deserializer, [payload]).fast == [0]


def test_protobuf_recursive_message_takes_the_slow_lane(proto_pool: Any) -> None:
    registry = proto_registry()
    deserializer = build_deserializer(FormatConfig(type="protobuf"), registry, "events")  # type: ignore[arg-type]
    node = proto_class(proto_pool, "acme.events.Node")(value=1)
    node.next.value = 2
    decoded = decode_all(deserializer, [confluent(21, node.SerializeToString(), b"\x02\x04")])
    check_partition(decoded, 1)
    assert decoded.fast == []
    assert decoded.documents == {0: {"value": 1, "next": {"value": 2, "next": None}}}
    assert decoded.table.schema.field("next").type == pa.string()


# --- build_deserializer --------------------------------------------------------------------------


@pytest.fixture
def no_orjson(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(json_format, "_orjson", None)
    yield


@pytest.mark.usefixtures("no_orjson")
@pytest.mark.parametrize(
    ("payload", "outcome"),
    [
        (b'{"a": 1, "b": [true, null], "c": "\\u00e9"}', {"a": 1, "b": [True, None], "c": "\u00e9"}),
        (b'{"a": NaN}', "invalid JSON"),
        (b'{"a": 1e400}', "invalid JSON: number 1e400 is too large"),
        (b'{"a": "\xff"}', "payload is not valid UTF-8: invalid start byte at byte 7"),
        (b"  ", "payload holds no JSON value"),
        (b"[" * 100_000 + b"]" * 100_000, "invalid JSON"),
    ],
)
def test_reference_lane_without_orjson(payload: bytes, outcome: Any) -> None:
    if isinstance(outcome, dict):
        assert serialization.parse_json_object(payload) == outcome
    else:
        with pytest.raises(MessageError) as caught:
            serialization.parse_json_object(payload)
        assert caught.value.reason.startswith(outcome)


# --- hazards of the libraries underneath ----------------------------------------------------------


def test_json_lone_null_does_not_crash_arrow() -> None:
    # pyarrow 26 segfaults when the first value of its input is null; every read starts with {}.
    deserializer = json_deserializer()
    for batch in ([b"null"], [b" null", GOOD[0]], [GOOD[0], b"null"]):
        decoded = decode_all(deserializer, batch)
        check_partition(decoded, len(batch))
        assert list(reasons(decoded).values()) == ["payload is JSON null, not an object"]


def test_json_arrays_of_nulls_arrow_builds_invalid_take_the_slow_lane() -> None:
    # pyarrow 26 infers list<null> for [null, null] but builds the child array too short.
    payload = b'{"id":"n","unknown":[null,null]}'
    decoded = decode_all(json_deserializer(), [GOOD[0], payload])
    check_partition(decoded, 2)
    decoded.table.validate(full=True)
    assert decoded.documents == {1: {"id": "n", "unknown": [None, None]}}


def linked(depth: int) -> bytes:
    # value=1 (zigzag 0x02), then union branch 1 (0x02) for every level but the last (branch 0: null).
    return confluent(1, b"\x02\x02" * (depth - 1) + b"\x02\x00")


def test_avro_recursive_values_are_depth_limited_not_a_crash() -> None:
    registry = MemoryRegistry()
    registry.add(1, NODE)
    deserializer = avro_deserializer(registry)
    decoded = decode_all(deserializer, [linked(3), linked(serialization.MAX_AVRO_DEPTH + 1), linked(200_000)])
    check_partition(decoded, 3)
    assert decoded.documents[0] == {"value": 1, "next": {"value": 1, "next": {"value": 1, "next": None}}}
    assert decoded.fast == []
    assert reasons(decoded) == {
        1: "the Avro value is nested deeper than 64 levels",
        2: "the Avro value is nested deeper than 64 levels",
    }
    assert deserializer.document(messages([linked(serialization.MAX_AVRO_DEPTH)]), 0)["value"] == 1


def test_protobuf_deep_recursion_is_a_dead_letter(proto_pool: Any) -> None:
    registry = proto_registry()
    deserializer = build_deserializer(FormatConfig(type="protobuf"), registry, "events")  # type: ignore[arg-type]
    node_class = proto_class(proto_pool, "acme.events.Node")
    body = b""
    for _ in range(5_000):  # Node{value=1, next=<body>}
        body = b"\x08\x01" + (b"\x12" + _varint(len(body)) + body if body else b"")
    decoded = decode_all(deserializer, [confluent(21, body, b"\x02\x04")])
    assert reasons(decoded)[0].startswith("not a valid protobuf message acme.events.Node")
    assert node_class  # the class the producer would use


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def test_protobuf_schemas_registered_as_base64_descriptors(proto_pool: Any) -> None:
    # Confluent's Python serializer registers a base64 FileDescriptorProto, not .proto text, and
    # Apicurio answers what was registered: both forms (and a mix) must compile.
    def serialized(name: str) -> str:
        file_proto = descriptor_pb2.FileDescriptorProto()
        proto_pool.FindFileByName(name).CopyToProto(file_proto)
        return base64.b64encode(file_proto.SerializeToString()).decode()

    for main, common in (
        (serialized("event.proto"), serialized("acme/common.proto")),
        (serialized("event.proto"), COMMON_PROTO),
        (EVENT_PROTO, serialized("acme/common.proto")),
    ):
        registry = MemoryRegistry()
        registry.subjects[("acme/common.proto", 1)] = RegisteredSchema(30, "PROTOBUF", common)
        registry.add(31, main, "PROTOBUF", [SchemaReference("acme/common.proto", "acme/common.proto", 1)])
        deserializer = build_deserializer(FormatConfig(type="protobuf"), registry, "events")  # type: ignore[arg-type]
        decoded = decode_all(deserializer, [confluent(31, full_event(proto_pool).SerializeToString(), b"\x00")])
        check_partition(decoded, 1)
        assert decoded.fast == [0]
        assert decoded.documents[0]["price"] == {"currency": "EUR", "units": 0}


def test_protobuf_confluent_builtin_imports() -> None:
    schema = """syntax = "proto3";
import "confluent/meta.proto";
message Tagged { string name = 1 [(confluent.field_meta).doc = "the name"]; }
"""
    registry = MemoryRegistry()
    registry.add(40, schema, "PROTOBUF")
    deserializer = build_deserializer(FormatConfig(type="protobuf"), registry, "events")  # type: ignore[arg-type]
    decoded = decode_all(deserializer, [confluent(40, b"\x0a\x03abc", b"\x00")])
    assert rows(decoded) == {0: {"name": "abc"}}


@pytest.mark.parametrize("parallel", [False, True])
def test_json_deep_nesting_never_reaches_arrow(monkeypatch: pytest.MonkeyPatch, parallel: bool) -> None:
    # Arrow's JSON parser recurses on the C stack: ~20,000 levels crash the process (fewer on a thread).
    # The parts of a parallel read are parsed on reader threads, whose stacks may be smaller.
    monkeypatch.setattr(json_format, "PARALLEL_READ_MIN_BYTES", 0 if parallel else 1 << 40)
    monkeypatch.setattr(json_format, "PARALLEL_READ_MIN_AVERAGE_BYTES", 0)
    deep = b'{"x":' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    unclosed = b'{"x":' + b"[" * 50_000
    medium = b'{"x":' + b"[" * 1_010 + b"]" * 1_010 + b"}"  # deeper than Arrow gets, within orjson's 1024
    at_limit = b'{"x":' + b"[" * 999 + b"]" * 999 + b"}"  # as deep as Arrow is given: its depth check refuses it
    objects = b'{"a":' * 1_001 + b"1" + b"}" * 1_001  # 1,001 object levels: 5 KB, screened too
    in_string = b'{"x":"' + b"[" * 5_000 + b'"}'  # brackets in a string do not nest
    shallow = b'{"y":' + b"[" * 62 + b"1" + b"]" * 62 + b"}"  # 63 levels: the limit is 64
    too_deep = b'{"y":' + b"[" * 64 + b"1" + b"]" * 64 + b"}"  # Arrow reads it, the later stages would not cope
    given: list[bytes] = []  # every payload handed to Arrow's reader
    parse = json_format.JsonDeserializer._parse

    def recorded(self: json_format.JsonDeserializer, chunk: list[bytes]) -> pa.Table:
        given.extend(chunk)
        return parse(self, chunk)

    monkeypatch.setattr(json_format.JsonDeserializer, "_parse", recorded)
    payloads = [GOOD[0], deep, unclosed, medium, in_string, shallow, too_deep, at_limit, objects]
    decoded = decode_all(json_deserializer(), payloads)
    check_partition(decoded, 9)
    assert decoded.fast == [0, 4, 5]
    assert reasons(decoded)[1].startswith("invalid JSON: depth limit exceeded")
    assert reasons(decoded)[2].startswith("invalid JSON")
    too_deep_reason = "the JSON value is nested deeper than 64 levels"
    assert reasons(decoded)[3] == reasons(decoded)[6] == reasons(decoded)[7] == reasons(decoded)[8] == too_deep_reason
    assert decoded.documents == {}
    assert at_limit in given and not set(given) & {deep, unclosed, medium, objects}


@pytest.mark.parametrize(
    ("payload", "deeper"),
    [
        (b"[" * 1_001, True),
        (b"[" * 1_000, False),
        (b"[]" * 2_000, False),
        (b'"' + b"[" * 2_000 + b'"', False),
        (b'["\\\\"' + b"[" * 2_000, True),  # an escaped backslash ends the string
        (b'["\\"' + b"[" * 2_000 + b'"', False),  # an escaped quote does not
        (b'{"a":' * 1_500 + b"1" + b"}" * 1_500, True),
        (b'"\\"' * 200_000 + b"[" * 1_001, True),  # too long to scan: on the safe side
        (b'{"":' * 900 + b"1" + b"}" * 900, False),  # 900 object levels in 4.5 KB: settled by one count
        (b"[" * 900 + b'{"":' * 101 + b"1" + b"}" * 101 + b"]" * 900, True),  # 1,001 levels, mixed
        (b"[" * 900 + b'{"":' * 100 + b"1" + b"}" * 100 + b"]" * 900, False),
    ],
)
def test_nesting_bound(payload: bytes, deeper: bool) -> None:
    assert _nests_deeper(payload, 1_000) is deeper


@pytest.mark.parametrize("schema", ['{"type": "array"}', '{"type": "fixed", "name": "f"}', "null", '{"type": 7}'])
def test_a_malformed_avro_schema_in_the_registry_is_a_dead_letter(schema: str) -> None:
    registry = MemoryRegistry()
    registry.add(9, schema)
    decoded = decode_all(avro_deserializer(registry), [b"\x00\x00\x00\x00\x09\x02"])
    assert reasons(decoded)[0].startswith("schema id 9 is not a valid Avro schema")


def test_gzip_batches_are_read_in_rounds_of_bounded_inflated_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json_format, "GZIP_ROUND_BYTES", 100)
    docs = [{"id": f"g{i}", "pad": "x" * 60} for i in range(6)] + [{"id": "z", "pad": 7}]  # pad: string, then a number
    payloads = [gzip.compress(json.dumps(doc).encode()) for doc in docs] + [b"not gzip"]
    deserializer = json_deserializer(gzip=True)
    decoded = decode_all(deserializer, payloads)
    check_partition(decoded, 8)
    assert deserializer.reads >= 6  # one round per payload or two, never all inflated together
    assert decoded.table.column("id").to_pylist() == [f"g{i}" for i in range(6)]
    assert decoded.documents == {6: {"id": "z", "pad": 7}}  # its inferred type does not join: the slow lane
    assert reasons(decoded)[7].startswith("payload is not gzip")
