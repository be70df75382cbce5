"""Fit decoded documents to the table schema (stage ``coerce``).

Two lanes, one contract:

* :func:`coerce_document` — the reference lane: one document (a dict of Python values, as the
  deserializer and transforms produce it) → one row of Python values that
  ``pa.Table.from_pylist([row], schema=schema)`` accepts, or a :class:`MessageError` whose reason
  names the column (dotted path for nested fields, ``tags[3]`` for list elements, ``m["k"]`` for
  map entries) and shows the offending value.
* :func:`coerce_table` — the fast lane: whole Arrow columns converted with Arrow compute kernels.
  It may *decline* a row (put it in ``fallback``; the caller retries it with
  :func:`coerce_document`) but never gives a row a value different from what
  :func:`coerce_document` gives the same document ("fast may fail, never disagree"). A value the
  reference lane would reject is always declined, never reported as an error from here.

The Delta table's schema is the authority. A missing field or ``None`` becomes null when the column
is nullable; otherwise the message fails with ``column 'id' is required but the message has no
value for it`` (nested: ``column 'user.id' ...``). Fields that are not in the schema are dropped and
counted (non-null values only; top level and inside structs, recursively).

Coercion rules (source value → column type):

=================  ==============================================================================
column type        accepted values
=================  ==============================================================================
string             str as is; bool → ``true``/``false``; int, float, Decimal → their JSON text
                   (``42``, ``1.5``, ``1e+16``; NaN/±inf as Python's json writes them); dict/list →
                   compact JSON (``{"a":1}``; datetimes inside as below, bytes inside as base64);
                   bytes → UTF-8 text (invalid UTF-8 is an error); aware datetime →
                   ``2026-11-22T10:00:00.123456Z`` (converted to UTC, fraction only when non-zero),
                   naive datetime → the same without ``Z``; date → ``YYYY-MM-DD``; time → ISO text
byte/short/int/    int in range; float with an integral value in range (``3.0`` → 3); str matching
long               ``[+-]?[0-9]+`` in range; integral Decimal in range. bool is not a number here.
float/double       int, float, Decimal, numeric str (``[+-]?([0-9]+.?[0-9]*|.[0-9]+)([eE][+-]?[0-9]+)?``);
                   NaN is an error, a value that is not finite after conversion (``1e39`` into
                   float) is out of range. float = the float32 rounding of the double.
boolean            bool; str ``true``/``false`` in any ASCII case. Numbers are errors.
decimal(p,s)       int, float (through its shortest ``repr``), numeric str, Decimal → exact value;
                   error when it needs more than ``s`` decimal places (no rounding) or more than
                   ``p - s`` integer digits. Works up to decimal(38,0) with 38-digit values.
date               ``YYYY-MM-DD``; int/float/Decimal = epoch in the column's unit → its UTC date;
                   date as is; datetime → its UTC date (naive taken as UTC). Years 1..9999.
timestamp,         str ``YYYY-MM-DD(T|t| )HH:MM:SS[.fraction][Z|z|±HH:MM]``: fraction 1..9 digits,
timestamp_ntz      truncated to microseconds; no zone = UTC; timestamp_ntz stores the UTC wall
                   time. int = epoch in the column's unit (exact); float/Decimal = epoch rounded
                   half-to-even to the microsecond; aware datetime → UTC; naive datetime taken as
                   UTC; date → midnight. Years 1..9999. Anything else (date-only strings, leap
                   seconds, garbage) is an error.
binary             bytes as is; str → strict standard base64 (``b64decode(s, validate=True)``).
struct<...>        dict → each field coerced by name (missing → null or required error), unknown
                   keys dropped and counted.
array<T>           list → each element coerced (``tags[3]`` in errors).
map<K,V>           dict → key coerced to K (``"7"`` into an int key is fine), value to V; two keys
                   that convert to the same key are an error.
=================  ==============================================================================

Numbers coerced into date / timestamp / timestamp_ntz columns are epochs in
``CoercionOptions.epoch_unit`` (``s``, ``ms``, ``us``) unless ``epoch_units`` names the column by
its dotted path (``ts``, ``user.created``; list elements and map values use their column's path).

Fast lane, by (source Arrow type → column type):

* vectorised (Arrow kernels, no per-row Python): same type (plus range/finiteness checks); string ←
  string/integer/boolean/binary (UTF-8 checked); integers ← integer/float/numeric string (up to 18
  digits); float/double ← float/integer/numeric string; boolean ← ``true``/``false`` string;
  decimal ← decimal/integer/plain decimal string (no exponent, digits within the column's);
  date ← date32/``YYYY-MM-DD`` string/integer or integral float epoch/timestamp; timestamp(_ntz) ←
  timestamp/date32/integer or integral float epoch/RFC 3339 string (RE2-validated, then Arrow's
  ISO 8601 cast); struct ← struct (by field name, recursively); array ← list; map<string,V> ← map
  with string keys. A row whose value makes a kernel fail (Feb 30, a rescale with loss) is
  isolated by bisection; range failures by masks.
* value by value with the reference function (declined where it fails): fractional float epochs
  and decimals → date/timestamp; float → decimal; decimal → integer/double; string → binary
  (base64); maps with other key types; map → struct; integer strings over 18 digits and decimal
  strings with exponents or extra digits (only those rows); anything else without a kernel.
* declined outright: string ← float/decimal/temporal/struct/list/map (their text cannot be proven
  identical to the document's: an inferred double holds 1.0 for a JSON 1); map ← anything but a map
  (an inferred struct cannot tell an absent key from a null value); booleans into anything but
  boolean/string; floats of magnitude 2**53 or more wherever the exact integer matters (an inferred
  double column may hold a rounded JSON integer); Arrow dates/timestamps outside years 1..9999 and
  sub-microsecond nanosecond timestamps (no Python document holds them).

The fast lane trusts that the table holds the document's values. Arrow's JSON reader given a
timestamp, date, binary or decimal read type parses more leniently than these rules (it reads
``"2026-11-22"`` as a timestamp and a binary column's text as raw bytes), so such columns must be
read as strings (or numbers) for the two lanes to agree.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import math
import re
import reprlib
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from fractions import Fraction
from functools import lru_cache
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from kafka2delta.batches import isolate_failures
from kafka2delta.errors import MessageError

STAGE = "coerce"


@dataclass(frozen=True)
class CoercionOptions:
    epoch_unit: str = "ms"
    """Unit (``s``, ``ms``, ``us``) of numbers coerced into timestamp / timestamp_ntz / date columns."""
    epoch_units: Mapping[str, str] = field(default_factory=dict)
    """Per-column overrides, keyed by dotted column path (``user.created``)."""


@dataclass
class CoercedTable:
    rows: pa.Table
    """The rows that converted, in ``schema`` (same field order, types and nullability)."""
    kept: list[int]
    """For each row of ``rows``, its position in the input table (ascending)."""
    fallback: list[int]
    """Input positions the fast lane could not convert; the caller retries them with coerce_document."""
    unknown_fields: int = 0
    """Non-null values dropped because their field is not in ``schema`` (top level and nested), kept rows only."""


# ---------------------------------------------------------------------------------------------
# Shared constants
# ---------------------------------------------------------------------------------------------

_UTC = dt.UTC
_EPOCH = dt.datetime(1970, 1, 1)
_EPOCH_ORDINAL = dt.date(1970, 1, 1).toordinal()
_US_PER_SECOND = 1_000_000
_US_PER_DAY = 86_400 * _US_PER_SECOND
_MIN_DAY = dt.date.min.toordinal() - _EPOCH_ORDINAL
_MAX_DAY = dt.date.max.toordinal() - _EPOCH_ORDINAL
_MIN_US = _MIN_DAY * _US_PER_DAY
"""0001-01-01T00:00:00 in microseconds since the epoch: the first instant Python and Delta share."""
_MAX_US = (_MAX_DAY + 1) * _US_PER_DAY - 1
"""9999-12-31T23:59:59.999999 in microseconds since the epoch."""
_US_PER_UNIT = {"s": _US_PER_SECOND, "ms": 1_000, "us": 1}
_EXACT_FLOAT_LIMIT = 2**53
"""Beyond this a double cannot tell neighbouring integers apart: a JSON integer read into an
inferred double column may have been rounded, so the fast lane declines such values wherever the
exact integer matters."""
_FLOAT32 = struct.Struct("<f")

# Python regexes use [0-9], never \d (which matches any Unicode digit that int() would accept too).
_INTEGER_TEXT = re.compile(r"[+-]?[0-9]+")
_NUMBER_TEXT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_DATE_TEXT = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})")
_TIMESTAMP_TEXT = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt ]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,9}))?"
    r"(?:[Zz]|([+-])([0-9]{2}):([0-9]{2}))?"
)

# RE2 patterns for the fast lane (RE2's \d is ASCII; [0-9] used anyway for symmetry). They are never
# looser than the Python ones above: a string they accept is one the reference lane accepts too,
# except impossible days (Feb 30) and year 0, which Arrow's cast and the range check then decline.
_RE2_INTEGER = r"^[+-]?[0-9]{1,18}$"
"""At most 18 digits: always fits int64, so the cast cannot overflow; longer ones go value by value."""
_RE2_ANY_INTEGER = r"^[+-]?[0-9]+$"
_RE2_NUMBER = r"^[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$"
_RE2_BOOLEAN = r"^(?:[Tt][Rr][Uu][Ee]|[Ff][Aa][Ll][Ss][Ee])$"
"""Spelled out rather than (?i): RE2 folds case by Unicode rules (``ſ`` matches ``s``)."""
_RE2_DAY = r"[0-9]{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01])"
_RE2_CLOCK = r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]"
_RE2_OFFSET = r"[+-](?:[01][0-9]|2[0-3]):[0-5][0-9]"
_RE2_DATE = rf"^{_RE2_DAY}$"
_RE2_TS_ZONED = rf"^{_RE2_DAY}[T ]{_RE2_CLOCK}(?:\.[0-9]{{1,6}})?(?:Z|{_RE2_OFFSET})$"
"""What Arrow's ISO 8601 cast to timestamp[us, UTC] reads as is: the common case, one pass."""
_RE2_TS_NAIVE = rf"^{_RE2_DAY}[T ]{_RE2_CLOCK}(?:\.[0-9]{{1,6}})?$"
"""No zone: Arrow reads it once a ``Z`` is appended (no zone means UTC)."""
_RE2_TS_FULL = rf"^{_RE2_DAY}[Tt ]{_RE2_CLOCK}(?:\.[0-9]{{1,9}})?(?:[Zz]|{_RE2_OFFSET})?$"
"""Everything the grammar allows; what the two above miss (``t``, ``z``, 7-9 digits) is rewritten."""
_RE2_TS_NO_ZONE = rf"^({_RE2_DAY}[T ]{_RE2_CLOCK}(?:\.[0-9]+)?)$"


