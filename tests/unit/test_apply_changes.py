"""The parts of ``jobs apply-changes`` and the turn loop it shares with ``mutate``/``ttl`` that need no Spark
session: the MERGE's clauses for Debezium's unchanged-TOAST placeholders and soft deletes, the job names that could
pass for the daemon's txn ids, the changelog tables ``mutate``/``ttl`` refuse, and storage errors that fail a turn,
not the job. What the MERGE does on real tables is tests/spark/test_apply_changes.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from kafka2delta.changes import UNAVAILABLE_VALUE
from kafka2delta.config import Config, load_config
from kafka2delta.coordinator import Coordinator, NoBackend
from kafka2delta.errors import ConfigError, RetryableError
from kafka2delta.spark.apply_changes import ApplyChangesJob, ApplyOptions, changelog_route
from kafka2delta.spark.change_merge import (
    VALUES_FLAG,
    filled_position,
    merge_clauses,
    newer_condition,
    placeholders,
    sql_literal,
)
from kafka2delta.spark.errors import ConflictingCommit
from kafka2delta.spark.jobs import StreamingJob, check_job_name, check_not_changelog
from kafka2delta.spark.mutations import Target
from tests.support.spark_turns import FlakyTurn

TEXT = f"'{UNAVAILABLE_VALUE}'"


def _config(tmp_path: Path, **env: str) -> Config:
    return load_config(
        None,
        {
            "K2D_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:1",
            "K2D_KAFKA__TOPIC": "events",
            "K2D_FORMAT__KEY": "json",
            "K2D_TABLE__URI": str(tmp_path / "events"),
            "K2D_JOBS__CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
            "K2D_JOBS__MUTATION_TOPIC": "requests",
            **{f"K2D_{key.upper()}": value for key, value in env.items()},
        },
    )


class Session:
    """What TurnJob asks of a SparkSession before any query."""

    def newSession(self) -> Session:
        return self


def test_placeholders_are_debeziums_own_as_each_column_type_holds_them() -> None:
    schema = StructType(
        [
            StructField("id", StringType(), False),  # the key: never filled
            StructField("name", StringType()),
            StructField("blob", BinaryType()),
            StructField("tags", ArrayType(StringType())),
            StructField("counts", ArrayType(IntegerType())),
            StructField("n", LongType()),
            StructField("_op", StringType()),  # a position column: never filled
            StructField("kafka_topic", StringType()),
        ]
    )
    holes = placeholders(schema, ["id"])
    ints = ", ".join(str(byte) for byte in UNAVAILABLE_VALUE.encode())
    assert holes == {
        "name": (TEXT, f'\'{{"{UNAVAILABLE_VALUE}":"{UNAVAILABLE_VALUE}"}}\''),  # text; hstore as JSON
        "blob": "X'" + UNAVAILABLE_VALUE.encode().hex().upper() + "'",
        "tags": (f"array({TEXT})", "array('b68a35a7-17ad-35b3-af2a-ae46edb4545a')"),  # text[]; uuid[]
        "counts": f"CAST(array({ints}) AS array<int>)",  # int[]: the placeholder's bytes
    }
    assert sql_literal("it's \\ here") == "'it\\'s \\\\ here'"


def test_a_placeholder_left_keeps_the_rows_value_and_inserts_null() -> None:
    holes = {"name": TEXT}
    hard = merge_clauses(
        ["id"], ["id", "name", "n", "_op", "kafka_offset"], has_lsn=True, soft=False, placeholders=holes
    )
    update, insert = hard[1].assignments, hard[2].assignments
    # The row's value where the placeholder is left, or where the change that gave the value is not newer than the
    # row (a late change of the batch never gives values).
    filled = filled_position("name", holes)
    late = f"s.`{filled}` IS NOT NULL AND NOT {newer_condition(True, filled)}"
    assert update["name"] == f"CASE WHEN s.`name` <=> {TEXT} OR ({late}) THEN t.`name` ELSE s.`name` END"
    assert insert["name"] == f"CASE WHEN s.`name` <=> {TEXT} THEN NULL ELSE s.`name` END"
    assert update["n"] == insert["n"] == "s.`n`"  # a column Debezium never fills with the placeholder
    # Without placeholders (a changelog without _lsn is no Debezium changelog) every value is the change's.
    plain = merge_clauses(["id"], ["id", "name"], has_lsn=False, soft=False)
    assert plain[1].assignments == {"id": "s.`id`", "name": "s.`name`"}


def test_a_soft_delete_after_an_upsert_of_the_batch_sets_the_upserts_values() -> None:
    soft = merge_clauses(
        ["id"], ["id", "name", "_op", "kafka_offset"], has_lsn=False, soft=True, placeholders={"name": TEXT}
    )
    values, delete = f"s.`{VALUES_FLAG}`", "s.`__k2d_delete`"
    assert [(c.kind, c.condition.split(" AND (")[0]) for c in soft] == [
        ("update", f"{delete} AND {values}"),
        ("update", delete),
        ("update", f"NOT {delete}"),
        ("insert", f"{delete} AND {values}"),
        ("insert", delete),
        ("insert", f"NOT {delete}"),
    ]
    # With its last upsert's values: every column (the placeholder still keeps the row's value), marked deleted.
    assert soft[0].assignments["name"].startswith("CASE WHEN s.`name` <=>")
    assert soft[0].assignments["_deleted"] == "true" and soft[3].assignments["_deleted"] == "true"
    # Without one: the position and the mark only; the row keeps its data, a new key is a marker.
    assert soft[1].assignments == {"_op": "s.`_op`", "kafka_offset": "s.`kafka_offset`", "_deleted": "true"}
    assert "name" not in soft[4].assignments


def test_job_names_that_could_be_the_daemons_txn_ids_are_refused() -> None:
    for name in ("7", "orders-3", "dlq-0", "apply-orders-12"):
        with pytest.raises(ConfigError, match=r"--job-name: .* could collide .*<app_id>-<topic>-<partition>"):
            check_job_name(name)
    for name in ("apply-changes", "apply-orders", "apply-v2", "mutate", "gdpr", "orders-3b"):
        check_job_name(name)
    config = _config(Path("/nonexistent"))
    with pytest.raises(ConfigError, match="--job-name"):
        StreamingJob(Session(), config, "mutate", Coordinator(NoBackend(), "t"), job_name="orders-3")  # type: ignore[arg-type]


def test_mutate_and_ttl_refuse_a_changelog_table(tmp_path: Path) -> None:
    config = _config(tmp_path, TABLE__MODE="changelog", TABLE__KEY="id")
    assert changelog_route(config, config.table.uri) == "table"
    for job in ("mutate", "ttl"):
        with pytest.raises(ConfigError, match=r"table\.mode: .* is a changelog table .* source database") as info:
            check_not_changelog(config, job)
        print(info.value)
    with pytest.raises(ConfigError, match="is a changelog table"):
        StreamingJob(Session(), config, "mutate", Coordinator(NoBackend(), "t"))  # type: ignore[arg-type]
    # A route writing table.uri as a changelog makes it one too; an append or upsert table is the jobs' to change.
    routed = _config(
        tmp_path,
        KAFKA__TOPIC="",
        KAFKA__TOPICS="events,users",
        ROUTES=json.dumps([{"topic": "users", "mode": "changelog", "key": ["id"]}]),
        TABLE__URI=str(tmp_path / "lake"),
    )
    assert changelog_route(routed, routed.table.uri) == "routes[0]"
    check_not_changelog(_config(tmp_path), "mutate")
    check_not_changelog(_config(tmp_path, TABLE__MODE="upsert", TABLE__KEY="id"), "ttl")
    # A ttl that only deletes dead letters changes no changelog; mutate, or ttl with a retention, still would.
    letters_only = _config(tmp_path, TABLE__MODE="changelog", TABLE__KEY="id", JOBS__DEAD_LETTER_RETENTION_DAYS="30")
    check_not_changelog(letters_only, "ttl")
    with pytest.raises(ConfigError, match="is a changelog table"):
        check_not_changelog(letters_only, "mutate")


def flaky_storage(config: Config) -> FlakyTurn:
    """A turn whose storage fails once (a Delta log that cannot be read), then works."""
    return FlakyTurn(Session(), config, RetryableError("reading the Delta log of /nonexistent/t: connection reset"))


def test_a_storage_error_fails_the_turn_not_the_job(tmp_path: Path) -> None:
    job = flaky_storage(_config(tmp_path))
    report = job.run(available_now=True, interval_s=0)
    assert report.status == "ok" and report.details["conflicts"] == 1 and report.details["turns"] == 1


def test_storage_failing_turn_after_turn_stops_a_continuous_job(tmp_path: Path) -> None:
    # A refusal that lasts (a revoked credential) must end the job, not warn at every interval forever.
    job = flaky_storage(_config(tmp_path))
    job.failures = 10
    with pytest.raises(RetryableError, match="connection reset"):
        job.run(interval_s=0, max_attempts=3)
    assert job.failures == 7 and job.stats.conflicts == 3


def test_conflicts_turn_after_turn_do_not_stop_a_continuous_job(tmp_path: Path) -> None:
    # Losing every commit to another writer (no coordinator) is normal, never the end of a continuous job.
    job = FlakyTurn(Session(), _config(tmp_path), ConflictingCommit("jobs flaky", "ConcurrentAppendException"))
    job.failures = 10
    report = job.run(interval_s=0, max_attempts=3, max_turns=12)
    assert job.failures == 0 and report.details["conflicts"] == 10 and report.details["turns"] == 2


def test_raw_deltalake_errors_become_retryable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def unreachable(*args: Any, **kwargs: Any) -> bool:
        raise DeltaError("Generic S3 error: error sending request: connection reset")

    monkeypatch.setattr(DeltaTable, "is_deltatable", staticmethod(unreachable))
    config = _config(tmp_path)
    options = ApplyOptions(Target(str(tmp_path / "changelog")), Target(str(tmp_path / "current")), ("id",))
    job = ApplyChangesJob(Session(), config, options, Coordinator(NoBackend(), "t"))  # type: ignore[arg-type]
    with pytest.raises(RetryableError, match=r"looking for a Delta table at .*changelog: Generic S3 error"):
        job.prepare()
    with pytest.raises(RetryableError, match="connection reset"):
        job.table_stats()
    monkeypatch.undo()
    with pytest.raises(ConfigError, match="no Delta table"):  # absent is an answer, not a storage error
        Target(str(tmp_path / "absent")).applied_version("events-apply-changes")
