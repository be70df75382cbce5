"""Smoke test: confluent-kafka's schema registry client and serdes against the local Apicurio registry.

Starts its own registries (free ports, temp dirs) unless ``--url`` points at a running one::

    .venv/bin/python -m dev.registry.smoke_test            # everything, ~15 s once the app is cached
    .venv/bin/python -m dev.registry.smoke_test --url http://127.0.0.1:8081/apis/ccompat/v7

Needs in the venv, beside confluent-kafka: attrs, cachetools, certifi, httpx2 (or httpx), authlib
(the client), fastavro (Avro serdes), protobuf (Protobuf serdes). Prints one line per check and
ends with "N passed, N failed"; exits 1 if any check failed.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import tempfile
import time
import traceback
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext

from dev.registry.registry import LocalRegistry

AVRO_V1 = {
    "type": "record",
    "name": "Event",
    "namespace": "k2d.smoke",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "name", "type": "string"},
    ],
}
# BACKWARD-compatible: a new nullable field with default null.
AVRO_V2 = {**AVRO_V1, "fields": [*AVRO_V1["fields"], {"name": "note", "type": ["null", "string"], "default": None}]}
# Not BACKWARD-compatible with v2: "id" changes type long -> string.
AVRO_BAD = {**AVRO_V1, "fields": [{"name": "id", "type": "string"}, *AVRO_V1["fields"][1:]]}

_results: list[tuple[str, bool, str]] = []


def check(name: str, fn: Callable[[], str | None]) -> None:
    t0 = time.monotonic()
    try:
        detail = fn() or ""
        ok = True
    except Exception as exc:
        detail = f"{type(exc).__name__}: {exc}"
        if not isinstance(exc, AssertionError):
            detail += "\n" + traceback.format_exc(limit=4)
        ok = False
    _results.append((name, ok, detail))
    print(f"{'PASS' if ok else 'FAIL'} {name} ({time.monotonic() - t0:.2f}s){': ' + detail if detail else ''}")


def http(method: str, url: str, body: Any = None, auth: tuple[str, str] | None = None) -> tuple[int, Any]:
    """Plain HTTP for the ccompat calls the Python client does not expose (or to see raw answers)."""
    headers = {"Content-Type": "application/vnd.schemaregistry.v1+json"}
    if auth is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            raw = response.read()
            return response.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as err:
        raw = err.read()
        try:
            return err.code, json.loads(raw)
        except ValueError:
            return err.code, raw.decode(errors="replace")


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# ---------------------------------------------------------------------------------------------- Avro


def avro_checks(url: str, conf: dict[str, str], auth: tuple[str, str] | None) -> None:
    client = SchemaRegistryClient(conf)
    topic = unique("avro")
    subject = f"{topic}-value"
    ids: dict[str, int] = {}

    def register_v1() -> str:
        ids["v1"] = client.register_schema(subject, Schema(json.dumps(AVRO_V1), "AVRO"))
        back = SchemaRegistryClient(conf).get_schema(ids["v1"])  # fresh client: no cache
        assert back.schema_type == "AVRO", back.schema_type
        assert json.loads(back.schema_str or "null") == AVRO_V1, back.schema_str
        latest = client.get_latest_version(subject)
        assert (latest.schema_id, latest.version) == (ids["v1"], 1), latest
        return f"id {ids['v1']}, GET /schemas/ids/{ids['v1']} returns the same schema"

    def lookup() -> str:
        found = SchemaRegistryClient(conf).lookup_schema(subject, Schema(json.dumps(AVRO_V1), "AVRO"))
        assert (found.schema_id, found.version) == (ids["v1"], 1), found
        return "POST /subjects/{subject} finds id and version"

    def same_schema_other_subject() -> str:
        other = SchemaRegistryClient(conf).register_schema(
            f"{unique('avro')}-value", Schema(json.dumps(AVRO_V1), "AVRO")
        )
        assert other == ids["v1"], (other, ids["v1"])
        return f"same id {other} (ids are per schema content, as in Confluent)"

    def reformatted_schema() -> str:
        text = json.dumps(AVRO_V1, indent=4)  # same schema, other whitespace
        fresh = SchemaRegistryClient(conf)
        rid = fresh.register_schema(subject, Schema(text, "AVRO"))
        versions = fresh.get_versions(subject)
        assert rid == ids["v1"] and versions == [1], f"id {rid} (v1 is {ids['v1']}), versions {versions}"
        return "whitespace-only change: same id, no new version"

    def compat_v2() -> str:
        level = http("GET", f"{url}/config", auth=auth)[1]
        ok = client.test_compatibility(subject, Schema(json.dumps(AVRO_V2), "AVRO"))
        assert ok is True, ok
        ids["v2"] = client.register_schema(subject, Schema(json.dumps(AVRO_V2), "AVRO"))
        assert ids["v2"] != ids["v1"]
        assert client.get_versions(subject) == [1, 2], client.get_versions(subject)
        return f"global config {level}; v2 (nullable field, default null) accepted as id {ids['v2']}"

    def incompatible() -> str:
        ok = client.test_compatibility(subject, Schema(json.dumps(AVRO_BAD), "AVRO"))
        assert ok is False, ok
        try:
            client.register_schema(subject, Schema(json.dumps(AVRO_BAD), "AVRO"))
        except SchemaRegistryError as err:
            assert err.http_status_code == 409, err
            return f"HTTP {err.http_status_code}, error_code {err.error_code}, message {err.error_message[:150]!r}"
        raise AssertionError("incompatible schema was registered under BACKWARD")

    def per_subject_none() -> str:
        client.set_compatibility(subject, "NONE")  # PUT /config/{subject} {"compatibility": "NONE"}
        level = client.get_compatibility(subject)
        assert level == "NONE", level
        bad = client.register_schema(subject, Schema(json.dumps(AVRO_BAD), "AVRO"))
        assert client.get_versions(subject) == [1, 2, 3], client.get_versions(subject)
        return f"PUT /config/{{subject}} NONE, GET -> {level}; incompatible change registered as id {bad}"

    def delete_none_config() -> str:
        # Confluent: DELETE /config/{subject} drops the subject's level (back to the global one).
        # Apicurio 3.3.3: that works for BACKWARD, FORWARD, ... but a NONE level stays in place.
        client.delete_config(subject)
        after_delete = client.get_compatibility(subject)
        assert after_delete == "NONE", f"fixed upstream? GET /config/{{subject}} -> {after_delete}"
        # Workaround: delete the subject's COMPATIBILITY rule through Apicurio's core API (or PUT the wanted level).
        core = url.removesuffix("/apis/ccompat/v7") + "/apis/registry/v3"
        status, _ = http("DELETE", f"{core}/groups/default/artifacts/{subject}/rules/COMPATIBILITY", auth=auth)
        assert status == 204, status
        level = client.get_compatibility(subject)
        assert level == "BACKWARD", level
        return (
            "QUIRK: after DELETE /config/{subject} a NONE level is still NONE; "
            f"DELETE {{core}}/groups/default/artifacts/{{subject}}/rules/COMPATIBILITY -> {status}, level now {level}"
        )

    def references() -> str:
        money = {
            "type": "record",
            "name": "Money",
            "namespace": "k2d.ref",
            "fields": [{"name": "units", "type": "long"}],
        }
        order = {
            "type": "record",
            "name": "Order",
            "namespace": "k2d.ref",
            "fields": [{"name": "id", "type": "long"}, {"name": "total", "type": "k2d.ref.Money"}],
        }
        fresh = SchemaRegistryClient(conf)
        money_subject, order_topic = unique("money"), unique("orders")
        fresh.register_schema(money_subject, Schema(json.dumps(money), "AVRO"))
        refs = [SchemaReference("k2d.ref.Money", money_subject, 1)]
        oid = fresh.register_schema(f"{order_topic}-value", Schema(json.dumps(order), "AVRO", refs))
        raw = http("GET", f"{url}/schemas/ids/{oid}", auth=auth)[1]
        ctx = SerializationContext(order_topic, MessageField.VALUE)
        # A schema with references goes to AvroSerializer as a Schema (with its references), not a string.
        order_schema = Schema(json.dumps(order), "AVRO", refs)
        ser = AvroSerializer(SchemaRegistryClient(conf), order_schema, conf={"auto.register.schemas": False})
        value = {"id": 1, "total": {"units": 5}}
        data = ser(value, ctx)
        assert data is not None and int.from_bytes(data[1:5], "big") == oid, data
        out = AvroDeserializer(SchemaRegistryClient(conf))(data, ctx)  # resolves the reference by subject/version
        assert out == value, out
        return f"order id {oid}, GET /schemas/ids/{oid} references {raw.get('references')}; serde round trip ok"

    def serde_roundtrip() -> str:
        ctx = SerializationContext(topic, MessageField.VALUE)
        ser = AvroSerializer(
            client, json.dumps(AVRO_V2), conf={"auto.register.schemas": False, "use.latest.version": False}
        )
        value = {"id": 42, "name": "answer", "note": None}
        data = ser(value, ctx)
        assert data is not None and data[0] == 0, data
        wid = int.from_bytes(data[1:5], "big")
        assert wid == ids["v2"], (wid, ids["v2"])
        out = AvroDeserializer(SchemaRegistryClient(conf))(data, ctx)
        assert out == value, out
        return f"{len(data)} bytes, magic 0 + id {wid}; decoded {out}"

    def auto_register_and_reader_schema() -> str:
        topic2 = unique("avro-auto")
        ctx = SerializationContext(topic2, MessageField.VALUE)
        data = AvroSerializer(SchemaRegistryClient(conf), json.dumps(AVRO_V1))({"id": 7, "name": "seven"}, ctx)
        assert data is not None
        wid = int.from_bytes(data[1:5], "big")
        subjects = SchemaRegistryClient(conf).get_subjects()
        assert f"{topic2}-value" in subjects, subjects
        # Reader schema v2 over a v1 record: the new field takes its default.
        out = AvroDeserializer(SchemaRegistryClient(conf), json.dumps(AVRO_V2))(data, ctx)
        assert out == {"id": 7, "name": "seven", "note": None}, out
        return f"auto-registered {topic2}-value as id {wid}; v1 bytes read with v2 reader schema: {out}"

    def delete_subject() -> str:
        fresh = SchemaRegistryClient(conf)
        soft = fresh.delete_subject(subject)
        assert subject not in fresh.get_subjects()
        hard = fresh.delete_subject(subject, permanent=True)
        still = http("GET", f"{url}/schemas/ids/{ids['v1']}", auth=auth)[0]
        return f"soft delete -> {soft}, permanent -> {hard}; GET /schemas/ids/{ids['v1']} afterwards -> {still}"

    check("avro: register v1, get by id, latest version", register_v1)
    check("avro: lookup schema under subject", lookup)
    check("avro: same schema in another subject", same_schema_other_subject)
    check("avro: re-register same schema with other whitespace", reformatted_schema)
    check("avro: BACKWARD accepts v2 with nullable field", compat_v2)
    check("avro: BACKWARD rejects incompatible change", incompatible)
    check("avro: per-subject compatibility NONE", per_subject_none)
    check("avro: DELETE /config/{subject} after NONE (quirk)", delete_none_config)
    check("avro: schema references", references)
    check("avro: AvroSerializer/AvroDeserializer wire format", serde_roundtrip)
    check("avro: auto-register + reader schema", auto_register_and_reader_schema)
    check("avro: delete subject", delete_subject)


# ------------------------------------------------------------------------------------------ Protobuf


def protobuf_checks(url: str, conf: dict[str, str], auth: tuple[str, str] | None) -> None:
    try:
        from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # type: ignore[import-untyped]
    except ImportError as exc:
        missing = f"{exc} (pip install protobuf)"

        def fail() -> str:
            raise AssertionError(missing)

        check("protobuf: import", fail)
        return

    fdp = descriptor_pb2.FieldDescriptorProto
    tag = uuid.uuid4().hex[:8]
    pool = descriptor_pool.DescriptorPool()
    money = descriptor_pb2.FileDescriptorProto(name=f"k2d/money_{tag}.proto", package=f"k2d.m{tag}", syntax="proto3")
    msg = money.message_type.add(name="Money")
    msg.field.add(name="currency", number=1, type=fdp.TYPE_STRING, label=fdp.LABEL_OPTIONAL)
    msg.field.add(name="units", number=2, type=fdp.TYPE_INT64, label=fdp.LABEL_OPTIONAL)
    event = descriptor_pb2.FileDescriptorProto(
        name=f"k2d/order_{tag}.proto", package=f"k2d.o{tag}", syntax="proto3", dependency=[money.name]
    )
    msg = event.message_type.add(name="Order")
    msg.field.add(name="id", number=1, type=fdp.TYPE_INT64, label=fdp.LABEL_OPTIONAL)
    msg.field.add(name="customer", number=2, type=fdp.TYPE_STRING, label=fdp.LABEL_OPTIONAL)
    msg.field.add(
        name="total", number=3, type=fdp.TYPE_MESSAGE, type_name=f".k2d.m{tag}.Money", label=fdp.LABEL_OPTIONAL
    )
    pool.Add(money)
    pool.Add(event)
    Order: Any = message_factory.GetMessageClass(pool.FindMessageTypeByName(f"k2d.o{tag}.Order"))
    topic = unique("proto")
    ctx = SerializationContext(topic, MessageField.VALUE)
    client = SchemaRegistryClient(conf)
    found: dict[str, Any] = {}

    def serialize() -> str:
        ser = ProtobufSerializer(Order, client, {"auto.register.schemas": True})
        value = Order(id=9, customer="ada", total={"currency": "EUR", "units": 12})
        data = ser(value, ctx)
        assert data is not None and data[0] == 0, data
        found["data"], found["value"] = data, value
        found["id"] = int.from_bytes(data[1:5], "big")
        subjects = [s for s in client.get_subjects() if tag in s or s == f"{topic}-value"]
        latest = client.get_latest_version(f"{topic}-value")
        refs = [(r.name, r.subject, r.version) for r in latest.schema.references or []]
        assert refs and refs[0][0] == money.name, refs
        return f"id {found['id']}; subjects {subjects}; references {refs}; bytes {data.hex()}"

    def deserialize_without_registry() -> str:
        out = ProtobufDeserializer(Order, {"use.deprecated.format": False})(found["data"], ctx)
        assert out == found["value"], out
        return f"decoded {out}".replace("\n", " ")

    def deserialize_with_registry() -> str:
        # The deserializer fetches the writer schema with GET /schemas/ids/{id}?format=serialized.
        # Apicurio 3.3.3 answers 500 for descriptors the Python serializer registered (base64), and
        # raw descriptor bytes (not base64) for .proto text, so this fails either way.
        try:
            out = ProtobufDeserializer(Order, {}, SchemaRegistryClient(conf))(found["data"], ctx)
        except Exception as exc:
            return f"QUIRK: fails as expected: {type(exc).__name__}: {str(exc)[:120]}"
        raise AssertionError(f"fixed upstream? ProtobufDeserializer with a registry client decoded {out}")

    def schema_text() -> str:
        status, body = http("GET", f"{url}/schemas/ids/{found['id']}", auth=auth)
        status2, body2 = http("GET", f"{url}/schemas/ids/{found['id']}?format=serialized", auth=auth)
        text = body.get("schema", "") if isinstance(body, dict) else body
        text2 = body2.get("schema", "") if isinstance(body2, dict) else body2
        return (
            f"default format -> {status}, schemaType {body.get('schemaType') if isinstance(body, dict) else None}, "
            f"starts {text[:60]!r}; format=serialized -> {status2}, starts {str(text2)[:40]!r}"
        )

    def proto_text_register() -> str:
        text = 'syntax = "proto3";\npackage k2d.text;\n\nmessage Ping {\n  int64 seq = 1;\n  string note = 2;\n}\n'
        subject = f"{unique('proto-text')}-value"
        sid = client.register_schema(subject, Schema(text, "PROTOBUF"))
        back = SchemaRegistryClient(conf).get_schema(sid)
        return f"registered .proto text as id {sid}; read back {(back.schema_str or '')[:50]!r}"

    check("protobuf: ProtobufSerializer (auto-register, with an imported file)", serialize)
    if "data" in found:
        check("protobuf: ProtobufDeserializer without a registry client", deserialize_without_registry)
        check("protobuf: ProtobufDeserializer with a registry client (quirk)", deserialize_with_registry)
        check("protobuf: schema text returned by /schemas/ids", schema_text)
    check("protobuf: register .proto text", proto_text_register)


# --------------------------------------------------------------------------------------- Basic auth


def basic_auth_checks(work: Path) -> None:
    auth = ("k2d", "s3cret:pw")
    with LocalRegistry(work / "auth", basic_auth=auth) as registry:

        def anonymous() -> str:
            status, body = http("GET", f"{registry.url}/subjects")
            assert status == 401, (status, body)
            status, body = http("GET", f"{registry.url}/subjects", auth=("k2d", "wrong"))
            assert status == 401, (status, body)
            health = http("GET", registry.health_url)[0]
            return f"no/bad credentials -> 401; management {registry.health_url} -> {health} without credentials"

        def with_client() -> str:
            client = SchemaRegistryClient(registry.client_config())
            subject = f"{unique('auth')}-value"
            sid = client.register_schema(subject, Schema(json.dumps(AVRO_V1), "AVRO"))
            ctx = SerializationContext(subject.removesuffix("-value"), MessageField.VALUE)
            data = AvroSerializer(client, json.dumps(AVRO_V1))({"id": 1, "name": "x"}, ctx)
            out = AvroDeserializer(SchemaRegistryClient(registry.client_config()))(data, ctx)
            assert out == {"id": 1, "name": "x"}, out
            return f"basic.auth.user.info works: id {sid}, serde round trip ok"

        check("basic auth: rejects missing/wrong credentials", anonymous)
        check("basic auth: SchemaRegistryClient with basic.auth.user.info", with_client)


# ------------------------------------------------------------------------------------ kill/restart


def restart_checks(registry: LocalRegistry) -> None:
    client = SchemaRegistryClient(registry.client_config())
    subject = f"{unique('restart')}-value"
    sid = client.register_schema(subject, Schema(json.dumps(AVRO_V1), "AVRO"))

    def kill_restart() -> str:
        registry.kill()
        t0 = time.monotonic()
        registry.start(fresh=False)
        took = time.monotonic() - t0
        back = SchemaRegistryClient(registry.client_config()).get_schema(sid)
        assert json.loads(back.schema_str or "null") == AVRO_V1
        return f"schema id {sid} survives kill + start(fresh=False) (restart {took:.1f}s)"

    check("restart: data kept after kill()", kill_restart)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="use this running registry (ccompat URL) instead of starting one")
    parser.add_argument("--basic-auth", metavar="USER:PASSWORD", help="credentials for --url")
    args = parser.parse_args(argv)
    auth: tuple[str, str] | None = None
    if args.basic_auth:
        user, _, password = args.basic_auth.partition(":")
        auth = (user, password)
    if args.url:
        conf = {"url": args.url}
        if auth:
            conf["basic.auth.user.info"] = args.basic_auth
        avro_checks(args.url, conf, auth)
        protobuf_checks(args.url, conf, auth)
    else:
        with tempfile.TemporaryDirectory(prefix="k2d-registry-smoke-") as tmp:
            work = Path(tmp)
            registry = LocalRegistry(work / "registry")
            t0 = time.monotonic()
            registry.start()
            print(f"registry up at {registry.url} in {time.monotonic() - t0:.1f}s (pid {registry.pid})")
            try:
                avro_checks(registry.url, registry.client_config(), None)
                protobuf_checks(registry.url, registry.client_config(), None)
                restart_checks(registry)
            finally:
                registry.stop()
            basic_auth_checks(work)
    passed = sum(ok for _, ok, _ in _results)
    failed = len(_results) - passed
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