# ---------------------------------------------------------------------------------------------
# Reference lane: one Python value at a time
# ---------------------------------------------------------------------------------------------


@dataclass
class _Walk:
    """State of one coerce_document call: the options and the running unknown-field count."""

    options: CoercionOptions
    unknown: int = 0


_ValueFn = Callable[[Any, "_Column", str, str, _Walk], Any]
"""(value, column, display path, schema path, walk) → Python value; ``value`` is not None."""


@dataclass(frozen=True, eq=False)
class _Column:
    """A column type compiled for the reference lane: what converting one value needs, computed once
    (pyarrow's type accessors build new objects on every call, too slow per value)."""

    name: str
    nullable: bool
    dtype: pa.DataType
    type_name: str
    """As the config spells it, for reasons: ``long``, ``decimal(10,2)``, ``array<string>``."""
    convert: _ValueFn
    low: int = 0
    high: int = 0
    """Integers: the range of the type."""
    float32: bool = False
    precision: int = 0
    scale: int = 0
    naive: bool = False
    """timestamp_ntz (no zone)."""
    members: tuple[_Column, ...] = ()
    member_names: frozenset[str] = frozenset()
    element: _Column | None = None
    """List element, or map value."""
    key: _Column | None = None
    """Map key."""


_REPR = reprlib.Repr()
_REPR.maxstring = 100
_REPR.maxother = 100
_REPR.maxlist = 10
_REPR.maxdict = 10
_REPR.maxlevel = 3
_SHOWN_CHARS = 100


def _show(value: Any) -> str:
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


def _kind(value: Any) -> str:
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
def _type_name(dtype: pa.DataType) -> str:
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
        return f"map<{_type_name(dtype.key_type)},{_type_name(dtype.item_type)}>"
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype):
        return f"array<{_type_name(dtype.value_type)}>"
    if pa.types.is_struct(dtype):
        members = ",".join(f"{dtype.field(i).name}:{_type_name(dtype.field(i).type)}" for i in range(dtype.num_fields))
        return f"struct<{members}>"
    return str(dtype)


def _failure(path: str, problem: str) -> MessageError:
    return MessageError(STAGE, f"column '{path}': {problem}")


def _cannot(value: Any, column: _Column, path: str, why: str = "") -> MessageError:
    reason = f"cannot convert {_show(value)} ({_kind(value)}) to {column.type_name}"
    return _failure(path, f"{reason}: {why}" if why else reason)


def _out_of_range(value: Any, column: _Column, path: str) -> MessageError:
    return _failure(path, f"{_show(value)} is out of range for {column.type_name}")


def _required(path: str) -> MessageError:
    return MessageError(STAGE, f"column '{path}' is required but the message has no value for it")


def _us_per_unit(schema_path: str, options: CoercionOptions) -> int:
    unit = options.epoch_units.get(schema_path, options.epoch_unit)
    try:
        return _US_PER_UNIT[unit]
    except KeyError:
        # The config validates units; reaching this is a programming error, not a bad message.
        raise ValueError(f"epoch unit for column {schema_path!r} must be s, ms or us, got {unit!r}") from None


def _int_bounds(dtype: pa.DataType) -> tuple[int, int]:
    bits = dtype.bit_width
    if pa.types.is_signed_integer(dtype):
        return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    return 0, 2**bits - 1


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


def _checked_text(text: str, original: Any, column: _Column, path: str) -> str:
    # A Python str may hold lone surrogates (json.loads lets "\ud800" through); Arrow needs UTF-8.
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise _cannot(original, column, path, "not valid Unicode text") from None
    return text


