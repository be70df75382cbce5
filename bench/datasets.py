"""The benchmark's data sets: how each message is made, the table schema that holds it, the transforms.

Four data sets, all on the demo's event shape (``dev/events.py``: a nested ``user`` object and an RFC 3339
timestamp string):

- ``json`` — the demo event as JSON, about 250 bytes;
- ``json2k`` — the same event with an ``items`` array of 14 line items and a ``context`` object, about 2 KB;
- ``avro`` — the demo event's fields as a bare Avro datum (``format.avro_schema_file``), about 150 bytes;
- ``protobuf`` — the demo event as a proto3 message in the Confluent wire format (:data:`EVENT_PROTO`, registered
  in a schema registry, whose id the payloads carry), about 165 bytes.

Payloads are built from string templates (no ``strftime`` per message) so that the producer, not the
payload builder, sets the pace: a few hundred thousand messages per second from one Python process.
"""

from __future__ import annotations

import datetime as dt
import io
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dev.events import COUNTRIES, EVENT_TYPES, event_json
from dev.events import EVENT_SCHEMA as BASE_SCHEMA

ITEMS_SCHEMA = {
    "items": "array<struct<sku:string,name:string,qty:long,price:double,category:string>>",
    "context": "struct<app:string,version:string,locale:string,screen:string,campaign:string>",
}

# Three transforms typical of kafka-delta-ingest users; all compile to column operations in the daemon.
TRANSFORMS = {"day": "substr(ts, `0`, `10`)", "offset": "kafka.offset", "user_id": "user.id"}
TRANSFORM_COLUMNS = {"day": "date", "offset": "long", "user_id": "long"}
# The same in Spark SQL, over the columns of from_json(value) and the Kafka source's own columns.
SPARK_TRANSFORMS = {
    "day": "CAST(substr(e.ts, 1, 10) AS DATE)",
    "offset": "offset",
    "user_id": "e.user.id",
}

AVRO_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Event",
    "namespace": "bench",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "type", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "ts", "type": "string"},
        {
            "name": "user",
            "type": {
                "type": "record",
                "name": "User",
                "fields": [{"name": "id", "type": "long"}, {"name": "country", "type": "string"}],
            },
        },
        {"name": "session", "type": "string"},
        {"name": "page", "type": "string"},
        {"name": "referrer", "type": "string"},
        {"name": "ua", "type": "string"},
    ],
}


EVENT_PROTO = """syntax = "proto3";
package bench;
message Event {
  string id = 1; string type = 2; double amount = 3; string ts = 4; User user = 5;
  string session = 6; string page = 7; string referrer = 8; string ua = 9;
}
message User { int64 id = 1; string country = 2; }
"""
Maker = Callable[[int, int, str], bytes]
"""``(partition, seq, ts) -> payload``."""


class Timestamps:
    """RFC 3339 strings ``base + seq`` microseconds, formatted with one ``strftime`` per second of range."""

    def __init__(self, base: dt.datetime) -> None:
        self._base = base.replace(microsecond=0)
        self._prefixes: dict[int, str] = {}

    def at(self, seq: int) -> str:
        second, micros = divmod(seq, 1_000_000)
        prefix = self._prefixes.get(second)
        if prefix is None:
            prefix = (self._base + dt.timedelta(seconds=second)).strftime("%Y-%m-%dT%H:%M:%S.")
            self._prefixes[second] = prefix
        return f"{prefix}{micros:06d}Z"


def now_ts() -> str:
    """The current time as the events' ``ts`` string."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


_CATEGORIES = ("books", "garden", "kitchen", "toys", "electronics", "sports", "music")


_ITEMS_CACHE: dict[int, str] = {}


def _items(seq: int) -> str:
    """The line items depend on ``seq`` modulo 10,007 only: built once per residue."""
    key = seq % 10_007
    cached = _ITEMS_CACHE.get(key)
    if cached is not None:
        return cached
    parts = []
    for i in range(14):
        n = (seq * 31 + i * 7) % 10_007
        parts.append(
            f'{{"sku":"SKU-{n:06d}-{i:02d}","name":"Product number {n} in the spring catalogue",'
            f'"qty":{1 + (n % 5)},"price":{n % 5000 / 100},"category":"{_CATEGORIES[n % 7]}"}}'
        )
    _ITEMS_CACHE[key] = ",".join(parts)
    return _ITEMS_CACHE[key]


def json2k_event(partition: int, seq: int, ts: str) -> bytes:
    """The demo event with 14 line items and a context object (about 2 KB)."""
    head = event_json(partition, seq, ts)[:-1].decode()
    return (
        f'{head},"items":[{_items(seq)}],"context":{{"app":"shop-web","version":"4.{seq % 17}.{seq % 5}",'
        f'"locale":"en-{COUNTRIES[seq % 6]}","screen":"1920x1080","campaign":"autumn-{seq % 23:02d}"}}}}'
    ).encode()


def event_values(partition: int, seq: int, ts: str) -> dict[str, Any]:
    """The demo event's values (the same as ``dev.events.event_json``), for the typed formats."""
    return {
        "id": f"p{partition}-{seq}",
        "type": EVENT_TYPES[seq % 4],
        "amount": seq % 1000 / 10,
        "ts": ts,
        "user": {"id": seq % 100_003, "country": COUNTRIES[seq % 6]},
        "session": f"s-{seq % 9973:05d}-{partition}",
        "page": f"/products/{seq % 517}",
        "referrer": "https://example.com/",
        "ua": "Mozilla/5.0 (X11; Linux x86_64) Gecko/20100101",
    }


