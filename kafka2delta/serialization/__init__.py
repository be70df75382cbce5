"""Deserializers: payload bytes (and keys) of many messages → documents (stage ``deserialize``).

This package's face: :func:`build_deserializer` (the factory for ``[format]`` and ``format.key``) and
the public names. One module per format (``json``, ``raw``, ``avro``, ``protobuf``); ``base`` holds what
they all share (the protocol, the decode skeleton, gzip, the Confluent header) and ``typed`` the fast
lane of the schema-typed formats.

Two lanes, one contract:

* :meth:`Deserializer.decode` — the fast lane: one Arrow table for the batch (JSON through Arrow's
  C++ reader, Avro/Protobuf records converted with their writer schema's Arrow type). Messages it
  cannot put in the table go to ``documents`` (decoded the slow way) or ``failures`` (dead letters).
* :meth:`Deserializer.document` — the reference lane: one message → one dict of Python values.

A message's outcome (dead letter or not, and its values) depends only on the message itself, never
on its neighbours in the batch, so a replay after a crash gives the same result. The *lane* a valid
message takes may depend on its neighbours in one case: two messages whose values give one field
incompatible Arrow types (JSON: an unknown field that is a string here and a number there; Avro/
Protobuf: two schema versions that changed a field's type) cannot share a table, so one side is sent
to the reference lane. Its values are the same either way (the coercion stage fits both lanes to the
table identically).

A registry outage is a :class:`RetryableError` (raised, never a dead letter); an unknown schema id,
a wrong magic byte, truncated bytes, invalid UTF-8, invalid JSON or a non-object JSON value are
:class:`MessageError` (stage ``deserialize``).

Formats:

* ``json``: one JSON object per message; Arrow's JSON reader in one call per clean batch, bad
  messages found by bisection; the reference lane is orjson (the standard ``json`` module when orjson
  is absent, and for payloads with integers beyond 64 bits, which orjson would turn into floats).
* ``avro``: a registry's wire format, Confluent's or AWS Glue's (``framing``: writer schema by id or
  schema version UUID, optional reader schema file), or bare datums written with
  ``format.avro_schema_file``; :func:`avro_to_arrow` gives the types.
* ``protobuf``: a registry's wire format, Confluent's or AWS Glue's (``framing``; the message type named the
  wire format's way, ``protobuf_indexes``); the ``.proto`` text is compiled by protoc (bundled in
  ``grpcio-tools``) once per schema; :func:`protobuf_to_arrow` gives the types.
* ``json`` with the Glue registry (``glue_json``): JSON text behind Glue's header, each schema version
  checked in Glue, then the JSON lane.
* ``raw``: the payload as one column (UTF-8 text or bytes).
"""

from __future__ import annotations

from kafka2delta.config import FormatConfig
from kafka2delta.errors import ConfigError
from kafka2delta.registry import SchemaRegistry
from kafka2delta.registry_glue import GlueRegistry
from kafka2delta.serialization.avro import (
    MAX_AVRO_DEPTH,
    AvroCodec,
    AvroDeserializer,
    AvroKeys,
    AvroSchema,
    avro_to_arrow,
    load_avro_schema_file,
)
from kafka2delta.serialization.base import (
    MAX_DECOMPRESSED_BYTES,
    MAX_DOCUMENT_DEPTH,
    Decoded,
    Deserializer,
    KeyDecoder,
    decode_error,
    gunzip,
    split_confluent,
    utf8_reason,
)
from kafka2delta.serialization.framing import ConfluentFraming, Framing, GlueFraming, split_glue
from kafka2delta.serialization.glue_json import GlueJsonPayloads
from kafka2delta.serialization.json import JsonDeserializer, json_readable, parse_json, parse_json_object
from kafka2delta.serialization.protobuf import ProtobufCodec, ProtobufDeserializer, compile_proto, protobuf_to_arrow
from kafka2delta.serialization.protobuf_indexes import glue_message_order, read_message_indexes
from kafka2delta.serialization.raw import RawDeserializer

__all__ = [
    "MAX_AVRO_DEPTH",
    "MAX_DECOMPRESSED_BYTES",
    "MAX_DOCUMENT_DEPTH",
    "AvroDeserializer",
    "AvroSchema",
    "Decoded",
    "Deserializer",
    "Framing",
    "GlueJsonPayloads",
    "JsonDeserializer",
    "ProtobufDeserializer",
    "RawDeserializer",
    "avro_to_arrow",
    "build_deserializer",
    "build_key_decoder",
    "compile_proto",
    "glue_message_order",
    "gunzip",
    "json_readable",
    "load_avro_schema_file",
    "parse_json",
    "parse_json_object",
    "protobuf_to_arrow",
    "read_message_indexes",
    "split_confluent",
    "split_glue",
]

Registry = SchemaRegistry | GlueRegistry
"""The registry edge a deserializer is given: a Confluent-API one or AWS Glue's (each implies its wire format)."""


def build_deserializer(format: FormatConfig, registry: Registry | None, topic: str) -> Deserializer:
    """The deserializer for ``[format]``; ConfigError when the configuration cannot work
    (an unreadable ``avro_schema_file``, protobuf or Avro keys without a registry)."""
    keys = build_key_decoder(format, registry)
    if format.type == "json":
        if isinstance(registry, GlueRegistry):  # JSON (Schema) values in Glue's wire format
            return JsonDeserializer(keys, unwrap=GlueJsonPayloads(registry))
        return JsonDeserializer(keys, gzip=format.gzip)
    if format.type == "raw":
        return RawDeserializer(keys, column=format.raw_column, gzip=format.gzip)
    if format.type == "avro":
        reader = load_avro_schema_file(format.avro_schema_file) if format.avro_schema_file else None
        if registry is None and reader is None:
            raise ConfigError(
                "format.type",
                "avro needs a schema registry (schema_registry.url, or type = 'glue') or format.avro_schema_file",
            )
        return AvroDeserializer(keys, AvroCodec(framing_of(registry), reader), topic=topic)
    if format.type == "protobuf":
        framing = framing_of(registry)
        if framing is None:
            raise ConfigError("format.type", "protobuf needs a schema registry (schema_registry.url, or type = 'glue')")
        return ProtobufDeserializer(keys, ProtobufCodec(framing), topic=topic)
    raise ConfigError("format.type", f"unknown format {format.type!r}")


def build_key_decoder(format: FormatConfig, registry: Registry | None) -> KeyDecoder | None:
    """The decoder of ``format.key`` (None for ``none``)."""
    if format.key == "none":
        return None
    if format.key == "string":
        return _string_key
    if format.key == "json":
        return parse_json
    if format.key in ("avro", "protobuf"):
        framing = framing_of(registry)
        if framing is None:
            raise ConfigError(
                "format.key", f"{format.key} keys need a schema registry (schema_registry.url, or type = 'glue')"
            )
        return AvroKeys(AvroCodec(framing, None)) if format.key == "avro" else ProtobufCodec(framing).read_value
    raise ConfigError("format.key", f"unknown key format {format.key!r}")


def framing_of(registry: Registry | None) -> Framing | None:
    """The wire format that goes with ``registry`` (None: bare datums)."""
    if registry is None:
        return None
    if isinstance(registry, GlueRegistry):
        return GlueFraming(registry)
    return ConfluentFraming(registry)


def _string_key(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise decode_error(utf8_reason(raw, "key")) from exc
