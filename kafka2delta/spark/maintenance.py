"""``maintain optimize`` and ``maintain vacuum``: compaction (bin-packing or Z-order) and the removal of files no
version references any more, including the Parquet files a crashed daemon wrote but never committed.

Neither changes data, so neither conflicts with the daemon's appends: Delta runs OPTIMIZE at snapshot isolation
(files appended meanwhile are simply not part of it) and delta-rs's appends read no files (tests/spark prove it).

Both also work on the Spark-only tables (``jobs apply-changes`` targets), which have deletion vectors: OPTIMIZE
compacts them as Delta does (a file whose vector deletes more than
``spark.databricks.delta.optimize.maxDeletedRowsRatio`` of its rows, 5 %, is rewritten even when large), and
``optimize --purge-deletion-vectors`` runs ``REORG TABLE … APPLY (PURGE)`` instead: every file with a deletion
vector is rewritten without its deleted rows, so the current version holds no deletion vector (the old files
stay until vacuum).
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kafka2delta.config import without_credentials
from kafka2delta.errors import ConfigError, FatalError
from kafka2delta.spark.errors import translate
from kafka2delta.spark.report import Report
from kafka2delta.spark.session import spark_path
from kafka2delta.spark.tables import (
    DAEMON_FILE,
    TableStats,
    check_writable,
    data_files,
    logged_adds,
    open_table,
    referenced_paths,
    spark_only_table,
    table_stats,
)
from kafka2delta.writer import SPARK_ONLY_PROPERTY

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)

# A daemon's file is uncommitted for the moment between its write and its commit: never vacuum that young.
MIN_RETAIN_HOURS = 1.0
DELTA_DEFAULT_RETAIN_HOURS = 168.0


class _SessionConf:
    """Set runtime SQL settings for the duration of a ``with`` block, then put the old values back."""

    def __init__(self, session: SparkSession, values: Mapping[str, str]) -> None:
        self._session, self._values = session, dict(values)
        self._old: dict[str, str | None] = {}

    def __enter__(self) -> None:
        for key, value in self._values.items():
            self._old[key] = self._session.conf.get(key, None)
            self._session.conf.set(key, value)

    def __exit__(self, *exc: object) -> None:
        for key, old in self._old.items():
            if old is None:
                self._session.conf.unset(key)
            else:
                self._session.conf.set(key, old)


def check_optimize_options(
    *, zorder_by: Sequence[str], target_file_size: int | None, purge_deletion_vectors: bool
) -> None:
    """The ``optimize`` options that contradict themselves, refused before any Spark work (the CLI checks them
    before it starts the JVM)."""
    if target_file_size is not None and target_file_size <= 0:
        raise ConfigError("--target-file-size", f"expected a positive number of bytes, got {target_file_size}")
    if purge_deletion_vectors and zorder_by:
        raise ConfigError("--purge-deletion-vectors", "rewrites the files with deletion vectors: not with --zorder-by")


def check_retention(retain_hours: float) -> None:
    """A retention too short for a live daemon's files, refused before any Spark work."""
    if not math.isfinite(retain_hours) or retain_hours < MIN_RETAIN_HOURS:
        raise ConfigError(
            "--retain-hours",
            f"expected at least {MIN_RETAIN_HOURS:g} hour: a daemon's new file stays uncommitted for a moment, "
            f"and a younger retention could delete it before its commit (got {retain_hours:g})",
        )


RETENTION_PROPERTY = "delta.deletedFileRetentionDuration"
"""How long a table keeps the files its commits removed (Delta's default: ``interval 1 week``)."""
RETENTION_CHECK_CONF = "spark.databricks.delta.retentionDurationCheck.enabled"
"""Delta's refusal of a VACUUM retention shorter than the table's :data:`RETENTION_PROPERTY`."""

# Delta reads the property as Spark's interval string (DeltaConfigs.parseCalendarInterval: an optional
# "interval", then "<number> <unit>" pairs; units singular or plural, any case; a fraction for seconds only).
# Months and years are not accepted by Delta (their length varies), so they are not here either.
_INTERVAL_UNITS_S = {
    "week": 7 * 86400.0,
    "day": 86400.0,
    "hour": 3600.0,
    "minute": 60.0,
    "second": 1.0,
    "millisecond": 1e-3,
    "microsecond": 1e-6,
}
_INTERVAL_PART = r"([+-]?)\s*(\d+(?:\.\d*)?|\.\d+)\s+(" + "|".join(_INTERVAL_UNITS_S) + r")s?"
_INTERVAL = re.compile(rf"(?:interval\s+)?{_INTERVAL_PART}(?:\s+{_INTERVAL_PART})*", re.IGNORECASE)


