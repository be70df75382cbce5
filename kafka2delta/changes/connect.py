"""Kafka Connect schemas (as the JSON converter embeds them, ``schemas.enable=true``) → Arrow types, and the
values of Connect's and Debezium's logical types → the Python values those Arrow types hold.

Pure: a Connect schema is the JSON object the converter writes, ``{"type": "struct", "fields": [...]}``. The
mapping (README "Change events" has the table):

* ``org.apache.kafka.connect.data.Decimal`` (bytes: the unscaled value, big-endian two's complement; the
  ``scale`` parameter; ``connect.decimal.precision`` when Debezium knows it) → ``decimal(p, s)`` (p 38 when
  unknown; a precision above 38 → the decimal as text, in plain notation);
* ``io.debezium.data.VariableScaleDecimal`` (a struct of ``scale`` and ``value``: PostgreSQL ``numeric``
  without a scale, whose values may have any scale) → ``string``, the exact decimal in plain notation (no Delta
  decimal holds them all; declare the column ``decimal(p,s)`` in ``table.schema`` to get numbers, and values
  that do not fit become dead letters);
* ``io.debezium.time.Date`` / Connect ``Date`` (days) → ``date``;
* ``io.debezium.time.Time`` (ms), ``MicroTime`` (µs), ``NanoTime`` (ns), Connect ``Time`` (ms) → ``string``
  ``HH:MM:SS[.ffffff]`` (Delta has no time type);
* ``io.debezium.time.Timestamp`` (ms), ``MicroTimestamp`` (µs), ``NanoTimestamp`` (ns, cut to µs), Connect
  ``Timestamp`` (ms): a wall-clock time without zone → ``timestamp_ntz``;
* ``io.debezium.time.ZonedTimestamp`` (ISO-8601 text with an offset) → ``timestamp`` (UTC);
* ``io.debezium.data.Json``, ``Uuid``, ``Xml``, ``Enum``, ``ZonedTime`` and other named strings → ``string``;
* ``bytes`` (base64 in JSON) → ``binary``; ``float32``/``float64`` (``"NaN"``, ``"Infinity"`` and
  ``"-Infinity"`` as the JSON converter writes them) → ``float``/``double``; ``int8`` … ``int64``, ``boolean``,
  ``string`` → the same Arrow types; ``array`` → ``list``; ``map`` with string keys → ``map``; ``struct`` →
  ``struct``. A field is ``not null`` when the schema says ``"optional": false``.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

import pyarrow as pa

from kafka2delta.serialization.base import decode_error

MAX_DECIMAL_PRECISION = 38
_SPECIAL_FLOATS = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}

_EPOCH_DATE = dt.date(1970, 1, 1)
_EPOCH = dt.datetime(1970, 1, 1)

DECIMAL = "org.apache.kafka.connect.data.Decimal"
VARIABLE_SCALE_DECIMAL = "io.debezium.data.VariableScaleDecimal"
_DATES = frozenset({"io.debezium.time.Date", "org.apache.kafka.connect.data.Date"})
_TIMES = {
    "io.debezium.time.Time": 1_000,
    "org.apache.kafka.connect.data.Time": 1_000,
    "io.debezium.time.MicroTime": 1,
    "io.debezium.time.NanoTime": 0,  # 0: nanoseconds (divided, not multiplied)
}
_TIMESTAMPS = {
    "io.debezium.time.Timestamp": 1_000,
    "org.apache.kafka.connect.data.Timestamp": 1_000,
    "io.debezium.time.MicroTimestamp": 1,
    "io.debezium.time.NanoTimestamp": 0,
}
ZONED_TIMESTAMP = "io.debezium.time.ZonedTimestamp"
_PRIMITIVES: dict[str, pa.DataType] = {
    "int8": pa.int8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "float": pa.float32(),  # the JSON converter's names for FLOAT32 and FLOAT64
    "double": pa.float64(),
    "float32": pa.float32(),
    "float64": pa.float64(),
    "boolean": pa.bool_(),
    "string": pa.string(),
    "bytes": pa.binary(),
}

ConnectSchema = Mapping[str, Any]


# --- types -------------------------------------------------------------------------------------


def arrow_field(schema: ConnectSchema, name: str | None = None) -> pa.Field:
    """The Arrow field of a Connect field schema (its ``field`` name unless ``name`` is given)."""
    return pa.field(name or schema.get("field", ""), arrow_type(schema), nullable=bool(schema.get("optional", True)))


def arrow_type(schema: ConnectSchema) -> pa.DataType:
    """The Arrow type a Connect schema's values take here (see the module docstring)."""
    logical = schema.get("name")
    kind = schema.get("type")
    if logical == DECIMAL:
        parameters = schema.get("parameters") or {}
        scale = int(parameters.get("scale", 0))
        precision = int(parameters.get("connect.decimal.precision", MAX_DECIMAL_PRECISION))
        if precision > MAX_DECIMAL_PRECISION or scale > MAX_DECIMAL_PRECISION:
            return pa.string()
        return pa.decimal128(max(precision, scale, 1), scale)
    if logical == VARIABLE_SCALE_DECIMAL:
        return pa.string()
    if logical in _DATES:
        return pa.date32()
    if logical in _TIMES:
        return pa.string()
    if logical in _TIMESTAMPS:
        return pa.timestamp("us")
    if logical == ZONED_TIMESTAMP:
        return pa.timestamp("us", tz="UTC")
    if kind == "struct":
        return pa.struct([arrow_field(member) for member in schema.get("fields", [])])
    if kind == "array":
        return pa.list_(arrow_type(schema.get("items") or {"type": "string"}))
    if kind == "map":
        return pa.map_(arrow_type(schema.get("keys") or {"type": "string"}), arrow_type(schema.get("values") or {}))
    if isinstance(kind, str) and kind in _PRIMITIVES:
        return _PRIMITIVES[kind]
    raise decode_error(f"unsupported Connect schema type {kind!r} (name {logical!r})")


