"""KafkaSource.seek after an offset-out-of-range error: librdkafka refuses the seek ("Erroneous
state"), so the partition is assigned afresh at the offset (the chaos test
tests/chaos/test_topic_changes.py::test_offsets_deleted_by_retention_while_running shows it on a broker)."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import OFFSET_INVALID, KafkaError, KafkaException, Message, TopicPartition

from kafka2delta.config import KafkaConfig
from kafka2delta.errors import ConfigError, FatalError, RetryableError
from kafka2delta.kafka import DeadLetterTopic, KafkaSource
from kafka2delta.records import DeadLetter
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


class ScriptedConsumer(RefusingConsumer):
    """Returns the scripted messages from consume(); runs the subscription's assign callback when asked."""

    def __init__(self, messages: list[Message]) -> None:
        super().__init__({})
        self.messages = messages

    def consume(self, num_messages: int, timeout: float) -> list[Message]:
        return self.messages


def test_a_fatal_consumer_error_stops_the_daemon() -> None:
    # librdkafka reports a group consumer's fatal error (fenced by a newer member with our group.instance.id)
    # as a consumer error with code _FATAL, whose fatal() is False: it must not be a warning the loop ignores.
    fenced = KafkaError(KafkaError._FATAL, "Fatal error: Broker: Static consumer fenced by other consumer")
    assert not fenced.fatal()
    kafka = source("cooperative-sticky", ScriptedConsumer([Message(error=fenced)]))
    with pytest.raises(FatalError, match="fenced"):
        kafka.consume(10, 0.1)


def test_an_acl_refusal_from_consume_stops_the_daemon_before_admission() -> None:
    refused = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "Broker: Topic authorization failed")
    kafka = source("cooperative-sticky", ScriptedConsumer([Message(topic="t", error=refused)]))
    with pytest.raises(FatalError, match=r"^kafka\.topic: the broker's ACLs"):
        kafka.consume(10, 0.1)


class Listener:
    def __init__(self, failure: Exception) -> None:
        self.failure = failure

    def assigned(self, partitions: list[Partition]) -> dict[Partition, Any]:
        raise self.failure

    def revoked(self, partitions: list[Partition]) -> None:
        raise self.failure

    def lost(self, partitions: list[Partition]) -> None:
        raise self.failure

    def stopping(self) -> bool:
        return False


@pytest.mark.parametrize(
    "failure", [KafkaException(KafkaError(KafkaError._STATE, "Erroneous state")), RetryableError("storage: 503")]
)
def test_a_rebalance_callback_failure_is_fatal(failure: Exception) -> None:
    # confluent-kafka raises a callback's exception from consume() after dropping what that call fetched, whose
    # offsets librdkafka has passed: a retried consume would leave a gap. The daemon stops instead.
    callbacks: dict[str, Any] = {}

    class Subscribing(RefusingConsumer):
        def subscribe(self, topics: list[str], **kwargs: Any) -> None:
            callbacks.update(kwargs)

    # A pattern subscription reads no metadata before subscribing: no broker needed.
    kafka = KafkaSource(KafkaConfig("127.0.0.1:9", "", topic_pattern="^t$"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("kafka2delta.kafka.new_consumer", lambda settings: Subscribing({}))
        kafka.start(Listener(failure))
    for name in ("on_assign", "on_revoke", "on_lost"):
        with pytest.raises(FatalError, match="the consumer cannot go on") as raised:
            callbacks[name](None, [TopicPartition("t", 0)])
        assert raised.value.__cause__ is failure


class SizeLimitedProducer:
    """A producer with a message size limit: its own (refused when produced) or the broker's (refused in the
    delivery report at flush)."""

    def __init__(self, limit: int, where: str, headers_too: bool = False) -> None:
        self.limit, self.where, self.headers_too = limit, where, headers_too
        self.queued: list[tuple[bytes | None, list[tuple[str, Any]], Any]] = []
        self.delivered: list[tuple[bytes | None, dict[str, Any]]] = []

    def produce(self, topic: str, value: bytes | None, key: Any, headers: Any, on_delivery: Any) -> None:
        if self.where == "producer" and value is not None and len(value) > self.limit:
            raise KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "Message size too large"))
        self.queued.append((value, headers, on_delivery))

    def poll(self, timeout: float) -> int:
        return 0

    def flush(self, timeout: float) -> int:
        queued, self.queued = self.queued, []
        for value, headers, on_delivery in queued:
            message = Message(value=value)
            if (value is not None and len(value) > self.limit) or self.headers_too:
                on_delivery(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "Broker: Message size too large"), message)
            else:
                self.delivered.append((value, dict(headers)))
                on_delivery(None, message)
        return 0


@pytest.mark.parametrize("where", ["producer", "broker"])
def test_a_dead_letter_too_large_for_the_topic_goes_without_its_payload(where: str) -> None:
    # It would be refused at every retry and restart: the partition would never move again.
    topic = DeadLetterTopic("127.0.0.1:9", {}, "dlq")
    producer = SizeLimitedProducer(limit=100, where=where)
    topic._producer = producer  # type: ignore[assignment]
    small = DeadLetter("t", 0, 5, "deserialize", "not JSON", b"{broken")
    large = DeadLetter("t", 0, 6, "deserialize", "not JSON", b"x" * 1000)
    topic.produce([small, large])
    assert [value for value, _ in producer.delivered] == [b"{broken", None]
    headers = producer.delivered[1][1]
    assert headers["kafka2delta.offset"] == b"6"
    assert headers["kafka2delta.payload_dropped"] == b"too large for the topic: 1000 bytes"
    assert "kafka2delta.payload_dropped" not in producer.delivered[0][1]


def test_a_dead_letter_refused_even_without_its_payload_is_retried() -> None:
    topic = DeadLetterTopic("127.0.0.1:9", {}, "dlq")
    producer = SizeLimitedProducer(limit=100, where="broker", headers_too=True)  # its headers alone are too large
    topic._producer = producer  # type: ignore[assignment]
    with pytest.raises(RetryableError, match="Message size too large"):
        topic.produce([DeadLetter("t", 0, 6, "deserialize", "not JSON", b"x" * 1000)])


def test_a_setting_the_dead_letter_producer_refuses_names_the_key() -> None:
    settings = {"security.protocol": "SSL", "ssl.ca.location": "/nonexistent/ca.pem"}
    with pytest.raises(ConfigError) as raised:
        DeadLetterTopic("127.0.0.1:9", settings, "dlq")
    assert raised.value.key == "kafka.settings.ssl.ca.location"
