"""Local PostgreSQL (Debian's ``postgresql`` package) for change-data-capture dev and tests.

No Docker and no system cluster: :func:`dev.tools.ensure` installs the ``postgresql`` package when its
programs are missing (its service is never started), ``initdb`` makes a cluster in the work dir, and
``postgres`` runs as a plain subprocess bound to 127.0.0.1 only, its unix socket in the work dir. Settings for
logical decoding (Debezium's ``pgoutput``) are on: ``wal_level=logical``, replication slots and WAL senders.

PostgreSQL refuses to run as root. As root, the server runs as the system user ``k2d-postgres`` (created when
missing, no login shell, no home), through ``setpriv`` (which execs: the pid we record is the postmaster's); the
work dir is handed to that user, and every directory above it that the user could not traverse gets o+x
(traverse only, no listing) — pytest's ``/tmp/pytest-of-root`` is 0700, for one.

Library use (tests)::

    with LocalPostgres(tmp_path / "postgres") as pg:  # a free port, started on enter
        pg.dsn                                       # postgresql://k2d:k2d@127.0.0.1:PORT/k2d
        with pg.connect() as conn:                   # psycopg connection, autocommit
            conn.execute("CREATE TABLE t (id int PRIMARY KEY)")

CLI use (a developer's shell; the server keeps running after the command exits)::

    python -m dev.postgres.postgres start [--dir DIR] [--port N]
    python -m dev.postgres.postgres status [--dir DIR]
    python -m dev.postgres.postgres stop [--dir DIR]

Environment:
    K2D_POSTGRES_BIN     the directory of initdb and postgres (default: the newest /usr/lib/postgresql/*/bin)
    K2D_POSTGRES_USER    the system user the server runs as when started by root (default k2d-postgres)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import psycopg
from psycopg.conninfo import conninfo_to_dict

from dev import tools
from dev.local_server import (
    LocalServer,
    cli_parser,
    pid_alive,
    recorded_pid,
    run_cli,
    stop_pid,
    stop_recorded,
)

DEFAULT_DIR = Path(".k2d/postgres")
DEFAULT_PORT = 5432
DEFAULT_OS_USER = "k2d-postgres"
# The database role Debezium connects with: a superuser with the REPLICATION attribute.
DEFAULT_USER = "k2d"
DEFAULT_PASSWORD = "k2d"
DEFAULT_DBNAME = "k2d"

_INFO_FILE = "postgres.json"  # what status/stop and other processes need: port, role, password, database
_CONF_FILE = "k2d.conf"  # in the data dir, included by postgresql.conf; rewritten on each start
_INCLUDE = f"include = '{_CONF_FILE}'\n"


# ------------------------------------------------------------------------ programs


def bin_dir() -> Path:
    """The directory holding ``initdb`` and ``postgres``: $K2D_POSTGRES_BIN, else Debian's newest, installed
    through :func:`dev.tools.ensure` (apt-get) if missing."""
    explicit = os.environ.get("K2D_POSTGRES_BIN")
    if explicit:
        path = Path(explicit).expanduser()
        if not (path / "postgres").is_file():
            raise RuntimeError(f"K2D_POSTGRES_BIN={explicit} has no postgres program")
        return path
    found = tools.find("/usr/lib/postgresql/*/bin/postgres")
    if found is None:
        paths = tools.ensure(["postgresql"])
        found = paths["/usr/lib/postgresql/*/bin/postgres"]
    return Path(found).parent


class _OsUser(NamedTuple):
    name: str
    uid: int
    gid: int


def _os_user() -> _OsUser | None:
    """The unprivileged user to run PostgreSQL as when we are root (created if missing), else None (ourselves)."""
    if os.geteuid() != 0:
        return None
    name = os.environ.get("K2D_POSTGRES_USER") or DEFAULT_OS_USER
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        useradd = shutil.which("useradd") or "/usr/sbin/useradd"
        made = subprocess.run(
            [useradd, "--system", "--user-group", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            capture_output=True,
            text=True,
            check=False,
        )
        if made.returncode not in (0, 9):  # 9: made meanwhile by another process
            raise RuntimeError(f"useradd {name} failed (exit {made.returncode}): {made.stderr.strip()}") from None
        entry = pwd.getpwnam(name)
    return _OsUser(name, entry.pw_uid, entry.pw_gid)


def _as_user(user: _OsUser | None, command: Sequence[str]) -> list[str]:
    """``command`` run as ``user`` (setpriv execs it, so the pid stays the program's own)."""
    if user is None:
        return list(command)
    setpriv = shutil.which("setpriv") or "/usr/bin/setpriv"
    return [setpriv, f"--reuid={user.uid}", f"--regid={user.gid}", "--init-groups", "--", *command]


def _grant_traverse(path: Path, user: _OsUser) -> None:
    """Let ``user`` reach ``path``: o+x on each directory above it that neither owner nor group rights open."""
    for parent in reversed(path.parents):
        st = parent.stat()
        if st.st_uid == user.uid or st.st_mode & stat.S_IXOTH:
            continue
        if st.st_gid == user.gid and st.st_mode & stat.S_IXGRP:
            continue
        os.chmod(parent, stat.S_IMODE(st.st_mode) | stat.S_IXOTH)


def _initdb_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "LC_"))}
    env["LANG"] = "C.UTF-8"
    return env


