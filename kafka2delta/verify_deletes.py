"""Rows a later commit deleted, for ``kafka2delta verify``: what ``jobs ttl``, a ``jobs mutate`` DELETE or anyone's
DELETE, MERGE or UPDATE took out of a table after the daemon wrote them. Verify counts their offsets as deleted, not
missing.

A commit that deletes rows removes the files holding them (``remove`` with ``dataChange = true``) and adds back
the rows it keeps (a rewritten file). So the rows a commit deleted are those of its removed files less those of its
added files, by partition and offset. Only the operations meant to delete rows count: DELETE, MERGE, UPDATE, and an
overwrite with a predicate (``replaceWhere``). A RESTORE, a whole-table overwrite or any other commit that removed
files explains nothing: rows it took out stay missing, as a loss would. Three things make a deleting commit's rows
unknown, and the report names them: VACUUM having removed its files, a deletion vector (this reader does not apply
them; the daemon's tables have none), and a log cleaned up before it (``delta.logRetentionDuration``).

The cost: the commit info of the log's versions, newest first, until every missing offset is explained (one read a
version; all of them when some are not), and the data files of the deleting commits. It is paid only when offsets are
missing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pa_fs
import pyarrow.parquet as pq

from kafka2delta.errors import RetryableError
from kafka2delta.verify_reading import Deadline, no_offsets, offset_pairs
from kafka2delta.writer import table_filesystem

_FIRST_PAGE = 1000  # log entries read first, newest first; then the 4 times as many before them, and so on
_LAST_PAGE = 16_000  # the largest page: what a page holds waits in memory, and a stop is seen between entries
_READERS = 8  # log entries read at once (one GET each on object storage)
_DELETING = frozenset({"DELETE", "MERGE", "UPDATE"})
"""Operations meant to delete (or that may delete) rows; an overwrite counts with a predicate (LogEntry.deletes)."""


@dataclass(frozen=True)
class DeletingCommit:
    """A commit that deleted rows of the checked topic."""

    operation: str
    rows: int
    """Rows of the checked topic it took out."""


@dataclass
class Deletions:
    """The offsets of rows that commits up to a table version deleted, by Kafka partition."""

    offsets: dict[int, np.ndarray] = field(default_factory=dict)
    by_version: dict[int, DeletingCommit] = field(default_factory=dict)
    unreadable: dict[int, str] = field(default_factory=dict)
    """Deleting commits whose rows cannot be told, by version: why (files vacuumed, deletion vectors …)."""
    log_starts_at: int = 0
    """The version after the first entry missing from the log, going down (cleaned up, or a gap): what older commits
    deleted cannot be told. 0: none missing, or the walk stopped before."""


def deleted_rows(
    uri: str,
    storage_options: Mapping[str, str],
    version: int,
    partition_column: str,
    offset_column: str,
    where: Callable[[pa.Schema], pc.Expression | None],
    where_columns: tuple[str, ...],
    missing: Mapping[int, np.ndarray],
    deadline: Deadline,
) -> Deletions:
    """What the commits of ``uri`` up to ``version`` deleted of the rows ``where`` selects (the checked topic's),
    reading ``where_columns`` for it. The log's entries are read from ``version`` down, a page at a time (several
    at once), until every offset of ``missing`` is found deleted or the log ends: deletions are usually recent.
    Each entry is read by its own version number (found by review: deltalake 1.6's history() numbers its entries by
    counting down and skips a commit without commitInfo, so an older entry could be read as another version)."""
    filesystem, root = table_filesystem(uri, storage_options)
    read = _Read(filesystem, root, (partition_column, offset_column), where, where_columns)
    found = Deletions()
    pieces: list[pa.Table] = []
    for entries in log_pages(filesystem, root, uri, version, deadline):
        for at, entry in entries:
            if entry is None:  # cleaned up from here down (delta.logRetentionDuration), or a gap
                found.log_starts_at = at + 1
            elif entry.deletes:
                deadline.wait(0, lambda: f"reading the data files of {uri} at version {at}")  # noqa: B023 (at once)
                deleted = _deleted_by(read, at, entry, found)
                if deleted is not None and deleted.num_rows:
                    found.by_version[at] = DeletingCommit(entry.operation, deleted.num_rows)
                    pieces.append(deleted)
        if pieces:
            rows = pa.concat_tables(pieces)
            partitions, offsets = rows.column(0).to_numpy(), rows.column(1).to_numpy()
            found.offsets = {int(p): np.unique(offsets[partitions == p]) for p in np.unique(partitions)}
        if all(np.isin(offsets, found.offsets.get(p, ())).all() for p, offsets in missing.items()):
            break
    return found


def log_pages(
    filesystem: pa_fs.FileSystem, root: str, uri: str, version: int, deadline: Deadline
) -> Iterator[list[tuple[int, LogEntry | None]]]:
    """The log's entries from ``version`` down, newest first, a page at a time (a page's entries read several at
    once; the first page small, as what is looked for is usually recent). The walk ends at version 0 or with the
    first entry the log no longer has (None: cleaned up from there down, or a gap), the last of its page."""
    top, page = version, _FIRST_PAGE
    with ThreadPoolExecutor(_READERS) as pool:
        while top >= 0:
            versions = list(range(top, max(top - page, -1), -1))
            entries: list[tuple[int, LogEntry | None]] = []
            for at, entry in zip(versions, pool.map(partial(_log_entry, filesystem, root), versions), strict=True):
                deadline.wait(0, lambda: f"reading the log of {uri} at version {at}")  # noqa: B023 (called at once)
                entries.append((at, entry))
                if entry is None:
                    break
            yield entries
            if entries[-1][1] is None:
                return
            top, page = top - page, min(page * 4, _LAST_PAGE)


@dataclass
class LogEntry:
    """What one log entry says about deletions: its operation and the data files it removed and added (with
    ``dataChange``)."""

    info: dict[str, Any]
    """Its ``commitInfo`` (empty when it has none: the protocol makes it optional)."""
    removed: list[dict[str, Any]]
    added: list[dict[str, Any]]
    error: str = ""
    """Why it could not be read (not JSON), if so."""

    @property
    def operation(self) -> str:
        return str(self.info.get("operation", ""))

    @property
    def deletes(self) -> bool:
        """Whether it was meant to delete rows, and not by the daemon (found by review: a RESTORE counted as
        deletions hid a real loss)."""
        if self.error:
            return True  # said in the report, rather than taken as deleting nothing
        if "kafka2delta" in self.info:
            return False
        if self.operation in _DELETING:
            return True
        parameters = self.info.get("operationParameters") or {}
        # An overwrite of what a predicate selects (Spark's replaceWhere, delta-rs's predicate): a deliberate delete.
        return (
            self.operation == "WRITE"
            and str(parameters.get("mode", "")).lower() == "overwrite"
            and bool(parameters.get("predicate"))
        )


def _log_entry(filesystem: pa_fs.FileSystem, root: str, version: int) -> LogEntry | None:
    """The entry of ``version`` (None when the log no longer has it)."""
    path = f"{root.rstrip('/')}/_delta_log/{version:020d}.json"
    try:
        with filesystem.open_input_stream(path) as stream:
            data = stream.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise RetryableError(f"reading {path}: {exc}") from exc
    entry = LogEntry({}, [], [])
    try:
        for line in data.decode().splitlines():
            if not line.strip():
                continue
            action = json.loads(line)
            if "commitInfo" in action:
                entry.info = action["commitInfo"] or {}
            for kind, files in (("remove", entry.removed), ("add", entry.added)):
                if kind in action and action[kind].get("dataChange", True):
                    files.append(action[kind])
    except (ValueError, TypeError, AttributeError) as exc:  # not UTF-8, not JSON, an action that is not an object
        entry.error = f"its log entry is unreadable: {type(exc).__name__}: {exc}"
    if not entry.deletes:
        entry.removed, entry.added = [], []  # a page of entries waits in memory: keep only what is read later
    return entry


def _deleted_by(read: _Read, at: int, entry: LogEntry, found: Deletions) -> pa.Table | None:
    """The (partition, offset) of the rows version ``at`` deleted; None, noted in ``found``, when it cannot be told."""
    if not entry.removed and not entry.error:
        return None
    if why := unreadable(entry):
        found.unreadable[at] = why
        return None
    try:
        return _minus(read.rows(entry.removed), read.rows(entry.added))
    except FileNotFoundError:
        found.unreadable[at] = "its files were vacuumed"
    except pa.ArrowException as exc:  # a corrupt data file: named, not fatal to the check
        found.unreadable[at] = f"unreadable: {exc}"
    return None


def unreadable(entry: LogEntry) -> str:
    """Why the rows an entry's files hold cannot be told from its log entry alone ("" when they can)."""
    if entry.error:
        return entry.error
    if any(action.get("deletionVector") for action in (*entry.removed, *entry.added)):
        return "deletion vectors"
    return ""


