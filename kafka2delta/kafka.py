"""The Kafka edge: thin wrappers over confluent-kafka for the daemon: the consumer the loop reads
(:class:`KafkaSource`), the producer of the optional dead-letter topic (:class:`DeadLetterTopic`) and
metadata probes. confluent-kafka's exceptions are caught here (and, for its own independent reads,
in ``verify.py``), and re-raised as ours.

The start offset of every partition is set inside the assignment itself (never fetch, then seek):
the rebalance callbacks ask a :class:`RebalanceListener` where each partition starts, and
assign with those offsets.

librdkafka retries every failed connection; the ones no retry can mend (credentials or a certificate refused,
the broker's certificate not trusted: :func:`security_failure`) are seen by the error callback and raised as
FatalError naming the ``kafka.settings`` key, from the next consume or metadata read.
"""

from __future__ import annotations

import gc
import itertools
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, TypeVar, cast

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
)
from confluent_kafka import TopicPartition as KafkaTopicPartition

from kafka2delta.config import KafkaConfig
from kafka2delta.edges import RebalanceListener
from kafka2delta.errors import ConfigError, FatalError, RetryableError
from kafka2delta.offsets import LogicalOffset
from kafka2delta.records import ConsumedBatch, DeadLetter, PartitionMessages, TopicPartition

logger = logging.getLogger(__name__)

FETCH_MAX_BYTES = 1024 * 1024
"""The daemon's fetch.max.bytes, raised to message.max.bytes (librdkafka refuses less) or to an operator's
max.partition.fetch.bytes (fetch.message.max.bytes) when either is set higher.
librdkafka decompresses a fetch response (up to fetch.max.bytes, across all partitions) at once, one op per
message, so the response is what to bound: with 64 partitions of lz4 JSON, 50 MB responses took the peak RSS from
~400 MB to ~900 MB (bench, scaling scenario); on 4 partitions, 1 MiB instead of 8 MB took librdkafka's share of a
250-B catch-up's peak from ~57 MB to ~16 MB (memray) and the catch-up ran no slower (the broker rotates the
partitions of its responses). Not max.partition.fetch.bytes: a partition's record batch larger than that comes back
cut short after the response's first partition, is dropped and fetched again (-15% msg/s)."""

_DEFAULT_SETTINGS = {
    "partition.assignment.strategy": "cooperative-sticky",
    # Bound what librdkafka prefetches so memory stays flat however far behind we are: 16 MiB in all, and at least
    # 5,000 messages per partition (librdkafka's default, 100,000, kept ~110 MB of decompressed message sets and
    # per-message ops in a 250-B catch-up on 4 partitions). A full queue is polled again after 10 ms instead of
    # librdkafka's 1 s, which is what made a small queue starve the fetcher (-35% throughput) before.
    # README "What memory each setting costs".
    "queued.max.messages.kbytes": "16384",
    "queued.min.messages": "5000",
    "fetch.queue.backoff.ms": "10",
    # librdkafka checks that bound per partition, on compressed bytes, before it fetches; fetch.max.bytes (set
    # with the consumer: FETCH_MAX_BYTES) bounds what one response brings.
}


