"""Avro payloads (``format.type = "avro"``): a registry's wire format (Confluent's or AWS Glue's, see
:mod:`~kafka2delta.serialization.framing`: writer schema by id, optional reader schema file), or bare datums
written with ``format.avro_schema_file``. :func:`avro_to_arrow` gives the Arrow types; fastavro decodes.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import io
import json
import uuid
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fastavro
import numpy as np
import pyarrow as pa
from fastavro._read_common import SchemaResolutionError
from fastavro._read_py import schemaless_reader as _py_schemaless_reader
from fastavro.schema import SchemaParseException

from kafka2delta.errors import ConfigError, MessageError
from kafka2delta.records import PartitionMessages
from kafka2delta.registry import RegisteredSchema
from kafka2delta.serialization.avro_batch import ColumnReader, Datums, column_reader, lay_out
from kafka2delta.serialization.base import (
    MAX_DOCUMENT_DEPTH,
    OBJECT_ADDRESS,
    BaseDeserializer,
    Decoded,
    KeyDecoder,
    decode_error,
    document_depth,
)
from kafka2delta.serialization.framing import Framing
from kafka2delta.serialization.typed import (
    BrokenSchema,
    Convert,
    Shape,
    TypedGroup,
    grouped_decode,
    remember_schema,
)

# fastavro reports a malformed schema ({"type": "array"} without items, null …) as KeyError/TypeError too.
_AVRO_SCHEMA_ERRORS = (ValueError, KeyError, TypeError, AttributeError, SchemaParseException)


def _time_micros(value: Any) -> Any:
    if isinstance(value, dt.time):
        return ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + value.microsecond
    return value


def _uuid_text(value: Any) -> Any:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, bytes) and len(value) == 16:
        return str(uuid.UUID(bytes=value))
    return value


def _decimal_text(value: Any) -> Any:
    return format(value, "f") if isinstance(value, decimal.Decimal) else value


def _generic_fix(value: Any) -> Any:
    """The fixes of :func:`avro_to_arrow` applied by Python type, for values of no fixed shape."""
    if isinstance(value, dict):
        return {key: _generic_fix(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_generic_fix(item) for item in value]
    if isinstance(value, dt.time):
        return _time_micros(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    return value


def _fix_list(item_fix: Convert) -> Convert:
    def fix(values: list[Any]) -> list[Any]:
        return [None if item is None else item_fix(item) for item in values]

    return fix


def _fix_map(value_fix: Convert) -> Convert:
    def fix(values: dict[str, Any]) -> dict[str, Any]:
        return {key: None if item is None else value_fix(item) for key, item in values.items()}

    return fix


def _fix_record(field_fixes: list[tuple[str, Convert]]) -> Convert:
    def fix(record: dict[str, Any]) -> dict[str, Any]:
        for name, field_fix in field_fixes:
            item = record.get(name)
            if item is not None:
                record[name] = field_fix(item)
        return record

    return fix


_AVRO_PRIMITIVES: dict[str, pa.DataType] = {
    "null": pa.null(),
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "bytes": pa.binary(),
    "string": pa.string(),
}
# What fastavro may raise on bytes that are not a datum of the schema (truncated, garbage, a
# writer/reader pair that does not resolve, a date out of Python's range …).
_AVRO_ERRORS: tuple[type[Exception], ...] = (
    EOFError,
    ValueError,
    IndexError,
    KeyError,
    TypeError,
    OverflowError,
    UnicodeDecodeError,
    SchemaResolutionError,
)


def avro_to_arrow(schema: Any) -> pa.DataType:
    """The Arrow type of values of an Avro schema (JSON text, a dict/list, or a type name).

    record → struct (fields in schema order); ``["null", T]`` (either order) → T (every Arrow field
    is nullable); enum, string, uuid → string; bytes, fixed → binary; int → int32; long → int64;
    float → float32; double → float64; boolean → bool; array → list; map → map<string, V>;
    date → date32; timestamp-millis/micros → timestamp(us, UTC); local-timestamp-millis/micros →
    timestamp(us); decimal (precision ≤ 38) → decimal128(p, s), wider → string; time-millis/micros →
    int64 microseconds since midnight. A union of several non-null types and a recursive reference
    have no faithful Arrow type: string (their messages take the reference lane).
    """
    if isinstance(schema, str):
        with contextlib.suppress(ValueError):  # else a bare type name such as "string"
            schema = json.loads(schema)
    return AvroSchema.parse(schema).shape().arrow


class _AvroShapes:
    def __init__(self, named: Mapping[str, Any]) -> None:
        self._named = named
        self.recursive = False
        """Set when the schema contains itself (see :data:`MAX_AVRO_DEPTH`)."""

    def shape(self, schema: Any, stack: tuple[str, ...] = ()) -> Shape:
        if isinstance(schema, str):
            if schema in _AVRO_PRIMITIVES:
                return Shape(_AVRO_PRIMITIVES[schema], None, False)
            if schema in stack:  # a record that contains itself
                self.recursive = True
                return Shape(pa.string(), _generic_fix, True)
            return self.shape(self._named[schema], stack)
        if isinstance(schema, list):
            branches = [branch for branch in schema if branch != "null"]
            if not branches:
                return Shape(pa.null(), None, False)
            if len(branches) == 1:
                return self.shape(branches[0], stack)
            return Shape(pa.string(), _generic_fix, True)
        kind = schema["type"]
        logical = self._logical(schema, kind)
        if logical is not None:
            return logical
        if kind in ("record", "error"):
            name = schema["name"]
            inner = (*stack, name)
            fields: list[pa.Field] = []
            fixes: list[tuple[str, Convert]] = []
            slow = False
            for item in schema["fields"]:
                child = self.shape(item["type"], inner)
                fields.append(pa.field(item["name"], child.arrow))
                slow = slow or child.slow
                if child.fix is not None:
                    fixes.append((item["name"], child.fix))
            return Shape(pa.struct(fields), _fix_record(fixes) if fixes else None, slow)
        if kind == "enum":
            return Shape(pa.string(), None, False)
        if kind == "fixed":
            return Shape(pa.binary(), None, False)
        if kind == "array":
            item_shape = self.shape(schema["items"], stack)
            fix = _fix_list(item_shape.fix) if item_shape.fix else None
            return Shape(pa.list_(item_shape.arrow), fix, item_shape.slow)
        if kind == "map":
            value_shape = self.shape(schema["values"], stack)
            fix = _fix_map(value_shape.fix) if value_shape.fix else None
            return Shape(pa.map_(pa.string(), value_shape.arrow), fix, value_shape.slow)
        return self.shape(kind, stack)  # {"type": "string"} and {"type": "<named type>"}

    @staticmethod
    def _logical(schema: Mapping[str, Any], kind: Any) -> Shape | None:
        logical = schema.get("logicalType")
        if logical is None:
            return None
        # A logical type on the wrong base type is ignored, as the Avro specification says.
        if logical == "date" and kind == "int":
            return Shape(pa.date32(), None, False)
        if logical in ("timestamp-millis", "timestamp-micros") and kind == "long":
            return Shape(pa.timestamp("us", "UTC"), None, False)
        if logical in ("local-timestamp-millis", "local-timestamp-micros") and kind == "long":
            return Shape(pa.timestamp("us"), None, False)
        if (logical, kind) in (("time-millis", "int"), ("time-micros", "long")):
            # Delta has no time type: microseconds since midnight.
            return Shape(pa.int64(), _time_micros, False)
        if logical == "uuid" and kind in ("string", "fixed"):
            return Shape(pa.string(), _uuid_text, False)
        if logical == "decimal" and kind in ("bytes", "fixed"):
            precision = int(schema.get("precision", 0))
            scale = int(schema.get("scale", 0))
            if 0 < precision <= 38 and 0 <= scale <= precision:
                return Shape(pa.decimal128(precision, scale), None, False)
            return Shape(pa.string(), _decimal_text, False)
        return None


@dataclass(frozen=True)
class AvroSchema:
    """A parsed Avro schema and the named types it can refer to."""

    parsed: Any
    named: Mapping[str, Any]

    @staticmethod
    def parse(schema: Any, named: dict[str, Any] | None = None) -> AvroSchema:
        """Parse JSON-decoded ``schema``; ``named`` holds types defined by referenced schemas."""
        named = {} if named is None else named
        return AvroSchema(fastavro.parse_schema(schema, named_schemas=named), named)

    def shape(self) -> Shape:
        return _AvroShapes(self.named).shape(self.parsed)

    @property
    def recursive(self) -> bool:
        shapes = _AvroShapes(self.named)
        shapes.shape(self.parsed)
        return shapes.recursive


def load_avro_schema_file(path: str) -> AvroSchema:
    """The parsed ``format.avro_schema_file``; ConfigError naming the key when it cannot be used."""
    key = "format.avro_schema_file"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(key, f"cannot read {path}: {exc}") from exc
    try:
        return AvroSchema.parse(json.loads(text))
    except _AVRO_SCHEMA_ERRORS as exc:
        raise ConfigError(key, f"{path} is not an Avro schema: {exc!r}") from exc


@dataclass
class _AvroWriter:
    """A writer schema (by registry id, or the schema file for bare datums) and how to read with it."""

    parsed: Any
    reader: Any
    """The reader schema to resolve to (None: read with the writer schema as it is)."""
    shape: Shape
    is_record: bool
    kind: str
    recursive: bool = False
    """The writer schema contains itself: read with fastavro's pure-Python reader, depth-limited."""
    columns: ColumnReader | None = None
    """The column lane's reader of this schema (None: the schema needs the per-message lane)."""

    def with_columns(self, named: Mapping[str, Any]) -> _AvroWriter:
        """This writer with the column lane's reader, when the lane reads its datums exactly as the per-message
        lane would: no reader schema to resolve to, no fix, and the same Arrow type."""
        if self.reader is not None or self.recursive or not self.is_record or self.shape.fix is not None:
            return self
        columns = column_reader(self.parsed, named)
        if columns is not None and columns.arrow.equals(self.shape.arrow):
            self.columns = columns
        return self


