"""One change event → one :class:`Change`: is it an upsert or a delete, of which key, with which row.

Pure: the value and the key arrive decoded (a dict from JSON or Avro, or None for a tombstone). Two envelopes
(``format.envelope``):

* ``debezium``: ``{"before", "after", "op", "source", "ts_ms"}``, optionally wrapped by the JSON converter as
  ``{"schema": …, "payload": …}``. ``op`` ``c`` (create), ``r`` (snapshot read) and ``u`` (update) upsert the
  ``after`` image; ``d`` deletes the key of the ``before`` image (or of the Kafka key); a tombstone (null
  value) deletes the Kafka key. A primary-key change arrives as a ``d`` of the old key and a ``c`` of the new
  one, so it ends with the new key only. ``t`` (truncate) and ``m`` (logical message) cannot be applied per
  key: they are dead letters that say so.
* ``none``: the value is the new state of its key; a null value deletes the Kafka key.

With a Connect schema at hand the row's values are converted by it (:mod:`kafka2delta.changes.connect`) and
the change carries the row's Arrow fields; without one the values are as the message had them.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from kafka2delta.changes.connect import ConnectSchema, arrow_field, convert, shown, struct_fields
from kafka2delta.serialization.base import decode_error

UPSERT_OPS = frozenset({"c", "r", "u"})


@dataclass(frozen=True)
class Change:
    """What one message does to its key."""

    delete: bool
    op: str
    """``c``, ``r``, ``u`` or ``d`` (a tombstone is a ``d``)."""
    row: dict[str, Any]
    """The new row (an upsert) or at least the key columns (a delete)."""
    fields: tuple[pa.Field, ...] | None = None
    """The row's Arrow fields, when a Connect schema gave them."""
    source_ts_ms: int | None = None
    """When the change was made in the source database (``source.ts_ms``)."""
    lsn: int | None = None
    """The source position (``source.lsn``, PostgreSQL's log sequence number)."""
    before: dict[str, Any] | None = None
    """Debezium's before image (converted like the row), when the event has one."""


def unwrap_connect(document: Any) -> tuple[Any, ConnectSchema | None]:
    """The payload and the Connect schema of a JSON converter envelope (``schemas.enable=true``), or the
    document itself and None."""
    if isinstance(document, Mapping) and document.keys() == {"schema", "payload"}:
        schema = document["schema"]
        return document["payload"], schema if isinstance(schema, Mapping) else None
    return document, None


def key_row(key: Any, key_columns: Sequence[str]) -> tuple[dict[str, Any], tuple[pa.Field, ...] | None]:
    """The key columns of a decoded Kafka key: an object (Debezium's key struct), or a scalar for a one-column
    key (``format.key = "string"``); converted by its Connect schema when it comes with one (the JSON converter's
    envelope, or an Avro key's writer schema)."""
    payload, schema = unwrap_connect(key)
    if isinstance(payload, Mapping):
        if schema is not None and schema.get("type") == "struct":
            return _converted(payload, schema, "key")
        return dict(payload), None
    if payload is not None and len(key_columns) == 1:
        return {key_columns[0]: payload if schema is None else convert(payload, schema, "key")}, None
    raise decode_error(
        f"the Kafka key {shown(payload)} does not name the key columns {list(key_columns)}: give a key object "
        '(format.key = "json", "avro" or "protobuf"), or one key column for a string key'
    )


def debezium_change(value: Any, key: Any, key_columns: Sequence[str], *, before_image: bool = False) -> Change:
    """The change a Debezium event (or a tombstone: ``value`` None) makes; with ``before_image``, carrying the
    event's before image too."""
    if value is None:
        return _delete_of_key(key, key_columns, "d")
    payload, schema = unwrap_connect(value)
    if not isinstance(payload, Mapping):
        raise decode_error(f"not a Debezium change event: the value is {shown(payload)}, not an object")
    op = payload.get("op")
    if not isinstance(op, str):
        keys = ", ".join(sorted(str(k) for k in payload)[:8])
        raise decode_error(f"not a Debezium change event: no 'op' field (fields: {keys})")
    members = struct_fields(schema) if schema is not None else {}
    source = payload.get("source")
    source_ts, lsn = _source_position(source if isinstance(source, Mapping) else {})
    before = payload.get("before")
    wanted = op == "d" or before_image  # an upsert's before image is read only when it is kept
    before_row, before_fields = (
        _converted(before, members.get("before"), "before") if wanted and isinstance(before, Mapping) else (None, None)
    )
    kept_before = before_row if before_image else None
    if op in UPSERT_OPS:
        after = payload.get("after")
        if not isinstance(after, Mapping):
            raise decode_error(f"Debezium event op={op!r} has no 'after' image")
        row, fields = _converted(after, members.get("after"), "after")
        return Change(delete=False, op=op, row=row, fields=fields, source_ts_ms=source_ts, lsn=lsn, before=kept_before)
    if op == "d":
        if before_row is not None and all(before_row.get(column) is not None for column in key_columns):
            row, fields = dict(before_row), before_fields
        else:
            deleted = _delete_of_key(key, key_columns, op)
            row, fields = deleted.row, deleted.fields
        return Change(delete=True, op=op, row=row, fields=fields, source_ts_ms=source_ts, lsn=lsn, before=kept_before)
    if op == "t":
        raise decode_error("op 't' (a TRUNCATE) cannot be applied per key: the table keeps its rows")
    raise decode_error(f"Debezium op {op!r} is not a row change (expected c, r, u or d)")


def plain_change(value: Any, key: Any, key_columns: Sequence[str]) -> Change:
    """``envelope = "none"``: the value is the key's new state; a null value deletes the key."""
    if value is None:
        return _delete_of_key(key, key_columns, "d")
    payload, schema = unwrap_connect(value)
    if not isinstance(payload, Mapping):
        raise decode_error(f"the value is {shown(payload)}, not an object")
    row, fields = _converted(payload, schema, "value")
    return Change(delete=False, op="u", row=row, fields=fields)


def _delete_of_key(key: Any, key_columns: Sequence[str], op: str) -> Change:
    if key is None:
        raise decode_error("a delete (null value) without a Kafka key: no key to delete")
    row, fields = key_row(key, key_columns)
    return Change(delete=True, op=op, row=row, fields=fields)


def _converted(
    image: Mapping[str, Any], schema: ConnectSchema | None, path: str
) -> tuple[dict[str, Any], tuple[pa.Field, ...] | None]:
    if schema is None:
        return dict(image), None
    members = struct_fields(schema)
    row = {name: convert(image.get(name), member, f"{path}.{name}") for name, member in members.items()}
    # Values the schema does not describe are kept as they are (a converter that drops the schema of a field).
    row.update({name: value for name, value in image.items() if name not in members})
    return row, tuple(arrow_field(member) for member in members.values())


def _source_position(source: Mapping[str, Any]) -> tuple[int | None, int | None]:
    ts = source.get("ts_ms")
    lsn = source.get("lsn")
    return (
        ts if isinstance(ts, int) and not isinstance(ts, bool) else None,
        lsn if isinstance(lsn, int) and not isinstance(lsn, bool) else None,
    )


def source_timestamp(ts_ms: int | None) -> dt.datetime | None:
    return None if ts_ms is None else dt.datetime.fromtimestamp(ts_ms / 1000, dt.UTC)
