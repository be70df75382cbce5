"""Fault injection for crash tests: SIGKILL this process at a named step.

Off by default. The CLI arms it from ``K2D_FAULT_INJECT=<point>[:<nth hit>]``; when it is not
armed a :func:`point` call is one comparison. Points: ``after_parquet_write``,
``after_dead_letter_commit``, ``between_table_commits`` (a flush of several tables: one committed, the next
not yet), ``before_merge`` (upsert tables: the MERGE's changes are computed, the
call that writes its files and commits them not made), ``inside_merge`` (a file of the MERGE written, its commit
not made: see :func:`watching_files`), ``after_delta_commit``, ``before_kafka_commit``, ``after_kafka_commit``,
``in_revoke`` (a rebalance took partitions from us, before their buffers are committed) and ``in_assign``
(partitions given to us, before their start offsets are read from the table); in ``jobs apply-changes``,
``after_apply_merge`` (a micro-batch's MERGE committed, Spark's checkpoint not yet told). The chaos suite
(``tests/chaos``) kills the daemon and the job at each of them.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import unquote, urlparse

logger = logging.getLogger(__name__)

POINTS = frozenset(
    {
        "after_parquet_write",
        "after_dead_letter_commit",
        "between_table_commits",
        "before_merge",
        "inside_merge",
        "after_delta_commit",
        "before_kafka_commit",
        "after_kafka_commit",
        "in_revoke",
        "in_assign",
        "after_apply_merge",
    }
)
_armed: str | None = None
_remaining_hits = 0


def arm(spec: str) -> None:
    """Arm ``point[:n]``: kill the process at the n-th time (default first) the point is reached."""
    global _armed, _remaining_hits
    name, _, count = spec.partition(":")
    if name not in POINTS:
        raise ValueError(f"unknown fault point {name!r} (known: {', '.join(sorted(POINTS))})")
    _armed, _remaining_hits = name, int(count or 1)
    logger.warning("fault injection armed: SIGKILL at hit %d of %s", _remaining_hits, name)


def arm_from_environment() -> None:
    """Arm what ``K2D_FAULT_INJECT`` names, if anything (the daemon and the Spark jobs, at start)."""
    spec = os.environ.get("K2D_FAULT_INJECT")
    if spec:
        arm(spec)


def point(name: str) -> None:
    global _remaining_hits
    if _armed != name:
        return
    _remaining_hits -= 1
    if _remaining_hits <= 0:
        _announce("fault injection: SIGKILL at %s", name)
        os.kill(os.getpid(), signal.SIGKILL)


def _announce(message: str, *args: object) -> None:
    """Log the kill about to come, and flush it: a SIGKILLed process writes nothing more."""
    logger.critical(message, *args)
    for handler in logging.getLogger().handlers:
        handler.flush()


@contextmanager
def watching_files(name: str, table_uri: str, next_commit: int) -> Iterator[None]:
    """A step that writes files and commits them in one call outside Python (delta-rs's MERGE, which releases
    the GIL), with no hook between the two: when ``name``'s hit is due, a thread SIGKILLs this process as soon as
    a new data file appears in the local table ``table_uri`` while the log has no version ``next_commit`` yet.
    A call that committed before a file was seen (it wrote none, or wrote it too fast) does not count as the hit:
    the point stays armed for the next call."""
    global _remaining_hits
    if _armed != name or _remaining_hits > 1:
        if _armed == name:
            _remaining_hits -= 1
        yield
        return
    location = urlparse(table_uri)
    if location.scheme not in ("", "file"):
        logger.warning("fault injection: %s watches local tables only, not %s", name, table_uri)
        yield
        return
    directory = Path(unquote(location.path))
    try:
        before = _data_files(directory)  # before the call starts: its first file must not pass for an earlier one
    except OSError as exc:
        logger.warning("fault injection: %s cannot list %s: %s; armed again", name, directory, exc)
        yield
        return
    done = threading.Event()
    said: list[str] = []
    watcher = threading.Thread(
        target=_kill_on_new_file,
        args=(name, directory, before, next_commit, done, said),
        name=f"fault-{name}",
        daemon=True,
    )
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()
    if not said:
        logger.warning("fault injection: %s saw no new data file before the call ended; armed again", name)


def _kill_on_new_file(
    name: str, directory: Path, before: set[str], next_commit: int, done: threading.Event, said: list[str]
) -> None:
    """The watcher of :func:`watching_files`; what it logged goes in ``said``."""
    commit = directory / "_delta_log" / f"{next_commit:020d}.json"
    try:
        while not done.is_set():
            written = _data_files(directory) - before
            if not written:
                if commit.exists():
                    return  # committed with no file seen: "saw no new data file"
                time.sleep(0)  # let the call run: it needs the GIL to read its source rows
                continue
            # The line comes first (a dead process logs nothing), then the commit is looked for once more: the kill
            # follows that look by microseconds, while a MERGE commits ~0.5 ms or more after its first file.
            file = directory / sorted(written)[0]
            _announce("fault injection: SIGKILL at %s (%s written, version %d not committed)", name, file, next_commit)
            if not commit.exists():
                os.kill(os.getpid(), signal.SIGKILL)
            said.append("missed")
            logger.warning(
                "fault injection: %s missed: version %d was committed before the kill; armed again", name, next_commit
            )
            return
    except OSError as exc:  # the table's directory could not be listed: nothing to kill on
        said.append("failed")
        logger.warning("fault injection: %s stopped watching %s: %s; armed again", name, directory, exc)


def _data_files(directory: Path) -> set[str]:
    """The finished data files of a table, as paths under it (delta-rs writes ``<name>#<n>`` and renames it to
    ``<name>`` when complete)."""
    found = set()
    folders = [Path()]
    while folders:
        folder = folders.pop()
        for entry in os.scandir(directory / folder):
            if entry.is_dir() and entry.name != "_delta_log":
                folders.append(folder / entry.name)
            elif entry.name.endswith(".parquet"):
                found.add(str(folder / entry.name))
    return found
