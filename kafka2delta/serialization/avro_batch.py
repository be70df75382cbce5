"""Avro's column lane: the datums of one writer schema decoded field by field over the whole batch, straight
into Arrow arrays, with numpy (no per-message reader call, no per-message dict).

The datums are laid end to end in one byte buffer; a cursor holds each message's read position and its end.
Every read is a vector operation over the messages (a varint for all of them, then a string for all of them
…), so a batch costs a few numpy calls per schema field instead of a fastavro call per message.

The lane only ever *declines* a message, never decides one: a datum it cannot prove it read exactly as
fastavro would — a read past the datum's end (truncated), bytes left after it (trailing), a varint longer than
64 bits, a negative length, a union or enum index out of range, invalid UTF-8, an ``int`` beyond 32 bits —
is marked and handed back; the caller reads those with the per-message reader, which alone makes dead letters.
Since each datum is read between its own bounds, a bad datum never shifts its neighbours.

Schemas it reads: records (nested too), null, boolean, int, long, float, double, string, bytes, fixed, enum,
and unions of ``null`` with one other type. Anything else (arrays, maps, other unions, logical types, a
recursive type) makes :func:`column_reader` answer None: that writer schema keeps the per-message lane.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import pyarrow as pa

Bytes = npt.NDArray[np.uint8]
Ints = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]

MAX_VARINT_BYTES = 10
"""A 64-bit varint takes at most 10 bytes (the 10th holding bit 63 only)."""
PADDING = 16
"""Zero bytes after the last datum, so that a read starting inside a datum never leaves the buffer."""
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_OFFSETS_MAX = 2**31 - 1


@dataclass
class Datums:
    """A batch's datums end to end, each with its writer schema."""

    buffer: bytes
    """The datums (and what lies between them), then :data:`PADDING` zero bytes."""
    starts: Ints
    ends: Ints
    """Datum ``i`` is ``buffer[starts[i]:ends[i]]``."""
    schemas: Ints
    """Index into ``schema_ids`` of each datum's writer schema; -1 when the payload is not in the wire format
    (or is missing): the per-message lane says why."""
    schema_ids: list[int]


def lay_out(payloads: Sequence[bytes | None], header: int) -> Datums:
    """Datums behind a Confluent header (``header`` = 5: magic byte 0, big-endian schema id) or bare (0)."""
    present = cast("Sequence[bytes]", payloads)  # until len() says otherwise
    try:
        sizes = np.fromiter(map(len, present), np.int64, len(payloads))
        missing = np.zeros(len(payloads), np.bool_)
        buffer = b"".join(present) + bytes(PADDING)
    except TypeError:  # a missing payload (None): its datum is empty, and not in the wire format
        sizes = np.fromiter((-1 if payload is None else len(payload) for payload in payloads), np.int64, len(payloads))
        missing = sizes < 0
        sizes[missing] = 0
        buffer = b"".join(payload for payload in payloads if payload is not None) + bytes(PADDING)
    ends = np.cumsum(sizes)
    begins = ends - sizes
    if not header:
        return Datums(buffer, begins, ends, np.where(missing, -1, 0), [0])
    data = np.frombuffer(buffer, np.uint8)
    framed = (sizes >= header) & (data[begins] == 0)
    ids = np.zeros(len(sizes), np.int64)
    for k in range(1, header):
        ids = (ids << 8) | data[begins + k]
    schema_ids, schemas = np.unique(ids[framed], return_inverse=True)
    indexes = np.full(len(sizes), -1, np.int64)
    indexes[framed] = schemas
    return Datums(buffer, begins + header, ends, indexes, schema_ids.tolist())


class _Unsupported(Exception):
    """The schema holds a type the column lane does not read."""


@dataclass
class Cursor:
    """The batch's datums end to end (``buffer``), each message's read position and end."""

    buffer: Bytes
    ends: Ints
    bad: Mask
    """Messages the lane declines (their values in the arrays are garbage and must not be used)."""

    def decline(self, rows: Ints, where: Mask) -> None:
        if where.any():
            self.bad[rows[where]] = True


Read = Callable[[Cursor, Ints, Ints], tuple[pa.Array, Ints]]
"""(cursor, message rows, their positions) → (the values of those rows, the positions after them)."""


