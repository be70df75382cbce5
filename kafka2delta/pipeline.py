"""The pure core: the messages of one partition → rows in the table schema + dead letters + skips.

deserialize → transform (and filter) → evolve the schema (``merge``) → coerce. No Kafka, no Delta,
no clock: unit tests drive it directly.

Every stage has two lanes. The fast lane works on one Arrow table for the whole batch; the
reference lane works on one Python document per message. A message the fast lane declines at any
stage starts again in the reference lane from its payload, and only the reference lane makes dead
letters, so the reason a message fails is always the reference lane's. A message's outcome depends
on the message alone (and the config and table schema), never on its neighbours in the batch:
that is what makes a replay after a crash produce the same rows and the same dead letters.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc

from kafka2delta.bisection import isolate_failures
from kafka2delta.changes import ChangeOptions
from kafka2delta.coercions import CoercionOptions, coerce_document, coerce_table
from kafka2delta.errors import MessageError
from kafka2delta.records import DeadLetter, PartitionMessages, ProcessedPartition, Stage, payload_json
from kafka2delta.schema import conform, documents_schema, evolve
from kafka2delta.serialization import Decoded, Deserializer
from kafka2delta.transforms import Transformer

logger = logging.getLogger(__name__)


def read_type(data_type: pa.DataType, path: str, epoch_columns: frozenset[str]) -> pa.DataType:
    """The type Arrow's JSON reader should produce for a table column of ``data_type``.

    Temporal columns are read as strings (RFC 3339 text) and parsed by the coercion stage, except
    the columns ``coercions.epoch_units`` names, which are read as numbers (epoch values). Binary
    columns are read as strings (base64). Arrow reads decimals from JSON numbers and strings itself.
    """
    if pa.types.is_temporal(data_type):
        return pa.float64() if path in epoch_columns else pa.string()
    if pa.types.is_binary(data_type) or pa.types.is_large_binary(data_type):
        return pa.string()
    if pa.types.is_struct(data_type):
        return pa.struct([pa.field(f.name, read_type(f.type, f"{path}.{f.name}", epoch_columns)) for f in data_type])
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        return pa.list_(read_type(data_type.value_type, path, epoch_columns))
    return data_type


def read_schema(
    table_schema: pa.Schema, sources: Sequence[tuple[str, pa.DataType | None]], epoch_columns: frozenset[str]
) -> pa.Schema:
    """The table's columns as the JSON reader should read them, plus the paths transforms read."""
    fields = {f.name: read_type(f.type, f.name, epoch_columns) for f in table_schema}
    for path, wanted in sources:
        if wanted is not None:
            _place(fields, path.split("."), wanted)
    return pa.schema([pa.field(name, t) for name, t in fields.items()])


def _place(fields: dict[str, pa.DataType], parts: list[str], wanted: pa.DataType) -> None:
    """Put ``wanted`` at the dotted path in ``fields``, building structs; what is there already wins."""
    head, rest = parts[0], parts[1:]
    current = fields.get(head)
    if not rest:
        fields.setdefault(head, wanted)
        return
    if current is None:
        members: dict[str, pa.DataType] = {}
    elif pa.types.is_struct(current):
        members = {f.name: f.type for f in current}
    else:
        return  # the path runs through a scalar column: the column's type wins
    _place(members, rest, wanted)
    fields[head] = pa.struct([pa.field(name, t) for name, t in members.items()])