class KafkaSource:
    """The group's consumer of the subscribed topics (a list, or a pattern): the loop's
    :class:`kafka2delta.edges.Source`."""

    def __init__(self, config: KafkaConfig, *, partition_eof: bool = False, with_headers: bool = True) -> None:
        """``with_headers=False`` skips reading headers (only transforms use them)."""
        self._config = config
        self._with_headers = with_headers
        self._subscription = config.subscription()
        self._single_topic = bool(config.topic) or (len(config.topics) == 1 and not config.topic_pattern)
        self._watch = SecurityWatch(config.settings, topic_key=_topic_key(config))
        settings: dict[str, Any] = {**_DEFAULT_SETTINGS, **config.settings}
        raised_by = ("message.max.bytes", "max.partition.fetch.bytes", "fetch.message.max.bytes")
        settings.setdefault(
            "fetch.max.bytes", str(max(FETCH_MAX_BYTES, *(_int_setting(config.settings, key) for key in raised_by)))
        )
        self._cooperative = "cooperative" in str(settings["partition.assignment.strategy"])
        settings.update(
            {
                "bootstrap.servers": config.bootstrap_servers,
                "group.id": config.group_id,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                # A vanished offset must surface as an event we handle by policy, never a silent reset.
                "auto.offset.reset": "error",
                "enable.partition.eof": partition_eof,
                "error_cb": self._on_error,
                "on_commit": self._on_commit,
                "logger": logging.getLogger("kafka2delta.librdkafka"),
            }
        )
        self._settings = settings
        self._consumer: Consumer | None = None  # created in start(): no network in __init__
        # Where each partition was last assigned or sought: its position until a message is consumed.
        self._starts: dict[TopicPartition, int] = {}

    @property
    def consumer(self) -> Consumer:
        if self._consumer is None:
            raise RuntimeError("KafkaSource.start() was not called")
        return self._consumer

    def start(self, listener: RebalanceListener) -> None:
        try:
            self._consumer = new_consumer(self._settings)
            named = [] if self._config.topic_pattern else self._subscription
            metadata = _metadata(self._consumer, self._watch, timeout=30, stopping=listener.stopping) if named else None
        except KafkaException as exc:
            raise RetryableError(f"cannot reach Kafka at {self._config.bootstrap_servers}: {exc}") from exc
        if listener.stopping():
            logger.info("stop asked for before Kafka answered: not joining the group")
            return
        for name in named:
            topic = metadata.topics.get(name) if metadata is not None else None
            if topic is None or topic.error is not None:
                key = _topic_key(self._config)
                raise FatalError(f"{key}: topic {name!r} does not exist ({topic.error if topic else 'no metadata'})")

        @_fatal_in_callback("assignment")
        def on_assign(consumer: Consumer, partitions: list[KafkaTopicPartition]) -> None:
            self._watch.admitted()
            starts = listener.assigned([TopicPartition(tp.topic, tp.partition) for tp in partitions])
            positioned = [KafkaTopicPartition(tp.topic, tp.partition, _to_kafka_offset(o)) for tp, o in starts.items()]
            self._starts.update((TopicPartition(tp.topic, tp.partition), tp.offset) for tp in positioned)
            if self._cooperative:
                consumer.incremental_assign(positioned)
            else:
                consumer.assign(positioned)

        @_fatal_in_callback("revocation")
        def on_revoke(consumer: Consumer, partitions: list[KafkaTopicPartition]) -> None:
            listener.revoked([TopicPartition(tp.topic, tp.partition) for tp in partitions])

        @_fatal_in_callback("loss")
        def on_lost(consumer: Consumer, partitions: list[KafkaTopicPartition]) -> None:
            listener.lost([TopicPartition(tp.topic, tp.partition) for tp in partitions])

        # A pattern (``^…``) is matched by librdkafka against the cluster's topics at every metadata refresh
        # (topic.metadata.refresh.interval.ms): new matching topics are assigned, deleted ones revoked.
        self._consumer.subscribe(self._subscription, on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost)

    def consume(self, max_messages: int, timeout: float) -> ConsumedBatch:
        # Every Message (and every timestamp tuple) is a GC-tracked object: thousands per call set off
        # collection after collection of the young generations (about 10% of the daemon's CPU in the
        # catch-up profile, bench/results/profile-json.txt), yet none of them is in a cycle: reference
        # counting frees them all when this call returns. So the cyclic GC pauses for the call.
        enabled = gc.isenabled()
        gc.disable()
        try:
            return self._consume(max_messages, timeout)
        finally:
            if enabled:
                gc.enable()

    def _consume(self, max_messages: int, timeout: float) -> ConsumedBatch:
        try:
            messages: list[Message] = self.consumer.consume(num_messages=max_messages, timeout=timeout)
        except KafkaException as exc:
            raise RetryableError(f"consume failed: {exc}") from exc
        batch = ConsumedBatch()
        errors: list[Message] = []
        if any(map(Message.error, messages)):  # end-of-partition events, errors: rare, handled one by one
            errors = [message for message in messages if message.error() is not None]
            messages = [message for message in messages if message.error() is None]
        if messages or any(cast(KafkaError, e.error()).code() == KafkaError._PARTITION_EOF for e in errors):
            self._watch.admitted()  # a fetch answered (an error event is none: an ACL refusal comes as one)
        self._watch.check()  # the error callbacks ran inside consume()
        for message in errors:
            self._consume_error(cast(KafkaError, message.error()), message, batch)
        # Column by column with C-level map() calls: this is the per-message part of the hot path.
        # partition() and offset() are set on every message that is not an error.
        partitions = cast(list[int], list(map(Message.partition, messages)))
        # One named topic: every message's topic is that one (no per-message call).
        single = self._subscription[0] if self._single_topic else None
        topics = cast(list[str], list(map(Message.topic, messages))) if single is None else None
        offsets = cast(list[int], list(map(Message.offset, messages)))
        payloads = list(map(Message.value, messages))
        keys = list(map(Message.key, messages))
        stamps = list(map(Message.timestamp, messages))
        headers = list(map(Message.headers, messages)) if self._with_headers else None
        start = 0
        run_keys: list[int] | list[tuple[str, int]] = (
            partitions if topics is None else list(zip(topics, partitions, strict=True))
        )
        runs = itertools.groupby(run_keys)
        # librdkafka hands out each partition's messages in runs: one slice per run, not per message.
        for key, run in runs:
            end = start + sum(1 for _ in run)
            tp = TopicPartition(*key) if isinstance(key, tuple) else TopicPartition(cast(str, single), cast(int, key))
            group = batch.partitions.get(tp)
            if group is None:
                group = batch.partitions[tp] = PartitionMessages(
                    topic=tp.topic,
                    partition=tp.partition,
                    offsets=[],
                    payloads=[],
                    timestamps_ms=[],
                    keys=[],
                    headers=[] if headers is not None else None,
                    timestamp_types=[],
                )
            group.offsets += offsets[start:end]
            group.payloads += payloads[start:end]
            group.keys += keys[start:end]  # type: ignore[operator]  # created as lists just above
            # librdkafka counts timestamp types 0 none, 1 create, 2 log-append; Kafka (and
            # kafka.timestamp_type) -1, 0, 1.
            group.timestamp_types += [kind - 1 for kind, _ in stamps[start:end]]  # type: ignore[operator]
            group.timestamps_ms += [stamp for _, stamp in stamps[start:end]]
            if headers is not None:
                group.headers += headers[start:end]  # type: ignore[operator]
            start = end
        batch.count = len(messages)
        return batch

    def _consume_error(self, error: KafkaError, message: Message, batch: ConsumedBatch) -> None:
        code, topic, partition, offset = error.code(), message.topic(), message.partition(), message.offset()
        tp = TopicPartition(topic, partition) if topic is not None and partition is not None else None
        if code == KafkaError._PARTITION_EOF and tp is not None and offset is not None:
            batch.end_offsets[tp] = offset
        elif code in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE) and tp is not None:
            batch.out_of_range.append(tp)
        elif code == KafkaError._FATAL or error.fatal():
            # librdkafka hands a group consumer its fatal error (fenced by a newer member with our
            # group.instance.id, say) as a consumer error with code _FATAL, whose fatal() is False.
            raise FatalError(f"fatal Kafka error (the consumer cannot go on): {error.str()}")
        elif self._watch.saw(error):
            self._watch.check()  # a refused ACL: fatal at once before admission, after a grace period since
        else:
            logger.warning("Kafka error on %s[%s]@%s: %s", topic, partition, offset, error.str())

    def seek(self, tp: TopicPartition, start: int | LogicalOffset) -> None:
        target = KafkaTopicPartition(tp.topic, tp.partition, _to_kafka_offset(start))
        try:
            self.consumer.seek(target)
        except KafkaException as exc:
            # After an offset-out-of-range error (auto.offset.reset=error) librdkafka refuses to seek the
            # partition ("Erroneous state") and would never fetch it again: assign it afresh at the offset.
            if exc.args[0].code() == KafkaError._STATE and self._reassign(target):
                logger.info("%s re-assigned at %s (librdkafka refused the seek: %s)", tp, start, exc)
            else:
                # Not assigned any more (a rebalance in between): the next owner starts from the log.
                logger.info("seek of %s to %s skipped: %s", tp, start, exc)
                return
        self._starts[tp] = target.offset

    def _reassign(self, target: KafkaTopicPartition) -> bool:
        """Take ``target``'s partition out of the assignment and put it back at ``target.offset``."""
        wanted = TopicPartition(target.topic, target.partition)
        try:
            assigned = [TopicPartition(tp.topic, tp.partition) for tp in self.consumer.assignment()]
            if wanted not in assigned:
                return False
            if self._cooperative:
                self.consumer.incremental_unassign([KafkaTopicPartition(target.topic, target.partition)])
                self.consumer.incremental_assign([target])
                return True
            # Eager: assign() replaces the whole assignment; the others keep their positions (where they
            # were assigned or sought while nothing was consumed since: never the group's offsets).
            others = self.consumer.position([KafkaTopicPartition(*tp) for tp in assigned if tp != wanted])
            for kafka_tp in others:
                if kafka_tp.offset < 0:
                    kafka_tp.offset = self._starts.get(
                        TopicPartition(kafka_tp.topic, kafka_tp.partition), kafka_tp.offset
                    )
            self.consumer.assign([*others, target])
            return True
        except KafkaException as exc:
            logger.warning("re-assigning %s failed: %s", wanted, exc)
            return False

    def commit_group_offsets(self, next_offsets: Mapping[TopicPartition, int]) -> None:
        """Record progress in Kafka for lag tools only; recovery never reads it."""
        offsets = [KafkaTopicPartition(tp.topic, tp.partition, o) for tp, o in next_offsets.items()]
        try:
            self.consumer.commit(offsets=offsets, asynchronous=True)
        except KafkaException as exc:
            logger.info("group offset commit skipped: %s", exc)

    def watermarks(self, tp: TopicPartition, cached: bool = False) -> tuple[int, int]:
        try:
            low, high = self.consumer.get_watermark_offsets(
                KafkaTopicPartition(tp.topic, tp.partition), timeout=10, cached=cached
            )
        except KafkaException as exc:
            raise RetryableError(f"watermarks of {tp}: {exc}") from exc
        return int(low), int(high)

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def _on_error(self, error: KafkaError) -> None:
        if self._watch.saw(error):
            return  # raised by the next consume (or start), naming the setting at fault
        if error.fatal():
            logger.error("fatal Kafka client error: %s", error.str())
        else:
            logger.warning("Kafka client error (librdkafka retries): %s", error.str())

    @staticmethod
    def _on_commit(error: KafkaError | None, partitions: list[KafkaTopicPartition]) -> None:
        if error is not None:
            logger.info("group offset commit failed (lag tools only, recovery unaffected): %s", error.str())


