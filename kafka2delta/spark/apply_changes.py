"""``jobs apply-changes``: the current state of a changelog table, kept by a Spark Structured Streaming job.

A changelog table (``table.mode = "changelog"``, bronze) is where the daemon appends a source database's change
events (Debezium's, flattened), one row each: the key columns (``table.key``, never null), the after image, ``_op``
(c, r, u, d; a delete's data columns are null), ``_source_ts`` and ``_lsn`` (with the Debezium envelope; ``_lsn`` is
null for sources other than PostgreSQL), ``kafka_partition`` and ``kafka_offset``, maybe ``_before`` (the before
image). This job reads it with Delta's streaming source and keeps a table of one row per key (silver, the target),
one MERGE per micro-batch, turn by turn like ``mutate`` and ``ttl`` (:class:`~kafka2delta.spark.jobs.TurnJob`).

A micro-batch (``foreachBatch``): drop ``_before``; collapse it to each key's last change (a batch holding several
topics' changes without ``_lsn`` is refused: their Kafka positions are unrelated); create the target at the first
batch, even an empty one (the changelog's columns, the key NOT NULL, ``_deleted`` when soft; deletion vectors on;
Spark-only), add the columns the changelog gained since (the daemon's schema evolution); then one MERGE. The
collapse and the MERGE's clauses, and how they keep a row from moving backwards, are
:mod:`kafka2delta.spark.change_merge`'s.

Exactly once: the MERGE commits with ``txnAppId = <app_id>-<job name>`` and ``txnVersion = batch id`` (the
checkpoint is ``<jobs.checkpoint_dir or <target>_checkpoints>/<job name>``). A micro-batch that Spark runs again (a
crash between the MERGE and the checkpoint's commit) finds its version in the table and is skipped (counted); one
older than the table's version raises :class:`~kafka2delta.spark.errors.CheckpointMismatch`; a new checkpoint is
refused while the table holds a version of that app id, and a checkpoint with batches while the target is gone.

The target is the job's alone: deletion vectors make MERGE write a small vector instead of rewriting every file it
touches, and the daemon (deltalake 1.6) can neither read nor write them. So the target is marked Spark-only
(``kafka2delta.sparkOnly = true``: ``maintain`` works on it, ``mutate`` and ``ttl`` refuse it), and the job refuses
a target that is its source, one the config's daemon writes, one whose log holds other writers' txns, or an
existing table without that mark.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from kafka2delta import faults
from kafka2delta.changes.options import BEFORE_COLUMN, DELETED_COLUMN
from kafka2delta.config import TOPIC_PLACEHOLDER, Config, RouteConfig, table_key
from kafka2delta.coordinator import Coordinator
from kafka2delta.errors import ConfigError, Kafka2DeltaError
from kafka2delta.spark.change_merge import (
    LSN,
    OFFSET,
    OP,
    PARTITION,
    TOPIC,
    VALUES_FLAG,
    last_changes,
    merge_clauses,
    newer_condition,
    placeholders,
    sql_literal,
)
from kafka2delta.spark.errors import TableNotWritable, translate
from kafka2delta.spark.jobs import TurnJob, TurnStats, checkpoint_location
from kafka2delta.spark.mutations import Target, _q, _Txn, check_not_past
from kafka2delta.spark.tables import (
    TableStats,
    check_writable,
    daemon_tables,
    is_table,
    open_table,
    spark_only_table,
    table_stats,
    txn_versions,
)
from kafka2delta.writer import SPARK_ONLY_PROPERTY

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import DataType, StructType

logger = logging.getLogger(__name__)

DEFAULT_JOB_NAME = "apply-changes"
DEFAULT_MAX_FILES_PER_TRIGGER = 1000
TARGET_PROPERTIES = {"delta.enableDeletionVectors": "true", SPARK_ONLY_PROPERTY: "true"}
"""Set when the job creates its target (the session's defaults turn deletion vectors off for new tables)."""
_TOPIC_NAME = "[A-Za-z0-9._-]+"


# -- options: what the CLI gives, completed from the config (pure)


@dataclass(frozen=True)
class ApplyOptions:
    """What one ``jobs apply-changes`` applies where (:func:`resolve_options` completes them from the config)."""

    source: Target
    """The changelog table (``--source``)."""
    target: Target
    """The current-state table (``--target``)."""
    key: tuple[str, ...]
    delete_mode: Literal["hard", "soft"] = "hard"
    max_files_per_trigger: int = DEFAULT_MAX_FILES_PER_TRIGGER
    """Most changelog files one micro-batch reads (Delta's ``maxFilesPerTrigger``)."""


def _matches(configured: str, uri: str, topics: re.Pattern[str] | None = None) -> bool:
    """Whether ``uri`` is the configured table (``{topic}`` standing for any topic name, or for one that
    ``topics`` finds)."""
    pattern = re.escape(table_key(configured)).replace(re.escape(TOPIC_PLACEHOLDER), f"(?P<topic>{_TOPIC_NAME})", 1)
    pattern = pattern.replace(re.escape(TOPIC_PLACEHOLDER), "(?P=topic)")
    found = re.fullmatch(pattern, table_key(uri))
    if found is None:
        return False
    return topics is None or "topic" not in found.groupdict() or topics.search(found["topic"]) is not None


def _writer_route(config: Config, uri: str) -> tuple[str, RouteConfig | None] | None:
    """(config key, route; None for ``[table]``) of the route whose table is ``uri`` (routes first, then
    ``[table]``, as routing does)."""
    table = config.table
    for i, route in enumerate(config.routes):
        template = route.uri or table.uri
        # A route takes its own topic or pattern: ``{topic}`` in its URI stands for those topics only.
        topics = re.compile(route.topic_pattern) if route.topic_pattern else None
        if route.topic:
            template = template.replace(TOPIC_PLACEHOLDER, route.topic)
        if template and _matches(template, uri, topics):
            return f"routes[{i}]", route
    if table.uri and _matches(table.uri, uri):
        return "table", None
    return None


def source_route(config: Config, source: str) -> tuple[str, tuple[str, ...], str] | None:
    """(config key, key columns, delete mode) of the route whose table is ``source`` (routes first, then
    ``[table]``, as routing does; an empty key or delete mode falls back to ``[table]``'s)."""
    found = _writer_route(config, source)
    if found is None:
        return None
    where, route = found
    table = config.table
    if route is None:
        return where, table.key, table.delete_mode
    return where, route.key or table.key, route.delete_mode or table.delete_mode


def changelog_route(config: Config, uri: str) -> str | None:
    """The config key (``table`` or ``routes[i]``) of a route writing ``uri`` (a URI or the ``{topic}`` template
    ``table.uri`` itself) as a changelog table (``mode = "changelog"``); None if the config writes none there."""
    table = config.table
    routes: list[tuple[str, str, str, re.Pattern[str] | None]] = [
        (
            f"routes[{i}]",
            (route.uri or table.uri).replace(TOPIC_PLACEHOLDER, route.topic) if route.topic else route.uri or table.uri,
            route.mode or table.mode,
            re.compile(route.topic_pattern) if route.topic_pattern else None,
        )
        for i, route in enumerate(config.routes)
    ]
    routes.append(("table", table.uri, table.mode, None))
    for where, template, mode, topics in routes:
        if mode != "changelog" or not template:
            continue
        if table_key(template) == table_key(uri) or _matches(template, uri, topics) or _matches(uri, template):
            return where
    return None


def resolve_options(
    config: Config,
    *,
    source: str | None,
    target: str | None,
    key: Sequence[str] | None = None,
    delete_mode: str | None = None,
    max_files_per_trigger: int = DEFAULT_MAX_FILES_PER_TRIGGER,
) -> ApplyOptions:
    """The job's options; the defaults of ``--key`` and ``--delete-mode`` are the source's route's. ConfigError
    naming the flag when one is missing or the target is a table the daemon writes (checked before Spark starts)."""
    if not source:
        raise ConfigError("--source", "is required: the changelog table (table.mode = 'changelog') to read")
    if not target:
        raise ConfigError("--target", "is required: the current-state table to keep")
    if table_key(source) == table_key(target):
        raise ConfigError("--target", f"is the --source ({source}): the current state needs a table of its own")
    if max_files_per_trigger <= 0:
        raise ConfigError("--max-files-per-trigger", f"expected a positive number, got {max_files_per_trigger}")
    for where, uri, _ in daemon_tables(config):
        if _matches(uri, target):
            raise ConfigError(
                "--target",
                f"{target} is a table the ingest daemon writes ({where} = {uri}): apply-changes keeps a Spark-only "
                "table with deletion vectors, which the daemon can neither read nor append to",
            )
    route = source_route(config, source)
    if not key:
        if route is None or not route[1]:
            found = f"its route {route[0]} has no key" if route else "no route of the config writes it"
            raise ConfigError("--key", f"the key columns of {source} are needed ({found}): give --key c1,c2")
        key = route[1]
    mode = delete_mode or (route[2] if route else "") or "hard"
    if mode not in ("hard", "soft"):
        raise ConfigError("--delete-mode", f"expected hard or soft, got {mode!r}")
    storage = config.table.storage_options
    return ApplyOptions(
        Target(source, storage),
        Target(target, storage),
        tuple(key),
        "soft" if mode == "soft" else "hard",
        max_files_per_trigger,
    )


def missing_columns(source: StructType, target: StructType) -> list[tuple[str, DataType]]:
    """The columns (``a`` or nested ``a.b``, quoted) of ``source`` that ``target`` lacks, with their types: what the
    changelog gained since the target was made (fields of structs in arrays and maps are not followed)."""
    from pyspark.sql.types import StructType

    found: list[tuple[str, DataType]] = []
    have = {f.name: f.dataType for f in target.fields}
    for column in source.fields:
        existing = have.get(column.name)
        if existing is None:
            found.append((_q(column.name), column.dataType))
        elif isinstance(column.dataType, StructType) and isinstance(existing, StructType):
            found += [(f"{_q(column.name)}.{name}", kind) for name, kind in missing_columns(column.dataType, existing)]
    return found


def sql_type(kind: DataType) -> str:
    """A type as DDL, struct field names quoted."""
    from pyspark.sql.types import ArrayType, MapType, StructType

    if isinstance(kind, StructType):
        return "struct<" + ",".join(f"{_q(f.name)}:{sql_type(f.dataType)}" for f in kind.fields) + ">"
    if isinstance(kind, ArrayType):
        return f"array<{sql_type(kind.elementType)}>"
    if isinstance(kind, MapType):
        return f"map<{sql_type(kind.keyType)},{sql_type(kind.valueType)}>"
    return str(kind.simpleString())


# -- one micro-batch (Spark)


@dataclass
class ChangeCounts:
    """What micro-batches did. ``changes`` = ``collapsed`` + ``null_keys`` + the batch's last changes per key; those
    = ``inserted`` + ``updated`` + ``deleted`` + ``ignored`` (hard mode: a delete of a key the target does not hold
    is ignored; soft mode: a delete is an update setting ``_deleted``, or an insert of a marker, never ``deleted``)."""

    changes: int = 0
    """Changelog rows read."""
    collapsed: int = 0
    """Rows superseded by a later change of the same key in the same batch."""
    null_keys: int = 0
    """Rows with a null key column (never applied; the changelog's key is NOT NULL)."""
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    ignored: int = 0
    """Last changes the position guard kept from the table: not newer than the key's row (a replay, a duplicate,
    a late change), or the delete of a key the target does not hold (hard mode)."""
    replayed_batches: int = 0
    """Micro-batches skipped because the target holds their txn version already (a replay)."""
    deletion_vectors: int = 0
    """Deletion vectors the MERGEs added (or updated): files whose rows changed without being rewritten."""
    files_added: int = 0
    files_removed: int = 0
    """Files removed whole (a file given a deletion vector is not counted)."""
    bytes_added: int = 0

    def add(self, other: ChangeCounts) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


def create_target(session: SparkSession, target: Target, schema: StructType, key: Sequence[str], soft: bool) -> None:
    """The target, from the changelog's columns: the key NOT NULL, ``_deleted`` when soft, deletion vectors on."""
    from delta.tables import DeltaTable
    from pyspark.sql.types import BooleanType, StructField, StructType

    fields = [StructField(f.name, f.dataType, f.name not in key, f.metadata) for f in schema.fields]
    if soft:
        fields.append(StructField(DELETED_COLUMN, BooleanType(), True))
    builder = DeltaTable.createIfNotExists(session).location(target.path).addColumns(StructType(fields))
    for name, value in TARGET_PROPERTIES.items():
        builder = builder.property(name, value)
    builder.execute()
    logger.info(
        "created %s (%d columns, key %s, %s deletes)",
        target.uri,
        len(fields),
        ",".join(key),
        "soft" if soft else "hard",
    )


def add_new_columns(session: SparkSession, target: Target, schema: StructType) -> None:
    """Add the columns the changelog gained since the target was made (the daemon's schema evolution)."""
    from delta.tables import DeltaTable

    missing = missing_columns(schema, DeltaTable.forPath(session, target.path).toDF().schema)
    if not missing:
        return
    columns = ", ".join(f"{name} {sql_type(kind)}" for name, kind in missing)
    session.sql(f"ALTER TABLE delta.`{target.path.replace('`', '``')}` ADD COLUMNS ({columns})").collect()
    logger.info("%s: added the changelog's new columns %s", target.uri, columns)


def _merge_metrics(session: SparkSession, target: Target, before: int) -> dict[str, int] | None:
    """The operationMetrics of the MERGE committed after version ``before``; None if it committed nothing (Delta
    found its txn version applied: a concurrent replay)."""
    from delta.tables import DeltaTable

    history = DeltaTable.forPath(session, target.path).history(5)
    rows = history.where(f"operation = 'MERGE' AND version > {before}").orderBy("version").collect()
    if not rows:
        return None
    return {name: int(value) for name, value in (rows[0]["operationMetrics"] or {}).items()}


def apply_batch(
    session: SparkSession, batch: DataFrame, batch_id: int, options: ApplyOptions, txn_app_id: str
) -> ChangeCounts:
    """Apply one micro-batch of the changelog to the target: one MERGE, ``txnVersion = batch_id``."""
    from delta.tables import DeltaTable
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException
    from pyspark.sql import functions as F

    target, counts = options.target, ChangeCounts()
    exists = is_table(target.uri, target.storage_options)
    applied = target.applied_version(txn_app_id) if exists else -1
    check_not_past(target, txn_app_id, applied, batch_id, start_over="drop the target and its checkpoint to rebuild it")
    if applied == batch_id:
        counts.replayed_batches = 1
        logger.info("batch %d: already applied (txn %s=%d in %s); skipped", batch_id, txn_app_id, applied, target.uri)
        return counts
    step = f"jobs apply-changes batch {batch_id} (txnVersion {batch_id} of {txn_app_id})"
    rows = batch.drop(BEFORE_COLUMN) if BEFORE_COLUMN in batch.columns else batch
    soft, has_lsn = options.delete_mode == "soft", LSN in rows.columns
    try:
        # A Debezium changelog (it has _lsn) keeps the unchanged-TOAST placeholders as they came.
        holes = placeholders(rows.schema, options.key) if has_lsn else {}
        latest = last_changes(rows, options.key, soft=soft, placeholders=holes)
        null_key = " OR ".join(f"{_q(c)} IS NULL" for c in options.key)
        figures = [F.count(F.lit(1)), F.count_if(F.expr(null_key))]
        if TOPIC in rows.columns:
            # Changes without a source position are ordered by their Kafka position: unrelated across topics.
            unpositioned = F.count_if(F.col(_q(LSN)).isNull()) if has_lsn else F.count(F.lit(1))
            figures += [F.count_distinct(F.col(_q(TOPIC))), unpositioned]
        total = rows.agg(*figures).first()
        assert total is not None
        counts.changes, counts.null_keys = int(total[0]), int(total[1] or 0)
        if TOPIC in rows.columns and int(total[2] or 0) > 1 and int(total[3] or 0) > 0:
            raise ConfigError(
                "--source",
                f"batch {batch_id} of {options.source.uri} holds the changes of {int(total[2])} topics "
                f"({TOPIC}), {int(total[3])} of them without a source position ({LSN}"
                f"{' is null' if has_lsn else ': the changelog has no such column'}): changes are then ordered by "
                "their Kafka partition and offset, which are unrelated across topics, so an older change could "
                "win. Write each topic to its own changelog table ({topic} in table.uri), or use a source with a "
                f"position (Debezium's PostgreSQL connector fills {LSN})",
            )
        if counts.null_keys:
            logger.warning(
                "batch %d: %d change(s) with a null key column (%s) ignored",
                batch_id,
                counts.null_keys,
                ",".join(options.key),
            )
        if not exists:
            # Even for an empty batch: Spark records it as done in the checkpoint when it returns, and a checkpoint
            # with done batches and no target is refused (the target would miss their changes). An empty batch
            # changes nothing else, so no txn is needed for it: a replay finds nothing to apply either.
            create_target(session, target, rows.schema, options.key, soft)
        if counts.changes == 0:
            return counts
        add_new_columns(session, target, rows.schema)
        if counts.changes == counts.null_keys:
            return counts
        clauses = merge_clauses(options.key, rows.columns, has_lsn=has_lsn, soft=soft, placeholders=holes)
        before = open_table(target.uri, target.storage_options, key="--target").version()
        condition = " AND ".join(f"t.{_q(c)} = s.{_q(c)}" for c in options.key)
        builder = DeltaTable.forPath(session, target.path).alias("t").merge(latest.alias("s"), condition)
        for clause in clauses:
            assignments: dict[str, str | Column] = {_q(c): e for c, e in clause.assignments.items()}
            if clause.kind == "delete":
                builder = builder.whenMatchedDelete(condition=clause.condition)
            elif clause.kind == "update":
                builder = builder.whenMatchedUpdate(condition=clause.condition, set=assignments)
            else:
                builder = builder.whenNotMatchedInsert(condition=clause.condition, values=assignments)
        with _Txn(session, txn_app_id, batch_id):
            builder.execute()
        faults.point("after_apply_merge")  # committed; Spark's checkpoint not yet told: the batch will run again
        metrics = _merge_metrics(session, target, before)
    except (PySparkException, Py4JError) as exc:
        raise translate(exc, step, target.uri) from exc
    if metrics is None:
        counts.replayed_batches = 1
        logger.info("batch %d: Delta skipped the MERGE (txn %s=%d already applied)", batch_id, txn_app_id, batch_id)
        return counts
    # The MERGE's source is the batch's last change per key (Delta materializes it: a foreachBatch DataFrame is
    # not a plain Delta scan), so its row count is how many the collapse kept.
    last = metrics.get("numSourceRows", counts.changes - counts.null_keys)
    counts.collapsed = counts.changes - counts.null_keys - last
    counts.inserted = metrics.get("numTargetRowsInserted", 0)
    counts.updated = metrics.get("numTargetRowsMatchedUpdated", metrics.get("numTargetRowsUpdated", 0))
    counts.deleted = metrics.get("numTargetRowsMatchedDeleted", metrics.get("numTargetRowsDeleted", 0))
    counts.ignored = last - counts.inserted - counts.updated - counts.deleted
    counts.deletion_vectors = metrics.get("numTargetDeletionVectorsAdded", 0)
    counts.files_added = metrics.get("numTargetFilesAdded", 0)
    counts.files_removed = metrics.get("numTargetFilesRemoved", 0)
    counts.bytes_added = metrics.get("numTargetBytesAdded", 0)
    logger.info(
        "batch %d: %d change(s), %d collapsed: %d inserted, %d updated, %d deleted, %d ignored; %d deletion "
        "vector(s), files +%d -%d, %d bytes added (txn %s=%d)",
        batch_id,
        counts.changes,
        counts.collapsed,
        counts.inserted,
        counts.updated,
        counts.deleted,
        counts.ignored,
        counts.deletion_vectors,
        counts.files_added,
        counts.files_removed,
        counts.bytes_added,
        txn_app_id,
        batch_id,
    )
    return counts


# -- the job, turn by turn


@dataclass
class ApplyStats(TurnStats):
    """Counters over the turns of ``apply-changes``."""

    counts: ChangeCounts = field(default_factory=ChangeCounts)


class ApplyChangesJob(TurnJob[ApplyStats]):
    """``jobs apply-changes``: the changelog ``options.source`` applied to ``options.target``, turn by turn."""

    def __init__(
        self,
        session: SparkSession,
        config: Config,
        options: ApplyOptions,
        coordinator: Coordinator,
        *,
        job_name: str | None = None,
    ) -> None:
        name = job_name or DEFAULT_JOB_NAME
        super().__init__(
            session,
            config,
            coordinator,
            name=name,
            target=options.target,
            checkpoint=checkpoint_location(config, name, options.target.uri),
            stats=ApplyStats(),
            step="jobs apply-changes",
        )
        self.options = options

    def _exists(self, table: Target) -> bool:
        return is_table(table.uri, table.storage_options)

    def prepare(self) -> None:
        """The source is a changelog with the key columns; an existing target is the job's and fits the options."""
        source, target, key = self.options.source, self.options.target, self.options.key
        if not self._exists(source):
            raise ConfigError("--source", f"no Delta table at {source.uri}")
        columns = {f.name for f in open_table(source.uri, source.storage_options, key="--source").schema().fields}
        missing = [c for c in (*key, OP, PARTITION, OFFSET) if c not in columns]
        if missing:
            raise ConfigError(
                "--source",
                f"{source.uri} is not a changelog table (table.mode = 'changelog') with key {','.join(key)}: it "
                f"lacks the column(s) {', '.join(missing)}",
            )
        if LSN not in columns and TOPIC not in columns:
            logger.warning(
                "%s has neither %s nor %s: the job orders changes by Kafka partition and offset and cannot tell "
                "whether the changelog mixes topics (their positions are unrelated); keep one topic per changelog",
                source.uri,
                LSN,
                TOPIC,
            )
        self.check_target()
        if not self._exists(target):
            return
        fields = open_table(target.uri, target.storage_options, key="--target").schema().fields
        have = {f.name: f for f in fields}
        # The job makes exactly the key columns NOT NULL (create_target): they say which key made the target.
        made_with = [f.name for f in fields if not f.nullable]
        if set(made_with) != set(key):
            raise ConfigError(
                "--key",
                f"{target.uri} was made with key {','.join(made_with) or '(none)'} (its NOT NULL columns), not "
                f"{','.join(key)}: its rows are one per key of {','.join(made_with) or '(none)'}. Give --key "
                f"{','.join(made_with)}, or a new --target (with its own --job-name) for key {','.join(key)}",
            )
        absent = [c for c in (PARTITION, OFFSET) if c not in have]
        if absent:
            raise ConfigError(
                "--target", f"{target.uri} lacks the column(s) {', '.join(absent)}: it is no apply-changes target"
            )
        soft = self.options.delete_mode == "soft"
        if soft != (DELETED_COLUMN in have):
            made = "soft (it has _deleted)" if DELETED_COLUMN in have else "hard (it has no _deleted)"
            raise ConfigError(
                "--delete-mode", f"{target.uri} was made for {made} deletes, not {self.options.delete_mode}"
            )

    def check_target(self) -> None:
        """The target, if it exists, is this job's: Spark-only, and no other writer's txn in its log."""
        target = self.target
        if not self._exists(target):
            return
        others = sorted(app for app in txn_versions(target.uri, target.storage_options) if app != self.txn_app_id)
        if others:
            raise TableNotWritable(
                f"{target.uri} holds commits of other writers (txn app ids {', '.join(others[:5])}"
                f"{', …' if len(others) > 5 else ''}; the daemon's are <app_id>-<partition> and "
                f"<app_id>-<topic>-<partition>, this job's {self.txn_app_id}): apply-changes keeps a table of its own"
            )
        if not spark_only_table(target.uri, target.storage_options):
            raise TableNotWritable(
                f"{target.uri} exists and is not a Spark-only table ({SPARK_ONLY_PROPERTY}=true): apply-changes "
                "creates its target at its first batch; give a new --target"
            )
        check_writable(target.uri, target.storage_options, spark_only_ok=True)

    def table_stats(self) -> TableStats | None:
        return table_stats(self.target.uri, self.target.storage_options) if self._exists(self.target) else None

    def work(self) -> None:
        exists = self._exists(self.target)
        if not exists and self._checkpoint_batches("commits"):
            raise ConfigError(
                "jobs.checkpoint_dir",
                f"the checkpoint {self.checkpoint} has applied batches but {self.target.uri} does not exist: the "
                "query would go on from there and make a target without the earlier changes. Delete the "
                "checkpoint to rebuild the target from the changelog's first version",
            )
        if not self.pending_work():
            return
        if exists:
            self.check_checkpoint()
        self._run_query()

    def source_pending(self, offsets: list[str]) -> bool:
        """False when the checkpoint's last batch ended at a version past the changelog's newest."""
        offset = json.loads(offsets[0])
        source = self.options.source
        newest = open_table(source.uri, source.storage_options, key="--source").version()
        done = int(offset["index"]) == -1 and not offset.get("isStartingVersion", True)
        return not (done and newest < int(offset["reservoirVersion"]))

    def _run_query(self) -> None:
        query = (
            self.session.readStream.format("delta")
            .option("maxFilesPerTrigger", str(self.options.max_files_per_trigger))
            .load(self.options.source.path)
            .writeStream.foreachBatch(self._process)
            .option("checkpointLocation", self.checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()

    def _process(self, batch: DataFrame, batch_id: int) -> None:
        try:
            counts = apply_batch(batch.sparkSession, batch, batch_id, self.options, self.txn_app_id)
        except Kafka2DeltaError as exc:
            self._batch_error = exc
            raise
        self.stats.batches += 1
        self.stats.counts.add(counts)

    def restart_advice(self) -> str:
        return "to rebuild the target from the changelog's first version, drop the target and its checkpoint"

    def details(self) -> dict[str, Any]:
        counts = self.stats.counts
        return {
            "source": self.options.source.uri,
            "delete_mode": self.options.delete_mode,
            "changes": counts.changes,
            "collapsed": counts.collapsed,
            "null_keys": counts.null_keys,
            "inserted": counts.inserted,
            "updated": counts.updated,
            "deleted": counts.deleted,
            "ignored": counts.ignored,
            "replayed_batches_skipped": counts.replayed_batches,
            "deletion_vectors_added": counts.deletion_vectors,
            "files_added": counts.files_added,
            "files_removed": counts.files_removed,
            "bytes_added": counts.bytes_added,
        }

    def rows_changed(self) -> int:
        counts = self.stats.counts
        return counts.inserted + counts.updated + counts.deleted


__all__ = [
    "DEFAULT_JOB_NAME",
    "TARGET_PROPERTIES",
    "VALUES_FLAG",
    "ApplyChangesJob",
    "ApplyOptions",
    "ChangeCounts",
    "apply_batch",
    "changelog_route",
    "last_changes",
    "merge_clauses",
    "newer_condition",
    "placeholders",
    "resolve_options",
    "sql_literal",
]
