"""Local single-node Apache Kafka (KRaft, combined broker+controller) for dev and tests.

No Docker and no Kafka tarball: the broker's jars come from Maven Central through
``dev/kafka/pom.xml`` (see :func:`ensure_jars`) and the broker runs as a plain
``java`` subprocess bound to 127.0.0.1 only.

Library use (tests)::

    with LocalBroker(tmp_path / "kafka") as broker:  # free ports, started on enter
        create_topic(broker.bootstrap_servers, "events", partitions=4)
        ...

    with SecuredBroker(tmp_path / "kafka") as broker:  # + SASL_PLAINTEXT, SASL_SSL, SSL (mTLS) listeners
        broker.add_scram_user("ingest", "secret")   # SCRAM-SHA-512, through the PLAINTEXT listener
        broker.bootstrap("SASL_SSL"), broker.certificates.ca   # see SecuredBroker

CLI use (a developer's shell; the broker keeps running after the command exits)::

    python -m dev.kafka.broker start [--dir DIR] [--port N] [--controller-port N]
    python -m dev.kafka.broker status [--dir DIR]
    python -m dev.kafka.broker stop [--dir DIR]

Environment:
    K2D_KAFKA_LIBS       where the jars are cached (default ~/.cache/kafka2delta/kafka-libs-<ver>)
    K2D_KAFKA_JVM_OPTS   replaces the default JVM flags (heap/GC/JIT), e.g. for benchmarks
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._scram import ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion
from confluent_kafka.cimpl import NewTopic  # what confluent_kafka.admin re-exports (not in its __all__)

from dev.kafka.certificates import Certificates, make_certificates
from dev.local_server import (
    LocalServer,
    cache_dir,
    cli_parser,
    ensure_fetched,
    free_ports,
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

_JARS = "kafka_2.13-*.jar"  # the broker itself: its presence tells a complete fetch


# --------------------------------------------------------------------------- jars


def kafka_version() -> str:
    """The Kafka version pinned in pom.xml (``<kafka.version>``)."""
    return pom_property(POM, "kafka.version")


def default_libs_dir() -> Path:
    return cache_dir("K2D_KAFKA_LIBS", f"kafka-libs-{kafka_version()}")


def _fetch_jars(tmp: Path) -> Path:
    run = mvn_copy_dependencies(POM, tmp, "-DincludeScope=runtime", fetches="the Kafka jars")
    if run.proc.returncode != 0 or not any(tmp.glob(_JARS)):
        raise run.error("fetching Kafka jars")
    return tmp


def ensure_jars(libs_dir: Path | None = None) -> Path:
    """Return a directory holding the broker's runtime jars, fetching them if needed.

    Maven runs only when the directory lacks a marker matching the current pom.xml's
    sha256, so editing the pom (e.g. a version bump) refetches. Safe to call from
    several processes at once (file lock; fetch into a temp dir, then rename).
    """
    libs = (libs_dir if libs_dir is not None else default_libs_dir()).expanduser().resolve()
    return ensure_fetched(libs, POM, complete=lambda done: any(done.glob(_JARS)), fetch=_fetch_jars)


# ------------------------------------------------------------------------ helpers


def _cluster_id() -> str:
    """Same format as ``kafka-storage.sh random-uuid`` (url-safe base64, no padding)."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def _admin(bootstrap: str, settings: Mapping[str, str] | None = None) -> AdminClient:
    return AdminClient(
        {
            "bootstrap.servers": bootstrap,
            "log_level": 0,  # silence librdkafka's "Connection refused" spam while polling
            "reconnect.backoff.ms": 50,
            "reconnect.backoff.max.ms": 250,
            "socket.connection.setup.timeout.ms": 2000,
            **(settings or {}),
        }
    )


def _answers(bootstrap: str, timeout: float, settings: Mapping[str, str] | None = None) -> bool:
    try:
        md = _admin(bootstrap, settings).list_topics(timeout=timeout)
    except KafkaException:
        return False
    return bool(md.brokers)


