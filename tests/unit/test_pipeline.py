"""The pure core: deserialize + coerce, driven with in-memory messages."""

import datetime as dt
import json
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from kafka2delta.coercions import CoercionOptions
from kafka2delta.config import FormatConfig
from kafka2delta.pipeline import Pipeline, read_schema
from kafka2delta.records import PartitionMessages
from kafka2delta.schema import parse_schema
from kafka2delta.serialization import build_deserializer
from kafka2delta.transforms import Transformer
from tests.support.serialization import V1, V2, MemoryRegistry, event, framed_avro

SCHEMA = parse_schema(
    {
        "id": "string not null",
        "n": "long",
        "ts": "timestamp",
        "day": "date",
        "price": "decimal(10,2)",
        "user": "struct<id:long,country:string>",
    }
)


def json_pipeline(schema: pa.Schema, **kwargs: Any) -> Pipeline:
    return Pipeline(build_deserializer(FormatConfig(), None, "events"), schema, **kwargs)


def messages(payloads: list[bytes | None], first_offset: int = 100) -> PartitionMessages:
    offsets = list(range(first_offset, first_offset + len(payloads)))
    return PartitionMessages(
        topic="events",
        partition=3,
        offsets=offsets,
        payloads=payloads,
        timestamps_ms=[1_700_000_000_000 + i for i in range(len(payloads))],
    )


def test_good_messages_become_rows_in_the_table_schema() -> None:
    pipeline = json_pipeline(SCHEMA)
    result = pipeline.process(
        messages(
            [
                b'{"id":"a","n":1,"ts":"2026-11-22T10:00:00Z","day":"2026-11-22","price":"1.25","user":{"id":7,"country":"FR"},"extra":1}',
                b'{"id":"b","ts":"2026-11-22T11:00:00.5+01:00"}',
                b'{\n  "id": "c",\n  "ts": "2026-11-22 10:00:00"\n}',
            ]
        )
    )
    assert result.dead_letters == []
    assert result.rows.schema == SCHEMA
    rows = result.rows.to_pylist()
    assert [r["id"] for r in rows] == ["a", "b", "c"]
    assert rows[0]["user"] == {"id": 7, "country": "FR"}
    assert rows[0]["price"] == Decimal("1.25")
    assert rows[0]["day"] == dt.date(2026, 11, 22)
    assert rows[1]["ts"] == dt.datetime(2026, 11, 22, 10, 0, 0, 500000, tzinfo=dt.UTC)
    assert rows[2]["ts"] == dt.datetime(2026, 11, 22, 10, 0, tzinfo=dt.UTC)
    assert rows[1]["n"] is None
    assert (result.first_offset, result.last_offset) == (100, 102)


def test_every_message_is_a_row_a_dead_letter_or_a_skip() -> None:
    pipeline = json_pipeline(SCHEMA)
    payloads: list[bytes | None] = [
        b'{"id":"ok1"}',
        b"not json",
        None,
        b"",
        b'{"id":"ok2","n":"seven"}',  # wrong type
        b'{"n":1}',  # required id missing
        b"[1,2]",
        b'{"id":"x"}{"id":"y"}',  # two objects in one payload
        b'{"id":"bad-ts","ts":"yesterday"}',
        b'{"id":"ok3","n":3}',
        b'{"id":"unterminated',
    ]
    result = pipeline.process(messages(payloads, first_offset=0))
    assert [r["id"] for r in result.rows.to_pylist()] == ["ok1", "ok3"]
    assert result.skipped_empty == 2
    by_offset = {letter.offset: letter for letter in result.dead_letters}
    assert sorted(by_offset) == [1, 4, 5, 6, 7, 8, 10]
    assert result.rows.num_rows + len(result.dead_letters) + result.skipped_empty == len(payloads)
    assert by_offset[1].stage == "deserialize"
    assert by_offset[5].stage == "coerce" and "'id'" in by_offset[5].reason
    assert by_offset[8].stage == "coerce" and "'ts'" in by_offset[8].reason
    assert by_offset[1].payload == b"not json"
    assert by_offset[1].where == "events[3]@1"


