"""The reference lane for whole documents: nested values (structs, lists, maps) walked with the
scalar converters of :mod:`kafka2delta.coercions.values`, column types compiled once, and
:func:`coerce_document`, one document → one row of the table schema.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from functools import lru_cache
from typing import Any

import pyarrow as pa

from kafka2delta.coercions.common import CoercionOptions, int_bounds
from kafka2delta.coercions.values import (
    Column,
    ValueFn,
    Walk,
    cannot_convert,
    column_failure,
    required_missing,
    show_value,
    to_binary,
    to_boolean,
    to_date,
    to_decimal,
    to_floating,
    to_integer,
    to_string,
    to_timestamp,
    type_name,
    value_kind,
)
from kafka2delta.errors import MessageError


def _coerce_value(value: Any, column: Column, path: str, schema_path: str, walk: Walk) -> Any:
    if value is None:
        if column.nullable:
            return None
        raise required_missing(path)
    return column.convert(value, column, path, schema_path, walk)


def _coerce_members(
    value: Mapping[Any, Any],
    members: tuple[Column, ...],
    names: frozenset[str],
    prefix: str,
    schema_prefix: str,
    walk: Walk,
) -> dict[str, Any]:
    """A dict into a row of ``members`` (top level, or a struct with ``prefix`` ``user.``)."""
    row = {
        member.name: _coerce_value(
            value.get(member.name), member, prefix + member.name, schema_prefix + member.name, walk
        )
        for member in members
    }
    if not value.keys() <= names:
        walk.unknown += sum(1 for key, item in value.items() if item is not None and key not in names)
    return row


def _to_struct(value: Any, column: Column, path: str, schema_path: str, walk: Walk) -> Any:
    if not isinstance(value, Mapping):
        raise cannot_convert(value, column, path)
    return _coerce_members(value, column.members, column.member_names, path + ".", schema_path + ".", walk)


def _to_list(value: Any, column: Column, path: str, schema_path: str, walk: Walk) -> Any:
    if not isinstance(value, list | tuple):
        raise cannot_convert(value, column, path)
    element = column.element
    assert element is not None
    return [_coerce_value(item, element, f"{path}[{index}]", schema_path, walk) for index, item in enumerate(value)]


def _entry_path(path: str, key: Any) -> str:
    shown = json.dumps(key[:40], ensure_ascii=False) if isinstance(key, str) else show_value(key)
    return f"{path}[{shown}]"


def _to_map(value: Any, column: Column, path: str, schema_path: str, walk: Walk) -> Any:
    if not isinstance(value, Mapping):
        raise cannot_convert(value, column, path)
    key_column, item = column.key, column.element
    assert key_column is not None and item is not None
    entries: dict[Any, Any] = {}
    for key, member in value.items():
        entry_path = _entry_path(path, key)
        converted = _coerce_value(key, key_column, entry_path, schema_path, walk)
        try:
            duplicate = converted in entries
        except TypeError:  # an unhashable key type (a struct or list key) cannot come from a dict
            raise cannot_convert(key, key_column, entry_path) from None
        if duplicate:
            raise column_failure(path, f"two keys convert to the same key {show_value(converted)}")
        entries[converted] = _coerce_value(member, item, entry_path, schema_path, walk)
    return entries


@lru_cache(maxsize=512)
def value_function(dtype: pa.DataType) -> ValueFn:
    """The reference converter for one column type."""
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
        return to_string
    if pa.types.is_integer(dtype):
        return to_integer
    if pa.types.is_floating(dtype) and dtype.bit_width in (32, 64):
        return to_floating
    if pa.types.is_boolean(dtype):
        return to_boolean
    if pa.types.is_decimal(dtype):
        return to_decimal
    if pa.types.is_date32(dtype):
        return to_date
    if pa.types.is_timestamp(dtype) and dtype.unit == "us":
        return to_timestamp
    if pa.types.is_binary(dtype) or pa.types.is_large_binary(dtype):
        return to_binary
    if pa.types.is_struct(dtype):
        return _to_struct
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype):
        return _to_list
    if pa.types.is_map(dtype):
        return _to_map
    raise TypeError(f"coercion into column type {dtype} is not supported")


def _compile(dtype: pa.DataType, name: str = "", nullable: bool = True) -> Column:
    convert = value_function(dtype)
    column = Column(name, nullable, dtype, type_name(dtype), convert)
    if pa.types.is_integer(dtype):
        low, high = int_bounds(dtype)
        return replace(column, low=low, high=high)
    if pa.types.is_floating(dtype):
        return replace(column, float32=dtype.bit_width == 32)
    if pa.types.is_decimal(dtype):
        return replace(column, precision=dtype.precision, scale=dtype.scale)
    if pa.types.is_timestamp(dtype):
        return replace(column, naive=dtype.tz is None)
    if pa.types.is_struct(dtype):
        members = tuple(_compile(f.type, f.name, f.nullable) for f in (dtype.field(i) for i in range(dtype.num_fields)))
        return replace(column, members=members, member_names=frozenset(m.name for m in members))
    if pa.types.is_map(dtype):
        item = dtype.item_field
        return replace(
            column, key=_compile(dtype.key_type, "key", False), element=_compile(item.type, item.name, item.nullable)
        )
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype):
        element = dtype.value_field
        return replace(column, element=_compile(element.type, element.name, element.nullable))
    return column


@lru_cache(maxsize=256)
def compiled_type(dtype: pa.DataType) -> Column:
    return _compile(dtype)


_COMPILED_SCHEMAS: dict[int, tuple[pa.Schema, tuple[Column, ...], frozenset[str]]] = {}


def _compiled_schema(schema: pa.Schema) -> tuple[tuple[Column, ...], frozenset[str]]:
    # Keyed by identity (hashing a schema costs more than converting a document); the entry keeps
    # the schema alive, so its id cannot be reused while it is cached.
    cached = _COMPILED_SCHEMAS.get(id(schema))
    if cached is not None and cached[0] is schema:
        return cached[1], cached[2]
    columns = tuple(_compile(f.type, f.name, f.nullable) for f in schema)
    names = frozenset(schema.names)
    if len(_COMPILED_SCHEMAS) >= 64:
        _COMPILED_SCHEMAS.clear()
    _COMPILED_SCHEMAS[id(schema)] = (schema, columns, names)
    return columns, names


def coerce_document(
    document: Mapping[str, Any], schema: pa.Schema, options: CoercionOptions
) -> tuple[dict[str, Any], int]:
    """Return (row, number of non-null values dropped because their field is not in ``schema``)."""
    if not isinstance(document, Mapping):
        raise MessageError("coerce", f"the message is {value_kind(document)} {show_value(document)}, not an object")
    columns, names = _compiled_schema(schema)
    walk = Walk(options)
    row = _coerce_members(document, columns, names, "", "", walk)
    return row, walk.unknown
