"""Checks that a stage's fast (Arrow) lane declines a row or agrees with its reference lane."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pytest

from kafka2delta.coercions import CoercedTable, CoercionOptions, coerce_document, coerce_table
from kafka2delta.errors import MessageError


def check_fast_lane(
    documents: Sequence[dict[str, Any]], table: pa.Table, schema: pa.Schema, options: CoercionOptions
) -> CoercedTable:
    """coerce_table on ``table`` (row i holds documents[i]) declines or agrees with coerce_document."""
    result = coerce_table(table, schema, options)
    assert result.rows.schema == schema
    assert result.rows.num_rows == len(result.kept)
    assert result.kept == sorted(result.kept) and result.fallback == sorted(result.fallback)
    assert sorted(result.kept + result.fallback) == list(range(table.num_rows))
    unknown = 0
    for output_row, position in enumerate(result.kept):
        try:
            row, dropped = coerce_document(documents[position], schema, options)
        except MessageError as exc:
            pytest.fail(f"fast lane kept row {position} ({documents[position]!r}) that the reference rejects: {exc}")
        expected = pa.Table.from_pylist([row], schema=schema).to_pylist()
        assert result.rows.slice(output_row, 1).to_pylist() == expected, documents[position]
        unknown += dropped
    assert result.unknown_fields == unknown
    return result


def normalized(value: Any) -> Any:
    """Arrow cannot tell a missing field from a null one: compare documents without null fields
    (and NaN as a marker, since NaN != NaN)."""
    if isinstance(value, float) and value != value:
        return "NaN"
    if isinstance(value, dict):
        return {name: normalized(item) for name, item in value.items() if item is not None}
    if isinstance(value, list):
        return [normalized(item) for item in value]
    return value