def data_file(filesystem: pa_fs.FileSystem, root: str, action: dict[str, Any], columns: tuple[str, ...]) -> pa.Table:
    """The ``columns`` of the data file an add or remove action names (those it has; its partition values as text
    columns). FileNotFoundError when the file is gone (vacuumed)."""
    path = f"{root.rstrip('/')}/{unquote(action['path'])}"
    try:
        if filesystem.get_file_info(path).type == pa_fs.FileType.NotFound:
            raise FileNotFoundError(path)
        with filesystem.open_input_file(path) as handle:
            parquet = pq.ParquetFile(handle)
            rows = parquet.read(columns=[n for n in columns if n in parquet.schema_arrow.names])
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise RetryableError(f"reading {path}: {exc}") from exc
    for name, value in (action.get("partitionValues") or {}).items():
        if name in columns and name not in rows.column_names:
            value = value or None  # an empty partition value is a null one (the protocol's rule)
            rows = rows.append_column(name, pa.array([value] * rows.num_rows, pa.string()))
    return rows


@dataclass
class _Read:
    """How the rows of a table's data files are read: their partition and offset, where ``where`` selects them."""

    filesystem: pa_fs.FileSystem
    root: str
    columns: tuple[str, str]
    where: Callable[[pa.Schema], pc.Expression | None]
    where_columns: tuple[str, ...]

    def rows(self, files: list[dict[str, Any]]) -> pa.Table:
        """(partition, offset) of the selected rows of ``files`` (a file's partition values count as its columns).
        FileNotFoundError when a file is gone."""
        pieces = [self._file(action) for action in files]
        kept = [piece for piece in pieces if piece is not None]
        return pa.concat_tables(kept) if kept else no_offsets()

    def _file(self, action: dict[str, Any]) -> pa.Table | None:
        rows = data_file(self.filesystem, self.root, action, (*self.columns, *self.where_columns))
        for name in self.where_columns:
            # A file written before the column existed reads as the table does, with nulls there (found by review:
            # with no column, no filter applied, and another topic's rows of a shared table explained this one's).
            if name not in rows.column_names:
                rows = rows.append_column(name, pa.nulls(rows.num_rows, pa.string()))
        if not set(self.columns) <= set(rows.column_names):
            return None  # written before the metadata columns were: no offset to tell
        for name in self.where_columns:  # another writer's file may hold text as string_view or large_string
            if name in rows.column_names and rows.schema.field(name).type in (pa.large_string(), pa.string_view()):
                rows = rows.set_column(rows.column_names.index(name), name, rows.column(name).cast(pa.string()))
        expression = self.where(rows.schema)
        return offset_pairs(rows if expression is None else rows.filter(expression), *self.columns)


def _minus(rows: pa.Table, kept: pa.Table) -> pa.Table:
    """The (partition, offset) pairs of ``rows`` that ``kept`` does not hold."""
    if not kept.num_rows:
        return rows
    return rows.join(
        kept.group_by(["partition", "offset"]).aggregate([]), ["partition", "offset"], join_type="left anti"
    )
