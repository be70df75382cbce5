"""Produce-to-readable latency of every row of a Delta table, from its log.

A row is readable once the Delta version that adds its file is committed. For each version, the log's
``commitInfo.timestamp`` (epoch ms, written by the committer: delta-rs for the daemon, Delta Spark for
Spark) is that moment; each row carries its Kafka timestamp (``kafka_timestamp``: librdkafka's create time
of the message). Latency = commit timestamp − Kafka timestamp. Works for any writer's table.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def versions(table: Path) -> list[dict[str, Any]]:
    """Every commit of the table: version, commitInfo timestamp (ms), the version it read (``readVersion``, or for
    the daemon's commits, which delta-rs writes without one, ``kafka2delta.read_version``), the files it adds, the
    log file's mtime."""
    found = []
    for path in sorted((table / "_delta_log").glob("*.json")):
        version = int(path.stem)
        commit_ms: int | None = None
        read_version: int | None = None
        adds = []
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            action = json.loads(line)
            if "commitInfo" in action:
                info = action["commitInfo"]
                commit_ms = info.get("timestamp")
                read_version = info.get("readVersion", (info.get("kafka2delta") or {}).get("read_version"))
            elif "add" in action:
                adds.append(unquote(action["add"]["path"]))
        found.append(
            {
                "version": version,
                "commit_ms": commit_ms,
                "read_version": read_version,
                "adds": adds,
                "mtime_ms": path.stat().st_mtime * 1000,
            }
        )
    return found


def _timestamps_ms(file: Path, column: str) -> np.ndarray:
    values = pq.read_table(file, columns=[column]).column(column)
    return pc_cast_ms(values)


def pc_cast_ms(values: pa.ChunkedArray) -> np.ndarray:
    """A timestamp column (any unit, INT96 included) as epoch milliseconds."""
    if pa.types.is_timestamp(values.type):
        values = values.cast(pa.timestamp("us", tz=values.type.tz)).cast(pa.int64())
        return values.to_numpy(zero_copy_only=False) / 1000.0
    return values.cast(pa.int64()).to_numpy(zero_copy_only=False).astype(np.float64)


def row_latencies(
    table: Path, column: str = "kafka_timestamp", since_ms: float = 0.0
) -> tuple[np.ndarray, dict[str, Any]]:
    """Latency in seconds of every row whose Kafka timestamp is at or after ``since_ms`` (rows of a warm-up
    before it are left out), and facts about the commits: how many held measured rows, and the same
    percentiles taken from the log file's mtime (when the version became visible to readers) instead of
    commitInfo.timestamp (Delta Spark stamps commitInfo before it writes the file, delta-rs about when)."""
    chunks = []
    by_mtime = []
    commits = 0
    for entry in versions(table):
        if not entry["adds"] or entry["commit_ms"] is None:
            continue
        measured = False
        for add in entry["adds"]:
            kafka_ms = _timestamps_ms(table / add, column)
            kafka_ms = kafka_ms[kafka_ms >= since_ms]
            if len(kafka_ms):
                measured = True
                chunks.append((entry["commit_ms"] - kafka_ms) / 1000.0)
                by_mtime.append((entry["mtime_ms"] - kafka_ms) / 1000.0)
        commits += measured
    latencies = np.concatenate(chunks) if chunks else np.array([])
    facts: dict[str, Any] = {"commits_with_rows": commits}
    if by_mtime:
        visible = np.concatenate(by_mtime)
        p50, p99 = np.percentile(visible, [50, 99])
        facts["by_log_mtime"] = {"p50_s": round(float(p50), 3), "p99_s": round(float(p99), 3)}
    return latencies, facts


def summary(latencies: np.ndarray) -> dict[str, float | int]:
    if not len(latencies):
        return {"rows": 0}
    p50, p95, p99 = np.percentile(latencies, [50, 95, 99])
    return {
        "rows": len(latencies),
        "p50_s": round(float(p50), 3),
        "p95_s": round(float(p95), 3),
        "p99_s": round(float(p99), 3),
        "max_s": round(float(latencies.max()), 3),
        "min_s": round(float(latencies.min()), 3),
        "mean_s": round(float(latencies.mean()), 3),
    }


def cdf_points(latencies: np.ndarray, points: int = 200) -> list[list[float]]:
    """(latency s, fraction of rows at or below it) at ``points`` quantiles, for the CDF plot."""
    if not len(latencies):
        return []
    qs = np.linspace(0, 100, points)
    values = np.percentile(latencies, qs)
    return [[round(float(v), 4), round(float(q) / 100, 4)] for v, q in zip(values, qs, strict=True)]