MAX_AVRO_DEPTH = MAX_DOCUMENT_DEPTH
"""Deepest nesting (records, arrays, maps) accepted for values of a recursive Avro schema."""


class AvroCodec:
    """Reads Avro datums: framed (Confluent or Glue) through their registry, or bare with the schema file."""

    def __init__(self, registry: Framing | None, reader: AvroSchema | None) -> None:
        self._registry = registry
        self._reader = reader
        self._reader_shape = reader.shape() if reader is not None else None
        self._bare: _AvroWriter | None = None
        if registry is None:
            if reader is None or self._reader_shape is None:
                raise ConfigError("format.avro_schema_file", "bare Avro datums need the schema file")
            self._bare = _AvroWriter(
                reader.parsed,
                None,
                self._reader_shape,
                _is_record(reader.parsed),
                _kind(reader.parsed),
                reader.recursive,
            ).with_columns(reader.named)
        self._writers: dict[int, _AvroWriter | BrokenSchema] = {}

    def writer(self, payload: bytes) -> tuple[int, bytes, int, _AvroWriter]:
        """(schema id, the bytes holding the datum, where in them it starts, writer) of a payload."""
        schema_id, data, offset = self.unframe(payload)
        return schema_id, data, offset, self.schema_writer(schema_id)

    def lay_out(self, payloads: Sequence[bytes | None]) -> Datums:
        """The payloads' datums end to end, each with its writer schema, for the column lane."""
        if self._registry is None:
            return lay_out(payloads, 0)
        return self._registry.lay_out(payloads)

    def unframe(self, payload: bytes) -> tuple[int, bytes, int]:
        """(schema id, the bytes holding the datum, where in them it starts); bare datums are schema 0."""
        if self._registry is None:
            return 0, payload, 0
        return self._registry.unframe(payload)

    def schema_writer(self, schema_id: int) -> _AvroWriter:
        """The writer of a schema id (the schema file's for bare datums)."""
        if self._registry is None:
            assert self._bare is not None
            return self._bare
        writer = self._writers.get(schema_id)
        if writer is None:
            # A registry outage (RetryableError) or an unknown id (MessageError, remembered by the
            # registry client for a minute only) propagates and is not cached here.
            writer = remember_schema(self._writers, schema_id, self._load(self._registry, schema_id))
        if isinstance(writer, BrokenSchema):
            raise decode_error(writer.reason)
        return writer

    def _load(self, registry: Framing, schema_id: int) -> _AvroWriter | BrokenSchema:
        registered = registry.schema(schema_id)
        if registered.schema_type != "AVRO":
            return BrokenSchema(f"{registry.describe(schema_id)} is a {registered.schema_type} schema, not AVRO")
        named: dict[str, Any] = {}
        try:
            self._load_references(registry, registered, named, set())
            writer = AvroSchema.parse(json.loads(registered.schema), named)
        except _AVRO_SCHEMA_ERRORS as exc:
            return BrokenSchema(f"{registry.describe(schema_id)} is not a valid Avro schema: {exc!r}")
        if self._reader is None or self._reader_shape is None:
            parsed = writer.parsed
            return _AvroWriter(
                parsed, None, writer.shape(), _is_record(parsed), _kind(parsed), writer.recursive
            ).with_columns(writer.named)
        reader = self._reader.parsed
        # Resolving a schema to itself only costs time.
        resolve_to = None if _same_schema(writer.parsed, reader) else reader
        recursive = writer.recursive or self._reader.recursive
        return _AvroWriter(
            writer.parsed, resolve_to, self._reader_shape, _is_record(reader), _kind(reader), recursive
        ).with_columns(writer.named)

    def _load_references(
        self, registry: Framing, schema: RegisteredSchema, named: dict[str, Any], seen: set[tuple[str, int]]
    ) -> None:
        """Named types defined in referenced subjects, parsed before the schema that uses them."""
        for reference in schema.references:
            key = (reference.subject, reference.version)
            if key in seen:
                continue
            seen.add(key)
            referenced = registry.referenced(reference.subject, reference.version)
            self._load_references(registry, referenced, named, seen)
            AvroSchema.parse(json.loads(referenced.schema), named)

    def read(self, payload: bytes) -> tuple[int, _AvroWriter, Any]:
        """(schema id, writer, decoded value with fixes applied)."""
        schema_id, data, offset, writer = self.writer(payload)
        stream = io.BytesIO(data)
        stream.seek(offset)
        try:
            if writer.recursive:
                # fastavro's compiled reader recurses on the C stack and crashes the process a few
                # thousand levels down; the pure-Python one raises RecursionError (~200 levels), and
                # the depth check below makes the limit the same whatever the caller's stack.
                value = _py_schemaless_reader(stream, writer.parsed, writer.reader)
                if document_depth(value) > MAX_AVRO_DEPTH:
                    raise RecursionError
            else:
                value = fastavro.schemaless_reader(stream, writer.parsed, writer.reader)
        except RecursionError as exc:
            raise decode_error(f"the Avro value is nested deeper than {MAX_AVRO_DEPTH} levels") from exc
        except _AVRO_ERRORS as exc:
            raise decode_error(_avro_reason(exc, len(data) - offset)) from exc
        if stream.tell() != len(data):
            raise decode_error(f"{len(data) - stream.tell()} trailing bytes after the Avro datum")
        if writer.shape.fix is not None:
            value = writer.shape.fix(value)
        return schema_id, writer, value

    def read_any(self, payload: bytes) -> Any:
        return self.read(payload)[2]

    def read_record(self, payload: bytes) -> tuple[int, _AvroWriter, dict[str, Any]]:
        schema_id, writer, value = self.read(payload)
        if not writer.is_record:
            raise decode_error(f"the Avro value is a {writer.kind}, not a record")
        return schema_id, writer, value


