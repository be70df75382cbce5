"""Tables made by their first commit: a route without a schema writes a table that does not exist yet, and
:class:`DeferredTable` creates it from the first rows (or the first MERGE's changes) it commits.
:func:`open_delta_table` gives a route its table edge: opened, created from a schema, or deferred."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from deltalake import DeltaTable
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import DeltaError, TableNotFoundError

from kafka2delta.changes import DELETE_FLAG, ChangeOptions
from kafka2delta.errors import RetryableError, SchemaChanged, TableNotCreated
from kafka2delta.records import OffsetRange, TopicPartition
from kafka2delta.writer import DeltaWriter, LegacyTxnId, TxnId, check_rows

if TYPE_CHECKING:
    from deltalake.transaction import AddAction

    from kafka2delta.encoded_rows import EncodedFile

logger = logging.getLogger(__name__)


class DeferredTable:
    """A table that does not exist yet and has no configured schema (a route without ``schema``): it is created
    by its first commit with rows, from their schema (what the pipeline took from the first batch). Until then
    it holds no txn, so its partitions start at their start mark (written by a flush that could not create it:
    ``Positions.mark_unmade``), else at ``kafka.auto_offset_reset``; another writer creating it first
    is seen at the next refresh, or at our first commit (a schema change, as for any table)."""

    def __init__(
        self,
        uri: str,
        storage_options: Mapping[str, str],
        txn_id: TxnId,
        compression: str,
        checkpoint_interval: int,
        partition_by: Iterable[str],
        legacy_txn_id: LegacyTxnId | None = None,
    ) -> None:
        self._uri = uri
        self._options = dict(storage_options)
        self._txn_id = txn_id
        self._legacy_txn_id = legacy_txn_id
        self._compression = compression
        self._checkpoint_interval = checkpoint_interval
        self._partition_by = list(partition_by)
        self._writer: DeltaWriter | None = None
        self.schema: pa.Schema = pa.schema([])

    @property
    def uri(self) -> str:
        return self._uri

    @property
    def version(self) -> int:
        """The table's version; -1 while it does not exist."""
        return self._writer.version if self._exists() and self._writer is not None else -1

    def refresh_schema(self) -> pa.Schema:
        if self._exists():
            assert self._writer is not None
            self.schema = self._writer.refresh_schema()
        return self.schema

    def committed_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]:
        if self._exists():
            assert self._writer is not None
            return self._writer.committed_offsets(partitions)
        return dict.fromkeys(partitions)

    def write_files(self, tp: TopicPartition, offsets: OffsetRange, rows: pa.Table) -> list[AddAction]:
        return self._created(rows.schema).write_files(tp, offsets, rows)

    def put_file(self, tp: TopicPartition, offsets: OffsetRange, encoded: EncodedFile) -> list[AddAction]:
        return self._created(encoded.schema).put_file(tp, offsets, encoded)

    def check_rows(self, rows: pa.Table) -> None:
        check_rows(rows, self._compression)

    def commit(
        self,
        actions: Sequence[AddAction],
        expected: Mapping[TopicPartition, int | None],
        versions: Mapping[TopicPartition, int],
        metadata: dict[str, Any],
    ) -> int:
        if not self._exists():
            raise TableNotCreated(self._uri)
        assert self._writer is not None
        version = self._writer.commit(actions, expected, versions, metadata)
        self.schema = self._writer.schema
        return version

    def commit_evolution(
        self,
        rows: pa.Table,
        expected: Mapping[TopicPartition, int | None],
        versions: Mapping[TopicPartition, int],
        metadata: dict[str, Any],
    ) -> int:
        if not rows.num_rows and not self._exists():
            raise TableNotCreated(self._uri)
        writer = self._created(rows.schema)
        version = writer.commit_evolution(rows, expected, versions, metadata)
        self.schema = writer.schema
        return version

    def merge(
        self,
        changes: pa.Table,
        options: ChangeOptions,
        expected: Mapping[TopicPartition, int | None],
        versions: Mapping[TopicPartition, int],
        metadata: dict[str, Any],
        *,
        evolve: bool,
    ) -> int:
        """The first MERGE creates the table from the changes' columns, the key columns ``not null``."""
        exists = self._exists()
        if not changes.num_rows and not exists:
            raise TableNotCreated(self._uri)
        columns = [f.with_nullable(f.name not in options.key) for f in changes.schema if f.name != DELETE_FLAG]
        writer = self._created(pa.schema(columns))
        # A table just created from the changes' columns has them all: the MERGE adds none.
        version = writer.merge(changes, options, expected, versions, metadata, evolve=evolve and exists)
        self.schema = writer.schema
        return version

    @property
    def last_merge(self) -> dict[str, Any]:
        return self._writer.last_merge if self._writer is not None else {}

    def _exists(self) -> bool:
        if self._writer is None:
            try:
                self._writer = DeltaWriter(
                    DeltaTable(self._uri, storage_options=self._options),
                    self._uri,
                    self._options,
                    self._txn_id,
                    self._compression,
                    self._checkpoint_interval,
                    self._legacy_txn_id,
                )
            except TableNotFoundError:
                return False
            except (DeltaError, OSError) as exc:
                raise RetryableError(f"opening table {self._uri}: {exc}") from exc
        return True

    def _created(self, schema: pa.Schema) -> DeltaWriter:
        """The writer of the table, created from ``schema`` if it does not exist. SchemaChanged when its schema
        is not the one the committer last saw (or, when we create it, ``schema``): another writer created it after
        the committer's schema check, or won the create race (``mode="ignore"`` then opens its table), and an
        evolution commit would merge our rows into its columns, casting them (1.5 into a long column is 1)."""
        if self._exists():
            assert self._writer is not None
            writer, expected = self._writer, self.schema
        else:
            absent = [c for c in self._partition_by if c not in schema.names]
            if absent:
                # A Delta table's partition columns are fixed when it is made (found by review: silently dropped).
                logger.warning(
                    "%s: created without partition column(s) %s, which its first rows do not carry; a table's "
                    "partitioning cannot change later (give the route a schema to have them)",
                    self._uri,
                    absent,
                )
            writer = self._writer = DeltaWriter.open(
                self._uri,
                self._options,
                self._txn_id,
                self._compression,
                self._checkpoint_interval,
                schema,
                [c for c in self._partition_by if c in schema.names],
                self._legacy_txn_id,
            )
            expected = pa.schema(DeltaSchema.from_arrow(schema).to_arrow())  # as Delta keeps it (ms as us, …)
        if not writer.schema.equals(expected, check_metadata=False):
            self.schema = writer.schema
            raise SchemaChanged(self._uri, writer.schema)
        return writer


def open_delta_table(
    uri: str,
    storage_options: Mapping[str, str],
    txn_id: TxnId,
    compression: str,
    checkpoint_interval: int,
    create_schema: pa.Schema | None,
    partition_by: Iterable[str] = (),
    legacy_txn_id: LegacyTxnId | None = None,
    *,
    defer: bool = False,
) -> DeltaWriter | DeferredTable:
    """The table at ``uri``: opened, created from ``create_schema``, or, when it does not exist and there is
    no schema, a :class:`DeferredTable` (``defer``) or a ConfigError naming ``table.schema``."""
    if create_schema is None and defer:
        deferred = DeferredTable(
            uri, storage_options, txn_id, compression, checkpoint_interval, partition_by, legacy_txn_id
        )
        if deferred.version < 0:
            return deferred
    return DeltaWriter.open(
        uri, storage_options, txn_id, compression, checkpoint_interval, create_schema, partition_by, legacy_txn_id
    )
