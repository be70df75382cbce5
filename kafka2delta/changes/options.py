"""What makes a table an upsert table: its key, its envelope, its delete mode, its change columns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import pyarrow as pa

CHANGE_COLUMNS: dict[str, tuple[str, pa.DataType]] = {
    "op": ("_op", pa.string()),
    "source_ts": ("_source_ts", pa.timestamp("us", tz="UTC")),
    "lsn": ("_lsn", pa.int64()),
}
"""``table.change_columns`` → the column each names, and its type: the change's op (``c``, ``r``, ``u``,
``d``), when the source made it (``source.ts_ms``), and the source position (``source.lsn``)."""
DELETED_COLUMN = "_deleted"
"""The column of ``delete_mode = "soft"``: true on a row whose key was deleted."""
UNAVAILABLE_VALUE = "__debezium_unavailable_value"
"""Debezium's placeholder (``unavailable.value.placeholder``) for a TOASTed value an update left unchanged
(PostgreSQL without ``REPLICA IDENTITY FULL``): the row keeps the value it has."""
DELETE_FLAG = "__k2d_delete"
"""The MERGE source's column that tells a delete from an upsert (never a table column)."""


@dataclass(frozen=True, kw_only=True)
class ChangeOptions:
    """``table.mode = "upsert"`` for one table."""

    key: tuple[str, ...]
    envelope: Literal["none", "debezium"] = "none"
    delete_mode: Literal["hard", "soft"] = "hard"
    change_columns: tuple[str, ...] = ()

    def extra_columns(self) -> dict[str, pa.DataType]:
        """The columns the change adds to its row (change columns, and ``_deleted`` when soft)."""
        columns = {CHANGE_COLUMNS[name][0]: CHANGE_COLUMNS[name][1] for name in self.change_columns}
        if self.delete_mode == "soft":
            columns[DELETED_COLUMN] = pa.bool_()
        return columns

    def table_columns(self) -> dict[str, str]:
        """The extra columns as ``table.schema`` type strings (added to a configured schema)."""
        names = {pa.string(): "string", pa.timestamp("us", tz="UTC"): "timestamp", pa.int64(): "long"}
        names[pa.bool_()] = "boolean"
        return {column: names[data_type] for column, data_type in self.extra_columns().items()}
