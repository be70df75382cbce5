"""Protobuf payloads (``format.type = "protobuf"``) in a registry's wire format, Confluent's (magic byte,
schema id, message indexes, message) or AWS Glue's (header, schema version UUID, maybe zlib, message index,
message): :mod:`~kafka2delta.serialization.framing` finds the schema, and
:mod:`~kafka2delta.serialization.protobuf_indexes` the message type in it. The ``.proto`` text is compiled by
protoc (bundled in ``grpcio-tools``) once per schema; :func:`protobuf_to_arrow` gives the Arrow types.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import functools
import importlib
import operator
import os
import re
import tempfile
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # type: ignore[import-untyped]
from google.protobuf.descriptor import FieldDescriptor as F  # type: ignore[import-untyped]
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]

from kafka2delta.bisection import isolate_failures
from kafka2delta.errors import MessageError
from kafka2delta.records import PartitionMessages
from kafka2delta.registry import RegisteredSchema
from kafka2delta.serialization.avro_batch import ColumnReader, Datums
from kafka2delta.serialization.base import BaseDeserializer, Decoded, KeyDecoder, decode_error
from kafka2delta.serialization.framing import Framing
from kafka2delta.serialization.protobuf_aws import aws_protos, decimal_field, is_aws_decimal
from kafka2delta.serialization.protobuf_batch import wire_reader
from kafka2delta.serialization.protobuf_indexes import MessageIndexes, is_repeated
from kafka2delta.serialization.typed import (
    BrokenSchema,
    Convert,
    Shape,
    TypedGroup,
    grouped_decode,
    remember_schema,
)

_WRAPPERS = {
    "google.protobuf.DoubleValue": pa.float64(),
    "google.protobuf.FloatValue": pa.float32(),
    "google.protobuf.Int64Value": pa.int64(),
    "google.protobuf.UInt64Value": pa.decimal128(20, 0),
    "google.protobuf.Int32Value": pa.int32(),
    "google.protobuf.UInt32Value": pa.int64(),
    "google.protobuf.BoolValue": pa.bool_(),
    "google.protobuf.StringValue": pa.string(),
    "google.protobuf.BytesValue": pa.binary(),
}
_TIMESTAMP = "google.protobuf.Timestamp"
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _proto_scalar_types() -> dict[int, pa.DataType]:
    return {
        F.TYPE_DOUBLE: pa.float64(),
        F.TYPE_FLOAT: pa.float32(),
        F.TYPE_INT64: pa.int64(),
        F.TYPE_SINT64: pa.int64(),
        F.TYPE_SFIXED64: pa.int64(),
        F.TYPE_UINT64: pa.decimal128(20, 0),
        F.TYPE_FIXED64: pa.decimal128(20, 0),
        F.TYPE_INT32: pa.int32(),
        F.TYPE_SINT32: pa.int32(),
        F.TYPE_SFIXED32: pa.int32(),
        F.TYPE_UINT32: pa.int64(),
        F.TYPE_FIXED32: pa.int64(),
        F.TYPE_BOOL: pa.bool_(),
        F.TYPE_STRING: pa.string(),
        F.TYPE_BYTES: pa.binary(),
        F.TYPE_ENUM: pa.string(),
    }


def _is_map(f: Any) -> bool:
    return bool(f.message_type is not None and f.message_type.GetOptions().map_entry and is_repeated(f))


def protobuf_to_arrow(descriptor: Any) -> pa.DataType:
    """The Arrow type of messages of a protobuf ``Descriptor``.

    message → struct (proto field names, declaration order); double → float64; float → float32;
    int32/sint32/sfixed32 → int32; int64/sint64/sfixed64 → int64; uint32/fixed32 → int64;
    uint64/fixed64 → decimal128(20, 0); bool → bool; string → string; bytes → binary; enum →
    string (the value's name); repeated → list; map → map<K, V>; google.protobuf.Timestamp →
    timestamp(us, UTC); the wrapper types (Int64Value …) → their scalar type, null when unset; AWS's
    additionalTypes.Decimal → decimal128 (:mod:`~kafka2delta.serialization.protobuf_aws`).
    A recursive message has no faithful Arrow type: string (its messages take the reference lane).
    """
    return _ProtoShapes().record(descriptor).arrow


class _ProtoShapes:
    """Arrow types and dict converters per message descriptor, built once per message type."""

    def __init__(self) -> None:
        self._scalars = _proto_scalar_types()

    def shape(self, descriptor: Any, stack: tuple[str, ...] = ()) -> Shape:
        """The shape of a message-typed field's value (``fix`` converts the message object)."""
        name = descriptor.full_name
        if name in stack:
            return Shape(pa.string(), None, True)
        if name == _TIMESTAMP:
            return Shape(pa.timestamp("us", "UTC"), _timestamp, False)
        return self.record(descriptor, stack)

    def record(self, descriptor: Any, stack: tuple[str, ...] = ()) -> Shape:
        """The struct of a message (also for a top-level Timestamp); ``fix`` converts it to a dict."""
        inner = (*stack, descriptor.full_name)
        fields: list[pa.Field] = []
        getters: list[tuple[str, Convert]] = []
        slow = False
        for f in descriptor.fields:
            arrow, getter, field_slow = self._field(f, inner)
            fields.append(pa.field(f.name, arrow))
            getters.append((f.name, getter))
            slow = slow or field_slow

        def convert(message: Any) -> dict[str, Any]:
            return {name: getter(message) for name, getter in getters}

        return Shape(pa.struct(fields), convert, slow)

    def columns(self, descriptor: Any) -> Callable[[list[Any]], pa.Table] | None:
        """Parsed messages → their table, one array per field over the field's values (the very values the
        record's ``fix`` puts in its dicts); None for a recursive message or one without fields."""
        found = self._struct_columns(descriptor, ())
        if found is None:
            return None
        fields, arrays = found
        schema = pa.schema(fields)
        return lambda parsed: pa.Table.from_arrays(arrays(parsed), schema=schema)

    def _struct_columns(
        self, descriptor: Any, stack: tuple[str, ...]
    ) -> tuple[list[pa.Field], Callable[[list[Any]], list[pa.Array]]] | None:
        inner = (*stack, descriptor.full_name)
        fields: list[pa.Field] = []
        reads: list[Callable[[list[Any]], pa.Array]] = []
        for f in descriptor.fields:
            arrow, getter, slow = self._field(f, inner)
            if slow:
                return None
            fields.append(pa.field(f.name, arrow))
            reads.append(self._column(f, arrow, getter, inner))
        if not fields:
            return None
        return fields, lambda parsed: [read(parsed) for read in reads]

    def _column(
        self, f: Any, arrow: pa.DataType, getter: Convert, stack: tuple[str, ...]
    ) -> Callable[[list[Any]], pa.Array]:
        """One field's array: a plain field's attribute, a message field's own columns (null where unset), or
        else the dict lane's getter per message."""
        name = f.name
        get = operator.attrgetter(name)
        if is_repeated(f) or (f.type not in _CONVERTED and f.has_presence):
            return lambda parsed: pa.array([getter(m) for m in parsed], arrow)
        if f.type not in _CONVERTED:  # the getter of a plain field is getattr
            return lambda parsed: pa.array(list(map(get, parsed)), arrow)
        nested = None
        if f.type == F.TYPE_MESSAGE and pa.types.is_struct(arrow) and f.message_type.full_name != _TIMESTAMP:
            nested = self._struct_columns(f.message_type, stack)
        if nested is None:
            return lambda parsed: pa.array([getter(m) for m in parsed], arrow)
        child_fields, child_arrays = nested

        def read(parsed: list[Any]) -> pa.Array:
            unset = pc.invert(pa.array([m.HasField(name) for m in parsed], pa.bool_()))
            return pa.StructArray.from_arrays(child_arrays(list(map(get, parsed))), fields=child_fields, mask=unset)

        return read

    def _value(self, f: Any, stack: tuple[str, ...]) -> tuple[pa.DataType, Convert | None, bool]:
        """The type of one value of ``f`` (an element, for a repeated field) and its converter."""
        if f.type in (F.TYPE_MESSAGE, F.TYPE_GROUP):
            message_type = f.message_type
            wrapped = _WRAPPERS.get(message_type.full_name)
            if wrapped is not None:
                return wrapped, _unwrap, False
            if is_aws_decimal(message_type):
                return (*decimal_field(f), False)
            shape = self.shape(message_type, stack)
            if shape.slow and shape.fix is None:  # recursive: no converter of a fixed shape
                return shape.arrow, _proto_generic, True
            return shape.arrow, shape.fix, shape.slow
        if f.type == F.TYPE_ENUM:
            names = {value.number: value.name for value in f.enum_type.values}

            def enum_name(number: int) -> str:
                # An open enum may carry a number this schema does not name: keep the number.
                return names.get(number) or str(number)

            return pa.string(), enum_name, False
        return self._scalars[f.type], None, False

    def _field(self, f: Any, stack: tuple[str, ...]) -> tuple[pa.DataType, Convert, bool]:
        name = f.name
        if _is_map(f):
            key_field = f.message_type.fields_by_name["key"]
            value_field = f.message_type.fields_by_name["value"]
            key_type, _, _ = self._value(key_field, stack)
            value_type, value_convert, slow = self._value(value_field, stack)
            if value_convert is None:
                return pa.map_(key_type, value_type), lambda m: dict(getattr(m, name)), slow
            convert_value = value_convert
            return (
                pa.map_(key_type, value_type),
                lambda m: {k: convert_value(v) for k, v in getattr(m, name).items()},
                slow,
            )
        value_type, value_convert, slow = self._value(f, stack)
        if is_repeated(f):
            if value_convert is None:
                return pa.list_(value_type), lambda m: list(getattr(m, name)), slow
            convert_item = value_convert
            return pa.list_(value_type), lambda m: [convert_item(v) for v in getattr(m, name)], slow
        if f.has_presence:
            # Messages, proto3 ``optional``, oneof members and proto2 fields: unset is null.
            convert_set = value_convert or (lambda v: v)
            return value_type, lambda m: convert_set(getattr(m, name)) if m.HasField(name) else None, slow
        if value_convert is None:
            return value_type, lambda m: getattr(m, name), slow
        convert_plain = value_convert
        return value_type, lambda m: convert_plain(getattr(m, name)), slow


_CONVERTED = (F.TYPE_MESSAGE, F.TYPE_GROUP, F.TYPE_ENUM)
"""Field types whose values the dicts hold converted (the others hold what the message attribute gives)."""


def _timestamp(message: Any) -> dt.datetime:
    try:
        return _EPOCH + dt.timedelta(seconds=message.seconds, microseconds=message.nanos // 1000)
    except OverflowError as exc:
        raise decode_error(f"google.protobuf.Timestamp out of range: {message.seconds} s") from exc


def _unwrap(message: Any) -> Any:
    return message.value


def _proto_generic(message: Any) -> dict[str, Any]:
    """A recursive message → dict, walking the fields at run time (the reference lane only)."""
    converted: dict[str, Any] = {}
    for f in message.DESCRIPTOR.fields:
        converted[f.name] = _proto_generic_field(message, f)
    return converted


def _proto_generic_value(f: Any, value: Any) -> Any:
    if f.type in (F.TYPE_MESSAGE, F.TYPE_GROUP):
        name = f.message_type.full_name
        if name == _TIMESTAMP:
            return _timestamp(value)
        if name in _WRAPPERS:
            return value.value
        if is_aws_decimal(f.message_type):
            return decimal_field(f)[1](value)
        return _proto_generic(value)
    if f.type == F.TYPE_ENUM:
        found = f.enum_type.values_by_number.get(value)
        return found.name if found is not None else str(value)
    return value


def _proto_generic_field(message: Any, f: Any) -> Any:
    value = getattr(message, f.name)
    if _is_map(f):
        value_field = f.message_type.fields_by_name["value"]
        return {k: _proto_generic_value(value_field, v) for k, v in value.items()}
    if is_repeated(f):
        return [_proto_generic_value(f, v) for v in value]
    if f.has_presence and not message.HasField(f.name):
        return None
    return _proto_generic_value(f, value)


@dataclass
class _ProtoMessage:
    cls: Any
    shape: Shape
    convert: Convert
    columns: Callable[[list[Any]], pa.Table] | None = None
    """Parsed messages → their table, for the column lane (None: the message needs the dict lane)."""
    many: Any = None
    """A message type ``{repeated <this type> items = 1;}``: many messages parsed in one call (set with
    ``columns``)."""
    wire: ColumnReader | None = None
    """Reads the messages straight from their bytes (set with ``columns``, None when the wire lane cannot)."""

    def parse_many(self, bodies: list[bytes]) -> Callable[[list[int]], list[Any]]:
        """Parses ``bodies[i]`` for the i of a chunk as the items of one ``many`` message: each item is read from
        exactly its own bytes (a length-delimited field), as ``cls.FromString`` would read it alone."""

        def parse(chunk: list[int]) -> list[Any]:
            framed: list[bytes] = []
            for i in chunk:
                framed.append(_field_one(len(bodies[i])))
                framed.append(bodies[i])
            return list(self.many.FromString(b"".join(framed)).items)

        return parse


@dataclass
class _ProtoFile:
    schema: str
    """How reasons name it (``schema id 7``, ``schema version <uuid>``)."""
    pool: Any
    top: list[Any]
    """Top-level message descriptors, in declaration order (Confluent's message index 0, 1, …)."""
    messages: dict[tuple[int, ...], _ProtoMessage | BrokenSchema] = field(default_factory=dict)


class ProtobufCodec:
    """Reads Protobuf messages framed by ``framing`` (Confluent's or Glue's wire format and its registry)."""

    def __init__(self, framing: Framing) -> None:
        self._framing = framing
        self._files: dict[int, _ProtoFile | BrokenSchema] = {}

    def read(self, payload: bytes) -> tuple[tuple[int, tuple[int, ...]], _ProtoMessage, dict[str, Any]]:
        schema_id, data, offset = self._framing.unframe(payload)
        indexes, offset = self._framing.protobuf_indexes.read(data, offset)
        message = self._message(schema_id, indexes)
        try:
            parsed = message.cls.FromString(data[offset:])
        except _PARSE_ERRORS as exc:
            raise decode_error(f"not a valid protobuf message {message.cls.DESCRIPTOR.full_name}: {exc}") from exc
        return (schema_id, indexes), message, message.convert(parsed)

    def read_value(self, payload: bytes) -> dict[str, Any]:
        """One payload's message as a dict (how ``format.key = "protobuf"`` decodes a key)."""
        return self.read(payload)[2]

    def lay_out(self, payloads: Sequence[bytes | None]) -> Datums:
        """The payloads' datums (message index, then message) end to end, each with its schema."""
        return self._framing.lay_out(payloads)

    def columns_of(self, schema_id: int) -> _ProtoMessage | None:
        """The first message type of ``schema_id`` (message indexes ``[0]``) when the column lane reads it;
        None when it does not, or the schema cannot be used (its messages are then dead letters one by one).
        A registry outage propagates."""
        try:
            message = self._message(schema_id, (0,))
        except MessageError:
            return None
        return message if message.columns is not None else None

    def _message(self, schema_id: int, indexes: tuple[int, ...]) -> _ProtoMessage:
        loaded = self._files.get(schema_id)
        if loaded is None:
            loaded = remember_schema(self._files, schema_id, self._load(schema_id))  # RetryableError: not cached
        if isinstance(loaded, BrokenSchema):
            raise decode_error(loaded.reason)
        found = loaded.messages.get(indexes)
        if found is None:
            found = loaded.messages[indexes] = _resolve_message(loaded, self._framing.protobuf_indexes, indexes)
        if isinstance(found, BrokenSchema):
            raise decode_error(found.reason)
        return found

    def _load(self, schema_id: int) -> _ProtoFile | BrokenSchema:
        registered = self._framing.schema(schema_id)
        schema = self._framing.describe(schema_id)
        if registered.schema_type != "PROTOBUF":
            return BrokenSchema(f"{schema} is a {registered.schema_type} schema, not PROTOBUF")
        files: dict[str, str] = {}
        main = f"kafka2delta_schema_{schema_id}.proto"
        files[main] = registered.schema
        reason = self._collect_references(registered, files, set())
        if reason is not None:
            return BrokenSchema(f"{schema}: {reason}")
        compiled = compile_proto(files, main)
        if isinstance(compiled, str):
            return BrokenSchema(f"{schema} does not compile: {compiled}")
        pool, top = compiled
        return _ProtoFile(schema, pool, top)

    def _collect_references(
        self, schema: RegisteredSchema, files: dict[str, str], seen: set[tuple[str, int]]
    ) -> str | None:
        for reference in schema.references:
            key = (reference.subject, reference.version)
            if key in seen:
                continue
            seen.add(key)
            path = Path(reference.name)
            if path.is_absolute() or ".." in path.parts:
                return f"reference name {reference.name!r} is not a relative path"
            referenced = self._framing.referenced(reference.subject, reference.version)
            files[reference.name] = referenced.schema
            reason = self._collect_references(referenced, files, seen)
            if reason is not None:
                return reason
        return None


def _resolve_message(
    loaded: _ProtoFile, message_indexes: MessageIndexes, indexes: tuple[int, ...]
) -> _ProtoMessage | BrokenSchema:
    descriptor = message_indexes.find(loaded.top, indexes, loaded.schema)
    if isinstance(descriptor, str):
        return BrokenSchema(descriptor)
    shapes = _ProtoShapes()
    shape = shapes.record(descriptor)
    convert = shape.fix if shape.fix is not None else _proto_generic
    columns = None if shape.slow else shapes.columns(descriptor)
    many = _many(loaded.pool, descriptor, indexes) if columns is not None else None
    if many is None:
        columns = None  # the column lane needs both
    wire = wire_reader(descriptor, shape.arrow) if columns is not None else None
    return _ProtoMessage(message_factory.GetMessageClass(descriptor), shape, convert, columns, many, wire)


def _many(pool: Any, descriptor: Any, indexes: tuple[int, ...]) -> Any:
    """The class of ``{repeated <descriptor> items = 1;}`` in ``pool``; None when ``descriptor`` (or a message in
    it) has required fields, whose check could differ between a message alone and an item."""
    if _has_required(descriptor, set()):
        return None
    name = "Many" + "_".join(str(index) for index in indexes)
    file = descriptor_pb2.FileDescriptorProto(
        name=f"kafka2delta/many/{name}.proto", package="kafka2delta.many", syntax="proto3"
    )
    file.dependency.append(descriptor.file.name)
    items = file.message_type.add(name=name).field.add(name="items", number=1)
    items.label = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
    items.type = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
    items.type_name = "." + descriptor.full_name
    try:
        pool.Add(file)
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"kafka2delta.many.{name}"))
    except (TypeError, ValueError, KeyError):  # the pool refuses it: no column lane, nothing else changes
        return None


