"""The benchmark: kafka2delta side by side with Spark Structured Streaming, on one machine, in one run.

    python -m bench.run            # the full run (`make bench`), about 25 minutes on 2 cores (20–27 recorded)
    python -m bench.run --quick    # a small run of every scenario (`make bench-quick`), about 5 minutes

It starts its own Kafka broker (dev/kafka, free ports on 127.0.0.1, stopped at the end), then:

1. catch-up: a backlog of N messages (default 2,000,000 JSON events of ~250 B on 4 partitions); the daemon
   (`kafka2delta ingest --until-caught-up`, three transforms) and Spark Structured Streaming (`local[2]`,
   trigger 1 s, the same transforms in Spark SQL, Delta sink) each ingest the same topic into their own table;
2. steady rate: a producer at 50,000 msg/s over 4 partitions for 60 s while the daemon (allowed latency 1 s)
   — then Spark (trigger 1 s) — runs; latency per row = commit timestamp of the Delta version holding it
   minus the row's Kafka timestamp (bench/latency.py);
3. scaling (daemon): messages 0.5M/2M/8M, partitions 1/4/16/64, message size 250 B/2 KB, and Avro:
   one dimension at a time around the catch-up point → CPU seconds per million messages.

Writes bench/results/<UTC timestamp>.json (every figure, the machine, the load average before and after)
and bench/results/latest.json, latest.md and the PNG plots (bench/report.py).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from bench import daemon, report, writers
from bench.datasets import DATASETS, SPARK_TRANSFORMS, TRANSFORMS
from bench.latency import cdf_points, summary
from bench.measure import TreeMonitor, busy_processes, git_state, load_average, machine
from bench.producer import produce_backlog
from dev.kafka.broker import LocalBroker, create_topic
from dev.local_server import free_ports
from dev.registry.registry import LocalRegistry

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

RESULTS = HERE / "results"
# Full JIT (the dev default stops at C1 for a fast start) and a 1-GB heap: the broker should not be the bottleneck.
BROKER_JVM_OPTS = ("-Xms1g", "-Xmx1g", "-XX:+UseSerialGC", "-XX:-UsePerfData", "-Djava.awt.headless=true")

FULL = {
    "catchup_messages": 2_000_000,
    "partitions": 4,
    "rate": 50_000,
    "steady_seconds": 60,
    "warmup_seconds": 10,
    "scaling_messages": [500_000, 2_000_000, 8_000_000],
    "scaling_partitions": [1, 4, 16, 64],
    "scaling_datasets": ["json", "json2k", "avro", "protobuf"],
    "writers": [1, 2, 4, 8],
    "writers_stores": ["local", "s3", "s3-latency"],
    "writers_rate": 6000,
    "writers_seconds": 30,
    "writers_paced": (8, 2.0),
}
QUICK = {
    "catchup_messages": 200_000,
    "partitions": 4,
    "rate": 50_000,
    "steady_seconds": 15,
    "warmup_seconds": 5,
    "scaling_messages": [100_000, 200_000, 400_000],
    "scaling_partitions": [1, 4, 16],
    "scaling_datasets": ["json", "json2k", "avro", "protobuf"],
    "writers": [1, 2],
    "writers_stores": ["local", "s3"],
    "writers_rate": 2000,
    "writers_seconds": 10,
    "writers_paced": None,
}

TARGETS = {
    "catchup_msgs_per_s": 150_000,
    "catchup_vs_spark": 5.0,
    "steady_p99_s": 2.5,
    "steady_p50_s": 1.3,
    "peak_rss_mb": 600,
    "cpu_per_message_spread_pct": 15.0,
}


def log(message: str) -> None:
    print(f"[{dt.datetime.now(dt.UTC):%H:%M:%S}] {message}", flush=True)


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.plan: dict[str, Any] = QUICK if args.quick else FULL
        if args.messages:
            self.plan = {**self.plan, "catchup_messages": args.messages}
        if args.steady_seconds:
            self.plan = {**self.plan, "steady_seconds": args.steady_seconds}
        self.src = Path(args.src).resolve() if args.src else ROOT
        self.bootstrap = ""
        self.produced: dict[str, tuple[int, int]] = {}  # topic -> (messages, payload bytes)
        self.servers = contextlib.ExitStack()  # what a scenario starts besides the broker (it stops them)
        self._registry: LocalRegistry | None = None

    @property
    def registry_url(self) -> str:
        """The schema registry of the registry data sets (Apicurio, started on first use)."""
        if self._registry is None:
            self._registry = self.servers.enter_context(LocalRegistry(self.work / "registry"))
            log(f"schema registry on {self._registry.url}")
        return self._registry.url

    def _register(self, topic: str, dataset: str) -> int:
        """The data set's writer schema registered under ``<topic>-value``: its id (0 when it has none)."""
        registered = DATASETS[dataset].registered
        if registered is None:
            return 0
        from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

        schema_type, text = registered
        client = SchemaRegistryClient({"url": self.registry_url})
        return int(client.register_schema(f"{topic}-value", Schema(text, schema_type)))

    # --- topics -----------------------------------------------------------------------------

    def backlog(self, messages: int, partitions: int, dataset: str) -> tuple[str, int, int]:
        """A fresh topic holding ``messages`` of ``dataset``; (topic, messages, payload bytes)."""
        topic = f"bench-{dataset}-{partitions}p-{messages}-{uuid.uuid4().hex[:6]}"
        create_topic(self.bootstrap, topic, partitions)
        schema_id = self._register(topic, dataset)
        produced = produce_backlog(self.bootstrap, topic, partitions, messages, dataset, schema_id=schema_id)
        log(
            f"produced {produced['messages']:,} {dataset} messages to {partitions} partitions in "
            f"{produced['seconds']:.1f} s ({produced['messages'] / produced['seconds']:,.0f} msg/s)"
        )
        return topic, int(produced["messages"]), int(produced["bytes"])

    def _scratch(self, name: str) -> Path:
        path = self.work / name
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        return path

    # --- the daemon -------------------------------------------------------------------------

    def daemon_catchup(self, topic: str, messages: int, payload: int, dataset: str, name: str) -> dict[str, Any]:
        registry_url = self.registry_url if DATASETS[dataset].registered else ""
        work = self._scratch(name)
        result = daemon.catchup(
            self.bootstrap, topic, messages, payload, dataset, work, src=self.src, registry_url=registry_url
        )
        log(
            f"daemon {name}: {result['msgs_per_s']:,} msg/s, {result['cpu_s_per_million']} CPU s/M, "
            f"peak RSS {result['peak_rss_mb']} MB, {result['commits']} commits"
        )
        return result

    def daemon_baseline(self) -> dict[str, Any]:
        """The daemon's fixed cost (start-up, group join, shutdown) on an empty 4-partition topic."""
        topic = f"bench-empty-{uuid.uuid4().hex[:6]}"
        create_topic(self.bootstrap, topic, self.plan["partitions"])
        result = daemon.catchup(self.bootstrap, topic, 0, 0, "json", self._scratch("baseline"), src=self.src)
        baseline = {k: result[k] for k in ("wall_s", "startup_s", "cpu_s", "peak_rss_mb")}
        log(f"daemon baseline (empty topic): {baseline}")
        return baseline

    # --- Spark ------------------------------------------------------------------------------

    def _spark_command(self, topic: str, work: Path, mode: str, **extra: str) -> list[str]:
        command = [
            *daemon.python_module("bench.spark_ss"),
            "--bootstrap",
            self.bootstrap,
            "--topic",
            topic,
            "--table",
            str(work / "table"),
            "--checkpoint",
            str(work / "checkpoint"),
            "--mode",
            mode,
        ]
        for key, value in extra.items():
            command += [f"--{key.replace('_', '-')}", value]
        return command

    def _spark_process(self, command: list[str], log_path: Path) -> subprocess.Popen[bytes]:
        # Its own session: on any failure the harness ends the driver and its JVM together.
        return subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=log_path.open("wb"),
            cwd=log_path.parent,
            env=daemon.repo_env(),
            start_new_session=True,
        )

    @staticmethod
    def _end(proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def spark_prefetch(self) -> None:
        """On a fresh machine Spark's Ivy fetches delta-spark and spark-sql-kafka from Maven Central at its first
        start: do that before anything is timed (nothing to do when the jars are in the cache already)."""
        from kafka2delta.spark.session import maven_packages

        ivy = Path.home() / ".ivy2.5.2" / "jars"
        wanted = [coordinate.split(":") for coordinate in maven_packages()]
        if all((ivy / f"{group}_{artifact}-{version}.jar").exists() for group, artifact, version in wanted):
            return
        log("fetching Spark's jars (Delta, Kafka source) into Ivy's cache")
        work = self._scratch("spark-prefetch")
        command = self._spark_command("none", work, "prefetch")
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=(work / "spark.log").open("wb"))

    def spark_catchup(self, topic: str, messages: int, payload: int) -> dict[str, Any]:
        work = self._scratch("spark-catchup")
        started = time.time()
        proc = self._spark_process(
            self._spark_command(topic, work, "catchup", messages=str(messages)), work / "spark.log"
        )
        try:
            with TreeMonitor(proc.pid, interval=0.2) as monitor:
                out, _ = proc.communicate(timeout=1800)
        finally:
            self._end(proc)
        if proc.returncode != 0:
            raise RuntimeError(f"Spark catch-up failed ({proc.returncode}); see {work / 'spark.log'}")
        marks = json.loads(out.decode().strip().splitlines()[-1])
        wall = marks["done"] - started
        processing = marks["done"] - marks["query_started"]
        result = {
            "messages": messages,
            "rows": marks["rows"],
            "batches": marks["batches"],
            "first_batches_rows_ms": marks["first_batches"],
            "wall_s": round(wall, 3),
            "startup_s": round(marks["query_started"] - started, 3),
            "msgs_per_s": round(messages / wall),
            "msgs_per_s_after_startup": round(messages / processing),
            "mb_per_s": round(payload / wall / 1e6, 2),
            "cpu_s": round(monitor.cpu_s, 2),
            "cpu_s_per_million": round(monitor.cpu_s / messages * 1e6, 3),
            "peak_rss_mb": monitor.peak_rss_mb,
        }
        log(f"spark catch-up: {result['msgs_per_s']:,} msg/s, peak RSS {result['peak_rss_mb']} MB")
        return result

    def spark_steady(self, topic: str) -> tuple[dict[str, Any], np.ndarray]:
        work = self._scratch("spark-steady")
        ready, stop = work / "ready", work / "stop"
        proc = self._spark_process(
            self._spark_command(topic, work, "steady", ready_file=str(ready), stop_file=str(stop)),
            work / "spark.log",
        )
        try:
            with TreeMonitor(proc.pid, interval=0.2) as monitor:
                deadline = time.monotonic() + 600
                while not ready.exists():
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"Spark did not start its query; see {work / 'spark.log'}")
                    time.sleep(0.2)
                plan = self.plan
                produced = daemon.warm_then_measure(
                    monitor,
                    self.bootstrap,
                    topic,
                    plan["partitions"],
                    plan["rate"],
                    plan["steady_seconds"],
                    plan["warmup_seconds"],
                    "json",
                    work / "table",
                    self.args.drain_timeout_s,
                )
                stop.write_text("stop\n")
                proc.communicate(timeout=300)
        finally:
            self._end(proc)
        result, latencies = daemon.steady_result(work / "table", produced, monitor.peak_rss_mb)
        log(f"spark steady: {summary(latencies)}")
        return result, latencies

    # --- scenarios --------------------------------------------------------------------------

    def run(self, results: dict[str, Any]) -> None:
        plan = self.plan
        if not self.args.skip_spark:
            self.spark_prefetch()
        results["daemon_baseline"] = self.daemon_baseline()

        log("scenario 1: catch-up")
        topic, messages, payload = self.backlog(plan["catchup_messages"], plan["partitions"], "json")
        catchup: dict[str, Any] = {
            "dataset": "json",
            "messages": messages,
            "partitions": plan["partitions"],
            "avg_message_bytes": round(payload / messages, 1),
            "transforms": TRANSFORMS,
            "spark_transforms": SPARK_TRANSFORMS,
        }
        catchup["daemon"] = self.daemon_catchup(topic, messages, payload, "json", "catchup")
        if not self.args.skip_spark:
            catchup["spark"] = self.spark_catchup(topic, messages, payload)
        results["catchup"] = catchup
        self.save(results)

        log("scenario 2: steady rate")
        steady: dict[str, Any] = {
            "rate": plan["rate"],
            "seconds": plan["steady_seconds"],
            "partitions": plan["partitions"],
            "warmup_seconds": plan["warmup_seconds"],
            "allowed_latency_s": 1.0,
            "spark_trigger_s": 1.0,
        }
        cdfs: dict[str, Any] = {}
        topic = f"bench-steady-daemon-{uuid.uuid4().hex[:6]}"
        create_topic(self.bootstrap, topic, plan["partitions"])
        (metrics_port,) = free_ports(1)
        steady["daemon"], latencies = daemon.steady(
            self.bootstrap,
            topic,
            plan["partitions"],
            plan["rate"],
            plan["steady_seconds"],
            "json",
            self._scratch("steady-daemon"),
            metrics_port,
            src=self.src,
            drain_timeout_s=self.args.drain_timeout_s,
            warmup_s=plan["warmup_seconds"],
        )
        cdfs["daemon"] = cdf_points(latencies)
        log(f"daemon steady: {summary(latencies)}")
        if not self.args.skip_spark:
            topic = f"bench-steady-spark-{uuid.uuid4().hex[:6]}"
            create_topic(self.bootstrap, topic, plan["partitions"])
            steady["spark"], latencies = self.spark_steady(topic)
            cdfs["spark"] = cdf_points(latencies)
        steady["cdf"] = cdfs
        results["steady"] = steady
        self.save(results)

        if not self.args.skip_scaling:
            log("scenario 3: scaling")
            with self.servers:  # the schema registry of the registry data sets stops with the scenario
                results["scaling"] = self.scaling(catchup)
            self._registry = None
            catchup.update(per_format(results["scaling"]))
        self.save(results)

        if not self.args.skip_writers:
            log("scenario 4: many writers on one table")
            found = writers.run(
                self.bootstrap,
                plan["writers"],
                plan["writers_stores"],
                plan["writers_rate"],
                plan["writers_seconds"],
                plan["warmup_seconds"],
                self._scratch("writers"),
                say=log,
                paced=plan["writers_paced"],
            )
            results["writers"] = {**writers.latest_keys(found), "detail": found}
            self.save(results)

    def scaling(self, catchup: dict[str, Any]) -> dict[str, Any]:
        """One dimension at a time around the catch-up point (its own run is reused)."""
        plan = self.plan
        base_messages, base_partitions = plan["catchup_messages"], plan["partitions"]
        points: dict[tuple[int, int, str], dict[str, Any]] = {
            (catchup["messages"], base_partitions, "json"): {
                **catchup["daemon"],
                "avg_message_bytes": catchup["avg_message_bytes"],
            }
        }
        wanted = [(m, base_partitions, "json") for m in plan["scaling_messages"]]
        wanted += [(base_messages, p, "json") for p in plan["scaling_partitions"]]
        wanted += [(base_messages, base_partitions, d) for d in plan["scaling_datasets"]]
        for messages, partitions, dataset in wanted:
            key = (messages - messages % partitions, partitions, dataset)
            if key in points:
                continue
            topic, produced, payload = self.backlog(messages, partitions, dataset)
            name = f"scale-{dataset}-{partitions}p-{produced}"
            point = self.daemon_catchup(topic, produced, payload, dataset, name)
            point["avg_message_bytes"] = round(payload / produced, 1)
            points[(produced, partitions, dataset)] = point
            shutil.rmtree(self.work / name, ignore_errors=True)  # the table: disk only

        baseline_cpu = self._baseline_cpu

        def row(key: tuple[int, int, str]) -> dict[str, Any]:
            messages, partitions, dataset = key
            point = points[key]
            net = (point["cpu_s"] - baseline_cpu) / messages * 1e6
            return {
                "messages": messages,
                "partitions": partitions,
                "dataset": dataset,
                "avg_message_bytes": point["avg_message_bytes"],
                "wall_s": point["wall_s"],
                "msgs_per_s": point["msgs_per_s"],
                "mb_per_s": point["mb_per_s"],
                "cpu_s": point["cpu_s"],
                "cpu_s_per_million": point["cpu_s_per_million"],
                "cpu_s_per_million_net": round(net, 3),
                "peak_rss_mb": point["peak_rss_mb"],
                "commits": point["commits"],
                **({"error": point["error"]} if "error" in point else {}),
            }

        def dimension(keys: list[tuple[int, int, str]]) -> dict[str, Any]:
            rows = [row(k) for k in keys]
            return {"points": rows, **spread(rows)}

        messages_keys = sorted({k for k in points if k[1] == base_partitions and k[2] == "json"})
        partition_keys = sorted(
            {k for k in points if k[0] == base_messages - base_messages % k[1] and k[2] == "json"}, key=lambda k: k[1]
        )
        dataset_keys = [k for k in points if k[0] == base_messages - base_messages % k[1] and k[1] == base_partitions]
        dataset_keys.sort(key=lambda k: plan["scaling_datasets"].index(k[2]) if k[2] in plan["scaling_datasets"] else 9)
        return {
            "messages": dimension(messages_keys),
            "partitions": dimension(partition_keys),
            "datasets": dimension(dataset_keys),
            "note": (
                "cpu_s_per_million counts every CPU second of the daemon's process (start-up included); "
                "cpu_s_per_million_net subtracts the start-up cost measured on an empty topic (daemon_baseline)"
            ),
        }

    @property
    def _baseline_cpu(self) -> float:
        return float(self.results["daemon_baseline"]["cpu_s"])

    def save(self, results: dict[str, Any]) -> None:
        self.results = results
        self.partial_path.write_text(json.dumps(results, indent=2) + "\n")

    partial_path: Path
    results: dict[str, Any]


