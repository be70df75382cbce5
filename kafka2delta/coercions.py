"""Fit decoded rows to the table schema (stage ``coerce``), column by column on Arrow arrays.

The Delta table's schema is the authority. A value that cannot be converted, or a null in a
required column, sends that message (not the batch) to the dead letters with the column named.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from kafka2delta.batches import StageResult, isolate_failures
from kafka2delta.errors import MessageError

STAGE = "coerce"
_ZONE_SUFFIX = r"(Z|z|[+-]\d\d(:?\d\d)?)$"


def _to_timestamp(values: pa.Array, target: pa.TimestampType) -> pa.Array:
    """RFC 3339 strings, with or without a zone; without one a value is taken as UTC."""
    if target.tz is None or not pa.types.is_string(values.type):
        return pc.cast(values, target)
    has_zone = pc.fill_null(pc.match_substring_regex(values, _ZONE_SUFFIX), False)
    null_strings = pa.nulls(len(values), pa.string())
    zoned = pc.cast(pc.if_else(has_zone, values, null_strings), target)
    local = pc.cast(pc.cast(pc.if_else(has_zone, null_strings, values), pa.timestamp(target.unit)), target)
    return pc.if_else(has_zone, zoned, local)


def coerce_column(name: str, values: pa.Array, target: pa.Field) -> pa.Array:
    """Convert one column; raises ValueError naming the column and the value Arrow rejected."""
    try:
        if values.type == target.type:
            converted = values
        elif pa.types.is_timestamp(target.type):
            converted = _to_timestamp(values, target.type)
        else:
            converted = pc.cast(values, target.type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise ValueError(f"column {name!r}: {exc}") from exc
    if not target.nullable and converted.null_count:
        raise ValueError(f"column {name!r} is required but the message has no value for it")
    return converted


def coerce(rows: pa.Table, schema: pa.Schema) -> StageResult:
    """Return ``rows`` in the table schema, plus the rows that could not be converted."""

    def convert(chunk: list[int]) -> pa.Table:
        taken = rows if len(chunk) == rows.num_rows else rows.take(pa.array(chunk, pa.int64()))
        columns = []
        for target in schema:
            if target.name in taken.column_names:
                values = taken.column(target.name).combine_chunks()
            else:
                values = pa.nulls(taken.num_rows, target.type)
            columns.append(coerce_column(target.name, values, target))
        return pa.Table.from_arrays(columns, schema=schema)

    pieces, failures = isolate_failures(list(range(rows.num_rows)), convert, (ValueError,))
    table = pa.concat_tables([piece for _, piece in pieces]) if pieces else schema.empty_table()
    return StageResult(
        rows=table,
        indices=[index for chunk, _ in pieces for index in chunk],
        failures=[(index, MessageError(STAGE, str(exc))) for index, exc in failures],
    )
