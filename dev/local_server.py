"""What the local dev servers share: :mod:`dev.kafka.broker` (Kafka), :mod:`dev.registry.registry` (Apicurio)
and :mod:`dev.zookeeper.zookeeper`.

Both fetch a Java program from Maven Central once into a cache dir outside the repo, run it as a child process
that leads its own process group and listens on 127.0.0.1 only, keep a pid file and a log in a work dir, and
have a CLI whose start/status/stop find a detached server again through that pid file. This module holds the
parts that are the same logic for both; what differs on purpose (what is fetched, the configuration files, the
command line, the readiness check, which ports) stays in each script.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import fcntl
import hashlib
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import ClassVar, NamedTuple, Self

_MARKER = ".pom-sha256"
_LOG_TAIL_LINES = 60
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # mvn 3.8 emits colour resets even with -B
_STACK_FRAME = re.compile(r"\s+(at |\.\.\. \d+ more)")
# Servers started in-process; stopped at interpreter exit unless detached (CLI).
_LIVE: set[LocalServer] = set()


# ---------------------------------------------------------------- fetching from Maven


def pom_property(pom: Path, name: str) -> str:
    """The value of the property ``<name>`` in ``pom`` (e.g. the pinned version of what is fetched)."""
    match = re.search(rf"<{re.escape(name)}>\s*([^<\s]+)\s*</{re.escape(name)}>", pom.read_text())
    if match is None:
        raise RuntimeError(f"no <{name}> property in {pom}")
    return match.group(1)


def cache_dir(env_var: str, name: str) -> Path:
    """$``env_var`` if set, else ``~/.cache/kafka2delta/NAME``: outside the repo, so that clones share it."""
    env = os.environ.get(env_var)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "kafka2delta" / name


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Exclusive flock on ``path`` (created if missing), so that only one process fetches at a time."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_fetched(target: Path, pom: Path, complete: Callable[[Path], bool], fetch: Callable[[Path], Path]) -> Path:
    """Return ``target`` once it holds what ``fetch`` makes for the current ``pom``, calling it if needed.

    ``target`` counts as done when its marker file holds the pom's sha256 (so editing the pom, e.g. a version
    bump, refetches) and ``complete(target)`` agrees. Otherwise, under a file lock next to ``target``,
    ``fetch(tmp)`` fills a fresh temp dir and returns the directory that becomes ``target`` (``tmp`` itself or
    one inside it), which is then renamed into place: concurrent callers never see a half-made ``target``.
    """
    pom_hash = hashlib.sha256(pom.read_bytes()).hexdigest()

    def done() -> bool:
        try:
            recorded = (target / _MARKER).read_text().strip()
        except OSError:
            return False
        return recorded == pom_hash and complete(target)

    if done():
        return target
    with file_lock(target.parent / f".{target.name}.lock"):
        if done():  # another process fetched it while this one waited for the lock
            return target
        tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            made = fetch(tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        (made / _MARKER).write_text(pom_hash + "\n")
        if target.exists():
            shutil.rmtree(target)
        made.rename(target)
        shutil.rmtree(tmp, ignore_errors=True)  # what fetch left beside ``made``, if anything
    return target


class MavenRun(NamedTuple):
    """One finished ``mvn dependency:copy-dependencies`` (see :func:`mvn_copy_dependencies`)."""

    cmd: list[str]
    proc: subprocess.CompletedProcess[str]

    def error(self, action: str, detail: str = "") -> RuntimeError:
        """A RuntimeError for a failed ``action`` with mvn's exit code, ``detail``, command line and output."""
        out, err = (_ANSI.sub("", text).strip() for text in (self.proc.stdout, self.proc.stderr))
        return RuntimeError(
            f"{action} failed (exit {self.proc.returncode}{detail}): {shlex.join(self.cmd)}\n"
            f"--- mvn stdout ---\n{out}\n--- mvn stderr ---\n{err}"
        )


def maven_repository() -> Path:
    """The Maven repository of these fetches: $K2D_MAVEN_REPO, else ``~/.cache/kafka2delta/maven-repository``.
    Not ``~/.m2/repository``: Spark's Ivy looks there before Maven Central, and a jar Maven is still fetching (its
    POM already written) fails a Spark session that starts at that moment ("NOT FOUND … local-m2-cache")."""
    return cache_dir("K2D_MAVEN_REPO", "maven-repository")