@dataclass(frozen=True)
class AvroKeys:
    """``format.key = "avro"``: a key's datum, and for change events the writer schema it was read with (its
    Connect types say what a key's numbers mean)."""

    codec: AvroCodec

    def __call__(self, payload: bytes) -> Any:
        return self.codec.read_any(payload)


def _avro_reason(exc: Exception, size: int) -> str:
    """A reason that names the problem and is the same on every replay (no object addresses)."""
    if isinstance(exc, EOFError):
        return f"truncated Avro datum: the schema needs more than its {size} bytes"
    if isinstance(exc, UnicodeDecodeError):
        return f"an Avro string is not valid UTF-8: {exc.reason} at byte {exc.start} of the string"
    text = OBJECT_ADDRESS.sub("", str(exc))
    if isinstance(exc, SchemaResolutionError):
        return f"the writer schema does not resolve to the reader schema: {text}"
    return f"not a valid Avro datum: {type(exc).__name__}: {text}"


def _kind(schema: Any) -> str:
    if isinstance(schema, dict):
        return str(schema.get("type"))
    if isinstance(schema, list):
        return "union"
    return str(schema)


def _is_record(schema: Any) -> bool:
    return isinstance(schema, dict) and schema.get("type") in ("record", "error")


def _same_schema(left: Any, right: Any) -> bool:
    try:
        return bool(fastavro.schema.to_parsing_canonical_form(left) == fastavro.schema.to_parsing_canonical_form(right))
    except (ValueError, KeyError, TypeError, SchemaParseException):
        return False