# ------------------------------------------------------------------------ helpers


def make_dsn(host: str, port: int, user: str, password: str, dbname: str) -> str:
    quote = urllib.parse.quote
    return f"postgresql://{quote(user, safe='')}:{quote(password, safe='')}@{host}:{port}/{quote(dbname, safe='')}"


class Database(NamedTuple):
    """Where a database is and how to log in: what Debezium's connector config and the tests need.

    :attr:`LocalPostgres.database` gives the local server's; :meth:`from_dsn` reads any libpq DSN (e.g. one
    given to the tests through K2D_TEST_POSTGRES_DSN).
    """

    host: str
    port: int
    user: str
    password: str
    dbname: str

    @classmethod
    def from_dsn(cls, dsn: str) -> Database:
        info = conninfo_to_dict(dsn)
        return cls(
            host=str(info.get("host") or "127.0.0.1"),
            port=int(info.get("port") or 5432),
            user=str(info.get("user") or ""),
            password=str(info.get("password") or ""),
            dbname=str(info.get("dbname") or info.get("user") or ""),
        )

    @property
    def dsn(self) -> str:
        return make_dsn(self.host, self.port, self.user, self.password, self.dbname)

    def connect(self, *, autocommit: bool = True, **kwargs: Any) -> psycopg.Connection[Any]:
        """A psycopg connection (``autocommit`` on by default)."""
        return psycopg.connect(self.dsn, autocommit=autocommit, **kwargs)


def _answers(dsn: str, timeout: float) -> bool:
    """True when a ``SELECT 1`` over TCP with the role's password succeeds."""
    try:
        with psycopg.connect(dsn, connect_timeout=max(1, round(timeout)), autocommit=True) as conn:
            return conn.execute("SELECT 1").fetchone() == (1,)
    except psycopg.Error:
        return False


# ------------------------------------------------------------------------- server


