"""``maintain optimize`` and ``maintain vacuum`` through delta-rs, with no Spark and no JVM: the lane for Azure and
Google Cloud Storage tables, which the Spark jobs cannot reach, and for any table the daemon writes with
``--engine deltalake``.

The same checks and the same report as the Spark lane (:mod:`kafka2delta.spark.maintenance`): a table no other
writer holds, before and after; a vacuum's dry run first, refused if it names a file the log references, and every
committed file still there afterwards. delta-rs commits through the same put-if-absent commit as the daemon, so an
optimize racing the daemon's appends loses nothing: delta-rs checks the winning commits for a conflict (appends of
new files are none), as Delta does.

The vacuum lists through delta-rs (its full vacuum: every file older than the retention that no version within it
references, a crashed daemon's never-committed files included) and deletes what it listed itself, less what Spark's
VACUUM would keep: a name starting with ``_`` or ``.`` anywhere in the path (a nested table's ``_delta_log``, ``.crc``
sidecars; not a partition directory ``<column>=…``, ``_change_data`` or ``_delta_index``), which delta-rs hides only
at the top. A table with the ``vacuumProtocolCheck`` feature or files named by absolute path is refused (naming
``--engine``).

What it does not do: the Spark-only tables (``jobs apply-changes`` targets) are refused naming ``--engine``: delta-rs
vacuums the deletion-vector files they still reference (found by review) and cannot write all their features.
``--where`` (Spark SQL on partition columns; delta-rs takes partition filters of its own) and
``--purge-deletion-vectors`` are refused naming the option; a fractional ``--retain-hours`` is rounded up to whole
hours (delta-rs counts whole hours); the files it writes are zstd-compressed, whatever the daemon's ``compression``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from deltalake import CommitProperties
from deltalake.exceptions import DeltaError

from kafka2delta.errors import ConfigError, RetryableError
from kafka2delta.spark.maintenance import (
    DELTA_DEFAULT_RETAIN_HOURS,
    before_optimize,
    check_retention,
    checked_vacuum,
    optimize_report,
)
from kafka2delta.spark.report import Report
from kafka2delta.spark.session import spark_reaches
from kafka2delta.spark.tables import (
    check_writable,
    open_table,
    referenced_paths,
    spark_only_table,
    table_stats,
    vacuum_skips,
)
from kafka2delta.writer import SPARK_ONLY_PROPERTY, table_filesystem

_DELETERS = 8  # files deleted at once by vacuum
_SPARK_ONLY_THERE = "vacuum it with --engine spark (a local or s3:// table; this lane cannot)"
MAINTAINED_BY = {"kafka2delta": {"operation": "maintain"}}
"""The commit info of this lane's commits, the key the daemon's own commits carry: ``verify`` and ``status`` read
them as maintenance, never as another writer's."""


def optimize(
    uri: str,
    storage_options: Mapping[str, str] = {},
    *,
    zorder_by: Sequence[str] = (),
    where: str = "",
    target_file_size: int | None = None,
    purge_deletion_vectors: bool = False,
) -> Report:
    """Compact small files into files of ``target_file_size`` bytes (delta-rs's default 100 MiB), or Z-order them
    by ``zorder_by``, in one commit."""
    started = time.monotonic()
    if where:
        raise ConfigError("--where", f"{uri} is optimized by delta-rs (no Spark): it takes no --where predicate")
    if purge_deletion_vectors:
        raise ConfigError(
            "--purge-deletion-vectors", f"{uri} is optimized by delta-rs, which writes no deletion vectors"
        )
    _refuse_spark_only(uri, storage_options)
    before = before_optimize(
        uri, storage_options, zorder_by=zorder_by, target_file_size=target_file_size, purge_deletion_vectors=False
    )
    table = open_table(uri, storage_options)
    unknown = [c for c in zorder_by if c not in {f.name for f in table.schema().fields}]
    if unknown:
        raise ConfigError("--zorder-by", f"{uri} has no top-level column {', '.join(unknown)}")
    partitioned = [c for c in zorder_by if c in table.metadata().partition_columns]
    if partitioned:
        raise ConfigError("--zorder-by", f"{', '.join(partitioned)}: a partition column of {uri} (Z-order the others)")
    read_version = table.version()
    commit = CommitProperties(custom_metadata=MAINTAINED_BY)
    try:
        if zorder_by:
            metrics = table.optimize.z_order(zorder_by, target_size=target_file_size, commit_properties=commit)
        else:
            metrics = table.optimize.compact(target_size=target_file_size, commit_properties=commit)
    except DeltaError as exc:
        raise _translated(exc, "optimize", uri) from exc
    except OSError as exc:
        raise RetryableError(f"optimize {uri}: {exc}") from exc
    commit_version = table.version() if table.version() != read_version else None
    check_writable(uri, storage_options, spark_only_ok=True)
    after = table_stats(uri, storage_options)
    return optimize_report(
        uri,
        started,
        before,
        after,
        _metrics(metrics),
        (read_version if commit_version is not None else None, commit_version),
        zorder_by=zorder_by,
        where="",
        target_file_size=target_file_size,
        extra={"engine": "deltalake"},
    )


