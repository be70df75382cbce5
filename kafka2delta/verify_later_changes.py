"""Keys a later commit deleted or changed, for ``kafka2delta verify`` of an upsert table: what ``jobs ttl``, a
``jobs mutate`` DELETE or UPDATE, or anyone's DELETE, MERGE, UPDATE or overwrite with a predicate did to a key after
the daemon wrote its last change. Verify counts such a key as deleted or changed later, not as missing or differing.

A commit that deletes or changes rows removes the files holding them and adds back the rows it keeps or changed
(:mod:`kafka2delta.verify_deletes` tells which commits count, and which it cannot read). For one key the walk starts
from the row its last change should have left (the expected row) and follows the commits not made by the daemon
in version order: a commit that removed a row equal to the key's current one leaves the key with the row of that key
it added, or with none. The key is explained when that walk ends with what the table holds: no row for a missing
key, an equal row for a differing one. A row equal to the expected one matters, not only the key: a delete of the
key's earlier row, before the daemon wrote its last change, explains nothing. Rows are equal as ``differs`` says
(the caller's: every compared column; a soft tombstone, every column it expects a value in), so the match is exact
only when the expected row holds a value unique to its change: its ``kafka_offset`` (``table.metadata_columns`` with
``"offset"``) or a non-null ``_lsn`` (a soft tombstone keeps its upsert's offset: ``_lsn`` only). Without one, a key
whose last change brought back the values of a row a job deleted or changed before is matched by value (the report
says so). A commit that took out more than one row of the key (the table held it twice: a fault) or left it twice
explains nothing.

The cost, paid only when keys are missing or differ: the log's entries from the table's version down, until every
such key's expected row is found removed by a commit (all of them when one is not), and the data files of the
commits not made by the daemon that removed or added files (each file's key column first, the rest only when it holds
a key looked for).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pa_fs

from kafka2delta.verify_deletes import LogEntry, data_file, log_pages, unreadable
from kafka2delta.verify_reading import Deadline
from kafka2delta.writer import table_filesystem

Row = dict[str, Any]
Differs = Callable[[Row, Row], list[str]]
"""The columns in which a row differs from the expected one (the first argument): empty when equal."""


def key_of(row: Mapping[str, Any], key: Sequence[str]) -> Any:
    """The key of ``row``: its one key column's value, or a tuple of them."""
    return row[key[0]] if len(key) == 1 else tuple(row[c] for c in key)


@dataclass(frozen=True)
class KeyCommit:
    """A commit not made by the daemon that left checked keys as the table holds them (the last commit of each
    key's walk: one that an even later commit overrode is not counted)."""

    operation: str
    keys: int


@dataclass
class LaterChanges:
    """What later commits did to the keys that are missing or differ."""

    deleted: dict[Any, int] = field(default_factory=dict)
    """Missing keys a later commit deleted: key → that commit's version."""
    changed: dict[Any, int] = field(default_factory=dict)
    """Differing keys later commits changed to the row the table holds: key → the last such commit's version."""
    by_version: dict[int, KeyCommit] = field(default_factory=dict)
    unreadable: dict[int, str] = field(default_factory=dict)
    """Commits whose rows cannot be told, by version: why (files vacuumed, deletion vectors …)."""
    log_starts_at: int = 0
    """The version after the first entry missing from the log, going down: what older commits did cannot be
    told. 0: none missing, or the walk stopped before."""


@dataclass(frozen=True)
class _Step:
    """What one commit did to one key: the key's rows in the files it removed and in those it added."""

    version: int
    removed: list[Row]
    added: list[Row]


def later_changes(
    uri: str,
    storage_options: Mapping[str, str],
    version: int,
    key: Sequence[str],
    schema: pa.Schema,
    expected: Mapping[Any, Row],
    held: Mapping[Any, Row | None],
    differs: Differs,
    deadline: Deadline,
) -> LaterChanges:
    """Which keys of ``held`` (key → the table's row, None when missing) later commits of ``uri`` up to ``version``
    took from their ``expected`` row to the one held, reading the columns of ``schema`` (the table's)."""
    filesystem, root = table_filesystem(uri, storage_options)
    found = LaterChanges()
    steps: dict[Any, list[_Step]] = defaultdict(list)  # newest first
    started: set[Any] = set()  # keys whose expected row a read commit removed: the walk has found where theirs start
    operations: dict[int, str] = {}
    for entries in log_pages(filesystem, root, uri, version, deadline):
        for at, entry in entries:
            if entry is None:
                found.log_starts_at = at + 1
                continue
            if not entry.deletes or not (entry.removed or entry.added or entry.error):
                continue  # (a job's MERGE that only inserted: read, it may bring back a key a job deleted)
            deadline.wait(0, lambda: f"reading the data files of {uri} at version {at}")  # noqa: B023 (called at once)
            rows = _key_rows(filesystem, root, entry, key, schema, held, found, at)
            if rows is None:
                continue
            operations[at] = entry.operation
            removed, added = rows
            for k in removed.keys() | added.keys():
                steps[k].append(_Step(at, removed.get(k, []), added.get(k, [])))
                if any(not differs(expected[k], row) for row in removed.get(k, [])):
                    started.add(k)
        if started.issuperset(held):
            break
    for k, now in held.items():
        end = _walk(expected[k], reversed(steps.get(k, [])), differs)
        if end is None:
            continue
        row, last = end
        if row is None and now is None:
            found.deleted[k] = last
        elif row is not None and now is not None and not differs(row, now):
            found.changed[k] = last
        else:
            continue
        commit = found.by_version.get(last, KeyCommit(operations[last], 0))
        found.by_version[last] = KeyCommit(commit.operation, commit.keys + 1)
    return found


