"""The reference lane, one Python value at a time: a value → the Python value a scalar column of the
table takes (string, integer, float, boolean, decimal, date, timestamp, binary), or a MessageError
whose reason names the column and shows the value. The rules are in the package docstring.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import math
import reprlib
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from functools import lru_cache
from typing import Any

import pyarrow as pa

from kafka2delta.coercions.common import (
    DATE_TEXT,
    EPOCH_ORDINAL,
    INTEGER_TEXT,
    MAX_DAY,
    MAX_US,
    MIN_DAY,
    MIN_US,
    NUMBER_TEXT,
    TIMESTAMP_TEXT,
    US_PER_DAY,
    US_PER_SECOND,
    CoercionOptions,
    us_per_unit,
)
from kafka2delta.errors import MessageError

_UTC = dt.UTC
_EPOCH = dt.datetime(1970, 1, 1)
_FLOAT32 = struct.Struct("<f")


@dataclass
class Walk:
    """State of one coerce_document call: the options and the running unknown-field count."""

    options: CoercionOptions
    unknown: int = 0


ValueFn = Callable[[Any, "Column", str, str, Walk], Any]
"""(value, column, display path, schema path, walk) → Python value; ``value`` is not None."""


@dataclass(frozen=True, eq=False)
class Column:
    """A column type compiled for the reference lane: what converting one value needs, computed once
    (pyarrow's type accessors build new objects on every call, too slow per value)."""

    name: str
    nullable: bool
    dtype: pa.DataType
    type_name: str
    """As the config spells it, for reasons: ``long``, ``decimal(10,2)``, ``array<string>``."""
    convert: ValueFn
    low: int = 0
    high: int = 0
    """Integers: the range of the type."""
    float32: bool = False
    precision: int = 0
    scale: int = 0
    naive: bool = False
    """timestamp_ntz (no zone)."""
    members: tuple[Column, ...] = ()
    member_names: frozenset[str] = frozenset()
    element: Column | None = None
    """List element, or map value."""
    key: Column | None = None
    """Map key."""


_REPR = reprlib.Repr()
_REPR.maxstring = 100
_REPR.maxother = 100
_REPR.maxlist = 10
_REPR.maxdict = 10
_REPR.maxlevel = 3
_SHOWN_CHARS = 100


def show_value(value: Any) -> str:
    """The offending value as it appears in a reason: short, and never itself a source of errors."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, int):
        # str() of an int with more than ~4300 digits raises ValueError; show its size instead.
        text = str(value) if value.bit_length() <= 3000 else f"<integer of {value.bit_length()} bits>"
    elif isinstance(value, str):
        text = repr(value[: _SHOWN_CHARS + 1])
    elif isinstance(value, Decimal):
        text = str(value) if len(value.as_tuple().digits) <= _SHOWN_CHARS else f"<decimal {value:.6E}>"
    elif isinstance(value, dt.date | dt.time):
        text = value.isoformat()
    else:
        text = _REPR.repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 1] + "…"


def value_kind(value: Any) -> str:
    """The JSON-ish name of a Python value's type, as reasons print it."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Decimal):
        return "decimal"
    if isinstance(value, bytes | bytearray | memoryview):
        return "bytes"
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, dt.datetime):
        return "timestamp"
    if isinstance(value, dt.date):
        return "date"
    if isinstance(value, dt.time):
        return "time"
    return type(value).__name__


@lru_cache(maxsize=512)
def type_name(dtype: pa.DataType) -> str:
    """A column type as the config spells it (``long``, ``decimal(10,2)``, ``array<string>``)."""
    names = {
        pa.string(): "string",
        pa.binary(): "binary",
        pa.bool_(): "boolean",
        pa.int8(): "byte",
        pa.int16(): "short",
        pa.int32(): "int",
        pa.int64(): "long",
        pa.float32(): "float",
        pa.float64(): "double",
        pa.date32(): "date",
    }
    if dtype in names:
        return names[dtype]
    if pa.types.is_timestamp(dtype):
        return "timestamp" if dtype.tz is not None else "timestamp_ntz"
    if pa.types.is_decimal(dtype):
        return f"decimal({dtype.precision},{dtype.scale})"
    if pa.types.is_map(dtype):
        return f"map<{type_name(dtype.key_type)},{type_name(dtype.item_type)}>"
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype):
        return f"array<{type_name(dtype.value_type)}>"
    if pa.types.is_struct(dtype):
        members = ",".join(f"{dtype.field(i).name}:{type_name(dtype.field(i).type)}" for i in range(dtype.num_fields))
        return f"struct<{members}>"
    return str(dtype)


def column_failure(path: str, problem: str) -> MessageError:
    return MessageError("coerce", f"column '{path}': {problem}")