def avro_writer(schema_id: int | None = None) -> Maker:
    """Bare Avro datums, or behind a Confluent header naming ``schema_id``."""
    import fastavro

    parsed = fastavro.parse_schema(AVRO_SCHEMA)
    write = fastavro.schemaless_writer
    header = b"" if schema_id is None else b"\x00" + schema_id.to_bytes(4, "big")

    def avro_event(partition: int, seq: int, ts: str) -> bytes:
        out = io.BytesIO()
        out.write(header)
        write(out, parsed, event_values(partition, seq, ts))
        return out.getvalue()

    return avro_event


def protobuf_writer(schema_id: int) -> Maker:
    """:data:`EVENT_PROTO` events in the Confluent wire format (header, message indexes [0], message)."""
    from google.protobuf import message_factory  # type: ignore[import-untyped]

    from kafka2delta.serialization import compile_proto

    compiled = compile_proto({"event.proto": EVENT_PROTO}, "event.proto")
    if isinstance(compiled, str):
        raise RuntimeError(compiled)
    event_class = message_factory.GetMessageClass(compiled[1][0])
    header = b"\x00" + schema_id.to_bytes(4, "big") + b"\x00"

    def protobuf_event(partition: int, seq: int, ts: str) -> bytes:
        return header + event_class(**event_values(partition, seq, ts)).SerializeToString()

    return protobuf_event


@dataclass(frozen=True)
class DataSet:
    name: str
    label: str
    schema: dict[str, str]
    format: str = "json"
    extra_env: dict[str, str] = field(default_factory=dict)
    registered: tuple[str, str] | None = None
    """(schema type, schema) the payloads' writer schema is registered as (they carry its id)."""

    def maker(self, schema_id: int = 0) -> Maker:
        """``(partition, seq, ts) -> payload``; ``schema_id`` is the registered schema's (``registered``)."""
        if self.name == "json":
            return event_json
        if self.name == "json2k":
            return json2k_event
        if self.format == "protobuf":
            return protobuf_writer(schema_id)
        return avro_writer()

    def table_schema(self, metadata_timestamp: bool = False) -> dict[str, str]:
        schema = {**self.schema, **TRANSFORM_COLUMNS}
        if metadata_timestamp:
            schema["kafka_timestamp"] = "timestamp"
        return schema

    def daemon_env(self, work: Path, registry_url: str = "") -> dict[str, str]:
        """The daemon's ``[format]`` settings for this data set (an .avsc written under ``work``)."""
        if self.registered is not None:
            return {"K2D_FORMAT__TYPE": self.format, "K2D_SCHEMA_REGISTRY__URL": registry_url}
        if self.format != "avro":
            return {}
        avsc = work / "event.avsc"
        avsc.write_text(json.dumps(AVRO_SCHEMA))
        return {"K2D_FORMAT__TYPE": "avro", "K2D_FORMAT__AVRO_SCHEMA_FILE": str(avsc)}

    def average_size(self, samples: int = 2000) -> float:
        make = self.maker(1)
        stamps = Timestamps(dt.datetime.now(dt.UTC))
        step = 7919  # spread the samples over the sequence space
        sizes = [len(make(i % 4, i * step, stamps.at(i * step))) for i in range(samples)]
        return sum(sizes) / len(sizes)


DATASETS = {
    "json": DataSet("json", "JSON ~250 B", BASE_SCHEMA),
    "json2k": DataSet("json2k", "JSON ~2 KB", {**BASE_SCHEMA, **ITEMS_SCHEMA}),
    "avro": DataSet("avro", "Avro ~150 B", BASE_SCHEMA, format="avro"),
    "protobuf": DataSet(
        "protobuf", "Protobuf ~165 B", BASE_SCHEMA, format="protobuf", registered=("PROTOBUF", EVENT_PROTO)
    ),
}
