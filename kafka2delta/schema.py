"""Table schemas written as type strings in the config, turned into Arrow schemas.

A column is ``name = "type"``; append ``" not null"`` for a required column. Types:
``string``, ``binary``, ``boolean``, ``byte``/``short``/``int``/``long`` (or ``int8`` … ``int64``),
``float``, ``double``, ``date``, ``timestamp`` (UTC, microseconds), ``timestamp_ntz``,
``decimal(p,s)``, ``array<T>``, ``map<K,V>``, ``struct<name:T,other:T>``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import pyarrow as pa

_PRIMITIVES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "binary": pa.binary(),
    "boolean": pa.bool_(),
    "bool": pa.bool_(),
    "byte": pa.int8(),
    "int8": pa.int8(),
    "short": pa.int16(),
    "int16": pa.int16(),
    "int": pa.int32(),
    "integer": pa.int32(),
    "int32": pa.int32(),
    "long": pa.int64(),
    "int64": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "timestamp_ntz": pa.timestamp("us"),
}
_DECIMAL = re.compile(r"decimal\(\s*(\d+)\s*,\s*(\d+)\s*\)")


def _split_top_level(text: str) -> list[str]:
    """Split ``a:int,b:map<string,int>`` on the commas that are not nested."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for char in text:
        if char in "<(":
            depth += 1
        elif char in ">)":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    parts.append("".join(current).strip())
    return parts


def parse_type(text: str) -> pa.DataType:
    """Parse one type string; raises ValueError naming what it could not read."""
    spec = text.strip().lower()
    if spec in _PRIMITIVES:
        return _PRIMITIVES[spec]
    decimal = _DECIMAL.fullmatch(spec)
    if decimal:
        precision, scale = int(decimal.group(1)), int(decimal.group(2))
        if not 1 <= precision <= 38 or scale > precision:
            raise ValueError(f"decimal({precision},{scale}) is out of range (precision 1..38, scale <= precision)")
        return pa.decimal128(precision, scale)
    if spec.startswith("array<") and spec.endswith(">"):
        return pa.list_(parse_type(text.strip()[6:-1]))
    if spec.startswith("map<") and spec.endswith(">"):
        key_value = _split_top_level(text.strip()[4:-1])
        if len(key_value) != 2:
            raise ValueError(f"map needs a key and a value type: {text!r}")
        return pa.map_(parse_type(key_value[0]), parse_type(key_value[1]))
    if spec.startswith("struct<") and spec.endswith(">"):
        fields = []
        for member in _split_top_level(text.strip()[7:-1]):
            name, sep, member_type = member.partition(":")
            if not sep or not name.strip():
                raise ValueError(f"struct member must be name:type, got {member!r}")
            fields.append(pa.field(name.strip(), parse_type(member_type)))
        return pa.struct(fields)
    raise ValueError(f"unknown type {text!r}")


def parse_schema(columns: Mapping[str, str]) -> pa.Schema:
    """Turn ``{column: "type [not null]"}`` into an Arrow schema, keeping the order given."""
    fields = []
    for name, spec in columns.items():
        nullable = True
        stripped = spec.strip()
        if stripped.lower().endswith(" not null"):
            nullable = False
            stripped = stripped[: -len(" not null")]
        fields.append(pa.field(name, parse_type(stripped), nullable=nullable))
    return pa.schema(fields)