def struct_fields(schema: ConnectSchema) -> dict[str, ConnectSchema]:
    """The member schemas of a Connect struct schema, by name."""
    return {member["field"]: member for member in schema.get("fields", []) if "field" in member}


# --- values ------------------------------------------------------------------------------------


def convert(value: Any, schema: ConnectSchema, path: str) -> Any:
    """``value`` (as the JSON converter wrote it) in the Python form of :func:`arrow_type` of ``schema``."""
    if value is None:
        return None
    logical = schema.get("name")
    kind = schema.get("type")
    if logical == DECIMAL:
        scale = int((schema.get("parameters") or {}).get("scale", 0))
        number = decimal_value(value, scale, path)
        # Plain notation: str() writes 0 with scale 20 as '0E-20' (found by review).
        return f"{number:f}" if pa.types.is_string(arrow_type(schema)) else number
    if logical == VARIABLE_SCALE_DECIMAL:
        if not isinstance(value, Mapping):
            raise decode_error(f"{path}: a VariableScaleDecimal must be an object of scale and value, got {value!r}")
        return variable_scale_text(value, path)
    if logical in _DATES:
        return date_value(value, path)
    if logical in _TIMES:
        return time_text(value, _TIMES[logical], path)
    if logical in _TIMESTAMPS:
        return timestamp_value(value, _TIMESTAMPS[logical], path)
    if logical == ZONED_TIMESTAMP:
        return zoned_timestamp(value, path)
    if kind == "struct":
        if not isinstance(value, Mapping):
            raise decode_error(f"{path}: expected an object, got {shown(value)}")
        members = struct_fields(schema)
        return {name: convert(value.get(name), member, f"{path}.{name}") for name, member in members.items()}
    if kind == "array":
        if not isinstance(value, list):
            raise decode_error(f"{path}: expected an array, got {shown(value)}")
        items = schema.get("items") or {"type": "string"}
        return [convert(item, items, f"{path}[{i}]") for i, item in enumerate(value)]
    if kind == "map":
        if not isinstance(value, Mapping):
            raise decode_error(f"{path}: a map with non-string keys is not supported, got {shown(value)}")
        values = schema.get("values") or {}
        return [(key, convert(item, values, f"{path}.{key}")) for key, item in value.items()]
    if kind == "bytes":
        return bytes_value(value, path)
    if kind in ("float", "double", "float32", "float64") and isinstance(value, str):
        if value not in _SPECIAL_FLOATS:
            raise decode_error(f"{path}: expected a number, got {shown(value)}")
        return _SPECIAL_FLOATS[value]
    return value


