"""What the jobs read about a table through deltalake (no Spark): sizes for the reports, the protocol check that
keeps the table writable by the daemon, file-level statistics, and the data files on storage for vacuum."""

from __future__ import annotations

import fnmatch
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.fs as pa_fs
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from kafka2delta.errors import ConfigError, RetryableError
from kafka2delta.spark.errors import TableNotWritable

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
    """Sum of the files' ``numRecords`` statistics; None if some file has none."""


def _open(uri: str, storage_options: Mapping[str, str]) -> DeltaTable:
    try:
        return DeltaTable(uri, storage_options=dict(storage_options) or None)
    except TableNotFoundError as exc:
        raise ConfigError("table.uri", f"no Delta table at {uri}") from exc
    except (DeltaError, OSError) as exc:
        raise RetryableError(f"reading the Delta log of {uri}: {exc}") from exc


def add_actions(uri: str, storage_options: Mapping[str, str] = {}) -> pa.Table:
    """One row per file of the current version: ``path``, ``size_bytes``, ``num_records``, ``min.<c>``, ``max.<c>``."""
    table = _open(uri, storage_options)
    try:
        return pa.table(table.get_add_actions(flatten=True))
    except (DeltaError, OSError) as exc:
        raise RetryableError(f"reading the add actions of {uri}: {exc}") from exc


def table_stats(uri: str, storage_options: Mapping[str, str] = {}) -> TableStats:
    table = _open(uri, storage_options)
    try:
        actions = pa.table(table.get_add_actions(flatten=True))
    except (DeltaError, OSError) as exc:
        raise RetryableError(f"reading the add actions of {uri}: {exc}") from exc
    records = actions.column("num_records").to_pylist() if "num_records" in actions.column_names else []
    rows = None if any(r is None for r in records) else sum(records)
    size = sum(actions.column("size_bytes").to_pylist()) if actions.num_rows else 0
    return TableStats(table.version(), actions.num_rows, size, rows)


def check_writable(uri: str, storage_options: Mapping[str, str] = {}) -> None:
    """Raise :class:`TableNotWritable` if the table needs (or is set to turn on) a writer feature deltalake
    1.6.x cannot write: the jobs must never leave the table in a state the daemon cannot append to."""
    table = _open(uri, storage_options)
    protocol = table.protocol()
    features = set(protocol.writer_features or ()) | set(protocol.reader_features or ())
    bad = sorted(features & UNWRITABLE_FEATURES)
    if bad:
        raise TableNotWritable(
            f"{uri} uses table features the ingest daemon (deltalake) cannot write: {', '.join(bad)}; "
            "kafka2delta's jobs leave such a table alone"
        )
    configuration = table.metadata().configuration
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
    table = _open(uri, storage_options)
    paths = pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist()
    return {storage_path(str(path)) for path in paths}


def filesystem(uri: str, storage_options: Mapping[str, str] = {}) -> tuple[pa_fs.FileSystem, str]:
    """The Arrow filesystem and root path of a table (local paths and the object stores Arrow knows)."""
    try:
        if "://" not in uri or uri.startswith("file://"):
            return pa_fs.LocalFileSystem(), uri.removeprefix("file://")
        return pa_fs.FileSystem.from_uri(uri)  # type: ignore[no-any-return]
    except (pa.ArrowInvalid, OSError) as exc:
        raise ConfigError("table.uri", f"cannot open {uri}: {exc}") from exc


@dataclass(frozen=True)
class DataFile:
    path: str
    """Relative to the table root."""
    size: int
    mtime_s: float


def data_files(uri: str, storage_options: Mapping[str, str] = {}) -> list[DataFile]:
    """Every Parquet file under the table root, outside ``_delta_log`` and hidden (``_``, ``.``) directories."""
    fs, root = filesystem(uri, storage_options)
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
        if any(part.startswith(("_", ".")) for part in relative.split("/")):
            continue
        mtime = info.mtime.timestamp() if info.mtime is not None else 0.0
        files.append(DataFile(relative, info.size or 0, mtime))
    return files


def logged_adds(uri: str, storage_options: Mapping[str, str] = {}) -> set[str]:
    """Paths (storage form, :func:`storage_path`) of every file added by a commit whose JSON is still in
    ``_delta_log`` (to tell a crashed daemon's never-committed files from files committed and later removed)."""
    fs, root = filesystem(uri, storage_options)
    log = f"{root.rstrip('/')}/_delta_log"
    try:
        infos = fs.get_file_info(pa_fs.FileSelector(log, allow_not_found=True))
    except OSError as exc:
        raise RetryableError(f"listing {log}: {exc}") from exc
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
    fs, base = filesystem(prefix + "/".join(segments[:first_glob]), storage_options)
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
    logs = fs.get_file_info([f"{c}/_delta_log" for c in candidates]) if candidates else []
    return sorted(prefix + c for c, log in zip(candidates, logs, strict=True) if log.type == pa_fs.FileType.Directory)
