"""On real Spark and Delta: vacuum keeps a table's own longer ``delta.deletedFileRetentionDuration`` (refused below
it, run with Delta's check on at or above it), and the retention delete of a date column keeps the cutoff's day,
as its pre-check on the log's statistics does, and a daemon writing many tables (a ``{topic}`` template) has its
dead letters' retention run on its dead-letter table (tests/unit/test_spark_jobs.py checks these without Spark)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from kafka2delta.config import load_config
from kafka2delta.coordinator import Coordinator, NoBackend
from kafka2delta.dead_letters import PARTITION_BY, dead_letter_rows
from kafka2delta.errors import ConfigError
from kafka2delta.records import DeadLetter
from kafka2delta.spark.jobs import StreamingJob
from kafka2delta.spark.maintenance import vacuum

pytestmark = pytest.mark.integration


def test_vacuum_keeps_the_tables_own_retention(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "events")
    write_deltalake(
        uri, pa.table({"id": [1, 2]}), configuration={"delta.deletedFileRetentionDuration": "interval 30 days"}
    )
    with pytest.raises(ConfigError, match=r"--retain-hours: .* 'interval 30 days' \(720 hours"):
        vacuum(spark, uri, retain_hours=168)
    assert vacuum(spark, uri, retain_hours=720, dry_run=True).status == "ok"  # Delta's own check passes
    # On Delta's default week, a shorter retention still runs (the check off for the call only).
    plain = str(tmp_path / "plain")
    write_deltalake(plain, pa.table({"id": [1]}))
    assert vacuum(spark, plain, retain_hours=24, dry_run=True).status == "ok"
    assert spark.conf.get("spark.databricks.delta.retentionDurationCheck.enabled", None) in (None, "true")


def test_the_retention_of_a_date_column_keeps_the_cutoffs_day(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "events")
    days = [dt.date(2024, 5, 9), dt.date(2024, 5, 10), dt.date(2024, 5, 11)]
    write_deltalake(uri, pa.table({"day": pa.array(days, pa.date32()), "id": [1, 2, 3]}))
    config = load_config(
        None,
        {
            "K2D_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:1",
            "K2D_KAFKA__TOPIC": "events",
            "K2D_TABLE__URI": uri,
            "K2D_JOBS__RETENTION_COLUMN": "day",
            "K2D_JOBS__RETENTION_DAYS": "1",
        },
    )
    now = dt.datetime(2024, 5, 11, 13, 30, tzinfo=dt.UTC)  # cutoff 2024-05-10 13:30 UTC: 05-10 is kept
    job = StreamingJob(spark, config, "ttl", Coordinator(NoBackend(), uri), clock=lambda: now)
    report = job.run(available_now=True, interval_s=0)
    assert report.status == "ok" and report.details["retention_deleted"] == 1
    assert sorted(DeltaTable(uri).to_pyarrow_table().column("day").to_pylist()) == days[1:]
    version = DeltaTable(uri).version()
    again = StreamingJob(spark, config, "ttl", Coordinator(NoBackend(), uri), clock=lambda: now)
    assert again.run(available_now=True, interval_s=0).details["retention_deleted"] == 0
    assert DeltaTable(uri).version() == version  # the pre-check ran no DELETE


def test_a_daemon_of_many_tables_has_its_dead_letters_retention_on_its_dead_letter_table(
    spark: Any, tmp_path: Path
) -> None:
    lake = tmp_path / "lake"
    letters = str(lake / "_dead_letters")  # the default of table.uri = <lake>/{topic}
    now = dt.datetime.now(dt.UTC)
    for offset, days in enumerate((40, 40, 10)):
        recorded = dead_letter_rows(
            [DeadLetter("a", 0, offset, "deserialize", "not JSON", b"{")], "k2d", now - dt.timedelta(days=days)
        )
        write_deltalake(letters, recorded, partition_by=list(PARTITION_BY), mode="append")
    config = load_config(
        None,
        {
            "K2D_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:1",
            "K2D_KAFKA__TOPICS": "a,b",
            "K2D_TABLE__URI": f"{lake}/{{topic}}",
            "K2D_JOBS__DEAD_LETTER_RETENTION_DAYS": "30",
        },
    )
    job = StreamingJob(spark, config, "ttl", Coordinator(NoBackend(), letters))
    report = job.run(available_now=True, interval_s=0)
    print(f"\nttl: {report.text()}")
    assert report.status == "ok" and report.table == letters and report.details["dead_letters_deleted"] == 2
    assert report.rows_before == 3 and report.rows_after == 1
    assert DeltaTable(letters).to_pyarrow_table(columns=["offset"]).column("offset").to_pylist() == [2]
    assert DeltaTable(letters).history(1)[0]["operation"] == "DELETE"
