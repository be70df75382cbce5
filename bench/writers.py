"""Many writers on one table (``make bench-writers``; a scenario of ``make bench`` too): N daemons in one consumer
group read a 32-partition topic into one Delta table, on local disk and on the S3 server (moto, with and without
added latency per request), while the producer sends a steady rate.

    python -m bench.writers [--writers 1,2,4,8] [--stores local,s3,s3-latency] [--rate 8000] [--seconds 30]

Each commit is one log version, and concurrent commits race for it: delta-rs writes version v+1 with
put-if-absent and, when another writer got there first, reads the winning commit, checks it for conflicts and
tries the next version. Figures per point, over the measured window (a warm-up at the same rate left out):

- ``commits_per_s``: log versions whose commitInfo timestamp falls in the window, per second;
- ``conflicts_per_commit``: for each such version v, the versions other writers committed between its read and
  its write (``v - read_version - 1``; the daemon records the version its txn check read in its commitInfo):
  each one was read and checked by delta-rs's conflict checker, and the ones that won the race cost a failed
  put and a retry; averaged over the window's commits;
- ``retries_per_commit``: kafka2delta's own retried commits (``kafka2delta_commit_retries_total`` of every
  daemon), per commit;
- ``p50_s``/``p99_s``: produce-to-readable latency of the window's rows (bench/latency.py);
- ``msgs_per_s``: rows the table received per second of the window, and ``drain_s`` (how long after the
  producer's end the table held every row: a writer set that falls behind shows here).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from bench.daemon import daemon_env, ready, run_rate_producer
from bench.latency import row_latencies, versions
from bench.measure import machine
from dev.kafka.broker import LocalBroker, create_topic
from dev.local_server import free_ports
from dev.s3 import client as s3_client
from dev.s3 import storage_options

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "writers.json"
PARTITIONS = 32
S3_LATENCY_S = 0.03
"""Added to each S3 request's round trip for ``s3-latency`` (S3's own first-byte latency for small objects is
tens of milliseconds; moto on loopback answers in about one)."""
BUCKET = "k2d-bench"
GAUGES = ("kafka2delta_commit_interval_seconds", "kafka2delta_table_writers")


@dataclass
class Store:
    """Where the table lives: its URI, the daemon's storage options, and how to mirror its log locally."""

    name: str
    uri: str
    options: dict[str, str]

    def env(self) -> dict[str, str]:
        return {f"K2D_TABLE__STORAGE_OPTIONS__{key}": value for key, value in self.options.items()}

    def local_copy(self, into: Path) -> Path:
        """The table's log and files as a local directory (itself when local) for bench/latency.py."""
        if not self.uri.startswith("s3://"):
            return Path(self.uri)
        bucket, _, prefix = self.uri.removeprefix("s3://").partition("/")
        client = s3_client(self.options["AWS_ENDPOINT_URL"])
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
            for item in page.get("Contents", []):
                target = into / item["Key"].removeprefix(prefix + "/")
                target.parent.mkdir(parents=True, exist_ok=True)
                client.download_file(bucket, item["Key"], str(target))
        return into


