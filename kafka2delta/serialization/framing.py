"""How a registry-framed payload names its writer schema, paired with the registry that resolves the name.

Two wire formats, one :class:`Framing` protocol the Avro and Protobuf lanes read through:

* Confluent (:class:`ConfluentFraming`): byte 0 is ``0``, bytes 1-4 the schema id (big-endian), then the
  datum. The id is looked up in a Confluent-API registry (:class:`kafka2delta.registry.SchemaRegistry`).
* AWS Glue (:class:`GlueFraming`, AWS's serde library): byte 0 is the header version ``3``, byte 1 the
  compression (``0`` none, ``5`` zlib), bytes 2-17 the schema version UUID, then the datum (zlib-compressed
  with ``5``). The UUID is looked up with ``GetSchemaVersion`` (:class:`kafka2delta.registry_glue.GlueRegistry`).

A Protobuf datum starts with the message type's index in its schema, written each wire format's own way
(:mod:`kafka2delta.serialization.protobuf_indexes`); :attr:`Framing.protobuf_indexes` says which.

A writer schema is named by an ``int`` either way (a Glue UUID is read as its 128-bit integer), so the
caches and batch groups keyed by schema id serve both; :meth:`Framing.describe` names it in reasons.
A header that is not the wire format's, a compression byte it does not define, truncated bytes, and a zlib
stream that is corrupt or inflates beyond :data:`MAX_DECOMPRESSED_BYTES` are :class:`MessageError`
(stage ``deserialize``): dead letters.
"""

from __future__ import annotations

import uuid
import zlib
from collections.abc import Sequence
from typing import Protocol, cast

import numpy as np

from kafka2delta.errors import MessageError
from kafka2delta.registry import RegisteredSchema, SchemaRegistry
from kafka2delta.serialization.avro_batch import PADDING, Datums, lay_out
from kafka2delta.serialization.base import (
    CONFLUENT_HEADER_BYTES,
    MAX_DECOMPRESSED_BYTES,
    decode_error,
    hex_bytes,
    split_confluent,
)
from kafka2delta.serialization.protobuf_indexes import CONFLUENT_INDEXES, GLUE_INDEXES, MessageIndexes

GLUE_HEADER_VERSION = 3
GLUE_COMPRESSION_NONE = 0
GLUE_COMPRESSION_ZLIB = 5
GLUE_HEADER_BYTES = 18  # header version, compression, 16-byte schema version UUID


class Framing(Protocol):
    """A wire format and its registry, as the Avro and Protobuf lanes need them."""

    @property
    def protobuf_indexes(self) -> MessageIndexes:
        """How a Protobuf datum in this wire format names its message type."""
        ...

    def unframe(self, payload: bytes) -> tuple[int, bytes, int]:
        """(the writer schema's number, the bytes holding the datum, where in them it starts)."""
        ...

    def lay_out(self, payloads: Sequence[bytes | None]) -> Datums:
        """The payloads' datums end to end, each with its writer schema, for the column lanes; a payload not in
        the wire format gets schema -1 (the per-message lane says why)."""
        ...

    def schema(self, schema_id: int) -> RegisteredSchema:
        """The writer schema; MessageError if the registry does not have it, RetryableError if unreachable."""
        ...

    def referenced(self, subject: str, version: int) -> RegisteredSchema:
        """A schema a reference points at (an Avro named type defined in another subject)."""
        ...

    def describe(self, schema_id: int) -> str:
        """How reasons name the writer schema: ``schema id 7``, ``schema version <uuid>``."""
        ...


class GlueSchemas(Protocol):
    """What :class:`GlueFraming` needs of the Glue registry edge."""

    def schema_version(self, version_id: uuid.UUID) -> RegisteredSchema: ...


class ConfluentFraming:
    """The Confluent wire format: magic byte ``0``, a 4-byte schema id."""

    protobuf_indexes: MessageIndexes = CONFLUENT_INDEXES

    def __init__(self, registry: SchemaRegistry) -> None:
        self.registry = registry

    def unframe(self, payload: bytes) -> tuple[int, bytes, int]:
        return split_confluent(payload), payload, CONFLUENT_HEADER_BYTES

    def lay_out(self, payloads: Sequence[bytes | None]) -> Datums:
        return lay_out(payloads, CONFLUENT_HEADER_BYTES)

    def schema(self, schema_id: int) -> RegisteredSchema:
        return self.registry.schema(schema_id)

    def referenced(self, subject: str, version: int) -> RegisteredSchema:
        return self.registry.referenced(subject, version)

    def describe(self, schema_id: int) -> str:
        return f"schema id {schema_id}"


GLUE_INFLATED_BATCH_BYTES = 128 * 1024 * 1024
"""The zlib-inflated bytes one batch read holds at most (beyond one payload's own cap, MAX_DECOMPRESSED_BYTES)."""


