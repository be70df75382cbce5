"""The pure core: deserialize + coerce, driven with in-memory messages."""

import datetime as dt
from decimal import Decimal

import pyarrow as pa

from kafka2delta.batches import PartitionMessages
from kafka2delta.coercions import coerce
from kafka2delta.pipeline import Pipeline
from kafka2delta.schema import parse_schema
from kafka2delta.serialization import JsonDeserializer

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


def messages(payloads: list[bytes | None], first_offset: int = 100) -> PartitionMessages:
    offsets = list(range(first_offset, first_offset + len(payloads)))
    return PartitionMessages("events", 3, offsets, payloads, [1_700_000_000_000 + i for i in range(len(payloads))])


def test_good_messages_become_rows_in_the_table_schema() -> None:
    pipeline = Pipeline(JsonDeserializer(SCHEMA), SCHEMA)
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
    pipeline = Pipeline(JsonDeserializer(SCHEMA), SCHEMA)
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


def test_coerce_reports_the_column_and_keeps_good_rows() -> None:
    schema = pa.schema([pa.field("price", pa.decimal128(5, 2)), pa.field("n", pa.int8())])
    rows = pa.table({"price": ["1.10", "12345678.1", "2"], "n": [1, 2, 300]})
    result = coerce(rows, schema)
    assert result.rows.column("price").to_pylist() == [Decimal("1.10")]
    assert [i for i, _ in result.failures] == [1, 2]
    assert "'price'" in result.failures[0][1].reason
    assert "'n'" in result.failures[1][1].reason
