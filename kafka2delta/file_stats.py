"""Delta file statistics (numRecords, min/max, nullCount) of the top-level primitive columns (pure).

A file's statistics are gathered per piece of rows (:func:`extremes`: a whole file, or one row group of a file
encoded as its rows arrive), merged (:meth:`FileStats.merge`), and written once (:meth:`FileStats.to_json`).
A bound is left out rather than wrong: a truncated string maximum, a NaN, or a piece whose bound is unknown
while it holds values makes the file's bound unknown too.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

STATS_STRING_PREFIX = 32
"""Longest string bound written: a prefix is still a lower bound; a longer maximum is left out."""


@dataclass
class ColumnStats:
    nulls: int
    values: int
    """Non-null values."""
    low: Any = None
    high: Any = None
    """None with ``values`` > 0: the bound is unknown (left out)."""


@dataclass
class FileStats:
    rows: int = 0
    columns: dict[str, ColumnStats] = field(default_factory=dict)

    def merge(self, other: FileStats) -> FileStats:
        """The statistics of both pieces' rows together (their columns are the same)."""
        merged = FileStats(self.rows + other.rows)
        for name in [*self.columns, *(n for n in other.columns if n not in self.columns)]:
            one, two = self.columns.get(name), other.columns.get(name)
            if one is None or two is None:
                continue  # a column only one piece has a bound for: no bound (never happens within a file)
            merged.columns[name] = ColumnStats(
                one.nulls + two.nulls,
                one.values + two.values,
                _bound(one, two, "low", min),
                _bound(one, two, "high", max),
            )
        return merged

    def to_json(self) -> str:
        min_values = {n: _json_stat(c.low) for n, c in self.columns.items() if c.low is not None}
        max_values = {n: _json_stat(c.high) for n, c in self.columns.items() if c.high is not None}
        null_count = {n: c.nulls for n, c in self.columns.items()}
        return json.dumps(
            {"numRecords": self.rows, "minValues": min_values, "maxValues": max_values, "nullCount": null_count}
        )


def _bound(one: ColumnStats, two: ColumnStats, side: str, pick: Any) -> Any:
    bounds = [getattr(c, side) for c in (one, two) if c.values]
    if not bounds or any(b is None for b in bounds):
        return None  # no values, or one piece's bound is unknown
    return pick(bounds)


def extremes(table: pa.Table) -> FileStats:
    """The statistics of ``table``'s rows."""
    stats = FileStats(table.num_rows)
    for name, column in zip(table.column_names, table.columns, strict=True):
        kind = column.type
        if pa.types.is_nested(kind):
            continue
        column_stats = ColumnStats(column.null_count, len(column) - column.null_count)
        stats.columns[name] = column_stats
        if not column_stats.values or not (
            pa.types.is_integer(kind)
            or pa.types.is_floating(kind)
            or pa.types.is_string(kind)
            or pa.types.is_date(kind)
            or pa.types.is_timestamp(kind)
        ):
            continue
        found = pc.min_max(column)
        low, high = found["min"].as_py(), found["max"].as_py()
        if pa.types.is_timestamp(kind):
            # Stats are written in milliseconds (the minimum truncated): round the maximum up so it stays a bound.
            high = high + dt.timedelta(milliseconds=1) if high.microsecond % 1000 else high
        if pa.types.is_floating(kind) and (low != low or high != high):
            continue  # NaN has no JSON form
        if isinstance(low, str):
            low = low[:STATS_STRING_PREFIX]  # a prefix is still a lower bound
            if len(high) > STATS_STRING_PREFIX:
                high = None  # a truncated maximum would not be an upper bound
        column_stats.low, column_stats.high = low, high
    return stats


def file_stats(table: pa.Table) -> str:
    """Delta's ``stats`` JSON of a file holding ``table``'s rows."""
    return extremes(table).to_json()


def _json_stat(value: Any) -> Any:
    """A statistics value as Delta writes it: timestamps in milliseconds, ISO 8601."""
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        return value.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3]
    if isinstance(value, dt.date):
        return value.isoformat()
    return value
