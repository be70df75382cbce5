"""Upsert tables under a stream of changes (``make bench-upsert``): kafka2delta's upsert mode against Spark
Structured Streaming ``foreachBatch`` MERGE (delta-spark), on the same machine, with the same changes.

    python -m bench.upsert [--rows 1000000] [--rate 2000] [--seconds 60] [--flush 1,10,60]
                           [--keys uniform,recent] [--skip-spark] [--quick]

For each key distribution and flush interval, and for each engine: a table of ``--rows`` rows is written
(sorted by ``id``, 16 files), a topic of 4 partitions gets ``--rate`` changes per second for ``--seconds``
seconds (70% updates of existing keys, 20% inserts of new keys, 10% deletes as tombstones; ``uniform`` keys or
``recent``: 90% of the updates and deletes among the newest 5% of keys), keyed by ``{"id": …}``, while the
engine applies them with a commit every flush interval (kafka2delta ``ingest.allowed_latency_s``, Spark's
trigger). Both engines get the identical sequence of changes (the same seed), each on its own topic.

Figures per run: changes/s applied (the rate is sustainable when the engine is caught up within one flush
interval plus 10 s of the producer's end), P50/P99 latency from a change's Kafka timestamp to the commit that
made it readable, bytes written per change (write amplification: Parquet bytes the commits add / changes),
peak RSS and CPU seconds of the engine's process tree. Results: ``bench/results/upsert.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic  # what confluent_kafka.admin re-exports (not in its __all__)
from deltalake import DeltaTable, write_deltalake

from bench.measure import TreeMonitor, machine
from dev.kafka.broker import LocalBroker

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "upsert.json"
PARTITIONS = 4
SCHEMA = {"id": "long not null", "name": "string", "amount": "double", "payload": "string", "changed_ms": "long"}
_ARROW = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("name", pa.string()),
        pa.field("amount", pa.float64()),
        pa.field("payload", pa.string()),
        pa.field("changed_ms", pa.int64()),
    ]
)
_PAYLOAD = "x" * 100


def seed_table(uri: str, rows: int, *, changelog: bool = False) -> None:
    """``rows`` rows sorted by id in 16 files (what a table compacted and Z-ordered on its key looks like);
    ``changelog``: as a changelog's snapshot (``_op = "r"``, Kafka coordinates -1, before any change)."""
    per_file = -(-rows // 16)
    for start in range(0, rows, per_file):
        ids = np.arange(start, min(rows, start + per_file), dtype=np.int64)
        batch = pa.table(
            {
                "id": ids,
                "name": pa.array([f"row {i}" for i in ids.tolist()]),
                "amount": ids.astype(np.float64) / 100,
                "payload": pa.array([_PAYLOAD] * len(ids)),
                "changed_ms": np.zeros(len(ids), dtype=np.int64),
            },
            schema=_ARROW,
        )
        if changelog:
            batch = (
                batch.append_column("kafka_partition", pa.array([-1] * len(ids), pa.int32()))
                .append_column("kafka_offset", pa.array([-1] * len(ids), pa.int64()))
                .append_column("_op", pa.array(["r"] * len(ids), pa.string()))
            )
        write_deltalake(uri, batch, mode="append")


def changes(rows: int, keys: str, seed: int) -> Iterator[tuple[int, dict[str, Any] | None]]:
    """The change stream: (key, new row or None for a delete), forever."""
    rng = random.Random(seed)
    live = rows  # ids 0..live-1 exist (a delete leaves a hole: updating it re-inserts, as a source would not,
    # which only makes the mix a little more insert-heavy)
    while True:
        roll = rng.random()
        if roll < 0.2:
            key = live
            live += 1
        elif keys == "recent" and rng.random() < 0.9:
            key = rng.randrange(max(0, live - live // 20), live)
        else:
            key = rng.randrange(live)
        if 0.2 <= roll < 0.3:
            yield key, None
        else:
            yield (
                key,
                {
                    "id": key,
                    "name": f"row {key} v{rng.randrange(1000)}",
                    "amount": rng.random() * 1000,
                    "payload": _PAYLOAD,
                },
            )


def produce(
    bootstrap: str, topic: str, rows: int, keys: str, rate: int, seconds: float
) -> dict[tuple[int, int], float]:
    """``rate`` changes/s for ``seconds``; returns (partition, offset) → Kafka timestamp (epoch s)."""
    stamps: dict[tuple[int, int], float] = {}

    def delivered(err: Any, msg: Any) -> None:
        if err is None:
            stamps[(msg.partition(), msg.offset())] = msg.timestamp()[1] / 1000

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    stream = changes(rows, keys, seed=1125)
    started = time.monotonic()
    sent = 0
    while (elapsed := time.monotonic() - started) < seconds:
        due = int(elapsed * rate) - sent
        for _ in range(due):
            key, row = next(stream)
            value = None if row is None else json.dumps({**row, "changed_ms": int(time.time() * 1000)}).encode()
            producer.produce(
                topic,
                key=json.dumps({"id": key}).encode(),
                value=value,
                partition=key % PARTITIONS,
                on_delivery=delivered,
            )
            sent += 1
        producer.poll(0)
        time.sleep(0.01)
    producer.flush(60)
    return stamps


def commits(uri: str, operations: tuple[str, ...] = ("MERGE",), *, with_version: bool = False) -> list[dict[str, Any]]:
    """Every commit of ``operations`` after the seed: its timestamp (s), the bytes and files it adds, the bytes it
    removes, and (daemon) its offsets."""
    found = []
    for path in sorted((Path(uri) / "_delta_log").glob("*.json")):
        info: dict[str, Any] = {}
        added = removed = files = 0
        for line in path.read_text().splitlines():
            action = json.loads(line) if line.strip() else {}
            if "commitInfo" in action:
                info = action["commitInfo"]
            added += action.get("add", {}).get("size", 0)
            files += "add" in action
            removed += action.get("remove", {}).get("size", 0) or 0
        operation = info.get("operation")
        if operation in operations and (operation != "WRITE" or info.get("kafka2delta")):  # not the seed's WRITE
            commit = {
                "ts": info["timestamp"] / 1000,
                "added": added,
                "files": files,
                "removed": removed,
                "kafka2delta": info.get("kafka2delta"),
            }
            found.append({**commit, "version": int(path.stem)} if with_version else commit)
    return found


def latencies(stamps: dict[tuple[int, int], float], readable: dict[tuple[int, int], float]) -> dict[str, float]:
    values = np.array([readable[k] - stamps[k] for k in stamps if k in readable])
    if not len(values):
        return {"p50_s": float("nan"), "p99_s": float("nan"), "measured": 0}
    return {
        "p50_s": round(float(np.percentile(values, 50)), 2),
        "p99_s": round(float(np.percentile(values, 99)), 2),
        "measured": len(values),
    }


def daemon_environment(work: Path, bootstrap: str, topic: str, uri: str, flush: float, mode: str) -> dict[str, str]:
    """The daemon's configuration (environment variables): ``topic`` into ``uri`` in ``mode``, keyed by ``id``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("K2D_")}
    env.update(
        {
            "PYTHONPATH": str(ROOT),
            "K2D_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
            "K2D_KAFKA__TOPIC": topic,
            "K2D_KAFKA__GROUP_ID": f"bench-{topic}",
            "K2D_TABLE__URI": uri,
            "K2D_TABLE__MODE": mode,
            "K2D_TABLE__KEY": "id",
            "K2D_FORMAT__KEY": "json",
            "K2D_TABLE__SCHEMA": json.dumps(SCHEMA),
            "K2D_INGEST__ALLOWED_LATENCY_S": str(flush),
            "K2D_DEAD_LETTERS__TABLE_URI": str(work / "dead_letters"),
        }
    )
    return env


def run_daemon(
    bootstrap: str, work: Path, topic: str, uri: str, flush: float, args: argparse.Namespace
) -> dict[str, Any]:
    env = daemon_environment(work, bootstrap, topic, uri, flush, "upsert")
    log = (work / "daemon.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "kafka2delta", "ingest"], env=env, cwd=work, stdout=log, stderr=log)
    with TreeMonitor(proc.pid) as monitor:
        time.sleep(3)  # assigned and polling before the first change
        started = time.monotonic()
        stamps = produce(bootstrap, topic, args.rows, args.keys_now, args.rate, args.seconds)
        produced = time.monotonic()
        last = {p: max((o for (q, o) in stamps if q == p), default=-1) for p in range(PARTITIONS)}
        caught_up = wait_txns(uri, topic, last, timeout=max(120.0, 4 * flush))
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
    log.close()
    readable: dict[tuple[int, int], float] = {}
    found = commits(uri)
    for commit in found:
        for partition, (first, last_offset) in (commit["kafka2delta"] or {}).get("offsets", {}).items():
            for offset in range(first, last_offset + 1):
                readable.setdefault((int(partition), offset), commit["ts"])
    return summary(stamps, readable, found, monitor, started, produced, caught_up, flush)


def wait_txns(uri: str, topic: str, last: dict[int, int], timeout: float) -> float | None:
    """The monotonic time the table's txns reached ``last``; None after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        table = DeltaTable(uri)
        if all((table.transaction_version(f"{topic}-{p}") or -1) >= o for p, o in last.items()):
            return time.monotonic()
        time.sleep(0.2)
    return None


class Measured(Protocol):
    """What a run's summary reads of the engine's processes (a :class:`TreeMonitor`, or several added)."""

    @property
    def peak_rss_mb(self) -> float: ...

    @property
    def cpu_s(self) -> float: ...


def summary(
    stamps: dict[tuple[int, int], float],
    readable: dict[tuple[int, int], float],
    found: list[dict[str, Any]],
    monitor: Measured,
    started: float,
    produced: float,
    caught_up: float | None,
    flush: float,
) -> dict[str, Any]:
    changes_count = len(stamps)
    behind = None if caught_up is None else round(caught_up - produced, 1)
    return {
        "changes": changes_count,
        "changes_per_s": round(changes_count / ((caught_up or time.monotonic()) - started)),
        "sustainable": behind is not None and behind <= flush + 10,
        "caught_up_after_s": behind,
        **latencies(stamps, readable),
        "commits": len(found),
        "bytes_written_per_change": round(sum(c["added"] for c in found) / max(1, changes_count)),
        "bytes_removed_per_change": round(sum(c["removed"] for c in found) / max(1, changes_count)),
        "peak_rss_mb": monitor.peak_rss_mb,
        "cpu_s": round(monitor.cpu_s, 1),
    }


def run_spark(
    bootstrap: str, work: Path, topic: str, uri: str, flush: float, args: argparse.Namespace
) -> dict[str, Any]:
    batches = work / "batches.jsonl"
    command = [
        sys.executable,
        "-m",
        "bench.spark_upsert",
        "--bootstrap",
        bootstrap,
        "--topic",
        topic,
        "--table",
        uri,
        "--checkpoint",
        str(work / "checkpoint"),
        "--trigger-s",
        str(flush),
        "--batches",
        str(batches),
        "--ready-file",
        str(work / "ready"),
        "--stop-file",
        str(work / "stop"),
    ]
    log = (work / "spark.log").open("wb")
    proc = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=log, env={**os.environ, "PYTHONPATH": str(ROOT)})
    with TreeMonitor(proc.pid) as monitor:
        deadline = time.monotonic() + 300
        while not (work / "ready").exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the Spark job did not start; see {work / 'spark.log'}")
            time.sleep(0.5)
        started = time.monotonic()
        stamps = produce(bootstrap, topic, args.rows, args.keys_now, args.rate, args.seconds)
        produced = time.monotonic()
        last = {p: max((o for (q, o) in stamps if q == p), default=-1) for p in range(PARTITIONS)}
        caught_up = None
        deadline = time.monotonic() + max(120.0, 4 * flush)
        while time.monotonic() < deadline and caught_up is None:
            done = spark_offsets(batches)
            if all(done.get(p, -1) >= o for p, o in last.items()):
                caught_up = time.monotonic()
            time.sleep(0.5)
        (work / "stop").touch()
        proc.wait(300)
    log.close()
    readable: dict[tuple[int, int], float] = {}
    for line in batches.read_text().splitlines() if batches.exists() else []:
        batch = json.loads(line)
        for partition, first, last_offset in batch["ranges"]:
            for offset in range(first, last_offset + 1):
                readable.setdefault((partition, offset), batch["committed"])
    return summary(stamps, readable, commits(uri), monitor, started, produced, caught_up, flush)


def spark_offsets(batches: Path) -> dict[int, int]:
    done: dict[int, int] = {}
    if batches.exists():
        for line in batches.read_text().splitlines():
            for partition, _, last in json.loads(line)["ranges"]:
                done[partition] = max(done.get(partition, -1), last)
    return done


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rate", type=int, default=2000, help="changes per second")
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--flush", default="1,10,60", help="flush intervals, seconds")
    parser.add_argument("--keys", default="uniform,recent")
    parser.add_argument(
        "--engines",
        default="kafka2delta,changelog,spark",
        help="kafka2delta (upsert mode), changelog (changelog + jobs apply-changes), spark (foreachBatch MERGE)",
    )
    parser.add_argument("--skip-spark", action="store_true", help="the kafka2delta engine only")
    parser.add_argument("--quick", action="store_true", help="100,000 rows, 500 changes/s for 20 s, flush 1 and 5 s")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--work", type=Path, help="keep the tables, logs and checkpoints here (a new directory)")
    args = parser.parse_args()
    from bench.changelog_apply import run_changelog  # it builds on this module's pieces

    if args.quick:
        args.rows, args.rate, args.seconds, args.flush = 100_000, 500, 20.0, "1,5"
    flushes = [float(f) for f in args.flush.split(",")]
    results: dict[str, Any] = {
        "rows": args.rows,
        "rate": args.rate,
        "seconds": args.seconds,
        "machine": machine(),
        "runs": [],
    }
    with tempfile.TemporaryDirectory(prefix="k2d-bench-upsert-") as tmp:
        root = args.work or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        seed = root / "seed"
        seed_table(str(seed), args.rows)
        print(f"seeded a table of {args.rows:,} rows", flush=True)
        with LocalBroker(root / "kafka") as broker:
            bootstrap = broker.bootstrap_servers
            admin = AdminClient({"bootstrap.servers": bootstrap})
            for keys in args.keys.split(","):
                args.keys_now = keys
                for flush in flushes:
                    engines = [e for e in args.engines.split(",") if not (args.skip_spark and e != "kafka2delta")]
                    for engine in engines:
                        name = f"{engine}-{keys}-{flush:g}".replace(".", "_")
                        work = root / name
                        work.mkdir()
                        uri = str(work / "table")
                        if engine != "changelog":  # its target is made by the job, from the changelog's snapshot
                            subprocess.run(["cp", "-r", str(seed), uri], check=True)
                        topic = f"bench.upsert.{name}"
                        futures = admin.create_topics(
                            [NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)]
                        )
                        for future in futures.values():
                            future.result(timeout=60)
                        runner = {"kafka2delta": run_daemon, "spark": run_spark, "changelog": run_changelog}[engine]
                        outcome = runner(bootstrap, work, topic, uri, flush, args)
                        row = {"engine": engine, "keys": keys, "flush_s": flush, **outcome}
                        results["runs"].append(row)
                        print(json.dumps(row), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
