"""Debezium change events as the JSON converter writes them (with or without the embedded Connect schema),
for the unit tests of upsert tables; the shapes follow the captured events in ``tests/fixtures/debezium``."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kafka2delta.config import Config, load_config
from kafka2delta.records import ConsumedBatch, PartitionMessages, TopicPartition

ConnectField = dict[str, Any]


def field(name: str, kind: str, *, optional: bool = True, logical: str = "", **parameters: str) -> ConnectField:
    schema: ConnectField = {"type": kind, "optional": optional, "field": name}
    if logical:
        schema["name"] = logical
        schema["version"] = 1
    if parameters:
        schema["parameters"] = {k.replace("_", "."): v for k, v in parameters.items()}
    return schema


def decimal_bytes(unscaled: int) -> str:
    """A Connect Decimal's JSON value: base64 of the big-endian two's-complement unscaled integer."""
    length = max(1, (unscaled.bit_length() + 8) // 8)
    return base64.b64encode(unscaled.to_bytes(length, "big", signed=True)).decode()


@dataclass
class SourceTable:
    """One source table: its columns (Connect field schemas) and its primary key."""

    name: str
    columns: list[ConnectField]
    key: Sequence[str]

    def row_schema(self, suffix: str) -> ConnectField:
        return {"type": "struct", "fields": self.columns, "optional": True, "name": f"db.public.{self.name}.{suffix}"}

    def envelope_schema(self) -> ConnectField:
        source = {
            "type": "struct",
            "fields": [
                field("connector", "string", optional=False),
                field("ts_ms", "int64", optional=False),
                field("lsn", "int64"),
            ],
            "optional": False,
            "name": "io.debezium.connector.postgresql.Source",
            "field": "source",
        }
        return {
            "type": "struct",
            "fields": [
                {**self.row_schema("Value"), "field": "before"},
                {**self.row_schema("Value"), "field": "after"},
                source,
                field("op", "string", optional=False),
                field("ts_ms", "int64"),
            ],
            "optional": False,
            "name": f"db.public.{self.name}.Envelope",
        }

    def key_schema(self) -> ConnectField:
        fields = [{**c, "optional": False} for c in self.columns if c["field"] in self.key]
        return {"type": "struct", "fields": fields, "optional": False, "name": f"db.public.{self.name}.Key"}

    def event(
        self, op: str, row: dict[str, Any], *, before: dict[str, Any] | None = None, lsn: int = 0, schemas: bool = True
    ) -> tuple[bytes, bytes]:
        """The key and value bytes of one change event (``op`` d: ``row`` is the before image)."""
        payload = {
            "before": row if op == "d" else before,
            "after": None if op == "d" else row,
            "source": {"connector": "postgresql", "ts_ms": 1_700_000_000_000 + lsn, "lsn": lsn},
            "op": op,
            "ts_ms": 1_700_000_000_000 + lsn,
        }
        return self.key_bytes(row, schemas), _json(payload, self.envelope_schema() if schemas else None)

    def key_bytes(self, row: dict[str, Any], schemas: bool = True) -> bytes:
        return _json({column: row[column] for column in self.key}, self.key_schema() if schemas else None)


def _json(payload: Any, schema: ConnectField | None) -> bytes:
    return json.dumps(payload if schema is None else {"schema": schema, "payload": payload}).encode()


def change_batch(
    tp: TopicPartition, first: int, messages: Sequence[tuple[bytes | None, bytes | None]]
) -> ConsumedBatch:
    """``(key, value)`` messages of ``tp`` from offset ``first`` (a value None is a tombstone)."""
    offsets = list(range(first, first + len(messages)))
    return ConsumedBatch(
        partitions={
            tp: PartitionMessages(
                topic=tp.topic,
                partition=tp.partition,
                offsets=offsets,
                payloads=[value for _, value in messages],
                timestamps_ms=[0] * len(offsets),
                keys=[key for key, _ in messages],
            )
        }
    )


def change_config(tmp_path: Path, mode: str, *, table: str = "table", **env: str) -> Config:
    """An upsert or changelog table's config on local paths (``<tmp_path>/<table>``, dead letters in
    ``<tmp_path>/dlq``): topic ``cdc``, key column ``id`` from JSON keys; ``env`` adds or overrides K2D_ settings."""
    return load_config(
        None,
        environ={
            "K2D_KAFKA__BOOTSTRAP_SERVERS": "unused:1",
            "K2D_KAFKA__TOPIC": "cdc",
            "K2D_TABLE__URI": str(tmp_path / table),
            "K2D_TABLE__MODE": mode,
            "K2D_TABLE__KEY": "id",
            "K2D_FORMAT__KEY": "json",
            "K2D_DEAD_LETTERS__TABLE_URI": str(tmp_path / "dlq"),
            **env,
        },
    )
