"""Local single-node Apache Kafka (KRaft, combined broker+controller) for dev and tests.

No Docker and no Kafka tarball: the broker's jars come from Maven Central through
``dev/kafka/pom.xml`` (see :func:`ensure_jars`) and the broker runs as a plain
``java`` subprocess bound to 127.0.0.1 only.

Library use (tests)::

    with LocalBroker(tmp_path / "kafka") as broker:  # free ports, started on enter
        create_topic(broker.bootstrap_servers, "events", partitions=4)
        ...

CLI use (a developer's shell; the broker keeps running after the command exits)::

    python dev/kafka/broker.py start [--dir DIR] [--port N] [--controller-port N]
    python dev/kafka/broker.py status [--dir DIR]
    python dev/kafka/broker.py stop [--dir DIR]

Environment:
    K2D_KAFKA_LIBS       where the jars are cached (default ~/.cache/kafka2delta/kafka-libs-<ver>)
    K2D_KAFKA_JVM_OPTS   replaces the default JVM flags (heap/GC/JIT), e.g. for benchmarks
"""

from __future__ import annotations

import argparse
import atexit
import base64
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
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic  # what confluent_kafka.admin re-exports (not in its __all__)

HERE = Path(__file__).resolve().parent
POM = HERE / "pom.xml"
LOG4J_CONFIG = HERE / "log4j2.properties"

DEFAULT_DIR = Path(".k2d/kafka")
DEFAULT_PORT = 9092
DEFAULT_CONTROLLER_PORT = 9093

# Serial GC + C1-only JIT: ~1.8 s instead of ~2.4 s from launch to ready on 2 cores.
# C1-only lowers peak throughput; benchmarks can override via K2D_KAFKA_JVM_OPTS.
DEFAULT_JVM_OPTS: tuple[str, ...] = (
    "-Xms64m",
    "-Xmx512m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:-UsePerfData",
    "-Djava.awt.headless=true",
)

_MARKER = ".pom-sha256"
_LOG_TAIL_LINES = 60
_PORT_IN_USE = re.compile(r"BindException|Address already in use")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # mvn 3.8 emits colour resets even with -B
_STACK_FRAME = re.compile(r"\s+(at |\.\.\. \d+ more)")
# Brokers started in-process; stopped at interpreter exit unless detached (CLI).
_LIVE: set[LocalBroker] = set()


# --------------------------------------------------------------------------- jars


def kafka_version() -> str:
    """The Kafka version pinned in pom.xml (``<kafka.version>``)."""
    match = re.search(r"<kafka\.version>\s*([^<\s]+)\s*</kafka\.version>", POM.read_text())
    if match is None:
        raise RuntimeError(f"no <kafka.version> property in {POM}")
    return match.group(1)


def default_libs_dir() -> Path:
    env = os.environ.get("K2D_KAFKA_LIBS")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "kafka2delta" / f"kafka-libs-{kafka_version()}"


def _pom_hash() -> str:
    return hashlib.sha256(POM.read_bytes()).hexdigest()


def _jars_ok(libs: Path, pom_hash: str) -> bool:
    marker = libs / _MARKER
    try:
        recorded = marker.read_text().strip()
    except OSError:
        return False
    return recorded == pom_hash and any(libs.glob("kafka_2.13-*.jar"))


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_jars(libs_dir: Path | None = None) -> Path:
    """Return a directory holding the broker's runtime jars, fetching them if needed.

    Maven runs only when the directory lacks a marker matching the current pom.xml's
    sha256, so editing the pom (e.g. a version bump) refetches. Safe to call from
    several processes at once (file lock; fetch into a temp dir, then rename).
    """
    libs = (libs_dir if libs_dir is not None else default_libs_dir()).expanduser().resolve()
    pom_hash = _pom_hash()
    if _jars_ok(libs, pom_hash):
        return libs
    with _file_lock(libs.parent / f".{libs.name}.lock"):
        if _jars_ok(libs, pom_hash):
            return libs
        mvn = shutil.which("mvn")
        if mvn is None:
            raise RuntimeError("mvn not found on PATH; it is needed once to fetch the Kafka jars")
        tmp = libs.parent / f".{libs.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        cmd = [
            mvn,
            "-q",
            "-B",
            "-f",
            str(POM),
            "dependency:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={tmp}",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0 or not any(tmp.glob("kafka_2.13-*.jar")):
            shutil.rmtree(tmp, ignore_errors=True)
            out, err = (_ANSI.sub("", text).strip() for text in (proc.stdout, proc.stderr))
            raise RuntimeError(
                f"fetching Kafka jars failed (exit {proc.returncode}): {shlex.join(cmd)}\n"
                f"--- mvn stdout ---\n{out}\n--- mvn stderr ---\n{err}"
            )
        (tmp / _MARKER).write_text(pom_hash + "\n")
        if libs.exists():
            shutil.rmtree(libs)
        tmp.rename(libs)
    return libs


