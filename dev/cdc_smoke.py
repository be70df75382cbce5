"""Smoke test of the change-data-capture pipeline: PostgreSQL → Debezium (Kafka Connect) → Kafka.

Starts its own servers (free ports, a temp dir): a Kafka broker (:mod:`dev.kafka.broker`), PostgreSQL
(:mod:`dev.postgres.postgres`), a Kafka Connect worker with the Debezium PostgreSQL connector
(:mod:`dev.connect.connect`) and, for the Avro form, an Apicurio registry (:mod:`dev.registry.registry`). For
each converter form it makes tables holding a mix of types, inserts rows before the connector starts (the
snapshot: ``op=r``), adds the connector, then inserts, updates, deletes, changes a primary key, adds a column
and inserts again, and prints every message on the tables' topics::

    .venv/bin/python -m dev.cdc_smoke                          # json, json-plain and avro
    .venv/bin/python -m dev.cdc_smoke --converter json-plain
    .venv/bin/python -m dev.cdc_smoke --fixtures tests/fixtures/debezium   # also (re)write the fixtures

``--fixtures DIR`` writes what was captured: ``json_schema.jsonl`` / ``json_plain.jsonl`` (one line per message:
topic, partition, offset, and key and value as the raw text the converter wrote, or null; plus the record's
headers, if any, as [name, text] pairs), ``avro.jsonl``
(key and value bytes in base64, the schema ids in them, and the values decoded) and ``avro_schemas.json`` (the
writer schemas by id, as the registry's ccompat API returns them). Ends with "N passed, N failed".
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import struct
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Message
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from dev.connect.connect import (
    CONVERTERS,
    Converter,
    LocalConnect,
    apicurio_converter_version,
    debezium_postgres_config,
    debezium_version,
    kafka_version,
)
from dev.kafka.broker import LocalBroker
from dev.postgres.postgres import LocalPostgres
from dev.registry.registry import LocalRegistry, apicurio_version

FIXTURE_FILES: dict[Converter, str] = {
    "json": "json_schema.jsonl",
    "json-plain": "json_plain.jsonl",
    "avro": "avro.jsonl",
}
TABLES = ("public.types", "public.big_keys", "public.composite", "public.toasty")

# Every type the decoder must know, twice with values and once all NULL (arrays: one NULL element).
SCHEMA_SQL = """
DROP TABLE IF EXISTS types, big_keys, composite, toasty;
CREATE TABLE types (
    id        integer PRIMARY KEY,
    big       bigint,
    small     smallint,
    num       numeric(38,10),
    num_var   numeric,
    real_col  real,
    dbl       double precision,
    txt       text,
    vc        varchar(20),
    flag      boolean,
    d         date,
    t         time,
    t3        time(3),
    ttz       timetz,
    ts        timestamp,
    ts3       timestamp(3),
    tstz      timestamptz,
    iv        interval,
    doc       jsonb,
    uid       uuid,
    ints      integer[],
    tags      text[],
    raw       bytea
);
CREATE TABLE big_keys (id bigint PRIMARY KEY, name text NOT NULL);
CREATE TABLE composite (tenant integer, code text, qty integer, PRIMARY KEY (tenant, code));
-- FULL: update and delete events carry the whole old row in "before" (DEFAULT: the key columns of a delete).
ALTER TABLE composite REPLICA IDENTITY FULL;
CREATE TABLE toasty (id integer PRIMARY KEY, note text, payload text);
"""

SNAPSHOT_SQL = [
    """INSERT INTO types VALUES (
        1, 9223372036854775807, -32768, 1234567890123456789012345678.0123456789, 3.14159265358979323846264338327950288,
        1.5, -2.25e-300, 'héllo wörld ✓ 日本語 🙂', 'plain', true, '2024-02-29', '23:59:59.999999', '01:02:03.456',
        '01:02:03.5+02', '2024-02-29 12:34:56.789012', '2024-02-29 12:34:56.789', '2024-02-29 12:34:56.789012+02',
        '1 year 2 mons 3 days 04:05:06.7', '{"a": [1, 2.5, null], "é": "x", "n": {"b": true}}',
        'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{1,2,NULL}', '{"a","b c","ü",NULL}', '\\x00ff10')""",
    """INSERT INTO types VALUES (
        2, -1, 0, -0.0000000001, 42, 0, 0, '', 'x', false, '1969-07-20', '00:00:00', '00:00:00', '00:00:00+00',
        '1900-01-01 00:00:00', '1900-01-01 00:00:00', '1969-12-31 23:59:59.5-00', '-1 day', '[]',
        '00000000-0000-0000-0000-000000000000', '{}', '{}', '\\x')""",
    "INSERT INTO types (id) VALUES (3)",
    # PostgreSQL's special values: what Debezium makes of them (NaN numerics become null, infinities odd numbers)
    """INSERT INTO types (id, num, num_var, real_col, dbl, d, ts, ts3, tstz) VALUES (
        6, 'NaN', 'NaN', 'NaN', '-Infinity', 'infinity', 'infinity', '-infinity', 'infinity')""",
    "INSERT INTO big_keys VALUES (9007199254740993, 'beyond double precision'), (-5, 'negative')",
    "INSERT INTO composite VALUES (1, 'a', 10), (1, 'b', 20), (2, 'a', 30)",
    # payload is long and incompressible enough to be stored out of line (TOAST).
    "INSERT INTO toasty VALUES (1, 'first', (SELECT string_agg(md5(i::text), '') FROM generate_series(1, 400) i))",
]

STREAM_SQL = [
    # c: an insert
    """INSERT INTO types VALUES (
        4, 5, 7, 99999999999999999999999999.9999999999, -0.000123, -1.25, 1e300, 'new row', 'v', true, '2000-01-01',
        '12:00:00.5', '12:00:00.5', '12:00:00.5-05:30', '2000-01-01 00:00:00.000001', '2000-01-01 00:00:00.001',
        '2000-01-01 00:00:00+00', '00:00:00.000001', '{"k": "v"}',
        'f47ac10b-58cc-4372-a567-0e02b2c3d479', '{-1}', '{"only"}', '\\xdeadbeef')""",
    # u: an update of non-key columns (REPLICA IDENTITY DEFAULT: no "before")
    "UPDATE types SET txt = 'updated ✓', num = 1.5, flag = NULL WHERE id = 1",
    # d + tombstone
    "DELETE FROM types WHERE id = 3",
    # a primary-key change: Debezium emits a delete (+ tombstone) for the old key and a create for the new one
    "UPDATE types SET id = 20 WHERE id = 2",
    "UPDATE big_keys SET name = 'renamed' WHERE id = 9007199254740993",
    "DELETE FROM big_keys WHERE id = -5",
    # REPLICA IDENTITY FULL: "before" holds the whole old row
    "UPDATE composite SET qty = qty + 1 WHERE tenant = 1 AND code = 'a'",
    "UPDATE composite SET code = 'c' WHERE tenant = 1 AND code = 'b'",  # a composite-key change
    "DELETE FROM composite WHERE tenant = 2",
    # an update that leaves the out-of-line (TOAST) column unchanged: its value is not in the WAL
    "UPDATE toasty SET note = 'second' WHERE id = 1",
    # schema change: the next event on the table carries the new column (no event for the ALTER itself)
    "ALTER TABLE types ADD COLUMN extra text",
    "ALTER TABLE types ADD COLUMN score numeric(5,2) DEFAULT 0",
    "INSERT INTO types (id, txt, extra, score) VALUES (5, 'after add column', 'extra ✓', 12.34)",
    "UPDATE types SET extra = 'set later' WHERE id = 4",
]
# What the statements above make, per table: snapshot (r) and streamed events, tombstones counted as events.
EXPECTED_SNAPSHOT = {"types": 4, "big_keys": 2, "composite": 3, "toasty": 1}
EXPECTED_TOTAL = {
    "types": 4 + 1 + 1 + 2 + 3 + 1 + 1,  # r×4, c, u, d+tombstone, pk change (d+tombstone+c), c, u
    "big_keys": 2 + 1 + 2,  # r×2, u, d+tombstone
    "composite": 3 + 1 + 3 + 2,  # r×3, u, pk change (d+tombstone+c), d+tombstone
    "toasty": 1 + 1,  # r, u
}


class Captured:
    """One consumed message: raw bytes and, once decoded, key and value as Python data."""

    def __init__(self, msg: Message) -> None:
        self.topic: str = msg.topic() or ""
        self.partition: int = msg.partition() or 0
        self.offset: int = msg.offset() or 0
        self.key: bytes | None = msg.key()
        self.value: bytes | None = msg.value()
        headers = msg.headers() or []
        pairs = list(headers.items()) if isinstance(headers, dict) else headers
        self.headers: list[tuple[str, bytes | None]] = [
            (name, raw.encode() if isinstance(raw, str) else raw) for name, raw in pairs
        ]
        self.key_data: Any = None
        self.value_data: Any = None

    @property
    def table(self) -> str:
        return self.topic.rsplit(".", 1)[-1]


def consume(bootstrap: str, topics: Sequence[str], expected: dict[str, int], timeout: float) -> list[Captured]:
    """Read ``topics`` from the start until each table has ``expected`` messages (or ``timeout`` passes)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"cdc-smoke-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "topic.metadata.refresh.interval.ms": 500,
            "log_level": 0,
        }
    )
    consumer.subscribe(list(topics))
    # Keyed by position: the worker creates each topic with its first record, and each new topic rebalances
    # the group, which (nothing committed) reads the other partitions again from the start.
    got: dict[tuple[str, int, int], Captured] = {}

    def poll(timeout: float) -> None:
        msg = consumer.poll(timeout)
        if msg is not None and msg.error() is None:
            c = Captured(msg)
            got[(c.topic, c.partition, c.offset)] = c

    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            counts = {table: sum(1 for c in got.values() if c.table == table) for table in expected}
            if all(counts[t] >= n for t, n in expected.items()):
                break
            poll(0.5)
        # A little longer, to see anything unexpected beyond the count.
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            poll(0.3)
    finally:
        consumer.close()
    return [got[k] for k in sorted(got)]


