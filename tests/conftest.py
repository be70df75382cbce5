"""Shared fixtures. Integration tests get a real Kafka broker (KRaft, from Maven Central jars)
started once per session (once per worker under `make test`'s pytest-xdist) on free loopback
ports, unless K2D_TEST_BOOTSTRAP_SERVERS names one, and, when a test asks for it, a real schema
registry (Apicurio Registry, Confluent-compatible API) the same way, unless
K2D_TEST_SCHEMA_REGISTRY_URL names one; for change data capture, PostgreSQL (logical decoding on)
unless K2D_TEST_POSTGRES_DSN names one, and a Kafka Connect worker with the Debezium PostgreSQL
connector on that broker unless K2D_TEST_CONNECT_URL names one; and the factories of the
real-broker tests (integration, Spark, chaos): topics, set-ups (topic + table + config file) and
daemon subprocesses."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

from dev import tools as debian_tools
from dev.connect import connect as connect_worker
from dev.connect.connect import ConnectClient, LocalConnect
from dev.k8s_tools import ensure_crds, ensure_helm
from dev.kafka.broker import LocalBroker, create_topic
from dev.object_stores.tools import ensure_azurite, ensure_fake_gcs
from dev.postgres.postgres import Database, LocalPostgres
from dev.registry import registry as apicurio
from dev.registry.registry import LocalRegistry
from dev.zookeeper import zookeeper
from tests.support.harness import METADATA_COLUMNS, SCHEMA, Daemon, Setup, Topic, toml_section


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    external = os.environ.get("K2D_TEST_BOOTSTRAP_SERVERS")
    if external:
        yield external
        return
    broker = LocalBroker(tmp_path_factory.mktemp("kafka"))
    try:
        yield broker.start()
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def schema_registry_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The Confluent-compatible base URL of a real registry (``…/apis/ccompat/v7`` for Apicurio)."""
    external = os.environ.get("K2D_TEST_SCHEMA_REGISTRY_URL")
    if external:
        yield external
        return
    registry = LocalRegistry(tmp_path_factory.mktemp("registry"))
    try:
        yield registry.start()
    finally:
        registry.stop()


@pytest.fixture(scope="session")
def postgres() -> Iterator[Database]:
    """A PostgreSQL database with ``wal_level=logical`` and a superuser role Debezium can log in with."""
    external = os.environ.get("K2D_TEST_POSTGRES_DSN")
    if external:
        yield Database.from_dsn(external)
        return
    # Not under pytest's base temp: any other pytest run on the machine resets /tmp/pytest-of-<user> to 0700,
    # and PostgreSQL, running as its own OS user, would lose its data directory mid-test (PANIC).
    work = Path(tempfile.mkdtemp(prefix="k2d-postgres-"))
    server = LocalPostgres(work)
    try:
        server.start()
        yield server.database
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="session")
def kafka_connect(tmp_path_factory: pytest.TempPathFactory, kafka_bootstrap: str) -> Iterator[ConnectClient]:
    """The REST API of a Kafka Connect worker (standalone) with the Debezium PostgreSQL connector, producing
    to ``kafka_bootstrap``."""
    external = os.environ.get("K2D_TEST_CONNECT_URL")
    if external:
        yield ConnectClient(external)
        return
    worker = LocalConnect(tmp_path_factory.mktemp("connect"), bootstrap_servers=kafka_bootstrap)
    try:
        worker.start()
        yield worker.client
    finally:
        worker.stop()


@pytest.fixture
def topic_factory(kafka_bootstrap: str) -> Callable[[int], Topic]:
    def create(partitions: int) -> Topic:
        name = f"t-{uuid.uuid4().hex[:10]}"
        create_topic(kafka_bootstrap, name, partitions)
        return Topic(name, partitions, kafka_bootstrap)

    return create


@pytest.fixture
def setup_factory(tmp_path: Path, topic_factory: Callable[[int], Topic]) -> Callable[..., Setup]:
    def make(
        partitions: int,
        schema: dict[str, str] | None = None,
        sections: dict[str, dict[str, Any]] | None = None,
        table: dict[str, Any] | None = None,
        metadata_columns: list[str] | None = METADATA_COLUMNS,
        table_uri: str | None = None,
        storage_options: dict[str, str] | None = None,
        **ingest: Any,
    ) -> Setup:
        """A topic, a table location and a config file. ``sections`` adds TOML tables (format, transforms …),
        ``table`` adds keys to [table] (partition_by, schema_evolution …). Rows record ``metadata_columns``
        (None: none; ``table={"metadata_columns": …}`` wins). ``table_uri`` and ``storage_options`` put the
        table elsewhere (an s3:// bucket)."""
        topic = topic_factory(partitions)
        table_uri = table_uri or str(tmp_path / "table")
        table = {**({"metadata_columns": metadata_columns} if metadata_columns else {}), **(table or {})}
        # Row groups of 500 rows: every crash, rebalance and store of the suites meets lanes whose rows were
        # encoded while buffered (the daemon's default, 65,536, is reached only by catch-ups of the bench).
        ingest_settings = {"allowed_latency_s": 1.0, "progress_interval_s": 2.0, "row_group_rows": 500, **ingest}
        lines = [
            "[kafka]",
            f'bootstrap_servers = "{topic.bootstrap}"',
            f'topic = "{topic.name}"',
            f'group_id = "g-{topic.name}"',
            "[kafka.settings]",
            '"session.timeout.ms" = "10000"',
            '"heartbeat.interval.ms" = "1000"',
            *toml_section("table", {"uri": table_uri, **table}),
            *toml_section("table.schema", schema if schema is not None else SCHEMA),
            *(toml_section("table.storage_options", storage_options) if storage_options else []),
            *toml_section("ingest", ingest_settings),
        ]
        for name, values in (sections or {}).items():
            lines += toml_section(name, values)
        config_path = tmp_path / "config.toml"
        config_path.write_text("\n".join(lines) + "\n")
        return Setup(topic, table_uri, config_path, tmp_path, topic.name, dict(storage_options or {}))

    return make