def cannot_convert(value: Any, column: Column, path: str, why: str = "") -> MessageError:
    reason = f"cannot convert {show_value(value)} ({value_kind(value)}) to {column.type_name}"
    return column_failure(path, f"{reason}: {why}" if why else reason)


def _out_of_range(value: Any, column: Column, path: str) -> MessageError:
    return column_failure(path, f"{show_value(value)} is out of range for {column.type_name}")


def required_missing(path: str) -> MessageError:
    return MessageError("coerce", f"column '{path}' is required but the message has no value for it")


# -- string -----------------------------------------------------------------------------------


def _float_text(value: float) -> str:
    """Python's json text of a float (json.dumps uses float.__repr__ and spells NaN/Infinity so)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return repr(value)


def _datetime_text(value: dt.datetime) -> str:
    """RFC 3339: aware → UTC with ``Z``; naive → no zone; fraction only when non-zero."""
    aware = value.tzinfo is not None and value.utcoffset() is not None
    wall = value.astimezone(_UTC).replace(tzinfo=None) if aware else value.replace(tzinfo=None)
    text = wall.isoformat(timespec="microseconds" if wall.microsecond else "seconds")
    return text + "Z" if aware else text


class _NotJson(ValueError):
    """A value inside a dict/list that has no JSON text (an object, a set, a non-scalar key...)."""


def _json_key(key: Any) -> str:
    # The key conversions Python's json module applies.
    if isinstance(key, str):
        return key
    if key is None:
        return "null"
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, int):
        return str(key)
    if isinstance(key, float):
        return _float_text(key)
    raise _NotJson(f"a key of type {type(key).__name__}")


def _write_json(value: Any, out: list[str]) -> None:
    """Compact JSON like ``json.dumps(v, separators=(",", ":"), ensure_ascii=False)``, extended
    to the values binary decoders produce (Decimal as a number, bytes as base64, datetimes as text)."""
    if value is None:
        out.append("null")
    elif isinstance(value, bool):
        out.append("true" if value else "false")
    elif isinstance(value, int):
        out.append(str(value))
    elif isinstance(value, float):
        out.append(_float_text(value))
    elif isinstance(value, str):
        out.append(json.dumps(value, ensure_ascii=False))
    elif isinstance(value, Decimal):
        out.append(str(value))
    elif isinstance(value, bytes | bytearray | memoryview):
        out.append('"' + base64.b64encode(bytes(value)).decode("ascii") + '"')
    elif isinstance(value, dt.datetime):
        out.append('"' + _datetime_text(value) + '"')
    elif isinstance(value, dt.date | dt.time):
        out.append('"' + value.isoformat() + '"')
    elif isinstance(value, Mapping):
        out.append("{")
        for index, (key, member) in enumerate(value.items()):
            if index:
                out.append(",")
            out.append(json.dumps(_json_key(key), ensure_ascii=False))
            out.append(":")
            _write_json(member, out)
        out.append("}")
    elif isinstance(value, list | tuple):
        out.append("[")
        for index, member in enumerate(value):
            if index:
                out.append(",")
            _write_json(member, out)
        out.append("]")
    else:
        raise _NotJson(f"a value of type {type(value).__name__}")


def _checked_text(text: str, original: Any, column: Column, path: str) -> str:
    # A Python str may hold lone surrogates (json.loads lets "\ud800" through); Arrow needs UTF-8.
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise cannot_convert(original, column, path, "not valid Unicode text") from None
    return text


def to_string(value: Any, column: Column, path: str, schema_path: str, walk: Walk) -> Any:
    if isinstance(value, str):
        return _checked_text(value, value, column, path)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        try:
            return str(value)
        except ValueError:  # more digits than Python converts to text
            raise _out_of_range(value, column, path) from None
    if isinstance(value, float):
        return _float_text(value)
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise cannot_convert(value, column, path, "not valid UTF-8") from None
    if isinstance(value, dt.datetime):
        try:
            return _datetime_text(value)
        except OverflowError:
            raise _out_of_range(value, column, path) from None
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, Mapping | list | tuple):
        out: list[str] = []
        try:
            _write_json(value, out)
        except (_NotJson, OverflowError) as exc:
            raise cannot_convert(value, column, path, f"holds {exc}") from None
        except ValueError:  # an int inside with too many digits for str()
            raise cannot_convert(value, column, path, "holds an integer too large for text") from None
        except RecursionError:
            raise cannot_convert(value, column, path, "nested too deeply") from None
        return _checked_text("".join(out), value, column, path)
    raise cannot_convert(value, column, path)


# -- numbers ----------------------------------------------------------------------------------


def to_integer(value: Any, column: Column, path: str, schema_path: str, walk: Walk) -> Any:
    low, high = column.low, column.high
    if isinstance(value, bool):
        raise cannot_convert(value, column, path, "a boolean is not a number")
    if isinstance(value, int):
        number = value
    elif isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise cannot_convert(value, column, path)
        number = int(value)
    elif isinstance(value, str):
        if not INTEGER_TEXT.fullmatch(value):
            raise cannot_convert(value, column, path)
        digits = value.lstrip("+-").lstrip("0") or "0"
        if len(digits) > 40:  # int() refuses > 4300 digits; 40 is plenty to be out of range
            raise _out_of_range(value, column, path)
        number = -int(digits) if value.startswith("-") else int(digits)
    elif isinstance(value, Decimal):
        if not value.is_finite():
            raise cannot_convert(value, column, path)
        if not value.is_zero() and value.adjusted() > 40:
            raise _out_of_range(value, column, path)
        if value != value.to_integral_value():
            raise cannot_convert(value, column, path)
        number = int(value)
    else:
        raise cannot_convert(value, column, path)
    if not low <= number <= high:
        raise _out_of_range(value, column, path)
    return number


def to_floating(value: Any, column: Column, path: str, schema_path: str, walk: Walk) -> Any:
    if isinstance(value, bool):
        raise cannot_convert(value, column, path, "a boolean is not a number")
    try:
        if isinstance(value, int | float):
            number = float(value)
        elif isinstance(value, str):
            if not NUMBER_TEXT.fullmatch(value):
                raise cannot_convert(value, column, path)
            number = float(value)
        elif isinstance(value, Decimal):
            if value.is_nan():  # float() raises on a signalling NaN
                raise cannot_convert(value, column, path, "not a number")
            number = float(value)
        else:
            raise cannot_convert(value, column, path)
    except OverflowError:  # an int beyond the double range
        raise _out_of_range(value, column, path) from None
    if math.isnan(number):
        raise cannot_convert(value, column, path, "not a number")
    if math.isinf(number):
        raise _out_of_range(value, column, path)
    if column.float32:
        # Round to float32 exactly as Arrow does (a C cast); struct raises where that gives inf.
        try:
            number = _FLOAT32.unpack(_FLOAT32.pack(number))[0]
        except OverflowError:
            raise _out_of_range(value, column, path) from None
    return number


def to_boolean(value: Any, column: Column, path: str, schema_path: str, walk: Walk) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.isascii():
        lowered = value.lower()
        if lowered in ("true", "false"):
            return lowered == "true"
    raise cannot_convert(value, column, path)


def _fit_decimal(number: Decimal, original: Any, column: Column, path: str) -> Decimal:
    """``number`` at the column's scale, exactly; an error where that would round or overflow."""
    precision, scale = column.precision, column.scale
    sign, digits, exponent = number.as_tuple()
    assert isinstance(exponent, int)  # finite: checked by the callers
    significant = "".join(map(str, digits)).lstrip("0")
    if not significant:
        return Decimal(f"0E-{scale}")
    stripped = significant.rstrip("0")
    exponent += len(significant) - len(stripped)
    # The value is int(stripped) * 10**exponent, with no trailing zero left in ``stripped``.
    if exponent < -scale:
        raise column_failure(
            path, f"{show_value(original)} has more than {scale} decimal places for {column.type_name}"
        )
    if len(stripped) + exponent > precision - scale:
        raise _out_of_range(original, column, path)
    unscaled = stripped + "0" * (exponent + scale)
    return Decimal(f"{'-' if sign else ''}{unscaled}E-{scale}")


