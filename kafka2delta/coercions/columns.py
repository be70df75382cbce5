"""The fast lane: whole Arrow columns converted with Arrow compute kernels (:func:`coerce_table`).

It may decline a row (``fallback``: the caller retries it in the reference lane) but never gives a
value the reference lane would not give the same document. Which source types take which route is
listed in the package docstring.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from kafka2delta.bisection import isolate_failures
from kafka2delta.coercions.common import (
    EXACT_FLOAT_LIMIT,
    MAX_DAY,
    MAX_US,
    MIN_DAY,
    MIN_US,
    RE2_ANY_INTEGER,
    RE2_BOOLEAN,
    RE2_DATE,
    RE2_INTEGER,
    RE2_NUMBER,
    RE2_TS_FULL,
    RE2_TS_NAIVE,
    RE2_TS_NO_ZONE,
    RE2_TS_ZONED,
    US_PER_DAY,
    US_PER_SECOND,
    US_PER_UNIT,
    CoercionOptions,
    int_bounds,
    us_per_unit,
)
from kafka2delta.coercions.documents import compiled_type, value_function
from kafka2delta.coercions.values import Walk
from kafka2delta.errors import MessageError


@dataclass
class CoercedTable:
    """What :func:`coerce_table` made of a table: the rows it converted and those it declined."""

    rows: pa.Table
    """The rows that converted, in ``schema`` (same field order, types and nullability)."""
    kept: list[int]
    """For each row of ``rows``, its position in the input table (ascending)."""
    fallback: list[int]
    """Input positions the fast lane could not convert; the caller retries them with coerce_document."""
    unknown_fields: int = 0
    """Non-null values dropped because their field is not in ``schema`` (top level and nested), kept rows only."""


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
    source_low, source_high = int_bounds(values.type)
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
    """A float that may be a rounded JSON integer (see EXACT_FLOAT_LIMIT), at any depth."""
    if isinstance(value, float):
        return not abs(value) < EXACT_FLOAT_LIMIT
    if isinstance(value, dict):
        return any(_holds_inexact_float(item) for item in value.values())
    if isinstance(value, list):
        return any(_holds_inexact_float(item) for item in value)
    return False


def _per_value(values: pa.Array, target: pa.DataType, schema_path: str, options: CoercionOptions) -> _Converted:
    """Convert with the reference function, value by value: sound for any pair, slow."""
    column = compiled_type(target)
    converted: list[Any] = []
    fails: list[int] = []
    counts: list[int] = []
    for index, value in enumerate(_python_values(values)):
        walk = Walk(options)
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
    value_function(target)  # raises TypeError for a column type the reference lane does not support
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
        return _Converted(values, _fail_unless(_between(pc.cast(values, pa.int64()), MIN_US, MAX_US)))
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
    low, high = int_bounds(target)
    if pa.types.is_integer(source):
        ok = _int_range_ok(values, low, high)
        fail = None if ok is None else _fail_unless(ok)
        return _Converted(pc.cast(values, target, safe=False), fail)
    if pa.types.is_floating(source):
        doubles = pc.cast(values, pa.float64())
        ok = pc.and_(
            pc.and_(pc.is_finite(doubles), pc.equal(pc.trunc(doubles), doubles)),
            _between(doubles, float(max(low, -EXACT_FLOAT_LIMIT)), float(min(high, EXACT_FLOAT_LIMIT - 1))),
        )
        fail = _fail_unless(ok)
        return _Converted(pc.cast(_null_out(doubles, fail), target), fail)
    if pa.types.is_string(source):
        text_fail = _fail_unless(pc.match_substring_regex(values, RE2_INTEGER))
        # Arrow's integer parser refuses a leading "+"; the regex allows nothing else it refuses.
        numbers = pc.cast(pc.utf8_ltrim(_null_out(values, text_fail), "+"), pa.int64())
        ok = _int_range_ok(numbers, low, high)
        fail = _or(text_fail, None if ok is None else _fail_unless(ok))
        converted = _Converted(pc.cast(numbers, target, safe=False), fail)
        long_digits = (
            None if text_fail is None else pc.and_(text_fail, pc.match_substring_regex(values, RE2_ANY_INTEGER))
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
        text_fail = _fail_unless(pc.match_substring_regex(values, RE2_NUMBER))
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
        fail = _fail_unless(pc.match_substring_regex(values, RE2_BOOLEAN))
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
        other_numbers = None if not_plain is None else pc.and_(not_plain, pc.match_substring_regex(values, RE2_NUMBER))
        return _patch_per_value(converted, values, other_numbers, target, schema_path, options)
    return _per_value(values, target, schema_path, options)


def _epoch_range_ok(values: pa.Array, per_unit: int) -> pa.Array | None:
    """Integer epochs whose microsecond value lies in years 1..9999."""
    return _int_range_ok(values, -(-MIN_US // per_unit), MAX_US // per_unit)


def _integer_epochs(values: pa.Array, target: pa.DataType, schema_path: str, options: CoercionOptions) -> _Converted:
    """Integer epochs in the column's unit → date32 or timestamp[us] (a _Converted of ``target``)."""
    per_unit = us_per_unit(schema_path, options)
    ok = _epoch_range_ok(values, per_unit)
    fail = None if ok is None else _fail_unless(ok)
    ints = pc.cast(_null_out(values, fail), pa.int64())  # in range now: a uint64 cannot wrap
    if pa.types.is_date32(target):
        unit = {1: "us", 1_000: "ms", US_PER_SECOND: "s"}[per_unit]
        # Arrow floors to the day, like the reference's // division.
        return _Converted(pc.cast(pc.cast(ints, pa.timestamp(unit)), target), fail)
    return _Converted(pc.cast(pc.multiply(ints, per_unit), target), fail)  # exact once in range


