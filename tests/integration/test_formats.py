"""Every format end to end: a real broker, a real schema registry (Apicurio, Confluent API), the daemon.

Avro and Protobuf payloads are made by confluent-kafka's own serializers, as a producer would."""

from __future__ import annotations

import datetime as dt
import gzip
import io
import json
import uuid
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from dev.registry.registry import LocalRegistry
from tests.support.harness import Message, wait_for
from tests.support.protobuf import compile_with_protoc, message_class


def avro_schema(version: int) -> dict[str, Any]:
    fields: list[dict[str, Any]] = [
        {"name": "id", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "user", "type": {"type": "record", "name": "User", "fields": [{"name": "id", "type": "long"}]}},
    ]
    if version >= 2:
        fields.append({"name": "color", "type": ["null", "string"], "default": None})
    if version == 3:  # incompatible: amount becomes a string
        fields[1] = {"name": "amount", "type": "string"}
    return {"type": "record", "name": "Event", "namespace": "k2d.test", "fields": fields}


def avro_serializer(client: SchemaRegistryClient, version: int) -> AvroSerializer:
    return AvroSerializer(client, json.dumps(avro_schema(version)), conf={"auto.register.schemas": True})


def test_avro_through_the_registry_with_evolution(setup_factory, daemon_factory, schema_registry_url) -> None:
    setup = setup_factory(
        1,
        metadata_columns=None,  # the table's columns are compared exactly
        schema={"id": "string not null", "amount": "double", "ts": "timestamp", "user": "struct<id:long>"},
        sections={"format": {"type": "avro"}, "schema_registry": {"url": schema_registry_url}},
        table={"schema_evolution": "merge"},
    )
    client = SchemaRegistryClient({"url": schema_registry_url})
    context = SerializationContext(setup.topic.name, MessageField.VALUE)
    ts = dt.datetime(2026, 11, 22, 10, 0, 0, 123000, tzinfo=dt.UTC)

    v1 = avro_serializer(client, 1)
    setup.topic.produce_messages(
        [Message(0, v1({"id": f"a{i}", "amount": i / 2, "ts": ts, "user": {"id": i}}, context)) for i in range(20)]
    )
    first = daemon_factory(setup, "--until-caught-up")
    assert first.wait(120) == 0, first.log()[-3000:]
    assert setup.table().schema().to_arrow().names == ["id", "amount", "ts", "user"]

    v2 = avro_serializer(client, 2)
    records = [
        {"id": f"b{i}", "amount": 1.5, "ts": ts, "user": {"id": i}, "color": "red" if i % 2 else None}
        for i in range(20)
    ]
    setup.topic.produce_messages([Message(0, v2(r, context)) for r in records])
    client.set_compatibility(subject_name=f"{setup.topic.name}-value", level="NONE")
    v3 = avro_serializer(client, 3)
    bad = [{"id": f"c{i}", "amount": "lots", "ts": ts, "user": {"id": i}, "color": None} for i in range(5)]
    setup.topic.produce_messages([Message(0, v3(r, context)) for r in bad])
    # A message naming a schema id the registry does not have.
    setup.topic.produce_messages([Message(0, b"\x00\x7f\xff\xff\xf0" + b"\x02a")])

    second = daemon_factory(setup, "--until-caught-up")
    assert second.wait(120) == 0, second.log()[-3000:]
    schema = pa.schema(setup.table().schema().to_arrow())
    assert schema.names == ["id", "amount", "ts", "user", "color"] and schema.field("color").nullable
    rows = {r["id"]: r for r in setup.rows()}
    assert len(rows) == 40
    assert rows["a3"]["color"] is None and rows["a3"]["ts"] == ts and rows["a3"]["user"] == {"id": 3}
    assert rows["b1"]["color"] == "red" and rows["b2"]["color"] is None
    letters = setup.dead_letters()
    assert [(r["offset"], r["stage"]) for r in letters] == [
        (o, s) for o, s in zip(range(40, 46), ["coerce"] * 5 + ["deserialize"], strict=True)
    ]
    assert "column 'amount'" in letters[0]["error"] and "lots" in letters[0]["error"]
    assert json.loads(letters[0]["payload_json"])["amount"] == "lots"  # the decoded record, for triage
    assert "not in the registry" in letters[-1]["error"]
    assert setup.txn_versions() == {0: 45}


