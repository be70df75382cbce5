"""Mutation and GDPR requests: parsing and grouping (pure), checking their values against the column types
(Spark), and applying one micro-batch of them to the table.

A mutation request is one JSON object per Kafka message::

    {"op": "update", "match": {"lead_id": "L1"}, "set": {"contact_id": "C9"}}
    {"op": "delete", "match": {"lead_id": "L2", "org": "o1"}}

``match`` and ``set`` name top-level columns with scalar values (``set`` values may be null, except for a NOT
NULL column). A GDPR request is ``{"subject_id": "U1"}``: every row whose ``jobs.subject_column`` equals it is
deleted. Every value must cast to its column's type (Spark's ``try_cast``, the cast the MERGE applies). A request
that is not valid is logged with ``topic[partition]@offset``, counted, never applied, and does not stop the job.

Exactly once: a micro-batch's requests, in (partition, offset) order, are cut into groups of consecutive
requests that one MERGE can apply as if one by one (the same match columns and no match value twice once cast
to the column types, so each row meets at most one of them; updates setting the same columns, none of them a
match column; deletes mix in). Group ``i`` of batch ``b`` commits with Delta's idempotent-DML transaction
``txnAppId = <app_id>-<job name>``, ``txnVersion = b * 1_000_000 + i``, so a replayed batch (a crash after some
of its commits, or a conflict) skips the groups that landed and applies the rest. GDPR batches are one DELETE
each: ``txnVersion = b``. A table whose txn version is past the batch's range raises
:class:`~kafka2delta.spark.errors.CheckpointMismatch` (the checkpoint is not the one that wrote it) instead of
skipping the batch as a replay.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from kafka2delta.spark.errors import CheckpointMismatch, translate

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

logger = logging.getLogger(__name__)

GROUP_STRIDE = 1_000_000
"""txnVersion = batch id * GROUP_STRIDE + group index (a batch holds fewer requests than this)."""
TXN_APP_ID_CONF = "spark.databricks.delta.write.txnAppId"
TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"

Scalar = str | int | float | bool | None


@dataclass(frozen=True)
class Request:
    """One valid mutation request."""

    op: Literal["update", "delete"]
    match: tuple[tuple[str, Scalar], ...]
    set: tuple[tuple[str, Scalar], ...]
    where: str
    """``topic[partition]@offset``, for logs."""
    canonical: tuple[str | None, ...] | None = None
    """The match values cast to their column types and back to text (:func:`check_values`): ``1`` and ``"1"``
    match the same rows of a bigint column, so they are one key."""

    @property
    def shape(self) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
        return self.op, tuple(c for c, _ in self.match), tuple(c for c, _ in self.set)

    @property
    def key(self) -> tuple[Scalar, ...]:
        if self.canonical is not None:
            return self.canonical
        return tuple(_text(v) for _, v in self.match)


@dataclass
class BatchResult:
    """What one micro-batch did."""

    requests: int = 0
    invalid: int = 0
    commits: int = 0
    skipped_commits: int = 0
    """Groups already applied by an earlier run of the same batch (their txnVersion was in the log)."""
    rows_updated: int = 0
    rows_deleted: int = 0
    errors: list[str] = field(default_factory=list)

    def add(self, other: BatchResult) -> None:
        self.requests += other.requests
        self.invalid += other.invalid
        self.commits += other.commits
        self.skipped_commits += other.skipped_commits
        self.rows_updated += other.rows_updated
        self.rows_deleted += other.rows_deleted
        self.errors.extend(other.errors)


def _scalar_columns(
    schema: Mapping[str, str], values: Any, what: str, *, nullable: bool, not_null: frozenset[str] = frozenset()
) -> tuple[tuple[str, Scalar], ...]:
    if not isinstance(values, dict) or not values:
        raise ValueError(f"'{what}' must be a non-empty object of column: value")
    pairs = []
    for column, value in values.items():
        if column not in schema:
            raise ValueError(f"'{what}' names {column!r}, which is not a top-level column")
        if schema[column].startswith(("struct", "array", "map")):
            raise ValueError(f"'{what}' names {column!r}, a {schema[column]} column (scalars only)")
        if value is None and not nullable:
            raise ValueError(f"'{what}' needs a value for {column!r}, not null")
        if value is None and column in not_null:
            raise ValueError(f"'{what}' cannot make {column!r} null: it is a NOT NULL column")
        if isinstance(value, (dict, list)):
            raise ValueError(f"'{what}' value of {column!r} must be a scalar, got {json.dumps(value)[:80]}")
        pairs.append((str(column), value))
    return tuple(sorted(pairs))


def parse_mutation(
    payload: bytes | None, schema: Mapping[str, str], where: str, not_null: frozenset[str] = frozenset()
) -> Request:
    """A well-formed request from a message payload; ValueError says why not. ``schema`` maps column → simple
    type, ``not_null`` names the NOT NULL columns. Whether the values cast to the column types is
    :func:`check_values`' part (it needs Spark)."""
    if not payload:
        raise ValueError("empty payload")
    try:
        raw = json.loads(payload)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"not JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise ValueError("not a JSON object")
    op = raw.get("op")
    unknown = set(raw) - {"op", "match", "set"}
    if unknown:
        raise ValueError(f"unknown keys {sorted(unknown)}")
    match = _scalar_columns(schema, raw.get("match"), "match", nullable=False)
    if op == "delete":
        if raw.get("set"):
            raise ValueError("a delete has no 'set'")
        return Request("delete", match, (), where)
    if op == "update":
        assignments = _scalar_columns(schema, raw.get("set"), "set", nullable=True, not_null=not_null)
        return Request("update", match, assignments, where)
    raise ValueError(f"'op' must be 'update' or 'delete', got {op!r}")


