"""JSON payloads in the AWS Glue Schema Registry's wire format (``format.type = "json"`` with
``schema_registry.type = "glue"``): a JSON Schema registered in Glue, the JSON text behind Glue's header.

The header is taken off each message (:func:`~kafka2delta.serialization.framing.split_glue`, zlib inflated),
its schema version is looked up in Glue (cached there) only to hold the same rules as the Avro lane (a
version Glue does not have, or one that is not a JSON Schema, is a dead letter; Glue unreachable is raised,
never a dead letter), and the JSON text goes through the JSON lane unchanged: one Arrow read per batch, in
rounds of bounded inflated size (a batch of small zlib bombs is never all held inflated), the reference lane per
message. The JSON Schema itself does not type the columns (the JSON lane infers, as for plain JSON); it is not
validated against either.
"""

from __future__ import annotations

from kafka2delta.serialization.base import decode_error
from kafka2delta.serialization.framing import GlueSchemas, split_glue


class GlueJsonPayloads:
    """The JSON text of a Glue wire-format payload, the JSON lane's ``unwrap`` (see the module docstring)."""

    def __init__(self, registry: GlueSchemas) -> None:
        self._registry = registry

    def __call__(self, payload: bytes) -> bytes:
        version_id, datum = split_glue(payload)
        registered = self._registry.schema_version(version_id)
        if registered.schema_type != "JSON":
            raise decode_error(f"schema version {version_id} is a {registered.schema_type} schema, not JSON")
        return datum
