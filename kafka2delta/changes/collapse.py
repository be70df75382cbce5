"""A flush's changes to one table → the MERGE source: the last change of each key (pure Arrow, one pass in Python
per column that needs it)."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import uuid
from collections.abc import Hashable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from kafka2delta.changes.options import CHANGE_COLUMNS, DELETE_FLAG, UNAVAILABLE_VALUE, ChangeOptions

_INDEX = "__k2d_index"
POSITION_COLUMNS = tuple(CHANGE_COLUMNS[name][0] for name in ("source_ts", "lsn"))
"""The change columns that place a change in the source (``_source_ts``, ``_lsn``). A Debezium tombstone has
none: as a soft delete it keeps those of the key's latest change that has them."""
UNAVAILABLE_FLAG = "__k2d_unavailable__"
"""Prefix of the MERGE source's column telling, per row, that a column's value did not change and no earlier
change of the flush gave it: the MERGE keeps the row's value (a row it inserts gets null)."""


def last_changes(
    rows: pa.Table,
    deletes: pa.Array,
    key: Sequence[str],
    unavailable: str | None = None,
    *,
    soft: bool = False,
    kept: Sequence[str] = (),
) -> pa.Table:
    """The last row of each key, with :data:`DELETE_FLAG` telling deletes from upserts.

    ``rows`` are in the order their changes happened (a flush's partitions one after the other, each in offset
    order: "last" is by partition, then offset); ``deletes`` is aligned with them.

    ``unavailable``: Debezium's placeholder for "this value did not change" (an unchanged TOASTed value, in each
    column type's form: :func:`placeholders_of`). The last change takes the value the key's latest earlier change
    in ``rows`` gave; with none, :data:`UNAVAILABLE_FLAG` marks it and the value is null. A hard delete ends what
    a key's earlier changes gave (its row is gone); a soft one (``soft``) keeps it, as the marked row does.

    ``soft``: a key whose last change is a delete after an upsert in ``rows`` becomes that upsert, marked deleted
    (its ``kept`` columns, the key, ``_deleted`` and the change columns, from the delete): as if the upsert had
    been merged and then the delete, in two flushes (found by review: the upsert was lost). A delete without a
    position (:data:`POSITION_COLUMNS` null: the tombstone after Debezium's delete event) takes them from the
    key's latest change in ``rows`` that has one, as the MERGE keeps the row's (found by review: the tombstone
    blanked the delete event's).
    """
    if not rows.num_rows or not key:
        return rows.slice(0, 0).append_column(DELETE_FLAG, pa.array([], pa.bool_()))
    rows = _without_negative_zero(rows, key)
    indexed = rows.select(list(key)).append_column(_INDEX, pa.array(range(rows.num_rows), pa.int64()))
    last = indexed.group_by(list(key), use_threads=False).aggregate([(_INDEX, "max")])
    chosen = last.column(f"{_INDEX}_max").combine_chunks().sort()
    chosen_flags = deletes.take(chosen)
    keys: list[Hashable] | None = None
    if soft and pc.any(chosen_flags).as_py():  # Python lists only where a flush needs them
        keys = _keys(rows, key)
        changes, upserts = _soft_deletes(rows, chosen.to_pylist(), deletes.to_pylist(), keys, kept)
        flipped = pa.array([upsert is not None for upsert in upserts], pa.bool_())
        chosen_flags = pc.and_(chosen_flags, pc.invert(flipped))
    else:
        changes = rows.take(chosen)
    if unavailable is not None:
        changes = _fill_unavailable(rows, changes, chosen, deletes, key, unavailable, soft, keys)
    return changes.append_column(DELETE_FLAG, chosen_flags)


def last_changes_of(rows: pa.Table, deletes: pa.Array, options: ChangeOptions) -> pa.Table:
    """:func:`last_changes` as ``options`` apply them: Debezium's TOAST placeholder, the delete mode, and the columns
    a flipped soft delete takes from the delete (the key, ``_deleted`` and the change columns)."""
    return last_changes(
        rows,
        deletes,
        options.key,
        UNAVAILABLE_VALUE if options.envelope == "debezium" else None,
        soft=options.delete_mode == "soft",
        kept=[*options.key, *options.extra_columns()],
    )


