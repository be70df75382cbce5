"""Which columns of a file Parquet should dictionary-encode (pure: a function of the rows).

Parquet's writer dictionary-encodes every column until a column chunk's dictionary passes 1 MiB, then falls back
to plain encoding for the rest of it. For a column whose values are all distinct (the Kafka offset, an event id, a
microsecond timestamp) that attempt is pure cost: in a 1M-row file its hash table grew to ~32 MB before the
fallback (memray, the 250-B catch-up's peak), and its dictionary pages came out larger than plain ones (900k rows
of the bench's events: offset 3.65 MB against 3.38 plain, id 4.23 against 4.17). So a column whose sampled values
are nearly all distinct is written plain from the start, and every other column keeps its dictionary: a column of a
bounded domain (a user id of 100k values: 2.19 MB against 3.39 plain) gains from it even when a small sample of
it looks distinct, which is why the sample is large and the bar high.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

SAMPLE_ROWS = 65_536
"""Rows looked at per column: the first ones of the file."""
DISTINCT_SHARE = 0.9
"""A sampled column with more distinct values than this share of its non-null values is written plain."""
MIN_SAMPLE = 1024
"""Files with fewer non-null values in a column keep its dictionary (too few to judge, too small to matter)."""

_CACHED_SCHEMAS = 256
_leaf_paths: dict[pa.Schema, tuple[str, ...]] = {}


def dictionary_columns(rows: pa.Table) -> list[str] | bool:
    """``use_dictionary`` for :func:`pyarrow.parquet.write_table`: the leaf column paths to dictionary-encode,
    or True (all) when no column is nearly distinct or the paths cannot be matched to Parquet's."""
    expected = parquet_leaf_paths(rows.schema)
    leaves = dict(_struct_leaves(rows))
    if not set(leaves) <= set(expected):  # a name Parquet would spell otherwise: leave every column as it was
        return True
    plain = {path for path, values in leaves.items() if _nearly_distinct(values)}
    if not plain:
        return True
    return [path for path in expected if path not in plain]


def parquet_leaf_paths(schema: pa.Schema) -> tuple[str, ...]:
    """The dotted paths Parquet gives the leaf columns of ``schema`` (``items.list.element.sku``), as its writer
    names them (read back from an empty file, once per schema)."""
    paths = _leaf_paths.get(schema)
    if paths is None:
        sink = pa.BufferOutputStream()
        pq.write_table(schema.empty_table(), sink)
        parquet_schema = pq.ParquetFile(pa.BufferReader(sink.getvalue())).schema
        paths = tuple(parquet_schema.column(i).path for i in range(len(parquet_schema)))
        if len(_leaf_paths) >= _CACHED_SCHEMAS:  # a daemon's tables have few schemas; never let them pile up
            _leaf_paths.clear()
        _leaf_paths[schema] = paths
    return paths


def _struct_leaves(rows: pa.Table) -> Iterator[tuple[str, pa.ChunkedArray]]:
    """The sampled values of every leaf reached through structs only (lists and maps keep their dictionaries)."""
    for field, column in zip(rows.schema, rows.columns, strict=True):
        yield from _leaves(field.name, field.type, column.slice(0, SAMPLE_ROWS))


def _leaves(path: str, kind: pa.DataType, values: pa.ChunkedArray) -> Iterator[tuple[str, pa.ChunkedArray]]:
    if pa.types.is_struct(kind):
        for index in range(kind.num_fields):
            child = kind.field(index)
            yield from _leaves(f"{path}.{child.name}", child.type, pc.struct_field(values, [index]))
    elif not pa.types.is_nested(kind) and not pa.types.is_boolean(kind):  # Parquet never dictionary-encodes booleans
        yield path, values


def _nearly_distinct(values: pa.ChunkedArray) -> bool:
    present = len(values) - values.null_count
    if present < MIN_SAMPLE:
        return False
    try:
        distinct = _distinct_count(values.drop_null())
    except pa.ArrowException:
        # A type Arrow cannot sort (views, dictionaries), or a sample too large to copy into one array (2 GiB of
        # strings): only an encoding is at stake, so keep the dictionary, as Parquet would by default.
        return False
    return bool(distinct > DISTINCT_SHARE * present)


def _distinct_count(present: pa.ChunkedArray) -> int:
    """Distinct values, counted as the unequal neighbours of a sorted copy. Arrow's ``count_distinct`` grows a hash
    table of ~28 MB for 65,536 int64 values (~19 MB for strings), and it ran at the first row group of each
    partition, at the catch-up's peak RSS (memray); the sort takes ~1.3 MB more than the copy, and less time.
    NaN never equals NaN in the comparison, so NaNs are counted apart, as one value (as ``count_distinct`` does)."""
    nan = 0
    if pa.types.is_floating(present.type):
        is_nan = pc.is_nan(present)
        nan = int(pc.any(is_nan).as_py() or False)
        present = present.filter(pc.invert(is_nan)) if nan else present
    if len(present) == 0:
        return nan
    ordered = pc.take(present, pc.sort_indices(present)).combine_chunks()
    return nan + 1 + int(pc.sum(pc.not_equal(ordered[1:], ordered[:-1])).as_py() or 0)
