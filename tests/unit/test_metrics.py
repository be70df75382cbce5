"""The metrics facade: the fixed list of names, the bulk histogram (exactly what a per-value Histogram gives),
per-row end-to-end latency, scrape-time gauges, and bounded labels."""

from __future__ import annotations

import bisect
import random
import re
from pathlib import Path

import pyarrow as pa
import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kafka2delta.metrics import LATENCY_BUCKETS, METRIC_NAMES, BulkHistogram, CommitStats, Metrics
from kafka2delta.records import TopicPartition


def samples(registry: CollectorRegistry, family: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """name+labels → value for every sample of ``family`` (``_created`` left out: a naive Histogram has it)."""
    found = {}
    for metric in text_string_to_metric_families(generate_latest(registry).decode()):
        if metric.name != family:
            continue
        for sample in metric.samples:
            if not sample.name.endswith("_created"):
                found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


@pytest.mark.parametrize("seed", range(5))
def test_bulk_histogram_equals_a_per_value_histogram(seed: int) -> None:
    rng = random.Random(seed)
    buckets = sorted(rng.sample([0.001, 0.01, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0, 3600.0], 7))
    bulk_registry, naive_registry = CollectorRegistry(), CollectorRegistry()
    bulk = BulkHistogram("h_seconds", "h", ("topic",), buckets, bulk_registry)
    naive = Histogram("h_seconds", "h", ("topic",), buckets=buckets, registry=naive_registry)
    for _ in range(20):
        topic = rng.choice(["a", "b", "c"])
        kind = rng.random()
        count = rng.randrange(0, 3000)
        if kind < 0.3:
            values = [rng.expovariate(1.0) for _ in range(count)]
        elif kind < 0.6:
            values = [rng.uniform(-1, 5000) for _ in range(count)]
        else:  # exactly on the bounds (le is inclusive), and integers
            values = [float(rng.choice([*buckets, 0, 1, 2, 7])) for _ in range(count)]
        for v in values:
            naive.labels(topic).observe(v)
        bulk.observe_many((topic,), pa.array(values, pa.float64()))
    got, want = samples(bulk_registry, "h_seconds"), samples(naive_registry, "h_seconds")
    assert got.keys() == want.keys()
    for key, expected in want.items():
        if key[0].endswith("_sum"):
            assert got[key] == pytest.approx(expected, rel=1e-9, abs=1e-9), key
        else:
            assert got[key] == expected, key  # bucket counts and _count: exact


def test_bulk_histogram_buckets_are_cumulative_and_skip_nulls() -> None:
    registry = CollectorRegistry()
    bulk = BulkHistogram("x", "x", (), [1, 2, 5], registry)
    bulk.observe_many((), pa.chunked_array([pa.array([0.5, None, 1.0, 2.0]), pa.array([3.0, 9.0])]))
    assert [value(registry, "x_bucket", le=le) for le in ("1.0", "2.0", "5.0", "+Inf")] == [2, 3, 4, 5]
    assert value(registry, "x_count") == 5 and value(registry, "x_sum") == pytest.approx(15.5)
    with pytest.raises(ValueError):
        bulk.observe_many(("extra",), pa.array([1.0]))


def test_a_million_rows_observed_in_bulk_land_in_the_buckets_one_by_one_observing_would() -> None:
    # Its speed is the benchmark's to show (observe_many in bench/results/profile-json.txt), not a timed test's.
    registry = CollectorRegistry()
    bulk = BulkHistogram("x", "x", ("topic",), LATENCY_BUCKETS, registry)
    raw = [i % 5000 / 10 for i in range(1_000_000)]
    bulk.observe_many(("t",), pa.array(raw, pa.float64()))
    assert value(registry, "x_count", topic="t") == 1_000_000
    assert value(registry, "x_sum", topic="t") == pytest.approx(sum(raw))
    ordered = sorted(raw)
    for bound in LATENCY_BUCKETS:
        expected = bisect.bisect_right(ordered, bound)
        assert value(registry, "x_bucket", topic="t", le=str(float(bound))) == expected, bound


def fire_every_event(metrics: Metrics) -> None:
    metrics.consumed("t", 0, 10)
    metrics.skipped("t", 0, "duplicate", 1)
    metrics.deserialized("t", 9)
    metrics.failed("t", "coerce", 1)
    metrics.dead_lettered("t", "coerce", 1)
    metrics.unknown_fields("t", 2)
    metrics.buffered(5, 1234)
    metrics.commit_retry("events")
    metrics.columns_added("events", 1)
    metrics.schema_change("events")
    metrics.commit_conflict(TopicPartition("t", 0), "events")
    metrics.storage_retry()
    metrics.rebalance("assigned", 2)
    metrics.offset_out_of_range("t", 1)
    metrics.coordinator_skip("events", "order")
    metrics.assigned(2)
    metrics.lag("t", 0, 7)
    metrics.merged("events", {"num_target_rows_inserted": 2, "num_target_files_added": 1})
    metrics.paced("events", 3.2, 32.0)
    metrics.committed(
        CommitStats(
            table="events",
            reason="latency",
            version=3,
            rows={TopicPartition("t", 0): 8},
            file_sizes=[4096],
            flush_seconds=0.2,
            commit_seconds=0.05,
            row_timestamps_ms={"t": [pa.array([1], pa.int64())]},
        )
    )


def test_every_documented_metric_is_exposed_with_its_type() -> None:
    metrics = Metrics()
    fire_every_event(metrics)
    text = generate_latest(metrics.registry).decode()
    families = {m.name: m.type for m in text_string_to_metric_families(text)}
    exposed = {f"{name}_total" if kind == "counter" else name for name, kind in families.items()}
    assert exposed == set(METRIC_NAMES)
    for name in METRIC_NAMES:
        assert f"\n{name}" in text or text.startswith(name) or f"{name}_bucket" in text, name
    assert families["kafka2delta_end_to_end_latency_seconds"] == "histogram"
    assert families["kafka2delta_consumer_lag"] == "gauge"
    assert (
        value(metrics.registry, "kafka2delta_build_info", version=pytest.importorskip("kafka2delta").__version__) == 1
    )


def test_no_unbounded_label() -> None:
    metrics = Metrics()
    fire_every_event(metrics)
    allowed = {"topic", "partition", "table", "stage", "reason", "event", "version", "action", "le"}
    for family in metrics.registry.collect():
        for sample in family.samples:
            assert set(sample.labels) <= allowed, (sample.name, sample.labels)


def test_commit_observes_rows_files_and_per_row_latency() -> None:
    wall = [1_000_000.0]
    metrics = Metrics(wall_clock=lambda: wall[0])
    now_ms = 1_000_000_000
    stamps = [
        pa.array([now_ms - 200, now_ms - 3_000, now_ms - 3_000], pa.int64()),  # 0.2 s, 3 s, 3 s
        pa.array([now_ms - 700_000, now_ms + 5_000, -1], pa.int64()),  # 700 s; a clock ahead → 0; no timestamp
    ]
    rows = {TopicPartition("t", 0): 3, TopicPartition("t", 1): 3}
    metrics.committed(
        CommitStats(
            table="events",
            reason="records",
            version=12,
            rows=rows,
            file_sizes=[2000, 70_000],
            flush_seconds=1.5,
            commit_seconds=0.3,
            row_timestamps_ms={"t": stamps},
        )
    )
    r = metrics.registry
    assert value(r, "kafka2delta_commits_total", table="events", reason="records") == 1
    assert value(r, "kafka2delta_rows_written_total", topic="t", partition="0", table="events") == 3
    assert value(r, "kafka2delta_rows_written_total", topic="t", partition="1", table="events") == 3
    assert value(r, "kafka2delta_files_written_total", table="events") == 2
    assert value(r, "kafka2delta_bytes_written_total", table="events") == 72_000
    assert value(r, "kafka2delta_file_size_bytes_count", table="events") == 2
    assert value(r, "kafka2delta_file_size_bytes_bucket", table="events", le="4096.0") == 1
    assert value(r, "kafka2delta_rows_per_commit_sum", table="events") == 6
    assert value(r, "kafka2delta_flush_duration_seconds_sum", table="events") == 1.5
    assert value(r, "kafka2delta_commit_duration_seconds_sum", table="events") == 0.3
    assert value(r, "kafka2delta_last_committed_version", table="events") == 12
    assert value(r, "kafka2delta_last_commit_timestamp_seconds", table="events") == 1_000_000.0
    latency = "kafka2delta_end_to_end_latency_seconds"
    assert value(r, f"{latency}_count", topic="t", table="events") == 5  # the row without a timestamp is not observed
    assert value(r, f"{latency}_sum", topic="t", table="events") == pytest.approx(0.2 + 3 + 3 + 700 + 0)
    assert value(r, f"{latency}_bucket", topic="t", table="events", le="0.25") == 2  # 0.2 s and the clamped one
    assert value(r, f"{latency}_bucket", topic="t", table="events", le="5.0") == 4
    assert value(r, f"{latency}_bucket", topic="t", table="events", le="600.0") == 4
    assert value(r, f"{latency}_bucket", topic="t", table="events", le="1800.0") == 5


def test_seconds_since_last_commit_is_computed_at_scrape_time() -> None:
    now = [100.0]
    metrics = Metrics(clock=lambda: now[0])
    now[0] = 130.0
    assert value(metrics.registry, "kafka2delta_seconds_since_last_commit") == 30  # since start: no commit yet
    metrics.committed(
        CommitStats(
            table="events", reason="latency", version=1, rows={}, file_sizes=[], flush_seconds=0.1, commit_seconds=0.1
        )
    )
    now[0] = 142.5
    assert value(metrics.registry, "kafka2delta_seconds_since_last_commit") == 12.5


def test_lag_of_partitions_no_longer_ours_is_removed() -> None:
    metrics = Metrics()
    metrics.lag("t", 0, 5)
    metrics.lag("t", 1, 0)
    metrics.unassigned([TopicPartition("t", 1), TopicPartition("t", 7)])
    assert value(metrics.registry, "kafka2delta_consumer_lag", topic="t", partition="0") == 5
    assert value(metrics.registry, "kafka2delta_consumer_lag", topic="t", partition="1") is None


def test_an_increment_of_0_makes_no_per_partition_series() -> None:
    """Found by review: ``rows_written`` (and ``consumed``, for a fetch of only duplicates) got a series at 0 for
    each increment of 0; with a routing expression, one for every partition × every table it may route to."""
    metrics = Metrics()
    metrics.consumed("t", 0, 0)
    metrics.skipped("t", 0, "duplicate", 0)
    metrics.dead_lettered("t", "coerce", 0)
    rows = {TopicPartition("t", 0): 0, TopicPartition("t", 1): 2}
    stats = CommitStats(
        table="orders", reason="latency", version=1, rows=rows, file_sizes=[], flush_seconds=0.1, commit_seconds=0.1
    )
    metrics.committed(stats)
    r = metrics.registry
    assert value(r, "kafka2delta_rows_written_total", topic="t", partition="0", table="orders") is None
    assert value(r, "kafka2delta_rows_written_total", topic="t", partition="1", table="orders") == 2
    exposed = generate_latest(r).decode()
    for family in ("messages_consumed", "messages_skipped", "messages_dead_lettered"):
        assert f"kafka2delta_{family}_total{{" not in exposed, family
    # Per table (bounded by the configured tables), a commit's series are there from its first commit, even at 0.
    assert value(r, "kafka2delta_files_written_total", table="orders") == 0
    assert value(r, "kafka2delta_commits_total", table="orders", reason="latency") == 1


def test_the_latency_buckets_can_tell_a_p50_under_2_s() -> None:
    """Found by review: no bound between 1 and 2.5 s, so ``histogram_quantile(0.5, …)`` could not say whether the
    steady-state P50 met its target (< 2 s): a P50 of 1.1 s and one of 2.4 s read the same."""
    assert {1.5, 2.0, 3.0, 4.0} <= set(LATENCY_BUCKETS)
    assert list(LATENCY_BUCKETS) == sorted(set(LATENCY_BUCKETS))
    wall = [1_000_000.0]
    metrics = Metrics(wall_clock=lambda: wall[0])
    now_ms = 1_000_000_000
    stamps = pa.array([now_ms - 1_800] * 6 + [now_ms - 2_400] * 4, pa.int64())  # 1.8 s and 2.4 s
    stats = CommitStats(
        table="events",
        reason="latency",
        version=1,
        rows={TopicPartition("t", 0): 10},
        file_sizes=[],
        flush_seconds=0.1,
        commit_seconds=0.1,
        row_timestamps_ms={"t": [stamps]},
    )
    metrics.committed(stats)
    bucket = "kafka2delta_end_to_end_latency_seconds_bucket"
    assert value(metrics.registry, bucket, topic="t", table="events", le="2.0") == 6  # the P50 is under 2 s
    assert value(metrics.registry, bucket, topic="t", table="events", le="1.5") == 0


@pytest.mark.parametrize("document", ["README.md", "docs/OPERATING.md"])
def test_the_documented_metrics_tables_match_the_registered_metrics(document: str) -> None:
    # README's table once said `topic` where the code had `table` for nine metrics: both tables are checked.
    metrics = Metrics()
    fire_every_event(metrics)
    registered: dict[str, tuple[str, set[str]]] = {}
    for family in metrics.registry.collect():
        name = f"{family.name}_total" if family.type == "counter" else family.name
        labels = {label for sample in family.samples for label in sample.labels if label != "le"}
        registered[name] = (family.type, labels)
    text = (Path(__file__).resolve().parents[2] / document).read_text(encoding="utf-8")
    documented = {}
    for line in text.splitlines():
        if line.startswith("| `kafka2delta_"):
            name, kind, label_cell = (cell.strip() for cell in line.split("|")[1:4])
            words = {label.strip() for label in re.sub(r"\(.*?\)", "", label_cell).split(",")} - {"—"}
            documented[name.strip("`")] = (kind, words)
    assert documented == registered
