"""Real Debezium events (captured from PostgreSQL through Kafka Connect, ``tests/fixtures/debezium``) into upsert
tables: every type lands as its Delta type, deletes and tombstones remove keys, an unchanged TOASTed value keeps
the row's value, the column added mid-stream appears, and a value Delta cannot hold is a dead letter naming it."""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from kafka2delta.config import load_config
from kafka2delta.records import TopicPartition
from tests.support.debezium import change_batch
from tests.support.registry import FakeRegistry
from tests.support.runner import TopicsSource, ingest_until_caught_up
from tests.support.serialization import framed_avro

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "debezium"
KEYS = {"big_keys": "id", "composite": "tenant,code", "toasty": "id", "types": "id"}


def events(name: str) -> dict[str, list[dict[str, Any]]]:
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for line in (FIXTURES / name).read_text().splitlines():
        message = json.loads(line)
        by_topic.setdefault(message["topic"].rsplit(".", 1)[-1], []).append(message)
    return by_topic


def replicate(tmp_path: Path, fixture: str, table: str, **env: str) -> Iterator[dict[str, Any]]:
    messages = events(fixture)[table]
    topic = messages[0]["topic"]
    config = load_config(
        None,
        environ={
            "K2D_KAFKA__BOOTSTRAP_SERVERS": "unused:1",
            "K2D_KAFKA__TOPIC": topic,
            "K2D_TABLE__URI": str(tmp_path / table),
            "K2D_TABLE__MODE": "upsert",
            "K2D_TABLE__KEY": KEYS[table],
            "K2D_FORMAT__KEY": "json",
            "K2D_FORMAT__ENVELOPE": "debezium",
            "K2D_DEAD_LETTERS__TABLE_URI": str(tmp_path / "dlq"),
            **env,
        },
    )
    tp = TopicPartition(topic, 0)
    pairs = [(raw(m["key"], fixture), raw(m["value"], fixture)) for m in messages]
    # Two batches, so changes to one key land in two merges as well as within one.
    half = len(pairs) // 2
    batches = [change_batch(tp, 0, pairs[:half]), change_batch(tp, half, pairs[half:])]
    ingest_until_caught_up(config, TopicsSource(batches, {tp: len(pairs)}))
    yield from DeltaTable(str(tmp_path / table)).to_pyarrow_table().to_pylist()


def raw(text: str | None, fixture: str) -> bytes | None:
    """A message's key or value bytes as the fixture holds them (base64 for the binary Avro ones)."""
    if text is None:
        return None
    return base64.b64decode(text) if fixture.startswith("avro") else text.encode()


def by_key(rows: Iterator[dict[str, Any]], *key: str) -> dict[Any, dict[str, Any]]:
    return {tuple(row[k] for k in key) if len(key) > 1 else row[key[0]]: row for row in rows}


def test_keys_beyond_double_precision_and_composite_keys(tmp_path: Path) -> None:
    env = {"K2D_TABLE__SCHEMA_EVOLUTION": "merge"}
    assert list(replicate(tmp_path, "json_schema.jsonl", "big_keys", **env)) == [
        {"id": 9007199254740993, "name": "renamed"}
    ]
    composite = by_key(replicate(tmp_path, "json_schema.jsonl", "composite", **env), "tenant", "code")
    assert {k: row["qty"] for k, row in composite.items()} == {(1, "a"): 11, (1, "c"): 20}


def test_an_unchanged_toasted_value_keeps_the_value_of_an_earlier_change(tmp_path: Path) -> None:
    (row,) = replicate(tmp_path, "json_schema.jsonl", "toasty", K2D_TABLE__SCHEMA_EVOLUTION="merge")
    source = events("json_schema.jsonl")["toasty"]
    snapshot = json.loads(source[0]["value"])["payload"]["after"]["payload"]
    assert row["note"] == "second" and row["payload"] == snapshot


def test_every_type_lands_as_its_delta_type_from_the_connect_schema(tmp_path: Path) -> None:
    rows = by_key(replicate(tmp_path, "json_schema.jsonl", "types", K2D_TABLE__SCHEMA_EVOLUTION="merge"), "id")
    schema = pa.schema(DeltaTable(str(tmp_path / "types")).schema().to_arrow())
    assert schema.names[0] == "id" and not schema.field("id").nullable
    assert schema.field("num").type == pa.decimal128(38, 10)
    assert schema.field("ts").type == pa.timestamp("us") and schema.field("tstz").type == pa.timestamp("us", "UTC")
    assert schema.field("d").type == pa.date32() and schema.field("raw").type == pa.binary()
    assert schema.field("ints").type == pa.list_(pa.field("element", pa.int32()))
    # Deleted (2, 3), created (4, 20, 5 after the ADD COLUMN), updated (1, 4); 6 holds dates Delta cannot hold.
    assert sorted(rows) == [1, 4, 5, 20]
    one = rows[1]
    assert one["txt"] == "updated ✓" and one["flag"] is None and one["small"] == -32768
    assert one["d"] == dt.date(2024, 2, 29) and one["t"] == "23:59:59.999999"
    assert one["ts"] == dt.datetime(2024, 2, 29, 12, 34, 56, 789012)
    assert one["tstz"] == dt.datetime(2024, 2, 29, 10, 34, 56, 789012, tzinfo=dt.UTC)
    assert one["num"] == Decimal("1.5") and one["num_var"] == "3.14159265358979323846264338327950288"
    assert one["tags"] == ["a", "b c", "ü", None] and one["raw"] == b"\x00\xff\x10"
    assert json.loads(one["doc"]) == {"a": [1, 2.5, None], "n": {"b": True}, "é": "x"}
    assert rows[4]["num"] == Decimal("99999999999999999999999999.9999999999")  # 36 digits: exact
    assert rows[5]["extra"] == "extra ✓" and rows[5]["score"] == Decimal("12.34")  # the column added mid-stream
    assert rows[1]["extra"] is None  # a row written before it
    (letter,) = DeltaTable(str(tmp_path / "dlq")).to_pyarrow_table().to_pylist()
    assert letter["offset"] == 3 and "out of range" in letter["error"]