@pytest.mark.parametrize("evolution", ["none", "merge"])
def test_avro_through_the_registry_makes_its_table_from_the_writer_schema(
    setup_factory, daemon_factory, schema_registry_url, evolution: str
) -> None:
    # No [table.schema]: the table is made from the first batch's writer schema; a later version's new field
    # becomes a nullable column with merge, and is dropped (counted) with none.
    setup = setup_factory(
        1,
        metadata_columns=None,
        schema={},
        sections={"format": {"type": "avro"}, "schema_registry": {"url": schema_registry_url}},
        table={"schema_evolution": evolution},
    )
    client = SchemaRegistryClient({"url": schema_registry_url})
    context = SerializationContext(setup.topic.name, MessageField.VALUE)
    ts = dt.datetime(2026, 11, 28, 10, 0, 0, 123000, tzinfo=dt.UTC)
    v1, v2 = avro_serializer(client, 1), avro_serializer(client, 2)
    setup.topic.produce_messages(
        [Message(0, v1({"id": f"a{i}", "amount": i / 2, "ts": ts, "user": {"id": i}}, context)) for i in range(10)]
    )
    first = daemon_factory(setup, "--until-caught-up")
    assert first.wait(120) == 0, first.log()[-3000:]
    schema = pa.schema(setup.table().schema().to_arrow())
    assert schema.names == ["id", "amount", "ts", "user"], schema
    assert pa.types.is_timestamp(schema.field("ts").type) and pa.types.is_struct(schema.field("user").type)
    setup.topic.produce_messages(
        [
            Message(0, v2({"id": f"b{i}", "amount": 1.0, "ts": ts, "user": {"id": i}, "color": "red"}, context))
            for i in range(10)
        ]
    )
    second = daemon_factory(setup, "--until-caught-up")
    assert second.wait(120) == 0, second.log()[-3000:]
    schema = pa.schema(setup.table().schema().to_arrow())
    rows = {r["id"]: r for r in setup.rows()}
    assert len(rows) == 20 and rows["a3"]["ts"] == ts and rows["a3"]["user"] == {"id": 3}
    if evolution == "merge":
        assert schema.names == ["id", "amount", "ts", "user", "color"] and schema.field("color").nullable
        assert rows["b1"]["color"] == "red" and rows["a1"]["color"] is None
    else:
        assert schema.names == ["id", "amount", "ts", "user"]
    assert setup.dead_letters() == [] and setup.txn_versions() == {0: 19}


def test_avro_bare_datums_with_a_schema_file(setup_factory, daemon_factory, tmp_path: Path) -> None:
    schema_file = tmp_path / "event.avsc"
    schema_file.write_text(json.dumps(avro_schema(2)))
    parsed = fastavro.parse_schema(avro_schema(2))
    setup = setup_factory(
        1,
        schema={"id": "string not null", "amount": "double", "color": "string"},
        sections={"format": {"type": "avro", "avro_schema_file": str(schema_file)}},
    )
    payloads = []
    for i in range(10):
        out = io.BytesIO()
        record = {"id": f"e{i}", "amount": float(i), "ts": 0, "user": {"id": i}, "color": "blue"}
        fastavro.schemaless_writer(out, parsed, record)
        payloads.append(out.getvalue())
    setup.topic.produce_messages([Message(0, p) for p in [*payloads, b"\x02"]])  # the last one is truncated
    daemon = daemon_factory(setup, "--until-caught-up")
    assert daemon.wait(120) == 0, daemon.log()[-3000:]
    rows = sorted(setup.rows(), key=lambda r: r["id"])
    assert [(r["id"], r["amount"], r["color"]) for r in rows] == [(f"e{i}", float(i), "blue") for i in range(10)]
    [letter] = setup.dead_letters()
    assert letter["offset"] == 10 and letter["stage"] == "deserialize"