def interval_hours(text: str) -> float | None:
    """The hours of a Delta interval property (``interval 30 days``, ``2 weeks``, ``1 day 12 hours``); None if
    it is not one this parser reads, or negative (the caller then leaves the decision to Delta)."""
    if _INTERVAL.fullmatch(text.strip()) is None:
        return None
    seconds = 0.0
    for sign, number, unit in re.findall(_INTERVAL_PART, text, re.IGNORECASE):
        if "." in number and unit.lower() != "second":
            return None  # Spark allows a fraction for seconds only
        seconds += (-1 if sign == "-" else 1) * float(number) * _INTERVAL_UNITS_S[unit.lower()]
    return seconds / 3600 if seconds >= 0 else None


def retention_check_off(uri: str, retain_hours: float, configuration: Mapping[str, str | None]) -> bool:
    """Whether VACUUM must run with Delta's retention check off (:data:`RETENTION_CHECK_CONF`): only when the
    table keeps Delta's default week and ``retain_hours`` is shorter. A table that sets its own
    :data:`RETENTION_PROPERTY` keeps it: a shorter ``retain_hours`` is a ConfigError naming the table and the
    property (its owners chose how long readers and time travel may need removed files); a value this module cannot
    read leaves the check on, for Delta to apply."""
    value = configuration.get(RETENTION_PROPERTY)
    if value is None:
        return retain_hours < DELTA_DEFAULT_RETAIN_HOURS
    table_hours = interval_hours(value)
    if table_hours is None:
        logger.warning("%s: %s = %r not understood; Delta's retention check stays on", uri, RETENTION_PROPERTY, value)
        return False
    if retain_hours < table_hours:
        raise ConfigError(
            "--retain-hours",
            f"{without_credentials(uri)} keeps removed files for {value!r} ({table_hours:g} hours, its table "
            f"property {RETENTION_PROPERTY}): --retain-hours {retain_hours:g} would delete files its readers and time "
            f"travel may still need. Give --retain-hours {table_hours:g} or more, or lower the table's property "
            "(ALTER TABLE … SET TBLPROPERTIES) if it may keep them for less",
        )
    return False


def optimize(
    session: SparkSession,
    uri: str,
    storage_options: Mapping[str, str] = {},
    *,
    zorder_by: Sequence[str] = (),
    where: str = "",
    target_file_size: int | None = None,
    purge_deletion_vectors: bool = False,
) -> Report:
    """Compact small files into files of ``target_file_size`` bytes (Delta's default 1 GiB), or Z-order them by
    ``zorder_by``, or (``purge_deletion_vectors``, Spark-only tables) rewrite every file that has a deletion
    vector; only the partitions matching ``where`` (a predicate on partition columns) if given."""
    from delta.tables import DeltaTable
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    started = time.monotonic()
    before = before_optimize(
        uri,
        storage_options,
        zorder_by=zorder_by,
        target_file_size=target_file_size,
        purge_deletion_vectors=purge_deletion_vectors,
    )
    conf = {}
    if target_file_size is not None:
        conf = {
            "spark.databricks.delta.optimize.maxFileSize": str(target_file_size),
            "spark.databricks.delta.optimize.minFileSize": str(target_file_size),
        }
    try:
        with _SessionConf(session, conf):
            if purge_deletion_vectors:
                path = spark_path(uri).replace("`", "``")
                condition = f" WHERE {where}" if where else ""
                rows = session.sql(f"REORG TABLE delta.`{path}`{condition} APPLY (PURGE)").collect()
            else:
                builder = DeltaTable.forPath(session, spark_path(uri)).optimize()
                if where:
                    builder = builder.where(where)
                result = builder.executeZOrderBy(*zorder_by) if zorder_by else builder.executeCompaction()
                rows = result.collect()
    except (PySparkException, Py4JError) as exc:
        raise translate(exc, "reorg (purge)" if purge_deletion_vectors else "optimize", uri) from exc
    metrics = rows[0]["metrics"].asDict(recursive=True) if rows and rows[0]["metrics"] is not None else {}
    check_writable(uri, storage_options, spark_only_ok=True)
    after = table_stats(uri, storage_options)
    operation = "REORG" if purge_deletion_vectors else "OPTIMIZE"
    try:
        read_version, commit_version = _optimize_commit(session, uri, before.version, after.version, operation)
    except (PySparkException, Py4JError) as exc:
        # Its commit has landed (or there was none): only the report's versions could not be read.
        raise translate(exc, f"reading the history after {operation}", uri) from exc
    purged: dict[str, object] = {}
    if purge_deletion_vectors:
        vectors = metrics.get("deletionVectorStats") or {}
        purged["purge"] = "REORG APPLY (PURGE): files with deletion vectors rewritten without their deleted rows"
        purged["deletion_vectors_removed"] = vectors.get("numDeletionVectorsRemoved", 0)
        purged["deleted_rows_purged"] = vectors.get("numDeletionVectorRowsRemoved", 0)
    return optimize_report(
        uri,
        started,
        before,
        after,
        metrics,
        (read_version, commit_version),
        zorder_by=zorder_by,
        where=where,
        target_file_size=target_file_size,
        extra=purged,
    )


