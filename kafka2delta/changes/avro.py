"""Avro writer schemas of Kafka Connect's Avro converters → the Connect schema they were made from.

Connect's Avro converters (Confluent's ``AvroConverter``, Apicurio's) keep each field's Connect type in the
Avro schema: ``connect.name`` (the logical type: ``io.debezium.time.Date``, Connect's ``Decimal`` …),
``connect.parameters`` and ``connect.type`` (``int16``/``int8`` are Avro ints). Turning the writer schema back
into a Connect schema lets Avro change events go through the same conversions as the JSON converter's
(:mod:`kafka2delta.changes.connect`). Pure.

Two Avro logical types arrive already converted by the Avro reader (:mod:`kafka2delta.serialization.avro`):
``time-millis``/``time-micros`` as microseconds since midnight, ``date`` as a date; they are named so.
"""

from __future__ import annotations

from typing import Any

from kafka2delta.changes.connect import ConnectSchema

_PRIMITIVES = {
    "int": "int32",
    "long": "int64",
    "float": "float32",
    "double": "float64",
    "boolean": "boolean",
    "string": "string",
    "bytes": "bytes",
    "null": "string",
}
_ALREADY_READ = {"time-millis": "io.debezium.time.MicroTime", "time-micros": "io.debezium.time.MicroTime"}


def connect_schema(avro: Any) -> ConnectSchema:
    """The Connect schema of an Avro schema (parsed JSON; named types may be referenced by name)."""
    return _convert(avro, {}, "")


def _convert(schema: Any, named: dict[str, dict[str, Any]], namespace: str) -> dict[str, Any]:
    if isinstance(schema, str):
        found = named.get(schema) or named.get(f"{namespace}.{schema}")
        if found is not None:
            return {**found, "optional": False}
        return {"type": _PRIMITIVES.get(schema, "string"), "optional": False}
    if isinstance(schema, list):
        branches = [branch for branch in schema if branch != "null"]
        inner = _convert(branches[0], named, namespace) if len(branches) == 1 else {"type": "string"}
        return {**inner, "optional": "null" in schema}
    kind = schema.get("type")
    logical = _ALREADY_READ.get(schema.get("logicalType", ""), schema.get("connect.name"))
    if isinstance(kind, (dict, list)):
        result = _convert(kind, named, namespace)
    elif kind in ("record", "error"):
        space = schema.get("namespace", namespace)
        name = schema["name"]
        full = name if "." in name or not space else f"{space}.{name}"
        result = {"type": "struct", "fields": [], **({"name": logical} if logical else {})}
        named[full] = named[name] = result  # before the fields: a field may name its own record
        result["fields"] = [{**_convert(f["type"], named, space), "field": f["name"]} for f in schema["fields"]]
    elif kind == "array":
        result = {"type": "array", "items": _convert(schema["items"], named, namespace)}
    elif kind == "map":
        result = {"type": "map", "keys": {"type": "string"}, "values": _convert(schema["values"], named, namespace)}
    elif kind == "enum":
        result = {"type": "string"}
    elif kind == "fixed":
        result = {"type": "bytes"}
    else:
        result = {"type": schema.get("connect.type") or _PRIMITIVES.get(str(kind), "string")}
    if logical and "name" not in result:
        result = {**result, "name": logical}
    parameters = schema.get("connect.parameters")
    if parameters:
        result = {**result, "parameters": parameters}
    result.setdefault("optional", False)
    return result