def parse_subject(payload: bytes | None) -> str:
    """The subject id of a GDPR request ``{"subject_id": ...}``; ValueError says why not."""
    if not payload:
        raise ValueError("empty payload")
    try:
        raw = json.loads(payload)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"not JSON: {exc}") from exc
    if not isinstance(raw, dict) or set(raw) != {"subject_id"}:
        raise ValueError('expected {"subject_id": <id>}')
    subject = raw["subject_id"]
    if subject is None or isinstance(subject, (dict, list, bool)) or subject == "":
        raise ValueError(f"subject_id must be a string or number, got {subject!r}")
    return str(subject)


def _set_columns(group: Sequence[Request]) -> tuple[str, ...] | None:
    """The ``set`` columns of a group's updates (None: deletes only so far)."""
    return next((r.shape[2] for r in group if r.op == "update"), None)


def group_requests(requests: Sequence[Request]) -> list[list[Request]]:
    """Cut ``requests`` (in order) into groups that one MERGE each applies exactly as if one by one.

    A group's requests match on the same columns with distinct values, so each row is matched by at most one
    of them and their order inside the group does not matter; updates in a group set the same columns, never a
    match column (a row cannot move to another request's key). Deletes and updates mix.
    """
    groups: list[list[Request]] = []
    keys: set[tuple[Scalar, ...]] = set()
    for request in requests:
        _op, match_columns, set_columns = request.shape
        current = groups[-1] if groups else None
        fits = (
            current is not None
            and current[0].shape[1] == match_columns
            and request.key not in keys
            and not set(match_columns) & set(set_columns)
            and not set(match_columns) & set(_set_columns(current) or ())
            and (request.op == "delete" or _set_columns(current) in (None, set_columns))
        )
        if not fits:
            groups.append([])
            keys = set()
        groups[-1].append(request)
        keys.add(request.key)
    return groups


def _text(value: Scalar) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _q(column: str) -> str:
    return "`" + column.replace("`", "``") + "`"


def simple_schema(schema: StructType) -> dict[str, str]:
    """Top-level column name → Spark SQL type (``string``, ``bigint``, ``struct<…>``)."""
    return {f.name: f.dataType.simpleString() for f in schema.fields}


def not_null_columns(schema: StructType) -> frozenset[str]:
    return frozenset(f.name for f in schema.fields if not f.nullable)


def _cast(expression: str, column_type: str) -> str:
    """``try_cast``: never an error inside a MERGE (Spark 4 runs ANSI casts, which fail the whole batch on
    every replay); the values were checked with the same cast by :func:`check_values`."""
    return f"try_cast({expression} AS {column_type})"