def decode(captured: list[Captured], converter: Converter, registry_url: str | None) -> dict[int, Any]:
    """Fill key_data/value_data; for Avro, returns the writer schemas by id (fetched through ccompat)."""
    schemas: dict[int, Any] = {}
    if converter != "avro":
        for c in captured:
            c.key_data = json.loads(c.key) if c.key is not None else None
            c.value_data = json.loads(c.value) if c.value is not None else None
        return schemas
    assert registry_url is not None
    client = SchemaRegistryClient({"url": registry_url})
    deserializer = AvroDeserializer(client)
    for c in captured:
        for field, raw in ((MessageField.KEY, c.key), (MessageField.VALUE, c.value)):
            if raw is None:
                continue
            magic, schema_id = struct.unpack(">bI", raw[:5])
            assert magic == 0, f"{c.topic}@{c.offset}: magic byte {magic}, not Confluent's wire format"
            if schema_id not in schemas:
                schemas[schema_id] = json.loads(client.get_schema(schema_id).schema_str or "null")
            data = deserializer(raw, SerializationContext(c.topic, field))
            if field == MessageField.KEY:
                c.key_data = data
            else:
                c.value_data = data
    return schemas


def _jsonable(value: Any) -> Any:
    """Avro-decoded data as JSON, as the JSON converter writes it: bytes as base64 text, NaN and infinities as
    the strings "NaN", "Infinity", "-Infinity"; anything else (Decimal) as its str()."""
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value).replace("inf", "Infinity").replace("nan", "NaN")  # as the JSON converter writes them
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return str(value)