def _without_negative_zero(rows: pa.Table, key: Sequence[str]) -> pa.Table:
    """-0.0 and 0.0 are one key to the MERGE (Arrow's group_by keeps them apart; delta-rs then finds two source
    rows for one target row: found by review)."""
    for column in key:
        index = rows.schema.get_field_index(column)
        values = rows.column(index)
        if pa.types.is_floating(values.type):
            rows = rows.set_column(index, rows.schema.field(index), pc.add(values, pa.scalar(0.0, values.type)))
    return rows


def _keys(rows: pa.Table, key: Sequence[str]) -> list[Hashable]:
    """Each row's key as a dict key (NaN, which is never equal to itself, as one key: as Arrow's group_by)."""
    columns = [[_NAN if value != value else value for value in rows.column(c).to_pylist()] for c in key]
    return list(zip(*columns, strict=True)) if len(columns) > 1 else columns[0]


_NAN: Any = object()


def _soft_deletes(
    rows: pa.Table, chosen: list[int], flags: list[bool], keys: list[Hashable], kept: Sequence[str]
) -> tuple[pa.Table, list[int | None]]:
    """Soft deletes: a key's last change, a delete, on the values of its last upsert in ``rows`` and, when it has
    no position itself, with that of the key's latest change that has one; with the index of that upsert per
    chosen change (None: not such a delete, or no upsert before it)."""
    positions = [name for name in POSITION_COLUMNS if name in kept and name in rows.column_names]
    positioned = _positioned(rows, positions)
    last_upsert: dict[Hashable, int] = {}
    last_positioned: dict[Hashable, int] = {}
    for index, deleted in enumerate(flags):
        if not deleted:
            last_upsert[keys[index]] = index
        if positioned[index]:
            last_positioned[keys[index]] = index
    upserts = [last_upsert.get(keys[index]) if flags[index] else None for index in chosen]
    values = [index if upsert is None else upsert for index, upsert in zip(chosen, upserts, strict=True)]
    placed = [last_positioned.get(keys[i], i) if flags[i] and not positioned[i] else i for i in chosen]
    changes = rows.take(pa.array(values, pa.int64()))
    if values == chosen and placed == chosen:
        return changes, upserts
    from_delete = rows.take(pa.array(chosen, pa.int64()))
    from_position = rows.take(pa.array(placed, pa.int64()))
    for name in kept:
        if name in changes.column_names:
            column = (from_position if name in positions else from_delete).column(name)
            position = changes.schema.get_field_index(name)
            changes = changes.set_column(position, changes.schema.field(position), column)
    return changes, upserts


def _positioned(rows: pa.Table, positions: Sequence[str]) -> list[bool]:
    """Per row, whether any of the ``positions`` columns holds a value."""
    if not positions:
        return [False] * rows.num_rows
    valid = pc.is_valid(rows.column(positions[0]))
    for name in positions[1:]:
        valid = pc.or_(valid, pc.is_valid(rows.column(name)))
    return [bool(value) for value in valid.to_pylist()]


def _fill_unavailable(
    rows: pa.Table,
    changes: pa.Table,
    chosen: pa.Array,
    deletes: pa.Array,
    key: Sequence[str],
    unavailable: str,
    soft: bool,
    keys: list[Hashable] | None,
) -> pa.Table:
    for index, column in enumerate(changes.schema):
        forms = _placeholders(column.type, unavailable)
        if not forms or column.name in key or not _may_hold(changes.column(index), forms):
            continue
        values = changes.column(index).to_pylist()
        marked = [value in forms for value in values]
        if not any(marked):
            continue
        keys = keys if keys is not None else _keys(rows, key)
        given = _values_given(rows.column(column.name).to_pylist(), deletes.to_pylist(), keys, forms, soft)
        indexes = chosen.to_pylist()
        unset = []
        for position, is_marked in enumerate(marked):
            if is_marked:
                found = given.get(keys[indexes[position]], _NONE)
                values[position] = None if found is _NONE else found
                unset.append(found is _NONE)
            else:
                unset.append(False)
        changes = changes.set_column(index, column, pa.array(values, column.type))
        if any(unset):
            changes = changes.append_column(UNAVAILABLE_FLAG + column.name, pa.array(unset, pa.bool_()))
    return changes