@dataclass(frozen=True)
class ColumnReader:
    """Reads datums of one record schema into a table typed ``arrow`` (a struct type)."""

    arrow: pa.StructType
    read_record: Read

    def read(self, buffer: bytes, starts: Ints, ends: Ints) -> tuple[pa.Table, Mask]:
        """The table of the datums at ``[starts[i], ends[i])`` of ``buffer``, and the messages declined.

        ``buffer`` must end with :data:`PADDING` bytes that belong to no datum."""
        cursor = Cursor(np.frombuffer(buffer, np.uint8), ends, np.zeros(len(starts), np.bool_))
        rows = np.arange(len(starts), dtype=np.int64)
        array, positions = self.read_record(cursor, rows, starts)
        cursor.decline(rows, positions != ends)  # trailing bytes (or a read past the end)
        assert isinstance(array, pa.StructArray)
        table = pa.Table.from_arrays(array.flatten(), schema=pa.schema(list(self.arrow)))
        return table, cursor.bad


def column_reader(schema: Any, named: Mapping[str, Any]) -> ColumnReader | None:
    """The column reader of a parsed record schema (fastavro's ``parse_schema`` form), or None when the
    schema holds a type the lane does not read. ``named`` holds the named types by full name."""
    try:
        arrow, read = _Compiler(named).compile(schema, ())
    except (_Unsupported, RecursionError):
        return None
    if not isinstance(arrow, pa.StructType) or arrow.num_fields == 0:
        return None
    return ColumnReader(arrow, read)


class _Compiler:
    def __init__(self, named: Mapping[str, Any]) -> None:
        self._named = named

    def compile(self, schema: Any, stack: tuple[str, ...]) -> tuple[pa.DataType, Read]:
        if isinstance(schema, str):
            primitive = _PRIMITIVES.get(schema)
            if primitive is not None:
                return primitive
            if schema in stack or schema not in self._named:
                raise _Unsupported(schema)  # recursive (or unknown: fastavro would not have parsed it)
            return self.compile(self._named[schema], stack)
        if isinstance(schema, list):
            return self._union(schema, stack)
        if not isinstance(schema, dict) or "logicalType" in schema:
            raise _Unsupported(str(schema))
        kind = schema.get("type")
        if kind in ("record", "error"):
            inner = (*stack, str(schema.get("name")))
            fields = [(str(item["name"]), *self.compile(item["type"], inner)) for item in schema["fields"]]
            return pa.struct([pa.field(name, arrow) for name, arrow, _ in fields]), _record(fields)
        if kind == "enum":
            return pa.string(), _enum(pa.array(list(schema["symbols"]), pa.string()))
        if kind == "fixed":
            return pa.binary(), _fixed(int(schema["size"]))
        if isinstance(kind, str) and kind in _PRIMITIVES:
            return _PRIMITIVES[kind]
        raise _Unsupported(str(kind))  # array, map, a named type given as {"type": name} …

    def _union(self, branches: list[Any], stack: tuple[str, ...]) -> tuple[pa.DataType, Read]:
        values = [i for i, branch in enumerate(branches) if branch != "null"]
        if len(values) > 1:
            raise _Unsupported("a union of several types")
        if not values:
            return pa.null(), _union([None] * len(branches), pa.null())
        arrow, read = self.compile(branches[values[0]], stack)
        return arrow, _union([read if i == values[0] else None for i in range(len(branches))], arrow)


# --- primitive reads -----------------------------------------------------------------------------


def varint(cursor: Cursor, rows: Ints, positions: Ints) -> tuple[Ints, Ints]:
    """Zigzag varints (Avro int and long) at ``positions``: (values, positions after them)."""
    raw, positions = unsigned_varint(cursor, rows, positions)
    return zigzag(raw), positions


def zigzag(raw: npt.NDArray[np.uint64]) -> Ints:
    """Zigzag-encoded varints (Avro's int and long, protobuf's sint32 and sint64) decoded."""
    return (raw >> np.uint64(1)).view(np.int64) ^ -(raw & np.uint64(1)).view(np.int64)


def unsigned_varint(cursor: Cursor, rows: Ints, positions: Ints) -> tuple[npt.NDArray[np.uint64], Ints]:
    """Plain base-128 varints at ``positions`` (the bits as written): (values, positions after them).

    A varint of more than 10 bytes, or whose 10th byte holds more than bit 63, is declined (fastavro and
    protobuf would read it differently from the specification, or not at all)."""
    buffer = cursor.buffer
    first = buffer[positions]
    raw = (first & 0x7F).astype(np.uint64)
    sizes = np.ones(len(positions), np.int64)
    going = np.flatnonzero(first & 0x80)
    for k in range(1, MAX_VARINT_BYTES):
        if not going.size:
            break
        byte = buffer[positions[going] + k]
        raw[going] |= (byte & 0x7F).astype(np.uint64) << np.uint64(7 * k)
        sizes[going] += 1
        if k == MAX_VARINT_BYTES - 1:
            cursor.decline(rows[going], byte > 1)
        going = going[(byte & 0x80) != 0]
    if going.size:  # still going after 10 bytes
        cursor.bad[rows[going]] = True
    return raw, _bounded(cursor, rows, positions + sizes)


