"""Raw payloads (``format.type = "raw"``): the payload as one column, UTF-8 text or bytes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from kafka2delta.errors import MessageError
from kafka2delta.records import PartitionMessages
from kafka2delta.serialization.base import (
    BaseDeserializer,
    Decoded,
    KeyDecoder,
    decode_error,
    gunzip,
    payload_at,
    utf8_reason,
)


class RawDeserializer(BaseDeserializer):
    """The payload as one column: UTF-8 text for a string column, the bytes for a binary column."""

    typed = True

    def __init__(self, keys: KeyDecoder | None, *, column: str = "value", gzip: bool = False) -> None:
        super().__init__(keys)
        self._column = column
        self._gzip = gzip
        self._type: pa.DataType = pa.string()

    def set_read_schema(self, schema: pa.Schema, table_schema: pa.Schema | None = None) -> None:
        # The JSON read schema maps binary columns to base64 text: the table says what the column is.
        schema = table_schema if table_schema is not None else schema
        index = schema.get_field_index(self._column)
        found = schema.field(index).type if index >= 0 else pa.string()
        binary = pa.types.is_binary(found) or pa.types.is_large_binary(found) or pa.types.is_fixed_size_binary(found)
        self._type = pa.binary() if binary else pa.string()

    def _document(self, payload: bytes) -> dict[str, Any]:
        data = gunzip(payload) if self._gzip else payload
        if self._type == pa.binary():
            return {self._column: data}
        try:
            return {self._column: data.decode("utf-8")}
        except UnicodeDecodeError as exc:
            raise decode_error(utf8_reason(data)) from exc

    def _decode_values(self, messages: PartitionMessages, positions: Sequence[int]) -> Decoded:
        failures: list[tuple[int, MessageError]] = []
        fast: list[int] = []
        values: list[bytes] = []
        for position in positions:
            try:
                payload = payload_at(messages, position)
                values.append(gunzip(payload) if self._gzip else payload)
            except MessageError as exc:
                failures.append((position, exc))
                continue
            fast.append(position)
        column = pa.array(values, pa.binary())
        if self._type == pa.string():
            try:
                column = column.cast(pa.string())  # Arrow validates all the UTF-8 at once
            except pa.ArrowInvalid:
                # Some payload is not UTF-8: find which, one by one, and name the byte.
                kept_positions: list[int] = []
                texts: list[str] = []
                for position, value in zip(fast, values, strict=True):
                    try:
                        texts.append(value.decode("utf-8"))
                    except UnicodeDecodeError:
                        failures.append((position, decode_error(utf8_reason(value))))
                        continue
                    kept_positions.append(position)
                fast, column = kept_positions, pa.array(texts, pa.string())
                failures.sort(key=lambda failure: failure[0])
        table = pa.table({self._column: column})
        return Decoded(table=table, fast=fast, failures=failures, typed=True)