def check_values(
    session: SparkSession, requests: Sequence[Request], types: Mapping[str, str]
) -> tuple[list[Request], list[tuple[Request, str]]]:
    """The requests whose every value casts to its column's type, with their canonical keys; and the others,
    each with the reason. One small Spark job (the cast is Spark's own, the one the MERGE applies)."""
    from pyspark.sql.types import StringType, StructField, StructType

    if not requests:
        return [], []
    slots: dict[tuple[str, str], int] = {}
    for request in requests:
        for kind, pairs in (("match", request.match), ("set", request.set)):
            for column, _ in pairs:
                slots.setdefault((kind, column), len(slots))
    rows = []
    for request in requests:
        row: list[str | None] = [None] * len(slots)
        for kind, pairs in (("match", request.match), ("set", request.set)):
            for column, value in pairs:
                row[slots[kind, column]] = _text(value)
        rows.append(tuple(row))
    schema = StructType([StructField(f"v{i}", StringType(), True) for i in range(len(slots))])
    casts = [f"CAST({_cast(f'v{i}', types[column])} AS STRING)" for (_kind, column), i in slots.items()]
    results = session.createDataFrame(rows, schema).selectExpr(*casts).collect()
    valid, invalid = [], []
    for request, raw, cast in zip(requests, rows, results, strict=True):
        problems = [
            f"'{kind}' value {raw[i]!r} of {column!r} is not a {types[column]}"
            for (kind, column), i in slots.items()
            if raw[i] is not None and cast[i] is None
        ]
        if problems:
            invalid.append((request, "; ".join(problems)))
            continue
        canonical = tuple(cast[slots["match", column]] for column, _ in request.match)
        valid.append(dataclasses.replace(request, canonical=canonical))
    return valid, invalid


class _Txn:
    """Delta's idempotent-DML transaction for the commands run inside the block."""

    def __init__(self, session: SparkSession, app_id: str, version: int) -> None:
        self._session, self._app_id, self._version = session, app_id, version

    def __enter__(self) -> None:
        self._session.conf.set(TXN_APP_ID_CONF, self._app_id)
        self._session.conf.set(TXN_VERSION_CONF, str(self._version))

    def __exit__(self, *exc: object) -> None:
        self._session.conf.unset(TXN_APP_ID_CONF)
        self._session.conf.unset(TXN_VERSION_CONF)


@dataclass(frozen=True)
class Target:
    """The table the jobs change: its URI and storage options for deltalake, its path for Spark."""

    uri: str
    storage_options: Mapping[str, str] = field(default_factory=dict)

    @property
    def path(self) -> str:
        from kafka2delta.spark.session import spark_path

        return spark_path(self.uri)

    def applied_version(self, txn_app_id: str) -> int:
        """The table's txn version of ``txn_app_id`` (-1 if none), read with deltalake (a storage failure: a
        :class:`~kafka2delta.errors.RetryableError`)."""
        from deltalake.exceptions import DeltaError

        from kafka2delta.errors import RetryableError
        from kafka2delta.spark.tables import open_table

        try:
            version = open_table(self.uri, self.storage_options).transaction_version(txn_app_id)
        except (DeltaError, OSError) as exc:
            raise RetryableError(f"reading the txn version of {txn_app_id} in {self.uri}: {exc}") from exc
        return -1 if version is None else int(version)


def _merge(session: SparkSession, path: str, group: list[Request], types: Mapping[str, str]) -> tuple[int, int]:
    """One MERGE applying ``group``; (rows updated, rows deleted)."""
    from delta.tables import DeltaTable
    from pyspark.sql.types import StringType, StructField, StructType

    match_columns = group[0].shape[1]
    set_columns = _set_columns(group) or ()
    names = ["op"] + [f"m{i}" for i in range(len(match_columns))] + [f"s{i}" for i in range(len(set_columns))]
    source_schema = StructType([StructField(n, StringType(), True) for n in names])
    rows = [
        (r.op, *(_text(v) for _, v in r.match), *(_text(v) for _, v in r.set or [(c, None) for c in set_columns]))
        for r in group
    ]
    source = session.createDataFrame(rows, source_schema)
    condition = " AND ".join(f"t.{_q(c)} = {_cast(f's.m{i}', types[c])}" for i, c in enumerate(match_columns))
    builder = DeltaTable.forPath(session, path).alias("t").merge(source.alias("s"), condition)
    if any(r.op == "delete" for r in group):
        builder = builder.whenMatchedDelete(condition="s.op = 'delete'")
    if set_columns:
        builder = builder.whenMatchedUpdate(
            condition="s.op = 'update'",
            set={_q(c): _cast(f"s.s{i}", types[c]) for i, c in enumerate(set_columns)},
        )
    metrics = builder.execute().collect()
    if not metrics:
        return 0, 0
    row = metrics[0].asDict()
    return int(row.get("num_updated_rows") or 0), int(row.get("num_deleted_rows") or 0)


