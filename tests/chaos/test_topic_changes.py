"""The topic changes under the daemon: partitions added while it runs (it must pick them up), and a
partition's next offset deleted by retention while it was stopped (``kafka.missing_offset_policy``:
``fail`` stops with an error naming the partition; ``earliest`` jumps, logged at ERROR and counted in
``kafka2delta_offsets_out_of_range_total``)."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewPartitions  # what confluent_kafka.admin re-exports (not in its __all__)

from tests.support.chaos import (
    FAST_GROUP,
    ChaosProducer,
    ChaosResult,
    chaos_setup,
    check,
    drain,
    poisoned,
    scale,
    stop,
    wait_committed,
)
from tests.support.harness import Setup, Topic, wait_for

# librdkafka notices new partitions at its next metadata refresh (default every 5 minutes).
REFRESH = {"K2D_KAFKA__SETTINGS__TOPIC_METADATA_REFRESH_INTERVAL_MS": "2000"}


def test_partitions_added_while_running(setup_factory, daemon_factory, chaos_result: ChaosResult) -> None:
    setup = chaos_setup(setup_factory, 2, max_messages_per_file=scale(500, 5_000), allowed_latency_s=0.5)
    chaos_result.scenario = "partitions added to the topic while running (2 → 4 → 6)"
    per_partition = scale(2_000, 20_000)
    first = ChaosProducer(setup.topic, per_partition, chunk=scale(200, 1_000), pause_s=0.2)
    daemons = [daemon_factory(setup, env={**FAST_GROUP, **REFRESH}) for _ in range(2)]
    wait_committed(setup)
    admin = AdminClient({"bootstrap.servers": setup.topic.bootstrap})
    producers = [first]
    for total in (4, 6):
        admin.create_partitions([NewPartitions(setup.topic.name, total)])[setup.topic.name].result(60)
        chaos_result.fault("partitions added", 2)
        wider = Topic(setup.topic.name, total, setup.topic.bootstrap)
        wait_for(lambda w=wider: _partitions(admin, w) == w.partitions, 60, "the new partitions")
        producers.append(ChaosProducer(wider, per_partition // 2, chunk=scale(200, 1_000), pause_s=0.2, start=10**6))
        new = set(range(total - 2, total))
        # The running daemons take the new partitions (no restart).
        wait_for(lambda n=new: n <= _partitions_with_rows(setup), 120, f"rows of partitions {sorted(new)}")
    for producer in producers:
        producer.join()
    for daemon in daemons:
        stop(daemon)
    setup.topic.partitions = 6
    drain(daemon_factory, setup)
    chaos_result.verdict = check(setup)
    assert set(range(6)) <= _partitions_with_rows(setup)


def _partitions(admin: AdminClient, topic: Topic) -> int:
    return len(admin.list_topics(topic.name, timeout=10).topics[topic.name].partitions)


def _partitions_with_rows(setup: Setup) -> set[int]:
    try:
        table = setup.table().to_pyarrow_table(columns=["kafka_partition"])
    except Exception:
        return set()
    return {p for p in table.column("kafka_partition").to_pylist() if p is not None}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_committed_offset_deleted_by_retention(setup_factory, daemon_factory, chaos_result: ChaosResult) -> None:
    setup = chaos_setup(setup_factory, 2, max_messages_per_file=scale(500, 5_000), allowed_latency_s=0.5)
    chaos_result.scenario = "next offset deleted by retention while stopped (policy fail, then earliest)"
    per_partition = scale(1_000, 20_000)
    setup.topic.produce(per_partition, payload=poisoned(50))
    drain(daemon_factory, setup)
    assert setup.txn_versions() == {0: per_partition - 1, 1: per_partition - 1}
    setup.topic.produce(per_partition, start=per_partition, payload=poisoned(50))
    # Retention deletes partition 0 past the table's next offset: `gone` messages were never ingested.
    gone = per_partition // 4
    admin = AdminClient({"bootstrap.servers": setup.topic.bootstrap})
    deleted = admin.delete_records([TopicPartition(setup.topic.name, 0, per_partition + gone)])
    for future in deleted.values():
        future.result(60)
    chaos_result.fault(f"records deleted past the committed offset (partition 0, {gone} never ingested)")

    refused = daemon_factory(setup, env=FAST_GROUP)
    assert refused.wait(120) == 1, refused.log()[-3000:]
    assert "deleted by retention" in refused.log() and "missing_offset_policy" in refused.log()
    assert setup.txn_versions()[0] == per_partition - 1, "policy fail: nothing moves"

    port = _free_port()
    env = {**FAST_GROUP, "K2D_KAFKA__MISSING_OFFSET_POLICY": "earliest", "K2D_METRICS__PORT": str(port)}
    jumped = daemon_factory(setup, env=env)
    end = 2 * per_partition - 1
    wait_for(lambda: setup.txn_versions() == {0: end, 1: end}, 180, "caught up after the jump")
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    counted = [line for line in metrics.splitlines() if line.startswith("kafka2delta_offsets_out_of_range_total{")]
    assert any('partition="0"' in line and line.endswith(" 1.0") for line in counted), counted
    stop(jumped)
    log = jumped.log()
    assert f"missing_offset_policy=earliest: starting at {per_partition + gone}" in log
    assert any(" ERROR " in line and "deleted by retention" in line for line in log.splitlines()), log[-3000:]
    chaos_result.notes = f"policy fail: exit 1; policy earliest: jumped over {gone} deleted offsets, counted 1"
    chaos_result.verdict = check(setup)


def test_offsets_deleted_by_retention_while_running(setup_factory, daemon_factory, chaos_result: ChaosResult) -> None:
    """The daemon's next fetch offset is deleted while it runs (it is stuck retrying a read-only table,
    and librdkafka may prefetch almost nothing): the broker answers OFFSET_OUT_OF_RANGE, and the policy
    (``earliest``) applies while running, logged at ERROR and counted."""
    from tests.support.chaos import read_only

    setup = chaos_setup(setup_factory, 1, allowed_latency_s=0.5, max_messages_per_file=scale(500, 5_000))
    chaos_result.scenario = "next offset deleted by retention while running (policy earliest)"
    # The same size in both forms: with librdkafka's prefetch cut to ~1 KB the daemon takes tens of messages a second.
    per_step = 1_000
    setup.topic.produce(per_step, payload=poisoned(50))
    port = _free_port()
    env = {
        **FAST_GROUP,
        "K2D_KAFKA__MISSING_OFFSET_POLICY": "earliest",
        "K2D_METRICS__PORT": str(port),
        # Prefetch (almost) nothing ahead of what the loop takes, so the fetch position stays behind.
        "K2D_KAFKA__SETTINGS__QUEUED_MAX_MESSAGES_KBYTES": "1",
        "K2D_KAFKA__SETTINGS__QUEUED_MIN_MESSAGES": "1",
        "K2D_KAFKA__SETTINGS__FETCH_MESSAGE_MAX_BYTES": "1024",
        "K2D_KAFKA__CONSUME_BATCH_SIZE": "50",
    }
    daemon = daemon_factory(setup, env=env)
    wait_for(lambda: _txn(setup) == per_step - 1, 180, "the first messages committed")
    table, letters = Path(setup.table_uri), Path(setup.dead_letter_uri)
    with read_only(table, table / "_delta_log", letters, letters / "_delta_log"):
        _produce_in_small_batches(setup.topic, per_step, start=per_step)  # the daemon takes some, then blocks
        wait_for(lambda: "retrying in" in daemon.log(), 60, "the daemon blocked on the read-only table")
        high = 2 * per_step
        admin = AdminClient({"bootstrap.servers": setup.topic.bootstrap})
        cut = high - per_step // 4
        for future in admin.delete_records([TopicPartition(setup.topic.name, 0, cut)]).values():
            future.result(60)
        chaos_result.fault(f"records deleted up to offset {cut} while the daemon ran")
    setup.topic.produce(per_step // 2, start=high, payload=poisoned(50))
    end = high + per_step // 2 - 1
    wait_for(lambda: _txn(setup) == end, 300, "caught up after the jump")
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    counted = [line for line in metrics.splitlines() if line.startswith("kafka2delta_offsets_out_of_range_total{")]
    stop(daemon)
    log = daemon.log()
    assert any(" ERROR " in line and "deleted by retention" in line for line in log.splitlines()), log[-4000:]
    assert any(line.endswith(" 1.0") for line in counted), counted
    chaos_result.notes = f"out-of-range events counted: {counted}"
    chaos_result.verdict = check(setup)


def _txn(setup: Setup) -> int | None:
    """Partition 0's txn version, None before the table exists."""
    try:
        return setup.txn_versions()[0]
    except Exception:
        return None


def _produce_in_small_batches(topic: Topic, count: int, start: int) -> None:
    """Partition 0, 20 messages per record batch: a fetch returns a whole batch, and small ones keep
    librdkafka's prefetch short."""
    producer = Producer({"bootstrap.servers": topic.bootstrap, "linger.ms": 0})
    payload = poisoned(50)
    for seq in range(start, start + count):
        producer.produce(topic.name, value=payload(0, seq), partition=0)
        if seq % 20 == 19:
            producer.flush(30)
    assert producer.flush(60) == 0
