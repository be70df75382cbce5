"""Local standalone Apache ZooKeeper for the job coordinator's dev use and tests.

No Docker and no tarball: the server's jars come from Maven Central through ``dev/zookeeper/pom.xml``
(see :func:`ensure_jars`) and ZooKeeper runs as a plain ``java`` subprocess
(``org.apache.zookeeper.server.ZooKeeperServerMain zoo.cfg``) bound to 127.0.0.1 only, its AdminServer off.

Library use (tests)::

    with LocalZooKeeper(tmp_path / "zookeeper") as zk:  # a free port, started on enter
        hosts = zk.hosts                                # "127.0.0.1:<port>" for kazoo

CLI use (a developer's shell; the server keeps running after the command exits)::

    python -m dev.zookeeper.zookeeper start [--dir DIR] [--port N]
    python -m dev.zookeeper.zookeeper status [--dir DIR]
    python -m dev.zookeeper.zookeeper stop [--dir DIR]

Environment:
    K2D_ZOOKEEPER_LIBS       where the jars are cached (default ~/.cache/kafka2delta/zookeeper-libs-<ver>)
    K2D_ZOOKEEPER_JVM_OPTS   replaces the default JVM flags
"""

from __future__ import annotations

import argparse
import re
import shutil
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from dev.local_server import (
    LocalServer,
    cache_dir,
    cli_parser,
    ensure_fetched,
    jvm_options,
    mvn_copy_dependencies,
    pom_property,
    print_status,
    recorded_pid,
    run_cli,
    start_or_reuse,
    stop_recorded_server,
)

HERE = Path(__file__).resolve().parent

POM = HERE / "pom.xml"

DEFAULT_DIR = Path(".k2d/zookeeper")
DEFAULT_PORT = 2181

DEFAULT_JVM_OPTS: tuple[str, ...] = (
    "-Xms32m",
    "-Xmx256m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:-UsePerfData",
    "-Djava.awt.headless=true",
    "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
    "-Dzookeeper.admin.enableServer=false",
)

_JARS = "zookeeper-[0-9]*.jar"  # the server itself: its presence tells a complete fetch


def zookeeper_version() -> str:
    """The ZooKeeper version pinned in pom.xml (``<zookeeper.version>``)."""
    return pom_property(POM, "zookeeper.version")


def default_libs_dir() -> Path:
    return cache_dir("K2D_ZOOKEEPER_LIBS", f"zookeeper-libs-{zookeeper_version()}")


def _fetch_jars(tmp: Path) -> Path:
    run = mvn_copy_dependencies(POM, tmp, "-DincludeScope=runtime", fetches="the ZooKeeper jars")
    if run.proc.returncode != 0 or not any(tmp.glob(_JARS)):
        raise run.error("fetching ZooKeeper jars")
    return tmp


def ensure_jars(libs_dir: Path | None = None) -> Path:
    """A directory holding the server's runtime jars, fetched once per pom.xml content (see broker.ensure_jars)."""
    libs = (libs_dir if libs_dir is not None else default_libs_dir()).expanduser().resolve()
    return ensure_fetched(libs, POM, complete=lambda done: any(done.glob(_JARS)), fetch=_fetch_jars)


def four_letter_word(hosts: str, word: str, timeout: float) -> str:
    """Send a four-letter command (``srvr``, ``ruok``) to ``host:port``; its answer, or "" if none."""
    host, _, port = hosts.partition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as sock:
            sock.sendall(word.encode())
            chunks = []
            while True:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                chunks.append(chunk)
            return b"".join(chunks).decode(errors="replace")
    except OSError:
        return ""


def _answers(hosts: str, timeout: float) -> bool:
    # "srvr" answers "not currently serving requests" until the database is loaded.
    return "Mode: standalone" in four_letter_word(hosts, "srvr", timeout)


