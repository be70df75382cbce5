"""A fake of the consumer ``kafka2delta verify`` reads a topic with (the calls verify_reading makes), for unit tests.

Messages are ``(offset, value, key)`` per topic and partition; the watermarks are the first offset and one past the
last. ``fail_at`` makes the broker answer a partition's read at an offset with an error code instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError

from kafka2delta import verify, verify_changes, verify_reading

Stored = tuple[int, bytes | None, bytes | None]


class _Message:
    def __init__(self, topic: str, partition: int, offset: int, value: bytes | None, key: bytes | None) -> None:
        self._where, self._value, self._key = (topic, partition, offset), value, key
        self._error: KafkaError | None = None

    def topic(self) -> str:
        return self._where[0]

    def partition(self) -> int:
        return self._where[1]

    def offset(self) -> int:
        return self._where[2]

    def value(self) -> bytes | None:
        return self._value

    def key(self) -> bytes | None:
        return self._key

    def headers(self) -> None:
        return None

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_700_000_000_000)

    def error(self) -> KafkaError | None:
        return self._error


def _error_message(topic: str, partition: int, offset: int, code: int) -> _Message:
    message = _Message(topic, partition, offset, None, None)
    message._error = KafkaError(code)
    return message


Topics = Mapping[str, Mapping[int, Sequence[Stored]]]


class FakeVerifyConsumer:
    def __init__(
        self, topics: Topics, settings: Mapping[str, Any], fail_at: Mapping[int, tuple[int, int]] | None = None
    ) -> None:
        self.topics, self.settings, self.fail_at = topics, dict(settings), fail_at or {}
        self.queue: list[_Message] = []
        self.closed = False

    def list_topics(self, topic: str, timeout: float) -> Any:
        found = {topic: SimpleNamespace(error=None, partitions=dict.fromkeys(self.topics[topic]))}
        return SimpleNamespace(topics=found if topic in self.topics else {})

    def get_watermark_offsets(self, tp: Any, timeout: float) -> tuple[int, int]:
        found = self.topics[tp.topic][tp.partition]
        return (found[0][0], found[-1][0] + 1) if found else (0, 0)

    def assign(self, partitions: Sequence[Any]) -> None:
        for tp in partitions:
            failure = self.fail_at.get(tp.partition)
            for offset, value, key in self.topics[tp.topic][tp.partition]:
                if failure is not None and offset == failure[0]:
                    self.queue.append(_error_message(tp.topic, tp.partition, offset, failure[1]))
                    break
                if offset >= tp.offset:
                    self.queue.append(_Message(tp.topic, tp.partition, offset, value, key))
            else:
                end = self.get_watermark_offsets(tp, 0)[1]
                self.queue.append(_error_message(tp.topic, tp.partition, end, KafkaError._PARTITION_EOF))

    def consume(self, count: int, timeout: float) -> list[_Message]:
        taken, self.queue = self.queue[:count], self.queue[count:]
        return taken

    def close(self) -> None:
        self.closed = True


def serve_topics(
    monkeypatch: pytest.MonkeyPatch,
    topics: Topics,
    *,
    compacted: bool = False,
    fail_at: Mapping[int, tuple[int, int]] | None = None,
) -> list[FakeVerifyConsumer]:
    """Make verify read ``topics`` from the fake (their partitions, their compaction policy); returns the consumers
    made."""
    made: list[FakeVerifyConsumer] = []

    def consumer(settings: Mapping[str, Any]) -> FakeVerifyConsumer:
        made.append(FakeVerifyConsumer(topics, settings, fail_at))
        return made[-1]

    def partitions(bootstrap_servers: str, topic: str, settings: Mapping[str, str]) -> list[int]:
        return sorted(topics[topic])

    monkeypatch.setattr(verify_reading, "new_consumer", consumer)
    monkeypatch.setattr(verify, "topic_partitions", partitions)
    monkeypatch.setattr(verify_changes, "topic_partitions", partitions)
    monkeypatch.setattr(verify, "is_compacted", lambda *args: compacted)
    monkeypatch.setattr(verify_changes, "is_compacted", lambda *args: compacted)
    return made