class DeadLetterTopic:
    """Produces dead letters to a Kafka topic: the original key and payload, the reason in headers. A letter too
    large for the topic (the producer's or the broker's message size limit) goes without its payload, marked in
    a header: the dead-letter table holds it whole, and a letter that can never be delivered must not stop the
    daemon at every restart."""

    def __init__(self, bootstrap_servers: str, settings: Mapping[str, str], topic: str) -> None:
        self._topic = topic
        self._producer = new_client(
            Producer,
            {
                **{k: v for k, v in settings.items() if not k.startswith(("partition.", "queued.", "fetch."))},
                "bootstrap.servers": bootstrap_servers,
                "enable.idempotence": True,
                "linger.ms": 20,
                "logger": logging.getLogger("kafka2delta.librdkafka"),
            },
        )

    def produce(self, letters: Sequence[DeadLetter]) -> None:
        """Deliver every letter or raise RetryableError (the caller holds the offsets and retries)."""
        failures: list[str] = []
        too_large: list[DeadLetter] = []

        def delivered(letter: DeadLetter, error: Any, message: Any) -> None:
            if error is None:
                return
            if error.code() == KafkaError.MSG_SIZE_TOO_LARGE and message.value() is not None:
                too_large.append(letter)
            else:
                failures.append(str(error))

        try:
            for letter in letters:
                self._send(letter, letter.payload, partial(delivered, letter))
            remaining = self._producer.flush(30)
            if not remaining:
                # Refused by the broker (its message.max.bytes): once more, without the payload. Refused again
                # (the delivery report's message has no value then), it is a failure.
                for letter in too_large:
                    self._send(letter, None, partial(delivered, letter))
                remaining = self._producer.flush(30) if too_large else 0
        except KafkaException as exc:
            raise RetryableError(f"producing dead letters to {self._topic}: {exc}") from exc
        if remaining or failures:
            raise RetryableError(
                f"producing dead letters to {self._topic}: {remaining} undelivered, errors {failures[:3]}"
            )

    def _send(self, letter: DeadLetter, payload: bytes | None, on_delivery: Callable[[Any, Any], None]) -> None:
        """Queue ``letter``; without ``payload`` (None) it goes as a notice: no payload, a key of at most
        :data:`_NOTICE_BYTES`, its reason cut to that length, so that it fits any topic."""
        key, headers = self._shaped(letter, payload)
        while True:
            try:
                self._producer.produce(self._topic, value=payload, key=key, headers=headers, on_delivery=on_delivery)
                return
            except BufferError:
                self._producer.poll(0.1)
            except KafkaException as exc:
                # The producer's own message.max.bytes refuses it before it is queued.
                if exc.args[0].code() != KafkaError.MSG_SIZE_TOO_LARGE or payload is None:
                    raise
                payload = None
                key, headers = self._shaped(letter, payload)

    def _shaped(self, letter: DeadLetter, payload: bytes | None) -> tuple[bytes | None, _Headers]:
        """The key and headers ``letter`` goes with (as a notice when ``payload`` is None, logged)."""
        reason, key = letter.reason.encode(), letter.key
        headers: _Headers = [
            ("kafka2delta.stage", letter.stage.encode()),
            ("kafka2delta.topic", letter.topic.encode()),
            ("kafka2delta.partition", str(letter.partition).encode()),
            ("kafka2delta.offset", str(letter.offset).encode()),
        ]
        if payload is None:
            reason = reason[:_NOTICE_BYTES]
            key = key if key is None or len(key) <= _NOTICE_BYTES else None
            size = len(letter.payload) + len(letter.key or b"")
            headers.append(("kafka2delta.payload_dropped", f"too large for the topic: {size} bytes".encode()))
            logger.warning(
                "dead letter %s: %d bytes, too large for the topic %s; produced without its payload (the "
                "dead-letter table holds it)",
                letter.where,
                size,
                self._topic,
            )
        return key, [("kafka2delta.error", reason), *headers]


