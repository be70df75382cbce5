"""The MERGE of one ``jobs apply-changes`` micro-batch, as SQL text and DataFrame expressions (no Spark session):
the collapse of the batch to each key's last change, and the WHEN clauses that apply it to the target.

The collapse (:func:`last_changes`) keeps each key's change with the greatest position ``(coalesce(_lsn, -1),
kafka_partition, kafka_offset)`` (without ``_lsn`` when the changelog has none), and ends the way separate
micro-batches would (docs/DESIGN.md invariant 13), as the daemon's upsert mode does
(:func:`kafka2delta.changes.collapse.last_changes`):

- Debezium's unchanged-TOAST placeholder (a Debezium changelog, one with ``_lsn``: ``__debezium_unavailable_value``
  in each form a column type takes it, :func:`~kafka2delta.changes.collapse.placeholders_of`) takes the key's latest
  earlier real value in the batch (in ``hard`` mode, after its last delete: none, null); left unfilled, the MERGE
  keeps the row's value (an insert gets null);
- ``soft``: a key whose last change is a delete takes its data columns from the key's last upsert in the batch, if
  any (the delete's key and position), as if that upsert had been applied and then the delete;
- a value so taken carries the position of the change it came from, and the MERGE uses it only if that change is
  newer than the row: a late change of the batch gives no values, as it would change nothing on its own.

The MERGE (:func:`merge_clauses`):

- a change reaches an existing row only if its position is greater than the row's (lexicographically): a replay, a
  duplicate or a late change never moves a row backwards; it is ignored, and counted;
- ``hard``: a delete removes the row; any other change replaces every column, or inserts the row;
- ``soft``: a delete sets ``_deleted`` and the row's position, ``_op``, ``_source_ts`` and Kafka columns, and keeps
  its data (or sets its batch's upsert's values); the delete of a key the target lacks inserts a marker (the key,
  its position, ``_deleted = true``) so that a late older change cannot bring the key back (in ``hard`` mode it
  can); other changes set ``_deleted = false``.
"""

from __future__ import annotations

import datetime as dt
import functools
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa

from kafka2delta.changes.collapse import placeholders_of
from kafka2delta.changes.options import CHANGE_COLUMNS, CHANGELOG_METADATA, DELETE_FLAG, DELETED_COLUMN
from kafka2delta.spark.mutations import _q

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import StructType

OP, SOURCE_TS, LSN = (CHANGE_COLUMNS[name][0] for name in ("op", "source_ts", "lsn"))
PARTITION, OFFSET = (f"kafka_{name}" for name in CHANGELOG_METADATA)
TOPIC = "kafka_topic"
"""The changelog's topic column (``table.metadata_columns = ["topic"]``), when it has one."""
VALUES_FLAG = "__k2d_upsert_values"
"""The MERGE source's column telling, on a soft delete, that its data columns are its key's last upsert in the batch
(never a table column)."""
VALUES_POSITION = "__k2d_upsert_position"
"""The MERGE source's column with that upsert's position (a struct ``lsn``, ``partition``, ``offset``): its values
are set only if it is newer than the row (a late upsert in the batch never gives values)."""
PlaceholderSql = str | tuple[str, ...]
"""Debezium's placeholder in one column as SQL (:func:`placeholders`): one literal, or one per form it takes there."""


def filled_position(column: str, placeholders: Mapping[str, PlaceholderSql]) -> str:
    """The MERGE source's column with the position of the change that gave ``column`` its value when the collapse
    filled a TOAST placeholder (null when the last change held the value itself)."""
    return f"__k2d_filled_{list(placeholders).index(column)}"


# -- the MERGE (pure: SQL text)


@dataclass(frozen=True)
class Clause:
    """One WHEN clause of the MERGE (``t``: the target, ``s``: the batch's last change per key)."""

    kind: Literal["delete", "update", "insert"]
    condition: str
    assignments: Mapping[str, str] = field(default_factory=dict)
    """Target column → SQL expression."""