class AvroDeserializer(BaseDeserializer):
    """Avro records: Confluent wire format through the registry, or bare datums of the schema file.

    Fast lane: messages grouped by writer schema id. A group of at least :data:`COLUMN_LANE_MIN_MESSAGES`
    whose schema the column lane reads (:mod:`~kafka2delta.serialization.avro_batch`) is decoded straight into
    Arrow columns, without documents; the messages it declines, and every other group, are decoded one by one
    to dicts with fastavro, then one ``pa.array(dicts, type=struct)`` per group (the type from
    :func:`avro_to_arrow` of the reader schema, or of the writer schema without one), and those dicts are
    documents too. Groups are concatenated with promotion, so a v1 row lacks v2's new field (null).
    """

    typed = True

    def __init__(self, keys: KeyDecoder | None, codec: AvroCodec, *, topic: str = "") -> None:
        super().__init__(keys)
        self._codec = codec
        self.topic = topic

    @property
    def codec(self) -> AvroCodec:
        """The reader (writer schemas by id), for stages that need the schema with the value (change events)."""
        return self._codec

    def _document(self, payload: bytes) -> dict[str, Any]:
        return self._codec.read_record(payload)[2]

    def _read(self, payload: bytes) -> tuple[Hashable, Shape, dict[str, Any]]:
        schema_id, writer, value = self._codec.read_record(payload)
        return schema_id, writer.shape, value

    def _decode_values(self, messages: PartitionMessages, positions: Sequence[int]) -> Decoded:
        if len(positions) < COLUMN_LANE_MIN_MESSAGES:
            return grouped_decode(messages, positions, self._read)
        datums = self._codec.lay_out([messages.payloads[position] for position in positions])
        at = np.asarray(positions, np.int64)
        groups: dict[Hashable, TypedGroup] = {}
        one_by_one = at[datums.schemas < 0].tolist()  # not the wire format: the per-message lane says why
        for index, schema_id in enumerate(datums.schema_ids):
            rows = np.flatnonzero(datums.schemas == index)
            writer = self._columns_of(schema_id) if len(rows) >= COLUMN_LANE_MIN_MESSAGES else None
            if writer is None or writer.columns is None:
                one_by_one.extend(at[rows].tolist())
                continue
            try:
                table, bad = writer.columns.read(datums.buffer, datums.starts[rows], datums.ends[rows])
            except (ArithmeticError, ValueError, IndexError, pa.ArrowException):
                one_by_one.extend(at[rows].tolist())  # the lane may fail, never disagree
                continue
            if bad.any():
                one_by_one.extend(at[rows[bad]].tolist())
                rows, table = rows[~bad], table.filter(~bad)
            groups[schema_id] = TypedGroup(writer.shape, columns=(at[rows].tolist(), table))
        return grouped_decode(messages, one_by_one, self._read, groups)

    def _columns_of(self, schema_id: int) -> _AvroWriter | None:
        """The writer of ``schema_id`` when the column lane reads it; None sends its messages one by one
        (an unknown or broken schema id is then a dead letter there; a registry outage propagates now)."""
        try:
            writer = self._codec.schema_writer(schema_id)
        except MessageError:
            return None
        return writer if writer.columns is not None else None


COLUMN_LANE_MIN_MESSAGES = 64
"""Fewest messages of one writer schema in a batch for the column lane (its fixed cost per schema field is that
of a few dozen messages decoded one by one)."""
