"""The topic changes under the daemon: partitions added while it runs (it must pick them up), and a
partition's next offset deleted by retention while it was stopped (``kafka.missing_offset_policy``:
``fail`` stops with an error naming the partition; ``earliest`` jumps, logged at ERROR and counted in
``kafka2delta_offsets_out_of_range_total``)."""

from __future__ import annotations

import socket
import urllib.request

from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions

from tests.chaos.conftest import (
    FAST_GROUP,
    ChaosProducer,
    ChaosResult,
    Topic,
    chaos_setup,
    check,
    drain,
    poisoned,
    scale,
    stop,
    wait_committed,
    wait_for,
)

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


def _partitions_with_rows(setup) -> set[int]:  # type: ignore[no-untyped-def]
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
