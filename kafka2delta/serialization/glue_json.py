"""JSON payloads in the AWS Glue Schema Registry's wire format (``format.type = "json"`` with
``schema_registry.type = "glue"``): a JSON Schema registered in Glue, the JSON text behind Glue's header.

The header is taken off each message (:func:`~kafka2delta.serialization.framing.split_glue`, zlib inflated),
its schema version is looked up in Glue (cached there) only to hold the same rules as the Avro lane (a
version Glue does not have, or one that is not a JSON Schema, is a dead letter; Glue unreachable is raised,
never a dead letter), and the JSON text goes through the JSON lane unchanged: one Arrow read per batch, the
reference lane per message. The JSON Schema itself does not type the columns (the JSON lane infers, as for
plain JSON); it is not validated against either.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from kafka2delta.errors import MessageError
from kafka2delta.records import PartitionMessages
from kafka2delta.serialization.base import Decoded, decode_error, payload_at
from kafka2delta.serialization.framing import GlueSchemas, split_glue
from kafka2delta.serialization.json import JsonDeserializer


class GlueJsonDeserializer:
    """The JSON lane behind Glue's header (see the module docstring)."""

    def __init__(self, inner: JsonDeserializer, registry: GlueSchemas) -> None:
        self._inner = inner
        self._registry = registry

    def set_read_schema(self, schema: pa.Schema, table_schema: pa.Schema | None = None) -> None:
        self._inner.set_read_schema(schema, table_schema)

    def decode(self, messages: PartitionMessages, positions: Sequence[int]) -> Decoded:
        payloads = list(messages.payloads)
        failures: list[tuple[int, MessageError]] = []
        kept: list[int] = []
        for position in positions:
            try:
                payloads[position] = self._unframe(payload_at(messages, position))
            except MessageError as exc:
                failures.append((position, exc))
                continue
            kept.append(position)
        decoded = self._inner.decode(dataclasses.replace(messages, payloads=payloads), kept)
        if failures:
            decoded.failures = sorted(failures + decoded.failures, key=lambda failure: failure[0])
        return decoded

    def document(self, messages: PartitionMessages, position: int) -> dict[str, Any]:
        payloads = list(messages.payloads)
        payloads[position] = self._unframe(payload_at(messages, position))
        return self._inner.document(dataclasses.replace(messages, payloads=payloads), position)

    def _unframe(self, payload: bytes) -> bytes:
        version_id, datum = split_glue(payload)
        registered = self._registry.schema_version(version_id)
        if registered.schema_type != "JSON":
            raise decode_error(f"schema version {version_id} is a {registered.schema_type} schema, not JSON")
        return datum