class ExactFloat(float):
    """A JSON number with more significant digits than a double holds, with its text kept.

    It is a float everywhere (transforms, double columns), but a decimal column takes its exact text,
    as Arrow's JSON reader does in the fast lane: both lanes then agree on decimal(38, s) values.
    """

    text: str

    def __new__(cls, text: str) -> ExactFloat:
        number = super().__new__(cls, text)
        number.text = text
        return number


def to_decimal(value: Any, column: Column, path: str, schema_path: str, walk: Walk) -> Any:
    if isinstance(value, bool):
        raise cannot_convert(value, column, path, "a boolean is not a number")
    if isinstance(value, int):
        if value.bit_length() > 256:  # far beyond 38 digits; spares Decimal() a huge conversion
            raise _out_of_range(value, column, path)
        number = Decimal(value)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise cannot_convert(value, column, path)
        number = Decimal(value.text if isinstance(value, ExactFloat) else repr(value))
    elif isinstance(value, str):
        if not NUMBER_TEXT.fullmatch(value):
            raise cannot_convert(value, column, path)
        number = Decimal(value)
    elif isinstance(value, Decimal):
        if not value.is_finite():
            raise cannot_convert(value, column, path)
        number = value
    else:
        raise cannot_convert(value, column, path)
    return _fit_decimal(number, value, column, path)


