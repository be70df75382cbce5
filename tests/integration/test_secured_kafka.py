"""Secured Kafka: the daemon ingests through SASL_PLAINTEXT and SASL_SSL (SCRAM-SHA-512) and SSL with client
certificates (mTLS) on a real broker (:class:`dev.kafka.broker.SecuredBroker`), with nothing but librdkafka
settings in ``[kafka.settings]``; a wrong password, a broker certificate it does not trust, and a client
certificate the broker does not trust each stop it with exit 1 and one line naming the key, nothing committed.

The topics are made and filled through the broker's PLAINTEXT listener; only the daemon uses the secured ones.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from dev.kafka.broker import SecuredBroker, create_topic
from tests.support.harness import SCHEMA, Daemon, Topic, toml_section
from tests.support.secured_kafka import PASSWORD, USER, listener_settings, secured_broker

pytestmark = pytest.mark.integration

PER_PARTITION = 40


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredBroker]:
    with secured_broker(tmp_path_factory.mktemp("secured-kafka")) as started:
        yield started


Run = Callable[..., tuple[Daemon, Topic, Path]]


@pytest.fixture
def run_daemon(broker: SecuredBroker, tmp_path: Path) -> Iterator[Run]:
    started: list[Daemon] = []

    def run(listener: str, subscription: str = "topic", **changes: str) -> tuple[Daemon, Topic, Path]:
        """A 2-partition topic with PER_PARTITION events each, and a daemon reading it through ``listener``
        with ``--until-caught-up``; returns the daemon (already exited), the topic and the table path."""
        name = f"t-{uuid.uuid4().hex[:10]}"
        create_topic(broker.bootstrap_servers, name, 2)
        topic = Topic(name, 2, broker.bootstrap_servers)
        topic.produce(PER_PARTITION)
        table = tmp_path / f"table-{name}"
        kafka: dict[str, Any] = {
            "bootstrap_servers": broker.bootstrap(listener),
            "group_id": f"g-{name}",
            **({"topic": name} if subscription == "topic" else {"topic_pattern": f"^{name}$"}),
        }
        lines = [
            *toml_section("kafka", kafka),
            *toml_section("kafka.settings", listener_settings(broker, listener, **changes)),
            *toml_section("table", {"uri": str(table), "metadata_columns": ["partition", "offset"]}),
            *toml_section("table.schema", SCHEMA),
            *toml_section("ingest", {"allowed_latency_s": 1.0}),
        ]
        config = tmp_path / f"{name}.toml"
        config.write_text("\n".join(lines) + "\n")
        args = [sys.executable, "-m", "kafka2delta", "ingest", "-c", str(config), "--until-caught-up"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("K2D_")}
        daemon = Daemon(args, env, tmp_path / f"{name}.log")
        started.append(daemon)
        daemon.wait(timeout=90)
        return daemon, topic, table

    yield run
    for daemon in started:
        if daemon.process.poll() is None:
            daemon.kill()


@pytest.mark.parametrize("listener", ["SASL_PLAINTEXT", "SASL_SSL", "SSL"])
def test_ingests_through_a_secured_listener(run_daemon: Run, listener: str) -> None:
    daemon, topic, table = run_daemon(listener)

    assert daemon.process.returncode == 0, daemon.log()[-3000:]
    delta = DeltaTable(str(table))
    ids = delta.to_pyarrow_table(columns=["id"]).column("id").to_pylist()
    assert sorted(ids) == sorted(f"p{p}-{seq}" for seq in range(PER_PARTITION) for p in range(2))
    assert {p: delta.transaction_version(f"{topic.name}-{p}") for p in range(2)} == {0: 39, 1: 39}
    assert PASSWORD not in daemon.log()


def assert_nothing_committed(table: Path, topic: Topic) -> None:
    """No table; the dead-letter table, which the daemon creates before it meets Kafka, as created: no row, no txn."""
    assert not table.exists()
    dead_letters = DeltaTable(f"{table}_dead_letters")
    assert dead_letters.version() == 0
    assert dead_letters.to_pyarrow_table().num_rows == 0
    assert [dead_letters.transaction_version(f"{topic.name}-dlq-{p}") for p in range(2)] == [None, None]


def fatal_line(daemon: Daemon) -> str:
    lines = [line for line in daemon.log().splitlines() if "fatal: " in line]
    assert len(lines) == 1, daemon.log()[-3000:]
    return lines[0]


@pytest.mark.parametrize("subscription", ["topic", "topic_pattern"])
def test_wrong_password_exits_1_naming_the_key(run_daemon: Run, subscription: str) -> None:
    daemon, topic, table = run_daemon("SASL_SSL", subscription, **{"sasl.password": "not-the-password"})

    assert daemon.process.returncode == 1, daemon.log()[-3000:]
    line = fatal_line(daemon)
    assert f"kafka.settings.sasl.password: authentication failed for sasl.username '{USER}'" in line
    assert "not-the-password" not in daemon.log()  # masked like every secret
    assert_nothing_committed(table, topic)


def test_untrusted_broker_certificate_exits_1_naming_the_key(run_daemon: Run, broker: SecuredBroker) -> None:
    untrusted = str(broker.certificates.untrusted_ca)
    daemon, topic, table = run_daemon("SASL_SSL", **{"ssl.ca.location": untrusted})

    assert daemon.process.returncode == 1, daemon.log()[-3000:]
    line = fatal_line(daemon)
    assert "kafka.settings.ssl.ca.location: the broker's certificate is not trusted" in line
    assert "certificate verify failed" in line
    assert_nothing_committed(table, topic)


def test_untrusted_client_certificate_exits_1_naming_the_key(run_daemon: Run, broker: SecuredBroker) -> None:
    certs = broker.certificates
    daemon, topic, table = run_daemon(
        "SSL",
        **{
            "ssl.certificate.location": str(certs.untrusted_client_certificate),
            "ssl.key.location": str(certs.untrusted_client_key),
        },
    )

    assert daemon.process.returncode == 1, daemon.log()[-3000:]
    line = fatal_line(daemon)
    assert "kafka.settings.ssl.certificate.location: the broker refused the client certificate" in line
    assert_nothing_committed(table, topic)