_Headers = list[tuple[str, str | bytes | None]]
_NOTICE_BYTES = 1024
"""A dead letter too large for its topic goes as a notice: its reason and key cut to this (the table holds both)."""


_Callback = Callable[[Consumer, list[KafkaTopicPartition]], None]


def _fatal_in_callback(what: str) -> Callable[[_Callback], _Callback]:
    """A rebalance callback whose failure stops the daemon. confluent-kafka raises a callback's exception from the
    ``consume()`` it ran in, after dropping the messages that call had fetched, whose offsets librdkafka has
    passed already: a consume retried after that would leave a gap the next commit's txn covers. A restart
    reads every partition again from its tables' txn versions instead."""

    def wrap(callback: _Callback) -> _Callback:
        def guarded(consumer: Consumer, partitions: list[KafkaTopicPartition]) -> None:
            try:
                callback(consumer, partitions)
            except (KafkaException, RetryableError) as exc:
                raise FatalError(f"the partition {what} failed, the consumer cannot go on: {exc}") from exc

        return guarded

    return wrap


def _to_kafka_offset(offset: int | LogicalOffset) -> int:
    if offset is LogicalOffset.EARLIEST:
        return int(OFFSET_BEGINNING)
    if offset is LogicalOffset.LATEST:
        return int(OFFSET_END)
    assert isinstance(offset, int)
    return offset


