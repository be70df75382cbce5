"""The metrics facade: one method per event, Prometheus underneath, one registry per daemon.

Every metric is listed in README.md ("Metrics") with its labels. Labels are bounded: topic,
partition, stage, reason; never offsets or keys.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

_PREFIX = "kafka2delta"


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        tp = ("topic", "partition")
        self._consumed = Counter(f"{_PREFIX}_messages_consumed", "Messages fetched from Kafka.", tp, registry=r)
        self._skipped = Counter(
            f"{_PREFIX}_messages_skipped",
            "Messages skipped: duplicate (already taken), empty payload, filtered, or dead_letter_recorded "
            "(a dead letter recorded before a crash).",
            ("topic", "partition", "reason"),
            registry=r,
        )
        self._dead = Counter(
            f"{_PREFIX}_messages_dead_lettered", "Messages that failed a stage.", ("topic", "stage"), registry=r
        )
        self._rows = Counter(f"{_PREFIX}_rows_written", "Rows committed to the table.", tp, registry=r)
        self._bytes = Counter(
            f"{_PREFIX}_bytes_written", "Parquet bytes committed to the table.", ("topic",), registry=r
        )
        self._files = Counter(
            f"{_PREFIX}_files_written", "Parquet files committed to the table.", ("topic",), registry=r
        )
        self._commits = Counter(f"{_PREFIX}_commits", "Delta commits made.", ("topic", "reason"), registry=r)
        self._conflicts = Counter(
            f"{_PREFIX}_commit_conflicts",
            "Partitions whose txn version moved under a commit (data dropped, resynced).",
            tp,
            registry=r,
        )
        self._retries = Counter(
            f"{_PREFIX}_storage_retries", "Storage operations retried after a transient error.", registry=r
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
        self._unknown_fields = Counter(
            f"{_PREFIX}_unknown_fields_dropped",
            "Field values dropped because the table has no column for them (schema_evolution = none).",
            ("topic",),
            registry=r,
        )
        self._columns_added = Counter(
            f"{_PREFIX}_columns_added",
            "Columns (or nested fields) added to the table by schema evolution (merge).",
            ("topic",),
            registry=r,
        )
        self._schema_changes = Counter(
            f"{_PREFIX}_schema_changes",
            "Schema changes made by another writer, each followed by a replay of the pending messages.",
            ("topic",),
            registry=r,
        )
        self._commit_seconds = Histogram(
            f"{_PREFIX}_commit_duration_seconds",
            "Time to write files and commit one batch.",
            registry=r,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self._version = Gauge(
            f"{_PREFIX}_last_committed_version", "Delta table version of the last commit.", registry=r
        )
        self._buffered = Gauge(f"{_PREFIX}_buffered_messages", "Messages buffered, not yet committed.", registry=r)
        self._assigned = Gauge(f"{_PREFIX}_assigned_partitions", "Partitions assigned to this daemon.", registry=r)

    def serve(self, host: str, port: int) -> None:
        start_http_server(port, addr=host, registry=self.registry)

    def consumed(self, topic: str, partition: int, count: int) -> None:
        self._consumed.labels(topic, str(partition)).inc(count)

    def skipped(self, topic: str, partition: int, reason: str, count: int) -> None:
        if count:
            self._skipped.labels(topic, str(partition), reason).inc(count)

    def dead_lettered(self, topic: str, stage: str, count: int = 1) -> None:
        self._dead.labels(topic, stage).inc(count)

    def committed(
        self,
        topic: str,
        reason: str,
        rows_by_partition: dict[int, int],
        files: int,
        nbytes: int,
        version: int,
        seconds: float,
    ) -> None:
        self._commits.labels(topic, reason).inc()
        for partition, rows in rows_by_partition.items():
            self._rows.labels(topic, str(partition)).inc(rows)
        self._files.labels(topic).inc(files)
        self._bytes.labels(topic).inc(nbytes)
        self._version.set(version)
        self._commit_seconds.observe(seconds)

    def unknown_fields(self, topic: str, count: int) -> None:
        if count:
            self._unknown_fields.labels(topic).inc(count)

    def columns_added(self, topic: str, count: int) -> None:
        self._columns_added.labels(topic).inc(count)

    def schema_change(self, topic: str) -> None:
        self._schema_changes.labels(topic).inc()

    def commit_conflict(self, topic: str, partition: int) -> None:
        self._conflicts.labels(topic, str(partition)).inc()

    def storage_retry(self) -> None:
        self._retries.inc()

    def rebalance(self, event: str, count: int) -> None:
        self._rebalances.labels(event).inc(count)

    def offset_out_of_range(self, topic: str, partition: int) -> None:
        self._out_of_range.labels(topic, str(partition)).inc()

    def buffered(self, messages: int) -> None:
        self._buffered.set(messages)

    def assigned(self, partitions: int) -> None:
        self._assigned.set(partitions)