# -- dates and timestamps -------------------------------------------------------------------


def _epoch_us(value: Any, column: Column, path: str, schema_path: str, walk: Walk) -> int:
    """A number read as an epoch in the column's unit → microseconds (ints exact, others half-even)."""
    per_unit = us_per_unit(schema_path, walk.options)
    if isinstance(value, int):
        return value * per_unit
    if isinstance(value, float) and not math.isfinite(value):
        raise cannot_convert(value, column, path)
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise cannot_convert(value, column, path)
        if not value.is_zero() and value.adjusted() > 30:  # keeps Fraction small; far out of range
            raise _out_of_range(value, column, path)
    # Fraction is exact for floats and Decimals; round() on it is half-to-even.
    return round(Fraction(value) * per_unit)


def _wall_time(value: dt.datetime, column: Column, path: str) -> dt.datetime:
    """A datetime's UTC wall time, naive (aware → converted; naive → taken as UTC)."""
    if value.tzinfo is None or value.utcoffset() is None:
        return value.replace(tzinfo=None)
    try:
        return value.astimezone(_UTC).replace(tzinfo=None)
    except OverflowError:
        raise _out_of_range(value, column, path) from None


def _parse_timestamp_us(text: str, column: Column, path: str) -> int:
    found = TIMESTAMP_TEXT.fullmatch(text)
    if not found:
        raise cannot_convert(text, column, path)
    year, month, day, hour, minute, second = (int(found.group(i)) for i in range(1, 7))
    fraction, sign, offset_hours, offset_minutes = found.group(7, 8, 9, 10)
    try:
        wall = dt.datetime(year, month, day, hour, minute, second)
    except ValueError:
        if year == 0:
            raise _out_of_range(text, column, path) from None
        raise cannot_convert(text, column, path) from None
    us = (wall.toordinal() - EPOCH_ORDINAL) * US_PER_DAY + (hour * 3600 + minute * 60 + second) * US_PER_SECOND
    if fraction:
        us += int(fraction[:6].ljust(6, "0"))  # truncated: the floor, since the fraction is positive
    if sign:
        if int(offset_hours) > 23 or int(offset_minutes) > 59:
            raise cannot_convert(text, column, path)
        offset = (int(offset_hours) * 60 + int(offset_minutes)) * 60 * US_PER_SECOND
        us -= offset if sign == "+" else -offset
    return us


def to_timestamp(value: Any, column: Column, path: str, schema_path: str, walk: Walk) -> Any:
    if isinstance(value, bool):
        raise cannot_convert(value, column, path)
    if isinstance(value, dt.datetime):
        wall = _wall_time(value, column, path)
    elif isinstance(value, dt.date):
        wall = dt.datetime(value.year, value.month, value.day)
    else:
        if isinstance(value, str):
            us = _parse_timestamp_us(value, column, path)
        elif isinstance(value, int | float | Decimal):
            us = _epoch_us(value, column, path, schema_path, walk)
        else:
            raise cannot_convert(value, column, path)
        if not MIN_US <= us <= MAX_US:
            raise _out_of_range(value, column, path)
        wall = _EPOCH + dt.timedelta(microseconds=us)
    return wall if column.naive else wall.replace(tzinfo=_UTC)


def to_date(value: Any, column: Column, path: str, schema_path: str, walk: Walk) -> Any:
    if isinstance(value, bool):
        raise cannot_convert(value, column, path)
    if isinstance(value, dt.datetime):
        return _wall_time(value, column, path).date()
    if isinstance(value, dt.date):
        return value
    if isinstance(value, str):
        found = DATE_TEXT.fullmatch(value)
        if not found:
            raise cannot_convert(value, column, path)
        year, month, day = (int(part) for part in found.groups())
        try:
            return dt.date(year, month, day)
        except ValueError:
            if year == 0:
                raise _out_of_range(value, column, path) from None
            raise cannot_convert(value, column, path) from None
    if isinstance(value, int | float | Decimal):
        days = _epoch_us(value, column, path, schema_path, walk) // US_PER_DAY
        if not MIN_DAY <= days <= MAX_DAY:
            raise _out_of_range(value, column, path)
        return dt.date.fromordinal(days + EPOCH_ORDINAL)
    raise cannot_convert(value, column, path)


# -- binary -----------------------------------------------------------------------------------------


def to_binary(value: Any, column: Column, path: str, schema_path: str, walk: Walk) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):  # ValueError: non-ASCII text
            raise cannot_convert(value, column, path, "not valid base64") from None
    raise cannot_convert(value, column, path)