class Pipeline:
    def __init__(
        self,
        deserializer: Deserializer,
        table_schema: pa.Schema,
        transformer: Transformer | None = None,
        options: CoercionOptions | None = None,
        schema_evolution: Literal["none", "merge"] = "none",
        *,
        table: str | None = None,
        changes: ChangeOptions | None = None,
        creates_table: bool = False,
    ) -> None:
        """``table`` names the table the rows go to in the dead letters (their ``table`` column). ``changes``
        makes the rows changes of an upsert table: every message counts (a tombstone deletes its key), deletes
        skip the transforms and keep only their key and change columns, and each row says whether it deletes;
        or of a changelog table: every change is a row (with its key), deletes too. ``creates_table``: the table
        does not exist and has no configured schema, so the first rows' fields make it (``merge``) until
        :meth:`set_schema` gives it columns; then ``schema_evolution`` holds, as in every other daemon."""
        self._table = table
        self.changes = changes
        self._deserializer = deserializer
        self._transformer = transformer if transformer is not None and transformer.active else None
        self._options = options or CoercionOptions()
        self._configured_merge = schema_evolution == "merge"
        self._merge = self._configured_merge or (creates_table and not table_schema.names)
        self._epoch_columns = frozenset(self._options.epoch_units)
        self._schema = table_schema
        self._fit(table_schema)

    @property
    def schema(self) -> pa.Schema:
        """The schema rows are fitted to: the table's, plus columns this pipeline added (merge)."""
        return self._schema

    def set_schema(self, schema: pa.Schema) -> None:
        """Fit rows to the table's ``schema`` from now on (our evolution commit, or another writer's change). A
        table that has columns evolves as configured, whoever created it."""
        if schema.names:
            self._merge = self._configured_merge
        self._fit(schema)

    def _fit(self, schema: pa.Schema) -> None:
        """Fit rows to ``schema`` from now on (the table's, or the one this pipeline evolved it to)."""
        self._schema = schema
        sources = self._transformer.source_fields(schema) if self._transformer else []
        self._deserializer.set_read_schema(read_schema(schema, sources, self._epoch_columns), schema)

    def process(self, messages: PartitionMessages) -> ProcessedPartition:
        """Every input message ends as exactly one of: a row, a dead letter, a counted skip."""
        before = self._schema
        outcome = self._run(messages, may_reread=True)
        if outcome.reread:
            # New columns were typed from what Arrow's JSON reader guessed; read the batch again with
            # their real types (a string that looks like a timestamp stays a string).
            added = outcome.added
            outcome = self._run(messages, may_reread=False)
            outcome.added = added + outcome.added
        result = outcome.result(messages, self._schema)
        if self._schema is not before:
            result = self._keep_used_columns(result, before, outcome.declared(self._targets()))
            if not self._schema.names and result.row_offsets:
                # Every new column is dropped again: the rows left have no column (``_Outcome.result``).
                added = result.added_columns
                result = outcome.result(messages, self._schema)
                result.added_columns = added
        return result

    def _keep_used_columns(
        self, result: ProcessedPartition, before: pa.Schema, declared: Declared
    ) -> ProcessedPartition:
        """Keep only the new columns some row of the batch has a value for, or the schema of a message that is a
        row declares (``declared``): fields seen only in messages that were filtered out or became dead letters
        must not change the table."""
        kept = _used_fields(before, self._schema, result.rows, declared)
        if kept.equals(self._schema):
            return result
        dropped = evolve(kept, self._schema, inferred=False).added
        logger.info("schema evolution: not adding %s (only dead letters or filtered messages had them)", dropped)
        self._fit(kept)
        result.rows = conform(result.rows, kept)
        result.added_columns = [path for path in result.added_columns if path not in dropped]
        return result

    # --- one pass ---------------------------------------------------------------------------

    def _run(self, messages: PartitionMessages, may_reread: bool) -> _Outcome:
        outcome = _Outcome(messages, self._table, self.changes.key if self.changes is not None else None)
        if self.changes is not None and self.changes.takes_tombstones:
            taken = list(range(len(messages)))  # a tombstone is the delete of its key
        else:
            taken = [i for i, payload in enumerate(messages.payloads) if payload]
        outcome.skipped_empty = len(messages) - len(taken)
        decoded = self._deserializer.decode(messages, taken)
        for position, error in decoded.failures:
            outcome.dead(position, error)
        outcome.schemas = decoded.declared

        fast_table: pa.Table | None = decoded.table
        fast_positions = list(decoded.fast)
        fast_set = set(fast_positions)
        slow: dict[int, dict[str, Any] | None] = {p: d for p, d in decoded.documents.items() if p not in fast_set}

        transformer = self._transformer
        if transformer is not None and fast_table is not None:
            if transformer.uses_interpreter:
                slow.update(dict.fromkeys(fast_positions))
                fast_table, fast_positions = None, []
            else:
                transformed = transformer.apply_table(fast_table, messages, fast_positions, decoded.keys)
                outcome.filtered += len(transformed.filtered)
                slow.update(dict.fromkeys(fast_positions[i] for i in transformed.fallback))
                fast_positions = [fast_positions[i] for i in transformed.kept]
                fast_table = transformed.table
        documents = self._slow_documents(messages, decoded, slow, outcome)

        if self._merge and self._evolve(fast_table, decoded, may_reread, documents, outcome):
            return outcome  # reread: this pass's results are discarded

        if fast_table is not None and fast_positions:
            coerced = coerce_table(fast_table, self._schema, self._options)
            outcome.unknown_fields += coerced.unknown_fields
            outcome.add_rows(coerced.rows, [fast_positions[i] for i in coerced.kept])
            declined = {fast_positions[i]: decoded.documents.get(fast_positions[i]) for i in coerced.fallback}
            documents.update(self._slow_documents(messages, decoded, declined, outcome))
        self._coerce_documents(messages, documents, outcome)
        if decoded.deletes:
            self._coerce_deletes(messages, decoded.deletes, outcome)
        return outcome

    def _typed_columns(self, decoded: Decoded) -> pa.Schema:
        """The columns a typed decode's schemas give its rows (writer schemas, Connect schemas, message types),
        whichever lane they take next; not a transform's targets, which are typed by their values."""
        targets = self._targets()
        columns = decoded.table.schema if decoded.table.num_columns else self._agreed_columns(decoded.declared)
        return pa.schema([f for f in columns if f.name not in targets])

    def _agreed_columns(self, declared: Sequence[tuple[pa.Schema, Sequence[int]]]) -> list[pa.Field]:
        """The columns every declared schema that has them gives one type (keys first): what a batch whose
        schemas conflict (a column changed type, so its typed rows took the per-message lane) still declares.
        The conflicting columns are typed by their values."""
        agreed: dict[str, pa.Field | None] = {}
        for schema, _ in declared:
            for f in schema:
                known = agreed.setdefault(f.name, f)
                if known is not None and known is not f and not known.equals(f):
                    agreed[f.name] = None
        fields = [f for f in agreed.values() if f is not None]
        key = self.changes.key if self.changes is not None else ()
        return sorted(fields, key=lambda f: key.index(f.name) if f.name in key else len(key))

    def _targets(self) -> frozenset[str]:
        return self._transformer.target_columns if self._transformer is not None else frozenset()

    def _coerce_deletes(
        self, messages: PartitionMessages, deletes: Mapping[int, dict[str, Any]], outcome: _Outcome
    ) -> None:
        """Deletes name a key: only their key and change columns are fitted (the other columns stay null)."""
        schema = pa.schema([f.with_nullable(True) for f in self._schema if f.name in deletes[min(deletes)]])
        rows: list[dict[str, Any]] = []
        positions: list[int] = []
        for position, document in sorted(deletes.items()):
            try:
                row, _ = coerce_document(document, schema, self._options)
            except MessageError as error:
                outcome.dead(position, error, document)
                continue
            rows.append(row)
            positions.append(position)

        def build(chunk: list[int]) -> pa.Table:
            return pa.Table.from_pylist([rows[i] for i in chunk], schema=schema)

        errors = (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ValueError, TypeError)
        pieces, failures = isolate_failures(list(range(len(rows))), build, errors)
        for chunk, table in pieces:
            outcome.add_rows(table, [positions[i] for i in chunk], delete=True)
        for index, exc in failures:
            reason = f"the key cannot be fitted to the table: {exc}"
            outcome.dead(positions[index], MessageError("coerce", reason))

    def _slow_documents(
        self,
        messages: PartitionMessages,
        decoded: Decoded,
        slow: Mapping[int, dict[str, Any] | None],
        outcome: _Outcome,
    ) -> dict[int, dict[str, Any]]:
        """The reference lane up to coercion: decode (when not decoded yet) and transform, per message."""
        documents: dict[int, dict[str, Any]] = {}
        for position in sorted(slow):
            stage: Stage = "deserialize"
            try:
                document = slow[position]
                if document is None:
                    document = decoded.documents.get(position) or self._deserializer.document(messages, position)
                if self._transformer is not None:
                    stage = "transform"
                    key = decoded.keys[position] if decoded.keys is not None else None
                    document = self._transformer.apply_document(document, messages, position, key)
                    if document is None:
                        outcome.filtered += 1
                        continue
            except MessageError as error:
                outcome.dead(position, error, self._original_document(messages, position))
                continue
            except RecursionError:  # the stages bound nesting; this only guards against a stage that misses it
                outcome.dead(position, MessageError(stage, "the message is nested too deeply"))
                continue
            documents[position] = document
        return documents

    def _evolve(
        self,
        fast_table: pa.Table | None,
        decoded: Decoded,
        may_reread: bool,
        documents: Mapping[int, dict[str, Any]],
        outcome: _Outcome,
    ) -> bool:
        """Add the fields the batch carries that the schema lacks; True when the batch must be read again."""
        schema = self._schema
        reread = False
        if fast_table is not None and fast_table.num_rows:
            evolution = evolve(schema, fast_table.schema, inferred=not decoded.typed)
            schema, reread = evolution.schema, bool(evolution.added) and not decoded.typed and may_reread
            outcome.note_evolution(evolution.added, evolution.rejected)
        elif decoded.declared:  # no fast rows (the interpreter lane): the documents alone only have values
            evolution = evolve(schema, self._typed_columns(decoded), inferred=False)
            schema = evolution.schema
            outcome.note_evolution(evolution.added, evolution.rejected)
        if documents:
            evolution = evolve(schema, documents_schema(documents.values()), inferred=False)
            schema = evolution.schema
            outcome.note_evolution(evolution.added, evolution.rejected)
        if schema is not self._schema:
            logger.info("schema evolution: adding %s", ", ".join(outcome.added))
            self._fit(schema)
        outcome.reread = reread
        return reread

    def _coerce_documents(
        self, messages: PartitionMessages, documents: Mapping[int, dict[str, Any]], outcome: _Outcome
    ) -> None:
        rows: list[dict[str, Any]] = []
        positions: list[int] = []
        for position, document in sorted(documents.items()):
            try:
                row, unknown = coerce_document(document, self._schema, self._options)
            except MessageError as error:
                outcome.dead(position, error, self._original_document(messages, position))
                continue
            except RecursionError:
                outcome.dead(position, MessageError("coerce", "the message is nested too deeply"))
                continue
            outcome.unknown_fields += unknown
            rows.append(row)
            positions.append(position)
        if not rows:
            return

        def build(chunk: list[int]) -> pa.Table:
            return pa.Table.from_pylist([rows[i] for i in chunk], schema=self._schema)

        # The reference lane promises rows Arrow accepts; a row it does not is still only one dead letter.
        errors = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError, ValueError, TypeError)
        pieces, failures = isolate_failures(list(range(len(rows))), build, errors)
        for chunk, table in pieces:
            outcome.add_rows(table, [positions[i] for i in chunk])
        for index, exc in failures:
            position = positions[index]
            reason = f"the row cannot be built in the table schema: {exc}"
            outcome.dead(position, MessageError("write", reason), self._original_document(messages, position))

    def _original_document(self, messages: PartitionMessages, position: int) -> dict[str, Any] | None:
        """The message decoded afresh, for the dead letter's ``payload_json`` (None if it does not decode)."""
        try:
            return self._deserializer.document(messages, position)
        except MessageError:
            return None


