"""The metrics facade: one method per event, Prometheus underneath, one registry per daemon.

Every metric is listed in docs/OPERATING.md (and the README) with its type, labels and meaning; the names are a
fixed list (:data:`METRIC_NAMES`). Labels are bounded: topic, partition, table, stage, reason, event, version, action;
never offsets or keys. The HTTP endpoints that serve the registry are in :mod:`kafka2delta.status`.

The end-to-end latency histogram is observed once per commit for every committed row at once:
:class:`BulkHistogram` counts an Arrow array into its buckets with one vectorised comparison per
bucket, so a million-row commit costs a few milliseconds and no Python per row.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.metrics_core import HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from kafka2delta import __version__
from kafka2delta.records import Stage, TopicPartition

_PREFIX = "kafka2delta"
_go_float: Callable[[float], str] = floatToGoString  # the `le` label as prometheus_client writes it

# Buckets: commit and flush times are seconds (a commit is one log write, a flush writes files too);
# latency spans the allowed latency (seconds) up to a backlog of hours, with bounds every second or half
# second between 1 and 5 s, where the steady-state P50 is (its target is under 2 s).
DURATION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
LATENCY_BUCKETS = (
    0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0
)  # fmt: skip
ROWS_BUCKETS = (1, 10, 100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000)
FILE_SIZE_BUCKETS = tuple(float(1024 * 4**i) for i in range(11))  # 1 KiB … 1 GiB
_LATENCY_SLICE_ROWS = 65_536

METRIC_NAMES = (
    "kafka2delta_messages_consumed_total",
    "kafka2delta_messages_skipped_total",
    "kafka2delta_messages_deserialized_total",
    "kafka2delta_messages_failed_total",
    "kafka2delta_messages_dead_lettered_total",
    "kafka2delta_rows_written_total",
    "kafka2delta_bytes_written_total",
    "kafka2delta_files_written_total",
    "kafka2delta_commits_total",
    "kafka2delta_merged_rows_total",
    "kafka2delta_merged_files_total",
    "kafka2delta_commit_conflicts_total",
    "kafka2delta_commit_retries_total",
    "kafka2delta_storage_retries_total",
    "kafka2delta_rebalances_total",
    "kafka2delta_offsets_out_of_range_total",
    "kafka2delta_coordinator_turns_refused_total",
    "kafka2delta_unknown_fields_dropped_total",
    "kafka2delta_columns_added_total",
    "kafka2delta_schema_changes_total",
    "kafka2delta_flush_duration_seconds",
    "kafka2delta_commit_duration_seconds",
    "kafka2delta_rows_per_commit",
    "kafka2delta_file_size_bytes",
    "kafka2delta_end_to_end_latency_seconds",
    "kafka2delta_consumer_lag",
    "kafka2delta_buffered_messages",
    "kafka2delta_buffered_bytes",
    "kafka2delta_assigned_partitions",
    "kafka2delta_seconds_since_last_commit",
    "kafka2delta_last_committed_version",
    "kafka2delta_last_commit_timestamp_seconds",
    "kafka2delta_commit_interval_seconds",
    "kafka2delta_table_writers",
    "kafka2delta_build_info",
)
"""Every metric family, as it appears in the exposition (counters with their ``_total``)."""


class BulkHistogram:
    """A Prometheus histogram observed a whole array at a time (prometheus_client's Histogram has no
    bulk observe). Buckets are cumulative (``le``), with ``+Inf`` = ``_count``, and ``_sum``: the same
    exposition a :class:`prometheus_client.Histogram` gives after observing each value. Thread-safe.
    """

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        buckets: Iterable[float],
        registry: CollectorRegistry | None,
    ) -> None:
        bounds = sorted(float(b) for b in buckets)
        if bounds and bounds[-1] == float("inf"):
            bounds.pop()
        self._name = name
        self._documentation = documentation
        self._labelnames = tuple(labelnames)
        self._bounds = tuple(bounds)
        self._lock = threading.Lock()
        # Per label values: cumulative count per bound, total count, sum.
        self._series: dict[tuple[str, ...], tuple[list[int], int, float]] = {}
        if registry is not None:
            registry.register(self)

    @property
    def bounds(self) -> tuple[float, ...]:
        return self._bounds

    def observe_many(self, labels: Sequence[str], values: pa.Array | pa.ChunkedArray) -> None:
        """Observe every non-null value of ``values`` (numbers) under ``labels``."""
        if len(labels) != len(self._labelnames):
            raise ValueError(f"{self._name}: expected labels {self._labelnames}, got {tuple(labels)}")
        if values.null_count:
            values = pc.drop_null(values)
        count = len(values)
        if not count:
            return
        values = values.cast(pa.float64())
        # One vectorised pass per bound: the count of values <= bound is already cumulative.
        cumulative = [int(pc.sum(pc.less_equal(values, bound)).as_py() or 0) for bound in self._bounds]
        total = float(pc.sum(values).as_py())
        key = tuple(labels)
        with self._lock:
            previous = self._series.get(key)
            if previous is None:
                self._series[key] = (cumulative, count, total)
            else:
                old, old_count, old_sum = previous
                merged = [a + b for a, b in zip(old, cumulative, strict=True)]
                self._series[key] = (merged, old_count + count, old_sum + total)

    def remove_by_labels(self, labels: Mapping[str, str]) -> None:
        """Drop every series whose labels include ``labels`` (as prometheus_client's metrics do)."""
        positions = {self._labelnames.index(name): value for name, value in labels.items()}
        with self._lock:
            for key in [k for k in self._series if all(k[i] == v for i, v in positions.items())]:
                del self._series[key]

    def describe(self) -> list[Metric]:
        return [HistogramMetricFamily(self._name, self._documentation, labels=self._labelnames)]

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self._name, self._documentation, labels=self._labelnames)
        with self._lock:
            series = [(key, list(counts), count, total) for key, (counts, count, total) in self._series.items()]
        for key, counts, count, total in series:
            buckets = [(_go_float(bound), float(c)) for bound, c in zip(self._bounds, counts, strict=True)]
            buckets.append(("+Inf", float(count)))
            family.add_metric(list(key), buckets, total)
        yield family


