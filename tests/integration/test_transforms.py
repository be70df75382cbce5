"""A transform chain on a real topic: Kafka metadata, the decoded key and headers, nested targets,
later transforms reading earlier ones, and a filter whose skipped messages still advance the offsets."""

import datetime as dt
import json

from tests.support.harness import Message

SCHEMA = {
    "id": "string not null",
    "type": "string",
    "offset": "long",
    "partition": "int",
    "topic": "string",
    "key_user": "string",
    "tenant": "string",
    "meta": "struct<offset:long,kafka_ts:timestamp,day:date>",
}
TRANSFORMS = {
    "offset": "kafka.offset",
    "partition": "kafka.partition",
    "topic": "kafka.topic",
    "key_user": "kafka.key.user",
    "tenant": "kafka.headers.tenant",
    "meta.offset": "offset",  # reads the result of the first transform
    "meta.kafka_ts": "kafka.timestamp",
    "meta.day": "substr(ts, `0`, `10`)",
}


def test_transform_chain_with_metadata_key_headers_and_filter(setup_factory, daemon_factory) -> None:
    setup = setup_factory(
        2,
        schema=SCHEMA,
        sections={
            "format": {"key": "json"},
            "transforms": TRANSFORMS,
            "filter": {"expression": "type != 'heartbeat'"},
        },
    )
    messages = []
    for n in range(400):
        kind = "heartbeat" if n % 10 == 0 else "click"
        doc = {"id": f"e{n}", "type": kind, "ts": f"2026-11-{1 + n % 28:02d}T08:00:00Z"}
        key = json.dumps({"user": f"u{n % 7}"}).encode()
        messages.append(Message(n % 2, json.dumps(doc).encode(), key, [("tenant", f"t{n % 3}".encode())]))
    before = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=5)
    setup.topic.produce_messages(messages)
    daemon = daemon_factory(setup, "--until-caught-up")
    assert daemon.wait(120) == 0, daemon.log()[-3000:]

    rows = {r["id"]: r for r in setup.rows()}
    assert set(rows) == {f"e{n}" for n in range(400) if n % 10}  # heartbeats filtered out
    assert setup.dead_letters() == []
    assert setup.txn_versions() == {0: 199, 1: 199}  # filtered messages advance the offsets too
    for n in range(400):
        if n % 10 == 0:
            continue
        row = rows[f"e{n}"]
        assert row["partition"] == n % 2 and row["offset"] == n // 2 and row["topic"] == setup.topic.name
        assert row["key_user"] == f"u{n % 7}" and row["tenant"] == f"t{n % 3}"
        assert row["meta"]["offset"] == row["offset"]
        assert row["meta"]["day"] == dt.date(2026, 11, 1 + n % 28)
        assert before <= row["meta"]["kafka_ts"] <= dt.datetime.now(dt.UTC)
    assert "40 filtered" in daemon.log()