# ------------------------------------------------------------------------- broker


class LocalBroker(LocalServer):
    """One combined broker+controller Kafka node listening on 127.0.0.1.

    Files in ``work_dir``: server.properties, broker.log (JVM stdout/stderr, log4j),
    broker.pid, data/ (log.dirs, wiped by a fresh start).
    """

    LABEL = "Kafka broker"
    PID_FILE = "broker.pid"
    LOG_FILE = "broker.log"
    PORT_IN_USE = re.compile(r"BindException|Address already in use")
    PROBE_TIMEOUT = 1.0

    controller_port: int

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
        super().__init__(work_dir, port, controller_port)
        if self.port == self.controller_port:
            raise ValueError("port and controller_port must differ")
        self._libs_dir = libs_dir
        self._jvm_opts = jvm_options(jvm_opts, "K2D_KAFKA_JVM_OPTS", DEFAULT_JVM_OPTS)
        self._extra_properties = dict(properties or {})

    def _ports(self) -> tuple[int, int]:
        return self.port, self.controller_port

    def _set_ports(self, port: int, second_port: int) -> None:
        self.port, self.controller_port = port, second_port

    # -- paths / properties

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def _address(self) -> str:
        return self.bootstrap_servers

    @property
    def config_path(self) -> Path:
        return self.work_dir / "server.properties"

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
        return self._start_retrying(lambda: self._start_once(libs, deadline, fresh=fresh))

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
        return self._run(self._java(libs, "kafka.Kafka", str(self.config_path)), deadline, fresh=fresh)

    def _ready(self, timeout: float) -> bool:
        return _answers(self.bootstrap_servers, timeout=timeout)


