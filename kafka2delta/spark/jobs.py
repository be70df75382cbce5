"""The streaming jobs, run one coordinator turn at a time: ``jobs mutate`` and ``jobs ttl`` (request topics from
Kafka change the table), and the turn loop they share with ``jobs apply-changes`` (:mod:`.apply_changes`).

A turn: take the coordinator's turn (lock + predecessor; none: skip, try at the next trigger), run the query
with ``Trigger.AvailableNow`` (every request available now, in micro-batches of at most
``jobs.max_requests_per_batch``; the checkpoint in ``<jobs.checkpoint_dir>/<job>`` records them), then, for
``ttl``, the retention delete; register and release. A turn that fails (a conflicting commit when the table's
other writers are not coordinated) releases without registering; the next turn replays the unfinished batch
from the checkpoint, and the txn versions make that replay change nothing that already landed.

The txn versions are batch ids, so they are tied to the checkpoint: the job commits with
``txnAppId = <app_id>-<job name>`` (the checkpoint is ``<jobs.checkpoint_dir>/<job name>``), refuses to start a
new checkpoint while the table holds a txn version of that app id, and a micro-batch older than the table's
version raises :class:`~kafka2delta.spark.errors.CheckpointMismatch` rather than being skipped as a replay.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from kafka2delta.config import Config, without_credentials
from kafka2delta.coordinator import Coordinator, CoordinatorError
from kafka2delta.errors import ConfigError, Kafka2DeltaError, RetryableError
from kafka2delta.spark.errors import ConflictingCommit, SourceSchemaChanged, SparkJobError, translate
from kafka2delta.spark.kafka_source import kafka_source_options
from kafka2delta.spark.mutations import (
    GROUP_STRIDE,
    BatchResult,
    RetentionType,
    Target,
    apply_gdpr_deletes,
    apply_mutations,
    retention_bound,
    retention_delete,
    retention_predicate,
)
from kafka2delta.spark.report import Report
from kafka2delta.spark.session import spark_path
from kafka2delta.spark.tables import TableStats, add_actions, check_writable, dead_letter_tables, is_table, table_stats

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

logger = logging.getLogger(__name__)

Handler = Callable[["SparkSession", list[tuple[int, int, bytes | None]], int], BatchResult]


@dataclass
class TurnStats:
    """Counters over a job's turns."""

    turns: int = 0
    skipped_turns: int = 0
    conflicts: int = 0
    """Turns failed by a retryable error (a conflicting commit, the source's schema changing under the query)."""
    batches: int = 0
    skip_reasons: dict[str, int] = field(default_factory=dict)


@dataclass
class JobStats(TurnStats):
    """Counters over the turns of ``mutate`` / ``ttl``."""

    result: BatchResult = field(default_factory=BatchResult)
    retention_deleted: int = 0
    dead_letters_deleted: int = 0


StatsT = TypeVar("StatsT", bound=TurnStats)


def checkpoint_location(config: Config, job: str, table_uri: str = "") -> str:
    """``<jobs.checkpoint_dir>/<job>``; default ``<table>_checkpoints/<job>``, the table being ``table_uri`` (a
    job's own target) or ``table.uri``."""
    base = config.jobs.checkpoint_dir or f"{(table_uri or config.table.uri).rstrip('/')}_checkpoints"
    return f"{spark_path(base).rstrip('/')}/{job}"


def may_hold_rows_before(actions: pa.Table, column: str, bound: dt.datetime | dt.date) -> bool:
    """False when the files' min statistics of ``column`` (``actions``: :func:`~.tables.add_actions`) prove that no
    row is below ``bound`` (:func:`~.mutations.retention_bound`: then the retention delete has nothing to do).
    A timestamp without a time zone in the statistics is UTC, as the session's."""
    if actions.num_rows == 0:
        return False
    name = f"min.{column}"
    if name not in actions.column_names:
        return True
    for low in actions.column(name).to_pylist():
        if isinstance(low, dt.datetime) and isinstance(bound, dt.datetime):
            if (low if low.tzinfo else low.replace(tzinfo=dt.UTC)) < bound:
                return True
        elif isinstance(low, dt.date) and not isinstance(low, dt.datetime) and not isinstance(bound, dt.datetime):
            if low < bound:
                return True
        else:
            return True  # no statistics, or not of the column's type: cannot tell
    return False


