"""Measuring a process tree (psutil) and describing the machine."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import psutil


class TreeMonitor:
    """Samples a process and its descendants every ``interval`` seconds in a thread.

    - ``peak_rss_mb``: the larger of the largest sum of RSS over the tree at one sample (the daemon's Python
      process; for Spark the driver's Python process plus its JVM) and the kernel's high-water mark of the
      largest process (``VmHWM``, read at each sample, and the rusage of a process the caller reaped, see
      :meth:`exited`). A sample can fall between two short spikes (the daemon maps buffers of 1 MiB or more on
      their own and frees them at once); the kernel's mark cannot. So for a one-process tree reaped with
      ``os.wait4`` (the daemon's catch-ups) the figure is its peak; otherwise it misses at most what grew in
      the last interval before the process ended, and for a tree it is never less than its largest process's;
    - ``cpu_s``: user + system CPU seconds of the tree: the last value seen of each process (a process that
      ends between two samples loses at most one interval), or the root's rusage when it is larger.
    """

    def __init__(self, pid: int, interval: float = 0.1) -> None:
        self.root = psutil.Process(pid)
        self.interval = interval
        self.peak_rss = 0
        self._high_water: dict[int, int] = {}  # pid -> VmHWM bytes, the last read while it lived
        self._cpu: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tree-monitor", daemon=True)
        self.samples: list[tuple[float, float, float]] = []  # (monotonic, rss MB, cpu s)

    def __enter__(self) -> TreeMonitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _processes(self) -> list[psutil.Process]:
        try:
            return [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return []

    def sample(self) -> None:
        rss = 0
        for proc in self._processes():
            try:
                with proc.oneshot():
                    mem = proc.memory_info().rss
                    times = proc.cpu_times()
            except psutil.Error:
                continue
            rss += mem
            key = proc.pid
            self._high_water[key] = max(self._high_water.get(key, 0), high_water_mark(key))
            # children_* are the CPU of waited-for children (a short-lived helper such as `java -version`).
            self._cpu[key] = max(
                self._cpu.get(key, 0.0), times.user + times.system + times.children_user + times.children_system
            )
        if rss:
            self.peak_rss = max(self.peak_rss, rss)
            self.samples.append((time.monotonic(), rss / 2**20, sum(self._cpu.values())))

    def exited(self, pid: int, max_rss_bytes: int) -> None:
        """A process of the tree ended, with this peak RSS (``os.wait4``'s rusage): it counts as its mark."""
        self._high_water[pid] = max(self._high_water.get(pid, 0), max_rss_bytes)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    @property
    def peak_rss_mb(self) -> float:
        return round(max(self.peak_rss, *self._high_water.values(), 0) / 2**20, 1)

    @property
    def cpu_s(self) -> float:
        return sum(self._cpu.values())


def high_water_mark(pid: int) -> int:
    """The kernel's peak resident set size of a live process (``VmHWM`` in /proc), in bytes; 0 where unread."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # the kernel writes kB
    return 0


def cpu_s_of_children(before: Any, after: Any) -> float:
    """CPU seconds between two ``resource.getrusage(RUSAGE_CHILDREN)`` readings."""
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def busy_processes() -> list[str]:
    """Other engineers' test suites and JVMs running now (command lines, shortened)."""
    found = []
    me = os.getpid()
    for proc in psutil.process_iter(["pid", "cmdline", "cpu_percent"]):
        if proc.pid == me:
            continue
        cmd = " ".join(proc.info.get("cmdline") or [])
        if any(word in cmd for word in ("pytest", "java ")) or cmd.startswith("java"):
            found.append(f"{proc.pid}: {cmd[:140]}")
    return found


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def _java_version() -> str:
    try:
        out = subprocess.run(["java", "-version"], capture_output=True, text=True, check=False, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return (out.stderr or out.stdout).splitlines()[0] if (out.stderr or out.stdout) else "unknown"


def machine() -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    packages = {}
    for name in ("kafka2delta", "confluent-kafka", "deltalake", "pyarrow", "pyspark", "delta-spark"):
        with contextlib.suppress(PackageNotFoundError):
            packages[name] = version(name)
    return {
        "cpus": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "java": _java_version(),
        "packages": packages,
    }


def git_state(root: Path) -> dict[str, Any]:
    """The commit the daemon ran from, and whether its package had uncommitted changes."""

    def git(*args: str) -> str:
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False)
        return out.stdout.strip()

    dirty = git("status", "--porcelain", "--", "kafka2delta")
    return {"commit": git("rev-parse", "HEAD"), "kafka2delta_dirty": [line[3:] for line in dirty.splitlines()]}