def before_optimize(
    uri: str,
    storage_options: Mapping[str, str],
    *,
    zorder_by: Sequence[str],
    target_file_size: int | None,
    purge_deletion_vectors: bool,
) -> TableStats:
    """The checks before an optimize of ``uri`` (its options, a table no one else holds); the table's sizes."""
    check_optimize_options(
        zorder_by=zorder_by, target_file_size=target_file_size, purge_deletion_vectors=purge_deletion_vectors
    )
    check_writable(uri, storage_options, spark_only_ok=True)
    if purge_deletion_vectors and not spark_only_table(uri, storage_options):
        raise ConfigError(
            "--purge-deletion-vectors",
            f"only for Spark-only tables ({SPARK_ONLY_PROPERTY}=true, the 'jobs apply-changes' targets): {uri} is "
            "one the daemon writes, which never has deletion vectors",
        )
    return table_stats(uri, storage_options)


def optimize_report(
    uri: str,
    started: float,
    before: TableStats,
    after: TableStats,
    metrics: Mapping[str, Any],
    versions: tuple[int | None, int | None],
    *,
    zorder_by: Sequence[str],
    where: str,
    target_file_size: int | None,
    extra: Mapping[str, object] = {},
) -> Report:
    """What an optimize did: ``metrics`` are its commit's (``numFilesRemoved``, ``filesRemoved.totalSize`` …),
    ``versions`` the snapshot it read and the version it committed as (None, None: it committed nothing)."""
    read_version, commit_version = versions
    details: dict[str, object] = {
        "files_removed": metrics.get("numFilesRemoved", 0),
        "files_added": metrics.get("numFilesAdded", 0),
        "bytes_removed": (metrics.get("filesRemoved") or {}).get("totalSize", 0),
        "bytes_added": (metrics.get("filesAdded") or {}).get("totalSize", 0),
        "version": f"{before.version}->{after.version}",
        **extra,
    }
    if before.deletion_vectors or after.deletion_vectors:
        details["files_with_deletion_vectors"] = f"{before.deletion_vectors}->{after.deletion_vectors}"
    if commit_version is not None:
        # Delta's own record: the snapshot OPTIMIZE read, and the version it committed as. Versions between
        # them are other writers' commits (the daemon's appends) that landed while it ran.
        details["read_version"] = read_version
        details["commit_version"] = commit_version
        details["concurrent_commits"] = commit_version - (read_version if read_version is not None else -1) - 1
    if zorder_by:
        details["zorder_by"] = ",".join(zorder_by)
    if where:
        details["where"] = where
    if target_file_size is not None:
        details["target_file_size"] = target_file_size
    return Report(
        "optimize",
        uri,
        files_before=before.files,
        files_after=after.files,
        bytes_before=before.bytes,
        bytes_after=after.bytes,
        rows_before=before.rows,
        rows_after=after.rows,
        duration_s=time.monotonic() - started,
        details=details,
    )


def _optimize_commit(
    session: SparkSession, uri: str, before: int, after: int, operation: str = "OPTIMIZE"
) -> tuple[int | None, int | None]:
    """(readVersion, version) of the ``operation`` commit (OPTIMIZE, REORG) between versions ``before`` and
    ``after`` (the newest if several), from the commit info Delta wrote; (None, None) if it committed nothing."""
    from delta.tables import DeltaTable

    if after <= before:
        return None, None
    history = DeltaTable.forPath(session, spark_path(uri)).history(after - before)
    rows = history.where(f"operation = '{operation}'").select("version", "readVersion").orderBy("version").collect()
    if not rows:
        return None, None
    read = rows[-1]["readVersion"]
    return (None if read is None else int(read)), int(rows[-1]["version"])