# librdkafka names the setting it refuses when a client is made: "ssl.ca.location failed: …" (a file it cannot
# read), "No such configuration property: \"x\"", "Invalid value \"x\" for configuration property \"y\"".
_REFUSED_SETTING = re.compile(r'(?:consumer|producer): ([\w.]+) failed|configuration property:? "([^"]+)"')


def new_consumer(settings: Mapping[str, Any]) -> Consumer:
    """A librdkafka consumer; a setting it refuses is a :class:`ConfigError` naming ``kafka.settings.<key>``
    (before, a missing CA file read as "cannot reach Kafka")."""
    return new_client(Consumer, settings)


_Client = TypeVar("_Client", Consumer, Producer)


def new_client(kind: type[_Client], settings: Mapping[str, Any]) -> _Client:
    """A librdkafka consumer or producer; a setting it refuses is a :class:`ConfigError` naming
    ``kafka.settings.<key>``."""
    try:
        return kind(dict(settings))
    except KafkaException as exc:
        error = exc.args[0] if exc.args else None
        if not isinstance(error, KafkaError) or error.code() != KafkaError._INVALID_ARG:
            raise
        match = _REFUSED_SETTING.search(error.str())
        key = f"kafka.settings.{next(filter(None, match.groups()))}" if match else "kafka.settings"
        raise ConfigError(key, f"librdkafka refused it: {error.str()}") from exc


