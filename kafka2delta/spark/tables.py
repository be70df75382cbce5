"""What the jobs read about a table through deltalake (no Spark): sizes for the reports, the protocol check that
keeps the table writable by the daemon (and the Spark-only tables away from the daemon-safe jobs), file-level
statistics, the txn app ids of its writers, and the data files on storage for vacuum; and which tables the
config's daemon writes."""

from __future__ import annotations

import fnmatch
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pa_fs
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from kafka2delta.config import Config
from kafka2delta.errors import ConfigError, RetryableError
from kafka2delta.spark.errors import TableNotWritable
from kafka2delta.writer import SPARK_ONLY_PROPERTY, is_spark_only, table_filesystem

# Writer features deltalake 1.6.x cannot write (docs/MAINTENANCE.md): a table with any of them stops the daemon.
# deletionVectors is here too: deltalake 1.6.6's Arrow reader refuses such tables, and the daemon reads the
# table (dead-letter recovery, `status`) with it.
UNWRITABLE_FEATURES = frozenset(
    {
        "domainMetadata",
        "rowTracking",
        "clustering",
        "inCommitTimestamp",
        "identityColumns",
        "deletionVectors",
        "icebergCompatV1",
        "icebergCompatV2",
        "coordinatedCommits-preview",
        "catalogOwned-preview",
    }
)
# Table properties that make Spark turn those features on at the next write.
_ENABLING_PROPERTIES = {
    "delta.enableDeletionVectors": "deletionVectors",
    "delta.enableRowTracking": "rowTracking",
    "delta.enableInCommitTimestamps": "inCommitTimestamp",
    "delta.enableInCommitTimestamps-preview": "inCommitTimestamp",
}

# <topic>-<partition>-<first offset>-<last offset>-<uuid>.<codec>.parquet (writer.write_files)
DAEMON_FILE = re.compile(r"^.+-\d+-\d+-\d+-[0-9a-f]{6,}\.[a-z0-9]+\.parquet$")


@dataclass(frozen=True)
class TableStats:
    """Sizes of a table's current version, from its log."""

    version: int
    files: int
    bytes: int
    rows: int | None
    """Sum of the files' ``numRecords`` statistics less the rows their deletion vectors delete; None if some file
    has no statistics."""
    deletion_vectors: int = 0
    """Files of the current version with a deletion vector (Spark-only tables)."""


def open_table(uri: str, storage_options: Mapping[str, str] = {}, *, key: str = "table.uri") -> DeltaTable:
    """The table at ``uri`` (deltalake): ConfigError naming ``key`` if there is none, RetryableError if storage
    failed (the jobs retry that at their next turn)."""
    try:
        return DeltaTable(uri, storage_options=dict(storage_options) or None)
    except TableNotFoundError as exc:
        raise ConfigError(key, f"no Delta table at {uri}") from exc
    except (DeltaError, OSError) as exc:
        raise RetryableError(f"reading the Delta log of {uri}: {exc}") from exc


def is_table(uri: str, storage_options: Mapping[str, str] = {}) -> bool:
    """Whether a Delta table is at ``uri`` (RetryableError if storage failed: not an answer)."""
    try:
        return bool(DeltaTable.is_deltatable(uri, dict(storage_options) or None))
    except (DeltaError, OSError) as exc:
        raise RetryableError(f"looking for a Delta table at {uri}: {exc}") from exc


def add_actions(uri: str, storage_options: Mapping[str, str] = {}) -> pa.Table:
    """One row per file of the current version: ``path``, ``size_bytes``, ``num_records``, ``min.<c>``, ``max.<c>``."""
    table = open_table(uri, storage_options)
    try:
        return pa.table(table.get_add_actions(flatten=True))
    except (DeltaError, OSError) as exc:
        raise RetryableError(f"reading the add actions of {uri}: {exc}") from exc


def table_stats(uri: str, storage_options: Mapping[str, str] = {}) -> TableStats:
    table = open_table(uri, storage_options)
    try:
        actions = pa.table(table.get_add_actions(flatten=True))
        # numRecords counts a file's rows before its deletion vector; deltalake reads the vectors, not the data.
        has_dvs = "deletionVectors" in (table.protocol().reader_features or ())
        vectors = pa.table(table.deletion_vectors()) if has_dvs else None
    except (DeltaError, OSError) as exc:
        raise RetryableError(f"reading the add actions of {uri}: {exc}") from exc
    records = actions.column("num_records").to_pylist() if "num_records" in actions.column_names else []
    rows = None if any(r is None for r in records) else sum(records)
    deleted, files_with_dvs = 0, 0
    if vectors is not None and vectors.num_rows:
        files_with_dvs = vectors.num_rows
        deleted = int(pc.sum(pc.invert(pc.list_flatten(vectors.column("selection_vector")))).as_py() or 0)
    size = sum(actions.column("size_bytes").to_pylist()) if actions.num_rows else 0
    return TableStats(table.version(), actions.num_rows, size, None if rows is None else rows - deleted, files_with_dvs)