def test_transforms_and_filter_run_in_both_lanes() -> None:
    schema = parse_schema({"id": "string not null", "day": "date", "offset": "long", "n": "long"})
    transformer = Transformer([("day", "substr(ts, `0`, `10`)"), ("offset", "kafka.offset")], "type != 'skip'")
    pipeline = json_pipeline(schema, transformer=transformer)
    result = pipeline.process(
        messages(
            [
                b'{"id":"fast","ts":"2026-11-22T10:00:00Z","type":"a","n":1}',
                b'{"id":"slow","ts":"2026-11-23T10:00:00Z","type":"a","n":"2"}',  # Arrow refuses "2" for long
                b'{"id":"skipped","ts":"2026-11-24T10:00:00Z","type":"skip"}',
                b'{"id":"no-ts","type":"a"}',  # substr(null) raises: a transform dead letter
            ]
        )
    )
    assert result.rows.to_pylist() == [
        {"id": "fast", "day": dt.date(2026, 11, 22), "offset": 100, "n": 1},
        {"id": "slow", "day": dt.date(2026, 11, 23), "offset": 101, "n": 2},
    ]
    assert result.row_offsets == [100, 101]
    assert result.skipped_filtered == 1
    [letter] = result.dead_letters
    assert (letter.offset, letter.stage) == (103, "transform") and "day" in letter.reason
    assert json.loads(letter.payload_json or "") == {"id": "no-ts", "type": "a"}


def test_merge_adds_fields_from_both_lanes_and_reads_guessed_types_again() -> None:
    schema = parse_schema({"id": "string not null"})
    pipeline = json_pipeline(schema, schema_evolution="merge")
    result = pipeline.process(
        messages(
            [
                b'{"id":"a","seen":"2026-11-22T10:00:00Z","n":1,"user":{"id":7}}',
                b'{"id":"b","n":"not a number"}',  # slow lane: a dead letter
                b'{"id":"c","tags":[1,"a"]}',  # slow lane: Arrow has no type for a mixed list
            ]
        )
    )
    assert pipeline.schema.names == ["id", "seen", "n", "user", "tags"]
    assert pipeline.schema.field("seen").type == pa.string()  # not Arrow's guess (a timestamp)
    assert pipeline.schema.field("tags").type == pa.list_(pa.string())
    assert result.added_columns == ["seen", "n", "user", "tags"]
    rows = {r["id"]: r for r in result.rows.to_pylist()}
    assert rows["a"]["seen"] == "2026-11-22T10:00:00Z" and rows["a"]["user"] == {"id": 7}
    assert rows["c"]["tags"] == ["1", "a"]
    [letter] = result.dead_letters  # "not a number" cannot fit the long column the batch created
    assert letter.stage == "coerce" and "'n'" in letter.reason


def test_none_drops_and_counts_unknown_fields() -> None:
    pipeline = json_pipeline(parse_schema({"id": "string", "user": "struct<id:long>"}))
    result = pipeline.process(
        messages([b'{"id":"a","x":1,"user":{"id":1,"y":2}}', b'{"id":"b","x":null}', b'{"id":"c","n":"s"}'])
    )
    assert [r["id"] for r in result.rows.to_pylist()] == ["a", "b", "c"]
    assert result.unknown_fields == 3
    assert pipeline.schema.names == ["id", "user"]


def test_epoch_columns_are_read_as_numbers() -> None:
    schema = parse_schema({"id": "string", "ts": "timestamp", "user": "struct<seen:timestamp>"})
    epoch = frozenset({"ts"})
    read = read_schema(schema, [("meta.day", pa.string())], epoch)
    assert read.field("ts").type == pa.float64()
    assert read.field("user").type == pa.struct([("seen", pa.string())])
    assert read.field("meta").type == pa.struct([("day", pa.string())])
    pipeline = json_pipeline(schema, options=CoercionOptions("ms", {"ts": "s"}))
    result = pipeline.process(messages([b'{"id":"a","ts":1700000000}', b'{"id":"b","ts":"2026-11-22T10:00:00Z"}']))
    assert [r["ts"] for r in result.rows.to_pylist()] == [
        dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=dt.UTC),
        dt.datetime(2026, 11, 22, 10, tzinfo=dt.UTC),
    ]


@pytest.mark.parametrize("transforms", [[], [("tag", "join('-', [kafka.topic, to_string(kafka.partition)])")]])
def test_a_field_a_writer_schema_declares_becomes_a_column_though_every_value_is_null(
    transforms: list[tuple[str, str]],
) -> None:
    """The table gets what the source declares: Avro's v2 adds ``note``, null in every message so far; so in the
    interpreter lane of transforms (the second case), whose documents alone would not say what ``note`` is."""
    registry = MemoryRegistry()
    registry.add(1, V1)
    registry.add(2, V2)
    v1_columns = parse_schema({"id": "string", "amount": "double", "kind": "string", "user": "struct<id:long>"})
    avro = build_deserializer(FormatConfig(type="avro"), registry, "events")  # type: ignore[arg-type]
    transformer = Transformer(transforms)
    pipeline = Pipeline(avro, v1_columns, transformer, schema_evolution="merge")
    result = pipeline.process(messages([framed_avro(1, V1, event(0)), framed_avro(2, V2, event(1, note=None))]))
    assert transformer.uses_interpreter is bool(transforms)
    assert pipeline.schema.names == ["id", "amount", "kind", "user", "note", *(["tag"] if transforms else [])]
    assert pipeline.schema.field("note").type == pa.string()
    assert result.rows.column("note").to_pylist() == [None, None]
    # JSON names no type: a field null in every message waits for a value.
    untyped = json_pipeline(parse_schema({"id": "string"}), schema_evolution="merge")
    untyped.process(messages([b'{"id": "a", "note": null}']))
    assert untyped.schema.names == ["id"]


