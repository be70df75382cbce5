"""The deserialize stage of an upsert or changelog table: the format's deserializer for the bytes, then the
envelope (:mod:`kafka2delta.changes.envelope`) for what each message does to its key.

It satisfies the :class:`~kafka2delta.serialization.Deserializer` protocol, so the pipeline runs the same
stages after it. What differs from an append table's deserializer:

* a tombstone (a null or empty value) is a message like any other: the delete of its Kafka key;
* an upsert table's deletes come back apart (``Decoded.deletes``: the key columns and the change columns),
  because they carry no row to transform or fit: they only name a key (a changelog's are rows like the others:
  the key and change columns, the rest null);
* upserts whose Connect schema is known come back as one Arrow table typed by it (``typed``: the table is
  created, and evolves, with the source's types), keys first, and so do Protobuf values, typed by their message
  type as an append table's are (a Debezium event's by its ``after`` image's); the rest as documents;
* the change columns (``_op``, ``_source_ts``, ``_lsn``; ``_deleted`` for soft deletes; ``_before`` for a
  changelog's before images) are added to every row the table has them for.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from kafka2delta.changes.avro import connect_schema
from kafka2delta.changes.connect import ConnectSchema, fit_to_column
from kafka2delta.changes.envelope import Change, debezium_change, key_row, plain_change, source_timestamp
from kafka2delta.changes.options import BEFORE_COLUMN, DELETED_COLUMN, ChangeOptions
from kafka2delta.errors import MessageError
from kafka2delta.records import PartitionMessages
from kafka2delta.schema import delta_type
from kafka2delta.serialization.avro import AvroCodec, AvroDeserializer, AvroKeys
from kafka2delta.serialization.base import Decoded, Deserializer, KeyDecoder, decode_error
from kafka2delta.serialization.protobuf import ProtobufDeserializer

Unwrap = Callable[[Any, Any, Sequence[str]], Change]


class ChangeDeserializer:
    typed = True

    def __init__(self, inner: Deserializer, keys: KeyDecoder | None, options: ChangeOptions) -> None:
        self._inner = inner
        self._keys = keys
        self._options = options
        self._unwrap: Unwrap = plain_change
        if options.envelope == "debezium":
            self._unwrap = functools.partial(debezium_change, before_image=options.before_image)
        self._table_schema = pa.schema([])
        self._connect_schemas: dict[int, ConnectSchema] = {}
        self._key_connect_schemas: dict[int, ConnectSchema] = {}
        self._avro_keys = keys.codec if isinstance(keys, AvroKeys) else None
        self._extra: dict[str, pa.Field] = {
            name: pa.field(name, data_type) for name, data_type in options.extra_columns().items()
        }

    def set_read_schema(self, schema: pa.Schema, table_schema: pa.Schema | None = None) -> None:
        self._table_schema = table_schema if table_schema is not None else schema
        self._inner.set_read_schema(schema, table_schema)

    def decode(self, messages: PartitionMessages, positions: Sequence[int]) -> Decoded:
        upserts: dict[int, Change] = {}
        deletes: dict[int, dict[str, Any]] = {}
        failures: list[tuple[int, MessageError]] = []
        documents: dict[int, dict[str, Any]] = {}
        for position in sorted(positions):
            try:
                change = self.change(messages, position)
                # Reading values by the table's types can fail too (a decimal that is no number): a dead letter,
                # never an error out of the batch (found by review: the daemon stopped on such a message).
                document = self._document(change)
            except MessageError as error:
                failures.append((position, error))
                continue
            if change.delete and self._options.upsert:
                deletes[position] = document
            else:  # a changelog appends its deletes like any change
                upserts[position] = change
                documents[position] = document
        row_types = _row_types(upserts)
        table, fast = self._typed_table(row_types, documents)
        return Decoded(
            table=table,
            fast=fast,
            documents=documents,
            failures=failures,
            typed=True,
            deletes=deletes,
            declared=[(pa.schema(self._with_change_columns(list(fields))), at) for fields, at in row_types],
        )

    def document(self, messages: PartitionMessages, position: int) -> dict[str, Any]:
        return self._document(self.change(messages, position))

    def change(self, messages: PartitionMessages, position: int) -> Change:
        """What the message at ``position`` does; MessageError (stage deserialize) when it cannot be read."""
        key = None
        raw_key = messages.key(position)
        if self._keys is not None and raw_key is not None:
            try:
                codec = self._avro_keys
                key = self._keys(raw_key) if codec is None else self._avro_key(codec, raw_key)
            except MessageError as exc:
                raise decode_error(f"key: {exc.reason}") from exc
        payload = messages.payloads[position]
        value, value_type = self._read_value(messages, position, payload) if payload else (None, None)
        change = self._unwrap(value, key, self._options.key)
        if value_type is not None and change.fields is None and (not change.delete or not self._options.upsert):
            # A changelog's delete is a row too: typed by its message type, as an Avro or Connect one is.
            change = dataclasses.replace(change, fields=tuple(value_type))
        missing = [column for column in self._options.key if change.row.get(column) is None]
        if missing and key is not None and not change.delete:
            change = self._with_key_columns(change, missing, key)
            missing = [column for column in missing if change.row.get(column) is None]
        if missing:
            what = "delete" if change.delete else "row"
            raise decode_error(f"the {what} has no value for the key column(s) {missing}, nor has its Kafka key")
        return change

    def _with_key_columns(self, change: Change, missing: list[str], key: Any) -> Change:
        """A row whose value leaves key columns out (or null) takes them from the decoded Kafka key: a keyed topic
        whose values do not repeat their key (a compacted topic of profiles keyed by user id). The value's own
        columns win. A typed row takes a key column typed by the key's schema, else by the table's column (the
        value read by it, as a schemaless row's are), else by the value itself."""
        try:
            values, key_fields = key_row(key, self._options.key)
        except MessageError:
            return change  # a key that does not name the key columns: the row stays without them
        found = {column: values[column] for column in missing if values.get(column) is not None}
        if not found:
            return change
        fields = change.fields
        if fields is not None:
            typed = {member.name for member in fields}
            declared = {member.name: member for member in key_fields or ()}
            added = []
            for column in [column for column in found if column not in typed]:
                member = declared.get(column)
                if member is None and column in self._table_schema.names:
                    member = self._table_schema.field(column)
                    found[column] = fit_to_column(found[column], member.type, column, self._options.decimal_handling)
                if member is None:
                    member = pa.field(column, _key_type(column, found[column]))
                added.append(member)
            fields = (*added, *fields)
        return dataclasses.replace(change, row={**change.row, **found}, fields=fields)

    def _read_value(
        self, messages: PartitionMessages, position: int, payload: bytes
    ) -> tuple[Any, pa.StructType | None]:
        """The decoded value, and the Arrow type of the row when the format gives one outside a Connect schema (a
        Protobuf value's message type; a Debezium event's row is its ``after`` image). An Avro value comes wrapped
        with the Connect schema its writer schema carries, as the JSON converter would have embedded it (so both
        go through the same conversions)."""
        if isinstance(self._inner, ProtobufDeserializer):
            value, value_type = self._inner.typed_document(payload)  # (the key was decoded by change())
            return value, value_type if self._options.envelope == "none" else _image_type(value_type)
        if not isinstance(self._inner, AvroDeserializer):
            return self._inner.document(messages, position), None
        schema_id, writer, datum = self._inner.codec.read_record(payload)
        schema = self._connect_schemas.get(schema_id)
        if schema is None:
            schema = self._connect_schemas[schema_id] = connect_schema(writer.parsed)
        return {"schema": schema, "payload": datum}, None

    def _avro_key(self, codec: AvroCodec, raw_key: bytes) -> dict[str, Any]:
        """An Avro key wrapped with the Connect schema of its writer schema, as a value is (found by review: a
        key's ``io.debezium.time.Timestamp`` stayed milliseconds, read as microseconds: a 1970 date)."""
        schema_id, writer, datum = codec.read(raw_key)
        schema = self._key_connect_schemas.get(schema_id)
        if schema is None:
            schema = self._key_connect_schemas[schema_id] = connect_schema(writer.parsed)
        return {"schema": schema, "payload": datum}

    def _document(self, change: Change) -> dict[str, Any]:
        row = change.row if change.fields is not None else self._fitted(change.row)
        if change.delete:
            row = {column: row[column] for column in self._options.key}
        extra = self._extra
        if "_op" in extra:
            row["_op"] = change.op
        if "_source_ts" in extra:
            row["_source_ts"] = source_timestamp(change.source_ts_ms)
        if "_lsn" in extra:
            row["_lsn"] = change.lsn
        if DELETED_COLUMN in extra:
            row[DELETED_COLUMN] = change.delete
        if self._options.before_image:
            row[BEFORE_COLUMN] = change.before
        return row

    def _fitted(self, row: dict[str, Any]) -> dict[str, Any]:
        """A schemaless row's values read by the table's column types (base64 decimals, epoch days …)."""
        schema = self._table_schema
        return {
            name: fit_to_column(value, schema.field(name).type, name, self._options.decimal_handling)
            if name in schema.names
            else value
            for name, value in row.items()
        }

    def _typed_table(
        self, row_types: list[tuple[tuple[pa.Field, ...], list[int]]], documents: dict[int, dict[str, Any]]
    ) -> tuple[pa.Table, list[int]]:
        """The upserts a Connect schema or message type describes, as one table in their unified schema (a member
        one version adds to a nested struct included), keys first; the rest stay documents (as do all of them when
        two versions give a column types Arrow cannot unify, or when Arrow refuses a value: there the failing
        one is found)."""
        if not row_types:
            return pa.table({}), []
        schemas = [pa.schema([member.with_nullable(True) for member in fields]) for fields, _ in row_types]
        try:
            row = schemas[0] if len(schemas) == 1 else pa.unify_schemas(schemas, promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            return pa.table({}), []
        keys = [row.field(column) for column in self._options.key if column in row.names]
        fields = self._with_change_columns(keys + [f for f in row if f.name not in self._options.key])
        typed = sorted(position for _, at in row_types for position in at)
        try:
            return pa.Table.from_pylist([documents[p] for p in typed], schema=pa.schema(fields)), typed
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ValueError, TypeError):
            return pa.table({}), []

    def _with_change_columns(self, row: list[pa.Field]) -> list[pa.Field]:
        """A typed row's fields, then the change columns the table has (the before image typed as the row: Debezium's
        before and after images share the row's schema)."""
        names = {member.name for member in row}
        fields = row + [member for name, member in self._extra.items() if name not in names]
        if self._options.before_image and BEFORE_COLUMN not in names:
            image = [member for member in row if member.name not in self._extra]
            fields.append(pa.field(BEFORE_COLUMN, pa.struct(image)))
        return fields


def _key_type(column: str, value: Any) -> pa.DataType:
    """The Arrow type of a key column taken from a schemaless Kafka key, for a table made from its first rows; a
    dead letter when Arrow or Delta has none for it (a number too large, mixed lists, an empty object, a null)."""
    try:
        data_type = pa.scalar(value).type
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
        raise decode_error(f"the Kafka key's {column!r} has no Arrow type: {exc}") from exc
    if delta_type(data_type, inferred=False) != data_type:  # a null (or a struct or list of them) drops out
        raise decode_error(f"the Kafka key's {column!r} ({value!r}) has no type Parquet can write ({data_type})")
    return data_type


def _row_types(upserts: dict[int, Change]) -> list[tuple[tuple[pa.Field, ...], list[int]]]:
    """The distinct row types among the upserts that have one, each with the upserts it wrote. Grouped by the
    names first (comparing Arrow fields costs more than the change did), then by the types, so a version that
    adds a member to a nested struct, or widens a column, is a type of its own."""
    by_names: dict[tuple[str, ...], list[tuple[tuple[pa.Field, ...], list[int]]]] = {}
    for position, change in upserts.items():
        fields = change.fields
        if fields is None:
            continue
        groups = by_names.setdefault(tuple(member.name for member in fields), [])
        for known, at in groups:
            if known is fields or known == fields:
                at.append(position)
                break
        else:
            groups.append((fields, [position]))
    return [group for groups in by_names.values() for group in groups]


def _image_type(event: pa.StructType | None) -> pa.StructType | None:
    """The row type of a Debezium event's message type: its ``after`` image's (the ``before`` image has the
    same); None when the message has no such field."""
    if event is None or event.get_field_index("after") < 0:
        return None
    image = event.field("after").type
    return image if isinstance(image, pa.StructType) else None