def spark_only_table(uri: str, storage_options: Mapping[str, str] = {}) -> bool:
    """Whether the table at ``uri`` is Spark-only (ConfigError naming ``table.uri`` if there is no table)."""
    return is_spark_only(open_table(uri, storage_options).metadata().configuration)


def check_writable(uri: str, storage_options: Mapping[str, str] = {}, *, spark_only_ok: bool = False) -> None:
    """Raise :class:`TableNotWritable` if the table needs (or is set to turn on) a writer feature deltalake
    1.6.x cannot write: the jobs must never leave the table in a state the daemon cannot append to.

    A Spark-only table (``kafka2delta.sparkOnly = true``: a ``jobs apply-changes`` target, which uses deletion
    vectors) is accepted when ``spark_only_ok`` (``apply-changes`` itself, ``maintain``) and refused otherwise:
    ``mutate`` and ``ttl`` are daemon-safe jobs for the daemon's tables."""
    table = open_table(uri, storage_options)
    configuration = table.metadata().configuration
    if is_spark_only(configuration):
        if spark_only_ok:
            return
        raise TableNotWritable(
            f"{uri} is a Spark-only table ({SPARK_ONLY_PROPERTY}=true): a 'jobs apply-changes' target, with "
            "deletion vectors; the mutate and ttl jobs change the daemon's tables only"
        )
    protocol = table.protocol()
    features = set(protocol.writer_features or ()) | set(protocol.reader_features or ())
    bad = sorted(features & UNWRITABLE_FEATURES)
    if bad:
        raise TableNotWritable(
            f"{uri} uses table features the ingest daemon (deltalake) cannot write: {', '.join(bad)}; "
            "kafka2delta's jobs leave such a table alone"
        )
    enabling = sorted(
        f"{key}={value} ({feature})"
        for key, feature in _ENABLING_PROPERTIES.items()
        if str(configuration.get(key, "false")).lower() == "true"
        for value in [configuration[key]]
    )
    if enabling:
        raise TableNotWritable(
            f"{uri} has table properties that make Spark enable features the ingest daemon cannot write: "
            f"{', '.join(enabling)}; unset them first"
        )


def _log_files(uri: str, storage_options: Mapping[str, str]) -> tuple[pa_fs.FileSystem, list[pa_fs.FileInfo]]:
    """The table's filesystem and what its ``_delta_log`` directory holds (nothing when it has none)."""
    fs, root = table_filesystem(uri, storage_options)
    log = f"{root.rstrip('/')}/_delta_log"
    try:
        return fs, fs.get_file_info(pa_fs.FileSelector(log, allow_not_found=True))
    except OSError as exc:
        raise RetryableError(f"listing {log}: {exc}") from exc


_COMMIT = re.compile(r"^(\d{20})\.json$")
# Checkpoints: classic (NNN.checkpoint.parquet), multi-part (NNN.checkpoint.0000000001.0000000003.parquet),
# V2 (NNN.checkpoint.<uuid>.json|parquet).
_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(?:\.(\d{10})\.(\d{10})|\.[0-9a-fA-F-]{36})?\.(parquet|json)$")