@pytest.fixture
def daemon_factory(tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    started: list[Daemon] = []
    counter = iter(range(1000))

    def start(setup: Setup, *extra: str, env: dict[str, str] | None = None) -> Daemon:
        args = [sys.executable, "-m", "kafka2delta", "ingest", "-c", str(setup.config_path), *extra]
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("K2D_")}
        full_env.update(env or {})
        daemon = Daemon(args, full_env, tmp_path / f"daemon-{next(counter)}.log")
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        if daemon.process.poll() is None:
            daemon.process.kill()
            daemon.process.wait()


# Under `make test` (pytest-xdist, `-n 2`) each worker is a pytest session with its own broker, so the tests are
# handed out in units that share what is slow to start: every Spark test to the worker that started Spark, every
# test on PostgreSQL + Kafka Connect to the worker that started those, the rest a module at a time (module fixtures
# start once). The two big units go first, one to each worker; then the modules whose tools a new machine builds
# (Helm, the object-store emulators: see pytest_collection_finish) after the others, so the builds overlap them; the
# unit tests, many and short, come last and even out the finish. (xdist's own `--dist loadgroup` marks do not group
# under pytest 9.2.)
SPARK_UNIT, CDC_UNIT = "spark", "postgres-and-connect"
CDC_MODULES = frozenset(
    {"tests/chaos/test_apply_changes.py", "tests/chaos/test_replication.py", "tests/integration/test_cdc_pipeline.py"}
)
CDC_FIXTURES = frozenset({"postgres", "kafka_connect"})
HELM_MODULE = "tests/integration/test_helm.py"
DEBIAN_TOOL_MODULES = frozenset(
    {HELM_MODULE, "tests/integration/test_observability.py", "tests/integration/test_prometheus.py"}
)


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def needs_object_stores(nodeid: str) -> bool:
    return "object_store" in module_of(nodeid)


def work_unit(nodeid: str) -> str:
    module = module_of(nodeid)
    if module.startswith("tests/spark/"):
        return SPARK_UNIT
    return CDC_UNIT if module in CDC_MODULES else module


class SharedStartScheduling(LoadScopeScheduling):  # type: ignore[misc]  # xdist ships no types
    """xdist's scope scheduling, with :func:`work_unit` as the scope, in collection order."""

    def _split_scope(self, nodeid: str) -> str:
        return work_unit(nodeid)


class SharedStartPlugin:
    """Registered only when xdist is loaded: pytest refuses an xdist hook it does not know (`-p no:xdist`)."""

    @staticmethod
    def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> SharedStartScheduling | None:
        if config.getvalue("dist") != "load":  # `-n N` alone; an explicit --dist keeps xdist's own
            return None
        config.option.loadscopereorder = False  # collection order: the big units first
        return SharedStartScheduling(config, log)


def pytest_configure(config: pytest.Config) -> None:
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(SharedStartPlugin(), "kafka2delta-shared-start")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):  # not an xdist worker
        return
    for item in items:
        module = module_of(item.nodeid)
        if CDC_FIXTURES & set(getattr(item, "fixturenames", ())) and module not in CDC_MODULES:
            raise pytest.UsageError(f"{module} starts PostgreSQL/Kafka Connect: add it to CDC_MODULES in {__file__}")
    first = {SPARK_UNIT: 0, CDC_UNIT: 1}

    def turn(item: pytest.Item) -> int:
        if item.nodeid.startswith("tests/unit/"):
            return 4
        if module_of(item.nodeid) == HELM_MODULE or needs_object_stores(item.nodeid):
            return 3
        return first.get(work_unit(item.nodeid), 2)

    items.sort(key=turn)


def pytest_collection_finish(session: pytest.Session) -> None:
    """On a new machine the servers and tools of the later tests are fetched or built first: Maven jars, Debian's
    Chromium and Prometheus, the object-store emulators, Helm (each `go install` takes minutes; the broker's jars
    and Spark's packages are fetched by the first tests anyway). Start that in the background as soon as the
    tests are known, one after the other in the order the tests need them, so the downloads and builds overlap
    the tests that run meanwhile (the Go-built tools' tests are handed out last).
    The fixtures fetch through the same file locks, so they wait for a fetch under way (and report its error, if
    any, as a failure). On a machine that has them all, each step returns at once."""
    fixtures = {name for item in session.items for name in getattr(item, "fixturenames", ())}
    modules = {module_of(item.nodeid) for item in session.items}
    steps: list[Callable[[], object]] = []
    if CDC_FIXTURES & fixtures:
        steps.append(connect_worker.ensure_jars)
    if "schema_registry_url" in fixtures:
        steps.append(apicurio.ensure_app)
    if "zookeeper_hosts" in fixtures:
        steps.append(zookeeper.ensure_jars)
    if DEBIAN_TOOL_MODULES & modules:
        steps.append(lambda: debian_tools.ensure(["chromium", "prometheus"]))
    if any(needs_object_stores(module) for module in modules):
        steps += [ensure_azurite, ensure_fake_gcs]
    if HELM_MODULE in modules:
        steps += [ensure_helm, ensure_crds]
    if steps:
        threading.Thread(target=_fetch_in_turn, args=(steps,), name="test-tools", daemon=True).start()


def _fetch_in_turn(steps: list[Callable[[], object]]) -> None:
    for step in steps:
        # A failed step is not lost: the fixture that needs it runs it again and fails with its error, on its test.
        with contextlib.suppress(RuntimeError, OSError):
            step()