MAVEN_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""Maven's JVM flags unless $MAVEN_OPTS sets others."""


def mvn_copy_dependencies(pom: Path, output_dir: Path, *options: str, fetches: str) -> MavenRun:
    """Run ``mvn -q -B -f POM dependency:copy-dependencies [OPTIONS] -DoutputDirectory=DIR`` with
    :func:`maven_repository`; never raises on mvn's exit code (the caller checks what it needed, then uses
    :meth:`MavenRun.error`)."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RuntimeError(f"mvn not found on PATH; it is needed once to fetch {fetches}")
    cmd = [mvn, "-q", "-B", "-f", str(pom), f"-Dmaven.repo.local={maven_repository()}"]
    cmd += ["dependency:copy-dependencies", *options, f"-DoutputDirectory={output_dir}"]
    # A short run waits on the network, not on Maven's code: the quick JIT and one GC thread take 40% less CPU
    # (8 CPU s against 14 for the ZooKeeper jars, same wall time), which the tests running meanwhile get.
    env = {**os.environ, "MAVEN_OPTS": os.environ.get("MAVEN_OPTS", MAVEN_OPTS)}
    return MavenRun(cmd, subprocess.run(cmd, capture_output=True, text=True, check=False, env=env))


def jvm_options(given: Sequence[str] | None, env_var: str, default: tuple[str, ...]) -> tuple[str, ...]:
    """The JVM flags: ``given`` if not None, else those in $``env_var`` (shell words) if set, else ``default``."""
    if given is not None:
        return tuple(given)
    if os.environ.get(env_var):
        return tuple(shlex.split(os.environ[env_var]))
    return default


# ------------------------------------------------------------------- ports and processes


def free_ports(count: int) -> list[int]:
    """Distinct free TCP ports on 127.0.0.1 (all sockets held open while picking)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def pick_ports(*wanted: int | None) -> list[int]:
    """``wanted`` with a distinct free port in place of each None."""
    free = free_ports(len(wanted))
    return [port if port is not None else spare for port, spare in zip(wanted, free, strict=True)]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is as good as dead
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)  # the server leads its own process group (new session)


def stop_pid(pid: int, timeout: float = 30) -> None:
    """SIGTERM the process group led by ``pid``, wait up to ``timeout``, then SIGKILL it (for a server that is
    not our child, so there is nothing to ``wait()`` on: poll until the pid is gone)."""
    signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    signal_group(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)


def recorded_pid(pid_path: Path, *cmdline_args: bytes) -> int | None:
    """The pid in ``pid_path`` if that process is alive and its command line holds every one of ``cmdline_args``.

    The command line check guards against pid reuse: a pid file can outlive its server (a crash, a reboot).
    """
    try:
        pid = int(pid_path.read_text().strip())
    except (OSError, ValueError):
        return None
    if not pid_alive(pid):
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    if not all(arg in cmdline for arg in cmdline_args):
        return None
    return pid


def stop_recorded(work_dir: Path, pid: int | None, pid_path: Path, label: str) -> int:
    """The CLI's ``stop``: stop the recorded server, if alive, and remove its (maybe stale) pid file. Exit 0."""
    if pid is None:
        print(f"no {label} running in {work_dir}", file=sys.stderr)
    else:
        stop_pid(pid)
        print(f"{label} pid {pid} stopped", file=sys.stderr)
    with contextlib.suppress(FileNotFoundError):
        pid_path.unlink()
    return 0


# A script's recorded server: (pid, address) if the server recorded in a work dir is alive; and its probe.
Recorded = Callable[[Path], "tuple[int, str] | None"]
Answers = Callable[[str, float], bool]