def vacuum(
    uri: str,
    storage_options: Mapping[str, str] = {},
    *,
    retain_hours: float = DELTA_DEFAULT_RETAIN_HOURS,
    dry_run: bool = False,
) -> Report:
    """Delete the files that no table version younger than ``retain_hours`` references and that are older than
    that, a crashed daemon's never-committed files included (delta-rs's full vacuum lists the storage), less the
    hidden ones Spark's VACUUM keeps (:func:`vacuum_skips`)."""
    check_retention(retain_hours)  # before it is rounded up
    _refuse_spark_only(uri, storage_options)
    _refuse_unlistable(uri, storage_options)
    hours = math.ceil(retain_hours)  # an int: delta-rs counts whole hours
    listed: list[str] = []
    deleted: list[int] = []

    def run(check_off: bool, listing: bool) -> list[str]:
        if not listing:
            deleted.append(delete_files(uri, storage_options, listed))
            return listed
        table = open_table(uri, storage_options)
        try:
            found = table.vacuum(
                retention_hours=hours, dry_run=True, enforce_retention_duration=not check_off, full=True
            )
        except DeltaError as exc:
            raise _translated(exc, "vacuum", uri) from exc
        except OSError as exc:
            raise RetryableError(f"vacuum {uri}: {exc}") from exc
        partitions = table.metadata().partition_columns
        listed[:] = [path for path in found if not vacuum_skips(path, partitions)]
        return listed

    report = checked_vacuum(uri, storage_options, retain_hours=hours, dry_run=dry_run, run=run)
    if deleted:
        report.details["deleted"] = deleted[0]  # those still there (another vacuum may have taken some)
    report.details["engine"] = "deltalake"
    return report


def delete_files(uri: str, storage_options: Mapping[str, str], paths: list[str]) -> int:
    """Delete the files ``paths`` (relative to the root of ``uri``), several at once (one request each on object
    storage); how many were there (one already gone is no error)."""
    filesystem, root = table_filesystem(uri, storage_options)

    def delete(path: str) -> bool:
        try:
            filesystem.delete_file(f"{root.rstrip('/')}/{path}")
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise RetryableError(f"vacuum {uri}: deleting {path}: {exc}") from exc
        return True

    with ThreadPoolExecutor(_DELETERS) as pool:
        return sum(pool.map(delete, paths))


def _refuse_unlistable(uri: str, storage_options: Mapping[str, str]) -> None:
    """The tables this vacuum cannot tell right from (found by review): one asking every vacuum to check its protocol
    (``vacuumProtocolCheck``: delta-rs's dry run checks none), one naming files by absolute path (a clone: delta-rs
    compares them with relative listings, as the clash check does, and neither would see them)."""
    protocol = open_table(uri, storage_options).protocol()
    if "vacuumProtocolCheck" in {*(protocol.reader_features or ()), *(protocol.writer_features or ())}:
        raise ConfigError("--engine", f"{uri} has the vacuumProtocolCheck table feature: {_SPARK_ONLY_THERE}")
    if any("://" in path or path.startswith("/") for path in referenced_paths(uri, storage_options)):
        raise ConfigError("--engine", f"{uri} references files by absolute path (a clone?): {_SPARK_ONLY_THERE}")


def _refuse_spark_only(uri: str, storage_options: Mapping[str, str]) -> None:
    if spark_only_table(uri, storage_options):
        raise ConfigError(
            "--engine",
            f"{uri} is Spark-only ({SPARK_ONLY_PROPERTY}=true, a 'jobs apply-changes' target, with deletion vectors): "
            "maintain it with --engine spark (delta-rs would vacuum the deletion-vector files it references)",
        )


def uses_deltalake(engine: str, uri: str) -> bool:
    """Whether ``maintain`` runs on ``uri`` through delta-rs: ``--engine deltalake``, or ``auto`` for a table on
    Azure or Google Cloud Storage (the Spark jobs cannot reach them)."""
    return engine == "deltalake" if engine != "auto" else not spark_reaches(uri)


def _metrics(found: Mapping[str, Any]) -> dict[str, Any]:
    """delta-rs's optimize metrics as Delta's: ``filesAdded``/``filesRemoved`` are JSON text there."""
    return {
        name: json.loads(value) if name in ("filesAdded", "filesRemoved") else value for name, value in found.items()
    }


def _translated(exc: DeltaError, what: str, uri: str) -> Exception:
    """A delta-rs failure: a retention it refuses names ``--retain-hours`` (the table's own retention is checked
    before, so this is a rule of delta-rs's), a table feature it cannot write names ``--engine``; anything else is
    storage or a lost race, for the next run."""
    if "retention period" in str(exc):
        return ConfigError("--retain-hours", f"{uri}: {exc}")
    if "Unsupported table features" in str(exc):
        return ConfigError("--engine", f"{what} {uri}: delta-rs cannot write this table ({exc}): use --engine spark")
    return RetryableError(f"{what} {uri} failed (the next run tries again): {exc}")
