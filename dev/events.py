"""Sample events for the demo and the benchmark: ~250-byte JSON with a nested object and a timestamp."""

from __future__ import annotations

import datetime as dt
import time

from confluent_kafka import Producer

EVENT_TYPES = ("click", "view", "purchase", "signup")
COUNTRIES = ("FR", "DE", "US", "JP", "BR", "IN")
EVENT_SCHEMA = {
    "id": "string not null",
    "type": "string",
    "amount": "double",
    "ts": "timestamp",
    "user": "struct<id:long,country:string>",
}


def make_event(partition: int, seq: int, now: dt.datetime) -> bytes:
    return event_json(partition, seq, (now + dt.timedelta(microseconds=seq)).strftime("%Y-%m-%dT%H:%M:%S.%fZ"))


def event_json(partition: int, seq: int, ts: str) -> bytes:
    """The event ``seq`` of ``partition`` with the RFC 3339 timestamp ``ts`` (also the benchmark's ``json``)."""
    return (
        f'{{"id":"p{partition}-{seq}","type":"{EVENT_TYPES[seq % 4]}","amount":{seq % 1000 / 10},'
        f'"ts":"{ts}","user":{{"id":{seq % 100_003},"country":"{COUNTRIES[seq % 6]}"}},'
        f'"session":"s-{seq % 9973:05d}-{partition}","page":"/products/{seq % 517}","referrer":"https://example.com/",'
        f'"ua":"Mozilla/5.0 (X11; Linux x86_64) Gecko/20100101"}}'
    ).encode()


def produce_events(bootstrap: str, topic: str, partitions: int, per_partition: int) -> float:
    """Produce ``per_partition`` events to every partition; return the seconds it took."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 50,
            "batch.size": 1_000_000,
            "compression.type": "lz4",
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    now = dt.datetime.now(dt.UTC)
    started = time.monotonic()
    for seq in range(per_partition):
        for partition in range(partitions):
            value = make_event(partition, seq, now)
            while True:
                try:
                    producer.produce(topic, value=value, partition=partition)
                    break
                except BufferError:
                    producer.poll(0.05)
        if seq % 10_000 == 0:
            producer.poll(0)
    if producer.flush(120) != 0:
        raise RuntimeError("the producer could not deliver every message")
    return time.monotonic() - started
