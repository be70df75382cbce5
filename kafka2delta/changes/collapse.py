"""A flush's changes to one table → the MERGE source: the last change of each key (pure Arrow)."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from kafka2delta.changes.options import DELETE_FLAG

_INDEX = "__k2d_index"


def last_changes(rows: pa.Table, deletes: pa.Array, key: Sequence[str], unavailable: str | None = None) -> pa.Table:
    """The last row of each key, with :data:`DELETE_FLAG` telling deletes from upserts.

    ``rows`` are in the order their changes happened (a flush's partitions one after the other, each in
    offset order: "last" is by partition, then offset); ``deletes`` is aligned with them. ``unavailable``: a
    placeholder for "this value did not change" (Debezium's unchanged TOASTed value): the last change takes
    the value an earlier change of its key in ``rows`` gave, if any (else the MERGE keeps the row's).
    """
    if not rows.num_rows or not key:
        return rows.slice(0, 0).append_column(DELETE_FLAG, pa.array([], pa.bool_()))
    indexed = rows.select(list(key)).append_column(_INDEX, pa.array(range(rows.num_rows), pa.int64()))
    last = indexed.group_by(list(key), use_threads=False).aggregate([(_INDEX, "max")])
    chosen = last.column(f"{_INDEX}_max").combine_chunks().sort()
    changes = rows.take(chosen)
    if unavailable is not None:
        changes = _fill_unavailable(rows, changes, chosen.to_pylist(), key, unavailable)
    return changes.append_column(DELETE_FLAG, deletes.take(chosen))


def _fill_unavailable(
    rows: pa.Table, changes: pa.Table, chosen: list[int], key: Sequence[str], unavailable: str
) -> pa.Table:
    for index, column in enumerate(changes.schema):
        if not pa.types.is_string(column.type) or column.name in key:
            continue
        marked = pc.equal(changes.column(index), unavailable)
        if not pc.any(marked).as_py():
            continue
        values = changes.column(index).to_pylist()
        history = rows.column(column.name).to_pylist()
        keys = list(zip(*(rows.column(c).to_pylist() for c in key), strict=True))
        for position, is_marked in enumerate(marked.to_pylist()):
            if not is_marked:
                continue
            last = chosen[position]
            earlier = (i for i in range(last - 1, -1, -1) if keys[i] == keys[last] and history[i] != unavailable)
            found = next(earlier, None)
            if found is not None:
                values[position] = history[found]
        changes = changes.set_column(index, column, pa.array(values, column.type))
    return changes
