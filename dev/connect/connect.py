"""Local Kafka Connect worker (standalone mode) with the Debezium PostgreSQL connector, for CDC dev and tests.

No Docker and no tarball: the worker's jars (``connect-runtime`` + ``connect-json``, the same Kafka version as
the broker in ``dev/kafka/pom.xml``), the Debezium PostgreSQL connector and Apicurio's Avro converter come from
Maven Central through ``dev/connect/pom.xml`` (see :func:`ensure_jars`). The worker runs as a plain ``java``
subprocess (``org.apache.kafka.connect.cli.ConnectStandalone``) whose REST API listens on 127.0.0.1 only;
source offsets live in a file in the work dir. Connectors are added through the REST API.

Library use (tests)::

    with LocalConnect(tmp_path / "connect", bootstrap_servers=broker.bootstrap_servers) as connect:
        config = debezium_postgres_config(pg, topic_prefix="cdc", tables=["public.items"], converter="json")
        connect.add_connector("items", config)  # PUT /connectors/items/config; waits for its task to run

CLI use (a developer's shell; the worker keeps running after the command exits)::

    python -m dev.connect.connect start --bootstrap-servers 127.0.0.1:9092 [--dir DIR] [--port N]
    python -m dev.connect.connect status [--dir DIR]
    python -m dev.connect.connect stop [--dir DIR]

Environment:
    K2D_CONNECT_LIBS       where the jars are cached (default ~/.cache/kafka2delta/connect-libs-<kafka>-debezium-<ver>)
    K2D_CONNECT_JVM_OPTS   replaces the default JVM flags (heap/GC/JIT)
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

from dev.kafka import broker
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
LOG4J_CONFIG = HERE / "log4j2.properties"

DEFAULT_DIR = Path(".k2d/connect")
DEFAULT_PORT = 8083  # Kafka Connect's default REST port

# Small heap: the machine is shared with the broker, the registry and Spark. Serial GC + C1 for a quick start.
DEFAULT_JVM_OPTS: tuple[str, ...] = (
    "-Xms64m",
    "-Xmx384m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:-UsePerfData",
    "-Djava.awt.headless=true",
)

POSTGRES_CONNECTOR = "io.debezium.connector.postgresql.PostgresConnector"
JSON_CONVERTER = "org.apache.kafka.connect.json.JsonConverter"
AVRO_CONVERTER = "io.apicurio.registry.utils.converter.AvroConverter"

# The worker's jars go on the class path; each plugin gets its own directory under plugins/ (plugin.path), so
# that Connect loads it in its own class loader.
_WORKER = "worker"
_PLUGINS = "plugins"
_PLUGIN_DIRS = {"debezium": "debezium-postgres", "avro": "apicurio-converter"}  # Maven profile -> plugin dir
_RUNTIME_JAR = "connect-runtime-*.jar"
_CONNECTOR_JAR = "debezium-connector-postgres-*.jar"
_CONVERTER_JAR = "apicurio-registry-utils-converter-*.jar"
_MANIFEST_JAR = "k2d-apicurio-converter-manifest.jar"
_DIR_PROP = "-Dk2d.connect.dir="  # on the java command line: lets status/stop recognise our process
# Every REST response carries this header with a per-start token (response.http.headers.config), so readiness
# checks know that the worker answering on the port is the one just launched.
_TOKEN_HEADER = "X-K2D-Connect"

Converter = Literal["json", "json-plain", "avro"]
CONVERTERS: tuple[Converter, ...] = ("json", "json-plain", "avro")


# --------------------------------------------------------------------------- jars


def kafka_version() -> str:
    """The Kafka version pinned in pom.xml (``<kafka.version>``); the same as the broker's (checked)."""
    version = pom_property(POM, "kafka.version")
    if version != broker.kafka_version():
        raise RuntimeError(f"{POM} pins Kafka {version}, {broker.POM} {broker.kafka_version()}: make them equal")
    return version


def debezium_version() -> str:
    """The Debezium version pinned in pom.xml (``<debezium.version>``)."""
    return pom_property(POM, "debezium.version")


def apicurio_converter_version() -> str:
    """The version of Apicurio's Connect converter pinned in pom.xml (``<apicurio.converter.version>``)."""
    return pom_property(POM, "apicurio.converter.version")


def default_libs_dir() -> Path:
    return cache_dir("K2D_CONNECT_LIBS", f"connect-libs-{kafka_version()}-debezium-{debezium_version()}")