def vacuum(
    session: SparkSession,
    uri: str,
    storage_options: Mapping[str, str] = {},
    *,
    retain_hours: float = DELTA_DEFAULT_RETAIN_HOURS,
    dry_run: bool = False,
) -> Report:
    """Delete the files that no table version younger than ``retain_hours`` references and that are older than
    that: files removed by earlier commits, and a crashed daemon's never-committed Parquet files (orphans).
    Never a file of the current version: the candidates are checked against the log before anything is deleted.
    A ``retain_hours`` shorter than the table's own ``delta.deletedFileRetentionDuration`` is a ConfigError
    (:func:`retention_check_off`)."""
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    root = spark_path(uri).rstrip("/")
    statement = f"VACUUM delta.`{root.replace('`', '``')}` RETAIN {retain_hours:g} HOURS"

    def run(check_off: bool, listing: bool) -> list[str]:
        # Set either way: a [spark.conf] that turned the check off for every table must not override a table's own.
        try:
            with _SessionConf(session, {RETENTION_CHECK_CONF: "false" if check_off else "true"}):
                rows = session.sql(f"{statement} DRY RUN" if listing else statement).collect()
        except (PySparkException, Py4JError) as exc:
            raise translate(exc, "vacuum", uri) from exc
        return [_relative(str(row[0]), root) for row in rows] if listing else []

    return checked_vacuum(uri, storage_options, retain_hours=retain_hours, dry_run=dry_run, run=run)


def checked_vacuum(
    uri: str,
    storage_options: Mapping[str, str],
    *,
    retain_hours: float,
    dry_run: bool,
    run: Callable[[bool, bool], list[str]],
) -> Report:
    """A vacuum of ``uri`` made safe whatever runs it: ``run(check_off, listing)`` vacuums (with the engine's
    retention check off or on: :func:`retention_check_off`) or, ``listing``, returns the files it would delete,
    relative to the table root. The dry run comes first; it must name no file the log references, and none may be
    missing after the real run."""
    started = time.monotonic()
    check_retention(retain_hours)
    check_writable(uri, storage_options, spark_only_ok=True)
    metadata = open_table(uri, storage_options).metadata()
    check_off = retention_check_off(uri, retain_hours, metadata.configuration)
    stats = table_stats(uri, storage_options)
    partitions = metadata.partition_columns
    on_storage = {f.path: f for f in data_files(uri, storage_options, partitions)}
    candidates = run(check_off, True)
    committed = referenced_paths(uri, storage_options)
    clash = sorted(set(candidates) & committed)
    if clash:
        raise FatalError(f"refusing to vacuum {uri}: it would delete committed files {clash[:5]}")
    if not dry_run:
        run(check_off, False)
    ever_added = logged_adds(uri, storage_options)
    orphans = [p for p in candidates if DAEMON_FILE.match(p.rsplit("/", 1)[-1]) and p not in ever_added]
    after = {f.path: f for f in data_files(uri, storage_options, partitions)}
    missing = sorted(committed - set(after))
    if missing:
        raise FatalError(f"committed files of {uri} are missing after vacuum: {missing[:5]}")
    freed = sum(on_storage[p].size for p in candidates if p in on_storage)
    return Report(
        "vacuum",
        uri,
        files_before=len(on_storage),
        files_after=len(after),
        bytes_before=sum(f.size for f in on_storage.values()),
        bytes_after=sum(f.size for f in after.values()),
        rows_before=stats.rows,
        rows_after=stats.rows,
        duration_s=time.monotonic() - started,
        details={
            "retain_hours": f"{retain_hours:g}",
            "deleted" if not dry_run else "would_delete": len(candidates),
            "orphans": len(orphans),
            "bytes_freed": freed,
            "committed_files": len(committed),
        },
    )


def _relative(path: str, root: str) -> str:
    """A VACUUM result path (``file:/abs/table/x.parquet``) relative to the table root."""
    for prefix in ("file://", "file:"):
        if path.startswith(prefix) and not root.startswith(prefix):
            path = path.removeprefix(prefix)
            break
    if path.startswith(root + "/"):
        return path[len(root) + 1 :]
    return path