def _has_required(descriptor: Any, seen: set[str]) -> bool:
    if descriptor.full_name in seen:
        return False
    seen.add(descriptor.full_name)
    for f in descriptor.fields:
        required = getattr(f, "is_required", None)  # protobuf ≥ 6; older versions only have ``label``
        if required if required is not None else f.label == f.LABEL_REQUIRED:
            return True
        if f.message_type is not None and _has_required(f.message_type, seen):
            return True
    return False


_FIELD_ONE: dict[int, bytes] = {}
_PARSE_ERRORS = (DecodeError, RuntimeError, ValueError)  # RuntimeError: upb's recursion limit


def _field_one(size: int) -> bytes:
    """The tag and length of a length-delimited field 1 of ``size`` bytes."""
    found = _FIELD_ONE.get(size)
    if found is None:
        length = bytearray()
        rest = size
        while rest > 0x7F:
            length.append(rest & 0x7F | 0x80)
            rest >>= 7
        length.append(rest)
        found = b"\x0a" + bytes(length)
        if size < 1 << 14:  # at most 16,384 kept
            _FIELD_ONE[size] = found
    return found


def compile_proto(files: Mapping[str, str], main: str) -> tuple[Any, list[Any]] | str:
    """Compile registry protobuf schemas with protoc (in-process, from grpcio-tools) into a new pool.

    ``files`` maps import paths to schemas as the registry holds them: ``.proto`` text (what
    Confluent's registry answers by default), or a base64 ``FileDescriptorProto`` (what the Confluent
    Python serializer registers, and what Apicurio then answers). Descriptors reach protoc through
    ``--descriptor_set_in``; the well-known types (google/protobuf/*.proto) come with grpcio-tools and
    Confluent's built-in imports (confluent/meta.proto …) with confluent-kafka. Returns (pool, the
    top-level message descriptors of ``main`` in declaration order, which the Confluent message
    indexes count), or protoc's error message.
    """
    from grpc_tools import _protoc_compiler  # type: ignore[import-untyped]
    from grpc_tools import protoc as grpc_protoc

    include = str(Path(grpc_protoc.__file__).parent / "_proto")
    texts: dict[str, str] = {}
    compiled = descriptor_pb2.FileDescriptorSet()
    for name, schema in files.items():
        file_proto = _serialized_descriptor(schema)
        if file_proto is None:
            texts[name] = schema
        else:
            file_proto.name = name  # imports name it as the reference does (so does Confluent's client)
            compiled.file.append(file_proto)
    given = set(files)
    compiled.file.extend(proto for proto in _builtin_protos() if proto.name not in given)
    with tempfile.TemporaryDirectory(prefix="k2d-proto-") as directory:
        for name, text in texts.items():
            target = Path(directory, name)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        known = os.path.join(directory, "known-descriptors.pb")
        Path(known).write_bytes(compiled.SerializeToString())
        out = os.path.join(directory, "descriptor-set.pb")
        arguments = [
            b"protoc",
            f"--descriptor_set_in={known}".encode(),
            f"-I{directory}".encode(),
            f"-I{include}".encode(),
            f"--descriptor_set_out={out}".encode(),
            b"--include_imports",
            main.encode(),
        ]
        if _protoc_compiler.run_main(arguments) != 0:
            # run_main only prints its errors; get_protos returns them (file:line:column: message)
            # but knows no descriptor inputs, so it explains errors in sources only.
            try:
                _protoc_compiler.get_protos(main.encode(), [directory.encode(), include.encode()])
            except _protoc_compiler.ProtocErrors as exc:
                return "; ".join(
                    # ProtocError positions are 0-based; editors and protoc's CLI count from 1.
                    f"{_text(e.filename)}:{e.line + 1}:{e.column + 1}: {_text(e.message)}"
                    for e in exc.errors()
                ).replace(directory + os.sep, "")
            return "protoc failed (its message is on standard error)"
        descriptor_set = descriptor_pb2.FileDescriptorSet.FromString(Path(out).read_bytes())
    # A pool per schema id: two versions of one .proto define the same names differently.
    pool = descriptor_pool.DescriptorPool()
    main_proto = None
    for file_proto in descriptor_set.file:  # dependencies first, as protoc writes them
        pool.Add(file_proto)
        if file_proto.name == main:
            main_proto = file_proto
    if main_proto is None:  # pragma: no cover - protoc always includes the file it compiled
        return f"protoc did not describe {main}"
    package = f"{main_proto.package}." if main_proto.package else ""
    top = [pool.FindMessageTypeByName(package + message.name) for message in main_proto.message_type]
    return pool, top