def newer_condition(has_lsn: bool, position: str | None = None) -> str:
    """SQL: the change's position is greater than the row's, ``(coalesce(_lsn, -1), kafka_partition,
    kafka_offset)`` compared lexicographically (without ``_lsn`` when the changelog has none). ``position``: the
    source's position column of another change instead (a struct ``lsn``, ``partition``, ``offset``, as
    :func:`last_changes` writes for the change whose values a collapse took)."""
    fields = {LSN: "lsn", PARTITION: "partition", OFFSET: "offset"}

    def source(column: str) -> str:
        return f"coalesce(s.{_q(column)}, -1)" if position is None else f"s.{_q(position)}.{fields[column]}"

    pairs = [(source(c), f"coalesce(t.{_q(c)}, -1)") for c in ((LSN,) if has_lsn else ())]
    pairs += [(source(c), f"coalesce(t.{_q(c)}, -1)") for c in (PARTITION, OFFSET)]
    condition = f"{pairs[-1][0]} > {pairs[-1][1]}"
    for new, old in reversed(pairs[:-1]):
        condition = f"({new} > {old} OR ({new} = {old} AND {condition}))"
    return condition


def _tracking(column: str) -> bool:
    """A column saying where and when the row's last change comes from (kept up to date by a soft delete)."""
    return column in (OP, SOURCE_TS, LSN) or column.startswith("kafka_")


def merge_clauses(
    key: Sequence[str],
    columns: Sequence[str],
    *,
    has_lsn: bool,
    soft: bool,
    placeholders: Mapping[str, PlaceholderSql] | None = None,
) -> list[Clause]:
    """The MERGE's clauses, in order, for a batch with ``columns`` (the target has them all).

    ``placeholders``: column → Debezium's unchanged-TOAST placeholder there as SQL (:func:`placeholders`).
    A change still holding it (no earlier change of the batch gave the value: :func:`last_changes`) keeps the row's
    value; an insert gets null. A value the collapse took from an earlier change of the batch (its position in
    :func:`filled_position`) is used only if that change is newer than the row: a late change never gives values.
    ``soft``: a delete whose data columns are its key's last upsert in the batch (:data:`VALUES_FLAG`, the
    upsert's position in :data:`VALUES_POSITION`) sets them too, if that upsert is newer than the row."""
    newer, delete = newer_condition(has_lsn), f"s.{_q(DELETE_FLAG)}"
    holes = placeholders or {}

    def kept(column: str, otherwise: str) -> str:
        source = f"s.{_q(column)}"
        if column not in holes:
            return source
        unset = holds_placeholder(source, holes[column])
        if otherwise == "NULL":  # an insert: no row the filled value could be older than
            return f"CASE WHEN {unset} THEN NULL ELSE {source} END"
        filled = filled_position(column, holes)
        late = f"s.{_q(filled)} IS NOT NULL AND NOT {newer_condition(has_lsn, filled)}"
        return f"CASE WHEN {unset} OR ({late}) THEN {otherwise} ELSE {source} END"

    update = {c: kept(c, f"t.{_q(c)}") for c in columns}
    insert = {c: kept(c, "NULL") for c in columns}
    if not soft:
        return [
            Clause("delete", f"{delete} AND {newer}"),
            Clause("update", f"NOT {delete} AND {newer}", update),
            Clause("insert", f"NOT {delete}", insert),
        ]
    values = f"s.{_q(VALUES_FLAG)} AND {newer_condition(has_lsn, VALUES_POSITION)}"
    marker = {c: f"s.{_q(c)}" for c in columns if c in key or _tracking(c)}
    return [
        Clause("update", f"{delete} AND {values} AND {newer}", {**update, DELETED_COLUMN: "true"}),
        Clause(
            "update",
            f"{delete} AND {newer}",
            {**{c: e for c, e in marker.items() if c not in key}, DELETED_COLUMN: "true"},
        ),
        Clause("update", f"NOT {delete} AND {newer}", {**update, DELETED_COLUMN: "false"}),
        Clause("insert", f"{delete} AND s.{_q(VALUES_FLAG)}", {**insert, DELETED_COLUMN: "true"}),
        Clause("insert", delete, {**marker, DELETED_COLUMN: "true"}),
        Clause("insert", f"NOT {delete}", {**insert, DELETED_COLUMN: "false"}),
    ]