def start_or_reuse(
    label: str,
    work_dir: Path,
    wanted: str,
    recorded: Recorded,
    answers: Answers,
    make_server: Callable[[], LocalServer],
    timeout: float,
) -> int:
    """The CLI's ``start``: reuse the server recorded in ``work_dir`` if it answers at ``wanted``, else replace
    it with ``make_server()``, started and detached. Prints the address on stdout. Exit 0."""
    rec = recorded(work_dir)
    if rec is not None:
        pid, address = rec
        if address == wanted and answers(address, 5):
            print(f"{label} already running (pid {pid}) in {work_dir}", file=sys.stderr)
            print(address)
            return 0
        print(f"replacing {label} pid {pid} in {work_dir}", file=sys.stderr)
        stop_pid(pid)
    server = make_server()
    t0 = time.monotonic()
    address = server.start(timeout=timeout)
    elapsed = time.monotonic() - t0
    print(f"{label} started (pid {server.pid}) in {elapsed:.1f}s; log: {server.log_path}", file=sys.stderr)
    server._detach()
    print(address)
    return 0


def stop_recorded_server(label: str, work_dir: Path, recorded: Recorded, pid_file: str) -> int:
    """The CLI's ``stop`` for a server whose record is (pid, address)."""
    rec = recorded(work_dir)
    return stop_recorded(work_dir, rec[0] if rec else None, work_dir / pid_file, label)


def print_status(work_dir: Path, recorded: Recorded, answers: Answers) -> int:
    """The CLI's ``status``: the address if the recorded server answers (exit 0), else exit 1."""
    rec = recorded(work_dir)
    if rec is None or not answers(rec[1], 5):
        print("not running", file=sys.stderr)
        return 1
    print(rec[1])
    return 0


def tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    """Last lines of a log, minus Java stack frames (kept: messages and "Caused by:")."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no {path})"
    kept = [line for line in text.splitlines() if not _STACK_FRAME.match(line)]
    return "\n".join(kept[-lines:])


# ------------------------------------------------------------------------------- CLI

Command = Callable[[argparse.Namespace], int]


def cli_parser(
    description: str,
    default_dir: Path,
    *,
    start: tuple[Command, str],
    stop: tuple[Command, str],
    status: tuple[Command, str],
) -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The start/stop/status CLI both servers have, each command with ``--dir``; each pair is (function, help).

    Returns the parser and its ``start`` sub-parser, which the caller gives the server's own options.
    """
    parser = argparse.ArgumentParser(description=description)
    sub = parser.add_subparsers(dest="command", required=True)
    commands: list[argparse.ArgumentParser] = []
    for name, (func, text) in (("start", start), ("stop", stop), ("status", status)):
        command = sub.add_parser(name, help=text)
        command.add_argument("--dir", default=str(default_dir), help=f"work dir (default {default_dir})")
        command.set_defaults(func=func)
        commands.append(command)
    return parser, commands[0]


def run_cli(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None, errors: tuple[type[Exception], ...] = (RuntimeError,)
) -> int:
    """Run the command ``argv`` names; one of ``errors`` is a one-line "error: ..." and exit 1, not a traceback."""
    args = parser.parse_args(argv)
    try:
        result: int = args.func(args)
    except errors as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return result


# ------------------------------------------------------------------------- the server


class PortInUseError(RuntimeError):
    """The server could not bind one of its ports: someone else holds it."""