def _complete(libs: Path) -> bool:
    plugins = libs / _PLUGINS
    return (
        any((libs / _WORKER).glob(_RUNTIME_JAR))
        and any((plugins / _PLUGIN_DIRS["debezium"]).glob(_CONNECTOR_JAR))
        and any((plugins / _PLUGIN_DIRS["avro"]).glob(_CONVERTER_JAR))
        and (plugins / _PLUGIN_DIRS["avro"] / _MANIFEST_JAR).is_file()
    )


def _fetch_jars(tmp: Path) -> Path:
    targets = {"worker": tmp / _WORKER, **{p: tmp / _PLUGINS / d for p, d in _PLUGIN_DIRS.items()}}
    for profile, target in targets.items():
        run = mvn_copy_dependencies(
            POM, target, "-P", profile, "-DincludeScope=runtime", fetches=f"the Kafka Connect jars ({profile})"
        )
        if run.proc.returncode != 0 or not any(target.glob("*.jar")):
            raise run.error(f"fetching Kafka Connect jars (profile {profile})")
    _add_converter_manifest(tmp / _PLUGINS / _PLUGIN_DIRS["avro"])
    if not _complete(tmp):
        raise RuntimeError(f"fetched Kafka Connect jars in {tmp} lack connect-runtime, Debezium or the converter")
    return tmp


def _add_converter_manifest(plugin_dir: Path) -> None:
    """Add the ServiceLoader manifest Apicurio's converter jar lacks, as a jar of its own beside it.

    With it the worker can run with ``plugin.discovery=service_load``, which starts about 4 s sooner than the
    reflective scan that finds the converter without it. (Kafka's ``connect-plugin-path sync-manifests`` does
    the same.)
    """
    manifest = "META-INF/services/org.apache.kafka.connect.storage.Converter"
    with zipfile.ZipFile(plugin_dir / _MANIFEST_JAR, "w") as jar:
        jar.writestr(manifest, AVRO_CONVERTER + "\n")


def ensure_jars(libs_dir: Path | None = None) -> Path:
    """Return a directory holding ``worker/`` (class path) and ``plugins/`` (plugin.path), fetching if needed.

    Maven runs (three times: one per profile of pom.xml) only when the directory lacks a marker matching the
    current pom.xml's sha256, so editing the pom (e.g. a version bump) refetches. Safe to call from several
    processes at once (file lock; fetch into a temp dir, then rename).
    """
    libs = (libs_dir if libs_dir is not None else default_libs_dir()).expanduser().resolve()
    return ensure_fetched(libs, POM, complete=_complete, fetch=_fetch_jars)


# ------------------------------------------------------------------------ REST


class ConnectError(RuntimeError):
    """The Connect REST API refused a request, or a connector or task failed."""