Declared = dict[str, "Declared"]
"""Columns a schema declares, by name, each with its declared members (empty for a column that is no struct)."""


def _declared_tree(data_type: pa.DataType) -> Declared:
    return {f.name: _declared_tree(f.type) for f in data_type} if isinstance(data_type, pa.StructType) else {}


def _merge_declared(into: Declared, more: Declared) -> None:
    for name, members in more.items():
        _merge_declared(into.setdefault(name, {}), members)


def _used_fields(before: pa.Schema, after: pa.Schema, rows: pa.Table, declared: Declared) -> pa.Schema:
    """``after`` without the fields it added to ``before`` that are null in every row of ``rows``, except the
    ``declared`` ones (a writer schema, Connect schema or message type says what they are)."""

    def keep(
        old: pa.DataType | None, new: pa.DataType, values: pa.ChunkedArray | pa.Array, declared: Declared | None
    ) -> pa.DataType | None:
        if old is None and (declared is None or not pa.types.is_struct(new)):
            return new if declared is not None or values.null_count < len(values) else None
        if pa.types.is_struct(new) and (old is None or (pa.types.is_struct(old) and old != new)):
            # A new member stays if declared or has a value; so do a declared new struct's members.
            chunks = values.chunks if isinstance(values, pa.ChunkedArray) else [values]
            members = []
            for index, member in enumerate(new):
                child = pa.chunked_array([chunk.field(index) for chunk in chunks], member.type)
                previous = (
                    old.field(member.name).type if old is not None and old.get_field_index(member.name) >= 0 else None
                )
                inner = declared.get(member.name) if declared is not None else None
                member_type = keep(previous, member.type, child, inner)
                if member_type is not None:
                    members.append(member.with_type(member_type))
            return pa.struct(members) if members or old is not None else None
        return new  # lists of structs: kept as added (a rare shape; nulls only cost a column)

    columns = []
    for column in after:
        old = before.field(column.name).type if column.name in before.names else None
        column_type = keep(old, column.type, rows.column(column.name), declared.get(column.name))
        if column_type is not None:
            columns.append(column.with_type(column_type))
    return pa.schema(columns, metadata=after.metadata)


