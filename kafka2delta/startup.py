"""The process's first seconds: a SIGTERM (or Ctrl-C) before the loop exists ends start-up at once, cleanly.

The loop's own handler (flush, commit, stop: cli.py) can only be installed once the loop exists, after the
imports (pyarrow, deltalake, confluent-kafka: about a second), the config, the tables and the consumer. Until
then Python's default handler would end the process by the signal (exit -15), and Kubernetes sends SIGTERM to a
pod that is still starting whenever a rollout or a scale-down overtakes it. So the entry point installs a
handler first thing, before importing anything heavy, that raises :class:`StopDuringStartup`; nothing has been
consumed or written yet, so there is nothing to flush, and the process exits 0 with one line saying so.

This module imports only the standard library, on purpose.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopDuringStartup(BaseException):
    """A stop signal arrived before the loop existed. A BaseException, like KeyboardInterrupt, so that no
    ``except Exception`` on the way (a retry around opening a table) takes it for an error to retry."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signal_name = signal.Signals(signum).name


_received: list[str] = []


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    for ignored in STOP_SIGNALS:  # a second signal must not interrupt the way out with a traceback
        signal.signal(ignored, signal.SIG_IGN)
    _received.append(signal.Signals(signum).name)
    raise StopDuringStartup(signum)


def received() -> str | None:
    """The stop signal that came during start-up, if one did. Its exception can be swallowed on the way: raised
    inside code that takes every exception (a bare ``except:``, a native library that checks for signals and
    drops the error), it never reaches :func:`main`, and the signal, now ignored, is not sent again. The loop
    asks this once its own handler is in place."""
    return _received[0] if _received else None


def guard() -> None:
    """Turn SIGTERM and SIGINT into :class:`StopDuringStartup` until the loop installs its own handler."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, _raise_stop)


def release() -> None:
    """For a command line that turned out not to run the daemon (``maintain``, ``jobs``, ``verify``, ``status``):
    Ctrl-C back to KeyboardInterrupt, and SIGTERM ends the command by :class:`SystemExit` (exit 143, as the
    signal's own default would): its ``finally`` blocks run (a coordinator turn is given back) and Spark's JVM,
    which watches its parent's pipe, goes with it. Not the default handler itself: in a container the command is
    PID 1, for which the kernel drops a signal left to its default, and a CronJob's pod deleted or past its
    deadline would wait out its grace period to be killed."""
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not interrupt the way out
    raise SystemExit(128 + signum)


MALLOC_ARENAS = 2
"""glibc malloc arenas for the daemon (glibc's default: 8 per core). Each of librdkafka's, Arrow's and delta-rs's
threads otherwise takes an arena of its own, whose freed memory stays in it: 2 took the 250-B catch-up's peak RSS
from 376-390 MB to 361-370 MB at the same speed (README "What memory each setting costs")."""
MMAP_THRESHOLD = 1024 * 1024
"""Allocations of this many bytes or more get a mapping of their own, given back to the system when freed.
glibc's threshold starts at 128 KiB and rises with every large block freed (up to 32 MiB), after which the
daemon's large, short-lived buffers (a batch's Arrow columns, a file's growing row groups) come from the heap,
whose holes stay resident: with a fixed 1 MiB, a 250-B catch-up peaked at 224-230 MB in every run (240-246
without in the same hour, 235-261 over a day's runs) and a 2-KB one at 299-301 MB (339-348), for 5-12% more CPU
per message (README "What memory each setting costs")."""
_M_ARENA_MAX = -8  # mallopt's parameter numbers (malloc.h)
_M_MMAP_THRESHOLD = -3


def tune_malloc() -> None:
    """Cap glibc's malloc arenas and fix its mmap threshold, before any thread starts. An operator's own choice,
    read by glibc itself, wins: ``MALLOC_ARENA_MAX`` or ``glibc.malloc.arena_max`` in ``GLIBC_TUNABLES``, and
    ``MALLOC_MMAP_THRESHOLD_`` or ``glibc.malloc.mmap_threshold``. Other C libraries (musl) are left alone."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None)  # the C library the interpreter runs on (no search for it)
    if not (hasattr(libc, "mallopt") and hasattr(libc, "gnu_get_libc_version")):  # glibc only
        return
    if not _set_by_operator("MALLOC_ARENA_MAX", "glibc.malloc.arena_max"):
        libc.mallopt(_M_ARENA_MAX, MALLOC_ARENAS)
    if not _set_by_operator("MALLOC_MMAP_THRESHOLD_", "glibc.malloc.mmap_threshold"):
        libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)


def _set_by_operator(variable: str, tunable: str) -> bool:
    """Whether glibc was given this malloc setting through the environment (``GLIBC_TUNABLES`` is
    ``name=value:name=value``)."""
    tunables = os.environ.get("GLIBC_TUNABLES", "").split(":")
    return variable in os.environ or any(item.partition("=")[0] == tunable for item in tunables)


def main() -> int:
    """The ``kafka2delta`` entry point: for the daemon, guard first, then import and run the command line. The
    other commands keep the default handlers: a stopped ``verify`` or Spark job must not exit 0 as if it had
    done its work."""
    command = next((arg for arg in sys.argv[1:] if not arg.startswith("-")), "")
    if command == "ingest":
        guard()
        # Read by pyarrow when it loads (so before any import of it): glibc's allocator gives freed Arrow buffers
        # back, jemalloc (pyarrow's default) keeps them; catch-up peak RSS 382-387 MB against 428-434, same speed
        # (README "What memory each setting costs"). An operator's own choice in the environment wins.
        os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
        tune_malloc()
    try:
        from kafka2delta.cli import main as cli_main  # after guard(), on purpose

        return cli_main()
    except StopDuringStartup as stop:
        line = f"received {stop.signal_name} during start-up: stopped before consuming"
        if logging.getLogger().handlers:  # the config was read: say it in the configured format
            logging.getLogger("kafka2delta").warning(line)
        else:
            print(f"kafka2delta: {line}", file=sys.stderr)
        return 0
