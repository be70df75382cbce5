"""The changelog engine of ``bench.upsert``: the daemon appends every change to a changelog table
(``table.mode = "changelog"``) and ``kafka2delta jobs apply-changes`` (Spark, deletion vectors) applies it to
the current-state table, turn after turn (``jobs.trigger_interval_s`` = the flush interval).

The changelog starts with the seed rows as a snapshot (``_op = "r"``, Kafka coordinates -1: older than any
change), and a first ``--available-now`` run of the job creates the target from them (not measured). Then the
daemon and the job run while the changes are produced. A change is readable when the target commit of the
first micro-batch whose end offset (the job's checkpoint) covers the changelog version holding it landed.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.measure import TreeMonitor
from bench.upsert import PARTITIONS, commits, daemon_environment, produce, seed_table, summary, wait_txns

JOB_NAME = "apply-bench"


class Both:
    """Two process trees measured as one engine: CPU seconds added, peak RSS as the sum of the two peaks."""

    def __init__(self, first: TreeMonitor, second: TreeMonitor) -> None:
        self._monitors = (first, second)

    @property
    def peak_rss_mb(self) -> float:
        return round(sum(m.peak_rss_mb for m in self._monitors), 1)

    @property
    def cpu_s(self) -> float:
        return sum(m.cpu_s for m in self._monitors)


def environment(work: Path, bootstrap: str, topic: str, changelog: str, flush: float) -> dict[str, str]:
    """The daemon's and the job's configuration: the daemon's of the upsert engine in changelog mode, and the
    job's checkpoints and turn interval (= the flush interval)."""
    env = daemon_environment(work, bootstrap, topic, changelog, flush, "changelog")
    env.update(
        {
            "K2D_JOBS__CHECKPOINT_DIR": str(work / "checkpoints"),
            "K2D_JOBS__TRIGGER_INTERVAL_S": str(flush),
            "K2D_SPARK__MASTER": "local[2]",
            "K2D_SPARK__LOG_LEVEL": "WARN",
        }
    )
    return env


def job_command(changelog: str, target: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "kafka2delta",
        "jobs",
        "apply-changes",
        "--source",
        changelog,
        "--target",
        target,
        "--job-name",
        JOB_NAME,
        *extra,
    ]


def run_changelog(
    bootstrap: str, work: Path, topic: str, uri: str, flush: float, args: argparse.Namespace
) -> dict[str, Any]:
    changelog = str(work / "changelog")
    seed_table(changelog, args.rows, changelog=True)
    env = environment(work, bootstrap, topic, changelog, flush)
    started = time.monotonic()
    load = subprocess.run(
        job_command(changelog, uri, "--available-now"), env=env, cwd=work, capture_output=True, text=True
    )
    if load.returncode != 0:
        raise RuntimeError(f"the initial apply-changes run failed:\n{load.stdout[-2000:]}{load.stderr[-4000:]}")
    initial_load_s = round(time.monotonic() - started, 1)
    print(f"apply-changes created the target from {args.rows:,} snapshot rows in {initial_load_s} s", flush=True)
    before = {c["version"] for c in target_commits(uri)}

    daemon_log = (work / "daemon.log").open("wb")
    job_log = (work / "job.log").open("wb")
    daemon = subprocess.Popen(
        [sys.executable, "-m", "kafka2delta", "ingest"], env=env, cwd=work, stdout=daemon_log, stderr=daemon_log
    )
    job = subprocess.Popen(job_command(changelog, uri), env=env, cwd=work, stdout=job_log, stderr=job_log)
    with TreeMonitor(daemon.pid) as daemon_monitor, TreeMonitor(job.pid) as job_monitor:
        time.sleep(20)  # the daemon assigned and the job's Spark session up before the first change
        started = time.monotonic()
        stamps = produce(bootstrap, topic, args.rows, args.keys_now, args.rate, args.seconds)
        produced = time.monotonic()
        last = {p: max((o for (q, o) in stamps if q == p), default=-1) for p in range(PARTITIONS)}
        timeout = max(180.0, 6 * flush)
        wait_txns(changelog, topic, last, timeout=timeout)
        caught_up = wait_applied(work, changelog, topic, last, timeout)
        for process in (daemon, job):
            process.send_signal(signal.SIGTERM)
        daemon.wait(120)
        job.wait(300)
    daemon_log.close()
    job_log.close()
    found = [c for c in target_commits(uri) if c["version"] not in before]
    readable = readable_times(work, changelog, found)
    result = summary(stamps, readable, found, Both(daemon_monitor, job_monitor), started, produced, caught_up, flush)
    written = sum(c["added"] for c in commits(changelog, ("WRITE",)))
    result["changelog_bytes_per_change"] = round(written / max(1, len(stamps)))
    result["deletion_vectors_per_commit"] = round(sum(c["dvs"] for c in found) / max(1, len(found)), 1)
    result["initial_load_s"] = initial_load_s
    return result