def txn_versions(uri: str, storage_options: Mapping[str, str] = {}) -> dict[str, int]:
    """Every txn app id of the table's current version, with its version: the txn actions of the newest complete
    checkpoint, then of the commits after it (deltalake 1.6 answers only for an app id one names:
    ``DeltaTable.transaction_version``). A V2 checkpoint keeps its txn actions in its top-level file."""
    fs, infos = _log_files(uri, storage_options)
    commits: dict[int, str] = {}
    checkpoints: dict[int, list[tuple[str, int]]] = {}
    for info in infos:
        if info.type != pa_fs.FileType.File:
            continue
        if commit := _COMMIT.match(info.base_name):
            commits[int(commit.group(1))] = info.path
        elif checkpoint := _CHECKPOINT.match(info.base_name):
            parts = int(checkpoint.group(3) or 1)
            checkpoints.setdefault(int(checkpoint.group(1)), []).append((info.path, parts))
    complete = [v for v, files in checkpoints.items() if any(n == 1 for _, n in files) or len(files) == files[0][1]]
    since = max(complete, default=-1)
    versions: dict[str, int] = {}
    try:
        for path, _ in checkpoints.get(since, []):
            if path.endswith(".parquet"):
                with fs.open_input_file(path) as stream:
                    parquet = pq.ParquetFile(stream)
                    if "txn" in parquet.schema_arrow.names:
                        for txn in parquet.read(columns=["txn"]).column("txn").to_pylist():
                            if txn:
                                versions[txn["appId"]] = int(txn["version"])
            else:
                versions.update(_txn_lines(fs, path))
        for version in sorted(v for v in commits if v > since):
            versions.update(_txn_lines(fs, commits[version]))
    except (OSError, ValueError, KeyError, pa.ArrowException) as exc:
        raise RetryableError(f"reading the txn actions of {uri}: {exc}") from exc
    return versions


def _txn_lines(fs: pa_fs.FileSystem, path: str) -> dict[str, int]:
    versions: dict[str, int] = {}
    with fs.open_input_stream(path) as stream:
        for line in stream.read().decode().splitlines():
            if '"txn"' in line and "txn" in (action := json.loads(line)):
                versions[action["txn"]["appId"]] = int(action["txn"]["version"])
    return versions


def files_matching(actions: pa.Table, column: str, value: Any) -> int:
    """How many files a point query ``column = value`` must read once files are pruned by min/max statistics
    (a file without statistics for ``column`` always counts)."""
    lows = actions.column(f"min.{column}").to_pylist()
    highs = actions.column(f"max.{column}").to_pylist()
    return sum(1 for low, high in zip(lows, highs, strict=True) if low is None or high is None or low <= value <= high)


def storage_path(log_path: str) -> str:
    """A file's path as it is named on storage, from its path in the Delta log: the log's ``path`` is a URI
    (percent-encoded once more: a partition value ``a b:c`` is directory ``p=a%20b%3Ac`` on storage and
    ``p=a%2520b%253Ac`` in the log and in deltalake's add actions), so it is decoded once. Every path that
    vacuum compares (log, storage listing, Spark's VACUUM output) is in this storage form."""
    return unquote(log_path)


def referenced_paths(uri: str, storage_options: Mapping[str, str] = {}) -> set[str]:
    """Relative paths (storage form, :func:`storage_path`) of the files of the current version."""
    table = open_table(uri, storage_options)
    paths = pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist()
    return {storage_path(str(path)) for path in paths}


@dataclass(frozen=True)
class DataFile:
    path: str
    """Relative to the table root."""
    size: int
    mtime_s: float


def data_files(
    uri: str, storage_options: Mapping[str, str] = {}, partition_columns: Sequence[str] | None = None
) -> list[DataFile]:
    """Every Parquet file under the table root that a vacuum may delete (:func:`vacuum_skips` none of it): outside
    ``_delta_log`` and hidden (``_``, ``.``) names, inside a partition directory whatever its name (the table's
    ``partition_columns`` unless given)."""
    if partition_columns is None:
        partition_columns = open_table(uri, storage_options).metadata().partition_columns
    fs, root = table_filesystem(uri, storage_options)
    root = root.rstrip("/")
    try:
        infos = fs.get_file_info(pa_fs.FileSelector(root, recursive=True, allow_not_found=True))
    except OSError as exc:
        raise RetryableError(f"listing {uri}: {exc}") from exc
    files = []
    for info in infos:
        if info.type != pa_fs.FileType.File or not info.path.endswith(".parquet"):
            continue
        relative = info.path[len(root) + 1 :]
        if vacuum_skips(relative, partition_columns):
            continue
        mtime = info.mtime.timestamp() if info.mtime is not None else 0.0
        files.append(DataFile(relative, info.size or 0, mtime))
    return files


def vacuum_skips(path: str, partition_columns: Sequence[str] = ()) -> bool:
    """Whether Spark's VACUUM leaves the file at ``path`` (relative to the table root) alone: a hidden name anywhere in
    it, ``_`` or ``.`` first, except a partition directory (``<partition column>=…``, so a column ``_p`` is no
    exception) and Delta's ``_change_data`` and ``_delta_index`` (DeltaTableUtils.isHiddenDirectory). delta-rs skips
    less (top-level names only): its lane filters delta-rs's list by this rule."""
    partitions = tuple(f"{column}=" for column in partition_columns)
    return any(
        part.startswith(("_", "."))
        and not part.startswith(partitions)
        and not part.startswith(("_change_data", "_delta_index"))
        for part in path.split("/")
    )