class SecuredBroker(LocalBroker):
    """A :class:`LocalBroker` with three more listeners on free 127.0.0.1 ports, for the security tests:

    - ``SASL_PLAINTEXT`` and ``SASL_SSL``: SCRAM-SHA-512; users are added after start with
      :meth:`add_scram_user` (Admin API, through the PLAINTEXT listener);
    - ``SSL``: TLS with client certificates required (mTLS), signed by ``certificates.ca``.

    PLAINTEXT stays the inter-broker listener (and the one the readiness probe and :meth:`add_scram_user` use),
    so no SCRAM user has to exist before start. The certificates (:mod:`dev.kafka.certificates`) are made in
    ``work_dir/certs`` unless ``certificates`` is given; the broker's certificate is for 127.0.0.1 and localhost.
    """

    LISTENERS = ("SASL_PLAINTEXT", "SASL_SSL", "SSL")
    MECHANISM = "SCRAM-SHA-512"

    def __init__(
        self,
        work_dir: Path,
        port: int | None = None,
        controller_port: int | None = None,
        *,
        certificates: Certificates | None = None,
        libs_dir: Path | None = None,
        jvm_opts: Sequence[str] | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> None:
        self.secured_ports: dict[str, int] = {}  # set by _set_ports, called by LocalServer.__init__
        super().__init__(work_dir, port, controller_port, libs_dir=libs_dir, jvm_opts=jvm_opts, properties=properties)
        self._certificates = certificates

    def _set_ports(self, port: int, second_port: int) -> None:
        super()._set_ports(port, second_port)
        # Picked again with the others when one of them turns out to be taken (a retried start).
        taken = {port, second_port}
        spare = [p for p in free_ports(len(self.LISTENERS) + 2) if p not in taken]
        self.secured_ports = dict(zip(self.LISTENERS, spare, strict=False))

    @property
    def certificates(self) -> Certificates:
        if self._certificates is None:
            self._certificates = make_certificates(self.work_dir / "certs")
        return self._certificates

    def bootstrap(self, listener: str) -> str:
        """The bootstrap servers of one listener: ``PLAINTEXT`` or one of :attr:`LISTENERS`."""
        if listener == "PLAINTEXT":
            return self.bootstrap_servers
        return f"127.0.0.1:{self.secured_ports[listener]}"

    def server_properties(self) -> str:
        certs = self.certificates
        listeners = ",".join(f"{name}://127.0.0.1:{port}" for name, port in self.secured_ports.items())
        jaas = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        secured = {
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port},"
            + listeners,
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port},"
            + listeners,
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,"
            + ",".join(f"{name}:{name}" for name in self.LISTENERS),
            "sasl.enabled.mechanisms": self.MECHANISM,
            "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config": jaas,
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": jaas,
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(certs.broker_keystore),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(certs.ca),
            "listener.name.ssl.ssl.client.auth": "required",
        }
        base = super().server_properties()
        kept = [line for line in base.splitlines(keepends=True) if line.split("=", 1)[0] not in secured]
        return "".join(kept) + "".join(f"{k}={v}\n" for k, v in secured.items())

    def add_scram_user(self, user: str, password: str, timeout: float = 30) -> None:
        """Create (or update) a SCRAM-SHA-512 user, then wait until the SASL_PLAINTEXT listener accepts it."""
        admin = _admin(self.bootstrap_servers)
        credential = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096)
        futures = admin.alter_user_scram_credentials(
            [UserScramCredentialUpsertion(user, credential, password.encode())], request_timeout=timeout
        )
        for future in futures.values():
            future.result(timeout=timeout)
        # The credential reaches the broker's SCRAM cache through the metadata log: wait for it.
        settings = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": self.MECHANISM}
        settings.update({"sasl.username": user, "sasl.password": password})
        deadline = time.monotonic() + timeout
        while not _answers(self.bootstrap("SASL_PLAINTEXT"), 2.0, settings):
            if time.monotonic() >= deadline:
                raise TimeoutError(f"SCRAM user {user!r} not accepted by {self.bootstrap('SASL_PLAINTEXT')}")
            time.sleep(0.2)


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
    config = work_dir / "server.properties"
    # Must be *our* kafka.Kafka for this work_dir, not whatever reused the pid.
    pid = recorded_pid(work_dir / LocalBroker.PID_FILE, b"kafka.Kafka", str(config).encode())
    if pid is None:
        return None
    try:
        props = config.read_text()
    except OSError:
        return None
    match = re.search(r"^listeners=PLAINTEXT://([^,\s]+)", props, re.MULTILINE)
    if match is None:
        return None
    return pid, match.group(1)


def _cmd_start(args: argparse.Namespace) -> int:
    work_dir = Path(args.dir).resolve()
    wanted = f"127.0.0.1:{args.port}"

    def server() -> LocalBroker:  # made only when the recorded one is not reused
        return LocalBroker(work_dir, port=args.port, controller_port=args.controller_port)

    return start_or_reuse("kafka", work_dir, wanted, _recorded, _answers, server, args.timeout)


def _cmd_stop(args: argparse.Namespace) -> int:
    return stop_recorded_server("kafka", Path(args.dir).resolve(), _recorded, LocalBroker.PID_FILE)


def _cmd_status(args: argparse.Namespace) -> int:
    return print_status(Path(args.dir).resolve(), _recorded, _answers)


def main(argv: Sequence[str] | None = None) -> int:
    parser, start = cli_parser(
        "Local single-node Kafka for kafka2delta dev/tests",
        DEFAULT_DIR,
        start=(_cmd_start, "start (or reuse) a detached broker; prints bootstrap servers"),
        stop=(_cmd_stop, "stop the broker recorded in DIR"),
        status=(_cmd_status, "print bootstrap servers if running (exit 1 if not)"),
    )
    start.add_argument("--port", type=int, default=DEFAULT_PORT)
    start.add_argument("--controller-port", type=int, default=DEFAULT_CONTROLLER_PORT)
    start.add_argument("--timeout", type=float, default=90.0, help="seconds to wait for readiness")
    return run_cli(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
