"""Change events → current-state tables (``table.mode = "upsert"``) and change logs (``"changelog"``).

``options`` (what makes a table an upsert table), ``connect`` (Kafka Connect/Debezium schemas and logical
types → Arrow), ``envelope`` (one event → a :class:`Change`: upsert or delete of a key), ``decoder`` (the
deserialize stage of an upsert table) and ``collapse`` (a flush's changes → the last change per key, the
MERGE source). The MERGE itself is the Delta edge's (:meth:`kafka2delta.writer.DeltaWriter.merge`).
"""

from kafka2delta.changes.collapse import last_changes, last_changes_of
from kafka2delta.changes.decoder import ChangeDeserializer
from kafka2delta.changes.envelope import Change, debezium_change, plain_change
from kafka2delta.changes.options import (
    BEFORE_COLUMN,
    CHANGE_COLUMNS,
    CHANGELOG_METADATA,
    CHANGELOG_ORDER,
    DELETE_FLAG,
    DELETED_COLUMN,
    UNAVAILABLE_VALUE,
    ChangeOptions,
)

__all__ = [
    "BEFORE_COLUMN",
    "CHANGELOG_METADATA",
    "CHANGELOG_ORDER",
    "CHANGE_COLUMNS",
    "DELETED_COLUMN",
    "DELETE_FLAG",
    "UNAVAILABLE_VALUE",
    "Change",
    "ChangeDeserializer",
    "ChangeOptions",
    "debezium_change",
    "last_changes",
    "last_changes_of",
    "plain_change",
]
