"""The errors of the Spark jobs, in the package's tree (``kafka2delta.errors``)::

    Kafka2DeltaError
     ├── RetryableError
     │    └── ConflictingCommit    Delta refused the job's commit (a concurrent writer); the next turn retries
     └── FatalError
          ├── SparkJobError        Spark or Delta failed otherwise (the message names the step)
          ├── CheckpointMismatch   the table holds a later txn version of the job than its checkpoint's batch
          └── TableNotWritable     the table needs features delta-rs cannot write; the jobs refuse to touch it

Spark's exceptions (``PySparkException``, ``Py4JJavaError``) are caught where a job calls Spark and re-raised
as one of these with ``raise ... from exc`` (:func:`translate`).
"""

from __future__ import annotations

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


class ConflictingCommit(RetryableError):
    """A Delta commit of the job lost to a concurrent writer (nothing of it landed)."""

    def __init__(self, step: str, detail: str) -> None:
        super().__init__(f"{step}: conflicting commit: {detail}")
        self.step = step
        self.detail = detail


class SparkJobError(FatalError):
    """Spark or Delta failed a step of a job."""


class CheckpointMismatch(FatalError):
    """A job's micro-batch is older than what the table already applied under the job's txnAppId: its
    checkpoint is not the one that wrote those commits (restored, replaced, or shared by two jobs)."""


class TableNotWritable(FatalError):
    """The table requires writer features that the ingest daemon (delta-rs) cannot write."""


def _summary(text: str, limit: int = 600) -> str:
    """The useful head of a JVM error: its first lines, without the stack frames."""
    lines = [line for line in text.strip().splitlines() if line.strip() and not line.lstrip().startswith("at ")]
    head = " | ".join(lines[:4])
    return head if len(head) <= limit else head[: limit - 1] + "…"


def is_conflict(exc: BaseException) -> bool:
    text = str(exc)
    return any(marker in text for marker in CONFLICT_MARKERS)


def translate(exc: BaseException, step: str) -> ConflictingCommit | SparkJobError:
    """Our error for a Spark/py4j exception raised during ``step``."""
    if is_conflict(exc):
        marker = next(m for m in CONFLICT_MARKERS if m in str(exc))
        return ConflictingCommit(step, f"{marker.rstrip('_')}: {_summary(str(exc), 300)}")
    return SparkJobError(f"{step} failed: {type(exc).__name__}: {_summary(str(exc))}")