class LocalServer(ABC):
    """One Java server process on 127.0.0.1 with its files in ``work_dir``: the lifecycle both servers share.

    A subclass names its files and messages (the class variables), owns two ports (``port`` and a second one;
    see :meth:`_ports`), builds its own command line and configuration, and says when it is ready
    (:meth:`_ready`). Its ``start`` calls :meth:`_start_retrying` around a ``_start_once`` that ends in
    :meth:`_run`.
    """

    LABEL: ClassVar[str]  # in exceptions: "Kafka broker", "schema registry"
    PID_FILE: ClassVar[str]  # file names in work_dir
    LOG_FILE: ClassVar[str]
    # What in the log's tail means the JVM failed to bind a port.
    PORT_IN_USE: ClassVar[re.Pattern[str]]
    # Upper bound of one readiness probe while waiting for start-up.
    PROBE_TIMEOUT: ClassVar[float]

    port: int  # the one clients use; set, with the second port, by the subclass's _set_ports

    def __init__(self, work_dir: Path, port: int | None, second_port: int | None) -> None:
        self.work_dir = Path(work_dir).resolve()
        self._wanted_ports = (port, second_port)  # None: ours to pick, and to pick again if taken
        self._set_ports(*pick_ports(port, second_port))
        self._proc: subprocess.Popen[bytes] | None = None

    # -- what a subclass provides

    @abstractmethod
    def start(self, timeout: float = ..., *, fresh: bool = True) -> str:
        """Start the server and block until it is ready (``timeout`` seconds); returns :attr:`_address`. Every
        argument is optional (each subclass has its own default timeout), so that ``with server:`` can call it
        bare."""

    @property
    @abstractmethod
    def _address(self) -> str:
        """What clients connect to; ``start`` returns it."""

    @abstractmethod
    def _ready(self, timeout: float) -> bool:
        """True when the server just launched answers (one probe of at most ``timeout`` seconds)."""

    @abstractmethod
    def _ports(self) -> tuple[int, int]:
        """``port`` and the second port."""

    @abstractmethod
    def _set_ports(self, port: int, second_port: int) -> None:
        """Set ``port`` and the second port (the subclass names that one)."""

    # -- paths / state

    @property
    def data_dir(self) -> Path:
        return self.work_dir / "data"

    @property
    def log_path(self) -> Path:
        return self.work_dir / self.LOG_FILE

    @property
    def pid_path(self) -> Path:
        return self.work_dir / self.PID_FILE

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # -- lifecycle

    def _start_retrying(self, start_once: Callable[[], str]) -> str:
        # A free port picked in __init__ can be taken by someone else before java binds it:
        # retry with newly picked ports (only the ones the caller left to us).
        attempts = 3 if None in self._wanted_ports else 1
        for attempt in range(1, attempts + 1):
            try:
                return start_once()
            except PortInUseError:
                if attempt == attempts:
                    raise
                self._set_ports(*pick_ports(*self._wanted_ports))
        raise AssertionError("unreachable")

    def _run(self, command: Sequence[str], deadline: float, *, fresh: bool) -> str:
        """Launch ``command`` in ``work_dir`` (log truncated if ``fresh``, else appended to) and wait until
        :meth:`_ready`; returns :attr:`_address`. Raises PortInUseError if the JVM exits over a taken port."""
        with self.log_path.open("wb" if fresh else "ab") as log:
            proc = subprocess.Popen(
                command,
                cwd=self.work_dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # own session + process group; survives the CLI
            )
        self._proc = proc
        self.pid_path.write_text(f"{proc.pid}\n")
        _LIVE.add(self)
        while True:
            code = proc.poll()
            if code is not None:
                self._forget()
                log_tail = tail(self.log_path)
                msg = f"{self.LABEL} exited with code {code} during startup; tail of {self.log_path}:\n{log_tail}"
                if self.PORT_IN_USE.search(log_tail):
                    port, second_port = self._ports()
                    raise PortInUseError(f"port {port} or {second_port} on 127.0.0.1 already in use. {msg}")
                raise RuntimeError(msg)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.kill()
                raise RuntimeError(
                    f"{self.LABEL} at {self._address} not ready in time; "
                    f"tail of {self.log_path}:\n{tail(self.log_path)}"
                )
            if self._ready(min(self.PROBE_TIMEOUT, max(remaining, 0.1))):
                return self._address
            time.sleep(0.1)

    def stop(self, timeout: float = 30) -> None:
        """Graceful stop: SIGTERM, wait up to ``timeout``, then SIGKILL. Idempotent."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            signal_group(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=timeout)
        signal_group(proc.pid, signal.SIGKILL)  # stragglers in the group, if any
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        self._forget()

    def kill(self) -> None:
        """Hard crash: SIGKILL the process group, no clean shutdown. Data is kept."""
        proc = self._proc
        if proc is None:
            return
        signal_group(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        self._forget()

    def _forget(self) -> None:
        self._proc = None
        _LIVE.discard(self)
        with contextlib.suppress(FileNotFoundError):
            self.pid_path.unlink()

    def _detach(self) -> None:
        """Leave the server running after this interpreter exits (CLI use)."""
        _LIVE.discard(self)
        self._proc = None

    def __enter__(self) -> Self:
        if not self.is_running():
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.work_dir)!r}, port={self.port}, pid={self.pid})"


@atexit.register
def _stop_live_servers() -> None:
    for server in list(_LIVE):
        server.stop(timeout=10)
