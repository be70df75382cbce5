"""Running the daemon (``kafka2delta ingest``) under measurement."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import resource
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from bench.datasets import DATASETS, TRANSFORMS
from bench.latency import row_latencies, summary
from bench.measure import TreeMonitor, cpu_s_of_children

ROOT = Path(__file__).resolve().parents[1]


def daemon_env(
    bootstrap: str,
    topic: str,
    table: Path,
    dataset: str,
    work: Path,
    *,
    allowed_latency_s: float,
    metadata_timestamp: bool = False,
    metrics_port: int = 0,
    src: Path = ROOT,
    registry_url: str = "",
) -> dict[str, str]:
    data = DATASETS[dataset]
    env = {
        # The measured daemon's settings are these alone: a K2D_* variable of the shell would change it unseen.
        **{name: value for name, value in os.environ.items() if not name.startswith("K2D_")},
        # The daemon's package from `src` (default: this checkout), whatever the venv has installed.
        "PYTHONPATH": os.pathsep.join(filter(None, [str(src), os.environ.get("PYTHONPATH", "")])),
        "K2D_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
        "K2D_KAFKA__TOPIC": topic,
        "K2D_KAFKA__GROUP_ID": f"k2d-{topic}",
        "K2D_TABLE__URI": str(table),
        "K2D_TABLE__SCHEMA": json.dumps(data.table_schema(metadata_timestamp)),
        "K2D_TRANSFORMS": json.dumps(TRANSFORMS),
        "K2D_INGEST__ALLOWED_LATENCY_S": str(allowed_latency_s),
        "K2D_INGEST__PROGRESS_INTERVAL_S": "5",
        "K2D_LOGGING__LEVEL": "INFO",
        "K2D_LOGGING__FORMAT": "json",
        **data.daemon_env(work, registry_url),
    }
    if metadata_timestamp:
        env["K2D_TABLE__METADATA_COLUMNS"] = "timestamp"
    if metrics_port:
        env["K2D_METRICS__PORT"] = str(metrics_port)
    return env


def _command(profile: Path | None) -> list[str]:
    command = [sys.executable, "-m", "kafka2delta", "ingest"]
    if profile is None:
        return command
    # py-spy records the daemon from its first instruction; --native shows time in C/Rust extensions too.
    pyspy = Path(sys.executable).parent / "py-spy"
    return [str(pyspy), "record", "--native", "--rate", "100", "--format", "raw", "-o", str(profile), "--", *command]


def _first_log_time(log: Path, words: str) -> float | None:
    """Epoch seconds of the first JSON log line whose message contains ``words``."""
    for line in log.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if words in str(entry.get("message", "")):
            return dt.datetime.fromisoformat(entry["time"].replace("Z", "+00:00")).timestamp()
    return None


def catchup(
    bootstrap: str,
    topic: str,
    messages: int,
    payload_bytes: int,
    dataset: str,
    work: Path,
    *,
    src: Path = ROOT,
    profile: Path | None = None,
    registry_url: str = "",
) -> dict[str, Any]:
    """``kafka2delta ingest --until-caught-up`` on a backlog: wall time from process start to exit."""
    work.mkdir(parents=True, exist_ok=True)
    table = work / "table"
    log = work / "daemon.log"
    env = daemon_env(bootstrap, topic, table, dataset, work, allowed_latency_s=5.0, src=src, registry_url=registry_url)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started_wall = time.time()
    started = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen([*_command(profile), "--until-caught-up"], env=env, cwd=work, stderr=out, stdout=out)
        with TreeMonitor(proc.pid) as monitor:
            # wait4 gives the process's own peak RSS at exit, its last moments (the final flush) included.
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = code = os.waitstatus_to_exitcode(status)
            monitor.exited(proc.pid, usage.ru_maxrss * 1024)  # Linux counts ru_maxrss in kB
        wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if code != 0:
        raise RuntimeError(f"the daemon exited with {code}; see {log}")
    dt_table = DeltaTable(str(table))
    rows = int(dt_table.count())
    assigned = _first_log_time(log, "assigned ")
    startup = assigned - started_wall if assigned else None
    cpu = max(cpu_s_of_children(before, after), monitor.cpu_s)
    result: dict[str, Any] = {
        "messages": messages,
        "rows": rows,
        "commits": dt_table.version(),
        "wall_s": round(wall, 3),
        "startup_s": round(startup, 3) if startup is not None else None,
        "msgs_per_s": round(messages / wall),
        "msgs_per_s_after_startup": round(messages / (wall - startup)) if startup else None,
        "mb_per_s": round(payload_bytes / wall / 1e6, 2),
        "cpu_s": round(cpu, 2),
        "cpu_s_per_million": round(cpu / messages * 1e6, 3) if messages else None,
        "peak_rss_mb": monitor.peak_rss_mb,
    }
    if rows != messages:
        result["error"] = f"{rows} rows for {messages} messages"
    return result


def ready(port: int) -> bool:
    """The daemon's /readyz answers 200."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def _rows(table: Path) -> int:
    try:
        return int(DeltaTable(str(table)).count())
    except (TableNotFoundError, DeltaError, OSError):  # no table yet, or a version being written
        return 0