_DAEMON_TXN_SUFFIX = re.compile(r".*-\d+")


def check_job_name(name: str) -> None:
    """A job's txnAppId is ``<app_id>-<job name>``; the daemon's are ``<app_id>-<partition>``,
    ``<app_id>-<topic>-<partition>`` and ``<app_id>-dlq-<partition>``: a name that is a number or ends in
    ``-<number>`` could be one of them (``orders-3``), and the job's txn versions would then be taken for a
    partition's offsets, or the other way round. ConfigError naming ``--job-name``."""
    if name.isdigit() or _DAEMON_TXN_SUFFIX.fullmatch(name):
        raise ConfigError(
            "--job-name",
            f"{name!r} could collide with the ingest daemon's txn ids (<app_id>-<partition>, "
            "<app_id>-<topic>-<partition>): the job commits as <app_id>-<job name>, so a name must not be a number "
            "or end in '-<number>' (e.g. apply-orders, not orders-3)",
        )


def job_table(config: Config, job: str) -> str:
    """The table ``jobs mutate``/``ttl`` take their turns on (the coordinator's resource, the report's table): the
    one table ``table.uri`` names (a ``{topic}`` template filled with the only topic). When it names none (empty:
    the routes name the tables) or many (a template several topics fill), ``ttl`` with only
    ``jobs.dead_letter_retention_days`` runs on the daemon's dead-letter table (its deletes reach every
    dead-letter table); anything else is a ConfigError naming what needs one table."""
    if config.main_table_uri:
        return config.main_table_uri
    jobs, uri = config.jobs, config.table.uri
    if job == "mutate":
        key, what = "table.uri", "'jobs mutate' changes one table"
    elif jobs.ttl_topic:
        key, what = "jobs.ttl_topic", "'jobs ttl' deletes the subjects of jobs.ttl_topic from one table"
    elif jobs.retention_column:
        key, what = "jobs.retention_column", "'jobs ttl' deletes the rows past jobs.retention_days from one table"
    else:
        return config.dead_letter_table_uri
    names = f"is a {{topic}} template several topics fill ({without_credentials(uri)})" if uri else "is empty"
    alone = "" if job == "mutate" else " (its dead-letter retention alone needs none: it runs on the dead-letter table)"
    raise ConfigError(key, f"{what}, and table.uri {names}: run it with a config whose table.uri is that table{alone}")


def check_not_changelog(config: Config, job: str) -> None:
    """``jobs mutate``/``ttl`` change ``table.uri``; refuse it when the config writes it as a changelog table: their
    UPDATE/DELETE is a data-change commit, which stops the ``jobs apply-changes`` streaming query reading the
    changelog (Delta's streaming source refuses a source whose rows were changed or deleted) and never reaches the
    current-state table. ConfigError naming ``table.mode`` (or the route's ``mode``). A ``ttl`` that only deletes
    dead letters changes no table of the config's."""
    from kafka2delta.spark.apply_changes import changelog_route

    uri = config.main_table_uri
    if job == "ttl" and config.jobs.dead_letters_only:
        return
    where = changelog_route(config, uri) if uri else None
    if where is None:
        return
    raise ConfigError(
        f"{where}.mode" if where != "table" else "table.mode",
        f"{uri} is a changelog table (mode = 'changelog'): 'jobs {job}' would update or delete its rows, "
        "a data-change commit that stops the 'jobs apply-changes' query reading it and never reaches the "
        "current-state table it keeps. Erase or change the data in the source database instead: Debezium's "
        "changes reach the changelog and, through apply-changes, its target (a delete, with --delete-mode hard, "
        "removes the row there); run mutate/ttl only with a config whose table.uri is an append or upsert table",
    )


