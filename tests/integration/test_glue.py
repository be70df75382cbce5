"""Avro, Protobuf and JSON in the AWS Glue Schema Registry's wire format end to end: a real broker, moto's Glue API served on
loopback (dev/s3.py's server: moto answers every service on its one port), the daemon as a process reaching
Glue through boto3 with AWS credentials from its environment.

A new schema version registered mid-stream becomes a new nullable column without a restart (merge); a
message naming a version Glue does not have is a dead letter naming it; Glue unreachable is retried with the
offsets held, never a dead letter."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from dev.s3 import FaultProxy, LocalS3
from tests.support.glue import (
    AWS_PROTOS,
    REGION,
    GlueSchemas,
    glue_avro,
    glue_client,
    glue_environment,
    glue_frame,
    glue_protobuf,
)
from tests.support.harness import Daemon, Message, Setup, wait_for
from tests.support.protobuf import compile_with_protoc, message_class
from tests.support.serialization import confluent, framed_avro

V1: dict[str, Any] = {
    "type": "record",
    "name": "Event",
    "namespace": "k2d.test",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "user", "type": {"type": "record", "name": "User", "fields": [{"name": "id", "type": "long"}]}},
    ],
}
V2: dict[str, Any] = {**V1, "fields": [*V1["fields"], {"name": "color", "type": ["null", "string"], "default": None}]}
PROTO_V1 = """syntax = "proto3";
package k2d.test;
message Event { string id = 1; double amount = 2; User user = 3; }
message User { int64 id = 1; }
"""
PROTO_V2 = PROTO_V1.replace("User user = 3; }", "User user = 3; optional string color = 4; }")
PROTO_V3 = PROTO_V2.replace(
    "message Event {",
    'import "additionalTypes/decimal.proto";\nimport "metadata/metadata.proto";\nmessage Event {'
    ' additionalTypes.Decimal price = 5 [(metadata.metadata_key) = "connect.decimal.scale",'
    ' (metadata.metadata_value) = "2"];',
)
UNKNOWN = uuid.UUID("00000000-0000-4000-8000-00000000beef")
SCHEMA = {"id": "string not null", "amount": "double", "user": "struct<id:long>"}


@pytest.fixture(scope="module")
def moto_server() -> Iterator[LocalS3]:
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    with LocalS3() as server:
        yield server


def glue_setup(setup_factory: Callable[..., Setup], endpoint: str, format: str = "avro") -> Setup:
    return setup_factory(
        1,
        schema=SCHEMA,
        metadata_columns=None,  # the table's columns are compared exactly
        table={"schema_evolution": "merge"},
        sections={
            "format": {"type": format},
            "schema_registry": {"type": "glue", "region": REGION, "endpoint_url": endpoint, "timeout_s": 2},
        },
    )


def event(schema: dict[str, Any], version: uuid.UUID, i: int, prefix: str, **extra: Any) -> bytes:
    record = {"id": f"{prefix}{i}", "amount": i / 2, "user": {"id": i}, **extra}
    return glue_avro(version, schema, record, zlib_compressed=i % 2 == 1)


def assert_color_became_a_column(setup: Setup, *, rows: int, v1_after_v2: str) -> None:
    """v1 rows (prefix ``a``), v2 rows with ``color`` (prefix ``b``, red unless i % 3 == 0), then a v1 row again: the
    table gained a nullable string column, null where v1 wrote."""
    schema = pa.schema(setup.table().schema().to_arrow())
    assert schema.names == ["id", "amount", "user", "color"]
    assert schema.field("color").type == pa.string() and schema.field("color").nullable
    found = {r["id"]: r for r in setup.rows()}
    assert len(found) == rows
    assert found["a3"] == {"id": "a3", "amount": 1.5, "user": {"id": 3}, "color": None}
    assert found["b4"] == {"id": "b4", "amount": 2.0, "user": {"id": 4}, "color": "red"}
    assert found["b3"]["color"] is None and found[v1_after_v2]["color"] is None


def test_a_new_schema_version_mid_stream_becomes_a_column_without_a_restart(
    setup_factory: Callable[..., Setup], daemon_factory: Callable[..., Daemon], moto_server: LocalS3
) -> None:
    setup = glue_setup(setup_factory, moto_server.endpoint)
    schemas = GlueSchemas(glue_client(moto_server.endpoint))
    v1 = schemas.register(setup.topic.name, V1)
    setup.topic.produce_messages([Message(0, event(V1, v1, i, "a")) for i in range(20)])
    daemon = daemon_factory(setup, env=glue_environment())
    wait_for(lambda: len(setup.ids()) == 20, 60, "the v1 rows")
    assert setup.table().schema().to_arrow().names == ["id", "amount", "user"]

    v2 = schemas.register(setup.topic.name, V2)
    assert v2 != v1
    setup.topic.produce_messages(
        [Message(0, event(V2, v2, i, "b", color="red" if i % 3 else None)) for i in range(20)]
        + [
            Message(0, glue_frame(UNKNOWN, b"\x02a")),  # offset 40: a version Glue does not have
            Message(0, framed_avro(1, V1, {"id": "c", "amount": 1.0, "user": {"id": 1}})),  # 41: Confluent's
            Message(0, event(V1, v1, 99, "a")),  # 42: v1 again, after v2
        ]
    )
    wait_for(lambda: len(setup.ids()) == 41 and len(setup.dead_letters()) == 2, 60, "the v2 rows")
    assert daemon.stop() == 0, daemon.log()[-3000:]

    assert_color_became_a_column(setup, rows=41, v1_after_v2="a99")
    # The column arrived in the same commit as the first rows carrying it.
    history = [h for h in setup.table().history() if h.get("kafka2delta", {}).get("added_columns")]
    assert len(history) == 1 and history[0]["kafka2delta"]["added_columns"] == ["color"]
    letters = setup.dead_letters()
    assert [(r["offset"], r["stage"]) for r in letters] == [(40, "deserialize"), (41, "deserialize")]
    assert letters[0]["error"].endswith(f"schema version {UNKNOWN} is not in the Glue schema registry")
    assert "not Glue wire format: header version byte 0x00, expected 0x03" in letters[1]["error"]
    assert f"{setup.topic.name}[0]@40" in daemon.log()
    assert setup.txn_versions() == {0: 42}


def test_protobuf_in_glue_wire_format_with_a_new_schema_version_mid_stream(
    setup_factory: Callable[..., Setup], daemon_factory: Callable[..., Daemon], moto_server: LocalS3
) -> None:
    setup = glue_setup(setup_factory, moto_server.endpoint, format="protobuf")
    schemas = GlueSchemas(glue_client(moto_server.endpoint))
    v1 = schemas.register(setup.topic.name, PROTO_V1, "PROTOBUF")
    old = message_class(compile_with_protoc({"e.proto": PROTO_V1}, "e.proto"), "k2d.test.Event")
    new = message_class(compile_with_protoc({"e.proto": PROTO_V2}, "e.proto"), "k2d.test.Event")

    def proto_event(cls: Any, version: uuid.UUID, i: int, prefix: str, **extra: Any) -> bytes:
        message = cls(id=f"{prefix}{i}", amount=i / 2, user={"id": i}, **extra)
        return glue_protobuf(version, message, zlib_compressed=i % 2 == 1)

    # 100 messages of one version: the column lanes read them.
    setup.topic.produce_messages([Message(0, proto_event(old, v1, i, "a")) for i in range(100)])
    daemon = daemon_factory(setup, env=glue_environment())
    wait_for(lambda: len(setup.ids()) == 100, 60, "the v1 rows")
    assert setup.table().schema().to_arrow().names == ["id", "amount", "user"]

    v2 = schemas.register(setup.topic.name, PROTO_V2, "PROTOBUF")
    setup.topic.produce_messages(
        [Message(0, proto_event(new, v2, i, "b", **({"color": "red"} if i % 3 else {}))) for i in range(100)]
        + [
            Message(0, glue_frame(v2, b"\x05" + old(id="x").SerializeToString())),  # 200: no message type 5
            Message(0, confluent(1, old(id="y").SerializeToString(), b"\x00")),  # 201: Confluent's framing
            Message(0, proto_event(old, v1, 0, "c")),  # 202: v1 again, after v2
        ]
    )
    wait_for(lambda: len(setup.ids()) == 201 and len(setup.dead_letters()) == 2, 60, "the v2 rows")
    assert daemon.stop() == 0, daemon.log()[-3000:]

    assert_color_became_a_column(setup, rows=201, v1_after_v2="c0")
    letters = setup.dead_letters()
    assert [(r["offset"], r["stage"]) for r in letters] == [(200, "deserialize"), (201, "deserialize")]
    assert letters[0]["error"].endswith(f"message index 5 does not exist in schema version {v2} (2 message types)")
    assert "not Glue wire format: header version byte 0x00, expected 0x03" in letters[1]["error"]
    assert setup.txn_versions() == {0: 202}

    # v3 imports AWS's own Decimal, as AWS's Kafka Connect Protobuf converter writes a Connect Decimal: a new
    # decimal(21,2) column; a price with more decimal places than that is a dead letter naming the field.
    v3 = schemas.register(setup.topic.name, PROTO_V3, "PROTOBUF")
    newest = message_class(compile_with_protoc({"e.proto": PROTO_V3, **AWS_PROTOS}, "e.proto"), "k2d.test.Event")
    prices = [{"units": i, "fraction": 250_000_000} for i in range(3)] + [{"units": 1, "fraction": 1}]
    setup.topic.produce_messages(
        [Message(0, glue_protobuf(v3, newest(id=f"d{i}", price=price))) for i, price in enumerate(prices)]
    )
    daemon = daemon_factory(setup, env=glue_environment())
    wait_for(lambda: len(setup.ids()) == 204 and len(setup.dead_letters()) == 3, 60, "the v3 rows")
    assert daemon.stop() == 0, daemon.log()[-3000:]
    schema = pa.schema(setup.table().schema().to_arrow())
    assert schema.names == ["id", "amount", "user", "color", "price"] and schema.field("price").nullable
    assert schema.field("price").type == pa.decimal128(21, 2)
    found = {r["id"]: r for r in setup.rows()}
    assert found["d2"]["price"] == Decimal("2.25") and found["a3"]["price"] is None and found["b4"]["price"] is None
    letter = setup.dead_letters()[2]
    assert (letter["offset"], letter["stage"]) == (206, "deserialize")
    assert letter["error"].endswith("price: additionalTypes.Decimal 1.000000001 has more than 2 decimal places")
    assert setup.txn_versions() == {0: 206}


def test_glue_unreachable_is_retried_with_the_offsets_held(
    setup_factory: Callable[..., Setup], daemon_factory: Callable[..., Daemon], moto_server: LocalS3
) -> None:
    with FaultProxy(moto_server.port) as proxy:
        setup = glue_setup(setup_factory, proxy.endpoint)
        v1 = GlueSchemas(glue_client(moto_server.endpoint)).register(setup.topic.name, V1)
        setup.topic.produce_messages([Message(0, event(V1, v1, i, "o")) for i in range(10)])
        proxy.refuse()
        daemon = daemon_factory(setup, env=glue_environment())
        wait_for(lambda: "retrying in" in daemon.log(), 60, "the daemon to back off")
        assert setup.ids() == [] and setup.dead_letters() == []
        proxy.heal()
        wait_for(lambda: len(setup.ids()) == 10, 60, "the rows once Glue is back")
        assert daemon.stop() == 0, daemon.log()[-3000:]
    assert setup.dead_letters() == []
    assert f"Glue schema registry at {proxy.endpoint} is unreachable" in daemon.log()
    assert setup.txn_versions() == {0: 9}


def test_json_schema_payloads_in_glue_wire_format(
    setup_factory: Callable[..., Setup], daemon_factory: Callable[..., Daemon], moto_server: LocalS3
) -> None:
    setup = glue_setup(setup_factory, moto_server.endpoint, format="json")
    schemas = GlueSchemas(glue_client(moto_server.endpoint))
    version = schemas.register(setup.topic.name, {"type": "object", "properties": {"id": {"type": "string"}}}, "JSON")
    avro_version = schemas.register(f"{setup.topic.name}-avro", V1)
    documents = [b'{"id": "j%d", "amount": %d.5, "user": {"id": %d}, "tag": "t%d"}' % (i, i, i, i) for i in range(10)]
    setup.topic.produce_messages(
        [Message(0, glue_frame(version, doc, zlib_compressed=i % 2 == 1)) for i, doc in enumerate(documents)]
        + [
            Message(0, glue_frame(avro_version, b'{"id": "x"}')),  # offset 10: an Avro schema version
            Message(0, b'{"id": "plain"}'),  # 11: plain JSON, no Glue header
        ]
    )
    daemon = daemon_factory(setup, "--until-caught-up", env=glue_environment())
    assert daemon.wait(120) == 0, daemon.log()[-3000:]
    assert pa.schema(setup.table().schema().to_arrow()).names == ["id", "amount", "user", "tag"]
    rows = {r["id"]: r for r in setup.rows()}
    assert len(rows) == 10 and rows["j3"] == {"id": "j3", "amount": 3.5, "user": {"id": 3}, "tag": "t3"}
    letters = setup.dead_letters()
    assert [(r["offset"], r["stage"]) for r in letters] == [(10, "deserialize"), (11, "deserialize")]
    assert letters[0]["error"].endswith(f"schema version {avro_version} is a AVRO schema, not JSON")
    assert "not Glue wire format" in letters[1]["error"]
    assert setup.txn_versions() == {0: 11}