def steady(
    bootstrap: str,
    topic: str,
    partitions: int,
    rate: float,
    seconds: float,
    dataset: str,
    work: Path,
    metrics_port: int,
    *,
    src: Path = ROOT,
    drain_timeout_s: float = 120.0,
    warmup_s: float = 10.0,
) -> tuple[dict[str, Any], np.ndarray]:
    """The daemon runs (allowed latency 1 s) while the producer sends ``rate`` msg/s for ``seconds``."""
    work.mkdir(parents=True, exist_ok=True)
    table = work / "table"
    log = work / "daemon.log"
    env = daemon_env(
        bootstrap,
        topic,
        table,
        dataset,
        work,
        allowed_latency_s=1.0,
        metadata_timestamp=True,
        metrics_port=metrics_port,
        src=src,
    )
    with log.open("wb") as out:
        proc = subprocess.Popen(_command(None), env=env, cwd=work, stderr=out, stdout=out)
        try:
            with TreeMonitor(proc.pid) as monitor:
                deadline = time.monotonic() + 120
                while not ready(metrics_port):
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"the daemon did not become ready; see {log}")
                    time.sleep(0.2)
                produced = warm_then_measure(
                    monitor, bootstrap, topic, partitions, rate, seconds, warmup_s, dataset, table, drain_timeout_s
                )
                proc.send_signal(signal.SIGTERM)
                code = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if code != 0:
        raise RuntimeError(f"the daemon exited with {code}; see {log}")
    result, latencies = steady_result(table, produced, monitor.peak_rss_mb)
    result["commits_logged"] = _commit_lines(log)
    return result, latencies


# progress.py's "committed version %d of %s (%s): … in %.3f s" (the table was added on 2026-11-25, and this
# summary came out empty from then until a review found it).
_COMMITTED = re.compile(r"committed version (\d+) (?:of \S+ )?\((\w+)\).* in ([\d.]+) s$")


def _commit_lines(log: Path) -> dict[str, Any]:
    """Why the daemon committed (latency, records, bytes…) and how long its commits took (write + Delta)."""
    reasons: dict[str, int] = {}
    seconds = []
    for line in log.read_text(errors="replace").splitlines():
        try:
            message = str(json.loads(line).get("message", ""))
        except ValueError:
            continue
        match = _COMMITTED.search(message)
        if match:
            reasons[match[2]] = reasons.get(match[2], 0) + 1
            seconds.append(float(match[3]))
    if not seconds:
        return {}
    seconds.sort()
    return {
        "reasons": reasons,
        "commit_s_p50": seconds[len(seconds) // 2],
        "commit_s_max": seconds[-1],
    }


def warm_then_measure(
    monitor: TreeMonitor,
    bootstrap: str,
    topic: str,
    partitions: int,
    rate: float,
    seconds: float,
    warmup_s: float,
    dataset: str,
    table: Path,
    drain_timeout_s: float,
) -> dict[str, Any]:
    """A warm-up at the same rate (left out of the figures), then the measured run; waits until the table
    holds every message. Returns the measured producer's report with ``cpu_s`` (the engine's, while it
    produced) and ``drain_s`` (seconds from the producer's end until the table held every row)."""
    total = 0
    if warmup_s > 0:
        total += run_rate_producer(bootstrap, topic, partitions, rate, warmup_s, dataset)["messages"]
        wait_for_rows(table, total, drain_timeout_s)
    monitor.sample()
    cpu_before = monitor.cpu_s
    produced = run_rate_producer(bootstrap, topic, partitions, rate, seconds, dataset)
    monitor.sample()
    produced["cpu_s"] = round(monitor.cpu_s - cpu_before, 2)
    produced["warmup_messages"] = total
    produced["drain_s"] = wait_for_rows(table, total + produced["messages"], drain_timeout_s)
    return produced


def wait_for_rows(table: Path, rows: int, timeout_s: float) -> float | None:
    """Seconds until ``table`` holds ``rows`` rows (None: not within ``timeout_s``)."""
    started = time.monotonic()
    while time.monotonic() < started + timeout_s:
        if _rows(table) >= rows:
            return round(time.monotonic() - started, 2)
        time.sleep(0.25)
    return None


def steady_result(table: Path, produced: dict[str, Any], peak_rss_mb: float) -> tuple[dict[str, Any], np.ndarray]:
    """Latency figures of the rows the measured producer sent (its first produce() call on)."""
    latencies, facts = row_latencies(table, since_ms=produced["first_wall"] * 1000 - 1)
    result: dict[str, Any] = {
        "producer": produced,
        **summary(latencies),
        **facts,
        "drain_s": produced["drain_s"],
        "peak_rss_mb": peak_rss_mb,
        "cpu_cores_during_production": round(produced["cpu_s"] / produced["seconds"], 2),
    }
    if result["rows"] != produced["messages"]:
        result["error"] = f"{result['rows']} measured rows for {produced['messages']} messages"
    return result, latencies


def run_rate_producer(
    bootstrap: str, topic: str, partitions: int, rate: float, seconds: float, dataset: str
) -> dict[str, Any]:
    """bench/producer.py in rate mode, in its own process (its own GIL and core share)."""
    out = subprocess.run(
        [
            *python_module("bench.producer"),
            "--bootstrap",
            bootstrap,
            "--topic",
            topic,
            "--partitions",
            str(partitions),
            "--dataset",
            dataset,
            "--rate",
            str(rate),
            "--seconds",
            str(seconds),
        ],
        capture_output=True,
        text=True,
        check=True,
        env=repo_env(),
    )
    produced: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return produced


def python_module(module: str) -> list[str]:
    """The command that runs one of the harness's modules (``bench.producer``, ``bench.spark_ss``) as a program."""
    return [sys.executable, "-m", module]


def repo_env() -> dict[str, str]:
    """The environment of a harness subprocess: this checkout importable (bench, dev) from any working directory."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))}