def _walk(expected: Row, steps: Iterable[_Step], differs: Differs) -> tuple[Row | None, int] | None:
    """Where the commits ``steps`` (oldest first) take a key from its expected row: the row (None: deleted) and the
    version of the last commit that changed it; None when none did, or a commit left the key twice."""
    row: Row | None = expected
    last: int | None = None
    for step in steps:
        if row is None:
            if step.added and not step.removed:  # inserted again (a MERGE's insert)
                if len(step.added) > 1:
                    return None
                row, last = step.added[0], step.version
            continue
        if not any(not differs(row, removed) for removed in step.removed):
            continue  # the commit took out another row of the key (an older one), not this one
        if len(step.removed) > 1 or len(step.added) > 1:
            return None  # the key twice: which row the commit kept cannot be told
        after = step.added[0] if step.added else None
        if after is None or differs(row, after):
            row, last = after, step.version
    return None if last is None else (row, last)


def _key_rows(
    filesystem: pa_fs.FileSystem,
    root: str,
    entry: LogEntry,
    key: Sequence[str],
    schema: pa.Schema,
    keys: Mapping[Any, object],
    found: LaterChanges,
    at: int,
) -> tuple[dict[Any, list[Row]], dict[Any, list[Row]]] | None:
    """The rows of ``keys`` in the files ``entry`` removed and in those it added; None, noted in ``found``, when they
    cannot be told."""
    if why := unreadable(entry):
        found.unreadable[at] = why
        return None
    try:
        return (
            _rows_of(filesystem, root, entry.removed, key, schema, keys),
            _rows_of(filesystem, root, entry.added, key, schema, keys),
        )
    except FileNotFoundError:
        found.unreadable[at] = "its files were vacuumed"
    except pa.ArrowException as exc:  # a corrupt file, a partition value that is not of its column's type
        found.unreadable[at] = f"unreadable: {exc}"
    return None


def _rows_of(
    filesystem: pa_fs.FileSystem,
    root: str,
    files: list[dict[str, Any]],
    key: Sequence[str],
    schema: pa.Schema,
    keys: Mapping[Any, object],
) -> dict[Any, list[Row]]:
    """The rows of ``keys`` the data files ``files`` hold, by key (the columns of ``schema``; partition values as
    their columns' types)."""
    first = [k[0] if len(key) > 1 else k for k in keys]
    wanted = pa.array(first, schema.field(key[0]).type)
    rows: dict[Any, list[Row]] = defaultdict(list)
    for action in files:
        # The key column first: most files a job rewrote hold none of the keys looked for.
        keys_here = _typed(data_file(filesystem, root, action, (key[0],)), schema)
        if (
            key[0] not in keys_here.column_names
            or not pc.any(pc.is_in(keys_here.column(key[0]), value_set=wanted)).as_py()
        ):
            continue
        data = _typed(data_file(filesystem, root, action, tuple(schema.names)), schema)
        for row in data.filter(pc.is_in(data.column(key[0]), value_set=wanted)).to_pylist():
            k = key_of(row, key)
            if k in keys:
                rows[k].append(row)
    return rows


def _typed(data: pa.Table, schema: pa.Schema) -> pa.Table:
    """``data``'s columns as ``schema`` types them: a partition value is text (a timestamp's without its zone, as
    Delta writes it), another writer's text may be string_view."""
    for name in data.column_names:
        kind = schema.field(name).type
        column = data.column(name)
        if column.type == kind:
            continue
        if pa.types.is_timestamp(kind) and kind.tz is not None and pa.types.is_string(column.type):
            # A partition value in UTC: with its zone as Spark writes it (…Z), without as delta-rs does.
            zoned = pc.ends_with(column, "Z")
            if not pc.all(zoned).as_py():
                column = column.cast(pa.timestamp(kind.unit))
        data = data.set_column(data.column_names.index(name), name, column.cast(kind))
    return data