def _probe_consumer(bootstrap_servers: str, settings: Mapping[str, str], watch: SecurityWatch) -> Consumer:
    # A consumer that never subscribes: it reads metadata and watermarks without joining a group.
    # librdkafka's own log lines go through Python logging (JSON lines, secrets masked), never raw to stderr.
    return new_consumer(
        {
            **settings,
            "bootstrap.servers": bootstrap_servers,
            "group.id": "kafka2delta-probe",
            "logger": logging.getLogger("kafka2delta.librdkafka"),
            "error_cb": watch.saw,
        }
    )


def topic_partitions(bootstrap_servers: str, topic: str, settings: Mapping[str, str]) -> list[int]:
    """The partitions of ``topic``, read from the broker's metadata."""
    watch = SecurityWatch(settings)
    consumer = _probe_consumer(bootstrap_servers, settings, watch)
    try:
        info = _metadata(consumer, watch, timeout=30, topic=topic).topics.get(topic)
        if info is None or info.error is not None:
            raise FatalError(f"kafka.topic: topic {topic!r} does not exist")
        return sorted(info.partitions)
    except KafkaException as exc:
        raise RetryableError(f"cannot reach Kafka at {bootstrap_servers}: {exc}") from exc
    finally:
        consumer.close()


def subscribed_topics(bootstrap_servers: str, config: KafkaConfig, settings: Mapping[str, str]) -> list[str]:
    """The topics the subscription names, or those of the cluster its pattern matches now."""
    if not config.topic_pattern:
        return config.subscription()
    watch = SecurityWatch(settings)
    consumer = _probe_consumer(bootstrap_servers, settings, watch)
    try:
        topics = _metadata(consumer, watch, timeout=30).topics
    except KafkaException as exc:
        raise RetryableError(f"cannot reach Kafka at {bootstrap_servers}: {exc}") from exc
    finally:
        consumer.close()
    return sorted(name for name in topics if config.subscribes(name))