class GlueFraming:
    """The AWS Glue Schema Registry wire format: header version ``3``, compression, schema version UUID."""

    protobuf_indexes: MessageIndexes = GLUE_INDEXES

    def __init__(self, registry: GlueSchemas) -> None:
        self.registry = registry

    def unframe(self, payload: bytes) -> tuple[int, bytes, int]:
        version_id, datum = split_glue(payload)
        return version_id.int, datum, 0

    def lay_out(self, payloads: Sequence[bytes | None]) -> Datums:
        # Uncompressed payloads stay where they lie and their UUIDs are read for all of them at once; only the
        # zlib ones are inflated (one by one) and put after the others, up to GLUE_INFLATED_BATCH_BYTES: the rest
        # take the per-message lane, one inflated at a time (found by review: 200 small bombs held 12.8 GiB).
        laid = lay_out(payloads, 0)
        data = np.frombuffer(laid.buffer, np.uint8)
        begins = laid.starts  # each payload's first byte; PADDING zero bytes follow the last one
        headed = (laid.schemas >= 0) & (laid.ends - begins >= GLUE_HEADER_BYTES) & (data[begins] == GLUE_HEADER_VERSION)
        compression = data[begins + 1]
        plain = np.flatnonzero(headed & (compression == GLUE_COMPRESSION_NONE))
        schemas = np.full(len(payloads), -1, np.int64)
        ends = laid.ends.copy()
        starts = ends.copy()  # a payload not in the format: an empty datum (the header is longer than PADDING)
        starts[plain] = begins[plain] + GLUE_HEADER_BYTES
        uuids = data[begins[plain, None] + np.arange(2, GLUE_HEADER_BYTES)]
        versions, schemas[plain] = np.unique(
            np.ascontiguousarray(uuids).view(np.dtype((np.void, 16))).ravel(), return_inverse=True
        )
        known = {int.from_bytes(version.tobytes(), "big"): index for index, version in enumerate(versions)}
        pieces = [laid.buffer]
        inflated: list[int] = []
        inflated_schemas: list[int] = []
        held = 0
        for row in np.flatnonzero(headed & (compression == GLUE_COMPRESSION_ZLIB)).tolist():
            try:
                version_id, datum = split_glue(cast(bytes, payloads[row]))
            except MessageError:
                continue  # the per-message lane says why
            if held + len(datum) > GLUE_INFLATED_BATCH_BYTES:
                break
            held += len(datum)
            inflated.append(row)
            inflated_schemas.append(known.setdefault(version_id.int, len(known)))
            pieces.append(datum)
        if not inflated:
            return Datums(laid.buffer, starts, ends, schemas, list(known))
        sizes = np.fromiter(map(len, pieces), np.int64, len(pieces))
        ends[inflated] = np.cumsum(sizes)[1:]
        starts[inflated] = ends[inflated] - sizes[1:]
        schemas[inflated] = inflated_schemas
        pieces.append(bytes(PADDING))
        return Datums(b"".join(pieces), starts, ends, schemas, list(known))

    def schema(self, schema_id: int) -> RegisteredSchema:
        return self.registry.schema_version(uuid.UUID(int=schema_id))

    def referenced(self, subject: str, version: int) -> RegisteredSchema:
        # Glue schemas carry no references; a RegisteredSchema from Glue never names one.
        raise decode_error(f"Glue schemas have no references (asked for {subject!r} version {version})")

    def describe(self, schema_id: int) -> str:
        return f"schema version {uuid.UUID(int=schema_id)}"


def split_glue(payload: bytes) -> tuple[uuid.UUID, bytes]:
    """The schema version UUID of a Glue wire-format payload and its datum (inflated when zlib-compressed)."""
    if payload[:1] != bytes([GLUE_HEADER_VERSION]):
        raise decode_error(
            f"not Glue wire format: header version byte {hex_bytes(payload[:1])}, expected 0x{GLUE_HEADER_VERSION:02x}"
        )
    if len(payload) < GLUE_HEADER_BYTES:
        raise decode_error(f"truncated: {len(payload)} bytes, the Glue header needs {GLUE_HEADER_BYTES}")
    compression = payload[1]
    version_id = uuid.UUID(bytes=payload[2:GLUE_HEADER_BYTES])
    datum = payload[GLUE_HEADER_BYTES:]
    if compression == GLUE_COMPRESSION_NONE:
        return version_id, datum
    if compression == GLUE_COMPRESSION_ZLIB:
        return version_id, _inflate(datum)
    raise decode_error(
        f"not Glue wire format: compression byte 0x{compression:02x}, expected 0x00 (none) or 0x05 (zlib)"
    )


def _inflate(data: bytes) -> bytes:
    inflater = zlib.decompressobj()
    try:
        # max_length caps the output, so a bomb never allocates more than the cap.
        inflated = inflater.decompress(data, MAX_DECOMPRESSED_BYTES + 1)
    except zlib.error as exc:
        raise decode_error(f"the Glue payload is not valid zlib: {exc}") from exc
    if len(inflated) > MAX_DECOMPRESSED_BYTES or inflater.unconsumed_tail:
        raise decode_error(f"the Glue payload inflates beyond {MAX_DECOMPRESSED_BYTES // (1024 * 1024)} MiB")
    if not inflater.eof:
        raise decode_error("the Glue payload's zlib stream is truncated")
    if inflater.unused_data:
        raise decode_error(f"{len(inflater.unused_data)} trailing bytes after the Glue payload's zlib stream")
    return inflated
