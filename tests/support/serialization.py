"""Messages, schemas and registries for the deserializer tests (example-based and property-based)."""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from typing import Any

import fastavro
import pyarrow as pa

from kafka2delta.errors import MessageError, RetryableError
from kafka2delta.records import PartitionMessages
from kafka2delta.registry import RegisteredSchema, SchemaReference
from kafka2delta.serialization import Decoded
from tests.support.protobuf import message_class


def messages(payloads: Sequence[bytes | None], keys: Sequence[bytes | None] | None = None) -> PartitionMessages:
    n = len(payloads)
    return PartitionMessages(
        topic="events",
        partition=3,
        offsets=list(range(100, 100 + n)),
        payloads=list(payloads),
        timestamps_ms=[0] * n,
        keys=None if keys is None else list(keys),
    )


def check_partition(decoded: Decoded, count: int) -> None:
    """Every position ends in exactly one of: table rows, slow-lane documents, failures."""
    failed = [position for position, _ in decoded.failures]
    slow = [p for p in decoded.documents if p not in decoded.fast]
    assert decoded.fast == sorted(decoded.fast)
    assert decoded.table.num_rows == len(decoded.fast)
    assert sorted(decoded.fast + slow + failed) == list(range(count))
    for _, error in decoded.failures:
        assert isinstance(error, MessageError)
        assert error.stage == "deserialize"


class MemoryRegistry:
    """The SchemaRegistry interface, in memory."""

    def __init__(self) -> None:
        self.by_id: dict[int, RegisteredSchema] = {}
        self.subjects: dict[tuple[str, int], RegisteredSchema] = {}
        self.down = False
        self.calls = 0

    def add(
        self, schema_id: int, schema: Any, schema_type: str = "AVRO", references: Sequence[SchemaReference] = ()
    ) -> int:
        text = schema if isinstance(schema, str) else json.dumps(schema)
        self.by_id[schema_id] = RegisteredSchema(schema_id, schema_type, text, tuple(references))  # type: ignore[arg-type]
        return schema_id

    def schema(self, schema_id: int) -> RegisteredSchema:
        self.calls += 1
        if self.down:
            raise RetryableError("schema registry http://registry:8081 is unreachable: connection refused")
        if schema_id not in self.by_id:
            raise MessageError("deserialize", f"schema id {schema_id} is not in the registry")
        return self.by_id[schema_id]

    def referenced(self, subject: str, version: int) -> RegisteredSchema:
        if self.down:
            raise RetryableError("schema registry http://registry:8081 is unreachable: connection refused")
        return self.subjects[(subject, version)]


def avro_datum(schema: Any, value: Any) -> bytes:
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, fastavro.parse_schema(schema), value)
    return buffer.getvalue()


def confluent(schema_id: int, body: bytes, indexes: bytes = b"") -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big") + indexes + body


def framed_avro(schema_id: int, schema: Any, value: Any) -> bytes:
    return confluent(schema_id, avro_datum(schema, value))


READ_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("amount", pa.float64()),
        ("count", pa.int64()),
        ("ts", pa.string()),  # a timestamp column, read as text (the coercion stage parses it)
        ("user", pa.struct([("id", pa.int64()), ("country", pa.string())])),
        ("labels", pa.map_(pa.string(), pa.string())),  # Arrow's JSON reader cannot read maps
    ]
)


V1 = {
    "type": "record",
    "name": "Event",
    "namespace": "acme",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["CLICK", "VIEW"]}},
        {"name": "user", "type": {"type": "record", "name": "User", "fields": [{"name": "id", "type": "long"}]}},
    ],
}


V2 = {**V1, "fields": [*V1["fields"], {"name": "note", "type": ["null", "string"], "default": None}]}


def event(i: int, **extra: Any) -> dict[str, Any]:
    return {"id": f"e{i}", "amount": i + 0.5, "kind": "VIEW", "user": {"id": i}, **extra}


LOGICAL = {
    "type": "record",
    "name": "Logical",
    "fields": [
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "at_ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "at_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "local_ms", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {
            "name": "fixed_price",
            "type": {"type": "fixed", "name": "F8", "size": 8, "logicalType": "decimal", "precision": 12, "scale": 3},
        },
        {"name": "huge", "type": {"type": "bytes", "logicalType": "decimal", "precision": 50, "scale": 5}},
        {"name": "uid", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "t_ms", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "t_us", "type": {"type": "long", "logicalType": "time-micros"}},
        {"name": "blob", "type": "bytes"},
        {"name": "hash", "type": {"type": "fixed", "name": "H4", "size": 4}},
        {"name": "small", "type": "int"},
        {"name": "ratio", "type": "float"},
        {"name": "flag", "type": "boolean"},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "scores", "type": {"type": "map", "values": "long"}},
        {"name": "maybe_time", "type": ["null", {"type": "int", "logicalType": "time-millis"}], "default": None},
        {"name": "times", "type": {"type": "array", "items": {"type": "long", "logicalType": "time-micros"}}},
    ],
}


COMMON_PROTO = """syntax = "proto3";
package acme.common;
message Money { string currency = 1; int64 units = 2; }
"""


EVENT_PROTO = """syntax = "proto3";
package acme.events;
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";
import "acme/common.proto";

message Event {
  string id = 1;
  int64 count = 2;
  double amount = 3;
  Kind kind = 4;
  User user = 5;
  repeated string tags = 6;
  map<string, int32> scores = 7;
  google.protobuf.Timestamp at = 8;
  bytes blob = 9;
  uint64 big = 10;
  optional string note = 11;
  acme.common.Money price = 12;
  uint32 small = 13;
  float ratio = 14;
  bool flag = 15;
  repeated User friends = 16;
  map<string, User> by_name = 17;
  google.protobuf.Int64Value maybe = 18;
  oneof choice { string text = 19; int32 number = 20; }
  sint32 delta = 21;

  message User { int64 id = 1; string country = 2; }
  enum Kind { KIND_UNSPECIFIED = 0; CLICK = 1; VIEW = 2; }
}

message Other { string name = 1; }

message Node { int32 value = 1; Node next = 2; }
"""


def full_event(pool: Any) -> Any:
    event_class = message_class(pool, "acme.events.Event")
    message = event_class(id="x", count=2**40, amount=1.5, kind=2, tags=["a", "b"], big=2**64 - 1, small=2**32 - 1)
    message.user.id = 7
    message.user.country = "FR"
    message.scores["k"] = 3
    message.at.seconds = 1_700_000_000
    message.at.nanos = 123_456_789
    message.price.currency = "EUR"
    message.note = "n"
    message.ratio = 0.25
    message.flag = True
    message.friends.add(id=1, country="DE")
    message.by_name["bob"].id = 9
    message.maybe.value = 11
    message.number = 4
    message.delta = -3
    return message


NODE = {
    "type": "record",
    "name": "Node",
    "fields": [{"name": "value", "type": "int"}, {"name": "next", "type": ["null", "Node"]}],
}
