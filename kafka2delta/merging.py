"""The Delta edge of an upsert table: the last change of each key applied with ONE delta-rs MERGE, whose
commit also carries the txn of every partition of the flush (``CommitProperties(app_transactions=…)``).

delta-rs merges copy-on-write: every file holding a changed key is rewritten. What keeps a merge from
reading and rewriting the whole table is the predicate: besides the key equality it bounds the key columns
(ints, dates) by the batch's minimum and maximum and the partition columns that are key columns by the batch's
values, so files whose statistics or partition values lie outside are never opened (README "Upsert tables": keys
that arrive in order, partitioning by a key column, and Z-ordering the key keep the touched files few).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, WriterProperties

from kafka2delta.changes import DELETE_FLAG, DELETED_COLUMN, ChangeOptions
from kafka2delta.changes.collapse import POSITION_COLUMNS, UNAVAILABLE_FLAG

_SOURCE, _TARGET = "s", "t"
_PRUNED_PARTITION_VALUES = 100  # more distinct values than this: no IN list (the predicate stays short)


def merge_changes(
    table: DeltaTable,
    source: pa.Table,
    options: ChangeOptions,
    *,
    partition_by: Sequence[str],
    compression: str,
    properties: CommitProperties,
) -> dict[str, Any]:
    """Apply ``source`` (the last change per key, :data:`DELETE_FLAG` set on deletes) in one commit; returns
    delta-rs's merge metrics (rows and files touched). The table already has every column of ``source`` (never
    ``merge_schema``: delta-rs then nulls a struct that gains a member in the rows it copies)."""
    columns = [name for name in source.column_names if name != DELETE_FLAG and not name.startswith(UNAVAILABLE_FLAG)]
    upsert = f"NOT {_SOURCE}.{quote(DELETE_FLAG)}"
    delete = f"{_SOURCE}.{quote(DELETE_FLAG)}"
    values = {quote(name): f"{_SOURCE}.{quote(name)}" for name in columns}
    updates = dict(values)
    for name in columns:
        flag = UNAVAILABLE_FLAG + name
        if flag in source.column_names:
            # Debezium sends an unchanged TOASTed value (PostgreSQL without REPLICA IDENTITY FULL) as a placeholder
            # that no earlier change of the flush filled (``last_changes``): an update keeps the value the row
            # has; an insert has none (null).
            column = quote(name)
            updates[column] = f"CASE WHEN {_SOURCE}.{quote(flag)} THEN {_TARGET}.{column} ELSE {_SOURCE}.{column} END"
    merger = table.merge(
        source,
        merge_predicate(source, options.key, partition_by),
        source_alias=_SOURCE,
        target_alias=_TARGET,
        writer_properties=WriterProperties(compression=compression.upper()),  # type: ignore[arg-type]
        commit_properties=properties,
    )
    if options.delete_mode == "soft":
        merger = merger.when_matched_update(*_soft_delete(columns, options))
    else:
        merger = merger.when_matched_delete(predicate=delete)
    merger = merger.when_matched_update(updates, predicate=upsert).when_not_matched_insert(values, predicate=upsert)
    return merger.execute()


def _soft_delete(columns: Sequence[str], options: ChangeOptions) -> tuple[dict[str, str], str]:
    """The update of a soft delete and its predicate: it marks the row and records the change; the row's other
    values stay as they were. A delete without a position (Debezium's tombstone after its delete event) keeps the
    row's position, and leaves a row already deleted as it is (not rewritten: found by review, the tombstone blanked
    the delete event's position)."""
    marked = list(dict.fromkeys([DELETED_COLUMN, *(name for name in columns if name in options.extra_columns())]))
    updates = {quote(name): f"{_SOURCE}.{quote(name)}" for name in marked}
    positions = [name for name in marked if name in POSITION_COLUMNS]
    for name in positions:
        updates[quote(name)] = f"COALESCE({_SOURCE}.{quote(name)}, {_TARGET}.{quote(name)})"
    unplaced = "".join(f" AND {_SOURCE}.{quote(name)} IS NULL" for name in positions)
    deleted = f"{_TARGET}.{quote(DELETED_COLUMN)} IS TRUE"
    return updates, f"{_SOURCE}.{quote(DELETE_FLAG)} AND NOT ({deleted}{unplaced})"


def merge_predicate(source: pa.Table, key: Sequence[str], partition_by: Sequence[str]) -> str:
    """Key equality, plus the bounds that let delta-rs skip files: each orderable key column between the
    batch's minimum and maximum, and each partition column that is a key column among the batch's values."""
    terms = [f"{_TARGET}.{quote(column)} = {_SOURCE}.{quote(column)}" for column in key]
    for column in key:
        values = source.column(column)
        if values.null_count == len(values) or not _orderable(values.type):
            continue
        low, high = pc.min_max(values).values()
        if low.is_valid and high.is_valid:
            target = f"{_TARGET}.{quote(column)}"
            terms.append(f"{target} >= {literal(low.as_py())} AND {target} <= {literal(high.as_py())}")
    for column in partition_by:
        # Only a key column: a change may move its row to another value of any other column, and the row in its
        # old partition must still be matched (bounding it by the new value inserted the key twice: found by
        # review).
        if column not in source.column_names or column not in key:
            continue
        values = source.column(column)
        distinct = pc.unique(values).to_pylist()
        if len(distinct) > _PRUNED_PARTITION_VALUES or not _listable(values.type) or None in distinct:
            continue
        terms.append(f"{_TARGET}.{quote(column)} IN ({', '.join(literal(v) for v in distinct)})")
    return " AND ".join(terms)


def quote(name: str) -> str:
    """A column name as delta-rs's SQL reads it."""
    return "`" + name.replace("`", "``") + "`"


def literal(value: Any) -> str:
    """A SQL literal for a key bound or a partition value (ints, decimals, dates, text, booleans)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, Decimal)):
        return str(value)
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        return f"DATE '{value.isoformat()}'"
    return "'" + str(value).replace("'", "''") + "'"


def _orderable(data_type: pa.DataType) -> bool:
    return bool(pa.types.is_integer(data_type) or pa.types.is_date(data_type))


def _listable(data_type: pa.DataType) -> bool:
    return bool(_orderable(data_type) or pa.types.is_string(data_type) or pa.types.is_boolean(data_type))