def holds_placeholder(value: str, placeholder: PlaceholderSql) -> str:
    """SQL: ``value`` (an SQL expression) is Debezium's placeholder, in any of its forms there."""
    tests = [
        f"map_entries({value}) <=> map_entries({form})" if _is_map(form) else f"{value} <=> {form}"
        for form in _forms(placeholder)
    ]
    return tests[0] if len(tests) == 1 else "(" + " OR ".join(tests) + ")"


def _holds_placeholder(value: Column, placeholder: PlaceholderSql) -> Column:
    """:func:`holds_placeholder` for a DataFrame column (never null)."""
    from pyspark.sql import functions as F

    tests = [
        F.map_entries(value).eqNullSafe(F.map_entries(F.expr(form)))
        if _is_map(form)
        else value.eqNullSafe(F.expr(form))
        for form in _forms(placeholder)
    ]
    return functools.reduce(operator.or_, tests)


def _forms(placeholder: PlaceholderSql) -> tuple[str, ...]:
    return (placeholder,) if isinstance(placeholder, str) else placeholder


def _is_map(form: str) -> bool:
    """Whether a placeholder literal is a map (:func:`sql_literal`): Spark compares no maps, only their entries."""
    return form.startswith("map(")


def sql_literal(value: Any) -> str:
    """A placeholder value (:func:`~kafka2delta.changes.collapse.placeholders_of`: text, bytes, numbers, dates,
    a list of them, a map as a list of key-value pairs) as Spark SQL."""
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, bytes):
        return f"X'{value.hex().upper()}'"
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        return f"DATE '{value.isoformat()}'"
    if isinstance(value, list) and value and all(isinstance(v, tuple) for v in value):
        return "map(" + ", ".join(sql_literal(part) for pair in value for part in pair) + ")"
    if isinstance(value, list):
        return "array(" + ", ".join(sql_literal(v) for v in value) + ")"
    raise TypeError(f"no SQL literal for {value!r}")


def placeholders(schema: StructType, key: Sequence[str]) -> dict[str, PlaceholderSql]:
    """Column → Debezium's unchanged-TOAST placeholder as it arrives in that column (the changelog keeps it as it
    came), for the data columns that can hold it (not the key, not the position columns): the forms
    :func:`~kafka2delta.changes.collapse.placeholders_of` knows for the column's type (read through Spark's Arrow
    mapping), each as an SQL literal of that type (a string column: one literal per form)."""
    from pyspark.errors import PySparkException
    from pyspark.sql.pandas.types import to_arrow_type

    found: dict[str, PlaceholderSql] = {}
    for column in schema.fields:
        if column.name in key or _tracking(column.name):
            continue
        try:
            arrow = to_arrow_type(column.dataType)
        except (PySparkException, TypeError, ValueError):  # a type Arrow has no mapping for: never a placeholder
            continue
        literals = tuple(sql_literal(form) for form in placeholders_of(arrow))
        if pa.types.is_list(arrow) and pa.types.is_integer(arrow.value_type):
            # array(95, …) is an array<int>: typed as the column (bigint[]).
            literals = tuple(f"CAST({literal} AS {column.dataType.simpleString()})" for literal in literals)
        if literals:
            found[column.name] = literals[0] if len(literals) == 1 else literals
    return found