def target_commits(uri: str) -> list[dict[str, Any]]:
    """The target's MERGE commits: version, time, the job's txn version (its micro-batch), bytes written and
    removed, deletion vectors written. A file that got a deletion vector is removed and added again under the same
    path: only its vector is written (and nothing of it removed)."""
    found = []
    for path in sorted((Path(uri) / "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        info: dict[str, Any] = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
        batch = next(
            (a["txn"]["version"] for a in actions if "txn" in a and a["txn"]["appId"].endswith(JOB_NAME)), None
        )
        adds = {a["add"]["path"]: a["add"] for a in actions if "add" in a}
        removes = {a["remove"]["path"]: a["remove"] for a in actions if "remove" in a}
        added = removed = dvs = 0
        for file_path, add in adds.items():
            vector = add.get("deletionVector")
            dvs += vector is not None
            vector_bytes = vector.get("sizeInBytes", 0) if vector else 0
            added += vector_bytes if file_path in removes else add.get("size", 0) + vector_bytes
        removed = sum(r.get("size", 0) or 0 for p, r in removes.items() if p not in adds)
        if info.get("operation") == "MERGE" and batch is not None:
            found.append(
                {
                    "version": int(path.stem),
                    "ts": info["timestamp"] / 1000,
                    "batch": batch,
                    "added": added,
                    "removed": removed,
                    "dvs": dvs,
                }
            )
    return found


def applied_through(work: Path) -> dict[int, tuple[int, int]]:
    """Micro-batch id → the end of the changelog it read (reservoirVersion, index), for the batches the job's
    checkpoint recorded as done."""
    root = work / "checkpoints" / JOB_NAME
    ends = {}
    for path in (root / "offsets").glob("[0-9]*"):
        if not (root / "commits" / path.name).exists():
            continue
        offset = json.loads(path.read_text().splitlines()[-1])
        ends[int(path.name)] = (int(offset["reservoirVersion"]), int(offset["index"]))
    return ends


def changelog_versions(changelog: str) -> dict[int, tuple[int, dict[int, tuple[int, int]]]]:
    """Changelog version → (files it added, partition → offsets it holds)."""
    versions = {}
    for commit in commits(changelog, ("WRITE",), with_version=True):
        offsets = (commit["kafka2delta"] or {}).get("offsets", {})
        versions[commit["version"]] = (commit["files"], {int(p): (a, b) for p, (a, b) in offsets.items()})
    return versions


def covers(end: tuple[int, int], version: int, files: int) -> bool:
    """Whether a micro-batch ending at ``end`` read all of ``version`` (Delta's source offsets: ``index`` -1
    means the version before ``reservoirVersion`` was read to its end)."""
    reservoir, index = end
    return reservoir > version or (reservoir == version and index >= files - 1)


def readable_times(work: Path, changelog: str, found: list[dict[str, Any]]) -> dict[tuple[int, int], float]:
    """(partition, offset) → when the target commit that applied it landed."""
    ends = applied_through(work)
    by_batch = sorted((c["batch"], c["ts"]) for c in found if c["batch"] in ends)
    readable: dict[tuple[int, int], float] = {}
    for version, (files, offsets) in sorted(changelog_versions(changelog).items()):
        when = next((ts for batch, ts in by_batch if covers(ends[batch], version, files)), None)
        if when is None:
            continue
        for partition, (first, last) in offsets.items():
            for offset in range(first, last + 1):
                readable.setdefault((partition, offset), when)
    return readable


def wait_applied(work: Path, changelog: str, topic: str, last: dict[int, int], timeout: float) -> float | None:
    """The monotonic time the job's checkpoint covered the changelog version holding each partition's last
    offset; None after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        versions = changelog_versions(changelog)
        needed = [
            (version, files)
            for version, (files, offsets) in versions.items()
            if any(p in offsets and offsets[p][0] <= o <= offsets[p][1] for p, o in last.items())
        ]
        ends = list(applied_through(work).values())
        if needed and all(any(covers(end, v, f) for end in ends) for v, f in needed):
            return time.monotonic()
        time.sleep(0.5)
    return None