@pytest.mark.parametrize("table", ["big_keys", "composite"])
def test_json_without_the_schema_needs_the_table_schema(tmp_path: Path, table: str) -> None:
    schemas = {
        "big_keys": {"id": "long", "name": "string"},
        "composite": {"tenant": "int", "code": "string", "qty": "int"},
    }
    with_schema = sorted(
        map(str, replicate(tmp_path / "a", "json_schema.jsonl", table, K2D_TABLE__SCHEMA_EVOLUTION="merge"))
    )
    plain = replicate(tmp_path / "b", "json_plain.jsonl", table, K2D_TABLE__SCHEMA=json.dumps(schemas[table]))
    assert sorted(map(str, plain)) == with_schema


def test_avro_events_land_as_the_json_converters_do(tmp_path: Path, fake_registry: FakeRegistry) -> None:
    for schema_id, schema in json.loads((FIXTURES / "avro_schemas.json").read_text()).items():
        fake_registry.state.register(int(schema_id), json.dumps(schema))
    avro = {
        "K2D_FORMAT__TYPE": "avro",
        "K2D_FORMAT__KEY": "avro",
        "K2D_SCHEMA_REGISTRY__URL": fake_registry.url,
        "K2D_TABLE__SCHEMA_EVOLUTION": "merge",
    }
    for table in ("types", "composite", "toasty", "big_keys"):
        from_json = by_key(
            replicate(tmp_path / "json", "json_schema.jsonl", table, K2D_TABLE__SCHEMA_EVOLUTION="merge"),
            *KEYS[table].split(","),
        )
        from_avro = by_key(replicate(tmp_path / "avro", "avro.jsonl", table, **avro), *KEYS[table].split(","))
        assert from_avro == from_json, table
        json_schema = pa.schema(DeltaTable(str(tmp_path / "json" / table)).schema().to_arrow())
        avro_schema = pa.schema(DeltaTable(str(tmp_path / "avro" / table)).schema().to_arrow())
        assert avro_schema == json_schema, table


def test_an_avro_keys_connect_types_are_read_as_a_values_are(tmp_path: Path, fake_registry: FakeRegistry) -> None:
    """Found by review: an Avro key was not converted by its Connect types, so the tombstone of a key holding an
    io.debezium.time.Timestamp (milliseconds) named a 1970 timestamp and deleted nothing."""
    timestamp = {"type": "long", "connect.version": 1, "connect.name": "io.debezium.time.Timestamp"}
    key_schema = {"type": "record", "name": "Key", "fields": [{"name": "at", "type": timestamp}]}
    value_schema = {
        "type": "record",
        "name": "Value",
        "fields": [{"name": "at", "type": timestamp}, {"name": "v", "type": ["null", "string"]}],
    }
    fake_registry.state.register(1, json.dumps(key_schema))
    fake_registry.state.register(2, json.dumps(value_schema))
    config = load_config(
        None,
        environ={
            "K2D_KAFKA__BOOTSTRAP_SERVERS": "unused:1",
            "K2D_KAFKA__TOPIC": "cdc",
            "K2D_TABLE__URI": str(tmp_path / "table"),
            "K2D_TABLE__MODE": "upsert",
            "K2D_TABLE__KEY": "at",
            "K2D_TABLE__SCHEMA_EVOLUTION": "merge",
            "K2D_FORMAT__TYPE": "avro",
            "K2D_FORMAT__KEY": "avro",
            "K2D_SCHEMA_REGISTRY__URL": fake_registry.url,
            "K2D_DEAD_LETTERS__TABLE_URI": str(tmp_path / "dlq"),
        },
    )
    kept, deleted = 1_700_000_000_000, 1_700_000_000_123
    upserts = [
        (framed_avro(1, key_schema, {"at": at}), framed_avro(2, value_schema, {"at": at, "v": "x"}))
        for at in (kept, deleted)
    ]
    tp = TopicPartition("cdc", 0)
    ingest_until_caught_up(config, TopicsSource([change_batch(tp, 0, upserts)], {tp: 2}))
    # Once the table has the column, a key without its Connect types is read by the column's (microseconds).
    tombstone = change_batch(tp, 2, [(framed_avro(1, key_schema, {"at": deleted}), None)])
    ingest_until_caught_up(config, TopicsSource([tombstone], {tp: 3}))
    rows = DeltaTable(str(tmp_path / "table")).to_pyarrow_table().to_pylist()
    assert rows == [{"at": dt.datetime(2023, 11, 14, 22, 13, 20), "v": "x"}]