def spread(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """How far CPU per message strays from the dimension's mean (gross and net of start-up), in percent."""
    out = {}
    for key in ("cpu_s_per_million", "cpu_s_per_million_net"):
        values = [r[key] for r in rows]
        mean = sum(values) / len(values)
        out[f"{key}_max_deviation_pct"] = round(max(abs(v / mean - 1) for v in values) * 100, 1) if mean else None
    return out


def per_format(scaling: dict[str, Any]) -> dict[str, Any]:
    """``catchup.<format>.*`` (json, json2k, avro): the catch-up figures of each format at the base size."""
    return {
        row["dataset"]: {
            "cpu_s_per_m": row["cpu_s_per_million"],
            "cpu_s_per_m_net": row["cpu_s_per_million_net"],
            "msgs_per_s": row["msgs_per_s"],
            "mb_per_s": row["mb_per_s"],
            "peak_rss_mb": row["peak_rss_mb"],
            "avg_message_bytes": row["avg_message_bytes"],
        }
        for row in scaling["datasets"]["points"]
    }


def ratios(results: dict[str, Any]) -> dict[str, Any]:
    """Daemon vs Spark: how many times faster / lighter the daemon is."""
    out: dict[str, Any] = {}
    catchup, steady = results.get("catchup", {}), results.get("steady", {})
    d, s = catchup.get("daemon"), catchup.get("spark")
    if d and s:
        out["catchup_msgs_per_s"] = round(d["msgs_per_s"] / s["msgs_per_s"], 2)
        if d.get("msgs_per_s_after_startup") and s.get("msgs_per_s_after_startup"):
            out["catchup_msgs_per_s_after_startup"] = round(
                d["msgs_per_s_after_startup"] / s["msgs_per_s_after_startup"], 2
            )
        out["catchup_cpu_per_message_spark_over_daemon"] = round(s["cpu_s_per_million"] / d["cpu_s_per_million"], 2)
        out["catchup_peak_rss_spark_over_daemon"] = round(s["peak_rss_mb"] / d["peak_rss_mb"], 2)
    d, s = steady.get("daemon"), steady.get("spark")
    if d and s and d.get("rows") and s.get("rows"):
        for q in ("p50_s", "p95_s", "p99_s", "max_s"):
            out[f"steady_{q}_spark_over_daemon"] = round(s[q] / d[q], 2)
        out["steady_peak_rss_spark_over_daemon"] = round(s["peak_rss_mb"] / d["peak_rss_mb"], 2)
        out["steady_cpu_spark_over_daemon"] = round(
            s["cpu_cores_during_production"] / d["cpu_cores_during_production"], 2
        )
    return out


def targets(results: dict[str, Any]) -> dict[str, Any]:
    """Each target of issue 6 with the measured figure and whether it is met."""
    out: dict[str, Any] = {}
    catchup, steady, scaling = results.get("catchup", {}), results.get("steady", {}), results.get("scaling", {})
    if "daemon" in catchup:
        value = catchup["daemon"]["msgs_per_s"]
        out["catchup_msgs_per_s"] = {"target": ">= 150000", "value": value, "met": value >= 150_000}
    if "catchup_msgs_per_s" in results.get("ratios", {}):
        value = results["ratios"]["catchup_msgs_per_s"]
        out["catchup_vs_spark"] = {"target": ">= 5x", "value": value, "met": value >= 5}
    if steady.get("daemon", {}).get("rows"):
        p50, p99 = steady["daemon"]["p50_s"], steady["daemon"]["p99_s"]
        out["steady_p50_s"] = {"target": "<= 1.3", "value": p50, "met": p50 <= 1.3}
        out["steady_p99_s"] = {"target": "<= 2.5", "value": p99, "met": p99 <= 2.5}
    rss = results.get("daemon", {}).get("peak_rss_mb")
    if rss is not None:
        out["peak_rss_mb"] = {"target": "<= 600", "value": rss, "met": rss <= 600}
    for dim in ("messages", "partitions"):
        if dim in scaling:
            gross = scaling[dim]["cpu_s_per_million_max_deviation_pct"]
            net = scaling[dim]["cpu_s_per_million_net_max_deviation_pct"]
            out[f"cpu_per_message_flat_over_{dim}"] = {
                "target": "within ±15% of the mean",
                "value_pct": gross,
                "value_net_of_startup_pct": net,
                "met": gross <= 15,
                "met_net_of_startup": net is not None and net <= 15,
            }
    return out


def peak_daemon_rss(results: dict[str, Any]) -> float | None:
    """The largest peak RSS of the daemon over every scenario."""
    peaks = [results.get("catchup", {}).get("daemon", {}).get("peak_rss_mb")]
    peaks.append(results.get("steady", {}).get("daemon", {}).get("peak_rss_mb"))
    for dim in results.get("scaling", {}).values():
        if isinstance(dim, dict):
            peaks += [p["peak_rss_mb"] for p in dim.get("points", [])]
    found = [p for p in peaks if p is not None]
    return max(found) if found else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small run of every scenario")
    parser.add_argument("--messages", type=int, help="catch-up backlog (default 2,000,000; quick 200,000)")
    parser.add_argument("--steady-seconds", type=float, help="steady-rate producer duration (default 60; quick 15)")
    parser.add_argument("--skip-spark", action="store_true")
    parser.add_argument("--skip-scaling", action="store_true")
    parser.add_argument("--skip-writers", action="store_true")
    parser.add_argument("--drain-timeout-s", type=float, default=180.0)
    parser.add_argument("--src", help="run the daemon's package from this checkout (default: this one)")
    parser.add_argument("--work", help="scratch directory (default: a temporary one, removed at the end)")
    parser.add_argument(
        "--out", help="where the results go (default bench/results; --quick: .k2d/bench-quick, kept out of git)"
    )
    parser.add_argument("--no-latest", action="store_true", help="do not replace latest.json/md and the plots")
    args = parser.parse_args()

    # SIGTERM (make interrupted, a CI timeout) unwinds like Ctrl-C: the broker and any Spark JVM are stopped.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    out = Path(args.out) if args.out else (ROOT / ".k2d" / "bench-quick" if args.quick else RESULTS)
    out.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="k2d-bench-"))
    bench = Bench(args, work)
    results: dict[str, Any] = {
        "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "mode": "quick" if args.quick else "full",
        "plan": bench.plan,
        "machine": machine(),
        "git": git_state(bench.src),
        "load": {"before": load_average(), "busy_before": busy_processes()},
        "targets_wanted": TARGETS,
    }
    bench.partial_path = out / f"{stamp}.partial.json"
    log(f"load average {results['load']['before']}; other test suites/JVMs: {len(results['load']['busy_before'])}")
    started = time.monotonic()
    try:
        with LocalBroker(work / "kafka", jvm_opts=BROKER_JVM_OPTS) as broker:
            bench.bootstrap = broker.bootstrap_servers
            log(f"broker on {bench.bootstrap}")
            bench.run(results)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    results["finished"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    results["duration_s"] = round(time.monotonic() - started, 1)
    results["load"]["after"] = load_average()
    results["load"]["busy_after"] = busy_processes()
    results["daemon"] = {"peak_rss_mb": peak_daemon_rss(results)}
    results["ratios"] = ratios(results)
    results["targets"] = targets(results)
    path = out / f"{stamp}{'-quick' if args.quick else ''}.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    bench.partial_path.unlink(missing_ok=True)
    log(f"wrote {path}")
    if not args.no_latest:
        (out / "latest.json").write_text(json.dumps(results, indent=2) + "\n")
        report.write(results, out)
        log(f"wrote {out / 'latest.json'}, {out / 'latest.md'} and the plots")
    print(report.markdown(results))
    problems = report.errors(results)
    for problem in problems:
        log(f"ERROR {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