def _to_string(value: Any, column: _Column, path: str, schema_path: str, walk: _Walk) -> Any:
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
            raise _cannot(value, column, path, "not valid UTF-8") from None
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
            raise _cannot(value, column, path, f"holds {exc}") from None
        except ValueError:  # an int inside with too many digits for str()
            raise _cannot(value, column, path, "holds an integer too large for text") from None
        except RecursionError:
            raise _cannot(value, column, path, "nested too deeply") from None
        return _checked_text("".join(out), value, column, path)
    raise _cannot(value, column, path)


# -- numbers ----------------------------------------------------------------------------------


def _to_integer(value: Any, column: _Column, path: str, schema_path: str, walk: _Walk) -> Any:
    low, high = column.low, column.high
    if isinstance(value, bool):
        raise _cannot(value, column, path, "a boolean is not a number")
    if isinstance(value, int):
        number = value
    elif isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise _cannot(value, column, path)
        number = int(value)
    elif isinstance(value, str):
        if not _INTEGER_TEXT.fullmatch(value):
            raise _cannot(value, column, path)
        digits = value.lstrip("+-").lstrip("0") or "0"
        if len(digits) > 40:  # int() refuses > 4300 digits; 40 is plenty to be out of range
            raise _out_of_range(value, column, path)
        number = -int(digits) if value.startswith("-") else int(digits)
    elif isinstance(value, Decimal):
        if not value.is_finite():
            raise _cannot(value, column, path)
        if not value.is_zero() and value.adjusted() > 40:
            raise _out_of_range(value, column, path)
        if value != value.to_integral_value():
            raise _cannot(value, column, path)
        number = int(value)
    else:
        raise _cannot(value, column, path)
    if not low <= number <= high:
        raise _out_of_range(value, column, path)
    return number


def _to_floating(value: Any, column: _Column, path: str, schema_path: str, walk: _Walk) -> Any:
    if isinstance(value, bool):
        raise _cannot(value, column, path, "a boolean is not a number")
    try:
        if isinstance(value, int | float):
            number = float(value)
        elif isinstance(value, str):
            if not _NUMBER_TEXT.fullmatch(value):
                raise _cannot(value, column, path)
            number = float(value)
        elif isinstance(value, Decimal):
            if value.is_nan():  # float() raises on a signalling NaN
                raise _cannot(value, column, path, "not a number")
            number = float(value)
        else:
            raise _cannot(value, column, path)
    except OverflowError:  # an int beyond the double range
        raise _out_of_range(value, column, path) from None
    if math.isnan(number):
        raise _cannot(value, column, path, "not a number")
    if math.isinf(number):
        raise _out_of_range(value, column, path)
    if column.float32:
        # Round to float32 exactly as Arrow does (a C cast); struct raises where that gives inf.
        try:
            number = _FLOAT32.unpack(_FLOAT32.pack(number))[0]
        except OverflowError:
            raise _out_of_range(value, column, path) from None
    return number


def _to_boolean(value: Any, column: _Column, path: str, schema_path: str, walk: _Walk) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.isascii():
        lowered = value.lower()
        if lowered in ("true", "false"):
            return lowered == "true"
    raise _cannot(value, column, path)


def _fit_decimal(number: Decimal, original: Any, column: _Column, path: str) -> Decimal:
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
        raise _failure(path, f"{_show(original)} has more than {scale} decimal places for {column.type_name}")
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


def _to_decimal(value: Any, column: _Column, path: str, schema_path: str, walk: _Walk) -> Any:
    if isinstance(value, bool):
        raise _cannot(value, column, path, "a boolean is not a number")
    if isinstance(value, int):
        if value.bit_length() > 256:  # far beyond 38 digits; spares Decimal() a huge conversion
            raise _out_of_range(value, column, path)
        number = Decimal(value)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise _cannot(value, column, path)
        number = Decimal(value.text if isinstance(value, ExactFloat) else repr(value))
    elif isinstance(value, str):
        if not _NUMBER_TEXT.fullmatch(value):
            raise _cannot(value, column, path)
        number = Decimal(value)
    elif isinstance(value, Decimal):
        if not value.is_finite():
            raise _cannot(value, column, path)
        number = value
    else:
        raise _cannot(value, column, path)
    return _fit_decimal(number, value, column, path)


# -- dates and timestamps -------------------------------------------------------------------


def _epoch_us(value: Any, column: _Column, path: str, schema_path: str, walk: _Walk) -> int:
    """A number read as an epoch in the column's unit → microseconds (ints exact, others half-even)."""
    per_unit = _us_per_unit(schema_path, walk.options)
    if isinstance(value, int):
        return value * per_unit
    if isinstance(value, float) and not math.isfinite(value):
        raise _cannot(value, column, path)
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise _cannot(value, column, path)
        if not value.is_zero() and value.adjusted() > 30:  # keeps Fraction small; far out of range
            raise _out_of_range(value, column, path)
    # Fraction is exact for floats and Decimals; round() on it is half-to-even.
    return round(Fraction(value) * per_unit)


def _wall_time(value: dt.datetime, column: _Column, path: str) -> dt.datetime:
    """A datetime's UTC wall time, naive (aware → converted; naive → taken as UTC)."""
    if value.tzinfo is None or value.utcoffset() is None:
        return value.replace(tzinfo=None)
    try:
        return value.astimezone(_UTC).replace(tzinfo=None)
    except OverflowError:
        raise _out_of_range(value, column, path) from None


def _parse_timestamp_us(text: str, column: _Column, path: str) -> int:
    found = _TIMESTAMP_TEXT.fullmatch(text)
    if not found:
        raise _cannot(text, column, path)
    year, month, day, hour, minute, second = (int(found.group(i)) for i in range(1, 7))
    fraction, sign, offset_hours, offset_minutes = found.group(7, 8, 9, 10)
    try:
        wall = dt.datetime(year, month, day, hour, minute, second)
    except ValueError:
        if year == 0:
            raise _out_of_range(text, column, path) from None
        raise _cannot(text, column, path) from None
    us = (wall.toordinal() - _EPOCH_ORDINAL) * _US_PER_DAY + (hour * 3600 + minute * 60 + second) * _US_PER_SECOND
    if fraction:
        us += int(fraction[:6].ljust(6, "0"))  # truncated: the floor, since the fraction is positive
    if sign:
        if int(offset_hours) > 23 or int(offset_minutes) > 59:
            raise _cannot(text, column, path)
        offset = (int(offset_hours) * 60 + int(offset_minutes)) * 60 * _US_PER_SECOND
        us -= offset if sign == "+" else -offset
    return us


def _to_timestamp(value: Any, column: _Column, path: str, schema_path: str, walk: _Walk) -> Any:
    if isinstance(value, bool):
        raise _cannot(value, column, path)
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
            raise _cannot(value, column, path)
        if not _MIN_US <= us <= _MAX_US:
            raise _out_of_range(value, column, path)
        wall = _EPOCH + dt.timedelta(microseconds=us)
    return wall if column.naive else wall.replace(tzinfo=_UTC)


