"""KafkaSource.seek after an offset-out-of-range error: librdkafka refuses the seek ("Erroneous
state"), so the partition is assigned afresh at the offset (the chaos test
tests/chaos/test_topic_changes.py::test_offsets_deleted_by_retention_while_running shows it on a broker)."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import OFFSET_INVALID, KafkaError, KafkaException, TopicPartition

from kafka2delta.config import KafkaConfig
from kafka2delta.kafka import KafkaSource
from kafka2delta.records import TopicPartition as Partition

T0 = Partition("t", 0)


class RefusingConsumer:
    """Refuses every seek as librdkafka does for a partition in the out-of-range state."""

    def __init__(self, assigned: dict[int, int]) -> None:
        self.assigned = dict(assigned)  # partition -> position (OFFSET_INVALID: nothing consumed yet)
        self.calls: list[tuple[str, Any]] = []

    def seek(self, tp: TopicPartition) -> None:
        raise KafkaException(KafkaError(KafkaError._STATE, "Failed to seek: Local: Erroneous state"))

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition("t", p) for p in sorted(self.assigned)]

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition("t", tp.partition, self.assigned[tp.partition]) for tp in partitions]

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        self.calls.append(("incremental_unassign", [tp.partition for tp in partitions]))

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        self.calls.append(("incremental_assign", [(tp.partition, tp.offset) for tp in partitions]))

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.calls.append(("assign", sorted((tp.partition, tp.offset) for tp in partitions)))


def source(strategy: str, consumer: RefusingConsumer) -> KafkaSource:
    config = KafkaConfig("127.0.0.1:9", "t", settings={"partition.assignment.strategy": strategy})
    kafka = KafkaSource(config)
    kafka._consumer = consumer  # type: ignore[assignment]
    return kafka


def test_cooperative_partition_is_reassigned_at_the_offset() -> None:
    consumer = RefusingConsumer({0: 120, 1: OFFSET_INVALID})
    source("cooperative-sticky", consumer).seek(T0, 3500)
    assert consumer.calls == [("incremental_unassign", [0]), ("incremental_assign", [(0, 3500)])]


def test_eager_keeps_the_other_partitions_where_they_are() -> None:
    consumer = RefusingConsumer({0: 120, 1: 77, 2: OFFSET_INVALID})
    kafka = source("range", consumer)
    kafka._starts[Partition("t", 2)] = (
        40  # assigned at 40, nothing consumed since: its position, never the group's offset
    )
    kafka.seek(T0, 3500)
    assert consumer.calls == [("assign", [(0, 3500), (1, 77), (2, 40)])]


@pytest.mark.parametrize("strategy", ["cooperative-sticky", "range"])
def test_a_partition_no_longer_assigned_is_left_alone(strategy: str) -> None:
    consumer = RefusingConsumer({1: 5})
    source(strategy, consumer).seek(T0, 3500)
    assert consumer.calls == []