class TurnJob(Generic[StatsT]):
    """A streaming job run turn by turn under the coordinator: the loop ``mutate``, ``ttl`` and ``apply-changes``
    share. A subclass says what a turn does (:meth:`work`, its query with ``Trigger.AvailableNow``), what it
    checks once before the first turn (:meth:`prepare`) and before and after each turn's work
    (:meth:`check_target`), whether its source has anything new (:meth:`source_pending`), and what it reports."""

    retryable: tuple[type[Exception], ...] = (ConflictingCommit, SourceSchemaChanged, CoordinatorError, RetryableError)
    """What fails a turn and not the job: a commit lost to another writer, the source's schema changing while
    the query read it, a ZooKeeper blip, storage failing (a Delta log that could not be read). The next turn runs
    the query again from the checkpoint."""

    def __init__(
        self,
        session: SparkSession,
        config: Config,
        coordinator: Coordinator,
        *,
        name: str,
        target: Target,
        checkpoint: str,
        stats: StatsT,
        step: str,
    ) -> None:
        check_job_name(name)
        # Its own SQL conf (the txn settings of idempotent DML), sharing the SparkContext: several jobs may run
        # in one process (tests, notebooks) without seeing each other's settings.
        self.session = session.newSession()
        self.config = config
        self.name = name
        self.txn_app_id = f"{config.app_id}-{name}"
        """Delta's txnAppId of the job's commits: one per checkpoint (``<jobs.checkpoint_dir>/<job name>``)."""
        self.coordinator = coordinator
        self.target = target
        self.checkpoint = checkpoint
        self.stats = stats
        self._step = step
        self._prepared = False
        self._batch_error: Exception | None = None
        """The error a micro-batch raised: Spark wraps it in a StreamingQueryException whose text is a Python
        traceback, so the turn raises this one instead (its message names the batch)."""

    # -- what a subclass says

    def prepare(self) -> None:
        """Checks made once, before the first turn (ConfigError naming the key if the job cannot run)."""

    def check_target(self) -> None:
        """Before and after each turn's work: the table is one the job may write."""
        check_writable(self.target.uri, self.target.storage_options)

    def work(self) -> None:
        """The turn's work, under the coordinator's turn (raises Spark's exceptions; :meth:`run_turn` translates)."""
        raise NotImplementedError

    def source_pending(self, offsets: list[str]) -> bool:
        """Whether the source holds anything past ``offsets`` (the checkpoint's last planned batch, one JSON line
        per source); raise or return True when unsure."""
        return True

    def batch_of(self, txn_version: int) -> int:
        """The micro-batch that committed ``txn_version``."""
        return txn_version

    def restart_advice(self) -> str:
        """How to start over when a new checkpoint is refused (the end of :meth:`check_checkpoint`'s message)."""
        return "run with a --job-name never used on this table"

    def details(self) -> dict[str, Any]:
        """The report's job-specific figures."""
        return {}

    def rows_changed(self) -> int:
        return 0

    def table_stats(self) -> TableStats | None:
        return table_stats(self.target.uri, self.target.storage_options)

    # -- the checkpoint

    def _checkpoint_batches(self, directory: str = "offsets") -> list[int]:
        """The batch ids planned (``offsets``) or done (``commits``) in the checkpoint (Hadoop's filesystem: any
        scheme)."""
        context = self.session.sparkContext
        jvm, hadoop_conf = context._jvm, context._jsc.hadoopConfiguration()  # no public API for Hadoop paths
        assert jvm is not None
        path = jvm.org.apache.hadoop.fs.Path(f"{self.checkpoint}/{directory}")
        fs = path.getFileSystem(hadoop_conf)
        if not fs.exists(path):
            return []
        return [int(name) for name in (st.getPath().getName() for st in fs.listStatus(path)) if name.isdigit()]

    def check_checkpoint(self) -> None:
        """Refuse a new checkpoint (no batch yet) while the table holds a txn version of the job's txnAppId: its
        batch ids would restart at 0, below that version, and every batch would be skipped as a replay."""
        applied = self.target.applied_version(self.txn_app_id)
        if applied < 0 or self._checkpoint_batches():
            return
        raise ConfigError(
            "jobs.checkpoint_dir",
            f"the checkpoint {self.checkpoint} is new (no batch yet), but {self.target.uri} already has txn version "
            f"{applied} of {self.txn_app_id} (batch {self.batch_of(applied)} of an earlier checkpoint): a new "
            "checkpoint restarts batch ids at 0 and its batches would be skipped as replays. The checkpoint is "
            "<jobs.checkpoint_dir>/<--job-name>: point jobs.checkpoint_dir and --job-name back at the one that "
            f"wrote that version; or, {self.restart_advice()}",
        )

    def pending_work(self) -> bool:
        """False only when the checkpoint shows everything of the source processed (an idle turn then costs
        no streaming query); True when unsure."""
        location = self.checkpoint
        if "://" in location and not location.startswith("file:"):
            return True
        root = Path(location.removeprefix("file:"))

        def last(directory: Path) -> int:
            return max((int(p.name) for p in directory.glob("[0-9]*") if p.name.isdigit()), default=-1)

        planned, committed = last(root / "offsets"), last(root / "commits")
        if planned < 0 or planned > committed:  # never ran, or a planned batch to (re)run
            return True
        try:
            return self.source_pending((root / "offsets" / str(planned)).read_text().splitlines()[2:])
        except (OSError, ValueError, IndexError, KeyError, TypeError, AttributeError, Kafka2DeltaError) as exc:
            logger.debug("%s: cannot tell whether the source has more (%s); running the query", self.name, exc)
            return True

    # -- turns

    def _prepare_once(self) -> None:
        if not self._prepared:
            self.prepare()
            self._prepared = True

    def run_turn(self) -> bool:
        """One turn; False if the coordinator gave none. Raises ConflictingCommit / SparkJobError (a retryable
        error, :attr:`retryable`, is counted in ``stats.conflicts``)."""
        from py4j.protocol import Py4JError
        from pyspark.errors import PySparkException

        self._prepare_once()
        turn = self.coordinator.turn(self.name)
        if turn is None:
            self.stats.skipped_turns += 1
            reason = self.coordinator.last_skip.split(" (")[0]
            self.stats.skip_reasons[reason] = self.stats.skip_reasons.get(reason, 0) + 1
            return False
        with turn:
            try:
                self.check_target()
                try:
                    self._batch_error = None
                    self.work()
                except (PySparkException, Py4JError) as exc:
                    error: Exception = self._batch_error or translate(exc, self._step, self.target.uri)
                    self._batch_error = None
                    raise error from exc
                self.check_target()
            except self.retryable:
                self.stats.conflicts += 1
                raise
        self.stats.turns += 1
        return True

    def run(
        self,
        *,
        available_now: bool = False,
        max_turns: int | None = None,
        max_attempts: int = 5,
        stop: threading.Event | None = None,
        interval_s: float | None = None,
    ) -> Report:
        """Turns until ``stop`` is set, ``max_turns`` turns ran, or (``available_now``) one turn completed.

        A conflicting commit (or the coordinator's store failing, or the source's schema changing under the query,
        or storage failing) fails the turn, not the job: the next turn retries (``available_now``: at most
        ``max_attempts`` turns, then it is raised). Storage failing ``max_attempts`` turns in a row is raised in a
        continuous run too: a refusal that lasts (a revoked credential) must stop the job, not warn forever.
        Other errors are raised. A run that ends (``stop``, ``max_turns``, a skipped ``available_now`` retry) while
        the last turn that ran had failed reports ``failed`` with its error, whatever turns the coordinator gave
        none since: what that turn was to do is not done (the next run replays it).
        """
        stop = stop or threading.Event()
        self._prepare_once()
        interval = self.config.jobs.trigger_interval_s if interval_s is None else interval_s
        started = time.monotonic()
        before = self.table_stats()
        attempts = storage_failures = 0
        status, reason = "ok", ""
        # The error of the last turn that ran, if it failed (a turn the coordinator gave none does not make up for it).
        last_failure: Exception | None = None
        while not stop.is_set():
            attempts += 1
            conflict = False
            try:
                ran = self.run_turn()
                storage_failures = 0
                if ran:
                    last_failure = None
            except self.retryable as exc:
                logger.warning("%s: %s; retrying at the next turn", self.name, exc)
                # Conflicts and schema changes are RetryableErrors too, and normal with other writers: not counted.
                lasting = isinstance(exc, RetryableError) and not isinstance(
                    exc, (ConflictingCommit, SourceSchemaChanged)
                )
                storage_failures = storage_failures + 1 if lasting else 0
                if (available_now and attempts >= max_attempts) or storage_failures >= max_attempts:
                    raise
                ran, conflict, last_failure = False, True, exc
            if available_now and ran:
                break
            if available_now and not conflict:
                status, reason = "skipped", self.coordinator.last_skip
                break
            if max_turns is not None and attempts >= max_turns:
                break
            stop.wait(min(interval, 1.0) if available_now else interval)
        if last_failure is not None:
            status, reason = "failed", f"the last turn failed: {last_failure}"
            logger.error("%s: stopping after a failed turn: %s", self.name, last_failure)
        after = self.table_stats()
        details: dict[str, Any] = {
            "turns": self.stats.turns,
            "skipped_turns": self.stats.skipped_turns,
            "conflicts": self.stats.conflicts,
            "batches": self.stats.batches,
            **self.details(),
        }
        if self.stats.skip_reasons:
            details["skip_reasons"] = dict(self.stats.skip_reasons)
        return Report(
            self.name,
            self.target.uri,
            status=status,
            reason=reason,
            files_before=before.files if before else None,
            files_after=after.files if after else None,
            bytes_before=before.bytes if before else None,
            bytes_after=after.bytes if after else None,
            rows_before=before.rows if before else None,
            rows_after=after.rows if after else None,
            rows_changed=self.rows_changed(),
            duration_s=time.monotonic() - started,
            details=details,
        )