def _header_text(raw: bytes | None) -> str | dict[str, str] | None:
    """A header value as text (the worker's SimpleHeaderConverter writes text), else ``{"base64": …}``."""
    if raw is None:
        return None
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(raw).decode()}


def fixture_lines(captured: list[Captured], converter: Converter) -> list[str]:
    lines = []
    for c in captured:
        record: dict[str, Any] = {"topic": c.topic, "partition": c.partition, "offset": c.offset}
        if converter == "avro":
            for side, raw, data in (("key", c.key, c.key_data), ("value", c.value, c.value_data)):
                record[side] = base64.b64encode(raw).decode() if raw is not None else None
                record[f"{side}_schema_id"] = struct.unpack(">I", raw[1:5])[0] if raw is not None else None
                record[f"{side}_decoded"] = _jsonable(data)
        else:
            record["key"] = c.key.decode() if c.key is not None else None
            record["value"] = c.value.decode() if c.value is not None else None
        if c.headers:
            record["headers"] = [[name, _header_text(raw)] for name, raw in c.headers]
        lines.append(json.dumps(record, ensure_ascii=False))
    return lines


# ----------------------------------------------------------------------- checks


def _payload(data: Any, converter: Converter) -> Any:
    return data["payload"] if converter == "json" and data is not None else data