def last_changes(
    batch: DataFrame,
    key: Sequence[str],
    *,
    soft: bool = False,
    placeholders: Mapping[str, PlaceholderSql] | None = None,
) -> DataFrame:
    """The last change of each key (null keys dropped), with the MERGE's delete flag (and, ``soft``,
    :data:`VALUES_FLAG`), collapsed the way separate micro-batches would end, as the daemon's upsert mode collapses
    a flush (:func:`kafka2delta.changes.collapse.last_changes`):

    - ``placeholders`` (column → SQL, :func:`placeholders`): a last change holding Debezium's unchanged-TOAST
      placeholder takes the key's latest earlier value in the batch that is not the placeholder; in ``hard`` mode
      only one after the key's last delete (the row was gone), and with none after it, null. Otherwise the
      placeholder stays, and the MERGE keeps the row's value (:func:`merge_clauses`).
    - ``soft``: a key whose last change is a delete takes the data columns of its last upsert in the batch (the key,
      the position, ``_op`` and the other change and Kafka columns stay the delete's), flagged
      :data:`VALUES_FLAG`, as if that upsert had been merged and then the delete.
    """
    from pyspark.sql import functions as F

    columns = batch.columns
    minus_one = F.lit(-1).cast("bigint")
    position = F.struct(
        *([F.coalesce(F.col(_q(LSN)).cast("bigint"), minus_one).alias("lsn")] if LSN in columns else []),
        F.coalesce(F.col(_q(PARTITION)).cast("bigint"), minus_one).alias("partition"),
        F.coalesce(F.col(_q(OFFSET)).cast("bigint"), minus_one).alias("offset"),
    )
    deleted = F.coalesce(F.col(_q(OP)) == F.lit("d"), F.lit(False))
    upsert = ~deleted
    row = F.struct(*(F.col(_q(c)) for c in columns))
    last, last_upsert, last_delete = "__k2d_last", "__k2d_last_upsert", "__k2d_last_delete"
    aggregates = [F.max_by(row, position).alias(last)]
    last_upsert_position = "__k2d_last_upsert_position"
    if soft:
        aggregates.append(F.max_by(F.when(upsert, row), F.when(upsert, position)).alias(last_upsert))
        aggregates.append(F.max(F.when(upsert, position)).alias(last_upsert_position))
    holes = dict(placeholders or {})
    given = {c: f"__k2d_given_{i}" for i, c in enumerate(holes)}
    if holes and not soft:
        aggregates.append(F.max(F.when(deleted, position)).alias(last_delete))
    for column, placeholder in holes.items():
        real = upsert & ~_holds_placeholder(F.col(_q(column)), placeholder)
        value = F.struct(F.col(_q(column)).alias("value"), position.alias("position"))
        aggregates.append(F.max_by(F.when(real, value), F.when(real, position)).alias(given[column]))
    keyed = batch.where(" AND ".join(f"{_q(c)} IS NOT NULL" for c in key))
    grouped = keyed.groupBy(*(F.col(_q(c)).alias(f"__k2d_key_{i}") for i, c in enumerate(key))).agg(*aggregates)

    chosen = F.col(last)
    is_delete = F.coalesce(chosen.getField(OP) == F.lit("d"), F.lit(False))
    with_values = (is_delete & F.col(last_upsert).isNotNull()) if soft else F.lit(False)
    selected = []
    filled = []  # where each filled value comes from: the MERGE uses it only if newer than the row
    for column in columns:
        value = chosen.getField(column)
        if soft and column not in key and not _tracking(column):
            value = F.when(with_values, F.col(last_upsert).getField(column)).otherwise(value)
        if column in holes:
            found = F.col(given[column])
            unset = _holds_placeholder(value, holes[column])
            given_by_found = unset & found.isNotNull()
            if soft:
                value, source = (
                    F.when(given_by_found, found.getField("value")).otherwise(value),
                    F.when(given_by_found, found.getField("position")),
                )
            else:
                after_delete = F.col(last_delete).isNull() | (found.getField("position") > F.col(last_delete))
                gone = unset & F.col(last_delete).isNotNull()
                value, source = (
                    F.when(given_by_found & after_delete, found.getField("value"))
                    .when(gone, F.lit(None))
                    .otherwise(value),
                    F.when(given_by_found & after_delete, found.getField("position")).when(gone, F.col(last_delete)),
                )
            filled.append(source.alias(filled_position(column, holes)))
        selected.append(value.alias(column))
    selected.append(is_delete.alias(DELETE_FLAG))
    if soft:
        selected.append(with_values.alias(VALUES_FLAG))
        selected.append(F.when(with_values, F.col(last_upsert_position)).alias(VALUES_POSITION))
    return grouped.select(*selected, *filled)