def _to_date(value: Any, column: _Column, path: str, schema_path: str, walk: _Walk) -> Any:
    if isinstance(value, bool):
        raise _cannot(value, column, path)
    if isinstance(value, dt.datetime):
        return _wall_time(value, column, path).date()
    if isinstance(value, dt.date):
        return value
    if isinstance(value, str):
        found = _DATE_TEXT.fullmatch(value)
        if not found:
            raise _cannot(value, column, path)
        year, month, day = (int(part) for part in found.groups())
        try:
            return dt.date(year, month, day)
        except ValueError:
            if year == 0:
                raise _out_of_range(value, column, path) from None
            raise _cannot(value, column, path) from None
    if isinstance(value, int | float | Decimal):
        days = _epoch_us(value, column, path, schema_path, walk) // _US_PER_DAY
        if not _MIN_DAY <= days <= _MAX_DAY:
            raise _out_of_range(value, column, path)
        return dt.date.fromordinal(days + _EPOCH_ORDINAL)
    raise _cannot(value, column, path)


# -- binary and nested ------------------------------------------------------------------------


def _to_binary(value: Any, column: _Column, path: str, schema_path: str, walk: _Walk) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):  # ValueError: non-ASCII text
            raise _cannot(value, column, path, "not valid base64") from None
    raise _cannot(value, column, path)


def _coerce_value(value: Any, column: _Column, path: str, schema_path: str, walk: _Walk) -> Any:
    if value is None:
        if column.nullable:
            return None
        raise _required(path)
    return column.convert(value, column, path, schema_path, walk)


def _coerce_members(
    value: Mapping[Any, Any],
    members: tuple[_Column, ...],
    names: frozenset[str],
    prefix: str,
    schema_prefix: str,
    walk: _Walk,
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


def _to_struct(value: Any, column: _Column, path: str, schema_path: str, walk: _Walk) -> Any:
    if not isinstance(value, Mapping):
        raise _cannot(value, column, path)
    return _coerce_members(value, column.members, column.member_names, path + ".", schema_path + ".", walk)


def _to_list(value: Any, column: _Column, path: str, schema_path: str, walk: _Walk) -> Any:
    if not isinstance(value, list | tuple):
        raise _cannot(value, column, path)
    element = column.element
    assert element is not None
    return [_coerce_value(item, element, f"{path}[{index}]", schema_path, walk) for index, item in enumerate(value)]


def _entry_path(path: str, key: Any) -> str:
    shown = json.dumps(key[:40], ensure_ascii=False) if isinstance(key, str) else _show(key)
    return f"{path}[{shown}]"


def _to_map(value: Any, column: _Column, path: str, schema_path: str, walk: _Walk) -> Any:
    if not isinstance(value, Mapping):
        raise _cannot(value, column, path)
    key_column, item = column.key, column.element
    assert key_column is not None and item is not None
    entries: dict[Any, Any] = {}
    for key, member in value.items():
        entry_path = _entry_path(path, key)
        converted = _coerce_value(key, key_column, entry_path, schema_path, walk)
        try:
            duplicate = converted in entries
        except TypeError:  # an unhashable key type (a struct or list key) cannot come from a dict
            raise _cannot(key, key_column, entry_path) from None
        if duplicate:
            raise _failure(path, f"two keys convert to the same key {_show(converted)}")
        entries[converted] = _coerce_value(member, item, entry_path, schema_path, walk)
    return entries


@lru_cache(maxsize=512)
def _value_function(dtype: pa.DataType) -> _ValueFn:
    """The reference converter for one column type."""
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
        return _to_string
    if pa.types.is_integer(dtype):
        return _to_integer
    if pa.types.is_floating(dtype) and dtype.bit_width in (32, 64):
        return _to_floating
    if pa.types.is_boolean(dtype):
        return _to_boolean
    if pa.types.is_decimal(dtype):
        return _to_decimal
    if pa.types.is_date32(dtype):
        return _to_date
    if pa.types.is_timestamp(dtype) and dtype.unit == "us":
        return _to_timestamp
    if pa.types.is_binary(dtype) or pa.types.is_large_binary(dtype):
        return _to_binary
    if pa.types.is_struct(dtype):
        return _to_struct
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype):
        return _to_list
    if pa.types.is_map(dtype):
        return _to_map
    raise TypeError(f"coercion into column type {dtype} is not supported")


def _compile(dtype: pa.DataType, name: str = "", nullable: bool = True) -> _Column:
    convert = _value_function(dtype)
    column = _Column(name, nullable, dtype, _type_name(dtype), convert)
    if pa.types.is_integer(dtype):
        low, high = _int_bounds(dtype)
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
def _compiled_type(dtype: pa.DataType) -> _Column:
    return _compile(dtype)


_COMPILED_SCHEMAS: dict[int, tuple[pa.Schema, tuple[_Column, ...], frozenset[str]]] = {}


def _compiled_schema(schema: pa.Schema) -> tuple[tuple[_Column, ...], frozenset[str]]:
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
        raise MessageError(STAGE, f"the message is {_kind(document)} {_show(document)}, not an object")
    columns, names = _compiled_schema(schema)
    walk = _Walk(options)
    row = _coerce_members(document, columns, names, "", "", walk)
    return row, walk.unknown


# ---------------------------------------------------------------------------------------------
# Fast lane: Arrow kernels, one column at a time
# ---------------------------------------------------------------------------------------------


@dataclass
class _Unknown:
    """Values dropped from the output because their field is not in the schema."""

    values: pa.Array | pa.ChunkedArray
    """One entry per slot: dropped when non-null (or, when ``summed``, a count of dropped values)."""
    rows: pa.Array | None = None
    """Position of each entry in the array it was dropped from (lists lift it to their own rows, up
    to the table's), or None when the entries are those positions themselves."""
    summed: bool = False


@dataclass
class _Converted:
    array: pa.Array
    """The values in the target type; arbitrary where ``fail`` is set (those rows are dropped)."""
    fail: pa.Array | None = None
    """Boolean, no nulls, aligned with the input: True where the row must be declined. None: none."""
    unknown: list[_Unknown] = field(default_factory=list)


def _or(left: pa.Array | None, right: pa.Array | None) -> pa.Array | None:
    if left is None:
        return right
    if right is None:
        return left
    return pc.or_(left, right)


def _any(mask: pa.Array | None) -> bool:
    return mask is not None and bool(pc.any(mask).as_py())


def _fail_unless(ok: pa.Array) -> pa.Array | None:
    """Turn a validity test (null where the input is null: nothing to check) into a fail mask."""
    fail = pc.invert(pc.fill_null(ok, True))
    return fail if _any(fail) else None


def _fail_where(bad: pa.Array) -> pa.Array | None:
    fail = pc.fill_null(bad, False)
    return fail if _any(fail) else None


def _mask_of_rows(length: int, rows: list[int]) -> pa.Array:
    flags = [False] * length
    for row in rows:
        flags[row] = True
    return pa.array(flags, pa.bool_())


def _decline_non_null(values: pa.Array, target: pa.DataType) -> _Converted:
    """Every non-null value is declined (the reference lane rejects it, or its result is unprovable)."""
    fail = values.is_valid() if values.null_count < len(values) else None
    return _Converted(pa.nulls(len(values), target), fail)


def _null_out(values: pa.Array, fail: pa.Array | None) -> pa.Array:
    """Null the failing slots, so that a safe kernel run afterwards only sees convertible values."""
    if fail is None:
        return values
    return pc.if_else(fail, pa.scalar(None, values.type), values)