def _bounded(cursor: Cursor, rows: Ints, positions: Ints) -> Ints:
    """Positions past their datum's end are declined and held at the end (so reads stay in the buffer)."""
    ends = cursor.ends[rows]
    over = positions > ends
    if over.any():
        cursor.bad[rows[over]] = True
        positions = np.minimum(positions, ends)
    return positions


def _read_null(cursor: Cursor, rows: Ints, positions: Ints) -> tuple[pa.Array, Ints]:
    return pa.nulls(len(rows)), positions


def _read_boolean(cursor: Cursor, rows: Ints, positions: Ints) -> tuple[pa.Array, Ints]:
    values = cursor.buffer[positions] != 0  # fastavro: any byte but 0 is true
    return pa.array(values, pa.bool_()), _bounded(cursor, rows, positions + 1)


def _read_long(cursor: Cursor, rows: Ints, positions: Ints) -> tuple[pa.Array, Ints]:
    values, positions = varint(cursor, rows, positions)
    return pa.array(values, pa.int64()), positions


def _read_int(cursor: Cursor, rows: Ints, positions: Ints) -> tuple[pa.Array, Ints]:
    values, positions = varint(cursor, rows, positions)
    # fastavro returns any 64-bit value for an int; Arrow's int32 refuses one beyond 32 bits.
    cursor.decline(rows, (values < _INT32_MIN) | (values > _INT32_MAX))
    return pa.array(values.astype(np.int32), pa.int32()), positions


def fixed_width(cursor: Cursor, rows: Ints, positions: Ints, size: int) -> tuple[Bytes, Ints]:
    """``size`` bytes per message, as an (n, size) array."""
    index = positions[:, None] + np.arange(size, dtype=np.int64)
    if size >= PADDING:  # a read from a truncated datum's end could leave the buffer
        np.minimum(index, len(cursor.buffer) - 1, out=index)
    return cursor.buffer[index], _bounded(cursor, rows, positions + size)


def read_float(cursor: Cursor, rows: Ints, positions: Ints) -> tuple[pa.Array, Ints]:
    taken, positions = fixed_width(cursor, rows, positions, 4)
    bits = taken.view("<u4").reshape(-1)
    # fastavro's float becomes a Python (double) float, and back: a signalling NaN comes back quiet.
    signalling = ((bits & 0x7FC00000) == 0x7F800000) & ((bits & 0x003FFFFF) != 0)
    if signalling.any():
        bits = bits | np.where(signalling, np.uint32(0x00400000), np.uint32(0))
    return pa.array(bits.view("<f4"), pa.float32()), positions


def read_double(cursor: Cursor, rows: Ints, positions: Ints) -> tuple[pa.Array, Ints]:
    taken, positions = fixed_width(cursor, rows, positions, 8)
    return pa.array(taken.view("<f8").reshape(-1), pa.float64()), positions


def _sized(cursor: Cursor, rows: Ints, starts: Ints, sizes: Ints) -> tuple[pa.Buffer, pa.Buffer, Ints]:
    """(offsets, data) buffers of the byte strings ``[starts, starts + sizes)`` and the positions after them."""
    ends = cursor.ends[rows]
    wrong = (sizes < 0) | (sizes > ends - starts)  # fastavro reads a negative size as "the rest"
    cursor.decline(rows, wrong)
    sizes = np.where(wrong, 0, sizes)
    offsets = np.zeros(len(sizes) + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    if offsets[-1] > _OFFSETS_MAX:
        raise OverflowError("more than 2 GiB of strings in one column")
    index = np.repeat(starts - offsets[:-1], sizes)
    index += _counting(len(index))
    data = np.take(cursor.buffer, index)
    after = np.where(wrong, ends, starts + sizes)
    return pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data), after


_COUNTING: list[npt.NDArray[np.int32]] = []
_COUNTING_KEPT = 1 << 20


def _counting(n: int) -> npt.NDArray[np.int32] | Ints:
    """0, 1, … n - 1 (up to a million kept, 4 MB: one string field of a batch fits)."""
    if n > _COUNTING_KEPT:
        return np.arange(n, dtype=np.int64)
    if not _COUNTING:
        _COUNTING.append(np.arange(_COUNTING_KEPT, dtype=np.int32))
    return _COUNTING[0][:n]


def _read_bytes(cursor: Cursor, rows: Ints, positions: Ints) -> tuple[pa.Array, Ints]:
    sizes, starts = varint(cursor, rows, positions)
    return byte_strings(cursor, rows, starts, sizes, pa.binary())