class StreamingJob(TurnJob[JobStats]):
    """``jobs mutate`` or ``jobs ttl``: requests from a Kafka topic, run turn by turn."""

    def __init__(
        self,
        session: SparkSession,
        config: Config,
        job: str,
        coordinator: Coordinator,
        *,
        job_name: str | None = None,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        if job not in ("mutate", "ttl"):
            raise ValueError(job)
        check_not_changelog(config, job)
        name = job_name or job
        uri = job_table(config, job)
        super().__init__(
            session,
            config,
            coordinator,
            name=name,
            target=Target(uri, config.table.storage_options),
            checkpoint=checkpoint_location(config, name, uri),
            stats=JobStats(),
            step=f"jobs {job}",
        )
        self.job = job
        self._clock = clock
        self._retention_type: RetentionType = "timestamp"
        """The type of ``jobs.retention_column`` (read by :meth:`check_table`, before the first turn)."""
        jobs = config.jobs
        self.topic = jobs.mutation_topic if job == "mutate" else jobs.ttl_topic
        if job == "mutate" and not self.topic:
            raise ConfigError("jobs.mutation_topic", "is required by 'jobs mutate'")
        if job == "ttl":
            if not self.topic and not jobs.retention_column and not jobs.dead_letter_retention_days:
                if not config.main_table_uri:  # the other two would be refused (job_table)
                    raise ConfigError(
                        "jobs.dead_letter_retention_days",
                        "is what 'jobs ttl' can do when table.uri names no one table: set it, or run ttl with a "
                        "config whose table.uri is one table",
                    )
                raise ConfigError(
                    "jobs.ttl_topic",
                    "'jobs ttl' needs jobs.ttl_topic, jobs.retention_column or jobs.dead_letter_retention_days",
                )
            if self.topic and not jobs.subject_column:
                raise ConfigError("jobs.subject_column", "is required with jobs.ttl_topic")

    # -- one micro-batch (called by Spark in this driver process)

    def _handler(self) -> Handler:
        txn_app_id, topic = self.txn_app_id, self.topic
        if self.job == "mutate":
            return lambda session, messages, batch_id: apply_mutations(
                session, self.target, messages, batch_id, txn_app_id, topic
            )
        column = self.config.jobs.subject_column
        return lambda session, messages, batch_id: apply_gdpr_deletes(
            session, self.target, messages, batch_id, txn_app_id, topic, column
        )

    def _for_each_batch(self, handler: Handler) -> Callable[[DataFrame, int], None]:
        def process(batch: DataFrame, batch_id: int) -> None:
            rows = batch.collect()
            messages = [(int(r["partition"]), int(r["offset"]), r["value"]) for r in rows]
            if not messages:
                return
            try:
                result = handler(batch.sparkSession, messages, batch_id)
            except Kafka2DeltaError as exc:
                self._batch_error = exc  # its message names the batch, group, txn version and requests
                raise
            self.stats.batches += 1
            self.stats.result.add(result)

        return process

    def _run_query(self) -> None:
        jobs, kafka = self.config.jobs, self.config.kafka
        reader = (
            self.session.readStream.format("kafka")
            .options(**kafka_source_options(kafka.bootstrap_servers, kafka.settings))  # librdkafka's, in Java
            .option("subscribe", self.topic)
            .option("startingOffsets", jobs.starting_offsets)
            .option("maxOffsetsPerTrigger", str(jobs.max_requests_per_batch))
        )
        query = (
            reader.load()
            .selectExpr("partition", "offset", "value")
            .writeStream.foreachBatch(self._for_each_batch(self._handler()))
            .option("checkpointLocation", self.checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()

    def prepare(self) -> None:
        if not self.config.main_table_uri and not is_table(self.target.uri, self.target.storage_options):
            raise ConfigError(
                "dead_letters.table_uri",
                f"no Delta table at {self.target.uri}, the daemon's dead-letter table, where this 'jobs ttl' takes "
                "its turns (table.uri names no one table): the daemon makes it when it starts",
            )
        self.check_table()

    def check_table(self) -> None:
        """The [jobs] columns exist in the table with usable types (ConfigError naming the key if not)."""
        from deltalake import DeltaTable as RsTable
        from deltalake.schema import PrimitiveType

        jobs = self.config.jobs
        wanted: list[tuple[str, str, tuple[str, ...]]] = []
        if self.job == "ttl" and self.topic:
            wanted.append(("jobs.subject_column", jobs.subject_column, ()))
        if self.job == "ttl" and jobs.retention_column:
            wanted.append(("jobs.retention_column", jobs.retention_column, ("timestamp", "timestamp_ntz", "date")))
        if not wanted:
            return
        check_writable(self.target.uri, self.target.storage_options)  # ConfigError if there is no table
        storage_options = dict(self.target.storage_options) or None
        fields = {f.name: f.type for f in RsTable(self.target.uri, storage_options=storage_options).schema().fields}
        for key, column, types in wanted:
            if column not in fields:
                raise ConfigError(
                    key, f"{column!r} is not a top-level column of {self.target.uri} (columns: {', '.join(fields)})"
                )
            kind = fields[column]
            simple = kind.type if isinstance(kind, PrimitiveType) else type(kind).__name__
            if not isinstance(kind, PrimitiveType) or (types and simple not in types):
                expected = " or ".join(types) if types else "a scalar type"
                raise ConfigError(key, f"column {column!r} of {self.target.uri} is {simple}, expected {expected}")
            if key == "jobs.retention_column":
                self._retention_type = cast(RetentionType, simple)

    def batch_of(self, txn_version: int) -> int:
        return txn_version // GROUP_STRIDE if self.job == "mutate" else txn_version

    def restart_advice(self) -> str:
        return (
            f"to read the request topic again from jobs.starting_offsets ({self.config.jobs.starting_offsets}) "
            "under a new txnAppId, run with a --job-name never used on this table"
        )

    def source_pending(self, offsets: list[str]) -> bool:
        """Whether the request topic holds requests past the checkpoint's last planned offsets."""
        from kafka2delta.kafka import high_watermarks, topic_partitions

        done = {int(p): int(o) for p, o in json.loads(offsets[0]).get(self.topic, {}).items()}
        kafka = self.config.kafka
        partitions = topic_partitions(kafka.bootstrap_servers, self.topic, kafka.settings)
        highs = high_watermarks(kafka.bootstrap_servers, self.topic, partitions, kafka.settings)
        return any(high > done.get(partition, 0) for partition, high in highs.items())

    def _retention(self) -> None:
        jobs = self.config.jobs
        column, column_type = jobs.retention_column, self._retention_type
        cutoff = self._clock() - dt.timedelta(days=jobs.retention_days)
        predicate = retention_predicate(column, column_type, cutoff)
        lows = add_actions(self.target.uri, self.target.storage_options)
        if not may_hold_rows_before(lows, column, retention_bound(column_type, cutoff)):
            logger.debug("retention: no file holds %s (log statistics)", predicate)
            return
        deleted = retention_delete(self.session, self.target.path, predicate)
        self.stats.retention_deleted += deleted
        logger.info("retention: %d rows with %s deleted", deleted, predicate)

    def _dead_letter_retention(self) -> None:
        """Dead letters recorded more than ``jobs.dead_letter_retention_days`` ago, from every dead-letter table that
        exists (a DELETE by their ``date`` partition: whole files, no rewrite; the daemon's appends to today's
        partition do not conflict with it)."""
        from py4j.protocol import Py4JError
        from pyspark.errors import PySparkException

        cutoff = self._clock() - dt.timedelta(days=self.config.jobs.dead_letter_retention_days)
        predicate = retention_predicate("date", "date", cutoff)
        options = self.config.table.storage_options
        for uri in dead_letter_tables(self.config):
            if not is_table(uri, options):
                continue  # the daemon makes it at start
            try:
                deleted = retention_delete(self.session, Target(uri, options).path, predicate)
            except (PySparkException, Py4JError) as exc:  # named by the dead-letter table, not table.uri
                raise translate(exc, "jobs ttl (dead-letter retention)", uri) from exc
            self.stats.dead_letters_deleted += deleted
            logger.info("dead-letter retention: %d dead letters with %s deleted from %s", deleted, predicate, uri)

    def work(self) -> None:
        if self.topic and self.pending_work():
            self.check_checkpoint()
            self._run_query()
        if self.job == "ttl" and self.config.jobs.retention_column:
            self._retention()
        if self.job == "ttl" and self.config.jobs.dead_letter_retention_days:
            self._dead_letter_retention()

    def details(self) -> dict[str, Any]:
        result = self.stats.result
        details: dict[str, Any] = {
            "requests": result.requests,
            "invalid": result.invalid,
            "commits": result.commits,
            "replayed_commits_skipped": result.skipped_commits,
            "rows_updated": result.rows_updated,
            "rows_deleted": result.rows_deleted,
        }
        if self.job == "ttl":
            details["retention_deleted"] = self.stats.retention_deleted
            details["dead_letters_deleted"] = self.stats.dead_letters_deleted
        return details

    def rows_changed(self) -> int:
        result = self.stats.result
        return (
            result.rows_updated + result.rows_deleted + self.stats.retention_deleted + self.stats.dead_letters_deleted
        )


__all__ = [
    "JobStats",
    "SparkJobError",
    "StreamingJob",
    "TurnJob",
    "TurnStats",
    "check_job_name",
    "check_not_changelog",
    "checkpoint_location",
]
