"""AWS's own Protobuf types: the two files AWS's Glue serializers ship and resolve without a reference, and what
an ``additionalTypes.Decimal`` becomes in a table.

``additionalTypes/decimal.proto`` declares ``message Decimal {int64 units = 1; int32 fraction = 2; uint32
precision = 3; int32 scale = 4;}``: a number as whole units plus billionths (``fraction``), as AWS's Kafka
Connect Protobuf converter writes Connect's Decimal (Debezium's NUMERIC columns, for example).
``metadata/metadata.proto`` extends a field's options with two strings, ``metadata_key`` (50001) and
``metadata_value`` (50002); the converter sets them to ``connect.decimal.scale`` and the scale when its Connect
schema names one.

A Decimal field lands as ``decimal128(19 + s, s)``: ``s`` is the field's ``connect.decimal.scale`` when that
is a whole number from 0 to 19, else 9 (billionths, the finest a Decimal carries, so every value fits); 19
digits hold any int64 of units. A value with more decimal places than ``s`` is a dead letter naming the field.
The message's own ``precision`` and ``scale`` describe the producer's number, not the column, and are not used.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from decimal import Context, Decimal
from typing import Any

import pyarrow as pa
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # type: ignore[import-untyped]
from google.protobuf.descriptor import FieldDescriptor as F  # type: ignore[import-untyped]
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]

from kafka2delta.serialization.base import decode_error
from kafka2delta.serialization.protobuf_indexes import is_repeated

DECIMAL = "additionalTypes.Decimal"
_SCALE_KEY = "connect.decimal.scale"
FRACTION_DIGITS = 9
"""A Decimal's ``fraction`` counts billionths."""
_DEFAULT_SCALE = FRACTION_DIGITS
_MAX_SCALE = 19
_UNIT_DIGITS = 19
_T = descriptor_pb2.FieldDescriptorProto
_EXACT = Context(prec=_UNIT_DIGITS + _MAX_SCALE)
"""Enough digits for any units and billionths at any column scale (Python's default context keeps 28)."""


def _field(name: str, number: int, kind: int) -> Any:
    return _T(name=name, number=number, type=kind, label=_T.LABEL_OPTIONAL, json_name=_json_name(name))


def _json_name(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


@functools.cache
def aws_protos() -> tuple[Any, ...]:
    """The FileDescriptorProtos of AWS's additionalTypes/decimal.proto and metadata/metadata.proto."""
    decimal = descriptor_pb2.FileDescriptorProto(name="additionalTypes/decimal.proto", package="additionalTypes")
    decimal.syntax = "proto3"
    decimal.options.java_package = "additionalTypes"
    decimal.options.java_outer_classname = "Decimals"
    decimal.message_type.add(
        name="Decimal",
        field=[
            _field("units", 1, _T.TYPE_INT64),
            _field("fraction", 2, _T.TYPE_INT32),
            _field("precision", 3, _T.TYPE_UINT32),
            _field("scale", 4, _T.TYPE_INT32),
        ],
    )
    metadata = descriptor_pb2.FileDescriptorProto(
        name="metadata/metadata.proto", package="metadata", dependency=["google/protobuf/descriptor.proto"]
    )
    metadata.syntax = "proto3"
    metadata.options.java_package = "metadata"
    metadata.options.java_outer_classname = "ProtobufSchemaMetadata"
    for name, number in (("metadata_key", 50001), ("metadata_value", 50002)):
        extension = _field(name, number, _T.TYPE_STRING)
        extension.extendee = ".google.protobuf.FieldOptions"
        metadata.extension.append(extension)
    return decimal, metadata


def is_aws_decimal(descriptor: Any) -> bool:
    """Whether a message type is AWS's Decimal: its name and exactly its four plain fields (a schema's own
    ``additionalTypes.Decimal`` of another shape, with ``optional`` or repeated fields or more members, stays an
    ordinary message)."""
    if descriptor.full_name != DECIMAL:
        return False
    return {(f.number, f.name, f.type, is_repeated(f), f.has_presence) for f in descriptor.fields} == _DECIMAL_SHAPE


_DECIMAL_SHAPE = {
    (1, "units", F.TYPE_INT64, False, False),
    (2, "fraction", F.TYPE_INT32, False, False),
    (3, "precision", F.TYPE_UINT32, False, False),
    (4, "scale", F.TYPE_INT32, False, False),
}


@functools.cache
def _metadata_options() -> Any:
    """A message class reading a FieldOptions' bytes for the two metadata options alone (others are skipped)."""
    options = descriptor_pb2.FileDescriptorProto(name="k2d/metadata_options.proto", package="k2d")
    options.syntax = "proto3"
    options.message_type.add(
        name="MetadataOptions",
        field=[_field("metadata_key", 50001, _T.TYPE_STRING), _field("metadata_value", 50002, _T.TYPE_STRING)],
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(options)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("k2d.MetadataOptions"))


def decimal_scale(f: Any) -> int:
    """The column scale of Decimal field ``f``: its ``connect.decimal.scale`` metadata, else 9."""
    if not f.has_options:
        return _DEFAULT_SCALE
    try:
        found = _metadata_options().FromString(f.GetOptions().SerializeToString())
    except DecodeError:  # an option numbered 50001 or 50002 of another type: not AWS's metadata
        return _DEFAULT_SCALE
    value = found.metadata_value.strip()
    if found.metadata_key != _SCALE_KEY or not value.isdecimal() or int(value) > _MAX_SCALE:
        return _DEFAULT_SCALE
    return int(value)


def decimal_type(scale: int) -> pa.Decimal128Type:
    """The column type of Decimals at ``scale``: room for any int64 of units."""
    return pa.decimal128(_UNIT_DIGITS + scale, scale)


@functools.lru_cache(maxsize=1024)  # the reference lane of a recursive message asks per value
def decimal_field(f: Any) -> tuple[pa.DataType, Callable[[Any], Decimal]]:
    """The Arrow type of Decimal field ``f`` and its converter of one Decimal message to a Python Decimal."""
    scale = decimal_scale(f)
    exponent = Decimal(1).scaleb(-scale)
    name = f.name

    def convert(message: Any) -> Decimal:
        number = _EXACT.add(Decimal(message.units), Decimal(message.fraction).scaleb(-FRACTION_DIGITS))
        fitted = number.quantize(exponent, context=_EXACT)
        if fitted != number:
            raise decode_error(f"{name}: additionalTypes.Decimal {number} has more than {scale} decimal places")
        return fitted

    return decimal_type(scale), convert