EVENT_PROTO = """
syntax = "proto3";
package k2d.test;
import "google/protobuf/timestamp.proto";

message Event {
  string id = 1;
  int64 count = 2;
  google.protobuf.Timestamp ts = 3;
  repeated string tags = 4;
  map<string, int64> scores = 5;
  Kind kind = 6;
  Inner inner = 7;
  enum Kind { UNKNOWN = 0; CLICK = 1; VIEW = 2; }
  message Inner { double value = 1; }
}
"""


def test_protobuf_through_the_registry(setup_factory, daemon_factory, schema_registry_url) -> None:
    setup = setup_factory(
        1,
        schema={
            "id": "string not null",
            "count": "long",
            "ts": "timestamp",
            "tags": "array<string>",
            "scores": "map<string,long>",
            "kind": "string",
            "inner": "struct<value:double>",
        },
        sections={"format": {"type": "protobuf"}, "schema_registry": {"url": schema_registry_url}},
    )
    Event = message_class(compile_with_protoc({"event.proto": EVENT_PROTO}, "event.proto"), "k2d.test.Event")
    client = SchemaRegistryClient({"url": schema_registry_url})
    serializer = ProtobufSerializer(Event, client, {"use.deprecated.format": False})
    context = SerializationContext(setup.topic.name, MessageField.VALUE)
    messages = []
    for i in range(10):
        event = Event(id=f"p{i}", count=i * 1_000_000_000_000, tags=["a", str(i)], kind=Event.CLICK)
        event.ts.FromDatetime(dt.datetime(2026, 11, 22, 10, i))
        event.scores["x"] = i
        event.inner.value = i / 4
        messages.append(Message(0, serializer(event, context)))
    messages.append(Message(0, b"\x00\x00\x00\x00\x01\x00\xff\xff"))  # garbage after a header
    setup.topic.produce_messages(messages)
    daemon = daemon_factory(setup, "--until-caught-up")
    assert daemon.wait(120) == 0, daemon.log()[-3000:]
    rows = {r["id"]: r for r in setup.rows()}
    assert len(rows) == 10
    assert rows["p3"]["count"] == 3_000_000_000_000 and rows["p3"]["tags"] == ["a", "3"]
    assert rows["p3"]["ts"] == dt.datetime(2026, 11, 22, 10, 3, tzinfo=dt.UTC)
    assert (
        rows["p3"]["scores"] == [("x", 3)] and rows["p3"]["kind"] == "CLICK" and rows["p3"]["inner"] == {"value": 0.75}
    )
    [letter] = setup.dead_letters()
    assert letter["offset"] == 10 and letter["stage"] == "deserialize"


def test_protobuf_through_the_registry_makes_its_table_from_the_message_type(
    setup_factory, daemon_factory, schema_registry_url
) -> None:
    setup = setup_factory(
        1,
        metadata_columns=None,
        schema={},
        sections={"format": {"type": "protobuf"}, "schema_registry": {"url": schema_registry_url}},
    )
    Event = message_class(compile_with_protoc({"event.proto": EVENT_PROTO}, "event.proto"), "k2d.test.Event")
    client = SchemaRegistryClient({"url": schema_registry_url})
    serializer = ProtobufSerializer(Event, client, {"use.deprecated.format": False})
    context = SerializationContext(setup.topic.name, MessageField.VALUE)
    events = [Event(id=f"p{i}", count=i, tags=["a"], kind=Event.VIEW) for i in range(5)]
    setup.topic.produce_messages([Message(0, serializer(event, context)) for event in events])
    daemon = daemon_factory(setup, "--until-caught-up")
    assert daemon.wait(120) == 0, daemon.log()[-3000:]
    schema = pa.schema(setup.table().schema().to_arrow())
    assert schema.names == ["id", "count", "ts", "tags", "scores", "kind", "inner"], schema
    rows = {r["id"]: r for r in setup.rows()}
    assert len(rows) == 5 and rows["p3"]["count"] == 3 and rows["p3"]["kind"] == "VIEW" and rows["p3"]["tags"] == ["a"]


