"""The error tree of kafka2delta.

::

    Kafka2DeltaError
     ├── ConfigError          bad configuration; the CLI exits with code 2
     ├── MessageError         one message cannot be handled; it becomes a dead letter (with its stage)
     ├── RowsRejected         Parquet refused particular rows of a batch; they become dead letters (stage write)
     ├── RowGroupRefused      Parquet refused rows encoded while buffered; read the partition again, rows kept as Arrow
     ├── RetryableError       storage or broker hiccup; back off and retry, offsets stay put
     ├── CommitConflict       another writer moved a partition's txn version; resync from the log
     ├── SchemaChanged        someone else changed the table's schema; rebuild the stages and replay
     ├── TableNotCreated      a table with no configured schema has no row yet to be created from; commit later
     └── FatalError           the daemon cannot go on; exit non-zero

Exceptions of the libraries that reach outside the process are caught only in the edge that calls the
library, and re-raised as one of these with ``raise ... from exc``: ``kafka.py`` (confluent-kafka: the
consumer and the dead-letter producer), ``writer.py``, ``deferred_tables.py`` and ``txn_versions.py``
(deltalake, Parquet, pyarrow's file systems), ``registry.py`` (HTTP) and ``registry_glue.py`` (botocore),
``coordinator.py`` (ZooKeeper, lock files), ``status.py`` (the HTTP server), ``config/`` (the config file and
the files secrets are read from), the independent checker's ``verify*.py`` (it reads the topic and the tables
with clients of its own) and ``spark/`` (PySpark and py4j). The stages catch the errors of the libraries that
parse an expression or decode and encode one batch in memory (jmespath, pyarrow, fastavro, protobuf:
``transforms/``, ``serialization/``, ``coercions/``, ``changes/``, ``encoded_rows.py``, ``dictionaries.py``),
and the read of ``format.avro_schema_file`` at start; they turn them into a ``MessageError`` naming the
message, a ``ConfigError`` naming the key, or another error of this tree.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka2delta.records import Stage, TopicPartition

if TYPE_CHECKING:
    import pyarrow as pa


class Kafka2DeltaError(Exception):
    """Root of every error this package raises on purpose."""


class ConfigError(Kafka2DeltaError):
    """The configuration is invalid. The message names the key at fault."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}")
        self.key = key
        self.problem = problem


class MessageError(Kafka2DeltaError):
    """A single message failed a stage; it goes to the dead letters, the stream goes on."""

    def __init__(self, stage: Stage, reason: str) -> None:
        super().__init__(f"{stage}: {reason}")
        self.stage: Stage = stage
        self.reason = reason


class RowsRejected(Kafka2DeltaError):
    """Parquet refused some rows of a batch (never the whole batch for one bad row): they become
    dead letters (stage ``write``) and the rest is written again."""

    def __init__(self, failures: list[tuple[int, Exception]]) -> None:
        super().__init__(f"{len(failures)} rows could not be written as Parquet")
        self.failures = failures
        """(row position in the batch, the error) per refused row."""


class RowGroupRefused(Kafka2DeltaError):
    """Parquet refused a row group encoded while it was buffered (:mod:`kafka2delta.encoded_rows`). The groups
    encoded before it are lost with the writer, so the loop reads the partition again from its tables' versions
    and keeps the lane's rows as Arrow until their commit, which finds the rows at fault (dead letters)."""

    def __init__(self, reason: str, tp: TopicPartition | None = None, table: str = "") -> None:
        super().__init__(reason if tp is None else f"{tp} → {table}: {reason}")
        self.reason = reason
        self.tp = tp
        self.table = table


class RetryableError(Kafka2DeltaError):
    """A transient failure of storage or the broker. Retry with backoff; never a dead letter."""


class CommitConflict(Kafka2DeltaError):
    """The table's txn version of some partitions is not the one this batch started from."""

    def __init__(self, partitions: dict[TopicPartition, int | None]) -> None:
        moved = ", ".join(f"{tp}->{v}" for tp, v in sorted(partitions.items()))
        super().__init__(f"txn versions moved under us for partitions {moved}")
        self.partitions = partitions


class SchemaChanged(Kafka2DeltaError):
    """The table's schema is not the one the buffered rows were fitted to (another writer changed it)."""

    def __init__(self, uri: str, schema: pa.Schema) -> None:
        super().__init__(f"the schema of {uri} changed under us")
        self.schema = schema
        """The table's schema now."""


class TableNotCreated(Kafka2DeltaError):
    """A flush holds no row for a table that does not exist yet and has no configured schema: nothing is
    committed to it (its dead letters are); the partitions' offsets are marked in the dead-letter table, then
    committed with their first rows."""

    def __init__(self, uri: str) -> None:
        super().__init__(f"{uri} does not exist yet and this flush holds no row to create it from")


class FatalError(Kafka2DeltaError):
    """The daemon cannot go on (for example a committed offset vanished and the policy is 'fail')."""
