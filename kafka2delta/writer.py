"""The Delta edge: Parquet files and ONE commit holding the files and the new txn offsets.

Files are named ``<topic>-<partition>-<first offset>-<last offset>-<uuid>.<codec>.parquet`` and each
commit's ``commitInfo`` carries ``kafka2delta: {app_id, topic, offsets: {partition: [first, last]}}``,
so every row traces back to Kafka. deltalake's exceptions are caught here and nowhere else.
"""

from __future__ import annotations

import copy
import datetime as dt
import logging
import re
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Self
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pa_ds
import pyarrow.fs as pa_fs
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction, WriterProperties, write_deltalake
from deltalake import Field as DeltaField
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.transaction import AddAction, RemoveAction

from kafka2delta import faults
from kafka2delta.bisection import isolate_failures
from kafka2delta.changes import DELETE_FLAG, ChangeOptions
from kafka2delta.changes.collapse import UNAVAILABLE_FLAG
from kafka2delta.config.sections import AZURE_SCHEMES, GCS_SCHEMES, s3_option_name
from kafka2delta.dictionaries import dictionary_columns
from kafka2delta.encoded_rows import DATA_ERRORS, EncodedFile
from kafka2delta.errors import (
    CommitConflict,
    ConfigError,
    FatalError,
    RetryableError,
    RowsRejected,
    SchemaChanged,
)
from kafka2delta.file_stats import file_stats
from kafka2delta.merging import merge_changes
from kafka2delta.offsets import CommitOutcome, classify_commit
from kafka2delta.records import OffsetRange, TopicPartition
from kafka2delta.schema import evolve as evolution_of
from kafka2delta.txn_versions import TxnVersions

TxnId = Callable[[TopicPartition], str]
"""The txn app id a table gives a topic partition (see :class:`kafka2delta.offsets.TxnIds`)."""
LegacyTxnId = Callable[[TopicPartition], str | None]
"""The id the table gave the partition before more topics could write it, if it differs."""
_HISTORY_LOOKED_AT = 1000
# The table property naming the topic that owned a table's legacy txn ids, set when they are first migrated.
LEGACY_OWNER_PROPERTY = "kafka2delta.legacyTxnTopic"

logger = logging.getLogger(__name__)

SPARK_ONLY_PROPERTY = "kafka2delta.sparkOnly"
"""A table property set (``true``) on the tables only Spark writes (``jobs apply-changes`` targets, with deletion
vectors): the daemon and the daemon-safe jobs (``mutate``, ``ttl``) refuse them."""


def is_spark_only(configuration: Mapping[str, str | None]) -> bool:
    """Whether a table's configuration marks it Spark-only (:data:`SPARK_ONLY_PROPERTY`)."""
    return str(configuration.get(SPARK_ONLY_PROPERTY) or "false").lower() == "true"


_HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
_PUT_SLICE = 4 * 1024 * 1024
_PATH_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:@ ")


def _table_schema(table: DeltaTable) -> pa.Schema:
    return pa.schema(table.schema().to_arrow())


def _partition_value(value: Any) -> str | None:
    """A partition value as the Delta protocol serialises it."""
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S.%f")
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _escape_path_name(value: str) -> str:
    """Hive-style escaping of a partition directory name (what Spark writes on disk)."""
    return "".join(c if c in _PATH_SAFE and c != " " else f"%{ord(c):02X}" for c in value)


