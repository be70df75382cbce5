"""The job coordinator: one lock per table plus an expected predecessor, so that the jobs writing one Delta
table (ingestion, mutations, GDPR deletes, compaction) never commit over each other and run in a set order.

Delta's optimistic concurrency keeps a table consistent but does not keep the writers alive: open-source Delta
runs every DELETE/UPDATE/MERGE at the Serializable level, so one that read the table while anyone appended
fails with ``ConcurrentAppendException``, and OPTIMIZE and a DELETE that rewrite the same file fail each other.
The coordinator serialises the writers instead (the design of Salesforce's Engagement pipeline):

1. ``turn(job)`` takes the resource's lock, waiting at most ``lock_timeout_s``; no lock: ``None``, the job skips
   this turn (it does not fail) and tries again at its next trigger.
2. It reads the last registered job. With an ``order`` (a cycle of job names), a job runs only after the job
   before it, or after itself (replicas of one job share its place); otherwise it releases the lock and returns
   ``None`` (unless that registration is older than ``order_timeout_s``, when the predecessor is taken as
   stopped). A registration by a job outside the order is ignored, with a warning.
3. The job runs inside ``with turn:``. Leaving the block without an exception registers the job as the last
   one (jobs outside the ``order`` only take the lock); leaving it either way releases the lock.

::

    coordinator = open_coordinator(config.coordinator, config.table.uri)
    turn = coordinator.turn("optimize")
    if turn is None:
        ...                      # skipped: lock busy, or not this job's turn (coordinator.last_skip says which)
    else:
        with turn:
            run_optimize()       # commit here; the lock is held

Backends: ZooKeeper (``kazoo``'s lock recipe under ``<root>/<resource>/lock``, the registration in
``<root>/<resource>/last``; a crashed job's lock goes with its session) for jobs on several hosts, and an fcntl
lock on ``<lock_dir>/<resource>.lock`` (registration in ``<resource>.last.json``) for one host. Registrations
carry wall-clock times, which hosts share; the lock wait uses the monotonic clock.

This module must not import pyspark (the daemon may use it); kazoo is imported only by the ZooKeeper backend.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from kafka2delta.config import CoordinatorConfig, table_key
from kafka2delta.errors import ConfigError, RetryableError

logger = logging.getLogger(__name__)

_POLL_S = 0.05


class CoordinatorError(RetryableError):
    """The coordinator's store cannot be reached or read (ZooKeeper down, lock dir unwritable)."""