def _between(values: pa.Array, low: Any, high: Any) -> pa.Array:
    return pc.and_(pc.greater_equal(values, low), pc.less_equal(values, high))


def _int_range_ok(values: pa.Array, low: int, high: int) -> pa.Array | None:
    """``low <= v <= high`` for an integer array, bounds clamped to its type; None: always true."""
    source_low, source_high = _int_bounds(values.type)
    if low <= source_low and source_high <= high:
        return None
    return _between(
        values,
        pa.scalar(max(low, source_low), values.type),
        pa.scalar(min(high, source_high), values.type),
    )


def _cast_isolating(values: pa.Array, target: pa.DataType) -> tuple[pa.Array, pa.Array | None]:
    """A safe cast; where it fails, bisect so that only the failing values are declined."""
    try:
        return pc.cast(values, target), None
    except pa.ArrowInvalid:
        pass  # some value does not convert: find which ones below

    def attempt(chunk: list[int]) -> pa.Array:
        # Bisection keeps chunks contiguous, so a zero-copy slice stands for the chunk.
        return pc.cast(values.slice(chunk[0], len(chunk)), target)

    _, failures = isolate_failures(list(range(len(values))), attempt, (pa.ArrowInvalid,))
    fail = _mask_of_rows(len(values), [position for position, _ in failures])
    return pc.cast(_null_out(values, fail), target), fail


_UNCONVERTIBLE = object()
"""An Arrow value with no Python equivalent (a nanosecond timestamp, a map with duplicate keys)."""
_ARROW_TO_PYTHON_ERRORS = (pa.ArrowException, ValueError, KeyError, OverflowError)


def _python_values(values: pa.Array) -> list[Any]:
    try:
        return list(values.to_pylist(maps_as_pydicts="strict"))
    except _ARROW_TO_PYTHON_ERRORS:
        converted: list[Any] = []
        for index in range(len(values)):
            try:
                converted.append(values[index].as_py(maps_as_pydicts="strict"))
            except _ARROW_TO_PYTHON_ERRORS:
                converted.append(_UNCONVERTIBLE)
        return converted


def _holds_inexact_float(value: Any) -> bool:
    """A float that may be a rounded JSON integer (see _EXACT_FLOAT_LIMIT), at any depth."""
    if isinstance(value, float):
        return not abs(value) < _EXACT_FLOAT_LIMIT
    if isinstance(value, dict):
        return any(_holds_inexact_float(item) for item in value.values())
    if isinstance(value, list):
        return any(_holds_inexact_float(item) for item in value)
    return False


def _per_value(values: pa.Array, target: pa.DataType, schema_path: str, options: CoercionOptions) -> _Converted:
    """Convert with the reference function, value by value: sound for any pair, slow."""
    column = _compiled_type(target)
    converted: list[Any] = []
    fails: list[int] = []
    counts: list[int] = []
    for index, value in enumerate(_python_values(values)):
        walk = _Walk(options)
        if value is None:
            converted.append(None)
        elif value is _UNCONVERTIBLE or _holds_inexact_float(value):
            converted.append(None)
            fails.append(index)
        else:
            try:
                converted.append(column.convert(value, column, schema_path, schema_path, walk))
            except MessageError:
                converted.append(None)
                fails.append(index)
        counts.append(walk.unknown)
    unknown = [_Unknown(pa.array(counts, pa.int64()), summed=True)] if any(counts) else []
    fail = _mask_of_rows(len(values), fails) if fails else None
    return _Converted(pa.array(converted, type=target), fail, unknown)


def _patch_per_value(
    converted: _Converted,
    values: pa.Array,
    subset: pa.Array | None,
    target: pa.DataType,
    schema_path: str,
    options: CoercionOptions,
) -> _Converted:
    """Redo the ``subset`` rows value by value: rare shapes the kernel leaves out (a 25-digit
    integer string, a decimal with an exponent) cost a Python call each, not a declined document."""
    if subset is None:
        return converted
    subset = pc.fill_null(subset, False)
    if not _any(subset):
        return converted
    positions = pc.indices_nonzero(subset)
    patch = _per_value(values.take(positions), target, schema_path, options)
    array = pc.replace_with_mask(converted.array, subset, patch.array)
    base_fail = converted.fail if converted.fail is not None else pa.repeat(False, len(values))
    patch_fail = patch.fail if patch.fail is not None else pa.repeat(False, len(positions))
    fail = pc.replace_with_mask(base_fail, subset, patch_fail)
    unknown = converted.unknown + [
        _Unknown(u.values, positions if u.rows is None else pc.take(positions, u.rows), u.summed) for u in patch.unknown
    ]
    return _Converted(array, fail if _any(fail) else None, unknown)


def _convert(values: pa.Array, target: pa.DataType, schema_path: str, options: CoercionOptions) -> _Converted:
    """One column (or nested child) of any Arrow type → ``target``; rows that cannot be, declined."""
    _value_function(target)  # raises TypeError for a column type the reference lane does not support
    source = values.type
    if pa.types.is_dictionary(source):
        values = values.dictionary_decode()
        source = values.type
    if pa.types.is_large_string(source) or pa.types.is_string_view(source):
        values = pc.cast(values, pa.string())
        source = values.type
    if pa.types.is_null(source) or values.null_count == len(values):
        return _Converted(pa.nulls(len(values), target))
    if source == target and not pa.types.is_nested(target) and not pa.types.is_decimal(target):
        return _identity(values, target)
    if pa.types.is_string(target):
        return _to_string_column(values, target)
    if pa.types.is_boolean(source) and not pa.types.is_boolean(target):
        return _decline_non_null(values, target)  # a boolean is only a boolean, or "true"/"false"
    if pa.types.is_integer(target):
        return _to_integer_column(values, target, schema_path, options)
    if pa.types.is_floating(target):
        return _to_floating_column(values, target, schema_path, options)
    if pa.types.is_boolean(target):
        return _to_boolean_column(values, target)
    if pa.types.is_decimal(target):
        return _to_decimal_column(values, target, schema_path, options)
    if pa.types.is_date32(target):
        return _to_date_column(values, target, schema_path, options)
    if pa.types.is_timestamp(target):
        return _to_timestamp_column(values, target, schema_path, options)
    if pa.types.is_binary(target):
        return _to_binary_column(values, target, schema_path, options)
    if pa.types.is_struct(target):
        return _to_struct_column(values, target, schema_path, options)
    if pa.types.is_list(target):
        return _to_list_column(values, target, schema_path, options)
    if pa.types.is_map(target):
        return _to_map_column(values, target, schema_path, options)
    raise TypeError(f"coercion into column type {target} is not supported")


def _identity(values: pa.Array, target: pa.DataType) -> _Converted:
    """Same type: only the values the reference lane would reject are declined."""
    if pa.types.is_floating(target):
        return _Converted(values, _fail_unless(pc.is_finite(values)))
    if pa.types.is_date32(target):
        return _Converted(values, _fail_unless(_between(values, pa.scalar(dt.date.min), pa.scalar(dt.date.max))))
    if pa.types.is_timestamp(target):
        return _Converted(values, _fail_unless(_between(pc.cast(values, pa.int64()), _MIN_US, _MAX_US)))
    return _Converted(values)