# ------------------------------------------------------------------------ helpers


def _free_ports(count: int) -> list[int]:
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


def _cluster_id() -> str:
    """Same format as ``kafka-storage.sh random-uuid`` (url-safe base64, no padding)."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def _admin(bootstrap: str) -> AdminClient:
    return AdminClient(
        {
            "bootstrap.servers": bootstrap,
            "log_level": 0,  # silence librdkafka's "Connection refused" spam while polling
            "reconnect.backoff.ms": 50,
            "reconnect.backoff.max.ms": 250,
            "socket.connection.setup.timeout.ms": 2000,
        }
    )


def _answers(bootstrap: str, timeout: float) -> bool:
    try:
        md = _admin(bootstrap).list_topics(timeout=timeout)
    except KafkaException:
        return False
    return bool(md.brokers)


def _pid_alive(pid: int) -> bool:
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


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)  # the broker leads its own process group (new session)


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    """Last lines of a log, minus Java stack frames (kept: messages and "Caused by:")."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no {path})"
    kept = [line for line in text.splitlines() if not _STACK_FRAME.match(line)]
    return "\n".join(kept[-lines:])


# ------------------------------------------------------------------------- broker


class _PortInUseError(RuntimeError):
    pass


class LocalBroker:
    """One combined broker+controller Kafka node listening on 127.0.0.1.

    Files in ``work_dir``: server.properties, broker.log (JVM stdout/stderr, log4j),
    broker.pid, data/ (log.dirs, wiped by a fresh start).
    """

    def __init__(
        self,
        work_dir: Path,
        port: int | None = None,
        controller_port: int | None = None,
        *,
        libs_dir: Path | None = None,
        jvm_opts: Sequence[str] | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> None:
        self.work_dir = Path(work_dir).resolve()
        self._auto_port = port is None
        self._auto_controller_port = controller_port is None
        free = _free_ports(2)
        self.port: int = port if port is not None else free[0]
        self.controller_port: int = controller_port if controller_port is not None else free[1]
        if self.port == self.controller_port:
            raise ValueError("port and controller_port must differ")
        self._libs_dir = libs_dir
        if jvm_opts is not None:
            self._jvm_opts = tuple(jvm_opts)
        elif os.environ.get("K2D_KAFKA_JVM_OPTS"):
            self._jvm_opts = tuple(shlex.split(os.environ["K2D_KAFKA_JVM_OPTS"]))
        else:
            self._jvm_opts = DEFAULT_JVM_OPTS
        self._extra_properties = dict(properties or {})
        self._proc: subprocess.Popen[bytes] | None = None

    # -- paths / properties

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def data_dir(self) -> Path:
        return self.work_dir / "data"

    @property
    def log_path(self) -> Path:
        return self.work_dir / "broker.log"

    @property
    def pid_path(self) -> Path:
        return self.work_dir / "broker.pid"

    @property
    def config_path(self) -> Path:
        return self.work_dir / "server.properties"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def server_properties(self) -> str:
        p, c = self.port, self.controller_port
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{c}",
            "listeners": f"PLAINTEXT://127.0.0.1:{p},CONTROLLER://127.0.0.1:{c}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{p},CONTROLLER://127.0.0.1:{c}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.data_dir),
            "num.partitions": "1",
            "auto.create.topics.enable": "false",
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
        }
        props.update(self._extra_properties)
        return "".join(f"{k}={v}\n" for k, v in props.items())

    def _java(self, libs: Path, main: str, *args: str) -> list[str]:
        java = shutil.which("java")
        if java is None:
            raise RuntimeError("java not found on PATH (Java 17+ is needed)")
        return [
            java,
            *self._jvm_opts,
            f"-Dlog4j2.configurationFile=file:{LOG4J_CONFIG}",
            f"-Dkafka.logs.dir={self.work_dir}",
            "-cp",
            f"{libs}/*",
            main,
            *args,
        ]

    # -- lifecycle

    def start(self, timeout: float = 90, *, fresh: bool = True) -> str:
        """Start the broker and block until it answers metadata requests.

        ``fresh=True`` wipes ``data/`` and formats new storage. ``fresh=False`` reuses
        existing data when present (e.g. restarting after :meth:`kill` in a chaos test).
        Returns the bootstrap servers string.
        """
        if self.is_running():
            raise RuntimeError(f"broker already running (pid {self.pid})")
        deadline = time.monotonic() + timeout
        libs = ensure_jars(self._libs_dir)
        # A free port picked in __init__ can be taken by someone else before java binds it:
        # retry with newly picked ports (only the ones the caller left to us).
        attempts = 3 if (self._auto_port or self._auto_controller_port) else 1
        for attempt in range(1, attempts + 1):
            try:
                return self._start_once(libs, deadline, fresh=fresh)
            except _PortInUseError:
                if attempt == attempts:
                    raise
                free = _free_ports(2)
                if self._auto_port:
                    self.port = free[0]
                if self._auto_controller_port:
                    self.controller_port = free[1]
        raise AssertionError("unreachable")

    def _start_once(self, libs: Path, deadline: float, *, fresh: bool) -> str:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        formatted = (self.data_dir / "meta.properties").is_file()
        if fresh or not formatted:
            shutil.rmtree(self.data_dir, ignore_errors=True)
        self.config_path.write_text(self.server_properties())
        if fresh or not formatted:
            fmt = subprocess.run(
                self._java(
                    libs,
                    "kafka.tools.StorageTool",
                    "format",
                    "-t",
                    _cluster_id(),
                    "-c",
                    str(self.config_path),
                    "--standalone",
                ),
                cwd=self.work_dir,
                capture_output=True,
                text=True,
                check=False,
            )
            if fmt.returncode != 0:
                raise RuntimeError(f"kafka storage format failed (exit {fmt.returncode}):\n{fmt.stdout}{fmt.stderr}")
        mode = "wb" if fresh else "ab"
        with self.log_path.open(mode) as log:
            self._proc = subprocess.Popen(
                self._java(libs, "kafka.Kafka", str(self.config_path)),
                cwd=self.work_dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # own session + process group; survives the CLI
            )
        self.pid_path.write_text(f"{self._proc.pid}\n")
        _LIVE.add(self)
        while True:
            code = self._proc.poll()
            if code is not None:
                self._forget()
                tail = _tail(self.log_path)
                msg = f"Kafka broker exited with code {code} during startup; tail of {self.log_path}:\n{tail}"
                if _PORT_IN_USE.search(tail):
                    raise _PortInUseError(
                        f"port {self.port} or {self.controller_port} on 127.0.0.1 already in use. {msg}"
                    )
                raise RuntimeError(msg)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.kill()
                raise RuntimeError(
                    f"Kafka broker at {self.bootstrap_servers} not ready in time; "
                    f"tail of {self.log_path}:\n{_tail(self.log_path)}"
                )
            if _answers(self.bootstrap_servers, timeout=min(1.0, max(remaining, 0.1))):
                return self.bootstrap_servers
            time.sleep(0.1)

    def stop(self, timeout: float = 30) -> None:
        """Graceful stop: SIGTERM, wait up to ``timeout``, then SIGKILL. Idempotent."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            _signal_group(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=timeout)
        _signal_group(proc.pid, signal.SIGKILL)  # stragglers in the group, if any
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        self._forget()

    def kill(self) -> None:
        """Hard crash: SIGKILL the process group, no clean shutdown. Data is kept."""
        proc = self._proc
        if proc is None:
            return
        _signal_group(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        self._forget()

    def _forget(self) -> None:
        self._proc = None
        _LIVE.discard(self)
        with contextlib.suppress(FileNotFoundError):
            self.pid_path.unlink()

    def _detach(self) -> None:
        """Leave the broker running after this interpreter exits (CLI use)."""
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
        return f"LocalBroker({str(self.work_dir)!r}, port={self.port}, pid={self.pid})"


@atexit.register
def _stop_live_brokers() -> None:
    for broker in list(_LIVE):
        broker.stop(timeout=10)


# ------------------------------------------------------------------------- topics


def create_topic(
    bootstrap: str,
    name: str,
    partitions: int,
    timeout: float = 30,
    *,
    exist_ok: bool = False,
) -> None:
    """Create a topic (replication factor 1) and wait until every partition has a leader."""
    deadline = time.monotonic() + timeout
    admin = _admin(bootstrap)
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1)],
        operation_timeout=timeout,
        request_timeout=timeout,
    )
    try:
        futures[name].result(timeout=timeout)
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        if not (exist_ok and isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS):
            raise
    while True:
        remaining = deadline - time.monotonic()
        with contextlib.suppress(KafkaException):
            md = admin.list_topics(topic=name, timeout=max(0.5, min(remaining, 5.0)))
            topic = md.topics.get(name)
            if (
                topic is not None
                and topic.error is None
                and len(topic.partitions) >= partitions
                and all(p.leader >= 0 and p.error is None for p in topic.partitions.values())
            ):
                return
        if time.monotonic() >= deadline:
            raise TimeoutError(f"topic {name!r} has no leaders for all {partitions} partitions after {timeout}s")
        time.sleep(0.1)


# ---------------------------------------------------------------------------- CLI


def _recorded(work_dir: Path) -> tuple[int, str] | None:
    """(pid, bootstrap) of the broker recorded in work_dir, if that process is alive."""
    try:
        pid = int((work_dir / "broker.pid").read_text().strip())
        props = (work_dir / "server.properties").read_text()
    except (OSError, ValueError):
        return None
    if not _pid_alive(pid):
        return None
    try:  # guard against pid reuse: must be *our* kafka.Kafka for this work_dir
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    if b"kafka.Kafka" not in cmdline or str(work_dir / "server.properties").encode() not in cmdline:
        return None
    match = re.search(r"^listeners=PLAINTEXT://([^,\s]+)", props, re.MULTILINE)
    if match is None:
        return None
    return pid, match.group(1)


def _stop_pid(pid: int, timeout: float = 30) -> None:
    _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    _signal_group(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while _pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)


def _cmd_start(args: argparse.Namespace) -> int:
    work_dir = Path(args.dir).resolve()
    wanted = f"127.0.0.1:{args.port}"
    rec = _recorded(work_dir)
    if rec is not None:
        pid, bootstrap = rec
        if bootstrap == wanted and _answers(bootstrap, timeout=5):
            print(f"kafka already running (pid {pid}) in {work_dir}", file=sys.stderr)
            print(bootstrap)
            return 0
        print(f"replacing kafka pid {pid} in {work_dir}", file=sys.stderr)
        _stop_pid(pid)
    broker = LocalBroker(work_dir, port=args.port, controller_port=args.controller_port)
    t0 = time.monotonic()
    bootstrap = broker.start(timeout=args.timeout)
    print(
        f"kafka started (pid {broker.pid}) in {time.monotonic() - t0:.1f}s; log: {broker.log_path}",
        file=sys.stderr,
    )
    broker._detach()
    print(bootstrap)
    return 0


def _cmd_stop(args: argparse.Namespace) -> int:
    work_dir = Path(args.dir).resolve()
    rec = _recorded(work_dir)
    if rec is None:
        print(f"no kafka running in {work_dir}", file=sys.stderr)
    else:
        _stop_pid(rec[0])
        print(f"kafka pid {rec[0]} stopped", file=sys.stderr)
    with contextlib.suppress(FileNotFoundError):
        (work_dir / "broker.pid").unlink()
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    rec = _recorded(Path(args.dir).resolve())
    if rec is None or not _answers(rec[1], timeout=5):
        print("not running", file=sys.stderr)
        return 1
    print(rec[1])
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Local single-node Kafka for kafka2delta dev/tests")
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="start (or reuse) a detached broker; prints bootstrap servers")
    start.add_argument("--dir", default=str(DEFAULT_DIR), help=f"work dir (default {DEFAULT_DIR})")
    start.add_argument("--port", type=int, default=DEFAULT_PORT)
    start.add_argument("--controller-port", type=int, default=DEFAULT_CONTROLLER_PORT)
    start.add_argument("--timeout", type=float, default=90.0, help="seconds to wait for readiness")
    start.set_defaults(func=_cmd_start)
    for name, func, text in (
        ("stop", _cmd_stop, "stop the broker recorded in DIR"),
        ("status", _cmd_status, "print bootstrap servers if running (exit 1 if not)"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("--dir", default=str(DEFAULT_DIR), help=f"work dir (default {DEFAULT_DIR})")
        p.set_defaults(func=func)
    args = parser.parse_args(argv)
    try:
        result: int = args.func(args)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return result


if __name__ == "__main__":
    sys.exit(main())