class _Outcome:
    """The results of one pass over a batch, by input position."""

    def __init__(self, messages: PartitionMessages, table: str | None, key: Sequence[str] | None = None) -> None:
        """``key``: the key columns of an upsert table (its rows must have them)."""
        self._messages = messages
        self._table = table
        self._key = key
        self._tables: list[pa.Table] = []
        self._positions: list[int] = []
        self._deletes: set[int] = set()
        self.dead_letters: list[DeadLetter] = []
        self.skipped_empty = 0
        self.filtered = 0
        self.unknown_fields = 0
        self.added: list[str] = []
        self.rejected: list[str] = []
        self.reread = False
        self.schemas: Sequence[tuple[pa.Schema, Sequence[int]]] = ()
        """The typed decode's schemas, each with the positions it wrote (``Decoded.declared``)."""

    def dead(self, position: int, error: MessageError, document: Any = None) -> None:
        messages = self._messages
        payload = messages.payloads[position] or b""
        self.dead_letters.append(
            DeadLetter(
                topic=messages.topic,
                partition=messages.partition,
                offset=messages.offsets[position],
                stage=error.stage,
                reason=error.reason,
                payload=payload,
                key=messages.key(position),
                timestamp_ms=messages.timestamps_ms[position],
                payload_json=payload_json(payload, document),
                table=self._table,
            )
        )

    def add_rows(self, table: pa.Table, positions: list[int], *, delete: bool = False) -> None:
        if self._key is not None and not delete:
            table, positions = self._keyed(table, positions, self._key)
        if positions:
            self._tables.append(table)
            self._positions.extend(positions)
            if delete:
                self._deletes.update(positions)

    def declared(self, targets: frozenset[str]) -> Declared:
        """What the schemas that wrote messages now rows declare (not the transform ``targets``): columns even
        when every value is null, as the source has them. (Asked only when the batch changed the schema.)"""
        declared: Declared = {}
        every_one = not self.dead_letters and not self.filtered  # then every decoded message is a row
        rows = set() if every_one else set(self._positions)
        for schema, positions in self.schemas:
            if positions and (every_one or any(position in rows for position in positions)):
                _merge_declared(declared, {f.name: _declared_tree(f.type) for f in schema if f.name not in targets})
        return declared

    def _keyed(self, table: pa.Table, positions: list[int], key: Sequence[str]) -> tuple[pa.Table, list[int]]:
        """Upsert rows whose key a transform made null (or whose key column the table lacks) are dead letters:
        a row without its key could never be updated or deleted again. (A delete of such a key stays: it
        matches no row.)"""
        missing = [column for column in key if column not in table.column_names]
        if missing:
            null = pa.array([True] * table.num_rows)
        else:
            null = pc.is_null(table.column(key[0]))
            for column in key[1:]:
                null = pc.or_(null, pc.is_null(table.column(column)))
        if not pc.any(null).as_py():
            return table, positions
        reason = f"the table has no key column {missing}" if missing else f"a key column of {list(key)} is null"
        failed = null.to_pylist()
        for position, is_null in zip(positions, failed, strict=True):
            if is_null:
                self.dead(position, MessageError("coerce", reason))
        return table.filter(pc.invert(null)), [p for p, is_null in zip(positions, failed, strict=True) if not is_null]

    def note_evolution(self, added: list[str], rejected: list[str]) -> None:
        self.added.extend(added)
        for path in rejected:
            if path not in self.rejected:
                self.rejected.append(path)
                messages = self._messages
                logger.warning(
                    "field %r cannot become a column (a name Delta refuses, or a case twin): dropped "
                    "(batch %s[%d]@%d..%d)",
                    path,
                    messages.topic,
                    messages.partition,
                    messages.offsets[0],
                    messages.offsets[-1],
                )

    def result(self, messages: PartitionMessages, schema: pa.Schema) -> ProcessedPartition:
        tables, unordered, skipped_empty = self._tables, self._positions, self.skipped_empty
        if not schema.names and unordered:
            # No column yet, so no row a table can hold (Arrow has no rows without columns). A value with no
            # field that could add one (``{}``, only nulls, a name Delta refuses, or fields only filtered messages
            # had) is kept as a dead letter, so none is lost and ``verify`` finds it; an upsert's delete has nothing
            # to delete yet: a counted skip.
            for position in unordered:
                if position in self._deletes:
                    skipped_empty += 1
                else:
                    self.dead(
                        position,
                        MessageError(
                            "coerce", "no column yet: the table has none and the value no field with a value to add one"
                        ),
                    )
            tables, unordered = [], []
        tables = [conform(table, schema) for table in tables]
        rows = pa.concat_tables(tables) if tables else schema.empty_table()
        order = sorted(range(len(unordered)), key=unordered.__getitem__)
        if order != list(range(len(order))):
            rows = rows.take(pa.array(order, pa.int64()))
        positions = [unordered[i] for i in order]
        self.dead_letters.sort(key=lambda letter: letter.offset)
        return ProcessedPartition(
            topic=messages.topic,
            partition=messages.partition,
            rows=rows,
            row_offsets=[messages.offsets[p] for p in positions],
            row_timestamps_ms=_row_timestamps(messages, positions),
            dead_letters=self.dead_letters,
            skipped_empty=skipped_empty,
            first_offset=messages.offsets[0],
            last_offset=messages.offsets[-1],
            max_timestamp_ms=max(messages.timestamps_ms),
            skipped_filtered=self.filtered,
            unknown_fields=self.unknown_fields,
            added_columns=self.added,
            row_deletes=pa.array([p in self._deletes for p in positions], pa.bool_()) if self._deletes else None,
        )


def _row_timestamps(messages: PartitionMessages, positions: list[int]) -> pa.Array:
    """The Kafka timestamps of the messages at ``positions`` (ascending), as one int64 array (no Python per row)."""
    stamps = pa.array(messages.timestamps_ms, pa.int64())
    if len(positions) == len(stamps):
        return stamps  # every message became a row
    return stamps.take(pa.array(positions, pa.int64()))
