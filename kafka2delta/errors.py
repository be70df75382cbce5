"""The error tree of kafka2delta.

::

    Kafka2DeltaError
     ├── ConfigError          bad configuration; the CLI exits with code 2
     ├── MessageError         one message cannot be handled; it becomes a dead letter
     ├── RetryableError       storage or broker hiccup; back off and retry, offsets stay put
     ├── CommitConflict       another writer moved a partition's txn version; resync from the log
     ├── SchemaChanged        someone else changed the table's schema; rebuild the stages and replay
     └── FatalError           the daemon cannot go on; exit non-zero

Third-party exceptions are caught only in their adapter (``kafka.py``, ``writer.py``) and
re-raised as one of these with ``raise ... from exc``.
"""

from __future__ import annotations


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

    def __init__(self, stage: str, reason: str) -> None:
        super().__init__(f"{stage}: {reason}")
        self.stage = stage
        self.reason = reason


class RetryableError(Kafka2DeltaError):
    """A transient failure of storage or the broker. Retry with backoff; never a dead letter."""


class CommitConflict(Kafka2DeltaError):
    """The table's txn version of some partitions is not the one this batch started from."""

    def __init__(self, partitions: dict[int, int | None]) -> None:
        moved = ", ".join(f"{p}->{v}" for p, v in sorted(partitions.items()))
        super().__init__(f"txn versions moved under us for partitions {moved}")
        self.partitions = partitions


class SchemaChanged(Kafka2DeltaError):
    """The table's schema is not the one the buffered rows were fitted to (another writer changed it)."""

    def __init__(self, uri: str, schema: object) -> None:
        super().__init__(f"the schema of {uri} changed under us")
        self.schema = schema


class FatalError(Kafka2DeltaError):
    """The daemon cannot go on (for example a committed offset vanished and the policy is 'fail')."""
