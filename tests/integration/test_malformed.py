"""Malformed messages go to the dead-letter table with their stage and reason; offsets still advance."""

import base64
import json

from confluent_kafka import Consumer

from tests.support.harness import Message, assert_exactly_once, event


def payload(partition: int, seq: int) -> bytes | None:
    if seq % 50 == 7:
        return b'{"id": "broken'
    if seq % 50 == 8:
        return None  # empty: skipped and counted
    if seq % 50 == 9:
        return b'{"id": null, "seq": 1}'  # required column missing
    return event(partition, seq)


def test_malformed_messages_become_dead_letters(setup_factory, daemon_factory) -> None:
    setup = setup_factory(2)
    produced = setup.topic.produce(per_partition=500, payload=payload)
    bad = {(p, s) for p in range(2) for s in range(500) if s % 50 in (7, 9)}
    daemon = daemon_factory(setup, "--until-caught-up")
    assert daemon.wait(120) == 0, daemon.log()[-3000:]
    assert_exactly_once(setup, [i for i in produced if (int(i[1]), int(i.split("-")[1])) not in bad])
    assert setup.txn_versions() == {0: 499, 1: 499}  # the last message (a bad one) is final too
    assert setup.dead_letter_txn_versions() == {0: 499, 1: 499}

    letters = setup.dead_letters()
    assert {(r["partition"], r["offset"]) for r in letters} == bad
    assert len(letters) == len(bad) == 40
    by_offset = {(r["partition"], r["offset"]): r for r in letters}
    broken, missing = by_offset[(0, 7)], by_offset[(1, 9)]
    assert broken["stage"] == "deserialize" and broken["topic"] == setup.topic.name
    assert base64.b64decode(broken["payload_base64"]) == b'{"id": "broken'
    assert broken["payload_json"] is None and broken["timestamp"] is not None
    assert missing["stage"] == "coerce"
    assert missing["error"] == "column 'id' is required but the message has no value for it"
    assert json.loads(missing["payload_json"]) == {"id": None, "seq": 1}
    assert {r["date"] for r in letters} == {letters[0]["ingested_at"].date()}

    log = daemon.log()
    assert f"dead letter {setup.topic.name}[0]@7 stage=deserialize" in log


def test_dead_letters_are_also_produced_to_a_kafka_topic(setup_factory, daemon_factory, topic_factory) -> None:
    dead_letter_topic = topic_factory(1)
    setup = setup_factory(1, sections={"dead_letters": {"topic": dead_letter_topic.name}})
    setup.topic.produce_messages(
        [Message(0, event(0, 0)), Message(0, b"not json", b"k1", [("trace", b"t-1")]), Message(0, event(0, 2))]
    )
    daemon = daemon_factory(setup, "--until-caught-up")
    assert daemon.wait(120) == 0, daemon.log()[-3000:]
    assert sorted(setup.ids()) == ["p0-0", "p0-2"]
    assert [(r["offset"], r["stage"]) for r in setup.dead_letters()] == [(1, "deserialize")]

    consumer = Consumer(
        {"bootstrap.servers": setup.topic.bootstrap, "group.id": "check", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([dead_letter_topic.name])
    try:
        message = None
        for _ in range(60):
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                break
        assert message is not None and message.error() is None
        headers = dict(message.headers() or [])
        assert message.value() == b"not json" and message.key() == b"k1"
        assert headers["kafka2delta.stage"] == b"deserialize"
        assert headers["kafka2delta.topic"] == setup.topic.name.encode()
        assert headers["kafka2delta.offset"] == b"1" and headers["kafka2delta.error"]
    finally:
        consumer.close()