_NONE: Any = object()


def _values_given(
    history: list[Any], flags: list[bool], keys: list[Hashable], forms: tuple[Any, ...], soft: bool
) -> dict[Hashable, Any]:
    """Each key's latest value that is not the placeholder, from its upserts. After a hard delete it is null: the
    row is gone, and a later change inserts it anew (as it would in a later flush)."""
    given: dict[Hashable, Any] = {}
    for value, deleted, row_key in zip(history, flags, keys, strict=True):
        if deleted:
            if not soft:
                given[row_key] = None
        elif value not in forms:
            given[row_key] = value
    return given


def _may_hold(values: pa.ChunkedArray, forms: tuple[Any, ...]) -> bool:
    """Whether ``values`` may hold one of the placeholder's ``forms``, tested in Arrow (most flushes hold none, and
    then no value is read into Python): a list column by its elements, a map column by its keys."""
    if pa.types.is_map(values.type):
        values = pa.chunked_array([chunk.keys for chunk in values.chunks], values.type.key_type)
        firsts = [form[0][0] for form in forms]
    elif pa.types.is_list(values.type):
        values = pc.list_flatten(values)
        firsts = [form[0] for form in forms]
    else:
        firsts = list(forms)
    return bool(pc.any(pc.is_in(values, value_set=pa.array(firsts, values.type))).as_py())


def placeholders_of(data_type: pa.DataType) -> tuple[Any, ...]:
    """Debezium's unchanged-TOAST placeholder (:data:`UNAVAILABLE_VALUE`) in each form it arrives in a column of
    ``data_type`` (as Python values of that type); empty if Debezium never writes it there. A changelog table keeps
    it as it arrived: ``jobs apply-changes`` fills it as :func:`last_changes` does."""
    return _placeholders(data_type, UNAVAILABLE_VALUE)


_EPOCH_DATE = dt.date(1970, 1, 1)


def _placeholders(data_type: pa.DataType, unavailable: str) -> tuple[Any, ...]:
    """How Debezium's PostgreSQL connector writes an unchanged TOASTed value in a column of ``data_type``
    (``UnchangedToastedPlaceholder``: by the source column's type, in the form its values take)."""
    raw = unavailable.encode()
    if pa.types.is_string(data_type) or pa.types.is_large_string(data_type):
        # Text (json, xml …), and hstore as JSON text (hstore.handling.mode = json, the default).
        return unavailable, json.dumps({unavailable: unavailable}, separators=(",", ":"), ensure_ascii=False)
    if pa.types.is_binary(data_type) or pa.types.is_large_binary(data_type):
        return (raw,)
    if pa.types.is_map(data_type):
        both_text = pa.types.is_string(data_type.key_type) and pa.types.is_string(data_type.item_type)
        return ([(unavailable, unavailable)],) if both_text else ()  # hstore, hstore.handling.mode = map
    if not pa.types.is_list(data_type):
        return ()
    item = data_type.value_type
    if pa.types.is_string(item):
        # text[], varchar[], json[] …; uuid[] as a name-based UUID of the placeholder (Java's nameUUIDFromBytes).
        return [unavailable], [str(uuid.UUID(bytes=hashlib.md5(raw, usedforsecurity=False).digest(), version=3))]
    if pa.types.is_binary(item):
        return ([raw],)  # bytea[]
    signed = [byte - 256 if byte > 127 else byte for byte in raw]  # Java's bytes
    if pa.types.is_signed_integer(item):
        return (signed,)  # int[], bigint[]: the placeholder's bytes as numbers
    if pa.types.is_date32(item):
        return ([_EPOCH_DATE + dt.timedelta(days=byte) for byte in signed],)  # date[]: an int[] of days
    return ()