def logged_adds(uri: str, storage_options: Mapping[str, str] = {}) -> set[str]:
    """Paths (storage form, :func:`storage_path`) of every file added by a commit whose JSON is still in
    ``_delta_log`` (to tell a crashed daemon's never-committed files from files committed and later removed)."""
    fs, infos = _log_files(uri, storage_options)
    paths: set[str] = set()
    for info in infos:
        if info.type != pa_fs.FileType.File or not info.path.endswith(".json") or "/_delta_log/." in info.path:
            continue
        try:
            with fs.open_input_stream(info.path) as stream:
                text = stream.read().decode()
        except OSError as exc:
            raise RetryableError(f"reading {info.path}: {exc}") from exc
        for line in text.splitlines():
            if '"add"' in line:
                with_add = json.loads(line)
                if "add" in with_add:
                    paths.add(storage_path(with_add["add"]["path"]))
    return paths


_GLOB = re.compile(r"[*?\[]")


def expand(pattern: str, storage_options: Mapping[str, str] = {}) -> list[str]:
    """The Delta tables a URI glob names (``*``, ``?``, ``[…]`` within path segments; ``s3://lake/raw/*``): every
    directory matching it that holds a ``_delta_log``, sorted. A URI without glob characters is returned as it is."""
    if not _GLOB.search(pattern):
        return [pattern]
    scheme, _, path = pattern.rpartition("://")
    prefix = f"{scheme}://" if scheme else ""
    if not scheme:
        path = os.path.abspath(path)
    segments = path.split("/")
    first_glob = next(i for i, segment in enumerate(segments) if _GLOB.search(segment))
    fs, base = table_filesystem(prefix + "/".join(segments[:first_glob]), storage_options)
    candidates = [base.rstrip("/")]
    for segment in segments[first_glob:]:
        if not _GLOB.search(segment):
            candidates = [f"{c}/{segment}" for c in candidates]
            continue
        matched = []
        for candidate in candidates:
            try:
                infos = fs.get_file_info(pa_fs.FileSelector(candidate, allow_not_found=True))
            except OSError as exc:
                raise RetryableError(f"listing {prefix}{candidate}: {exc}") from exc
            matched += [
                info.path
                for info in infos
                if info.type == pa_fs.FileType.Directory and fnmatch.fnmatchcase(info.base_name, segment)
            ]
        candidates = matched
    try:
        logs = fs.get_file_info([f"{c}/_delta_log" for c in candidates]) if candidates else []
    except OSError as exc:
        raise RetryableError(f"looking for Delta tables matching {pattern}: {exc}") from exc
    return sorted(prefix + c for c, log in zip(candidates, logs, strict=True) if log.type == pa_fs.FileType.Directory)


class DaemonTable(NamedTuple):
    """A table the config's daemon writes."""

    key: str
    """The config key naming it (``table.uri``, ``routes[1].dead_letter_table_uri`` …)."""
    uri: str
    """Its URI, or a ``{topic}`` template."""
    dead_letters: bool
    """A dead-letter table."""


def daemon_tables(config: Config) -> list[DaemonTable]:
    """Every table the config's daemon writes: ``table.uri``, the routes' URIs and every dead-letter table."""
    tables = [
        DaemonTable("table.uri", config.table.uri, False),
        DaemonTable("dead_letters.table_uri", config.dead_letter_table_uri, True),
    ]
    for i, route in enumerate(config.routes):
        tables += [
            DaemonTable(f"routes[{i}].uri", route.uri, False),
            DaemonTable(f"routes[{i}].dead_letter_table_uri", route.dead_letter_table_uri, True),
        ]
    return [table for table in tables if table.uri]


def dead_letter_tables(config: Config) -> list[str]:
    """The dead-letter tables (``maintain --dead-letters``, the dead-letter retention of ``jobs ttl``): the daemon's
    (it makes it at start), and each route's own that exists (the daemon makes those at a route's first dead
    letter)."""
    from kafka2delta.config import table_key

    found: dict[str, str] = {table_key(config.dead_letter_table_uri): config.dead_letter_table_uri}
    for table in daemon_tables(config):
        identity = table_key(table.uri)
        if table.dead_letters and identity not in found and is_table(table.uri, config.table.storage_options):
            found[identity] = table.uri
    return list(found.values())