def high_watermarks(
    bootstrap_servers: str, topic: str, partitions: list[int], settings: Mapping[str, str]
) -> dict[int, int]:
    consumer = _probe_consumer(bootstrap_servers, settings, SecurityWatch(settings))
    try:
        return {
            p: int(consumer.get_watermark_offsets(KafkaTopicPartition(topic, p), timeout=10)[1]) for p in partitions
        }
    except KafkaException as exc:
        raise RetryableError(f"watermarks of {topic}: {exc}") from exc
    finally:
        consumer.close()


# ----------------------------------------------------------------- security failures

# TLS alerts a broker sends when it refuses the client's certificate (or its absence): bad_certificate (42),
# unknown_ca (48), certificate_unknown (46), certificate_expired (45), certificate_revoked (44),
# certificate_required (116).
_CLIENT_CERTIFICATE_REFUSED = re.compile(
    r"alert (bad certificate|unknown ca|certificate (unknown|expired|revoked|required))"
)


def _topic_key(config: KafkaConfig) -> str:
    """The key that names the subscription: ``kafka.topic``, ``kafka.topics`` or ``kafka.topic_pattern``."""
    if config.topic:
        return "kafka.topic"
    return "kafka.topics" if config.topics else "kafka.topic_pattern"


def security_failure(
    error: KafkaError, settings: Mapping[str, str], topic_key: str = "kafka.topic"
) -> FatalError | None:
    """The error no retry can mend, naming the ``kafka.settings`` key at fault, or None for any other error.

    librdkafka retries every connection failure forever and reports each attempt to the error callback; among
    them, the broker refusing our credentials (``_AUTHENTICATION``), or our certificate, and our refusing the
    broker's certificate (``_SSL``, "certificate verify failed") only repeat until someone changes the settings.
    """
    code, text = error.code(), error.str()
    if code in (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED):
        # Let in, but the broker's ACLs refuse this principal the topic or the group: no retry grants them.
        topic = code == KafkaError.TOPIC_AUTHORIZATION_FAILED
        principal = settings.get("sasl.username") or "this client's principal"
        return FatalError(
            f"{topic_key if topic else 'kafka.group_id'}: the broker's ACLs do not allow {principal!r} to "
            f"{'read the topic' if topic else 'join the consumer group'} (grant Read on it); librdkafka: {text}"
        )
    if code in (KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED):
        if "mechanism handshake failed" in text:
            key = _named(settings, ("sasl.mechanism", "sasl.mechanisms"))
            problem = "the broker does not offer this SASL mechanism"
        else:
            key = "sasl.password"
            problem = f"authentication failed for sasl.username {settings.get('sasl.username', '')!r}"
    elif code == KafkaError._SSL and "certificate verify failed" in text:
        key = _named(settings, ("ssl.ca.location", "ssl.ca.pem"))
        problem = "the broker's certificate is not trusted (not signed by this CA, or not for this host name)"
    elif code in (KafkaError._SSL, KafkaError._TRANSPORT) and _CLIENT_CERTIFICATE_REFUSED.search(text):
        keys = ("ssl.certificate.location", "ssl.certificate.pem", "ssl.keystore.location")
        key = _named(settings, keys)
        if any(settings.get(k) for k in keys):
            problem = "the broker refused the client certificate (not signed by a CA it trusts?)"
        else:
            problem = "the broker wants a client certificate (mTLS) and none is set"
    else:
        return None
    return FatalError(f"kafka.settings.{key}: {problem}; librdkafka: {text}")