def _to_string_column(values: pa.Array, target: pa.DataType) -> _Converted:
    source = values.type
    if pa.types.is_integer(source) or pa.types.is_boolean(source):
        # Arrow prints integers in decimal and booleans as true/false: the reference's JSON text.
        return _Converted(pc.cast(values, target))
    if pa.types.is_binary(source) or pa.types.is_large_binary(source) or pa.types.is_fixed_size_binary(source):
        # The cast validates UTF-8, as bytes.decode("utf-8") does; invalid values are isolated.
        array, fail = _cast_isolating(pc.cast(values, pa.binary()), target)
        return _Converted(array, fail)
    # Floats, decimals, temporals, structs and lists: the document's own text is unknowable here
    # (an inferred double holds 1.0 for a JSON 1, a decimal column pads 1.5 to 1.50).
    return _decline_non_null(values, target)


def _to_integer_column(values: pa.Array, target: pa.DataType, schema_path: str, options: CoercionOptions) -> _Converted:
    source = values.type
    low, high = _int_bounds(target)
    if pa.types.is_integer(source):
        ok = _int_range_ok(values, low, high)
        fail = None if ok is None else _fail_unless(ok)
        return _Converted(pc.cast(values, target, safe=False), fail)
    if pa.types.is_floating(source):
        doubles = pc.cast(values, pa.float64())
        ok = pc.and_(
            pc.and_(pc.is_finite(doubles), pc.equal(pc.trunc(doubles), doubles)),
            _between(doubles, float(max(low, -_EXACT_FLOAT_LIMIT)), float(min(high, _EXACT_FLOAT_LIMIT - 1))),
        )
        fail = _fail_unless(ok)
        return _Converted(pc.cast(_null_out(doubles, fail), target), fail)
    if pa.types.is_string(source):
        text_fail = _fail_unless(pc.match_substring_regex(values, _RE2_INTEGER))
        # Arrow's integer parser refuses a leading "+"; the regex allows nothing else it refuses.
        numbers = pc.cast(pc.utf8_ltrim(_null_out(values, text_fail), "+"), pa.int64())
        ok = _int_range_ok(numbers, low, high)
        fail = _or(text_fail, None if ok is None else _fail_unless(ok))
        converted = _Converted(pc.cast(numbers, target, safe=False), fail)
        long_digits = (
            None if text_fail is None else pc.and_(text_fail, pc.match_substring_regex(values, _RE2_ANY_INTEGER))
        )
        return _patch_per_value(converted, values, long_digits, target, schema_path, options)
    return _per_value(values, target, schema_path, options)


def _to_floating_column(
    values: pa.Array, target: pa.DataType, schema_path: str, options: CoercionOptions
) -> _Converted:
    source = values.type
    text_fail = None
    if pa.types.is_floating(source):
        doubles = pc.cast(values, pa.float64())  # exact from float16/float32
    elif pa.types.is_integer(source):
        # Unsafe: Arrow refuses |v| > 2**53 in a safe cast; the C conversion rounds half-to-even,
        # exactly like Python's float(int).
        doubles = pc.cast(values, pa.float64(), safe=False)
    elif pa.types.is_string(source):
        text_fail = _fail_unless(pc.match_substring_regex(values, _RE2_NUMBER))
        # Arrow parses decimal text correctly rounded, as float() does; overflow gives inf.
        doubles, cast_fail = _cast_isolating(_null_out(values, text_fail), pa.float64())
        text_fail = _or(text_fail, cast_fail)
    else:
        return _per_value(values, target, schema_path, options)
    # float32: from the double, like the reference (double rounding included), inf where it overflows.
    result = doubles if target == pa.float64() else pc.cast(doubles, target, safe=False)
    return _Converted(result, _or(text_fail, _fail_unless(pc.is_finite(result))))


def _to_boolean_column(values: pa.Array, target: pa.DataType) -> _Converted:
    if pa.types.is_string(values.type):
        fail = _fail_unless(pc.match_substring_regex(values, _RE2_BOOLEAN))
        # Once validated, "true" is the only 4-character spelling.
        return _Converted(pc.equal(pc.utf8_length(values), 4), fail)
    return _decline_non_null(values, target)  # numbers are not booleans


def _decimal_range_fail(values: pa.Array, target: pa.DataType) -> pa.Array | None:
    """Decimal values with more integer digits than ``target`` allows.

    Needed before any decimal cast: Arrow's rescaling does not detect int128 overflow (89910 cast
    from decimal(5,0) to decimal(38,38) comes out as 0.593...), and Arrow never checks that an
    array's values fit its own declared precision."""
    integer_digits = target.precision - target.scale
    if integer_digits + 1 + values.type.scale > 76:
        return None  # the bound has no decimal256 at this scale; a valid source cannot exceed it
    widened = pc.cast(values, pa.decimal256(76, values.type.scale))  # same scale: exact
    bound = pa.scalar(Decimal(f"1E{integer_digits}"), widened.type)
    negative_bound = pa.scalar(Decimal(f"-1E{integer_digits}"), widened.type)
    return _fail_unless(pc.and_(pc.greater(widened, negative_bound), pc.less(widened, bound)))


def _decimal_text_pattern(target: pa.DataType) -> str:
    """Decimal text Arrow's parser reads exactly into ``target``: plain digits, at most the column's
    integer and fraction digits. Arrow silently overflows on longer text (40 digits parse to a
    wrong value), so anything else (exponents, extra zeros) goes value by value."""
    integer_digits, scale = target.precision - target.scale, target.scale
    integer = f"[0-9]{{1,{integer_digits}}}" if integer_digits else "0"
    if not scale:
        return rf"^[+-]?{integer}\.?$"
    return rf"^[+-]?(?:{integer}(?:\.[0-9]{{0,{scale}}})?|\.[0-9]{{1,{scale}}})$"


def _to_decimal_column(values: pa.Array, target: pa.DataType, schema_path: str, options: CoercionOptions) -> _Converted:
    source, scale = values.type, target.scale
    if pa.types.is_decimal(source):
        fail = _decimal_range_fail(values, target)
        if source == target:
            return _Converted(values, fail)
        # Within range, the safe cast can only fail on rescaling with loss (1.255 into scale 2).
        array, cast_fail = _cast_isolating(_null_out(values, fail), target)
        return _Converted(array, _or(fail, cast_fail))
    if pa.types.is_integer(source) and scale <= 18:
        limit = 10 ** (target.precision - scale) - 1
        ok = _int_range_ok(values, -limit, limit)
        fail = None if ok is None else _fail_unless(ok)
        # Widen exactly first (Arrow wants the integer type's digits plus the scale: 20 for uint64,
        # 19 for the rest once in int64); after the range check the narrowing cast loses nothing.
        if source == pa.uint64():
            widened = pc.cast(values, pa.decimal128(20 + scale, scale))
        else:
            widened = pc.cast(pc.cast(values, pa.int64()), pa.decimal128(19 + scale, scale))
        return _Converted(pc.cast(widened, target, safe=False), fail)
    if pa.types.is_string(source):
        not_plain = _fail_unless(pc.match_substring_regex(values, _decimal_text_pattern(target)))
        array, cast_fail = _cast_isolating(_null_out(values, not_plain), target)
        converted = _Converted(array, _or(not_plain, cast_fail))
        other_numbers = None if not_plain is None else pc.and_(not_plain, pc.match_substring_regex(values, _RE2_NUMBER))
        return _patch_per_value(converted, values, other_numbers, target, schema_path, options)
    return _per_value(values, target, schema_path, options)