@contextmanager
def stores(names: list[str], work: Path) -> Iterator[dict[str, Any]]:
    """A factory of a fresh table location per point, for each store asked for. The S3 server (moto, with
    conditional PUTs made atomic as S3's are) runs in a process of its own, a proxy adding latency in front."""
    with ExitStack() as stack:
        endpoints: dict[str, str] = {}
        if any(name.startswith("s3") for name in names):
            server = subprocess.Popen(
                [sys.executable, "-m", "dev.s3", "--bucket", BUCKET, "--delay", str(S3_LATENCY_S)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=(work / "s3.log").open("wb"),
                cwd=ROOT,
            )
            stack.callback(server.wait, 30)
            assert server.stdin is not None and server.stdout is not None
            stack.callback(server.stdin.close)  # the server ends when its stdin closes
            started = json.loads(server.stdout.readline() or "{}")
            if not started:
                raise RuntimeError(f"the S3 server did not start; see {work / 's3.log'}")
            endpoints = {"s3": started["plain"], "s3-latency": started["delayed"]}

        def make(name: str, point: str) -> Store:
            if name == "local":
                return Store(name, str(work / point / "table"), {})
            return Store(name, f"s3://{BUCKET}/{point}", storage_options(endpoints[name]))

        yield {"make": make}


def _scrape(port: int) -> dict[str, float]:
    """Counters of one daemon's /metrics, summed over their labels."""
    totals: dict[str, float] = {}
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            text = answer.read().decode()
    except OSError:
        return totals
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name, _, value = line.rpartition(" ")
        name = name.split("{", 1)[0]
        if name.endswith("_total") or name in GAUGES:
            totals[name] = totals.get(name, 0.0) + float(value)
    return totals


class RowCount:
    """The table's row count from its log (the add actions' record counts), read incrementally: polling it costs
    the store a listing, not a reload of the table."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._table: DeltaTable | None = None

    def __call__(self) -> int:
        try:
            if self._table is None:
                self._table = DeltaTable(self._store.uri, storage_options=self._store.options or None)
            else:
                self._table.update_incremental()
            actions = pa.table(self._table.get_add_actions(flatten=True))  # arro3 → pyarrow (Arrow C stream)
            return int(pc.sum(actions.column("num_records")).as_py() or 0)
        except (TableNotFoundError, OSError):  # no table yet
            return 0

    def wait(self, rows: int, timeout_s: float) -> float | None:
        """Seconds until the table holds ``rows`` rows (None: not within ``timeout_s``)."""
        started = time.monotonic()
        while time.monotonic() < started + timeout_s:
            if self() >= rows:
                return round(time.monotonic() - started, 2)
            time.sleep(0.5)
        return None


def commits_in(table: Path, since_ms: float, until_ms: float) -> list[dict[str, Any]]:
    """The log's commits whose commitInfo timestamp falls in [since_ms, until_ms]."""
    return [v for v in versions(table) if v["commit_ms"] is not None and since_ms <= v["commit_ms"] <= until_ms]


def run_point(
    bootstrap: str,
    store: Store,
    writers: int,
    rate: float,
    seconds: float,
    warmup_s: float,
    work: Path,
    budget: float | None = None,
) -> dict[str, Any]:
    """N daemons, one group, one table: a warm-up, the measured window, then SIGTERM to all."""
    work.mkdir(parents=True, exist_ok=True)
    topic = f"bench-writers-{work.name}"
    create_topic(bootstrap, topic, PARTITIONS)
    ports = free_ports(writers)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for index, port in enumerate(ports):
            env = daemon_env(
                bootstrap,
                topic,
                Path(store.uri),
                "json",
                work,
                allowed_latency_s=1.0,
                metadata_timestamp=True,
                metrics_port=port,
            )
            env.update(store.env())
            env["K2D_TABLE__URI"] = store.uri  # Path() would fold s3:// into s3:/
            env["K2D_KAFKA__GROUP_ID"] = f"k2d-{topic}"
            if budget is not None:
                env["K2D_INGEST__TABLE_COMMITS_PER_S"] = str(budget)
            log = (work / f"daemon-{index}.log").open("wb")
            command = [sys.executable, "-m", "kafka2delta", "ingest"]
            procs.append(subprocess.Popen(command, env=env, cwd=work, stdout=log, stderr=log))
        deadline = time.monotonic() + 180
        while not all(ready(port) for port in ports):
            if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
                raise RuntimeError(f"a daemon did not become ready; see {work}/daemon-*.log")
            time.sleep(0.5)
        warm = run_rate_producer(bootstrap, topic, PARTITIONS, rate, warmup_s, "json")["messages"]
        rows = RowCount(store)
        if rows.wait(warm, 180) is None:
            raise RuntimeError(f"the warm-up's {warm} rows did not land; see {work}/daemon-*.log")
        before = [_scrape(port) for port in ports]
        produced = run_rate_producer(bootstrap, topic, PARTITIONS, rate, seconds, "json")
        drain_s = rows.wait(warm + produced["messages"], 300)
        after = [_scrape(port) for port in ports]
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(timeout=120) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if any(codes):
        raise RuntimeError(f"daemons exited with {codes}; see {work}/daemon-*.log")

    def delta(name: str) -> float:
        return sum(a.get(name, 0.0) - b.get(name, 0.0) for a, b in zip(after, before, strict=True))

    table = store.local_copy(work / "mirror")
    first_ms, last_ms = produced["first_wall"] * 1000, produced["last_wall"] * 1000
    commits = commits_in(table, first_ms, last_ms)
    window_s = max((last_ms - first_ms) / 1000, 1e-9)
    behind = [c["version"] - c["read_version"] - 1 for c in commits if c["read_version"] is not None]
    latencies, _ = row_latencies(table, since_ms=first_ms - 1)
    retries = delta("kafka2delta_commit_retries_total")
    return {
        "writers": writers,
        "store": store.name,
        "rate": rate,
        "window_s": round(window_s, 2),
        "messages": produced["messages"],
        "commits": len(commits),
        "commits_per_s": round(len(commits) / window_s, 2),
        "conflicts_per_commit": round(float(np.mean(behind)), 3) if behind else 0.0,
        "max_conflicts_in_one_commit": max(behind, default=0),
        "retries_per_commit": round(retries / len(commits), 3) if commits else None,
        "txn_conflicts": delta("kafka2delta_commit_conflicts_total"),
        "msgs_per_s": round(len(latencies) / window_s),
        "p50_s": round(float(np.percentile(latencies, 50)), 3) if len(latencies) else None,
        "p99_s": round(float(np.percentile(latencies, 99)), 3) if len(latencies) else None,
        "drain_s": drain_s,
        "rows_measured": len(latencies),
        "commit_interval_s": round(float(np.mean([a.get(GAUGES[0], 1.0) for a in after])), 2),
        "table_writers_seen": round(float(np.mean([a.get(GAUGES[1], 1.0) for a in after])), 2),
        "budget": budget,
    }


def run(
    bootstrap: str,
    writer_counts: list[int],
    store_names: list[str],
    rate: float,
    seconds: float,
    warmup_s: float,
    work: Path,
    say: Any = print,
    paced: tuple[int, float] | None = None,
) -> dict[str, Any]:
    """Every (store, N) point; results by store then N. ``paced``: one more local point, (N, table_commits_per_s)
    with a budget N daemons exceed, to show the fleet settling at it."""
    results: dict[str, Any] = {"partitions": PARTITIONS, "rate": rate, "seconds": seconds, "points": {}}
    with stores(store_names, work) as factory:
        for name in store_names:
            for n in writer_counts:
                point = f"{name}-{n}"
                store = factory["make"](name, point)
                result = run_point(bootstrap, store, n, rate, seconds, warmup_s, work / point)
                results["points"].setdefault(name, {})[str(n)] = result
                say(_line(point, result))
        if paced is not None:
            n, budget = paced
            point = f"local-{n}-budget-{budget:g}"
            result = run_point(
                bootstrap, factory["make"]("local", point), n, rate, seconds, warmup_s, work / point, budget
            )
            results["paced"] = result
            say(_line(point, result))
    return results


def _line(point: str, result: dict[str, Any]) -> str:
    return (
        f"writers {point}: {result['commits_per_s']} commits/s, {result['conflicts_per_commit']} conflicts/commit, "
        f"{result['retries_per_commit']} retries/commit, {result['msgs_per_s']:,} msg/s, P50 {result['p50_s']} s, "
        f"P99 {result['p99_s']} s, commit interval {result['commit_interval_s']} s"
    )


def latest_keys(results: dict[str, Any]) -> dict[str, Any]:
    """``writers.<n>.*`` for latest.json: the local store's figures per N, the other stores' beside them."""
    by_n: dict[str, Any] = {}
    for store, points in results["points"].items():
        for n, point in points.items():
            figures = {
                k: point[k]
                for k in (
                    "commits_per_s",
                    "conflicts_per_commit",
                    "retries_per_commit",
                    "msgs_per_s",
                    "p50_s",
                    "p99_s",
                    "drain_s",
                )
            }
            entry = by_n.setdefault(n, {})
            if store == "local":
                entry.update(figures)
            else:
                entry[store] = figures
    return by_n


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--writers", default="1,2,4,8")
    parser.add_argument("--stores", default="local,s3,s3-latency")
    parser.add_argument("--rate", type=float, default=6000)  # as make bench's writers scenario and the README
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--warmup", type=float, default=10)
    parser.add_argument("--paced", default="8:2", help="N:budget, one more local point with that budget ('' = none)")
    parser.add_argument("--work", type=Path, help="keep the daemons' logs and tables here (default: a temporary dir)")
    args = parser.parse_args()
    counts = [int(n) for n in args.writers.split(",")]
    names = args.stores.split(",")
    unknown = set(names) - {"local", "s3", "s3-latency"}
    if unknown:
        parser.error(f"unknown --stores {sorted(unknown)}: local, s3, s3-latency")
    with tempfile.TemporaryDirectory(prefix="k2d-bench-writers-") as tmp:
        work = args.work or Path(tmp)
        with LocalBroker(work / "kafka") as broker:
            paced = tuple(float(x) for x in args.paced.split(":")) if args.paced else None
            results = run(
                broker.bootstrap_servers,
                counts,
                names,
                args.rate,
                args.seconds,
                args.warmup,
                work,
                paced=(int(paced[0]), paced[1]) if paced else None,
            )
    results["machine"] = machine()
    results["s3_latency_s"] = S3_LATENCY_S
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