_BASE64 = re.compile(r"[A-Za-z0-9+/=\s]+")


def _serialized_descriptor(schema: str) -> Any:
    """The FileDescriptorProto of a base64-serialized schema, or None for ``.proto`` text."""
    # .proto text always holds a ';' or a '{' (a syntax line, a field); base64 never does.
    if not schema.strip() or not _BASE64.fullmatch(schema):
        return None
    try:
        return descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(schema, validate=False))
    except (binascii.Error, DecodeError, ValueError):
        return None


_CONFLUENT_TYPES = ("meta_pb2", "type.decimal_pb2", "type.variant_pb2", "types.decimal_pb2")
_GOOGLE_TYPES = (
    "calendar_period",
    "color",
    "date",
    "datetime",
    "dayofweek",
    "decimal",
    "expr",
    "fraction",
    "interval",
    "latlng",
    "localized_text",
    "money",
    "month",
    "phone_number",
    "postal_address",
    "quaternion",
    "timeofday",
)


@functools.cache
def _builtin_protos() -> tuple[Any, ...]:
    """Files the registries' serializers treat as built in (never sent as references): Confluent's own
    confluent/*.proto, and Google's google/type/*.proto (googleapis-common-protos), which both Confluent and
    AWS Glue resolve without a reference; and AWS's own additionalTypes/decimal.proto and metadata/metadata.proto,
    which AWS's serializers ship (:mod:`~kafka2delta.serialization.protobuf_aws`)."""
    modules = [f"confluent_kafka.schema_registry.confluent.{name}" for name in _CONFLUENT_TYPES]
    modules += [f"google.type.{name}_pb2" for name in _GOOGLE_TYPES]
    found = list(aws_protos())
    for module in modules:
        try:
            loaded = importlib.import_module(module)
        except ImportError:  # an older confluent-kafka or no googleapis-common-protos: such imports fail by name
            continue
        found.append(descriptor_pb2.FileDescriptorProto.FromString(loaded.DESCRIPTOR.serialized_pb))
    return tuple(found)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class ProtobufDeserializer(BaseDeserializer):
    """Protobuf messages in a registry's wire format (see the module docstring)."""

    typed = True

    def __init__(self, keys: KeyDecoder | None, codec: ProtobufCodec, *, topic: str = "") -> None:
        super().__init__(keys)
        self._codec = codec
        self.topic = topic

    def _document(self, payload: bytes) -> dict[str, Any]:
        return self._codec.read_value(payload)

    def typed_document(self, payload: bytes) -> tuple[dict[str, Any], pa.StructType | None]:
        """One message's values and the Arrow type its message type gives them (None when that type has fields no
        Arrow type holds faithfully: a recursive message). The upsert lanes type their rows with it."""
        _, shape, value = self._read(payload)
        return value, shape.arrow if isinstance(shape.arrow, pa.StructType) and not shape.slow else None

    def _read(self, payload: bytes) -> tuple[Hashable, Shape, dict[str, Any]]:
        key, message, value = self._codec.read(payload)
        return key, message.shape, value

    def _decode_values(self, messages: PartitionMessages, positions: Sequence[int]) -> Decoded:
        """Batches of at least :data:`COLUMN_LANE_MIN_MESSAGES` of one schema's first message type (message
        indexes ``[0]``, written as one 0 byte) go through the column lanes: first the wire lane (numpy over the
        bytes, :mod:`kafka2delta.serialization.protobuf_batch`), then for what it declines, or a schema it does not
        read, the library lane (each message parsed by protobuf, then one ``pa.array`` per field, no dicts); the
        rest, and whatever the library lane declines, one by one."""
        if len(positions) < COLUMN_LANE_MIN_MESSAGES:
            return grouped_decode(messages, positions, self._read)
        datums = self._codec.lay_out([messages.payloads[position] for position in positions])
        first_type = (datums.ends > datums.starts) & (np.frombuffer(datums.buffer, np.uint8)[datums.starts] == 0)
        at = np.asarray(positions, np.int64)
        one_by_one = at[(datums.schemas < 0) | ~first_type].tolist()
        groups: dict[Hashable, TypedGroup] = {}
        for index, schema_id in enumerate(datums.schema_ids):
            rows = np.flatnonzero((datums.schemas == index) & first_type)
            message = self._codec.columns_of(schema_id) if len(rows) >= COLUMN_LANE_MIN_MESSAGES else None
            if message is None or message.columns is None:
                one_by_one.extend(at[rows].tolist())
                continue
            pieces: list[tuple[list[int], pa.Table]] = []
            if message.wire is not None:
                # The bodies start after the message-index byte (0: the first message type).
                table, declined = message.wire.read(datums.buffer, datums.starts[rows] + 1, datums.ends[rows])
                if declined.any():
                    table = table.filter(pa.array(~declined))
                pieces.append((at[rows[~declined]].tolist(), table))
                rows = rows[declined]  # the library lane reads them (and says why, if it cannot)
            if len(rows):
                spans = zip(datums.starts[rows].tolist(), datums.ends[rows].tolist(), strict=True)
                bodies = [datums.buffer[start + 1 : end] for start, end in spans]
                kept, table, left = self._library_lane(message, bodies, at[rows].tolist())
                one_by_one.extend(left)
                if table is not None:
                    pieces.append((kept, table))
            pieces = [piece for piece in pieces if piece[0]]
            if pieces:
                groups[(schema_id, (0,))] = TypedGroup(message.shape, columns=_joined(pieces))
        return grouped_decode(messages, one_by_one, self._read, groups)

    @staticmethod
    def _library_lane(
        message: _ProtoMessage, bodies: list[bytes], positions: Sequence[int]
    ) -> tuple[list[int], pa.Table | None, list[int]]:
        """The messages' bodies parsed by the protobuf library, then one ``pa.array`` per field: (the positions
        read, their table, the positions left to the per-message lane)."""
        assert message.columns is not None
        pieces, declined = isolate_failures(list(range(len(bodies))), message.parse_many(bodies), _PARSE_ERRORS)
        left = [positions[i] for i, _ in declined]  # the per-message lane says why
        parsed = [item for _, items in pieces for item in items]
        kept = [positions[i] for chunk, _ in pieces for i in chunk]
        try:
            return kept, message.columns(parsed), left
        except (MessageError, ArithmeticError, ValueError, TypeError, pa.ArrowException):
            return [], None, kept + left  # e.g. a Timestamp out of range: the per-message lane finds which


def _joined(pieces: list[tuple[list[int], pa.Table]]) -> tuple[list[int], pa.Table]:
    """The pieces of one schema's rows as one table, in position order."""
    if len(pieces) == 1:
        return pieces[0]
    positions = [position for kept, _ in pieces for position in kept]
    order = np.argsort(positions, kind="stable")
    table = pa.concat_tables([table for _, table in pieces]).take(pa.array(order))
    return np.asarray(positions)[order].tolist(), table


COLUMN_LANE_MIN_MESSAGES = 64
"""Fewest messages of one schema in a batch for the column lane (below, its fixed cost per field is not repaid)."""
