"""Table schemas written as type strings in the config, turned into Arrow schemas.

A column is ``name = "type"``; append ``" not null"`` for a required column. Types:
``string``, ``binary``, ``boolean``, ``byte``/``short``/``int``/``long`` (or ``int8`` … ``int64``),
``float``, ``double``, ``date``, ``timestamp`` (UTC, microseconds), ``timestamp_ntz``,
``decimal(p,s)``, ``array<T>``, ``map<K,V>``, ``struct<name:T,other:T>``.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

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


_NOT_NULL = " not null"


def is_required(spec: str) -> bool:
    """Whether a column's ``"type [not null]"`` says ``not null``."""
    return spec.strip().lower().endswith(_NOT_NULL)


def parse_schema(columns: Mapping[str, str]) -> pa.Schema:
    """Turn ``{column: "type [not null]"}`` into an Arrow schema, keeping the order given."""
    fields = []
    for name, spec in columns.items():
        required = is_required(spec)
        stripped = spec.strip()[: -len(_NOT_NULL)] if required else spec.strip()
        fields.append(pa.field(name, parse_type(stripped), nullable=not required))
    return pa.schema(fields)


# --- schema evolution -------------------------------------------------------------------------
# Delta (without column mapping) refuses these characters in column names.
_INVALID_NAME_CHARS = frozenset(" ,;{}()\n\t=")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
# Delta has no unsigned integers: the next wider signed type holds every value.
_UNSIGNED = {
    pa.uint8(): pa.int16(),
    pa.uint16(): pa.int32(),
    pa.uint32(): pa.int64(),
    pa.uint64(): pa.decimal128(20, 0),
}


@dataclass(frozen=True)
class Evolution:
    """The outcome of merging the fields a batch carries into the table schema."""

    schema: pa.Schema
    added: list[str] = field(default_factory=list)
    """Dotted paths of the new nullable columns and nested fields, in the order added."""
    rejected: list[str] = field(default_factory=list)
    """Dotted paths that cannot become columns (a name Delta refuses, or a case-insensitive twin)."""


def delta_type(arrow_type: pa.DataType, *, inferred: bool) -> pa.DataType | None:
    """The Delta-writable Arrow type for a new column holding ``arrow_type`` values (None: no column yet).

    ``inferred`` marks types Arrow's JSON reader guessed from the data: JSON has no timestamps, so a
    string that merely looks like one stays a string (the batch is then read again as strings).
    """
    t = arrow_type
    if pa.types.is_null(t):
        return None
    if pa.types.is_dictionary(t):
        return delta_type(t.value_type, inferred=inferred)
    if pa.types.is_boolean(t) or t in (pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.float32(), pa.float64()):
        return t
    if t in _UNSIGNED:
        return _UNSIGNED[t]
    if pa.types.is_float16(t):
        return pa.float32()
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return pa.binary()
    if pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_date(t):
        return pa.date32()
    if pa.types.is_timestamp(t):
        if inferred:
            return pa.string()
        return pa.timestamp("us", tz="UTC") if t.tz is not None else pa.timestamp("us")
    if pa.types.is_decimal128(t):
        return t
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t) or pa.types.is_list_view(t):
        element = delta_type(t.value_type, inferred=inferred)
        return None if element is None else pa.list_(element)
    if pa.types.is_map(t):
        key, item = delta_type(t.key_type, inferred=inferred), delta_type(t.item_type, inferred=inferred)
        return None if key is None or item is None else pa.map_(key, item)
    if pa.types.is_struct(t):
        members = []
        for member in t:
            member_type = delta_type(member.type, inferred=inferred)
            if member_type is not None and _valid_name(member.name):
                members.append(pa.field(member.name, member_type))
        return pa.struct(members) if members else None
    # time, duration, decimal256, unions …: no Delta type; keep the values as text.
    return pa.string()


def _valid_name(name: str) -> bool:
    return bool(name) and not (set(name) & _INVALID_NAME_CHARS)


def evolve(table_schema: pa.Schema, incoming: pa.Schema, *, inferred: bool) -> Evolution:
    """Add every field of ``incoming`` the table lacks (recursively inside structs) as nullable.

    Fields the table has are left as they are even when ``incoming`` types them differently:
    fitting a value to an existing column is the coercion stage's job (and its dead letters').
    """
    added: list[str] = []
    rejected: list[str] = []
    merged = _merge_fields(list(table_schema), list(incoming), "", inferred, added, rejected)
    schema = pa.schema(merged, metadata=table_schema.metadata) if added else table_schema
    return Evolution(schema, added, rejected)