class LocalPostgres(LocalServer):
    """One PostgreSQL cluster listening on 127.0.0.1 with its files in ``work_dir``.

    Files in ``work_dir``: data/ (the cluster, made by initdb; wiped by a fresh start), data/k2d.conf (this
    class's settings, included by data/postgresql.conf), postgres.log (the server's stderr), postgres.pid,
    postgres.json (port, role, password, database: for the CLI and other processes), the unix socket
    ``.s.PGSQL.<port>``. PostgreSQL needs one port; the second one :class:`LocalServer` manages is reserved and
    unused.

    ``settings`` adds or replaces server settings (``postgresql.conf`` names).
    """

    LABEL = "PostgreSQL"
    PID_FILE = "postgres.pid"
    LOG_FILE = "postgres.log"
    PORT_IN_USE = re.compile(r"could not bind|Address already in use|could not create any TCP/IP sockets")
    PROBE_TIMEOUT = 1.0

    host: ClassVar[str] = "127.0.0.1"
    spare_port: int

    def __init__(
        self,
        work_dir: Path,
        port: int | None = None,
        *,
        user: str = DEFAULT_USER,
        password: str = DEFAULT_PASSWORD,
        dbname: str = DEFAULT_DBNAME,
        settings: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(work_dir, port, None)
        if not re.fullmatch(r"[a-z_][a-z0-9_]*", user) or not re.fullmatch(r"[a-z_][a-z0-9_]*", dbname):
            raise ValueError("user and dbname must be plain lower-case SQL identifiers")
        self.user = user
        self.password = password
        self.dbname = dbname
        self._settings = dict(settings or {})

    def _ports(self) -> tuple[int, int]:
        return self.port, self.spare_port

    def _set_ports(self, port: int, second_port: int) -> None:
        self.port, self.spare_port = port, second_port

    # -- addresses / paths / settings

    @property
    def dsn(self) -> str:
        """``postgresql://USER:PASSWORD@127.0.0.1:PORT/DBNAME`` (libpq URI; psycopg takes it as is)."""
        return make_dsn(self.host, self.port, self.user, self.password, self.dbname)

    @property
    def _address(self) -> str:
        return self.dsn

    @property
    def info_path(self) -> Path:
        return self.work_dir / _INFO_FILE

    def server_settings(self) -> dict[str, str]:
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.work_dir}'",
            # Logical decoding for Debezium (pgoutput is built in).
            "wal_level": "logical",
            "max_replication_slots": "20",
            "max_wal_senders": "20",
            "max_connections": "50",
            # A test server: small, fast, not durable across an OS crash (a process crash is fine).
            "shared_buffers": "32MB",
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "logging_collector": "off",
            "log_min_messages": "warning",
            "log_line_prefix": "'%m [%p] '",
            "timezone": "'UTC'",
            "log_timezone": "'UTC'",
        }
        settings.update(self._settings)
        return settings

    @property
    def database(self) -> Database:
        return Database(self.host, self.port, self.user, self.password, self.dbname)

    def connect(self, *, autocommit: bool = True, dbname: str | None = None, **kwargs: Any) -> psycopg.Connection[Any]:
        """A psycopg connection to the database (``autocommit`` on by default), or to ``dbname``."""
        return self.database._replace(dbname=dbname or self.dbname).connect(autocommit=autocommit, **kwargs)

    # -- lifecycle

    def start(self, timeout: float = 60, *, fresh: bool = True) -> str:
        """Start the server and block until the role can log in over TCP; returns :attr:`dsn`.

        ``fresh=True`` wipes ``data/`` and runs initdb again. ``fresh=False`` reuses the cluster when present
        (e.g. to restart after :meth:`kill`). The database ``dbname`` is created when missing.
        """
        if self.is_running():
            raise RuntimeError(f"PostgreSQL already running (pid {self.pid})")
        deadline = time.monotonic() + timeout
        programs = bin_dir()
        os_user = _os_user()
        dsn = self._start_retrying(lambda: self._start_once(programs, os_user, deadline, fresh=fresh))
        self._create_database()
        return dsn

    def _prepare_work_dir(self, os_user: _OsUser | None) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        if os_user is not None:
            _grant_traverse(self.work_dir, os_user)
            os.chown(self.work_dir, os_user.uid, os_user.gid)
            self.work_dir.chmod(0o700)

    def _initdb(self, programs: Path, os_user: _OsUser | None) -> None:
        shutil.rmtree(self.data_dir, ignore_errors=True)
        pwfile = self.work_dir / ".pwfile"
        pwfile.write_text(self.password + "\n")
        pwfile.chmod(0o600)
        if os_user is not None:
            os.chown(pwfile, os_user.uid, os_user.gid)
        try:
            command = [
                str(programs / "initdb"),
                "-D",
                str(self.data_dir),
                "-U",
                self.user,
                f"--pwfile={pwfile}",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "--encoding=UTF8",
                "--locale=C.UTF-8",
                "--no-sync",
            ]
            made = subprocess.run(
                _as_user(os_user, command),
                cwd=self.work_dir,
                env=_initdb_env(),
                capture_output=True,
                text=True,
                check=False,
            )
        finally:
            pwfile.unlink(missing_ok=True)
        if made.returncode != 0:
            raise RuntimeError(f"initdb failed (exit {made.returncode}):\n{made.stdout}{made.stderr}")
        with (self.data_dir / "postgresql.conf").open("a") as conf:
            conf.write(_INCLUDE)

    def _start_once(self, programs: Path, os_user: _OsUser | None, deadline: float, *, fresh: bool) -> str:
        self._prepare_work_dir(os_user)
        if fresh or not (self.data_dir / "PG_VERSION").is_file():
            self._initdb(programs, os_user)
        (self.data_dir / "postmaster.pid").unlink(missing_ok=True)  # left by a kill(); the pid may be reused
        conf = self.data_dir / _CONF_FILE
        conf.write_text("".join(f"{k} = {v}\n" for k, v in self.server_settings().items()))
        if os_user is not None:
            os.chown(conf, os_user.uid, os_user.gid)
        info = {"port": self.port, "user": self.user, "password": self.password, "dbname": self.dbname}
        self.info_path.write_text(json.dumps(info) + "\n")
        self.info_path.chmod(0o600)
        command = _as_user(os_user, [str(programs / "postgres"), "-D", str(self.data_dir)])
        return self._run(command, deadline, fresh=fresh)

    def _create_database(self) -> None:
        with self.connect(dbname="postgres") as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (self.dbname,)).fetchone()
            if exists is None:
                conn.execute(f'CREATE DATABASE "{self.dbname}"')

    def _ready(self, timeout: float) -> bool:
        return _answers(make_dsn(self.host, self.port, self.user, self.password, "postgres"), timeout)

    def stop(self, timeout: float = 30) -> None:
        """Fast shutdown (SIGINT to the postmaster: sessions and WAL senders are ended, then a checkpoint),
        then what :meth:`LocalServer.stop` does for anything left. Idempotent."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=timeout)
        super().stop(timeout=10)


# ---------------------------------------------------------------------------- CLI


class _Recorded(NamedTuple):
    pid: int
    dsn: str
    port: int


def _recorded(work_dir: Path) -> _Recorded | None:
    """The server recorded in work_dir (pid file + postgres.json), if that process is alive."""
    data_dir = work_dir / "data"
    # Must be *our* postmaster for this work_dir, not whatever reused the pid.
    pid = recorded_pid(work_dir / LocalPostgres.PID_FILE, str(data_dir).encode())
    if pid is None:
        return None
    try:
        info = json.loads((work_dir / _INFO_FILE).read_text())
        port = int(info["port"])
        dsn = make_dsn(LocalPostgres.host, port, info["user"], info["password"], info["dbname"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return _Recorded(pid, dsn, port)


def _stop_postgres(pid: int) -> None:
    os.kill(pid, signal.SIGINT)  # fast shutdown
    deadline = time.monotonic() + 30
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    stop_pid(pid)


def _cmd_start(args: argparse.Namespace) -> int:
    work_dir = Path(args.dir).resolve()
    rec = _recorded(work_dir)
    if rec is not None:
        if rec.port == args.port and _answers(rec.dsn, 5):
            print(f"PostgreSQL already running (pid {rec.pid}) in {work_dir}", file=sys.stderr)
            print(rec.dsn)
            return 0
        print(f"replacing PostgreSQL pid {rec.pid} in {work_dir}", file=sys.stderr)
        _stop_postgres(rec.pid)
    server = LocalPostgres(work_dir, port=args.port)
    t0 = time.monotonic()
    dsn = server.start(timeout=args.timeout, fresh=args.fresh)
    elapsed = time.monotonic() - t0
    print(f"PostgreSQL started (pid {server.pid}) in {elapsed:.1f}s; log: {server.log_path}", file=sys.stderr)
    server._detach()
    print(dsn)
    return 0


def _cmd_stop(args: argparse.Namespace) -> int:
    work_dir = Path(args.dir).resolve()
    rec = _recorded(work_dir)
    if rec is not None:
        _stop_postgres(rec.pid)
    return stop_recorded(work_dir, rec.pid if rec else None, work_dir / LocalPostgres.PID_FILE, "PostgreSQL")


def _cmd_status(args: argparse.Namespace) -> int:
    rec = _recorded(Path(args.dir).resolve())
    if rec is None or not _answers(rec.dsn, 5):
        print("not running", file=sys.stderr)
        return 1
    print(rec.dsn)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser, start = cli_parser(
        "Local PostgreSQL (logical decoding on) for kafka2delta's CDC dev/tests",
        DEFAULT_DIR,
        start=(_cmd_start, "start (or reuse) a detached server; prints its DSN"),
        stop=(_cmd_stop, "stop the server recorded in DIR"),
        status=(_cmd_status, "print the DSN if running (exit 1 if not)"),
    )
    start.add_argument("--port", type=int, default=DEFAULT_PORT)
    start.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for readiness")
    start.add_argument(
        "--keep-data", dest="fresh", action="store_false", help="reuse DIR/data if it holds a cluster (default: wipe)"
    )
    return run_cli(parser, argv, errors=(RuntimeError, tools.ToolInstallError))


if __name__ == "__main__":
    sys.exit(main())
