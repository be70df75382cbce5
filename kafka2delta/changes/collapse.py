"""A flush's changes to one table → the MERGE source: the last change of each key (pure Arrow)."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from kafka2delta.changes.options import DELETE_FLAG

_INDEX = "__k2d_index"


def last_changes(rows: pa.Table, deletes: pa.Array, key: Sequence[str]) -> pa.Table:
    """The last row of each key, with :data:`DELETE_FLAG` telling deletes from upserts.

    ``rows`` are in the order their changes happened (a flush's partitions one after the other, each in
    offset order: "last" is by partition, then offset); ``deletes`` is aligned with them.
    """
    if not rows.num_rows or not key:
        return rows.slice(0, 0).append_column(DELETE_FLAG, pa.array([], pa.bool_()))
    indexed = rows.select(list(key)).append_column(_INDEX, pa.array(range(rows.num_rows), pa.int64()))
    last = indexed.group_by(list(key), use_threads=False).aggregate([(_INDEX, "max")])
    chosen = last.column(f"{_INDEX}_max").combine_chunks().sort()
    return rows.take(chosen).append_column(DELETE_FLAG, deletes.take(chosen))
