"""Many topics in one daemon (``make bench-topics``): the same messages as T one-partition topics, a table each
(``table.uri = …/{topic}``), against one topic of T partitions into one table.

    python -m bench.topics [--topics 200] [--messages 1000]

It starts its own broker (dev/kafka), produces ``--messages`` JSON events to each topic, and runs
``kafka2delta ingest --until-caught-up`` on each layout, measuring wall time, CPU and peak RSS of the
daemon (:class:`bench.measure.TreeMonitor`), and the commits made. Results: ``bench/results/topics.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic  # what confluent_kafka.admin re-exports (not in its __all__)
from deltalake import DeltaTable

from bench.datasets import DATASETS, Timestamps
from bench.measure import TreeMonitor, cpu_s_of_children, machine
from dev.kafka.broker import LocalBroker

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "topics.json"


def create(bootstrap: str, names: list[str], partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(n, num_partitions=partitions, replication_factor=1) for n in names])
    for future in futures.values():
        future.result(timeout=120)


def produce(bootstrap: str, targets: list[tuple[str, int]], messages: int) -> int:
    """``messages`` events to each (topic, partition); the payload bytes produced."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10000})
    make = DATASETS["json"].maker()
    stamps = Timestamps(dt.datetime.now(dt.UTC))
    total = 0
    for seq in range(messages):
        for topic, partition in targets:
            value = make(partition, seq, stamps.at(seq))
            total += len(value)
            while True:
                try:
                    producer.produce(topic, value=value, partition=partition)
                    break
                except BufferError:
                    producer.poll(0.1)
    assert producer.flush(120) == 0
    return total


def ingest(bootstrap: str, work: Path, subscription: dict[str, str], uri: str, messages: int) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("K2D_")}
    env.update(
        {
            "PYTHONPATH": str(ROOT),
            "K2D_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
            "K2D_KAFKA__GROUP_ID": f"bench-{work.name}",
            "K2D_TABLE__URI": uri,
            "K2D_TABLE__SCHEMA": json.dumps(DATASETS["json"].schema),
            "K2D_INGEST__ALLOWED_LATENCY_S": "5",
            "K2D_LOGGING__FORMAT": "json",
            **subscription,
        }
    )
    log = work / "daemon.log"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    with log.open("wb") as out:
        command = [sys.executable, "-m", "kafka2delta", "ingest", "--until-caught-up"]
        proc = subprocess.Popen(command, env=env, cwd=work, stdout=out, stderr=out)
        with TreeMonitor(proc.pid) as monitor:
            code = proc.wait()
    wall = time.monotonic() - started
    if code != 0:
        raise RuntimeError(f"the daemon exited with {code}; see {log}")
    cpu = max(cpu_s_of_children(before, resource.getrusage(resource.RUSAGE_CHILDREN)), monitor.cpu_s)
    return {
        "wall_s": round(wall, 2),
        "msgs_per_s": round(messages / wall),
        "cpu_s": round(cpu, 2),
        "cpu_s_per_million": round(cpu / messages * 1e6, 2),
        "peak_rss_mb": monitor.peak_rss_mb,
    }


def table_rows_and_commits(uris: list[str]) -> tuple[int, int]:
    rows = commits = 0
    for uri in uris:
        table = DeltaTable(uri)
        rows += int(table.count())
        commits += table.version()  # version 0 is the table's creation
    return rows, commits


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topics", type=int, default=200)
    parser.add_argument("--messages", type=int, default=1000, help="messages per topic")
    args = parser.parse_args()
    total = args.topics * args.messages
    results: dict[str, Any] = {"topics": args.topics, "messages_per_topic": args.messages, "machine": machine()}
    with tempfile.TemporaryDirectory(prefix="k2d-bench-topics-") as tmp:
        work = Path(tmp)
        with LocalBroker(work / "kafka") as broker:
            bootstrap = broker.bootstrap_servers
            names = [f"bench.many.{i:03d}" for i in range(args.topics)]
            create(bootstrap, names, 1)
            create(bootstrap, ["bench.one"], args.topics)
            payload = produce(bootstrap, [(n, 0) for n in names], args.messages)
            produce(bootstrap, [("bench.one", p) for p in range(args.topics)], args.messages)
            print(f"produced {total:,} messages ({payload / total:.0f} B each) twice", flush=True)

            lake = work / "lake"
            many = ingest(
                bootstrap, work / "many", {"K2D_KAFKA__TOPIC_PATTERN": r"^bench\.many\..*"}, f"{lake}/{{topic}}", total
            )
            rows, commits = table_rows_and_commits([str(lake / n) for n in names])
            results["many_topics"] = {**many, "rows": rows, "commits": commits, "tables": len(names)}
            one_uri = str(work / "one")
            one = ingest(bootstrap, work / "one-run", {"K2D_KAFKA__TOPIC": "bench.one"}, one_uri, total)
            rows, commits = table_rows_and_commits([one_uri])
            results["one_topic"] = {**one, "rows": rows, "commits": commits, "tables": 1}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    for layout in ("many_topics", "one_topic"):
        r = results[layout]
        print(
            f"{layout}: {r['tables']} tables, {r['rows']:,} rows, {r['msgs_per_s']:,} msg/s, "
            f"{r['cpu_s_per_million']} CPU s/M, peak RSS {r['peak_rss_mb']} MB, {r['commits']} commits"
        )
    return 0 if all(results[k]["rows"] == total for k in ("many_topics", "one_topic")) else 1


if __name__ == "__main__":
    sys.exit(main())