def decimal_value(value: Any, scale: int, path: str) -> Decimal:
    """A Connect decimal: base64 of the unscaled big-endian integer (``decimal.format=BASE64``, the JSON
    converter's default), raw bytes (Avro), or a JSON number/text (``decimal.format=NUMERIC``)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return Decimal(str(value))
    if isinstance(value, Decimal):
        return value
    raw = bytes_value(value, path) if isinstance(value, str) else value
    if not isinstance(raw, (bytes, bytearray)):
        raise decode_error(f"{path}: a decimal must be base64 bytes or a number, got {shown(value)}")
    unscaled = int.from_bytes(raw, "big", signed=True)
    return Decimal(f"{unscaled}E{-scale}")  # exact: scaleb would round to the context's 28 digits


def variable_scale_value(value: Mapping[str, Any], path: str) -> Decimal:
    """A VariableScaleDecimal (``{"scale": s, "value": <unscaled bytes>}``) as a number."""
    return decimal_value(value.get("value"), int(value.get("scale") or 0), path)


def variable_scale_text(value: Mapping[str, Any], path: str) -> str:
    """A VariableScaleDecimal as its exact text in plain notation (the ``string`` column it lands in)."""
    return f"{variable_scale_value(value, path):f}"


def bytes_value(value: Any, path: str) -> bytes:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if not isinstance(value, str):
        raise decode_error(f"{path}: bytes must be base64 text, got {shown(value)}")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise decode_error(f"{path}: bytes are not base64 ({exc}): {shown(value)}") from exc


def date_value(value: Any, path: str) -> dt.date:
    if isinstance(value, dt.date):
        return value
    days = _integer(value, path)
    try:
        return _EPOCH_DATE + dt.timedelta(days=days)
    except OverflowError as exc:
        raise decode_error(f"{path}: {days} days since 1970-01-01 is out of range") from exc


def time_text(value: Any, per_unit_us: int, path: str) -> str:
    """A time of day as ``HH:MM:SS[.ffffff]`` (``per_unit_us``: microseconds per unit; 0 for nanoseconds)."""
    if isinstance(value, dt.time):
        return value.isoformat()
    amount = _integer(value, path)
    micros = amount // 1_000 if per_unit_us == 0 else amount * per_unit_us
    if not 0 <= micros <= 86_400_000_000:
        raise decode_error(f"{path}: {amount} is not a time of day")
    if micros == 86_400_000_000:  # PostgreSQL's 24:00:00
        return "24:00:00"
    seconds, micro = divmod(micros, 1_000_000)
    return dt.time(seconds // 3600, seconds // 60 % 60, seconds % 60, micro).isoformat()


def timestamp_value(value: Any, per_unit_us: int, path: str) -> dt.datetime:
    """A zone-less timestamp from an epoch count (``per_unit_us`` as in :func:`time_text`)."""
    if isinstance(value, dt.datetime):
        return value
    amount = _integer(value, path)
    micros = amount // 1_000 if per_unit_us == 0 else amount * per_unit_us
    try:
        return _EPOCH + dt.timedelta(microseconds=micros)
    except OverflowError as exc:
        raise decode_error(f"{path}: {amount} is out of the timestamp range") from exc


def zoned_timestamp(value: Any, path: str) -> dt.datetime:
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC) if value.tzinfo else value.replace(tzinfo=dt.UTC)
    if not isinstance(value, str):
        raise decode_error(f"{path}: a ZonedTimestamp must be ISO-8601 text, got {shown(value)}")
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError as exc:
        raise decode_error(f"{path}: {value!r} is not an ISO-8601 timestamp") from exc
    return parsed.astimezone(dt.UTC) if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def _integer(value: Any, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise decode_error(f"{path}: expected an integer, got {shown(value)}")
    return value


def shown(value: Any) -> str:
    """A value as a reason quotes it: its repr, cut to 80 characters."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# --- values without a schema: fitted to the table's column types -------------------------------


def fit_to_column(value: Any, column_type: pa.DataType, path: str, decimal_handling: str = "auto") -> Any:
    """A Debezium value from a message without its Connect schema (``schemas.enable=false``), read by the
    table column's type: a decimal column takes base64 bytes (the column's scale), the number as text
    (:func:`_decimal_text`) or a VariableScaleDecimal object, a date column days, a ``timestamp_ntz`` column
    microseconds (Debezium's PostgreSQL default, ``MicroTimestamp``). Anything else is left to the coercion stage
    (a time needs the schema to be read)."""
    if value is None:
        return None
    if pa.types.is_string(column_type) and isinstance(value, Mapping) and value.keys() == {"scale", "value"}:
        return variable_scale_text(value, path)
    if pa.types.is_floating(column_type) and isinstance(value, str) and value in _SPECIAL_FLOATS:
        return _SPECIAL_FLOATS[value]
    if pa.types.is_decimal(column_type):
        if isinstance(value, Mapping) and "value" in value:
            return variable_scale_value(value, path)
        if isinstance(value, str):
            return _decimal_text(value, column_type.scale, path, decimal_handling)
        return value
    if pa.types.is_date(column_type) and isinstance(value, int) and not isinstance(value, bool):
        return date_value(value, path)
    if pa.types.is_timestamp(column_type) and column_type.tz is None and isinstance(value, int):
        return timestamp_value(value, 1, path)
    return value


def _decimal_text(text: str, scale: int, path: str, handling: str) -> Decimal:
    """A schema-less decimal sent as text, as ``format.decimal_handling`` says Debezium wrote it: base64 of the
    unscaled bytes (``precise``, the JSON converter's default), the number itself (``string``: Java's
    ``BigDecimal.toPlainString``), or whichever it reads as (``auto``: a number first, so base64 made only of
    digits such as "1234", the bytes d7 6d f8, is misread; found by review). Only the Connect schema
    (``schemas.enable=true``) or the setting tells them apart: "100" is a number, and valid base64 too."""
    if handling == "precise":
        return decimal_value(text, scale, path)
    try:
        number = Decimal(text)
    except InvalidOperation:
        number = None
    if number is not None and number.is_finite():
        return number
    if handling == "string":
        raise decode_error(f"{path}: {shown(text)} is not a decimal number")
    return decimal_value(text, scale, path)