@dataclass(frozen=True)
class Registration:
    """The last job that finished a turn on a resource."""

    job: str
    at: float
    """Wall-clock time the turn ended, epoch seconds."""
    owner: str
    """``host:pid`` of the process that ran it."""
    sequence: int
    """Turns registered on this resource so far (1 for the first)."""

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Registration | None:
        if not data:
            return None
        try:
            raw = json.loads(data)
            return cls(str(raw["job"]), float(raw["at"]), str(raw["owner"]), int(raw["sequence"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise CoordinatorError(f"unreadable coordinator registration {data[:200]!r}: {exc}") from exc


class Backend(Protocol):
    """Where the lock and the last registration of one resource live."""

    def acquire(self, owner: str, timeout_s: float) -> bool:
        """Take the lock, waiting at most ``timeout_s``; False if it stayed busy."""

    def release(self) -> None:
        """Give the lock up (no-op if not held)."""

    def read_last(self) -> Registration | None: ...

    def write_last(self, registration: Registration) -> None: ...

    def lost(self) -> bool:
        """True if the lock taken by the last ``acquire`` may have been lost since (ZooKeeper session trouble)."""

    def close(self) -> None: ...


class NoBackend:
    """``backend = "none"``: no lock; registrations kept in memory (this process only)."""

    def __init__(self) -> None:
        self._last: Registration | None = None

    def acquire(self, owner: str, timeout_s: float) -> bool:
        return True

    def release(self) -> None:
        pass

    def read_last(self) -> Registration | None:
        return self._last

    def write_last(self, registration: Registration) -> None:
        self._last = registration

    def lost(self) -> bool:
        return False

    def close(self) -> None:
        pass


class FileBackend:
    """An exclusive ``flock`` on ``<lock_dir>/<resource>.lock``: one host, any number of processes and threads
    (each acquire opens its own file description, so two threads of one process exclude each other too)."""

    def __init__(self, lock_dir: str | Path, resource: str) -> None:
        self._dir = Path(lock_dir)
        try:
            self._dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError("coordinator.lock_dir", f"cannot create {self._dir}: {exc}") from exc
        self._lock_path = self._dir / f"{resource}.lock"
        self._last_path = self._dir / f"{resource}.last.json"
        self._fd: int | None = None

    def acquire(self, owner: str, timeout_s: float) -> bool:
        if self._fd is not None:
            raise CoordinatorError(f"{self._lock_path} is already held by this coordinator")
        try:
            fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise CoordinatorError(f"cannot open the lock file {self._lock_path}: {exc}") from exc
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    return False
                time.sleep(_POLL_S)
                continue
            except OSError as exc:
                os.close(fd)
                raise CoordinatorError(f"cannot lock {self._lock_path}: {exc}") from exc
            self._fd = fd
            with contextlib.suppress(OSError):  # who holds it, for a person looking
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{owner}\n".encode(), 0)
            return True

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def read_last(self) -> Registration | None:
        try:
            return Registration.from_json(self._last_path.read_bytes())
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise CoordinatorError(f"cannot read {self._last_path}: {exc}") from exc

    def write_last(self, registration: Registration) -> None:
        tmp = self._last_path.with_name(f".{self._last_path.name}.{os.getpid()}.{threading.get_ident()}")
        try:
            tmp.write_bytes(registration.to_json())
            os.replace(tmp, self._last_path)
        except OSError as exc:
            raise CoordinatorError(f"cannot write {self._last_path}: {exc}") from exc

    def lost(self) -> bool:
        return False

    def close(self) -> None:
        self.release()


class ZooKeeperBackend:
    """kazoo's lock recipe (ephemeral sequential znodes: fair, released when the holder's session dies)."""

    def __init__(
        self, hosts: str, root: str, resource: str, session_timeout_s: float, connect_timeout_s: float
    ) -> None:
        try:
            from kazoo.client import KazooClient
            from kazoo.handlers.threading import KazooTimeoutError
        except ImportError as exc:
            raise ConfigError(
                "coordinator.backend", "'zookeeper' needs the kazoo package (pip install 'kafka2delta[spark]')"
            ) from exc
        self._hosts = hosts
        self._path = f"{root.rstrip('/')}/{resource}"
        self._client = KazooClient(hosts=hosts, timeout=session_timeout_s)
        self._lost = threading.Event()
        self._client.add_listener(self._on_state)
        try:
            self._client.start(timeout=connect_timeout_s)
        except KazooTimeoutError as exc:
            self._client.close()
            raise CoordinatorError(
                f"ZooKeeper at {hosts} (coordinator.hosts) did not answer in {connect_timeout_s:.0f} s"
            ) from exc
        self._lock: Any = None
        self._held = False
        self._call(lambda: self._client.ensure_path(self._path), "create")

    def _on_state(self, state: str) -> None:
        if self._held and state in ("SUSPENDED", "LOST"):
            self._lost.set()

    def _call(self, action: Callable[[], Any], what: str) -> Any:
        from kazoo.exceptions import KazooException
        from kazoo.handlers.threading import KazooTimeoutError

        try:
            return action()
        except (KazooException, KazooTimeoutError) as exc:
            raise CoordinatorError(
                f"ZooKeeper {what} {self._path} at {self._hosts} failed: {type(exc).__name__} {exc}"
            ) from exc

    def acquire(self, owner: str, timeout_s: float) -> bool:
        from kazoo.exceptions import LockTimeout

        self._lost.clear()
        lock = self._client.Lock(f"{self._path}/lock", identifier=owner)
        try:
            got = bool(self._call(lambda: lock.acquire(blocking=True, timeout=timeout_s), "lock"))
        except CoordinatorError as exc:
            if isinstance(exc.__cause__, LockTimeout):
                return False
            raise
        if got:
            self._lock, self._held = lock, True
        return got

    def release(self) -> None:
        lock, self._lock, self._held = self._lock, None, False
        if lock is not None:
            try:
                self._call(lock.release, "unlock")
            except CoordinatorError as exc:  # the session's end releases it anyway
                logger.warning("%s", exc)

    def read_last(self) -> Registration | None:
        path = f"{self._path}/last"

        def read() -> bytes:
            if not self._client.exists(path):
                return b""
            data, _stat = self._client.get(path)
            return bytes(data)

        return Registration.from_json(self._call(read, "read"))

    def write_last(self, registration: Registration) -> None:
        path = f"{self._path}/last"

        def write() -> None:
            if self._client.exists(path):
                self._client.set(path, registration.to_json())
            else:
                self._client.create(path, registration.to_json())

        self._call(write, "write")

    def lost(self) -> bool:
        return self._lost.is_set()

    def close(self) -> None:
        self.release()
        with contextlib.suppress(Exception):
            self._client.stop()
            self._client.close()


class Turn:
    """One job's turn, holding the lock: ``with turn:`` runs the job; a clean exit registers it, any exit releases."""

    def __init__(self, coordinator: Coordinator, job: str, predecessor: Registration | None) -> None:
        self._coordinator = coordinator
        self.job = job
        self.predecessor = predecessor
        """The registration found when the turn started (None: nothing registered yet)."""
        self.registration: Registration | None = None
        """This turn's registration, once the block exited cleanly (None for a job outside the order)."""
        self._done = False

    def __enter__(self) -> Turn:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._done:
            return
        self._done = True
        self._coordinator._finish(self, succeeded=exc_type is None)

    def release(self) -> None:
        """Give the lock up without registering (the ``with`` block does this on an exception)."""
        if not self._done:
            self._done = True
            self._coordinator._finish(self, succeeded=False)


class Coordinator:
    """Hands out turns on one resource to named jobs (see the module docstring). One instance per job process
    (or thread): it holds at most one turn at a time."""

    def __init__(
        self,
        backend: Backend,
        resource: str,
        *,
        order: tuple[str, ...] = (),
        order_timeout_s: float = 0.0,
        lock_timeout_s: float = 10.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.resource = resource
        self.order = order
        self._backend = backend
        self._order_timeout_s = order_timeout_s
        self._lock_timeout_s = lock_timeout_s
        self._clock = clock
        self._owner = f"{socket.gethostname()}:{os.getpid()}"
        self._active: Turn | None = None
        self.last_skip = ""
        """Why the last ``turn`` returned None: ``"lock busy"`` or ``"waiting for <job> (last: <job>)"``."""

    def expected_predecessor(self, job: str) -> str | None:
        """The job that must have run last before ``job`` may run (None: any)."""
        if job not in self.order or len(self.order) < 2:
            return None
        return self.order[self.order.index(job) - 1]

    def last(self) -> Registration | None:
        """The last registration (read without the lock)."""
        return self._backend.read_last()

    def turn(self, job: str, lock_timeout_s: float | None = None) -> Turn | None:
        """Take the lock and check the predecessor; a :class:`Turn` to run ``job`` in, or None to skip this turn."""
        if self._active is not None:
            raise CoordinatorError(f"job {self._active.job!r} still holds the turn on {self.resource}")
        timeout = self._lock_timeout_s if lock_timeout_s is None else lock_timeout_s
        if not self._backend.acquire(f"{job}@{self._owner}", timeout):
            self.last_skip = "lock busy"
            logger.info("%s: lock on %s busy for %.1f s; skipping this turn", job, self.resource, timeout)
            return None
        try:
            last = self._backend.read_last()
        except BaseException:
            self._backend.release()
            raise
        expected = self.expected_predecessor(job)
        if last is not None and self.order and last.job not in self.order:
            # Registered by a job with another order (or renamed): following it would stall the cycle for good.
            logger.warning(
                "%s: the last registered job %r on %s is not in coordinator.order %s; not waiting for it",
                job,
                last.job,
                self.resource,
                list(self.order),
            )
            last = None
        # A job may follow itself: replicas of one job (several daemons in one group) share its place in the cycle.
        if expected is not None and last is not None and last.job not in (expected, job):
            age = self._clock() - last.at
            if not (self._order_timeout_s > 0 and age > self._order_timeout_s):
                self._backend.release()
                self.last_skip = f"waiting for {expected} (last: {last.job})"
                logger.info("%s: %s on %s; skipping this turn", job, self.last_skip, self.resource)
                return None
            logger.warning(
                "%s: last registered job %s is %.0f s old (> coordinator.order_timeout_s); not waiting for %s",
                job,
                last.job,
                age,
                expected,
            )
        self.last_skip = ""
        self._active = Turn(self, job, last)
        logger.debug("%s: took the turn on %s (last: %s)", job, self.resource, last.job if last else None)
        return self._active

    def _finish(self, turn: Turn, *, succeeded: bool) -> None:
        try:
            if succeeded and (not self.order or turn.job in self.order):
                if self._backend.lost():
                    logger.error(
                        "%s: the lock on %s may have been lost during the turn (ZooKeeper session); not registering",
                        turn.job,
                        self.resource,
                    )
                else:
                    sequence = (turn.predecessor.sequence if turn.predecessor else 0) + 1
                    registration = Registration(turn.job, self._clock(), self._owner, sequence)
                    try:
                        self._backend.write_last(registration)
                    except CoordinatorError as exc:
                        # The job's work has landed; only the record of it is missing (its successor waits
                        # one more turn). Failing here would report a success as a failure.
                        logger.error("%s: ran, but could not register the turn on %s: %s", turn.job, self.resource, exc)
                    else:
                        turn.registration = registration
        finally:
            self._active = None
            self._backend.release()

    def close(self) -> None:
        if self._active is not None:
            self._active.release()
        self._backend.close()

    def __enter__(self) -> Coordinator:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def resource_name(table_uri: str) -> str:
    """A znode/file-safe name for a table: its last path segment plus a hash of its URI as
    :func:`~kafka2delta.config.table_key` spells it, so every spelling of one table takes one lock."""
    uri = table_key(table_uri)
    base = re.sub(r"[^A-Za-z0-9_.-]", "_", uri.rsplit("/", 1)[-1])[:60] or "table"
    digest = hashlib.sha256(uri.encode()).hexdigest()[:12]
    return f"{base}-{digest}"


def open_coordinator(config: CoordinatorConfig, table_uri: str, *, connect_timeout_s: float = 15.0) -> Coordinator:
    """The coordinator ``config`` describes for the table at ``table_uri``."""
    resource = config.resource or resource_name(table_uri)
    backend: Backend
    if config.backend == "zookeeper":
        backend = ZooKeeperBackend(config.hosts, config.root, resource, config.session_timeout_s, connect_timeout_s)
    elif config.backend == "file":
        backend = FileBackend(config.lock_dir, resource)
    else:
        backend = NoBackend()
    return Coordinator(
        backend,
        resource,
        order=config.order,
        order_timeout_s=config.order_timeout_s,
        lock_timeout_s=config.lock_timeout_s,
    )