def _merge_fields(
    existing: list[pa.Field],
    incoming: list[pa.Field],
    prefix: str,
    inferred: bool,
    added: list[str],
    rejected: list[str],
) -> list[pa.Field]:
    by_name = {f.name: i for i, f in enumerate(existing)}
    lowered = {f.name.lower() for f in existing}
    merged = list(existing)
    for new in incoming:
        path = f"{prefix}{new.name}"
        if new.name in by_name:
            index = by_name[new.name]
            old = merged[index]
            widened = _merge_nested(old.type, new.type, f"{path}.", inferred, added, rejected)
            if widened is not None:
                merged[index] = pa.field(old.name, widened, old.nullable, old.metadata)
            continue
        column_type = delta_type(new.type, inferred=inferred)
        if column_type is None:
            continue  # only nulls so far: no type to give it yet
        if not _valid_name(new.name) or new.name.lower() in lowered:
            rejected.append(path)
            continue
        merged.append(pa.field(new.name, column_type, nullable=True))
        by_name[new.name] = len(merged) - 1
        lowered.add(new.name.lower())
        added.append(path)
    return merged


def _merge_nested(
    old: pa.DataType, new: pa.DataType, prefix: str, inferred: bool, added: list[str], rejected: list[str]
) -> pa.DataType | None:
    """The widened type when ``new`` brings fields ``old`` (a struct, or a list of structs) lacks."""
    if pa.types.is_struct(old) and pa.types.is_struct(new):
        before = len(added)
        members = _merge_fields(list(old), list(new), prefix, inferred, added, rejected)
        return pa.struct(members) if len(added) > before else None
    old_list = pa.types.is_list(old) or pa.types.is_large_list(old)
    new_list = pa.types.is_list(new) or pa.types.is_large_list(new)
    if old_list and new_list:
        element = _merge_nested(old.value_type, new.value_type, prefix, inferred, added, rejected)
        return None if element is None else pa.list_(pa.field(old.value_field.name, element, old.value_field.nullable))
    return None


def infer_type(value: Any) -> pa.DataType | None:
    """The Arrow type of one Python value as a decoder or transform produced it (None for null)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return pa.bool_()
    if isinstance(value, int):
        if _INT64_MIN <= value <= _INT64_MAX:
            return pa.int64()
        return pa.decimal128(38, 0) if len(str(abs(value))) <= 38 else pa.string()
    if isinstance(value, float):
        return pa.float64()
    if isinstance(value, str):
        return pa.string()
    if isinstance(value, (bytes, bytearray)):
        return pa.binary()
    if isinstance(value, Decimal):
        exponent = value.as_tuple().exponent
        scale = -exponent if isinstance(exponent, int) and exponent < 0 else 0
        return pa.decimal128(38, min(scale, 18))
    if isinstance(value, dt.datetime):
        return pa.timestamp("us", tz="UTC") if value.tzinfo is not None else pa.timestamp("us")
    if isinstance(value, dt.date):
        return pa.date32()
    if isinstance(value, dict):
        members = [(str(k), infer_type(v)) for k, v in value.items()]
        return pa.struct([pa.field(k, t) for k, t in members if t is not None])
    if isinstance(value, list):
        element: pa.DataType | None = None
        for item in value:
            element = unify(element, infer_type(item))
        return None if element is None else pa.list_(element)
    return pa.string()


def unify(left: pa.DataType | None, right: pa.DataType | None) -> pa.DataType | None:
    """One type for values of both types (None is 'no value seen yet'); text when nothing narrower fits."""
    if left is None:
        return right
    if right is None or left == right:
        return left
    numeric = (pa.int64(), pa.float64())
    if left in numeric and right in numeric:
        return pa.float64()
    if pa.types.is_struct(left) and pa.types.is_struct(right):
        types: dict[str, pa.DataType | None] = {f.name: f.type for f in left}
        for member in right:
            types[member.name] = unify(types.get(member.name), member.type)
        return pa.struct([pa.field(name, t) for name, t in types.items() if t is not None])
    if pa.types.is_list(left) and pa.types.is_list(right):
        element = unify(left.value_type, right.value_type)
        return pa.list_(element) if element is not None else left
    return pa.string()


def documents_schema(documents: Iterable[Mapping[str, Any]]) -> pa.Schema:
    """The fields of Python documents with one unified type each (fields only ever null are left out)."""
    types: dict[str, pa.DataType | None] = {}
    for document in documents:
        for name, value in document.items():
            types[name] = unify(types.get(name), infer_type(value))
    return pa.schema([pa.field(name, t) for name, t in types.items() if t is not None])


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` in ``schema``: columns added since it was built become nulls, structs gain their new fields."""
    if table.schema == schema:
        return table
    columns = [
        table.column(f.name).cast(f.type) if f.name in table.column_names else pa.nulls(table.num_rows, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(columns, schema=schema)
