"""Producing payloads in the AWS Glue Schema Registry's wire format, as AWS's serde library does.

Schemas are registered in a Glue API (moto's, in process with ``mock_aws`` or served on loopback by
:class:`dev.s3.LocalS3`: moto's server answers every service on its one port) through boto3, and records
are framed by hand: byte 0 the header version 3, byte 1 the compression (0 none, 5 zlib), bytes 2-17 the
schema version UUID, then the Avro binary (zlib-compressed with 5). A Protobuf message is preceded by its type's
index among the schema's message types sorted by full name (one unsigned varint), as AWS's serializer writes it.

    schemas = GlueSchemas(glue_client(server.endpoint))
    version = schemas.register("events", schema)
    payload = glue_avro(version, schema, {"id": "a"}, zlib_compressed=True)
"""

from __future__ import annotations

import contextlib
import io
import json
import uuid
import zlib
from typing import Any

import boto3
import fastavro

from dev.s3 import ACCESS_KEY, REGION, SECRET_KEY

REGISTRY = "k2d-test"
AWS_PROTOS = {
    "additionalTypes/decimal.proto": """syntax = "proto3";
package additionalTypes;
message Decimal { int64 units = 1; int32 fraction = 2; uint32 precision = 3; int32 scale = 4; }
""",
    "metadata/metadata.proto": """syntax = "proto3";
package metadata;
import "google/protobuf/descriptor.proto";
extend google.protobuf.FieldOptions { string metadata_key = 50001; string metadata_value = 50002; }
""",
}
"""The producer's copies of the two files AWS's serializers ship, which AWS's Kafka Connect Protobuf converter
imports for a Connect Decimal and its scale (the daemon has its own; Glue holds no references)."""
__all__ = [
    "AWS_PROTOS",
    "REGION",
    "REGISTRY",
    "GlueSchemas",
    "glue_avro",
    "glue_client",
    "glue_environment",
    "glue_frame",
    "glue_protobuf",
]


def glue_client(endpoint: str | None = None) -> Any:
    """A boto3 Glue client with the test credentials (``endpoint``: moto's server; None: ``mock_aws``)."""
    return boto3.client(
        "glue",
        endpoint_url=endpoint,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name=REGION,
    )


def glue_environment() -> dict[str, str]:
    """The AWS environment a daemon needs to reach moto's Glue with the test credentials."""
    return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": REGION}


class GlueSchemas:
    """Registers schemas in one Glue registry, as a producer's serializer would (auto-registration)."""

    def __init__(self, client: Any, registry: str = REGISTRY) -> None:
        self.client = client
        self.registry = registry
        with contextlib.suppress(client.exceptions.AlreadyExistsException):
            client.create_registry(RegistryName=registry)

    def register(self, schema_name: str, schema: dict[str, Any] | str, data_format: str = "AVRO") -> uuid.UUID:
        """The version id of ``schema`` (``AVRO`` or ``JSON`` as a dict, ``PROTOBUF`` as ``.proto`` text) under
        ``schema_name`` (a new schema, or its next version)."""
        definition = schema if isinstance(schema, str) else json.dumps(schema)
        try:
            answer = self.client.create_schema(
                RegistryId={"RegistryName": self.registry},
                SchemaName=schema_name,
                DataFormat=data_format,
                Compatibility="NONE",
                SchemaDefinition=definition,
            )
        except self.client.exceptions.AlreadyExistsException:
            answer = self.client.register_schema_version(
                SchemaId={"RegistryName": self.registry, "SchemaName": schema_name}, SchemaDefinition=definition
            )
        return uuid.UUID(answer["SchemaVersionId"])


def glue_frame(version_id: uuid.UUID, datum: bytes, *, zlib_compressed: bool = False) -> bytes:
    """``datum`` in Glue's wire format."""
    if zlib_compressed:
        return bytes([3, 5]) + version_id.bytes + zlib.compress(datum)
    return bytes([3, 0]) + version_id.bytes + datum


def glue_avro(
    version_id: uuid.UUID, schema: dict[str, Any], record: dict[str, Any], *, zlib_compressed: bool = False
) -> bytes:
    """``record`` written with ``schema`` (the schema of ``version_id``) in Glue's wire format."""
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return glue_frame(version_id, out.getvalue(), zlib_compressed=zlib_compressed)


def glue_protobuf(version_id: uuid.UUID, message: Any, *, zlib_compressed: bool = False) -> bytes:
    """A Protobuf ``message`` (its schema is the one of ``version_id``) in Glue's wire format."""
    index = sorted(_message_names(message.DESCRIPTOR.file.message_types_by_name.values())).index(
        message.DESCRIPTOR.full_name
    )
    varint = bytearray()
    while index > 0x7F:
        varint.append(index & 0x7F | 0x80)
        index >>= 7
    varint.append(index)
    return glue_frame(version_id, bytes(varint) + message.SerializeToString(), zlib_compressed=zlib_compressed)


def _message_names(descriptors: Any) -> list[str]:
    """The full names of ``descriptors`` and of every message type nested in them, depth first."""
    return [name for d in descriptors for name in [d.full_name, *_message_names(d.nested_types)]]
