"""One config for both: the daemon ingests through the broker's SASL_SSL listener (SCRAM-SHA-512, the broker's
certificate checked against the test CA), then ``jobs mutate`` reads its requests from the same listener with
the same ``[kafka.settings]``, translated for Spark's Kafka source (Kafka's Java client)."""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from dev.kafka.broker import SecuredBroker, create_topic
from kafka2delta.coordinator import Coordinator, NoBackend
from kafka2delta.spark.jobs import StreamingJob
from tests.support.harness import Daemon, Message, Topic, toml_section
from tests.support.secured_kafka import PASSWORD, listener_settings, secured_broker
from tests.support.spark_jobs import SCHEMA, config, delete, event, jobs_section, update

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredBroker]:
    with secured_broker(tmp_path_factory.mktemp("secured-kafka")) as started:
        yield started


def test_mutate_job_reads_its_requests_through_sasl_ssl(spark: Any, broker: SecuredBroker, tmp_path: Path) -> None:
    events, requests = (f"{kind}-{uuid.uuid4().hex[:8]}" for kind in ("events", "mutations"))
    create_topic(broker.bootstrap_servers, events, 1)
    create_topic(broker.bootstrap_servers, requests, 1)
    table = tmp_path / "table"
    config_path = tmp_path / "config.toml"
    lines = [
        *toml_section("kafka", {"bootstrap_servers": broker.bootstrap("SASL_SSL"), "topic": events}),
        *toml_section("kafka.settings", listener_settings(broker, "SASL_SSL")),
        *toml_section("table", {"uri": str(table)}),
        *toml_section("table.schema", SCHEMA),
        *toml_section("jobs", jobs_section(requests, requests, tmp_path / "checkpoints")),
    ]
    config_path.write_text("\n".join(lines) + "\n")

    # The daemon: 40 events through SASL_SSL.
    Topic(events, 1, broker.bootstrap_servers).produce_messages(
        [Message(0, json.dumps(event(f"e{i}", f"L{i % 4}", f"U{i % 3}")).encode()) for i in range(40)]
    )
    daemon = Daemon(
        [sys.executable, "-m", "kafka2delta", "ingest", "-c", str(config_path), "--until-caught-up"],
        {k: v for k, v in os.environ.items() if not k.startswith("K2D_")},
        tmp_path / "daemon.log",
    )
    assert daemon.wait(120) == 0, daemon.log()[-3000:]
    assert DeltaTable(str(table)).transaction_version(f"{events}-0") == 39

    # The job: its requests through the same listener, with the same settings.
    Topic(requests, 1, broker.bootstrap_servers).produce_messages(
        [Message(0, update("L1", "C1")), Message(0, delete("L2"))]
    )
    job = StreamingJob(spark, config(config_path), "mutate", Coordinator(NoBackend(), "t"))
    report = job.run(available_now=True)

    assert report.status == "ok", report.text()
    assert report.details["rows_updated"] == 10 and report.details["rows_deleted"] == 10
    rows = DeltaTable(str(table)).to_pyarrow_table(columns=["lead_id", "contact_id"]).to_pylist()
    assert len(rows) == 30
    assert {r["contact_id"] for r in rows if r["lead_id"] == "L1"} == {"C1"}
    assert not any(r["lead_id"] == "L2" for r in rows)
    assert DeltaTable(str(table)).transaction_version(job.txn_app_id) is not None
    assert PASSWORD not in daemon.log()