class LocalZooKeeper(LocalServer):
    """One standalone ZooKeeper server on 127.0.0.1.

    Files in ``work_dir``: zoo.cfg, zookeeper.log (JVM stdout/stderr), zookeeper.pid, data/ (wiped by a fresh
    start). ZooKeeper needs one port; the second one :class:`LocalServer` manages is reserved and unused (the
    AdminServer, which would take it, needs Jetty and stays off).
    """

    LABEL = "ZooKeeper"
    PID_FILE = "zookeeper.pid"
    LOG_FILE = "zookeeper.log"
    PORT_IN_USE = re.compile(r"BindException|Address already in use")
    PROBE_TIMEOUT = 1.0

    spare_port: int

    def __init__(
        self,
        work_dir: Path,
        port: int | None = None,
        *,
        libs_dir: Path | None = None,
        jvm_opts: Sequence[str] | None = None,
    ) -> None:
        super().__init__(work_dir, port, None)
        self._libs_dir = libs_dir
        self._jvm_opts = jvm_options(jvm_opts, "K2D_ZOOKEEPER_JVM_OPTS", DEFAULT_JVM_OPTS)

    def _ports(self) -> tuple[int, int]:
        return self.port, self.spare_port

    def _set_ports(self, port: int, second_port: int) -> None:
        self.port, self.spare_port = port, second_port

    @property
    def hosts(self) -> str:
        """The connect string for clients (kazoo's ``hosts``)."""
        return f"127.0.0.1:{self.port}"

    @property
    def _address(self) -> str:
        return self.hosts

    @property
    def config_path(self) -> Path:
        return self.work_dir / "zoo.cfg"

    def zoo_cfg(self) -> str:
        settings = {
            "tickTime": "500",  # sessions may time out between 2 and 20 ticks: 1 s .. 10 s
            "dataDir": str(self.data_dir),
            "clientPort": str(self.port),
            "clientPortAddress": "127.0.0.1",
            "admin.enableServer": "false",
            "4lw.commands.whitelist": "srvr,ruok,stat",
            "maxClientCnxns": "0",
        }
        return "".join(f"{k}={v}\n" for k, v in settings.items())

    def start(self, timeout: float = 60, *, fresh: bool = True) -> str:
        """Start the server and block until it serves requests; returns the connect string.

        ``fresh=True`` wipes ``data/``; ``fresh=False`` keeps the znodes (a restart after :meth:`kill`).
        """
        if self.is_running():
            raise RuntimeError(f"zookeeper already running (pid {self.pid})")
        deadline = time.monotonic() + timeout
        libs = ensure_jars(self._libs_dir)
        return self._start_retrying(lambda: self._start_once(libs, deadline, fresh=fresh))

    def _start_once(self, libs: Path, deadline: float, *, fresh: bool) -> str:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        if fresh:
            shutil.rmtree(self.data_dir, ignore_errors=True)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(self.zoo_cfg())
        java = shutil.which("java")
        if java is None:
            raise RuntimeError("java not found on PATH (Java 11+ is needed)")
        command = [
            java,
            *self._jvm_opts,
            "-cp",
            f"{libs}/*",
            "org.apache.zookeeper.server.ZooKeeperServerMain",
            str(self.config_path),
        ]
        return self._run(command, deadline, fresh=fresh)

    def _ready(self, timeout: float) -> bool:
        return _answers(self.hosts, timeout=timeout)


# ---------------------------------------------------------------------------- CLI


def _recorded(work_dir: Path) -> tuple[int, str] | None:
    """(pid, hosts) of the server recorded in work_dir, if that process is alive."""
    config = work_dir / "zoo.cfg"
    pid = recorded_pid(work_dir / LocalZooKeeper.PID_FILE, b"org.apache.zookeeper.server.ZooKeeperServerMain")
    if pid is None:
        return None
    try:
        text = config.read_text()
    except OSError:
        return None
    match = re.search(r"^clientPort=(\d+)", text, re.MULTILINE)
    if match is None:
        return None
    return pid, f"127.0.0.1:{match.group(1)}"


def _cmd_start(args: argparse.Namespace) -> int:
    work_dir = Path(args.dir).resolve()
    wanted = f"127.0.0.1:{args.port}"

    def server() -> LocalZooKeeper:  # made only when the recorded one is not reused
        return LocalZooKeeper(work_dir, port=args.port)

    return start_or_reuse("zookeeper", work_dir, wanted, _recorded, _answers, server, args.timeout)


def _cmd_stop(args: argparse.Namespace) -> int:
    return stop_recorded_server("zookeeper", Path(args.dir).resolve(), _recorded, LocalZooKeeper.PID_FILE)


def _cmd_status(args: argparse.Namespace) -> int:
    return print_status(Path(args.dir).resolve(), _recorded, _answers)


def main(argv: Sequence[str] | None = None) -> int:
    parser, start = cli_parser(
        "Local standalone ZooKeeper for kafka2delta's job coordinator",
        DEFAULT_DIR,
        start=(_cmd_start, "start (or reuse) a detached server; prints the connect string"),
        stop=(_cmd_stop, "stop the server recorded in DIR"),
        status=(_cmd_status, "print the connect string if running (exit 1 if not)"),
    )
    start.add_argument("--port", type=int, default=DEFAULT_PORT)
    start.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for readiness")
    return run_cli(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
