"""A fast batched producer (confluent-kafka) of the benchmark's data sets.

Two modes:

- backlog: ``produce_backlog`` writes N messages spread evenly over the partitions as fast as librdkafka
  takes them (large batches, lz4, linger 50 ms) — the catch-up and scaling scenarios;
- rate: ``python -m bench.producer --rate R --seconds S …`` produces R messages/s for S seconds in ticks of
  10 ms (linger 5 ms, so the producer adds little to the latency it is measured by). The Kafka timestamp
  is librdkafka's create time, taken when ``produce()`` is called. Prints one JSON line with what it did.

The payload's ``ts`` is the time of production (rate) or a base time plus one microsecond per message (backlog).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing
import signal
import sys
import time

from confluent_kafka import Producer

from bench.datasets import DATASETS, Timestamps, now_ts

BACKLOG_SETTINGS = {
    "linger.ms": 50,
    "batch.size": 1_000_000,
    "batch.num.messages": 100_000,
    "compression.type": "lz4",
    "queue.buffering.max.messages": 2_000_000,
    "queue.buffering.max.kbytes": 1_048_576,
    "acks": "1",
}
RATE_SETTINGS = {
    "linger.ms": 5,
    "batch.size": 1_000_000,
    "compression.type": "lz4",
    "queue.buffering.max.messages": 1_000_000,
    "acks": "1",
}


def _producer(bootstrap: str, settings: dict[str, object]) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, **settings})


def produce_backlog(
    bootstrap: str, topic: str, partitions: int, messages: int, dataset: str, workers: int = 2, schema_id: int = 0
) -> dict[str, float]:
    """Produce ``messages`` (a multiple of ``partitions`` is produced: the rest is dropped) round-robin over
    the partitions, from ``workers`` processes that each own a share of the partitions; return the count,
    seconds and payload bytes. ``schema_id``: the registered writer schema of a registry data set."""
    per_partition = messages // partitions
    base = dt.datetime.now(dt.UTC)
    shares = [list(range(partitions))[w::workers] for w in range(min(workers, partitions))]
    started = time.monotonic()
    if len(shares) == 1:
        total_bytes = _produce_share(bootstrap, topic, shares[0], per_partition, dataset, base, schema_id)
    else:
        context = multiprocessing.get_context("fork")
        # The workers take SIGTERM's default action (the harness's handler would make Pool's exit noisy).
        with context.Pool(len(shares), initializer=signal.signal, initargs=(signal.SIGTERM, signal.SIG_DFL)) as pool:
            sizes = pool.starmap(
                _produce_share, [(bootstrap, topic, share, per_partition, dataset, base, schema_id) for share in shares]
            )
        total_bytes = sum(sizes)
    return {
        "messages": per_partition * partitions,
        "seconds": time.monotonic() - started,
        "bytes": total_bytes,
    }


def _produce_share(
    bootstrap: str,
    topic: str,
    partitions: list[int],
    per_partition: int,
    dataset: str,
    base: dt.datetime,
    schema_id: int = 0,
) -> int:
    """``per_partition`` messages to each of ``partitions``; returns the payload bytes."""
    make = DATASETS[dataset].maker(schema_id)
    producer = _producer(bootstrap, BACKLOG_SETTINGS)
    stamps = Timestamps(base)
    produce = producer.produce
    total_bytes = 0
    for seq in range(per_partition):
        ts = stamps.at(seq)
        for partition in partitions:
            value = make(partition, seq, ts)
            total_bytes += len(value)
            while True:
                try:
                    produce(topic, value=value, partition=partition)
                    break
                except BufferError:
                    producer.poll(0.05)
        if seq % 2000 == 0:
            producer.poll(0)
    if producer.flush(300) != 0:
        raise RuntimeError("the producer could not deliver every message")
    return total_bytes


def produce_rate(bootstrap: str, topic: str, partitions: int, rate: float, seconds: float, dataset: str) -> dict:
    """``rate`` messages/s for ``seconds``, round-robin over the partitions, in 10-ms ticks."""
    make = DATASETS[dataset].maker()
    producer = _producer(bootstrap, RATE_SETTINGS)
    tick = 0.01
    sent = 0
    total_bytes = 0
    late_ticks = 0
    started = time.monotonic()
    first_wall = time.time()
    next_tick = started
    while True:
        now = time.monotonic()
        elapsed = now - started
        if elapsed >= seconds:
            break
        due = int(min(elapsed + tick, seconds) * rate)
        ts = now_ts()
        while sent < due:
            value = make(sent % partitions, sent // partitions, ts)
            total_bytes += len(value)
            try:
                producer.produce(topic, value=value, partition=sent % partitions)
            except BufferError:
                producer.poll(0.01)
                continue
            sent += 1
        producer.poll(0)
        next_tick += tick
        pause = next_tick - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        else:
            late_ticks += 1
    produce_s = time.monotonic() - started
    if producer.flush(120) != 0:
        raise RuntimeError("the producer could not deliver every message")
    return {
        "messages": sent,
        "seconds": round(produce_s, 3),
        "rate": round(sent / produce_s),
        "bytes": total_bytes,
        "late_ticks": late_ticks,
        "first_wall": first_wall,
        "last_wall": time.time(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--partitions", type=int, required=True)
    parser.add_argument("--dataset", choices=sorted(DATASETS), default="json")
    parser.add_argument("--messages", type=int, help="backlog mode: produce this many as fast as possible")
    parser.add_argument("--rate", type=float, help="rate mode: messages per second")
    parser.add_argument("--seconds", type=float, default=60.0, help="rate mode: for this long")
    args = parser.parse_args()
    if args.rate:
        result = produce_rate(args.bootstrap, args.topic, args.partitions, args.rate, args.seconds, args.dataset)
    elif args.messages:
        result = produce_backlog(args.bootstrap, args.topic, args.partitions, args.messages, args.dataset)
    else:
        parser.error("give --rate or --messages")
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