def table_filesystem(uri: str, storage_options: Mapping[str, str]) -> tuple[pa_fs.FileSystem, str]:
    """The Arrow filesystem and root path of the table at ``uri``, built from the table's storage options (endpoint,
    credentials, region) as deltalake reads them: the daemon's Parquet files and the Spark jobs' listings of a
    table go where its log goes. ConfigError naming ``table.uri`` for a scheme it does not know."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return pa_fs.LocalFileSystem(), parsed.path if parsed.scheme else uri
    if parsed.scheme in ("s3", "s3a"):
        options = _s3_options(storage_options)
        endpoint = options.get("endpoint_url") or options.get("endpoint")
        scheme = None
        if endpoint:
            endpoint_parsed = urlparse(endpoint)
            scheme = endpoint_parsed.scheme or None
            endpoint = endpoint_parsed.netloc or endpoint
        filesystem = pa_fs.S3FileSystem(
            access_key=options.get("access_key_id"),
            secret_key=options.get("secret_access_key"),
            session_token=options.get("session_token") or options.get("token"),
            region=options.get("region") or options.get("default_region"),
            endpoint_override=endpoint,
            scheme=scheme or "https",
        )
        return filesystem, parsed.netloc + parsed.path
    if parsed.scheme in AZURE_SCHEMES + GCS_SCHEMES:
        # Through delta-rs's own object_store client, built from the same storage options as every DeltaTable
        # call (endpoint, credentials, retries): pyarrow's Azure and GCS filesystems take settings of their own
        # (GCS: no service-account key at all), which would have to be translated and could drift apart.
        from deltalake.fs import DeltaStorageHandler

        container = f"{parsed.scheme}://{parsed.netloc}"
        handler = DeltaStorageHandler(container, dict(storage_options))
        return pa_fs.PyFileSystem(handler), parsed.path.strip("/")
    raise ConfigError(
        "table.uri",
        f"unsupported scheme {parsed.scheme!r} (local paths, s3://, az:// or abfss:// and gs:// are supported)",
    )


def _s3_options(storage_options: Mapping[str, str]) -> dict[str, str]:
    """The S3 storage options by object_store's name with no ``aws_`` prefix, in lower case: deltalake takes
    ``AWS_ENDPOINT_URL``, ``aws_endpoint``, ``endpoint`` … alike, and the Parquet files must go where the log goes."""
    return {s3_option_name(key): value for key, value in storage_options.items()}


_COMMIT_FILE = re.compile(r"^(\d{20})\.json$")


def log_versions(uri: str, storage_options: Mapping[str, str]) -> list[int]:
    """The versions of the commit files in a table's ``_delta_log`` (sorted), read from storage."""
    filesystem, root = table_filesystem(uri, storage_options)
    selector = pa_fs.FileSelector(f"{root.rstrip('/')}/_delta_log", allow_not_found=True)
    try:
        infos = filesystem.get_file_info(selector)
    except OSError as exc:
        raise RetryableError(f"listing the log of {uri}: {exc}") from exc
    versions = [int(m.group(1)) for info in infos if (m := _COMMIT_FILE.match(info.base_name))]
    return sorted(versions)


def legacy_txn_owner(table: DeltaTable, uri: str) -> tuple[str, bool]:
    """The topic that wrote a table's one-topic txn ids (``<app_id>-<partition>``), and whether the table's property
    already names it (else its newest commits written with those ids do)."""
    owner = table.metadata().configuration.get(LEGACY_OWNER_PROPERTY)
    if owner:
        return str(owner), True
    for entry in table.history(_HISTORY_LOOKED_AT):
        info = entry.get("kafka2delta")
        # A commit with one-topic txn ids: before 0.2 (no "multi_topic"), or since, of a one-topic table.
        if isinstance(info, dict) and not info.get("multi_topic") and isinstance(info.get("topic"), str):
            return str(info["topic"]), False
    raise ConfigError(
        "table.app_id",
        f"{uri} holds txn ids of a single-topic configuration but no commit among its last "
        f"{_HISTORY_LOOKED_AT} says which topic wrote them: keep a configuration with one topic for this table",
    )


