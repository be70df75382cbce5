"""The jobs' safety nets, on small tables written by deltalake (no broker): the txnAppId is the checkpoint's
(a new checkpoint is refused, an old batch raises instead of being skipped), a bad value never fails the
MERGE (invalid, counted, skipped), a MERGE that fails anyway names its batch, and the [jobs] columns are
checked at start."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from kafka2delta.config import Config, load_config
from kafka2delta.coordinator import Coordinator, NoBackend
from kafka2delta.errors import ConfigError
from kafka2delta.spark.errors import CheckpointMismatch, SparkJobError
from kafka2delta.spark.jobs import StreamingJob, checkpoint_location
from kafka2delta.spark.mutations import Target, apply_gdpr_deletes, apply_mutations

SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("lead_id", pa.string()),
        pa.field("n", pa.int64()),
        pa.field("contact_id", pa.string()),
        pa.field("subject", pa.int64()),
        pa.field("ts", pa.timestamp("us", tz="UTC")),
    ]
)


def _table(tmp_path: Path, rows: int = 6) -> Target:
    uri = str(tmp_path / "table")
    write_deltalake(
        uri,
        pa.table(
            {
                "id": [f"e{i}" for i in range(rows)],
                "lead_id": [f"L{i % 3}" for i in range(rows)],
                "n": list(range(rows)),
                "contact_id": [None] * rows,
                "subject": [i % 3 for i in range(rows)],
                "ts": [None] * rows,
            },
            schema=SCHEMA,
        ),
    )
    return Target(uri)


def _rows(target: Target) -> dict[str, tuple[Any, ...]]:
    table = DeltaTable(target.uri).to_pyarrow_table(columns=["id", "lead_id", "n", "contact_id", "subject"])
    return {r["id"]: (r["lead_id"], r["n"], r["contact_id"], r["subject"]) for r in table.to_pylist()}


def _messages(*payloads: Any) -> list[tuple[int, int, bytes | None]]:
    return [(0, i, p if isinstance(p, bytes) else json.dumps(p).encode()) for i, p in enumerate(payloads)]


def _config(tmp_path: Path, target: Target, **jobs: str) -> Config:
    env = {
        "K2D_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:1",
        "K2D_KAFKA__TOPIC": "events",
        "K2D_TABLE__URI": target.uri,
        "K2D_JOBS__CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
        **{f"K2D_JOBS__{key.upper()}": value for key, value in jobs.items()},
    }
    return load_config(None, env)


def test_txn_app_id_is_the_jobs_and_an_older_batch_raises(spark: Any, tmp_path: Path) -> None:
    target = _table(tmp_path)
    update = {"op": "update", "match": {"lead_id": "L1"}, "set": {"contact_id": "C1"}}
    result = apply_mutations(spark, target, _messages(update), 3, "events-nightly", "req")
    assert result.commits == 1
    assert DeltaTable(target.uri).transaction_version("events-nightly") == 3_000_000
    # A replay of batch 3 (the checkpoint's last batch) skips what landed.
    replay = apply_mutations(spark, target, _messages(update), 3, "events-nightly", "req")
    assert (replay.commits, replay.skipped_commits) == (0, 1)
    # Batch 1 under the same txnAppId: an older checkpoint; raised, never skipped as a replay.
    version = DeltaTable(target.uri).version()
    with pytest.raises(CheckpointMismatch, match=r"batch 1 .*1000000\.\.1999999 of events-nightly.*3000000"):
        apply_mutations(spark, target, _messages(update), 1, "events-nightly", "req")
    forget = {"subject_id": 1}
    assert apply_gdpr_deletes(spark, target, _messages(forget), 5, "events-gdpr", "gdpr", "subject").commits == 1
    with pytest.raises(CheckpointMismatch, match=r"batch 2 .*version\(s\) 2 of events-gdpr.*version 5"):
        apply_gdpr_deletes(spark, target, _messages({"subject_id": 2}), 2, "events-gdpr", "gdpr", "subject")
    assert DeltaTable(target.uri).version() == version + 1


def test_a_new_checkpoint_is_refused_when_the_table_has_the_jobs_txn(spark: Any, tmp_path: Path) -> None:
    target = _table(tmp_path)
    config = _config(tmp_path, target, mutation_topic="requests")
    job = StreamingJob(spark, config, "mutate", Coordinator(NoBackend(), "t"))
    assert job.txn_app_id == "events-mutate"
    job.check_checkpoint()  # nothing applied yet: a new checkpoint is fine
    update = {"op": "update", "match": {"lead_id": "L1"}, "set": {"contact_id": "C1"}}
    apply_mutations(spark, target, _messages(update), 2, job.txn_app_id, "requests")
    with pytest.raises(ConfigError, match=r"jobs\.checkpoint_dir.*2000000 of events-mutate.*--job-name") as info:
        job.check_checkpoint()
    print(f"\n{info.value}")
    # The checkpoint that planned batches is accepted (Spark replays or goes on from it).
    offsets = Path(checkpoint_location(config, "mutate")) / "offsets"
    offsets.mkdir(parents=True)
    (offsets / "2").write_text("v1\n{}\n{}\n")
    job.check_checkpoint()
    # Another job name is another checkpoint and another txnAppId.
    other = StreamingJob(spark, config, "mutate", Coordinator(NoBackend(), "t"), job_name="remap")
    assert other.txn_app_id == "events-remap"
    other.check_checkpoint()
    with pytest.raises(ConfigError, match="--job-name"):
        StreamingJob(spark, config, "mutate", Coordinator(NoBackend(), "t"), job_name="7")


def test_values_that_do_not_cast_are_invalid_and_equal_keys_never_share_a_merge(spark: Any, tmp_path: Path) -> None:
    target = _table(tmp_path)
    before = _rows(target)
    messages = _messages(
        {"op": "update", "match": {"n": "abc"}, "set": {"contact_id": "X"}},  # match value not a bigint
        {"op": "update", "match": {"lead_id": "L0"}, "set": {"n": "x"}},  # set value not a bigint
        {"op": "update", "match": {"lead_id": "L0"}, "set": {"n": 1.5}},  # not a whole number
        {"op": "update", "match": {"lead_id": "L0"}, "set": {"id": None}},  # NOT NULL column
        {"op": "delete", "match": {"n": 99999999999999999999}},  # out of bigint's range
        {"op": "update", "match": {"n": 1}, "set": {"contact_id": "A"}},
        {"op": "update", "match": {"n": "1"}, "set": {"contact_id": "B"}},  # the same key once cast: after A
        {"op": "update", "match": {"n": " 2"}, "set": {"contact_id": "C"}},
        {"op": "delete", "match": {"n": "2"}},  # the same row as " 2": applied after the update
    )
    result = apply_mutations(spark, target, messages, 0, "events-mutate", "req")
    assert result.invalid == 5 and result.requests == 9
    assert result.rows_updated == 3 and result.rows_deleted == 1
    expected = {**before, "e1": (*before["e1"][:2], "B", before["e1"][3])}
    del expected["e2"]
    assert _rows(target) == expected
    # GDPR requests on a bigint subject column: a subject that is not a number is invalid; 1 and "1" are one.
    forget = _messages({"subject_id": "U1"}, {"subject_id": 1}, {"subject_id": "1"}, {"subject_id": "01"})
    gdpr = apply_gdpr_deletes(spark, target, forget, 0, "events-ttl", "gdpr", "subject")
    assert (gdpr.invalid, gdpr.commits, gdpr.rows_deleted) == (1, 1, 2)
    assert _rows(target) == {i: r for i, r in expected.items() if r[3] != 1}


def test_a_merge_that_fails_anyway_names_its_batch_group_and_requests(spark: Any, tmp_path: Path) -> None:
    target = _table(tmp_path)
    spark.sql(f"ALTER TABLE delta.`{target.path}` ADD CONSTRAINT positive CHECK (n >= 0)").collect()
    messages = _messages(
        {"op": "update", "match": {"lead_id": "L0"}, "set": {"contact_id": "ok"}},
        {"op": "update", "match": {"lead_id": "L1"}, "set": {"n": -1}},  # valid, but violates the constraint
        {"op": "update", "match": {"lead_id": "L2"}, "set": {"n": -2}},
    )
    with pytest.raises(SparkJobError) as info:
        apply_mutations(spark, target, messages, 4, "events-mutate", "req")
    text = str(info.value)
    print(f"\n{text[:400]}")
    assert "jobs mutate batch 4 group 1 (txnVersion 4000001 of events-mutate; 2 request(s) req[0]@1..req[0]@2)" in text
    assert DeltaTable(target.uri).transaction_version("events-mutate") == 4_000_000  # group 0 landed


def test_jobs_columns_are_checked_at_start(spark: Any, tmp_path: Path) -> None:
    target = _table(tmp_path)
    none = Coordinator(NoBackend(), "t")
    cases = [
        ({"ttl_topic": "gdpr", "subject_column": "nope"}, "jobs.subject_column", "not a top-level column"),
        ({"retention_column": "lead_id", "retention_days": "30"}, "jobs.retention_column", "expected timestamp"),
        ({"retention_column": "gone", "retention_days": "30"}, "jobs.retention_column", "not a top-level column"),
    ]
    for jobs, key, reason in cases:
        job = StreamingJob(spark, _config(tmp_path, target, **jobs), "ttl", none)
        with pytest.raises(ConfigError, match=reason) as info:
            job.run(available_now=True)
        assert info.value.key == key
    ok = StreamingJob(spark, _config(tmp_path, target, retention_column="ts", retention_days="30"), "ttl", none)
    assert ok.run(available_now=True).status == "ok"
