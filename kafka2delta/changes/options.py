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
BEFORE_COLUMN = "_before"
"""``table.before_image`` of a changelog table: the change's before image (Debezium's ``before``), a struct."""
CHANGELOG_METADATA = ("partition", "offset")
"""The Kafka coordinates every changelog row carries (``kafka_partition``, ``kafka_offset``: metadata columns)."""
CHANGELOG_ORDER = ("_lsn", "kafka_partition", "kafka_offset")
"""How ``jobs apply-changes`` orders the changes of one key: by source position (``_lsn``, when the changelog
has it; a null counts as -1), then by Kafka partition and offset."""


@dataclass(frozen=True, kw_only=True)
class ChangeOptions:
    """``table.mode = "upsert"`` or ``"changelog"`` for one table."""

    key: tuple[str, ...]
    mode: Literal["upsert", "changelog"] = "upsert"
    """``upsert``: each flush is one MERGE of the last change per key. ``changelog``: every change is appended
    as a row (deletes too, with their key only), for ``jobs apply-changes`` to apply."""
    envelope: Literal["none", "debezium"] = "none"
    delete_mode: Literal["hard", "soft"] = "hard"
    """``changelog``: not a column of the changelog; how ``jobs apply-changes`` deletes by default."""
    change_columns: tuple[str, ...] = ()
    decimal_handling: Literal["auto", "precise", "string"] = "auto"
    """How a schema-less change's text reads in a decimal column (``format.decimal_handling``)."""
    before_image: bool = False
    """``changelog`` with the Debezium envelope: the ``before`` image as the struct column ``_before``."""

    @property
    def upsert(self) -> bool:
        """True when the table is merged into (current state); False for an append-only changelog."""
        return self.mode == "upsert"

    @property
    def takes_tombstones(self) -> bool:
        """Whether a tombstone is a change: the delete of its key, except in a Debezium changelog, where it only
        follows the delete event (for log compaction) and is a counted skip like any empty message."""
        return self.upsert or self.envelope != "debezium"

    def extra_columns(self) -> dict[str, pa.DataType]:
        """The columns the change adds to its row (change columns, and ``_deleted`` when soft)."""
        columns = {CHANGE_COLUMNS[name][0]: CHANGE_COLUMNS[name][1] for name in self.change_columns}
        if self.delete_mode == "soft" and self.upsert:
            columns[DELETED_COLUMN] = pa.bool_()
        return columns

    def table_columns(self) -> dict[str, str]:
        """The extra columns as ``table.schema`` type strings (added to a configured schema)."""
        names = {pa.string(): "string", pa.timestamp("us", tz="UTC"): "timestamp", pa.int64(): "long"}
        names[pa.bool_()] = "boolean"
        return {column: names[data_type] for column, data_type in self.extra_columns().items()}