@dataclass(frozen=True)
class CommitStats:
    """One successful commit to a table, as the metrics see it."""

    table: str
    """The table's name (the ``table`` label)."""
    reason: str
    """Why it was flushed: ``latency``, ``records``, ``bytes``, ``buffer_bytes``, ``revoke``, ``shutdown``,
    ``caught_up``."""
    version: int
    """The table version it made."""
    rows: Mapping[TopicPartition, int]
    """Rows committed per topic partition."""
    file_sizes: Sequence[int]
    """Bytes of each Parquet file it added."""
    flush_seconds: float
    """From taking the buffers to the end of the commit: files, dead letters, Delta commit, retries."""
    commit_seconds: float
    """The Delta commit alone (the last, successful attempt)."""
    row_timestamps_ms: Mapping[str, Sequence[pa.Array]] = field(default_factory=dict)
    """By topic: the Kafka timestamp (epoch ms) of every committed row, in any number of int64 arrays."""


class Metrics:
    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        # No `<name>_created` series next to every counter and histogram: they double the series count and
        # no dashboard reads them. (A process-wide switch of prometheus_client; the daemon has one registry.)
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = registry or CollectorRegistry()
        self._clock = clock
        self._wall_clock = wall_clock
        self._started = clock()
        self._last_commit: float | None = None  # monotonic
        r = self.registry
        tp = ("topic", "partition")
        self._consumed = Counter(f"{_PREFIX}_messages_consumed", "Messages fetched from Kafka.", tp, registry=r)
        self._skipped = Counter(
            f"{_PREFIX}_messages_skipped",
            "Messages skipped: duplicate (already taken), empty payload, filtered, or dead_letter_recorded "
            "(found recorded in the dead-letter table: before a crash, a conflict or a schema change, or by another "
            "writer).",
            ("topic", "partition", "reason"),
            registry=r,
        )
        self._deserialized = Counter(
            f"{_PREFIX}_messages_deserialized", "Messages whose payload was decoded.", ("topic",), registry=r
        )
        self._failed = Counter(
            f"{_PREFIX}_messages_failed",
            "Messages that failed a stage, counted when the stage fails them (a replay after a conflict "
            "or schema change counts them again); they become dead letters.",
            ("topic", "stage"),
            registry=r,
        )
        self._dead = Counter(
            f"{_PREFIX}_messages_dead_lettered",
            "Messages recorded in the dead-letter table, counted once the table commit covering them lands.",
            ("topic", "stage"),
            registry=r,
        )
        # What happens to a table is labelled by the table (its route's name, or its URI): one commit may hold
        # several topics. The label's values are the configured tables, never message values.
        table = ("table",)
        self._rows = Counter(
            f"{_PREFIX}_rows_written", "Rows committed to a table.", ("topic", "partition", "table"), registry=r
        )
        self._bytes = Counter(f"{_PREFIX}_bytes_written", "Parquet bytes committed to a table.", table, registry=r)
        self._files = Counter(f"{_PREFIX}_files_written", "Parquet files committed to a table.", table, registry=r)
        self._commits = Counter(f"{_PREFIX}_commits", "Delta commits made.", ("table", "reason"), registry=r)
        self._merged_rows = Counter(
            f"{_PREFIX}_merged_rows",
            "Upsert tables: table rows a MERGE inserted, updated, deleted, or copied into the files it rewrote.",
            ("table", "action"),
            registry=r,
        )
        self._merged_files = Counter(
            f"{_PREFIX}_merged_files",
            "Upsert tables: files a MERGE added and removed (a rewritten file counts once each way).",
            ("table", "action"),
            registry=r,
        )
        self._conflicts = Counter(
            f"{_PREFIX}_commit_conflicts",
            "Partitions whose txn version moved under a commit (data dropped, resynced).",
            ("topic", "partition", "table"),
            registry=r,
        )
        self._commit_retries = Counter(
            f"{_PREFIX}_commit_retries",
            "Commit attempts that failed with a transient storage error and were retried.",
            table,
            registry=r,
        )
        self._retries = Counter(
            f"{_PREFIX}_storage_retries",
            "Operations (storage, Kafka, registry) retried after a transient error.",
            registry=r,
        )
        self._rebalances = Counter(
            f"{_PREFIX}_rebalances", "Partitions assigned, revoked or lost.", ("event",), registry=r
        )
        self._out_of_range = Counter(
            f"{_PREFIX}_offsets_out_of_range",
            "Partitions whose committed offset was no longer on the broker.",
            tp,
            registry=r,
        )
        self._turns_refused = Counter(
            f"{_PREFIX}_coordinator_turns_refused",
            "Refused ingest turns of the job coordinator (coordinator.join_ingest): lock busy or another job's turn.",
            ("table", "reason"),
            registry=r,
        )
        self._unknown_fields = Counter(
            f"{_PREFIX}_unknown_fields_dropped",
            "Field values dropped because the table has no column for them (schema_evolution = none).",
            ("topic",),
            registry=r,
        )
        self._columns_added = Counter(
            f"{_PREFIX}_columns_added",
            "Columns (or nested fields) added to a table by schema evolution (merge).",
            table,
            registry=r,
        )
        self._schema_changes = Counter(
            f"{_PREFIX}_schema_changes",
            "Schema changes made by another writer, each followed by a replay of the pending messages.",
            table,
            registry=r,
        )
        self._flush_seconds = Histogram(
            f"{_PREFIX}_flush_duration_seconds",
            "Time of one table's flush: Parquet files, dead-letter commit, Delta commit and any retries.",
            table,
            registry=r,
            buckets=DURATION_BUCKETS,
        )
        self._commit_seconds = Histogram(
            f"{_PREFIX}_commit_duration_seconds",
            "Time of the Delta commit of one flush (the log write, files already written).",
            table,
            registry=r,
            buckets=DURATION_BUCKETS,
        )
        self._rows_per_commit = Histogram(
            f"{_PREFIX}_rows_per_commit", "Rows in one Delta commit.", table, registry=r, buckets=ROWS_BUCKETS
        )
        self._file_size = Histogram(
            f"{_PREFIX}_file_size_bytes",
            "Size of each Parquet file committed.",
            table,
            registry=r,
            buckets=FILE_SIZE_BUCKETS,
        )
        self._latency = BulkHistogram(
            f"{_PREFIX}_end_to_end_latency_seconds",
            "Per committed row: commit time minus the row's Kafka timestamp (a producer clock ahead counts as 0).",
            ("topic", "table"),
            LATENCY_BUCKETS,
            registry=r,
        )
        self._lag = Gauge(
            f"{_PREFIX}_consumer_lag",
            "High watermark minus the next offset after the one committed in the Delta log "
            "(cached watermarks, updated after each commit and each progress interval).",
            tp,
            registry=r,
        )
        self._buffered = Gauge(f"{_PREFIX}_buffered_messages", "Messages buffered, not yet committed.", registry=r)
        self._buffered_bytes = Gauge(
            f"{_PREFIX}_buffered_bytes",
            "Memory the buffers take, not yet committed: encoded and Arrow bytes of the rows, 16 B a row, and the "
            "dead letters' payloads (what ingest.max_buffered_bytes bounds).",
            registry=r,
        )
        self._assigned = Gauge(f"{_PREFIX}_assigned_partitions", "Partitions assigned to this daemon.", registry=r)
        since = Gauge(
            f"{_PREFIX}_seconds_since_last_commit",
            "Seconds since the last successful Delta commit (since start when none yet), at scrape time.",
            registry=r,
        )
        since.set_function(self.seconds_since_last_commit)
        self._version = Gauge(
            f"{_PREFIX}_last_committed_version", "Delta table version of the last commit.", table, registry=r
        )
        self._last_commit_time = Gauge(
            f"{_PREFIX}_last_commit_timestamp_seconds",
            "Unix time of the last successful Delta commit to a table.",
            table,
            registry=r,
        )
        self._commit_interval = Gauge(
            f"{_PREFIX}_commit_interval_seconds",
            "How long a table's messages may wait before their commit now: ingest.allowed_latency_s, or longer when "
            "the table's writers together exceed ingest.table_commits_per_s.",
            table,
            registry=r,
        )
        self._table_writers = Gauge(
            f"{_PREFIX}_table_writers",
            "Commits of all writers per commit of this daemon, over its last commits, capped by the log's rate over "
            "one wait of this daemon (about the number of writers).",
            table,
            registry=r,
        )
        build = Gauge(f"{_PREFIX}_build_info", "Always 1; the label says which version runs.", ("version",), registry=r)
        build.labels(__version__).set(1)

    # --- consuming and processing ------------------------------------------------------

    # A labelled series is made by its first increment that is not 0: with a routing expression every table has a
    # lane for every piece of every partition, and incrementing by 0 made partitions × tables series that never
    # move.

    def consumed(self, topic: str, partition: int, count: int) -> None:
        if count:
            self._consumed.labels(topic, str(partition)).inc(count)

    def skipped(self, topic: str, partition: int, reason: str, count: int) -> None:
        if count:
            self._skipped.labels(topic, str(partition), reason).inc(count)

    def deserialized(self, topic: str, count: int) -> None:
        if count:
            self._deserialized.labels(topic).inc(count)

    def failed(self, topic: str, stage: Stage, count: int = 1) -> None:
        if count:
            self._failed.labels(topic, stage).inc(count)

    def unknown_fields(self, topic: str, count: int) -> None:
        if count:
            self._unknown_fields.labels(topic).inc(count)

    def buffered(self, messages: int, nbytes: int | None = None) -> None:
        self._buffered.set(messages)
        if nbytes is not None:
            self._buffered_bytes.set(nbytes)

    # --- committing --------------------------------------------------------------------

    def dead_lettered(self, topic: str, stage: Stage, count: int = 1) -> None:
        if count:
            self._dead.labels(topic, stage).inc(count)

    def committed(self, commit: CommitStats) -> None:
        now = self._clock()
        wall = self._wall_clock()
        table = commit.table
        self._commits.labels(table, commit.reason).inc()
        total = 0
        for tp, rows in commit.rows.items():
            if rows:
                self._rows.labels(tp.topic, str(tp.partition), table).inc(rows)
            total += rows
        self._files.labels(table).inc(len(commit.file_sizes))
        self._bytes.labels(table).inc(sum(commit.file_sizes))
        file_size = self._file_size.labels(table)
        for size in commit.file_sizes:
            file_size.observe(size)
        self._rows_per_commit.labels(table).observe(total)
        self._flush_seconds.labels(table).observe(commit.flush_seconds)
        self._commit_seconds.labels(table).observe(commit.commit_seconds)
        for topic, stamps in commit.row_timestamps_ms.items():
            self._observe_latency(topic, table, stamps, wall)
        self._version.labels(table).set(commit.version)
        self._last_commit_time.labels(table).set(wall)
        self._last_commit = now

    def _observe_latency(self, topic: str, table: str, timestamps_ms: Sequence[pa.Array], wall: float) -> None:
        # A slice at a time: a catch-up's flush (1M+ rows) in one go took ~50 MB of temporary arrays at the
        # moment its buffers were still held, the daemon's peak RSS.
        pieces: list[pa.Array] = []
        rows = 0
        for array in timestamps_ms:
            pieces.append(array)
            rows += len(array)
            if rows >= _LATENCY_SLICE_ROWS:
                self._observe_latency_slice(topic, table, pa.chunked_array(pieces, pa.int64()), wall)
                pieces, rows = [], 0
        if pieces:
            self._observe_latency_slice(topic, table, pa.chunked_array(pieces, pa.int64()), wall)

    def _observe_latency_slice(self, topic: str, table: str, stamps: pa.ChunkedArray, wall: float) -> None:
        stamps = stamps.filter(pc.greater(stamps, 0))  # -1: the message had no timestamp
        if not len(stamps):
            return
        seconds = pc.divide(pc.subtract(pa.scalar(wall * 1000.0), stamps.cast(pa.float64())), 1000.0)
        self._latency.observe_many((topic, table), pc.max_element_wise(seconds, 0.0))

    def merged(self, table: str, stats: Mapping[str, Any]) -> None:
        """delta-rs's metrics of one MERGE (``num_target_rows_*``, ``num_target_files_*``)."""
        for action in ("inserted", "updated", "deleted", "copied"):
            self._merged_rows.labels(table, action).inc(int(stats.get(f"num_target_rows_{action}", 0)))
        for action in ("added", "removed"):
            self._merged_files.labels(table, action).inc(int(stats.get(f"num_target_files_{action}", 0)))

    def commit_retry(self, table: str) -> None:
        self._commit_retries.labels(table).inc()

    def columns_added(self, table: str, count: int) -> None:
        self._columns_added.labels(table).inc(count)

    def schema_change(self, table: str) -> None:
        self._schema_changes.labels(table).inc()

    def commit_conflict(self, tp: TopicPartition, table: str) -> None:
        self._conflicts.labels(tp.topic, str(tp.partition), table).inc()

    def storage_retry(self) -> None:
        self._retries.inc()

    def paced(self, table: str, interval_s: float, writers: float) -> None:
        self._commit_interval.labels(table).set(interval_s)
        self._table_writers.labels(table).set(writers)

    def seconds_since_last_commit(self) -> float:
        last = self._last_commit if self._last_commit is not None else self._started
        return max(0.0, self._clock() - last)

    # --- partitions --------------------------------------------------------------------

    def rebalance(self, event: str, count: int) -> None:
        self._rebalances.labels(event).inc(count)

    def offset_out_of_range(self, topic: str, partition: int) -> None:
        self._out_of_range.labels(topic, str(partition)).inc()

    def coordinator_skip(self, table: str, reason: str) -> None:
        """A refused ``ingest`` turn; reason ``lock_busy`` or ``order``."""
        self._turns_refused.labels(table, reason).inc()

    def assigned(self, partitions: int) -> None:
        self._assigned.set(partitions)

    def lag(self, topic: str, partition: int, messages: int) -> None:
        self._lag.labels(topic, str(partition)).set(messages)

    def released(self, *, topics: Iterable[str] = (), tables: Iterable[str] = ()) -> None:
        """Drop the series of topics and tables this daemon no longer reads or writes (a topic deleted or assigned
        to another daemon, its table closed): they stop being exported instead of showing their last value forever.
        Counters that come back start again from 0, which ``rate()`` and ``increase()`` take as a reset."""
        gone = [("topic", topic) for topic in topics] + [("table", table) for table in tables]
        for metric in vars(self).values():
            # Every labelled metric, however many are added later; _labelnames is prometheus_client's (and ours).
            names = getattr(metric, "_labelnames", ())
            for label, value in gone:
                if label in names:
                    metric.remove_by_labels({label: value})

    def unassigned(self, partitions: Iterable[TopicPartition]) -> None:
        """Partitions no longer ours: their lag is another daemon's to report."""
        for tp in partitions:
            with contextlib.suppress(KeyError):
                self._lag.remove(tp.topic, str(tp.partition))