def check_not_past(
    target: Target,
    txn_app_id: str,
    applied: int,
    batch_id: int,
    versions: tuple[int, int] | None = None,
    *,
    start_over: str = "run with a new --job-name to start over",
) -> None:
    """Raise :class:`CheckpointMismatch` if the table applied a txn version past this batch's ``versions`` (first,
    last; default: the batch id alone): a later batch of another checkpoint. ``start_over`` ends the advice."""
    first, last = versions or (batch_id, batch_id)
    if applied > last:
        span = f"{first}" if first == last else f"{first}..{last}"
        raise CheckpointMismatch(
            f"batch {batch_id} would commit txn version(s) {span} of {txn_app_id}, but {target.uri} already has "
            f"version {applied}: the checkpoint is behind the table (restored, replaced, or shared with another "
            "job of the same name); its batches would be skipped as replays. Run with the checkpoint that wrote "
            f"version {applied} (jobs.checkpoint_dir, --job-name), or {start_over}"
        )


def apply_mutations(
    session: SparkSession,
    target: Target,
    messages: Sequence[tuple[int, int, bytes | None]],
    batch_id: int,
    txn_app_id: str,
    topic: str,
) -> BatchResult:
    """Apply one micro-batch of mutation requests (``(partition, offset, value)``) to ``target``, committing
    with ``txn_app_id`` (``<app_id>-<job name>``)."""
    from delta.tables import DeltaTable
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    path = target.path
    result = BatchResult()
    first, last = batch_id * GROUP_STRIDE, batch_id * GROUP_STRIDE + GROUP_STRIDE - 1
    applied = target.applied_version(txn_app_id)
    check_not_past(target, txn_app_id, applied, batch_id, (first, last))
    schema = DeltaTable.forPath(session, path).toDF().schema
    types, not_null = simple_schema(schema), not_null_columns(schema)
    parsed = []
    for partition, offset, value in sorted(messages, key=lambda m: (m[0], m[1])):
        where = f"{topic}[{partition}]@{offset}"
        result.requests += 1
        try:
            parsed.append(parse_mutation(value, types, where, not_null))
        except ValueError as exc:
            result.invalid += 1
            logger.warning("invalid mutation request %s: %s", where, exc)
    requests, bad = check_values(session, parsed, types)
    for request, reason in bad:
        result.invalid += 1
        logger.warning("invalid mutation request %s: %s", request.where, reason)
    for index, group in enumerate(group_requests(requests)):
        version = first + index
        if version <= applied:
            result.skipped_commits += 1
            continue
        try:
            with _Txn(session, txn_app_id, version):
                updated, deleted = _merge(session, path, group, types)
        except (PySparkException, Py4JError) as exc:
            step = (
                f"jobs mutate batch {batch_id} group {index} (txnVersion {version} of {txn_app_id}; "
                f"{len(group)} request(s) {group[0].where}..{group[-1].where})"
            )
            raise translate(exc, step, target.uri) from exc
        result.commits += 1
        result.rows_updated += updated
        result.rows_deleted += deleted
        logger.info(
            "batch %d group %d: %d request(s) %s..%s: %d updated, %d deleted (txn %s=%d)",
            batch_id,
            index,
            len(group),
            group[0].where,
            group[-1].where,
            updated,
            deleted,
            txn_app_id,
            version,
        )
    return result


