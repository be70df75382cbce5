"""The errors of the Spark jobs, in the package's tree (``kafka2delta.errors``)::

    Kafka2DeltaError
     ├── RetryableError
     │    ├── ConflictingCommit    Delta refused the job's commit (a concurrent writer); the next turn retries
     │    └── SourceSchemaChanged  a table's schema changed under the job (a streaming query's Delta source,
     │                             or a table since a DataFrame over it was analysed: the daemon added a
     │                             column); the next turn reads the new schema
     └── FatalError
          ├── SparkJobError        Spark or Delta failed otherwise (the message names the step)
          ├── CheckpointMismatch   the table holds a later txn version of the job than its checkpoint's batch
          └── TableNotWritable     the table needs features delta-rs cannot write (or is Spark-only, or is
                                   another writer's); the jobs refuse to touch it

Spark's exceptions (``PySparkException``, ``Py4JJavaError``) are caught where a job calls Spark and re-raised
as one of these with ``raise ... from exc`` (:func:`translate`), naming the step and the table.
"""

from __future__ import annotations

from kafka2delta.config import without_credentials
from kafka2delta.errors import FatalError, RetryableError

# Delta's optimistic-concurrency failures: another commit landed between the job's read and its commit.
CONFLICT_MARKERS = (
    "ConcurrentAppendException",
    "ConcurrentDeleteReadException",
    "ConcurrentDeleteDeleteException",
    "ConcurrentTransactionException",
    "MetadataChangedException",
    "ProtocolChangedException",
    "DELTA_CONCURRENT_",
)

# A table's schema changed under the job; a new turn, with new DataFrames and queries, reads the new one:
# the Delta streaming source's "Detected schema change ... Please try restarting the query" error classes
# (DELTA_SCHEMA_CHANGED, DELTA_SCHEMA_CHANGED_WITH_VERSION …), and "The schema of your Delta table has changed
# in an incompatible way since your DataFrame or DeltaTable object was created" (a MERGE's or DELETE's table
# analysed before the daemon's commit that added a column).
SCHEMA_CHANGED_MARKERS = ("DELTA_SCHEMA_CHANGED", "DELTA_SCHEMA_CHANGE_SINCE_ANALYSIS")


class ConflictingCommit(RetryableError):
    """A Delta commit of the job lost to a concurrent writer (nothing of it landed)."""

    def __init__(self, step: str, detail: str) -> None:
        super().__init__(f"{step}: conflicting commit: {detail}")
        self.step = step
        self.detail = detail


class SourceSchemaChanged(RetryableError):
    """A table's schema changed under the job, before the step's commit: the Delta table a streaming
    query reads, after the query started (Delta fails the query with ``DELTA_SCHEMA_CHANGED*`` when it plans a
    micro-batch, before the batch runs), or a table since a DataFrame or DeltaTable over it was analysed
    (``DELTA_SCHEMA_CHANGE_SINCE_ANALYSIS``). A new query, with new DataFrames, reads the new schema."""

    def __init__(self, step: str, detail: str) -> None:
        super().__init__(f"{step}: a table's schema changed during the step: {detail}")
        self.step = step
        self.detail = detail


class SparkJobError(FatalError):
    """Spark or Delta failed a step of a job."""


class CheckpointMismatch(FatalError):
    """A job's micro-batch is older than what the table already applied under the job's txnAppId: its
    checkpoint is not the one that wrote those commits (restored, replaced, or shared by two jobs)."""


class TableNotWritable(FatalError):
    """The table requires writer features that the ingest daemon (delta-rs) cannot write, or it is not the job's
    to write: a Spark-only table for a daemon-safe job, another writer's table for ``apply-changes``."""


def _summary(text: str, limit: int = 600) -> str:
    """The useful head of a JVM error: its first lines, without the stack frames."""
    lines = [line for line in text.strip().splitlines() if line.strip() and not line.lstrip().startswith("at ")]
    head = " | ".join(lines[:4])
    return head if len(head) <= limit else head[: limit - 1] + "…"


def is_conflict(exc: BaseException) -> bool:
    text = str(exc)
    return any(marker in text for marker in CONFLICT_MARKERS)


def translate(exc: BaseException, step: str, table: str) -> ConflictingCommit | SourceSchemaChanged | SparkJobError:
    """Our error for a Spark/py4j exception raised during ``step`` on ``table`` (named without credentials)."""
    step = f"{step} on {without_credentials(table)}"
    if any(marker in str(exc) for marker in SCHEMA_CHANGED_MARKERS):
        return SourceSchemaChanged(step, _summary(str(exc), 300))
    if is_conflict(exc):
        marker = next(m for m in CONFLICT_MARKERS if m in str(exc))
        return ConflictingCommit(step, f"{marker.rstrip('_')}: {_summary(str(exc), 300)}")
    return SparkJobError(f"{step} failed: {type(exc).__name__}: {_summary(str(exc))}")