def check_events(captured: list[Captured], converter: Converter) -> list[tuple[str, bool, str]]:
    results: list[tuple[str, bool, str]] = []

    def check(name: str, ok: bool, detail: str = "") -> None:
        results.append((f"{converter}: {name}", ok, detail))

    by_table: dict[str, list[Captured]] = {}
    for c in captured:
        by_table.setdefault(c.table, []).append(c)
    for table, n in EXPECTED_TOTAL.items():
        got = len(by_table.get(table, []))
        check(f"{table}: {n} messages", got == n, f"got {got}")
    ops = [(c.table, _payload(c.value_data, converter)["op"] if c.value is not None else "tombstone") for c in captured]
    types_ops = [op for table, op in ops if table == "types"]
    check(
        "types: ops r r r r c u d tombstone d tombstone c c u",
        types_ops == ["r", "r", "r", "r", "c", "u", "d", "tombstone", "d", "tombstone", "c", "c", "u"],
        str(types_ops),
    )
    values = [_payload(c.value_data, converter) for c in by_table.get("types", []) if c.value is not None]
    last = values[-1] if values else {}
    check("types: the column added shows up in later events", "extra" in (last.get("after") or {}), str(last)[:200])
    toasty = [_payload(c.value_data, converter) for c in by_table.get("toasty", []) if c.value is not None]
    unchanged = toasty[-1]["after"]["payload"] if toasty else None
    check(
        "toasty: an unchanged TOAST column is Debezium's placeholder",
        unchanged == "__debezium_unavailable_value",
        repr(unchanged)[:80],
    )
    return results


# ------------------------------------------------------------------------ the run