def apply_gdpr_deletes(
    session: SparkSession,
    target: Target,
    messages: Sequence[tuple[int, int, bytes | None]],
    batch_id: int,
    txn_app_id: str,
    topic: str,
    subject_column: str,
) -> BatchResult:
    """Delete every row of the subjects requested in one micro-batch: one commit, txnVersion = batch id."""
    from delta.tables import DeltaTable
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException
    from pyspark.sql.types import StringType, StructField, StructType

    path = target.path
    result = BatchResult()
    applied = target.applied_version(txn_app_id)
    check_not_past(target, txn_app_id, applied, batch_id)
    requested: list[tuple[str, str]] = []
    for partition, offset, value in sorted(messages, key=lambda m: (m[0], m[1])):
        where = f"{topic}[{partition}]@{offset}"
        result.requests += 1
        try:
            requested.append((where, parse_subject(value)))
        except ValueError as exc:
            result.invalid += 1
            logger.warning("invalid GDPR request %s: %s", where, exc)
    if not requested:
        return result
    table = DeltaTable.forPath(session, path)
    column_type = simple_schema(table.toDF().schema)[subject_column]
    text = StructType([StructField("subject", StringType(), False)])
    cast = _cast("subject", column_type)
    canonical = (
        session.createDataFrame([(s,) for _, s in requested], text).selectExpr(f"CAST({cast} AS STRING)").collect()
    )
    subjects: set[str] = set()
    for (where, subject), row in zip(requested, canonical, strict=True):
        if row[0] is None:
            result.invalid += 1
            logger.warning("invalid GDPR request %s: subject_id %r is not a %s", where, subject, column_type)
        else:
            subjects.add(row[0])  # 1 and "1" of a bigint column: one subject
    if not subjects:
        return result
    if batch_id <= applied:
        result.skipped_commits += 1
        return result
    source = session.createDataFrame([(s,) for s in sorted(subjects)], text)
    condition = f"t.{_q(subject_column)} = {_cast('s.subject', column_type)}"
    try:
        with _Txn(session, txn_app_id, batch_id):
            metrics = table.alias("t").merge(source.alias("s"), condition).whenMatchedDelete().execute().collect()
    except (PySparkException, Py4JError) as exc:
        step = (
            f"jobs ttl batch {batch_id} (txnVersion {batch_id} of {txn_app_id}; "
            f"{len(requested)} request(s) {requested[0][0]}..{requested[-1][0]})"
        )
        raise translate(exc, step, target.uri) from exc
    result.commits += 1
    result.rows_deleted += int(metrics[0].asDict().get("num_deleted_rows") or 0) if metrics else 0
    logger.info(
        "batch %d: GDPR delete of %d subject(s) %s..%s: %d rows deleted (txn %s=%d)",
        batch_id,
        len(subjects),
        requested[0][0],
        requested[-1][0],
        result.rows_deleted,
        txn_app_id,
        batch_id,
    )
    return result


RetentionType = Literal["timestamp", "timestamp_ntz", "date"]
"""The types a ``jobs.retention_column`` may have."""


def retention_bound(column_type: RetentionType, cutoff: dt.datetime) -> dt.datetime | dt.date:
    """The first value the retention delete keeps: rows whose column is below it are deleted. ``cutoff`` (UTC,
    aware) for a timestamp column; for a date column the cutoff's day (UTC), which is kept: a row dated ``D`` is
    deleted only once the whole of ``D`` is older than the retention (a date cannot tell which part of the cutoff's
    day it stands for). :func:`retention_predicate` and the jobs' pre-check on the log's statistics both use it."""
    cutoff = cutoff.astimezone(dt.UTC)
    return cutoff.date() if column_type == "date" else cutoff


def retention_predicate(column: str, column_type: RetentionType, cutoff: dt.datetime) -> str:
    """The SQL condition of the rows the retention delete removes (the session's time zone is UTC)."""
    bound = retention_bound(column_type, cutoff)
    if isinstance(bound, dt.datetime):
        literal = f"CAST('{bound.strftime('%Y-%m-%d %H:%M:%S.%f')}' AS {column_type.upper()})"
    else:
        literal = f"DATE '{bound.isoformat()}'"
    return f"{_q(column)} < {literal}"


def retention_delete(session: SparkSession, path: str, predicate: str) -> int:
    """Delete the rows matching ``predicate`` (:func:`retention_predicate`); rows deleted. Idempotent by nature."""
    statement = f"DELETE FROM delta.`{path.replace('`', '``')}` WHERE {predicate}"
    rows = session.sql(statement).collect()
    if not rows:
        return 0
    return int(rows[0].asDict().get("num_affected_rows") or 0)