def test_json_gzip_and_raw_payloads(setup_factory, daemon_factory) -> None:
    gzipped = setup_factory(
        1, schema={"id": "string not null", "n": "long"}, sections={"format": {"type": "json", "gzip": True}}
    )
    values = [gzip.compress(json.dumps({"id": f"g{i}", "n": i}).encode()) for i in range(10)] + [b'{"id": "plain"}']
    gzipped.topic.produce_messages([Message(0, v) for v in values])
    daemon = daemon_factory(gzipped, "--until-caught-up")
    assert daemon.wait(120) == 0, daemon.log()[-3000:]
    assert sorted(gzipped.ids()) == sorted(f"g{i}" for i in range(10))
    [letter] = gzipped.dead_letters()
    assert "not gzip" in letter["error"]


def test_raw_payloads_as_text_and_bytes_with_metadata(setup_factory, daemon_factory, tmp_path: Path) -> None:
    setup = setup_factory(
        1,
        metadata_columns=None,  # the table's columns are compared exactly
        schema={"value": "string", "offset": "long", "key": "string"},
        sections={
            "format": {"type": "raw", "raw_column": "value", "key": "string"},
            "transforms": {"offset": "kafka.offset", "key": "kafka.key"},
        },
    )
    setup.topic.produce_messages(
        [Message(0, f"line {i} ✓".encode(), f"k{i}".encode()) for i in range(5)] + [Message(0, b"\xff\xfe")]
    )
    daemon = daemon_factory(setup, "--until-caught-up")
    assert daemon.wait(120) == 0, daemon.log()[-3000:]
    rows = sorted(setup.rows(), key=lambda r: r["offset"])
    assert rows == [{"value": f"line {i} ✓", "offset": i, "key": f"k{i}"} for i in range(5)]
    [letter] = setup.dead_letters()
    assert letter["offset"] == 5 and "UTF-8" in letter["error"]


def test_raw_bytes(setup_factory, daemon_factory) -> None:
    setup = setup_factory(
        1, schema={"payload": "binary not null"}, sections={"format": {"type": "raw", "raw_column": "payload"}}
    )
    blobs = [uuid.uuid4().bytes + b"\xff\x00" for _ in range(5)]
    setup.topic.produce_messages([Message(0, b) for b in blobs])
    daemon = daemon_factory(setup, "--until-caught-up")
    assert daemon.wait(120) == 0, daemon.log()[-3000:]
    assert sorted(r["payload"] for r in setup.rows()) == sorted(blobs)


def test_a_registry_outage_is_retried_never_a_dead_letter(setup_factory, daemon_factory, tmp_path: Path) -> None:
    """The daemon starts while its registry is down: it backs off with the offsets held, and once the
    registry is back every message lands; none became a dead letter."""
    registry = LocalRegistry(tmp_path / "registry")
    url = registry.start()
    setup = setup_factory(
        1,
        schema={"id": "string not null", "amount": "double"},
        sections={"format": {"type": "avro"}, "schema_registry": {"url": url, "timeout_s": 2}},
    )
    serializer = avro_serializer(SchemaRegistryClient({"url": url}), 1)
    context = SerializationContext(setup.topic.name, MessageField.VALUE)
    ts = dt.datetime(2026, 11, 22, tzinfo=dt.UTC)
    setup.topic.produce_messages(
        [
            Message(0, serializer({"id": f"o{i}", "amount": 1.0, "ts": ts, "user": {"id": i}}, context))
            for i in range(30)
        ]
    )
    # Stopped, not killed: its H2 store keeps the schema only once flushed (a SIGKILL right after a
    # registration can lose it, and then the messages would rightly be dead letters: unknown id).
    registry.stop()
    try:
        daemon = daemon_factory(setup)
        wait_for(lambda: "retrying in" in daemon.log(), 60, "the daemon to back off")
        assert not setup.ids() and setup.dead_letters() == []
        registry.start(fresh=False)
        wait_for(lambda: len(setup.ids()) == 30, 90, "the rows once the registry is back")
        assert daemon.stop() == 0, daemon.log()[-3000:]
    finally:
        registry.stop()
    assert setup.dead_letters() == []
    assert f"schema registry {url} is unreachable" in daemon.log()
