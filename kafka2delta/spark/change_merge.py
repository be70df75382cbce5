"""The MERGE of one ``jobs apply-changes`` micro-batch, as SQL text and DataFrame expressions (no Spark session):
the collapse of the batch to each key's last change, and the WHEN clauses that apply it to the target.

The collapse (:func:`last_changes`) keeps each key's change with the greatest position ``(coalesce(_lsn, -1),
kafka_partition, kafka_offset)`` (without ``_lsn`` when the changelog has none), and ends the way separate
micro-batches would (docs/DESIGN.md invariant 13), as the daemon's upsert mode does
(:func:`kafka2delta.changes.collapse.last_changes`):

- Debezium's unchanged-TOAST placeholder (a Debezium changelog, one with ``_lsn``: ``__debezium_unavailable_value``,
  its bytes, ``[placeholder]``) takes the key's latest earlier real value in the batch (in ``hard`` mode, after its
  last delete: none, null); left unfilled, the MERGE keeps the row's value (an insert gets null);
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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from kafka2delta.changes.collapse import placeholder_of
from kafka2delta.changes.options import CHANGE_COLUMNS, CHANGELOG_METADATA, DELETE_FLAG, DELETED_COLUMN
from kafka2delta.spark.mutations import _q

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
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


def filled_position(column: str, placeholders: Mapping[str, str]) -> str:
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
    placeholders: Mapping[str, str] | None = None,
) -> list[Clause]:
    """The MERGE's clauses, in order, for a batch with ``columns`` (the target has them all).

    ``placeholders``: column → SQL literal of Debezium's unchanged-TOAST placeholder there (:func:`placeholders`).
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
        if otherwise == "NULL":  # an insert: no row the filled value could be older than
            return f"CASE WHEN {source} <=> {holes[column]} THEN NULL ELSE {source} END"
        filled = filled_position(column, holes)
        late = f"s.{_q(filled)} IS NOT NULL AND NOT {newer_condition(has_lsn, filled)}"
        return f"CASE WHEN {source} <=> {holes[column]} OR ({late}) THEN {otherwise} ELSE {source} END"

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


def sql_literal(value: Any) -> str:
    """A placeholder value (:func:`~kafka2delta.changes.collapse.placeholder_of`: text, bytes, a list of text) as
    Spark SQL."""
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, bytes):
        return f"X'{value.hex().upper()}'"
    if isinstance(value, list):
        return "array(" + ", ".join(sql_literal(v) for v in value) + ")"
    raise TypeError(f"no SQL literal for {value!r}")


def placeholders(schema: StructType, key: Sequence[str]) -> dict[str, str]:
    """Column → SQL literal of Debezium's unchanged-TOAST placeholder as it arrives in that column (the
    changelog keeps it as it came), for the data columns that can hold it (not the key, not the position columns):
    the types :func:`~kafka2delta.changes.collapse.placeholder_of` knows, read through Spark's Arrow mapping."""
    from pyspark.errors import PySparkException
    from pyspark.sql.pandas.types import to_arrow_type

    found: dict[str, str] = {}
    for column in schema.fields:
        if column.name in key or _tracking(column.name):
            continue
        try:
            arrow = to_arrow_type(column.dataType)
        except (PySparkException, TypeError, ValueError):  # a type Arrow has no mapping for: never a placeholder
            continue
        value = placeholder_of(arrow)
        if value is not None:
            found[column.name] = sql_literal(value)
    return found


def last_changes(
    batch: DataFrame, key: Sequence[str], *, soft: bool = False, placeholders: Mapping[str, str] | None = None
) -> DataFrame:
    """The last change of each key (null keys dropped), with the MERGE's delete flag (and, ``soft``,
    :data:`VALUES_FLAG`), collapsed the way separate micro-batches would end, as the daemon's upsert mode collapses
    a flush (:func:`kafka2delta.changes.collapse.last_changes`):

    - ``placeholders`` (column → SQL literal, :func:`placeholders`): a last change holding Debezium's unchanged-TOAST
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
    for column, literal in holes.items():
        real = upsert & ~F.col(_q(column)).eqNullSafe(F.expr(literal))
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
            unset = value.eqNullSafe(F.expr(holes[column]))
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