def _float_epochs(values: pa.Array, target: pa.DataType, schema_path: str, options: CoercionOptions) -> _Converted:
    """Float epochs: integral ones (what an epoch read as float64 from JSON usually is) through the
    integer kernels, exactly; fractional ones value by value (half-to-even rounding to the µs)."""
    doubles = pc.cast(values, pa.float64())
    integral = pc.and_(
        pc.and_(pc.is_finite(doubles), pc.equal(pc.trunc(doubles), doubles)),
        _between(doubles, float(-EXACT_FLOAT_LIMIT + 1), float(EXACT_FLOAT_LIMIT - 1)),
    )
    other = _fail_unless(integral)
    converted = _integer_epochs(pc.cast(_null_out(doubles, other), pa.int64()), target, schema_path, options)
    converted.fail = _or(converted.fail, other)
    return _patch_per_value(converted, values, other, target, schema_path, options)


def _to_date_column(values: pa.Array, target: pa.DataType, schema_path: str, options: CoercionOptions) -> _Converted:
    source = values.type
    fail = None
    if pa.types.is_string(source):
        fail = _fail_unless(pc.match_substring_regex(values, RE2_DATE))
        days, cast_fail = _cast_isolating(_null_out(values, fail), target)  # Arrow rejects Feb 30
        fail = _or(fail, cast_fail)
    elif pa.types.is_integer(source):
        return _integer_epochs(values, target, schema_path, options)
    elif pa.types.is_floating(source):
        return _float_epochs(values, target, schema_path, options)
    elif pa.types.is_timestamp(source):
        if source.unit != "ns":
            # Arrow's timestamp → date32 cast wraps around silently beyond int32 days: bound first.
            ok = _epoch_range_ok(pc.cast(values, pa.int64()), US_PER_UNIT[source.unit])
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
    zoned = pc.match_substring_regex(values, RE2_TS_ZONED)
    fail = None
    if (pc.sum(zoned).as_py() or 0) != len(values) - values.null_count:
        # Not all in the form Arrow reads directly: append Z to the zone-less ones, rewrite the
        # rare ones (lower-case t/z, 7-9 fraction digits), decline what the grammar refuses.
        naive = pc.match_substring_regex(values, RE2_TS_NAIVE)
        text = pc.if_else(naive, pc.binary_join_element_wise(values, "Z", ""), values)
        other = pc.fill_null(pc.invert(pc.or_(zoned, naive)), False)
        if _any(other):
            full = pc.match_substring_regex(values, RE2_TS_FULL)
            rewritten = pc.replace_substring_regex(pc.ascii_upper(values), r"(\.[0-9]{6})[0-9]+", r"\1")
            rewritten = pc.replace_substring_regex(rewritten, RE2_TS_NO_ZONE, r"\1Z")
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
            per_unit = US_PER_UNIT[source.unit]
            ok = _epoch_range_ok(ticks, per_unit)
            fail = None if ok is None else _fail_unless(ok)
            micros = pc.multiply(ticks, per_unit)
    elif pa.types.is_date32(source):
        days = pc.cast(pc.cast(values, pa.int32()), pa.int64())
        fail = _fail_unless(pc.and_(pc.greater_equal(days, MIN_DAY), pc.less_equal(days, MAX_DAY)))
        micros = pc.multiply(days, US_PER_DAY)
    else:
        return _per_value(values, target, schema_path, options)
    fail = _or(fail, _fail_unless(_between(micros, MIN_US, MAX_US)))
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