def _read_string(cursor: Cursor, rows: Ints, positions: Ints) -> tuple[pa.Array, Ints]:
    sizes, starts = varint(cursor, rows, positions)
    return byte_strings(cursor, rows, starts, sizes, pa.string())


def byte_strings(cursor: Cursor, rows: Ints, starts: Ints, sizes: Ints, arrow: pa.DataType) -> tuple[pa.Array, Ints]:
    """The byte strings ``[starts, starts + sizes)`` as ``binary``, or as ``string`` (rows that are not UTF-8
    declined), and the positions after them."""
    offsets, data, positions = _sized(cursor, rows, starts, sizes)
    binary = pa.BinaryArray.from_buffers(pa.binary(), len(rows), [None, offsets, data])
    if arrow == pa.binary():
        return binary, positions
    strings = pa.StringArray.from_buffers(len(rows), offsets, data)
    try:
        strings.validate(full=True)  # UTF-8
    except pa.ArrowInvalid:
        cursor.decline(rows, np.array([not _utf8(value) for value in binary.to_pylist()], np.bool_))
    return strings, positions


def _utf8(value: bytes | None) -> bool:
    try:
        (value or b"").decode("utf-8")  # what fastavro does
    except UnicodeDecodeError:
        return False
    return True


_PRIMITIVES: dict[str, tuple[pa.DataType, Read]] = {
    "null": (pa.null(), _read_null),
    "boolean": (pa.bool_(), _read_boolean),
    "int": (pa.int32(), _read_int),
    "long": (pa.int64(), _read_long),
    "float": (pa.float32(), read_float),
    "double": (pa.float64(), read_double),
    "bytes": (pa.binary(), _read_bytes),
    "string": (pa.string(), _read_string),
}


# --- composite reads -----------------------------------------------------------------------------


def _record(fields: list[tuple[str, pa.DataType, Read]]) -> Read:
    struct_fields = [pa.field(name, arrow) for name, arrow, _ in fields]

    def read(cursor: Cursor, rows: Ints, positions: Ints) -> tuple[pa.Array, Ints]:
        children: list[pa.Array] = []
        for _, _, read_field in fields:
            child, positions = read_field(cursor, rows, positions)
            children.append(child)
        if not children:
            return pa.array([{}] * len(rows), pa.struct([])), positions
        return pa.StructArray.from_arrays(children, fields=struct_fields), positions

    return read


def _enum(symbols: pa.Array) -> Read:
    count = len(symbols)

    def read(cursor: Cursor, rows: Ints, positions: Ints) -> tuple[pa.Array, Ints]:
        indexes, positions = varint(cursor, rows, positions)
        wrong = (indexes < 0) | (indexes >= count)  # fastavro would index from the end, or fail
        cursor.decline(rows, wrong)
        return symbols.take(pa.array(np.where(wrong, 0, indexes))), positions

    return read


def _fixed(size: int) -> Read:
    def read(cursor: Cursor, rows: Ints, positions: Ints) -> tuple[pa.Array, Ints]:
        taken, positions = fixed_width(cursor, rows, positions, size)
        offsets = pa.py_buffer(np.arange(len(rows) + 1, dtype=np.int32) * np.int32(size))
        return pa.BinaryArray.from_buffers(pa.binary(), len(rows), [None, offsets, pa.py_buffer(taken)]), positions

    return read


def _union(branches: list[Read | None], arrow: pa.DataType) -> Read:
    """A union of ``null`` (None) with at most one other type: an index, then the branch's value."""

    def read(cursor: Cursor, rows: Ints, positions: Ints) -> tuple[pa.Array, Ints]:
        indexes, positions = varint(cursor, rows, positions)
        wrong = (indexes < 0) | (indexes >= len(branches))  # fastavro would index from the end, or fail
        cursor.decline(rows, wrong)
        indexes = np.where(wrong, 0, indexes)
        valued = np.zeros(len(rows), np.bool_)
        for i, branch in enumerate(branches):
            if branch is not None:
                valued |= indexes == i
        if not valued.any():
            return pa.nulls(len(rows), arrow), positions
        which = np.flatnonzero(valued)
        branch = branches[int(indexes[which[0]])]
        assert branch is not None
        values, after = branch(cursor, rows[which], positions[which])
        positions = positions.copy()
        positions[which] = after
        if len(which) == len(rows):
            return values, positions
        # Spread the values over all rows, null where the null branch was written.
        place = np.cumsum(valued) - 1
        return values.take(pa.array(np.where(valued, place, 0), mask=~valued)), positions

    return read