def _epoch_range_ok(values: pa.Array, per_unit: int) -> pa.Array | None:
    """Integer epochs whose microsecond value lies in years 1..9999."""
    return _int_range_ok(values, -(-_MIN_US // per_unit), _MAX_US // per_unit)


def _integer_epochs(values: pa.Array, target: pa.DataType, schema_path: str, options: CoercionOptions) -> _Converted:
    """Integer epochs in the column's unit → date32 or timestamp[us] (a _Converted of ``target``)."""
    per_unit = _us_per_unit(schema_path, options)
    ok = _epoch_range_ok(values, per_unit)
    fail = None if ok is None else _fail_unless(ok)
    ints = pc.cast(_null_out(values, fail), pa.int64())  # in range now: a uint64 cannot wrap
    if pa.types.is_date32(target):
        unit = {1: "us", 1_000: "ms", _US_PER_SECOND: "s"}[per_unit]
        # Arrow floors to the day, like the reference's // division.
        return _Converted(pc.cast(pc.cast(ints, pa.timestamp(unit)), target), fail)
    return _Converted(pc.cast(pc.multiply(ints, per_unit), target), fail)  # exact once in range


def _float_epochs(values: pa.Array, target: pa.DataType, schema_path: str, options: CoercionOptions) -> _Converted:
    """Float epochs: integral ones (what an epoch read as float64 from JSON usually is) through the
    integer kernels, exactly; fractional ones value by value (half-to-even rounding to the µs)."""
    doubles = pc.cast(values, pa.float64())
    integral = pc.and_(
        pc.and_(pc.is_finite(doubles), pc.equal(pc.trunc(doubles), doubles)),
        _between(doubles, float(-_EXACT_FLOAT_LIMIT + 1), float(_EXACT_FLOAT_LIMIT - 1)),
    )
    other = _fail_unless(integral)
    converted = _integer_epochs(pc.cast(_null_out(doubles, other), pa.int64()), target, schema_path, options)
    converted.fail = _or(converted.fail, other)
    return _patch_per_value(converted, values, other, target, schema_path, options)


def _to_date_column(values: pa.Array, target: pa.DataType, schema_path: str, options: CoercionOptions) -> _Converted:
    source = values.type
    fail = None
    if pa.types.is_string(source):
        fail = _fail_unless(pc.match_substring_regex(values, _RE2_DATE))
        days, cast_fail = _cast_isolating(_null_out(values, fail), target)  # Arrow rejects Feb 30
        fail = _or(fail, cast_fail)
    elif pa.types.is_integer(source):
        return _integer_epochs(values, target, schema_path, options)
    elif pa.types.is_floating(source):
        return _float_epochs(values, target, schema_path, options)
    elif pa.types.is_timestamp(source):
        if source.unit != "ns":
            # Arrow's timestamp → date32 cast wraps around silently beyond int32 days: bound first.
            ok = _epoch_range_ok(pc.cast(values, pa.int64()), _US_PER_UNIT[source.unit])
            fail = None if ok is None else _fail_unless(ok)
        if source.tz is not None:
            values = pc.cast(values, pa.timestamp(source.unit, "UTC"))  # the UTC date, not the local one
        days = pc.cast(_null_out(values, fail), target)
    else:
        return _per_value(values, target, schema_path, options)
    in_range = _between(days, pa.scalar(dt.date.min), pa.scalar(dt.date.max))
    return _Converted(days, _or(fail, _fail_unless(in_range)))


def _timestamp_text_to_us(values: pa.Array) -> tuple[pa.Array, pa.Array | None]:
    """RFC 3339 / ``YYYY-MM-DD HH:MM:SS`` strings → int64 microseconds (UTC), vectorised."""
    zoned = pc.match_substring_regex(values, _RE2_TS_ZONED)
    fail = None
    if (pc.sum(zoned).as_py() or 0) != len(values) - values.null_count:
        # Not all in the form Arrow reads directly: append Z to the zone-less ones, rewrite the
        # rare ones (lower-case t/z, 7-9 fraction digits), decline what the grammar refuses.
        naive = pc.match_substring_regex(values, _RE2_TS_NAIVE)
        text = pc.if_else(naive, pc.binary_join_element_wise(values, "Z", ""), values)
        other = pc.fill_null(pc.invert(pc.or_(zoned, naive)), False)
        if _any(other):
            full = pc.match_substring_regex(values, _RE2_TS_FULL)
            rewritten = pc.replace_substring_regex(pc.ascii_upper(values), r"(\.[0-9]{6})[0-9]+", r"\1")
            rewritten = pc.replace_substring_regex(rewritten, _RE2_TS_NO_ZONE, r"\1Z")
            text = pc.if_else(pc.and_(other, full), rewritten, text)
            fail = _fail_where(pc.and_(other, pc.invert(full)))
        values = _null_out(text, fail)
    stamps, cast_fail = _cast_isolating(values, pa.timestamp("us", "UTC"))  # Feb 30 fails the cast
    return pc.cast(stamps, pa.int64()), _or(fail, cast_fail)


def _to_timestamp_column(
    values: pa.Array, target: pa.DataType, schema_path: str, options: CoercionOptions
) -> _Converted:
    source = values.type
    fail = None
    if pa.types.is_string(source):
        micros, fail = _timestamp_text_to_us(values)
    elif pa.types.is_integer(source):
        return _integer_epochs(values, target, schema_path, options)
    elif pa.types.is_floating(source):
        return _float_epochs(values, target, schema_path, options)
    elif pa.types.is_timestamp(source):
        # Arrow keeps the UTC instant when a timestamp changes zone or drops it: aware → UTC, naive
        # taken as UTC, as the reference does.
        ticks = pc.cast(values, pa.int64())
        if source.unit == "ns":
            whole = pc.multiply(pc.divide(ticks, 1_000), 1_000)
            fail = _fail_unless(pc.equal(whole, ticks))  # sub-microsecond values: no Python twin
            micros = pc.divide(ticks, 1_000)
        else:
            per_unit = _US_PER_UNIT[source.unit]
            ok = _epoch_range_ok(ticks, per_unit)
            fail = None if ok is None else _fail_unless(ok)
            micros = pc.multiply(ticks, per_unit)
    elif pa.types.is_date32(source):
        days = pc.cast(pc.cast(values, pa.int32()), pa.int64())
        fail = _fail_unless(pc.and_(pc.greater_equal(days, _MIN_DAY), pc.less_equal(days, _MAX_DAY)))
        micros = pc.multiply(days, _US_PER_DAY)
    else:
        return _per_value(values, target, schema_path, options)
    fail = _or(fail, _fail_unless(_between(micros, _MIN_US, _MAX_US)))
    return _Converted(pc.cast(micros, target), fail)


def _to_binary_column(values: pa.Array, target: pa.DataType, schema_path: str, options: CoercionOptions) -> _Converted:
    source = values.type
    if pa.types.is_large_binary(source) or pa.types.is_fixed_size_binary(source) or pa.types.is_binary_view(source):
        return _Converted(pc.cast(values, target))
    if pa.types.is_string(source):
        return _per_value(values, target, schema_path, options)  # base64: no Arrow kernel
    return _decline_non_null(values, target)


def _to_struct_column(values: pa.Array, target: pa.DataType, schema_path: str, options: CoercionOptions) -> _Converted:
    source = values.type
    if pa.types.is_map(source):
        return _per_value(values, target, schema_path, options)
    if not pa.types.is_struct(source):
        return _decline_non_null(values, target)
    length = len(values)
    children = values.flatten()  # row-aligned, with the struct's own nulls merged in
    by_name: dict[str, int] = {}
    for index in range(source.num_fields):
        by_name.setdefault(source.field(index).name, index)
    present = values.is_valid() if values.null_count else None
    converted_children: list[pa.Array] = []
    fail: pa.Array | None = None
    unknown: list[_Unknown] = []
    for member in target:
        found = by_name.get(member.name)
        if found is None:
            child = _Converted(pa.nulls(length, member.type))
        else:
            child = _convert(children[found], member.type, f"{schema_path}.{member.name}", options)
        converted_children.append(child.array)
        fail = _or(fail, child.fail)
        unknown.extend(child.unknown)
        if not member.nullable and child.array.null_count:
            missing = child.array.is_null() if present is None else pc.and_(child.array.is_null(), present)
            fail = _or(fail, _fail_where(missing))
    wanted = set(target.names)
    unknown.extend(_Unknown(children[i]) for i in range(source.num_fields) if source.field(i).name not in wanted)
    mask = values.is_null() if values.null_count else None
    array = pa.StructArray.from_arrays(converted_children, fields=list(target), mask=mask)
    return _Converted(array, fail, unknown)


def _list_layout(values: pa.Array) -> tuple[pa.Array, pa.Array | None]:
    """Offsets (int32) of the non-null lists' elements as list_flatten lays them out, and the null mask."""
    lengths = pc.fill_null(pc.list_value_length(values), 0)
    offsets = pa.concat_arrays([pa.array([0], pa.int32()), pc.cast(pc.cumulative_sum(lengths), pa.int32())])
    mask = values.is_null() if values.null_count else None
    return offsets, mask


def _lift(
    length: int, parents: pa.Array, element_fail: pa.Array | None, element_unknown: list[_Unknown]
) -> tuple[pa.Array | None, list[_Unknown]]:
    """Element-level failures and unknown values → those of the rows holding the elements."""
    fail = None
    if element_fail is not None:
        # Rare (a bad element): a Python pass over the failing rows only.
        fail = _mask_of_rows(length, pc.unique(pc.filter(parents, element_fail)).to_pylist())
    unknown = [
        _Unknown(u.values, parents if u.rows is None else pc.take(parents, u.rows), u.summed) for u in element_unknown
    ]
    return fail, unknown


def _element_fail(element: _Converted, field_: pa.Field) -> pa.Array | None:
    fail = element.fail
    if not field_.nullable and element.array.null_count:
        fail = _or(fail, _fail_where(element.array.is_null()))
    return fail


def _to_list_column(values: pa.Array, target: pa.DataType, schema_path: str, options: CoercionOptions) -> _Converted:
    source = values.type
    if not (pa.types.is_list(source) or pa.types.is_large_list(source) or pa.types.is_fixed_size_list(source)):
        return _decline_non_null(values, target)
    offsets, mask = _list_layout(values)
    element = _convert(pc.list_flatten(values), target.value_type, schema_path, options)
    array = pa.ListArray.from_arrays(offsets, element.array, type=target, mask=mask)
    element_fail = _element_fail(element, target.value_field)
    if element_fail is None and not element.unknown:
        return _Converted(array)
    fail, unknown = _lift(len(values), pc.list_parent_indices(array), element_fail, element.unknown)
    return _Converted(array, fail, unknown)


def _to_map_column(values: pa.Array, target: pa.DataType, schema_path: str, options: CoercionOptions) -> _Converted:
    source = values.type
    if not pa.types.is_map(source):
        return _decline_non_null(values, target)  # an inferred struct cannot tell absent from null
    string_keys = pa.types.is_string(source.key_type) or pa.types.is_large_string(source.key_type)
    if not (string_keys and pa.types.is_string(target.key_type)):
        # Converting keys may make two equal (the reference refuses that): value by value.
        return _per_value(values, target, schema_path, options)
    entries_type = pa.struct([source.key_field, source.item_field])
    as_lists = pc.cast(values, pa.list_(pa.field("entries", entries_type, nullable=False)))
    offsets, mask = _list_layout(as_lists)
    keys, items = pc.list_flatten(as_lists).flatten()
    keys = pc.cast(keys, pa.string())
    item = _convert(items, target.item_type, schema_path, options)
    array = pa.MapArray.from_arrays(offsets, keys, item.array, type=target, mask=mask)
    item_fail = _element_fail(item, target.item_field)
    if item_fail is None and not item.unknown:
        return _Converted(array)
    fail, unknown = _lift(len(values), pc.list_parent_indices(as_lists), item_fail, item.unknown)
    return _Converted(array, fail, unknown)


def _column_array(column: pa.ChunkedArray) -> pa.Array:
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def _count_unknown(unknown: list[_Unknown], keep: pa.Array | None) -> int:
    total = 0
    for dropped in unknown:
        entries = dropped.values
        if keep is not None:
            entries = pc.filter(entries, keep if dropped.rows is None else pc.take(keep, dropped.rows))
        if dropped.summed:
            total += int(pc.sum(entries).as_py() or 0)
        else:
            total += len(entries) - entries.null_count
    return total


def coerce_table(table: pa.Table, schema: pa.Schema, options: CoercionOptions) -> CoercedTable:
    """Convert ``table`` to ``schema`` column by column; decline (``fallback``) what cannot be."""
    length = table.num_rows
    first_position: dict[str, int] = {}
    for position, name in enumerate(table.column_names):
        first_position.setdefault(name, position)
    columns: list[pa.Array] = []
    fail: pa.Array | None = None
    unknown: list[_Unknown] = []
    for column in schema:
        found = first_position.get(column.name)
        if found is None:
            converted = _Converted(pa.nulls(length, column.type))
        else:
            converted = _convert(_column_array(table.column(found)), column.type, column.name, options)
        columns.append(converted.array)
        fail = _or(fail, converted.fail)
        unknown.extend(converted.unknown)
        if not column.nullable and converted.array.null_count:
            fail = _or(fail, converted.array.is_null())
    wanted = set(schema.names)
    unknown.extend(
        _Unknown(table.column(position))
        for position, name in enumerate(table.column_names)
        if name not in wanted and first_position[name] == position
    )
    rows = pa.Table.from_arrays(columns, schema=schema)
    if not _any(fail):
        return CoercedTable(rows, list(range(length)), [], _count_unknown(unknown, None))
    keep = pc.invert(fail)
    return CoercedTable(
        rows=rows.filter(keep),
        kept=pc.indices_nonzero(keep).to_pylist(),
        fallback=pc.indices_nonzero(fail).to_pylist(),
        unknown_fields=_count_unknown(unknown, keep),
    )