def _named(settings: Mapping[str, str], keys: tuple[str, ...]) -> str:
    """The first of ``keys`` that is set, else the first of them."""
    return next((key for key in keys if settings.get(key)), keys[0])


SECURITY_GRACE_S = 300
"""How long the broker may refuse a daemon it once admitted before the daemon gives up (exit 1)."""
SECURITY_QUIET_S = 60
"""A refusal this long after the last one starts a new grace period: librdkafka reports a lasting refusal at
every reconnect (``reconnect.backoff.max.ms``, 10 s by default), so the two were not one outage. With that
setting raised, three of its backoffs."""


class SecurityWatch:
    """The error callback's memory: the first :func:`security_failure` librdkafka reported, raised by
    :meth:`check` on the thread that polls (confluent-kafka runs the callback inside poll/consume).

    Before the broker has ever let us in (no assignment, no message yet) a refusal is the configuration's
    fault: fatal at once. Afterwards the same error is often passing (a SCRAM credential not yet on a restarted
    broker, a re-authentication during a rolling restart, a token endpoint timing out): it is logged and
    librdkafka retries, and only a refusal that lasts :data:`SECURITY_GRACE_S` with nothing admitted since is
    fatal."""

    def __init__(
        self, settings: Mapping[str, str], clock: Callable[[], float] = time.monotonic, topic_key: str = "kafka.topic"
    ) -> None:
        self._settings = settings
        self._clock = clock
        self._topic_key = topic_key
        self._quiet_s = max(SECURITY_QUIET_S, 3 * _int_setting(settings, "reconnect.backoff.max.ms") / 1000)
        self.failure: FatalError | None = None
        self._admitted = False
        self._failing_since: float | None = None
        self._last_failure = 0.0

    def admitted(self) -> None:
        """The broker let us in (an assignment, a message): later refusals start out as passing."""
        self._admitted = True
        self._failing_since = None

    def saw(self, error: KafkaError) -> bool:
        """Record ``error`` if it is a security failure (the first one only); whether it is one."""
        failure = security_failure(error, self._settings, self._topic_key)
        if failure is not None and self.failure is None:
            self.failure = failure
        return failure is not None

    def check(self) -> None:
        if self.failure is None:
            return
        if not self._admitted:
            raise self.failure
        now = self._clock()
        if self._failing_since is None or now - self._last_failure >= self._quiet_s:
            self._failing_since = now
            logger.warning("%s (librdkafka retries; fatal if it lasts %d s)", self.failure, SECURITY_GRACE_S)
        elif now - self._failing_since >= SECURITY_GRACE_S:
            raise FatalError(f"{self.failure} (for {now - self._failing_since:.0f} s)")
        self._last_failure = now
        self.failure = None  # the next refusal is recorded afresh; the clock runs from the first


def _metadata(
    consumer: Consumer,
    watch: SecurityWatch,
    timeout: float,
    topic: str | None = None,
    stopping: Callable[[], bool] | None = None,
) -> Any:
    """``list_topics``, in slices of a second with the error callbacks served in between: a security failure
    raises FatalError at once instead of a bare "transport failure" when ``timeout`` runs out. None once
    ``stopping()`` says so: a SIGTERM while the broker is out does not wait out the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        try:
            return consumer.list_topics(topic, timeout=max(0.1, min(1.0, remaining)))
        except KafkaException:
            consumer.poll(0)  # runs the error callback for what librdkafka met meanwhile
            watch.check()
            if stopping is not None and stopping():
                return None
            if remaining <= 1.0:
                raise


def _int_setting(settings: Mapping[str, Any], key: str) -> int:
    """``settings[key]`` as an integer; 0 when absent or not a number (librdkafka then names it itself)."""
    try:
        return int(settings.get(key, 0))
    except (TypeError, ValueError):
        return 0