def avro_pipeline(*schemas: Any, transformer: Transformer | None = None) -> Pipeline:
    """An Avro pipeline on a table of V1's columns, ``schemas`` registered as ids 1, 2 …"""
    registry = MemoryRegistry()
    for schema_id, schema in enumerate(schemas, start=1):
        registry.add(schema_id, schema)
    avro = build_deserializer(FormatConfig(type="avro"), registry, "events")  # type: ignore[arg-type]
    v1_columns = parse_schema({"id": "string", "amount": "double", "kind": "string", "user": "struct<id:long>"})
    return Pipeline(avro, v1_columns, transformer, schema_evolution="merge")


def test_only_the_schemas_of_messages_that_are_rows_declare_columns() -> None:
    """A writer schema whose messages were all filtered out declares nothing (its null ``note`` waits, as a
    value-typed field would); one whose message is a row declares a new member of a struct even while a transform
    writes another member into that struct."""
    filtered = avro_pipeline(V1, V2, transformer=Transformer([], "id != 'e1'"))
    result = filtered.process(messages([framed_avro(1, V1, event(0)), framed_avro(2, V2, event(1, note=None))]))
    assert filtered.schema.names == ["id", "amount", "kind", "user"] and result.skipped_filtered == 1
    user_fields = [{"name": "id", "type": "long"}, {"name": "email", "type": ["null", "string"], "default": None}]
    user = {"type": "record", "name": "User", "fields": user_fields}
    with_email = {**V1, "fields": [*V1["fields"][:3], {"name": "user", "type": user}]}
    nested = avro_pipeline(with_email, transformer=Transformer([("user.region", "kafka.topic")]))
    result = nested.process(messages([framed_avro(1, with_email, {**event(0), "user": {"id": 0, "email": None}})]))
    assert nested.schema.field("user").type == pa.struct(
        [("id", pa.int64()), ("email", pa.string()), ("region", pa.string())]
    )
    assert result.rows.column("user").to_pylist() == [{"id": 0, "email": None, "region": "events"}]


def test_fields_of_dead_letters_and_filtered_messages_do_not_become_columns() -> None:
    schema = parse_schema({"id": "string not null", "type": "string", "user": "struct<id:long>"})
    pipeline = json_pipeline(schema, schema_evolution="merge", transformer=Transformer([], "type != 'skip'"))
    result = pipeline.process(
        messages(
            [
                b'{"id":"a","type":"x","color":"red","user":{"id":1,"country":"FR"}}',
                b'{"type":"x","junk":1,"user":{"id":2,"junk":3}}',  # no id: a dead letter
                b'{"id":"c","type":"skip","filtered_only":true}',
            ]
        )
    )
    assert pipeline.schema.names == ["id", "type", "user", "color"]
    assert pipeline.schema.field("user").type == pa.struct([("id", pa.int64()), ("country", pa.string())])
    assert result.rows.schema == pipeline.schema
    assert result.added_columns == ["user.country", "color"]
    assert [letter.offset for letter in result.dead_letters] == [101] and result.skipped_filtered == 1


@pytest.mark.parametrize(
    ("documents", "filter_expression"),
    [
        ([{}], ""),
        ([{"a": None}], ""),  # JSON fields without a schema wait for a value
        ([{"bad name": 1}], ""),  # a name Delta refuses
        ([{}, {"a": 1, "t": "x"}], "t != 'x'"),  # the column only a filtered message had is dropped again
    ],
)
def test_a_value_no_column_can_hold_is_a_dead_letter(documents: list[dict[str, Any]], filter_expression: str) -> None:
    """Found by review: while a new table has no column, a value that adds none was no row (Arrow has no rows
    without columns), no dead letter and no skip."""
    transformer = Transformer([], filter_expression) if filter_expression else None
    pipeline = json_pipeline(pa.schema([]), transformer=transformer, schema_evolution="merge")
    result = pipeline.process(messages([json.dumps(d).encode() for d in documents]))
    assert result.rows.num_rows == 0 and result.row_offsets == [] and pipeline.schema.names == []
    assert [(letter.offset, letter.stage, letter.reason) for letter in result.dead_letters] == [
        (100, "coerce", "no column yet: the table has none and the value no field with a value to add one")
    ]
    assert result.skipped_filtered == len(documents) - 1