def _request(url: str, method: str = "GET", body: Any = None, timeout: float = 10) -> tuple[int, dict[str, str], Any]:
    """(status, headers, decoded JSON body or None) of one REST call; HTTP errors are returned, not raised."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Accept": "application/json", **({"Content-Type": "application/json"} if data is not None else {})}
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, got, raw = response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        status, got, raw = exc.code, dict(exc.headers), exc.read()
    try:
        decoded = json.loads(raw) if raw else None
    except ValueError:
        decoded = raw.decode(errors="replace")
    return status, got, decoded


def _answers(url: str, timeout: float, token: str | None = None) -> bool:
    """True when the worker at ``url`` lists its connectors (HTTP 200), from the worker holding ``token``."""
    try:
        status, headers, _ = _request(f"{url}/connectors", timeout=timeout)
    except (urllib.error.URLError, OSError, ValueError):
        return False
    return status == 200 and (token is None or headers.get(_TOKEN_HEADER) == token)


class ConnectClient:
    """The Kafka Connect REST API at ``url`` (``http://HOST:PORT``): any worker, local or not."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def __repr__(self) -> str:
        return f"ConnectClient({self.url!r})"

    def _call(self, method: str, path: str, body: Any = None, ok: Iterable[int] = (200,)) -> Any:
        status, _, decoded = _request(f"{self.url}{path}", method, body, timeout=30)
        if status not in tuple(ok):
            raise ConnectError(f"{method} {path}: HTTP {status}: {decoded}")
        return decoded

    def connectors(self) -> list[str]:
        return list(self._call("GET", "/connectors"))

    def connector_plugins(self) -> list[dict[str, str]]:
        """The connector classes the worker found (``GET /connector-plugins``)."""
        return list(self._call("GET", "/connector-plugins"))

    def status(self, name: str) -> dict[str, Any]:
        """``GET /connectors/NAME/status``: ``{"connector": {"state": …}, "tasks": [{"id", "state", "trace"?}]}``."""
        return dict(self._call("GET", f"/connectors/{urllib.parse.quote(name, safe='')}/status"))

    def add_connector(self, name: str, config: Mapping[str, str], timeout: float = 60) -> dict[str, Any]:
        """Create (or reconfigure) connector ``name`` (``PUT /connectors/NAME/config``) and wait until the
        connector and all its tasks are RUNNING; returns the status. Raises ConnectError when one FAILED (with
        its Java trace) and TimeoutError after ``timeout`` seconds."""
        quoted = urllib.parse.quote(name, safe="")
        self._call("PUT", f"/connectors/{quoted}/config", dict(config), ok=(200, 201))
        return self.wait_running(name, timeout)

    def wait_running(self, name: str, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        last: Any = None
        while True:
            status_code, _, last = _request(f"{self.url}/connectors/{urllib.parse.quote(name, safe='')}/status")
            if status_code == 200:
                states = [last["connector"]["state"], *(task["state"] for task in last["tasks"])]
                if "FAILED" in states:
                    traces = [t.get("trace", "") for t in [last["connector"], *last["tasks"]] if t.get("trace")]
                    raise ConnectError(f"connector {name} failed: {states}\n" + "\n".join(traces))
                if last["tasks"] and all(state == "RUNNING" for state in states):
                    return dict(last)
            if time.monotonic() >= deadline:
                raise TimeoutError(f"connector {name} not RUNNING after {timeout}s; last status: {last}")
            time.sleep(0.2)

    def delete_connector(self, name: str) -> None:
        """``DELETE /connectors/NAME`` (its replication slot stays in the database; drop it there if needed)."""
        self._call("DELETE", f"/connectors/{urllib.parse.quote(name, safe='')}", ok=(200, 204, 404))


# ------------------------------------------------------------------ connector config


class PostgresAddress(Protocol):
    """Where the database is (``dev.postgres.postgres.LocalPostgres`` and its ``Database`` are two)."""

    @property
    def host(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def user(self) -> str: ...
    @property
    def password(self) -> str: ...
    @property
    def dbname(self) -> str: ...


def converter_config(converter: Converter, registry_url: str | None = None) -> dict[str, str]:
    """Connector-level ``key.converter``/``value.converter`` settings for one of :data:`CONVERTERS`.

    - ``json``: Connect's JsonConverter with ``schemas.enable=true``: each key and value is
      ``{"schema": <Connect schema as JSON>, "payload": <data>}``.
    - ``json-plain``: the same converter with ``schemas.enable=false``: the payload alone.
    - ``avro``: Apicurio's AvroConverter writing Confluent's wire format (magic byte 0, 4-byte big-endian id,
      Avro binary) with schemas registered in the Apicurio registry at ``registry_url`` (its ccompat URL, as
      ``dev.registry.registry.LocalRegistry.url`` gives, or its base URL). The converter (2.6.x) talks to
      Apicurio's v2 core API, registers under TopicIdStrategy (artifact ``<topic>-key``/``<topic>-value`` in the
      default group: the ccompat subjects), and writes the content id, which is what the ccompat API calls the
      schema id.
    """
    if converter in ("json", "json-plain"):
        enabled = "true" if converter == "json" else "false"
        return {
            "key.converter": JSON_CONVERTER,
            "key.converter.schemas.enable": enabled,
            "value.converter": JSON_CONVERTER,
            "value.converter.schemas.enable": enabled,
        }
    if converter != "avro":
        raise ValueError(f"converter must be one of {CONVERTERS}, not {converter!r}")
    if not registry_url:
        raise ValueError("the avro converter needs registry_url")
    base = re.sub(r"/apis/.*$", "", registry_url.rstrip("/"))
    config: dict[str, str] = {}
    for side in ("key", "value"):
        prefix = f"{side}.converter"
        config.update(
            {
                prefix: AVRO_CONVERTER,
                f"{prefix}.apicurio.registry.url": f"{base}/apis/registry/v2",
                f"{prefix}.apicurio.registry.auto-register": "true",
                f"{prefix}.apicurio.registry.find-latest": "true",
                f"{prefix}.apicurio.registry.as-confluent": "true",
                f"{prefix}.apicurio.registry.use-id": "contentId",
                f"{prefix}.apicurio.registry.headers.enabled": "false",
            }
        )
    return config


def debezium_postgres_config(
    database: PostgresAddress,
    *,
    topic_prefix: str,
    tables: Iterable[str],
    converter: Converter = "json",
    registry_url: str | None = None,
    slot_name: str | None = None,
    publication_name: str | None = None,
    **overrides: str,
) -> dict[str, str]:
    """The config of a Debezium PostgreSQL connector capturing ``tables`` (``schema.table``) of ``database``.

    Topics are ``<topic_prefix>.<schema>.<table>``, created by the worker with one partition. The slot and the
    publication default to names made from ``topic_prefix`` (one connector per prefix); the publication holds
    just the captured tables (``publication.autocreate.mode=filtered``). Debezium's defaults that the events'
    shape depends on are spelled out: ``decimal.handling.mode=precise``, ``time.precision.mode=adaptive``,
    ``tombstones.on.delete=true``, ``snapshot.mode=initial``. ``overrides`` (dots written as given, e.g.
    ``**{"snapshot.mode": "no_data"}``) win over everything.
    """
    ident = re.sub(r"[^a-z0-9_]", "_", topic_prefix.lower())
    config = {
        "connector.class": POSTGRES_CONNECTOR,
        "tasks.max": "1",
        "database.hostname": database.host,
        "database.port": str(database.port),
        "database.user": database.user,
        "database.password": database.password,
        "database.dbname": database.dbname,
        "topic.prefix": topic_prefix,
        "table.include.list": ",".join(tables),
        "plugin.name": "pgoutput",
        "slot.name": slot_name or f"k2d_{ident}",
        "publication.name": publication_name or f"k2d_{ident}",
        "publication.autocreate.mode": "filtered",
        "snapshot.mode": "initial",
        "decimal.handling.mode": "precise",
        "time.precision.mode": "adaptive",
        "tombstones.on.delete": "true",
        # The broker does not auto-create topics: the worker creates them (topic.creation.enable is on).
        "topic.creation.default.replication.factor": "1",
        "topic.creation.default.partitions": "1",
        # Tests wait for events: poll the slot often.
        "poll.interval.ms": "100",
        **converter_config(converter, registry_url),
    }
    config.update(overrides)
    return config


# ------------------------------------------------------------------------- worker


class LocalConnect(LocalServer):
    """One standalone Kafka Connect worker whose REST API listens on 127.0.0.1, producing to ``bootstrap_servers``.

    Files in ``work_dir``: worker.properties, connect.log (JVM stdout/stderr, log4j), connect.pid,
    data/connect.offsets (the source offsets; wiped by a fresh start). The worker needs one port (REST); the
    second one :class:`LocalServer` manages is reserved and unused.
    """

    LABEL = "Kafka Connect"
    PID_FILE = "connect.pid"
    LOG_FILE = "connect.log"
    PORT_IN_USE = re.compile(r"BindException|Address already in use|Failed to bind")
    PROBE_TIMEOUT = 2.0

    spare_port: int

    def __init__(
        self,
        work_dir: Path,
        port: int | None = None,
        *,
        bootstrap_servers: str,
        libs_dir: Path | None = None,
        jvm_opts: Sequence[str] | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(work_dir, port, None)
        self.bootstrap_servers = bootstrap_servers
        self._libs_dir = libs_dir
        self._jvm_opts = jvm_options(jvm_opts, "K2D_CONNECT_JVM_OPTS", DEFAULT_JVM_OPTS)
        self._extra_properties = dict(properties or {})
        self._token = uuid.uuid4().hex

    def _ports(self) -> tuple[int, int]:
        return self.port, self.spare_port

    def _set_ports(self, port: int, second_port: int) -> None:
        self.port, self.spare_port = port, second_port

    # -- urls / paths / properties

    @property
    def url(self) -> str:
        """The REST API: ``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def _address(self) -> str:
        return self.url

    @property
    def config_path(self) -> Path:
        return self.work_dir / "worker.properties"

    @property
    def offsets_path(self) -> Path:
        return self.data_dir / "connect.offsets"

    def worker_properties(self, libs: Path) -> str:
        props = {
            "bootstrap.servers": self.bootstrap_servers,
            # Connector configs name their own converters; these are the worker's defaults.
            "key.converter": JSON_CONVERTER,
            "value.converter": JSON_CONVERTER,
            "offset.storage.file.filename": str(self.offsets_path),
            "offset.flush.interval.ms": "1000",
            "listeners": f"http://127.0.0.1:{self.port}",
            "rest.advertised.host.name": "127.0.0.1",
            "rest.advertised.port": str(self.port),
            "response.http.headers.config": f"set {_TOKEN_HEADER}: {self._token}",
            "plugin.path": str(libs / _PLUGINS),
            # No reflective scan of the plugins: ServiceLoader manifests only (see _add_converter_manifest).
            "plugin.discovery": "service_load",
            "task.shutdown.graceful.timeout.ms": "5000",
        }
        props.update(self._extra_properties)
        return "".join(f"{k}={v}\n" for k, v in props.items())

    def _command(self, libs: Path) -> list[str]:
        java = shutil.which("java")
        if java is None:
            raise RuntimeError("java not found on PATH (Java 17+ is needed)")
        return [
            java,
            *self._jvm_opts,
            f"-Dlog4j2.configurationFile=file:{LOG4J_CONFIG}",
            f"-Djava.io.tmpdir={self.work_dir / 'tmp'}",
            f"{_DIR_PROP}{self.work_dir}",
            "-cp",
            f"{libs / _WORKER}/*",
            "org.apache.kafka.connect.cli.ConnectStandalone",
            str(self.config_path),
        ]

    # -- lifecycle

    def start(self, timeout: float = 120, *, fresh: bool = True) -> str:
        """Start the worker and block until its REST API lists connectors; returns :attr:`url`.

        ``fresh=True`` wipes ``data/`` (the source offsets: a connector added again snapshots again, given a new
        slot). ``fresh=False`` keeps them. Connectors are not remembered across restarts (standalone mode keeps
        only offsets): add them again.
        """
        if self.is_running():
            raise RuntimeError(f"Kafka Connect already running (pid {self.pid})")
        deadline = time.monotonic() + timeout
        libs = ensure_jars(self._libs_dir)
        return self._start_retrying(lambda: self._start_once(libs, deadline, fresh=fresh))

    def _start_once(self, libs: Path, deadline: float, *, fresh: bool) -> str:
        self._token = uuid.uuid4().hex
        self.work_dir.mkdir(parents=True, exist_ok=True)
        if fresh:
            shutil.rmtree(self.data_dir, ignore_errors=True)
        shutil.rmtree(self.work_dir / "tmp", ignore_errors=True)
        for sub in (self.data_dir, self.work_dir / "tmp"):
            sub.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(self.worker_properties(libs))
        return self._run(self._command(libs), deadline, fresh=fresh)

    def _ready(self, timeout: float) -> bool:
        return _answers(self.url, timeout, self._token)

    # -- connectors (the REST API; see ConnectClient)

    @property
    def client(self) -> ConnectClient:
        return ConnectClient(self.url)

    def add_connector(self, name: str, config: Mapping[str, str], timeout: float = 60) -> dict[str, Any]:
        """See :meth:`ConnectClient.add_connector`."""
        return self.client.add_connector(name, config, timeout)

    def delete_connector(self, name: str) -> None:
        self.client.delete_connector(name)

    def status(self, name: str) -> dict[str, Any]:
        return self.client.status(name)


# ---------------------------------------------------------------------------- CLI


def _recorded(work_dir: Path) -> tuple[int, str] | None:
    """(pid, REST url) of the worker recorded in work_dir, if that process is alive."""
    pid = recorded_pid(work_dir / LocalConnect.PID_FILE, f"{_DIR_PROP}{work_dir}".encode())
    if pid is None:
        return None
    try:
        props = (work_dir / "worker.properties").read_text()
    except OSError:
        return None
    match = re.search(r"^listeners=(http://\S+)", props, re.MULTILINE)
    if match is None:
        return None
    return pid, match.group(1)


def _cmd_start(args: argparse.Namespace) -> int:
    work_dir = Path(args.dir).resolve()
    wanted = f"http://127.0.0.1:{args.port}"

    def server() -> LocalConnect:  # made only when the recorded one is not reused
        return LocalConnect(work_dir, port=args.port, bootstrap_servers=args.bootstrap_servers)

    return start_or_reuse("Kafka Connect", work_dir, wanted, _recorded, _answers, server, args.timeout)


def _cmd_stop(args: argparse.Namespace) -> int:
    return stop_recorded_server("Kafka Connect", Path(args.dir).resolve(), _recorded, LocalConnect.PID_FILE)


def _cmd_status(args: argparse.Namespace) -> int:
    return print_status(Path(args.dir).resolve(), _recorded, _answers)


def main(argv: Sequence[str] | None = None) -> int:
    parser, start = cli_parser(
        "Local Kafka Connect (standalone) with the Debezium PostgreSQL connector for kafka2delta dev/tests",
        DEFAULT_DIR,
        start=(_cmd_start, "start (or reuse) a detached worker; prints its REST url"),
        stop=(_cmd_stop, "stop the worker recorded in DIR"),
        status=(_cmd_status, "print the REST url if running (exit 1 if not)"),
    )
    start.add_argument("--bootstrap-servers", required=True, help="the Kafka broker, e.g. 127.0.0.1:9092")
    start.add_argument("--port", type=int, default=DEFAULT_PORT, help="REST port")
    start.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for readiness")
    return run_cli(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
