"""Protobuf's wire lane: the messages of one schema decoded field by field over the whole batch, straight from
their bytes into Arrow arrays with numpy (no message objects, no per-message call), as Avro's column lane does.

The messages lie end to end in one buffer (``avro_batch.lay_out``); every read is a vector operation over the
messages. A message is read as every standard serializer writes it (protobuf-java, -go, upb, protobuf.js): its
fields in ascending field-number order, each at most once. For each field of the schema, in that order, the
rows whose next tag is the field's read its value and step past it; the others hold the field's default
(implicit presence) or null (explicit presence: messages, ``optional``, proto2).

Like Avro's lane, this one only ever *declines* a message, never decides one: bytes left unread at a message's
end (a field out of order or repeated, an unknown field, a wrong wire type), a length past the end, a varint
longer than 64 bits (a tag or a length longer than 5 bytes), a value outside its field's range, a number a
closed (proto2) enum does not name, invalid UTF-8, a Timestamp outside Python's datetimes, a Decimal finer than
its column's scale: the caller reads
those messages with the protobuf library, which alone makes dead letters.

Schemas it reads: scalars, strings, bytes, enums, nested messages, ``google.protobuf.Timestamp`` and the
wrapper types, and AWS's ``additionalTypes.Decimal`` at a scale of at most 9
(:mod:`~kafka2delta.serialization.protobuf_aws`). A repeated field, a map, a group, a oneof of several fields, a
Decimal at a finer scale, a recursive message or messages
nested deeper than :data:`MAX_MESSAGE_DEPTH` make :func:`wire_reader` answer None: that schema keeps the
protobuf library's lane.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf.descriptor import FieldDescriptor as F  # type: ignore[import-untyped]

from kafka2delta.serialization.avro_batch import (
    ColumnReader,
    Cursor,
    Ints,
    Read,
    byte_strings,
    fixed_width,
    read_double,
    read_float,
    unsigned_varint,
    zigzag,
)
from kafka2delta.serialization.protobuf_aws import FRACTION_DIGITS, decimal_scale, decimal_type, is_aws_decimal
from kafka2delta.serialization.protobuf_indexes import is_repeated

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_UINT32_LIMIT = np.uint64(2**32)
_NO_TAG = np.uint64(2**64 - 1)
"""The tag of a row whose message has no bytes left (no field has it)."""
# Python's datetime range, which the library lane's Timestamp conversion is bound to.
_SECONDS_MIN, _SECONDS_MAX = -62_135_596_800, 253_402_300_799
_MICROS_MIN, _MICROS_MAX = _SECONDS_MIN * 1_000_000, _SECONDS_MAX * 1_000_000 + 999_999

_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5
_SHORT_VARINT_BYTES = 5
MAX_MESSAGE_DEPTH = 64
"""Deepest nesting of message types the lane reads (upb refuses a message nested deeper than 100 levels; the
later stages refuse documents deeper than 64 anyway)."""
_TIMESTAMP = "google.protobuf.Timestamp"
_WRAPPERS = {
    "google.protobuf.DoubleValue",
    "google.protobuf.FloatValue",
    "google.protobuf.Int64Value",
    "google.protobuf.UInt64Value",
    "google.protobuf.Int32Value",
    "google.protobuf.UInt32Value",
    "google.protobuf.BoolValue",
    "google.protobuf.StringValue",
    "google.protobuf.BytesValue",
}


class _Unsupported(Exception):
    """The schema holds a field the wire lane does not read."""


def wire_reader(descriptor: Any, expected: pa.DataType) -> ColumnReader | None:
    """The wire reader of a message type, or None when it holds a field the lane does not read. ``expected`` is
    the Arrow type the library lane gives the message (the reader must give exactly that type)."""
    try:
        arrow, read = _message(descriptor, ())
    except (_Unsupported, RecursionError):
        return None
    if arrow != expected or not isinstance(arrow, pa.StructType) or arrow.num_fields == 0:
        return None
    return ColumnReader(arrow, read)


@dataclass(frozen=True)
class _Field:
    tag: np.uint64
    read: Read
    """Reads the value after the tag."""
    absent: pa.Array
    """A one-element array: the value of a row without the field (its default, or null)."""


def _message(descriptor: Any, stack: tuple[str, ...]) -> tuple[pa.StructType, Read]:
    name = descriptor.full_name
    if name in stack:
        raise _Unsupported(f"recursive message {name}")
    if len(stack) >= MAX_MESSAGE_DEPTH:
        raise _Unsupported(f"message {name} nested {len(stack)} levels deep")
    inner = (*stack, name)
    struct_fields: list[pa.Field] = []
    by_number: list[tuple[int, int, _Field]] = []  # (number, declaration index, field)
    for index, f in enumerate(descriptor.fields):
        oneof = f.containing_oneof
        if oneof is not None and len(oneof.fields) > 1:
            raise _Unsupported(f"oneof {oneof.name}")  # setting one member clears the others
        arrow, wire_type, read = _value(f, inner)
        struct_fields.append(pa.field(f.name, arrow))
        absent = pa.nulls(1, arrow) if f.has_presence else pa.array([_default(f)], arrow)
        by_number.append((f.number, index, _Field(np.uint64(f.number << 3 | wire_type), read, absent)))
    by_number.sort(key=lambda item: item[0])
    struct = pa.struct(struct_fields)
    return struct, _read_message(struct, by_number)


def _read_message(struct: pa.StructType, by_number: list[tuple[int, int, _Field]]) -> Read:
    struct_fields = list(struct)

    def read(cursor: Cursor, rows: Ints, positions: Ints) -> tuple[pa.Array, Ints]:
        ends = cursor.ends[rows]
        positions = positions.copy()
        tags = np.full(len(rows), _NO_TAG, np.uint64)
        after_tags = positions.copy()
        _next_tags(cursor, rows, positions, ends, np.arange(len(rows)), tags, after_tags)
        children: list[pa.Array] = [pa.nulls(0)] * len(struct_fields)
        for _, index, field in by_number:
            which = np.flatnonzero(tags == field.tag)
            if not which.size:
                children[index] = field.absent.take(np.zeros(len(rows), np.int64))
                continue
            values, positions[which] = field.read(cursor, rows[which], after_tags[which])
            tags[which] = _NO_TAG
            _next_tags(cursor, rows, positions, ends, which, tags, after_tags)
            children[index] = _spread(values, which, len(rows), field.absent)
        # A tag left unread (a field out of order, repeated or unknown) leaves its row short of its end:
        # the caller declines it.
        if not children:  # a message type without fields (google.protobuf.Empty): from_arrays would have no rows
            return pa.array([{}] * len(rows), struct), positions
        return pa.StructArray.from_arrays(children, fields=struct_fields), positions

    return read


def _next_tags(
    cursor: Cursor, rows: Ints, positions: Ints, ends: Ints, which: Ints, tags: Any, after_tags: Ints
) -> None:
    """The tags at ``positions`` of the rows ``which`` that have bytes left, and the positions after them."""
    going = which[positions[which] < ends[which]]
    if going.size:
        tags[going], after_tags[going] = _short_varint(cursor, rows[going], positions[going])


def _short_varint(cursor: Cursor, rows: Ints, positions: Ints) -> tuple[Any, Ints]:
    """A tag or a length: a varint the library reads in at most 5 bytes (longer is "wire format corrupt")."""
    values, after = unsigned_varint(cursor, rows, positions)
    cursor.decline(rows, after - positions > _SHORT_VARINT_BYTES)
    return values, after


def _spread(values: pa.Array, which: Ints, count: int, absent: pa.Array) -> pa.Array:
    """``values`` (of the rows ``which``) over ``count`` rows, ``absent`` in the others."""
    if len(which) == count:
        return values
    index = np.full(count, len(values), np.int64)
    index[which] = np.arange(len(values))
    return pa.concat_arrays([values, absent]).take(pa.array(index))


def _default(f: Any) -> Any:
    """The value of an unset field of implicit presence, as the library lane converts it."""
    if f.type == F.TYPE_ENUM:
        names = _enum_names(f)
        return names.get(f.default_value) or str(f.default_value)
    return f.default_value


def _enum_names(f: Any) -> dict[int, str]:
    return {value.number: value.name for value in f.enum_type.values}  # an alias: the last name, as the library


def _value(f: Any, stack: tuple[str, ...]) -> tuple[pa.DataType, int, Read]:
    """(Arrow type, wire type, read) of one field."""
    if is_repeated(f):
        raise _Unsupported(f"repeated field {f.name}")
    kind = f.type
    if kind == F.TYPE_MESSAGE:
        message_type = f.message_type
        name = message_type.full_name
        if name == _TIMESTAMP:
            return pa.timestamp("us", "UTC"), _LENGTH, _embedded(_message(message_type, stack)[1], _timestamp)
        if is_aws_decimal(message_type):
            scale = decimal_scale(f)  # from the field's options, as the library lane's
            if scale > FRACTION_DIGITS:
                raise _Unsupported(f"{name} field {f.name} at scale {scale}")
            return decimal_type(scale), _LENGTH, _embedded(_message(message_type, stack)[1], _decimal(scale))
        arrow, read = _message(message_type, stack)
        if name in _WRAPPERS:
            return arrow.field(0).type, _LENGTH, _embedded(read, _unwrap)
        return arrow, _LENGTH, _embedded(read, None)
    if kind == F.TYPE_ENUM:
        return pa.string(), _VARINT, _enum(_enum_names(f), bool(f.enum_type.is_closed))
    found = _SCALARS.get(kind)
    if found is None:
        raise _Unsupported(f"field {f.name} of type {kind}")  # a group
    return found


def _embedded(read_message: Read, convert: Callable[[Cursor, Ints, pa.StructArray], pa.Array] | None) -> Read:
    """A length-delimited message: its fields read between its own bounds."""

    def read(cursor: Cursor, rows: Ints, positions: Ints) -> tuple[pa.Array, Ints]:
        sizes, starts = _short_varint(cursor, rows, positions)
        ends = cursor.ends[rows]
        signed = sizes.view(np.int64)
        wrong = (signed < 0) | (signed > ends - starts)
        cursor.decline(rows, wrong)
        inner_ends = np.where(wrong, starts, starts + signed)
        inner = Cursor(cursor.buffer, cursor.ends.copy(), cursor.bad)
        inner.ends[rows] = inner_ends
        values, after = read_message(inner, rows, starts)
        cursor.decline(rows, after != inner_ends)
        assert isinstance(values, pa.StructArray)
        return (values if convert is None else convert(cursor, rows, values)), np.where(wrong, ends, inner_ends)

    return read


def _unwrap(cursor: Cursor, rows: Ints, wrapper: pa.StructArray) -> pa.Array:
    return wrapper.field(0)


def _timestamp(cursor: Cursor, rows: Ints, timestamp: pa.StructArray) -> pa.Array:
    seconds = timestamp.field(0).to_numpy(zero_copy_only=False).astype(np.int64)
    nanos = timestamp.field(1).to_numpy(zero_copy_only=False).astype(np.int64)
    wrong = (seconds < _SECONDS_MIN) | (seconds > _SECONDS_MAX)
    micros = np.where(wrong, 0, seconds) * 1_000_000 + nanos // 1000  # floor, as the library lane's timedelta
    wrong |= (micros < _MICROS_MIN) | (micros > _MICROS_MAX)
    cursor.decline(rows, wrong)
    return pa.array(np.where(wrong, 0, micros), pa.timestamp("us", "UTC"))


def _decimal(scale: int) -> Callable[[Cursor, Ints, pa.StructArray], pa.Array]:
    """AWS's Decimal (units, billionths) at a column scale of at most 9: ``units·10^scale + fraction/10^(9-scale)``
    in decimal128 arithmetic, its unscaled digits then read at ``scale``. A fraction finer than the scale is
    declined (the library lane makes it a dead letter naming the field)."""
    step = 10 ** (FRACTION_DIGITS - scale)
    shift = pa.scalar(Decimal(10**scale), pa.decimal128(10, 0))
    arrow = decimal_type(scale)

    def convert(cursor: Cursor, rows: Ints, decimal: pa.StructArray) -> pa.Array:
        units = decimal.field(0).to_numpy(zero_copy_only=False).astype(np.int64)
        fraction = decimal.field(1).to_numpy(zero_copy_only=False).astype(np.int64)
        wrong = fraction % step != 0
        cursor.decline(rows, wrong)
        whole = pc.multiply(pa.array(units).cast(pa.decimal128(19, 0)), shift)
        unscaled = pc.add(whole, pa.array(np.where(wrong, 0, fraction // step)).cast(pa.decimal128(19, 0)))
        return pa.Array.from_buffers(arrow, len(unscaled), [None, unscaled.buffers()[1]], offset=unscaled.offset)

    return convert


def _enum(names: dict[int, str], closed: bool) -> Read:
    numbers = np.array(sorted(names), np.int64)
    symbols = pa.array([names[number] for number in numbers.tolist()], pa.string())

    def read(cursor: Cursor, rows: Ints, positions: Ints) -> tuple[pa.Array, Ints]:
        values, positions = _int32_values(cursor, rows, positions)
        at = np.minimum(np.searchsorted(numbers, values), len(numbers) - 1)
        unnamed = numbers[at] != values
        named = symbols.take(pa.array(np.where(unnamed, 0, at)))
        if not unnamed.any():
            return named, positions
        if closed:  # the library sets the number aside as an unknown field
            cursor.decline(rows, unnamed)
            return named, positions
        # An open enum keeps a number its schema does not name: the library lane's str(number).
        return pc.if_else(pa.array(unnamed), pa.array(values).cast(pa.string()), named), positions

    return read


# --- scalars -------------------------------------------------------------------------------------


def _int64(cursor: Cursor, rows: Ints, positions: Ints) -> tuple[pa.Array, Ints]:
    raw, positions = unsigned_varint(cursor, rows, positions)
    return pa.array(raw.view(np.int64), pa.int64()), positions


def _int32(cursor: Cursor, rows: Ints, positions: Ints) -> tuple[pa.Array, Ints]:
    values, positions = _int32_values(cursor, rows, positions)
    return pa.array(values.astype(np.int32), pa.int32()), positions


def _int32_values(cursor: Cursor, rows: Ints, positions: Ints) -> tuple[Ints, Ints]:
    """Varints of int32 fields and enums: a negative one is written sign-extended to 64 bits; beyond 32 bits the
    library would truncate, the lane declines."""
    raw, positions = unsigned_varint(cursor, rows, positions)
    values = raw.view(np.int64)
    cursor.decline(rows, (values < _INT32_MIN) | (values > _INT32_MAX))
    return values, positions


def _uint32(cursor: Cursor, rows: Ints, positions: Ints) -> tuple[pa.Array, Ints]:
    raw, positions = unsigned_varint(cursor, rows, positions)
    cursor.decline(rows, raw >= _UINT32_LIMIT)
    return pa.array(raw.astype(np.int64), pa.int64()), positions


def _uint64(cursor: Cursor, rows: Ints, positions: Ints) -> tuple[pa.Array, Ints]:
    raw, positions = unsigned_varint(cursor, rows, positions)
    return pa.array(raw, pa.uint64()).cast(pa.decimal128(20, 0)), positions


def _sint64(cursor: Cursor, rows: Ints, positions: Ints) -> tuple[pa.Array, Ints]:
    raw, positions = unsigned_varint(cursor, rows, positions)
    return pa.array(zigzag(raw), pa.int64()), positions


def _sint32(cursor: Cursor, rows: Ints, positions: Ints) -> tuple[pa.Array, Ints]:
    raw, positions = unsigned_varint(cursor, rows, positions)
    cursor.decline(rows, raw >= _UINT32_LIMIT)
    return pa.array(zigzag(raw).astype(np.int32), pa.int32()), positions


def _bool(cursor: Cursor, rows: Ints, positions: Ints) -> tuple[pa.Array, Ints]:
    raw, positions = unsigned_varint(cursor, rows, positions)
    return pa.array(raw != 0, pa.bool_()), positions


def _fixed(size: int, dtype: str, arrow: pa.DataType) -> Read:
    """A little-endian fixed-width integer (``dtype``) as ``arrow``."""

    def read(cursor: Cursor, rows: Ints, positions: Ints) -> tuple[pa.Array, Ints]:
        taken, positions = fixed_width(cursor, rows, positions, size)
        values = taken.view(dtype).reshape(-1)
        return pa.array(values).cast(arrow), positions

    return read


def _sized(arrow: pa.DataType) -> Read:
    def read(cursor: Cursor, rows: Ints, positions: Ints) -> tuple[pa.Array, Ints]:
        sizes, starts = _short_varint(cursor, rows, positions)
        return byte_strings(cursor, rows, starts, sizes.view(np.int64), arrow)

    return read


_SCALARS: dict[int, tuple[pa.DataType, int, Read]] = {
    F.TYPE_DOUBLE: (pa.float64(), _FIXED64, read_double),
    F.TYPE_FLOAT: (pa.float32(), _FIXED32, read_float),
    F.TYPE_INT64: (pa.int64(), _VARINT, _int64),
    F.TYPE_SINT64: (pa.int64(), _VARINT, _sint64),
    F.TYPE_SFIXED64: (pa.int64(), _FIXED64, _fixed(8, "<i8", pa.int64())),
    F.TYPE_UINT64: (pa.decimal128(20, 0), _VARINT, _uint64),
    F.TYPE_FIXED64: (pa.decimal128(20, 0), _FIXED64, _fixed(8, "<u8", pa.decimal128(20, 0))),
    F.TYPE_INT32: (pa.int32(), _VARINT, _int32),
    F.TYPE_SINT32: (pa.int32(), _VARINT, _sint32),
    F.TYPE_SFIXED32: (pa.int32(), _FIXED32, _fixed(4, "<i4", pa.int32())),
    F.TYPE_UINT32: (pa.int64(), _VARINT, _uint32),
    F.TYPE_FIXED32: (pa.int64(), _FIXED32, _fixed(4, "<u4", pa.int64())),
    F.TYPE_BOOL: (pa.bool_(), _VARINT, _bool),
    F.TYPE_STRING: (pa.string(), _LENGTH, _sized(pa.string())),
    F.TYPE_BYTES: (pa.binary(), _LENGTH, _sized(pa.binary())),
}