class DeltaWriter:
    """One handle on the table; every read of txn versions and every commit goes through it."""

    def __init__(
        self,
        table: DeltaTable,
        uri: str,
        storage_options: Mapping[str, str],
        txn_id: TxnId,
        compression: str,
        checkpoint_interval: int,
        legacy_txn_id: LegacyTxnId | None = None,
    ) -> None:
        self._table = table
        self._uri = uri
        self._txn_id = txn_id
        self._legacy_txn_id = legacy_txn_id
        self._legacy_owner: str | None = None
        self._migrating = False
        self._compression = compression
        self._checkpoint_interval = checkpoint_interval
        # The txn versions of a commit that landed but whose log refresh failed (the retry returns them).
        self._landed: dict[TopicPartition, int] | None = None
        self.last_merge: dict[str, Any] = {}
        """delta-rs's metrics of the last MERGE (files and rows touched), for logs and metrics."""
        self._filesystem, self._root = table_filesystem(uri, storage_options)
        self._txns = TxnVersions(self._filesystem, self._root)
        self.schema: pa.Schema = _table_schema(table)
        """The table schema as of the last refresh or commit of this writer."""
        self.partition_by: list[str] = list(table.metadata().partition_columns)
        retention = table.metadata().configuration.get("delta.setTransactionRetentionDuration")
        if retention:
            logger.warning(
                "table %s sets delta.setTransactionRetentionDuration=%s: the txn of a partition idle for longer "
                "expires and that partition would restart from kafka.auto_offset_reset",
                uri,
                retention,
            )

    @classmethod
    def open(
        cls,
        uri: str,
        storage_options: Mapping[str, str],
        txn_id: TxnId,
        compression: str,
        checkpoint_interval: int,
        create_schema: pa.Schema | None,
        partition_by: Iterable[str] = (),
        legacy_txn_id: LegacyTxnId | None = None,
    ) -> Self:
        """Open the table, creating it from ``create_schema`` when it does not exist."""
        options = dict(storage_options)
        try:
            table = DeltaTable(uri, storage_options=options)
        except TableNotFoundError as exc:
            if create_schema is None:
                raise ConfigError(
                    "table.schema", f"table {uri} does not exist and no schema is configured to create it"
                ) from exc
            try:
                table = DeltaTable.create(
                    uri, create_schema, mode="ignore", partition_by=list(partition_by) or None, storage_options=options
                )
            except DeltaError as create_exc:
                # Daemons started together race to create it: the loser's commit of version 0 fails ("protocol
                # changed"), and the table the winner created is the one to open.
                try:
                    table = DeltaTable(uri, storage_options=options)
                except (DeltaError, OSError):
                    raise RetryableError(f"creating table {uri}: {create_exc}") from create_exc
                logger.info("table %s was created by another writer meanwhile (%s)", uri, create_exc)
            else:
                logger.info("created table %s (partitioned by %s)", uri, list(partition_by) or "nothing")
        except (DeltaError, OSError) as exc:
            raise RetryableError(f"opening table {uri}: {exc}") from exc
        if is_spark_only(table.metadata().configuration):
            raise ConfigError(
                "table.uri",
                f"{uri} is written only by Spark ({SPARK_ONLY_PROPERTY} = true: the target of 'jobs apply-changes', "
                "with deletion vectors); the daemon writes the changelog table that job reads, not its target",
            )
        return cls(table, uri, options, txn_id, compression, checkpoint_interval, legacy_txn_id)

    @property
    def version(self) -> int:
        return self._table.version()

    @property
    def uri(self) -> str:
        return self._uri

    def refresh_schema(self) -> pa.Schema:
        """Read the newest table version and return its schema (also kept in :attr:`schema`)."""
        try:
            self._table.update_incremental()
        except (DeltaError, OSError) as exc:
            raise RetryableError(f"reading {self._uri}: {exc}") from exc
        self.schema = _table_schema(self._table)
        return self.schema

    def add_nullable_columns(self, fields: Sequence[pa.Field]) -> None:
        """Add nullable top-level columns to the table (one commit); rows written before read null there."""
        try:
            self._table.alter.add_columns([DeltaField.from_arrow(f) for f in fields])
        except (DeltaError, OSError) as exc:
            raise RetryableError(f"adding columns to {self._uri}: {exc}") from exc
        self.schema = _table_schema(self._table)

    def under_txn_ids(self, txn_id: TxnId) -> DeltaWriter:
        """This writer (the same handle) reading and committing other txn ids, with no legacy ones: the start marks
        the dead-letter table keeps for tables that do not exist yet (:meth:`DeadLetterTable.mark_starts`)."""
        view = copy.copy(self)
        view._txn_id, view._legacy_txn_id, view._landed = txn_id, None, None
        return view

    def committed_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]:
        """The txn versions of ``partitions`` in the newest table version."""
        try:
            self._table.update_incremental()
            app_ids = {tp: self._txn_id(tp) for tp in partitions}
            versions = self._txns.read(self._table, app_ids.values())
            found = {tp: versions[app_id] for tp, app_id in app_ids.items()}
            if self._legacy_txn_id is not None and not self._migrating:
                self._add_legacy_versions(found, self._legacy_txn_id)
            return found
        except (DeltaError, OSError) as exc:
            raise RetryableError(f"reading txn versions from {self._uri}: {exc}") from exc

    def _add_legacy_versions(self, found: dict[TopicPartition, int | None], legacy: LegacyTxnId) -> None:
        """A table written by one topic before more could write it holds ``<app_id>-<partition>`` ids: they
        are that topic's (the one its older commits name) until the new ``<app_id>-<topic>-<partition>``
        ids exist."""
        # Through the txn cache: a topic that never gets the new ids asks on every commit's check (found by review).
        legacy_ids = {tp: legacy_id for tp in found if found[tp] is None and (legacy_id := legacy(tp))}
        versions = self._txns.read(self._table, legacy_ids.values())
        older = {tp: versions[legacy_id] for tp, legacy_id in legacy_ids.items()}
        if not any(version is not None for version in older.values()):
            return
        recorded = True
        if self._legacy_owner is None:
            self._legacy_owner, recorded = legacy_txn_owner(self._table, self._uri)
        owned = {tp: version for tp, version in older.items() if tp.topic == self._legacy_owner and version is not None}
        found.update(owned)
        if owned or not recorded:
            # Named in a property at once, even by a process holding none of its partitions: the commits that name
            # it may be past the history looked at when one does (found by review).
            self._migrate(owned)

    def _migrate(self, versions: dict[TopicPartition, int]) -> None:
        """Copy legacy txn versions to the new ids, and name their owner topic in a table property, in one commit:
        later reads need no history (the commits naming the owner may be gone by then). Conditional like any
        commit: if another writer gave a partition its new id meanwhile, this does nothing (the next read sees
        it)."""
        owner = self._legacy_owner
        assert owner is not None
        self._migrating = True
        try:
            metadata = {"migrated_legacy_txn_ids": {str(tp): version for tp, version in sorted(versions.items())}}

            def run(properties: CommitProperties) -> None:
                self._table.alter.set_table_properties(
                    {LEGACY_OWNER_PROPERTY: owner}, raise_if_not_exists=False, commit_properties=properties
                )

            self._transaction(dict.fromkeys(versions), versions, metadata, run)
            logger.info("%s: one-topic txn ids are %s's (copied to ids naming it: %s)", self._uri, owner, versions)
        except CommitConflict:
            logger.info("%s: another writer moved the txn ids being migrated; using what it wrote", self._uri)
        except SchemaChanged as exc:
            logger.info("%s: txn ids not migrated this time (the schema changed: %s)", self._uri, exc.schema)
        finally:
            self._migrating = False

    def write_files(self, tp: TopicPartition, offsets: OffsetRange, rows: pa.Table) -> list[AddAction]:
        """Write the rows of one Kafka partition as Parquet (one file per table partition value).

        Raises :class:`RowsRejected` (row positions in ``rows``) when Parquet refuses particular rows,
        having written nothing, and :class:`RetryableError` when storage fails.
        """
        try:
            parts = self._split_by_partition(rows)
        except DATA_ERRORS as exc:
            raise RowsRejected(rejected_rows(rows, self._compression, exc)) from exc
        actions = []
        for values, part in parts:
            directory = "/".join(
                f"{column}={_HIVE_NULL if value is None else _escape_path_name(value)}"
                for column, value in values.items()
            )
            name = self._file_name(tp, offsets)
            relative = f"{directory}/{name}" if directory else name
            path = f"{self._root.rstrip('/')}/{relative}"
            try:
                if directory:
                    self._filesystem.create_dir(path.rsplit("/", 1)[0], recursive=True)
                pq.write_table(
                    part,
                    path,
                    filesystem=self._filesystem,
                    compression=self._compression,
                    row_group_size=1_000_000,
                    write_statistics=True,
                    use_dictionary=dictionary_columns(part),
                )
                size = self._filesystem.get_file_info(path).size
            except DATA_ERRORS as exc:
                raise RowsRejected(rejected_rows(rows, self._compression, exc)) from exc
            except OSError as exc:
                raise RetryableError(f"writing {path}: {exc}") from exc
            # The on-disk relative path: delta-rs percent-encodes it for the log itself.
            actions.append(AddAction(relative, size, values, int(time.time() * 1000), True, file_stats(part)))
        return actions

    def put_file(self, tp: TopicPartition, offsets: OffsetRange, encoded: EncodedFile) -> list[AddAction]:
        """Put a file encoded while its rows were buffered (unpartitioned tables). :class:`RetryableError` when
        storage fails."""
        name = self._file_name(tp, offsets)
        path = f"{self._root.rstrip('/')}/{name}"
        data = encoded.data
        try:
            # In slices through a buffer: a stream of delta-rs's object_store (Azure, GCS) takes bytes only, which
            # is what a buffer flush hands it (a large write would pass the Arrow buffer itself through).
            with pa.BufferedOutputStream(self._filesystem.open_output_stream(path), 2 * _PUT_SLICE) as out:
                for start in range(0, data.size, _PUT_SLICE):
                    out.write(data.slice(start, min(_PUT_SLICE, data.size - start)))
        except OSError as exc:
            raise RetryableError(f"writing {path}: {exc}") from exc
        return [AddAction(name, data.size, {}, int(time.time() * 1000), True, encoded.stats)]

    def _file_name(self, tp: TopicPartition, offsets: OffsetRange) -> str:
        unique = uuid.uuid4().hex[:12]
        return f"{tp.topic}-{tp.partition}-{offsets.first}-{offsets.last}-{unique}.{self._compression}.parquet"

    def check_rows(self, rows: pa.Table) -> None:
        check_rows(rows, self._compression)

    def _split_by_partition(self, rows: pa.Table) -> list[tuple[dict[str, str | None], pa.Table]]:
        if not self.partition_by:
            return [({}, rows)]
        keys = rows.select(self.partition_by).group_by(self.partition_by).aggregate([])
        parts = []
        for key in keys.to_pylist():
            mask = None
            for column, value in key.items():
                match = (
                    pc.is_null(rows[column])
                    if value is None
                    else pc.fill_null(pc.equal(rows[column], pa.scalar(value, rows.schema.field(column).type)), False)
                )
                mask = match if mask is None else pc.and_(mask, match)
            data_columns = [name for name in rows.column_names if name not in self.partition_by]
            parts.append(({c: _partition_value(v) for c, v in key.items()}, rows.filter(mask).select(data_columns)))
        return parts

    def commit(
        self,
        actions: Sequence[AddAction],
        expected: Mapping[TopicPartition, int | None],
        versions: Mapping[TopicPartition, int],
        metadata: dict[str, Any],
    ) -> int:
        """Commit ``actions`` with txn ``versions`` per partition, atomically. Returns the new version.

        ``expected`` holds the txn versions the batch started from; they are checked on the very
        snapshot the commit is made from, and delta-rs fails a concurrent commit of the same txn
        app id, so a zombie writer can never commit a range twice. The table schema is checked on
        that snapshot too: rows fitted to an older schema are never committed under a newer one.
        Raises :class:`CommitConflict` (partitions moved), :class:`SchemaChanged` or
        :class:`RetryableError` (nothing happened).
        """

        def run(properties: CommitProperties) -> None:
            self._table.create_write_transaction(
                list[AddAction | RemoveAction](actions),
                mode="append",
                schema=self._table.schema(),
                commit_properties=properties,
            )

        return self._transaction(expected, versions, metadata, run)

    def commit_evolution(
        self,
        rows: pa.Table,
        expected: Mapping[TopicPartition, int | None],
        versions: Mapping[TopicPartition, int],
        metadata: dict[str, Any],
    ) -> int:
        """Commit ``rows``, whose schema adds nullable columns (or nested fields) to the table's, in ONE
        commit holding the new schema, the files and the txns. delta-rs writes and names these files
        itself (``part-…``); the commit's ``kafka2delta`` metadata still records the offset ranges.
        """

        def run(properties: CommitProperties) -> None:
            write_deltalake(
                self._table,
                rows,
                mode="append",
                schema_mode="merge",
                partition_by=self.partition_by or None,
                writer_properties=WriterProperties(compression=self._compression.upper()),  # type: ignore[arg-type]
                commit_properties=properties,
            )

        return self._transaction(expected, versions, metadata, run)

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
        """Apply ``changes`` (the last change per key) with one MERGE whose commit holds the txns (upsert
        tables; ``evolve``: the changes add columns or struct members, committed just before in a commit of their
        own: delta-rs's MERGE with ``merge_schema`` nulls the whole struct in the rows it copies when a struct
        gains a member (found by review). That commit holds no txn and no file, so a replay after a crash
        between the two finds the columns there and merges as usual)."""
        stats: dict[str, Any] = {}

        def run(properties: CommitProperties) -> None:
            if evolve:  # after the txn and schema checks (another writer's change is then SchemaChanged)
                self._add_columns_of(changes)
            before = self._table.version()
            with faults.watching_files("inside_merge", self._table.table_uri, before + 1):
                stats.update(
                    merge_changes(
                        self._table,
                        changes,
                        options,
                        partition_by=self.partition_by,
                        compression=self._compression,
                        properties=properties,
                    )
                )
            if self._table.version() == before:
                # delta-rs commits nothing when the MERGE changes nothing (deletes of keys the table lacks, a
                # flush of only dead letters): the txns must move all the same (found by review: the next
                # flush took the unmoved txn for another writer's and resynced, forever at a fixed boundary).
                self._table.create_write_transaction(
                    [], mode="append", schema=self._table.schema(), commit_properties=properties
                )

        version = self._transaction(expected, versions, metadata, run)
        self.last_merge = stats
        return version

    def _add_columns_of(self, changes: pa.Table) -> None:
        """Add the columns and struct members ``changes`` has that the table lacks (nullable; a column the table
        has keeps its nullability), in one commit without files."""
        nullable = {f.name: f.nullable for f in self.schema}
        columns = [  # not the MERGE source's own columns (found by review: a TOAST flag became a table column)
            f.with_nullable(nullable.get(f.name, True))
            for f in changes.schema
            if f.name != DELETE_FLAG and not f.name.startswith(UNAVAILABLE_FLAG)
        ]
        if not evolution_of(self.schema, pa.schema(columns), inferred=False).added:
            return  # an earlier attempt of this flush added them
        # A failure here fails the MERGE's transaction (its txns unmoved): retried, or SchemaChanged on the retry's
        # check when another writer's change made it fail.
        write_deltalake(
            self._table,
            pa.schema(columns).empty_table(),
            mode="append",
            schema_mode="merge",
            partition_by=self.partition_by or None,
            commit_properties=CommitProperties(custom_metadata={"kafka2delta": {"operation": "add columns"}}),
        )  # the handle is now at this commit: no other writer's change slips into self.schema
        self.schema = _table_schema(self._table)

    def _transaction(
        self,
        expected: Mapping[TopicPartition, int | None],
        versions: Mapping[TopicPartition, int],
        metadata: dict[str, Any],
        run: Callable[[CommitProperties], None],
    ) -> int:
        in_log = self.committed_offsets(versions)
        landed, self._landed = self._landed, None
        if landed == dict(versions) and all(in_log[p] == v for p, v in versions.items()):
            # Our previous attempt of this very commit landed and only reading the log after it failed
            # (_after_commit). Known from this writer's own state: the same txn versions in the log could
            # also be another writer's commit of the same range (a zombie must get CommitConflict then).
            logger.info("an earlier attempt of this commit to %s landed (txn versions are ours)", self._uri)
            return self._after_commit(versions)
        moved = {p: v for p, v in in_log.items() if v != expected[p]}
        if moved:
            raise CommitConflict(moved)
        latest = _table_schema(self._table)
        if not latest.equals(self.schema, check_metadata=False):
            self.schema = latest
            raise SchemaChanged(self._uri, latest)
        properties = CommitProperties(
            # The version the txn check read: with the one this commit lands at, how many other writers' commits
            # came between (delta-rs's commitInfo has no readVersion for this kind of commit).
            custom_metadata={"kafka2delta": {**metadata, "read_version": self._table.version()}},
            app_transactions=[Transaction(self._txn_id(tp), v) for tp, v in versions.items()],
            max_commit_retries=50,
        )
        try:
            run(properties)
        except (DeltaError, OSError) as exc:
            # A failed or ambiguous commit: the log, not the exception, says what happened.
            conflict = isinstance(exc, CommitFailedError)
            logger.warning("commit to %s failed (%s: %s); re-reading txn versions", self._uri, type(exc).__name__, exc)
            try:
                in_log = self.committed_offsets(versions)
            except RetryableError as read_exc:
                raise RetryableError(f"commit failed ({exc}) and the log cannot be read ({read_exc})") from exc
            outcome = classify_commit(dict(expected), dict(versions), in_log)
            if all(o is CommitOutcome.COMMITTED for o in outcome.values()):
                logger.info("the failed commit did land (txn versions are ours)")
                return self._after_commit(versions)
            moved = {p: in_log[p] for p, o in outcome.items() if o is CommitOutcome.MOVED}
            if moved:
                raise CommitConflict(moved) from exc
            if any(o is CommitOutcome.COMMITTED for o in outcome.values()):
                raise FatalError(
                    f"a commit landed for some partitions only: {outcome}; the Delta log is inconsistent"
                ) from exc
            raise RetryableError(f"{'conflicting' if conflict else 'failed'} commit to {self._uri}: {exc}") from exc
        return self._after_commit(versions)

    def _after_commit(self, versions: Mapping[TopicPartition, int]) -> int:
        try:
            self._table.update_incremental()
        except (DeltaError, OSError) as exc:
            # The commit landed; the caller retries and the next attempt finds it landed (self._landed).
            self._landed = dict(versions)
            raise RetryableError(f"committed to {self._uri}, then reading the log failed: {exc}") from exc
        self.schema = _table_schema(self._table)
        version = self._table.version()
        if version % self._checkpoint_interval == 0:
            try:
                self._table.create_checkpoint()
                logger.info("wrote checkpoint at version %d", version)
            except (DeltaError, OSError) as exc:
                # A missing checkpoint only slows log reads; the next interval tries again.
                logger.warning("checkpoint at version %d failed: %s", version, exc)
        return version

    def scan(self, columns: list[str], predicate: pa_ds.Expression) -> pa.Table:
        """Rows of the newest version matching ``predicate`` (files pruned by partition values and stats)."""
        try:
            self._table.update_incremental()
            return self._table.to_pyarrow_dataset().to_table(columns=columns, filter=predicate)
        except (DeltaError, OSError) as exc:
            raise RetryableError(f"reading {self._uri}: {exc}") from exc

    def history(self, limit: int) -> list[dict[str, Any]]:
        try:
            self._table.update_incremental()
            return self._table.history(limit)
        except (DeltaError, OSError) as exc:
            raise RetryableError(f"reading history of {self._uri}: {exc}") from exc


def check_rows(rows: pa.Table, compression: str) -> None:
    """Raise :class:`RowsRejected` when Parquet refuses some rows (for commits delta-rs writes itself)."""
    try:
        pq.write_table(rows, pa.BufferOutputStream(), compression=compression)
    except DATA_ERRORS as exc:
        raise RowsRejected(rejected_rows(rows, compression, exc)) from exc


def rejected_rows(rows: pa.Table, compression: str, cause: Exception) -> list[tuple[int, Exception]]:
    """Find the rows Parquet refuses by writing halves to memory (a few rows cost k·log2(n) tries)."""

    def attempt(chunk: list[int]) -> None:
        pq.write_table(rows.take(pa.array(chunk, pa.int64())), pa.BufferOutputStream(), compression=compression)

    _, failures = isolate_failures(list(range(rows.num_rows)), attempt, DATA_ERRORS)
    if not failures:
        # The whole batch failed but no row does on its own: not a row problem, so not a dead letter.
        raise FatalError(f"Parquet refused a batch but none of its rows alone: {cause}") from cause
    return failures