def run_form(
    converter: Converter,
    pg: LocalPostgres,
    connect: LocalConnect,
    bootstrap: str,
    registry_url: str | None,
    fixtures: Path | None,
    echo: Callable[[str], None],
) -> list[tuple[str, bool, str]]:
    prefix = f"cdc_{converter.replace('-', '_')}"
    with pg.connect() as conn:
        conn.execute(SCHEMA_SQL)
        for statement in SNAPSHOT_SQL:
            conn.execute(statement)
    config = debezium_postgres_config(
        pg, topic_prefix=prefix, tables=TABLES, converter=converter, registry_url=registry_url
    )
    t0 = time.monotonic()
    connect.add_connector(prefix, config)
    echo(f"[{converter}] connector running after {time.monotonic() - t0:.1f}s")
    topics = [f"{prefix}.{table}" for table in TABLES]
    snapshot = consume(bootstrap, topics, EXPECTED_SNAPSHOT, timeout=60)
    echo(f"[{converter}] snapshot: {len(snapshot)} messages after {time.monotonic() - t0:.1f}s")
    with pg.connect() as conn:
        for statement in STREAM_SQL:
            conn.execute(statement)
    captured = consume(bootstrap, topics, EXPECTED_TOTAL, timeout=60)
    echo(f"[{converter}] all: {len(captured)} messages after {time.monotonic() - t0:.1f}s")
    connect.delete_connector(prefix)
    with pg.connect() as conn:  # the slot would hold WAL back for ever
        conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE NOT active")
    schemas = decode(captured, converter, registry_url)
    results: list[tuple[str, bool, str]] = []
    if registry_url is not None and converter == "avro":
        subjects = set(SchemaRegistryClient({"url": registry_url}).get_subjects())
        wanted = {f"{topic}-{side}" for topic in topics for side in ("key", "value")}
        results.append(("avro: ccompat subjects <topic>-key/-value", wanted <= subjects, str(sorted(subjects))))
    for c in captured:
        echo(f"--- {c.topic} [{c.partition}] @{c.offset}")
        echo(f"key:   {json.dumps(_jsonable(c.key_data), ensure_ascii=False)}")
        echo(f"value: {json.dumps(_jsonable(c.value_data), ensure_ascii=False)}")
        for name, raw in c.headers:
            echo(f"header {name}: {_header_text(raw)}")
    if fixtures is not None:
        fixtures.mkdir(parents=True, exist_ok=True)
        (fixtures / FIXTURE_FILES[converter]).write_text("\n".join(fixture_lines(captured, converter)) + "\n")
        if converter == "avro":
            text = json.dumps({str(k): v for k, v in sorted(schemas.items())}, indent=1, ensure_ascii=False)
            (fixtures / "avro_schemas.json").write_text(text + "\n")
    return results + check_events(captured, converter)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--converter", choices=[*CONVERTERS, "all"], default="all")
    parser.add_argument("--fixtures", type=Path, help="write the captured messages into this directory")
    parser.add_argument("--quiet", action="store_true", help="do not print the messages")
    args = parser.parse_args(argv)
    forms: list[Converter] = list(CONVERTERS) if args.converter == "all" else [args.converter]

    def echo(text: str) -> None:
        if not args.quiet or text.startswith("["):
            print(text, flush=True)

    print(
        f"Kafka/Connect {kafka_version()}, Debezium {debezium_version()}, "
        f"Apicurio converter {apicurio_converter_version()}, registry {apicurio_version()}",
        flush=True,
    )
    results: list[tuple[str, bool, str]] = []
    with tempfile.TemporaryDirectory(prefix="k2d-cdc-") as tmp:
        work = Path(tmp)
        t0 = time.monotonic()
        with LocalBroker(work / "kafka") as kafka, LocalPostgres(work / "postgres") as pg:
            echo(f"[servers] broker and PostgreSQL up after {time.monotonic() - t0:.1f}s")
            registry = LocalRegistry(work / "registry") if "avro" in forms else None
            try:
                registry_url = registry.start() if registry is not None else None
                t1 = time.monotonic()
                with LocalConnect(work / "connect", bootstrap_servers=kafka.bootstrap_servers) as connect:
                    echo(f"[servers] Kafka Connect up after {time.monotonic() - t1:.1f}s")
                    for form in forms:
                        try:
                            results += run_form(
                                form, pg, connect, kafka.bootstrap_servers, registry_url, args.fixtures, echo
                            )
                        except Exception as exc:
                            results.append((f"{form}: pipeline", False, f"{type(exc).__name__}: {exc}"))
                            print(f"connect.log tail:\n{connect.log_path.read_text()[-4000:]}", file=sys.stderr)
            finally:
                if registry is not None:
                    registry.stop()
    for name, ok, detail in results:
        print(f"{'PASS' if ok else 'FAIL'} {name}{'' if ok else f' ({detail})'}")
    failed = sum(1 for _, ok, _ in results if not ok)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
