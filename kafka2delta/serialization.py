"""Deserializers: payload bytes of many messages → one Arrow table (stage ``deserialize``).

JSON goes through Arrow's C++ JSON reader in one call per batch; a malformed message is found
by bisection (:func:`~kafka2delta.batches.isolate_failures`) and becomes a dead letter.
Other formats (Avro, Protobuf, raw) plug in behind the same :class:`Deserializer` protocol.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Protocol

import pyarrow as pa
import pyarrow.json as pa_json

from kafka2delta.batches import StageResult, isolate_failures
from kafka2delta.errors import MessageError

STAGE = "deserialize"


class Deserializer(Protocol):
    def decode(self, payloads: Sequence[bytes]) -> StageResult:
        """Decode every payload; rows keep input order, failures carry the input index."""
        ...


def json_read_type(data_type: pa.DataType) -> pa.DataType:
    """The type Arrow's JSON reader should produce for a table column of ``data_type``.

    Temporal, decimal and binary columns are read as strings and converted by the coercion stage,
    which knows the accepted formats and reports per message what it could not convert.
    """
    if pa.types.is_temporal(data_type) or pa.types.is_decimal(data_type) or pa.types.is_binary(data_type):
        return pa.string()
    if pa.types.is_struct(data_type):
        return pa.struct([pa.field(f.name, json_read_type(f.type)) for f in data_type])
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        return pa.list_(json_read_type(data_type.value_type))
    return data_type


class JsonDeserializer:
    """One JSON object per message; fields not in the table are ignored."""

    def __init__(self, table_schema: pa.Schema) -> None:
        fields = [
            pa.field(f.name, json_read_type(f.type))
            for f in table_schema
            # Maps have no JSON-reader type; issue-level coercion reads them from objects later.
            if not pa.types.is_map(f.type)
        ]
        self._read_schema = pa.schema(fields)

    def decode(self, payloads: Sequence[bytes]) -> StageResult:
        def parse(chunk: list[int]) -> pa.Table:
            data = b"\n".join(payloads[i] for i in chunk)
            # Pretty-printed payloads hold newlines; the reader must then track JSON structure.
            newlines_in_values = data.count(b"\n") != len(chunk) - 1
            table = pa_json.read_json(
                io.BytesIO(data),
                read_options=pa_json.ReadOptions(block_size=len(data) + 1, use_threads=False),
                parse_options=pa_json.ParseOptions(
                    explicit_schema=self._read_schema,
                    unexpected_field_behavior="ignore",
                    newlines_in_values=newlines_in_values,
                ),
            )
            if table.num_rows != len(chunk):
                # Two objects in one payload, or an unterminated one swallowing its neighbour.
                raise ValueError(f"payloads held {table.num_rows} JSON objects for {len(chunk)} messages")
            return table

        pieces, failures = isolate_failures(list(range(len(payloads))), parse, (pa.ArrowInvalid, ValueError))
        rows = pa.concat_tables([table for _, table in pieces]) if pieces else self._read_schema.empty_table()
        indices = [index for chunk, _ in pieces for index in chunk]
        return StageResult(
            rows=rows,
            indices=indices,
            failures=[(index, MessageError(STAGE, _reason(exc))) for index, exc in failures],
        )


def _reason(exc: Exception) -> str:
    text = str(exc)
    if text == "Empty JSON file":
        return "payload holds no JSON value"
    if "payloads held" in text:
        return "payload does not hold exactly one JSON object"
    return text.replace(" in row 0", "")
