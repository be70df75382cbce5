"""PostgreSQL → Debezium (Kafka Connect) → kafka2delta upsert tables, with the daemon SIGKILLed at random while a
random workload runs: afterwards each Delta table equals ``SELECT * FROM`` its source table, row by row and
value by value, and ``kafka2delta verify`` agrees.

Three tables with a mix of types (a bigint key with numeric(38,10), numeric without scale, unicode text,
boolean, date, time, timestamp, timestamptz, jsonb, uuid, an int array and NULLs; a composite key; an int key),
a snapshot of existing rows, then inserts, updates, deletes, one primary-key change and an ``ALTER TABLE … ADD
COLUMN``, all replicated by one daemon. Short form in ``make test`` (1,000 snapshot rows, 2 kills); full form
with ``K2D_CHAOS=full`` (10,000 rows, 8 kills).
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from dev.connect.connect import ConnectClient, Converter, debezium_postgres_config
from dev.postgres.postgres import Database
from tests.support.chaos import ChaosResult
from tests.support.harness import ROOT
from tests.support.replication import (
    KEYS,
    KilledDaemon,
    Workload,
    compare_tables,
    config_text,
    high_watermarks,
    record_comparisons,
    run_workload,
    wait_for_snapshot,
    wait_quiet,
)

FULL = os.environ.get("K2D_CHAOS") == "full"
SNAPSHOT_ROWS = 10_000 if FULL else 1_000
KILLS = 8 if FULL else 2
FAULTS = ("before_merge:2", "inside_merge:2", "after_delta_commit:2", "after_parquet_write:2")
"""The first is the short form's: a flush merges its tables one after another, so a restart's second MERGE comes in
its first flush, before the outside kill that follows that flush's first commit. The others may come a flush later
(after_delta_commit counts flushes; inside_merge waits for a MERGE that writes a file before its commit), after the
short form's outside kill (clean-clone runs: Avro at after_delta_commit, JSON at inside_merge, neither fired); the
full form's kills are far enough apart. The short form kills inside a MERGE in tests/unit/test_faults.py."""
CONVERTERS: tuple[Converter, ...] = ("json", "json-plain", "avro")
OPERATIONS = 6_000 if FULL else 600


@pytest.mark.parametrize("converter", CONVERTERS)
def test_postgres_tables_equal_their_delta_tables_through_debezium_and_sigkills(
    postgres: Database,
    kafka_connect: ConnectClient,
    kafka_bootstrap: str,
    tmp_path: Path,
    converter: Converter,
    request: pytest.FixtureRequest,
    chaos_result: ChaosResult,
) -> None:
    registry = request.getfixturevalue("schema_registry_url") if converter == "avro" else None
    prefix = f"rep{uuid.uuid4().hex[:8]}"
    workload = Workload(postgres, prefix, seed=20261125)  # a schema of its own in the shared database
    workload.snapshot(SNAPSHOT_ROWS)
    tables = [f"{prefix}.{name}" for name in KEYS]
    topics = [f"{prefix}.{name}" for name in tables]
    connector = debezium_postgres_config(
        postgres, topic_prefix=prefix, tables=tables, converter=converter, registry_url=registry
    )
    kafka_connect.add_connector(prefix, connector)
    request.addfinalizer(lambda: kafka_connect.delete_connector(prefix))
    config_path = tmp_path / "config.toml"
    config_path.write_text(config_text(tmp_path, kafka_bootstrap, prefix, converter, registry))
    env = {k: v for k, v in os.environ.items() if not k.startswith("K2D_")}
    wait_for_snapshot(kafka_bootstrap, topics)
    # The first restarts kill themselves at a named step of their second commit (a file of the MERGE written, its
    # commit not made; the MERGE computed and not made; after its commit; after the rows were checked), the last
    # ones are SIGKILLed from outside.
    daemon = KilledDaemon(config_path, env, tmp_path, operations=OPERATIONS, kills=KILLS, faults=FAULTS, seed=7)
    request.addfinalizer(daemon.kill_all)
    run_workload(workload, OPERATIONS, daemon.on_step)
    wait_quiet(kafka_bootstrap, topics)
    messages = sum(high_watermarks(kafka_bootstrap, topics).values())
    chaos_result.scenario = f"replication, PostgreSQL → Debezium ({converter}) → 3 upsert tables, SIGKILLs"
    fired = daemon.record_kills(chaos_result)
    # Each crash point was reached (a restart killed from outside before its fault fired would not test it).
    assert sorted(fired) == sorted(daemon.planned_faults), f"fault points that fired: {fired}"
    late = 0
    for orphan in daemon.files_left_inside_merges():  # the kill landed between the file and its commit
        log = orphan.parent / "_delta_log"
        if any(orphan.name in commit.read_text() for commit in log.glob("*.json")):
            late += 1  # or, its watcher descheduled between its last look and the kill, just after the commit
            continue
        assert orphan.exists(), orphan
    assert daemon.current.stop() == 0, daemon.current.log()[-3000:]
    final = daemon.start("--until-caught-up")
    assert final.wait(300) == 0, final.log()[-3000:]

    with workload.connect() as conn:
        tables_read = {
            name: DeltaTable(f"{tmp_path}/tables/{prefix}.{prefix}.{name}").to_pyarrow_table() for name in KEYS
        }
        comparisons = [compare_tables(conn, name, table.to_pylist(), converter) for name, table in tables_read.items()]
    chaos_result.notes = f"{SNAPSHOT_ROWS:,} snapshot rows per table, {OPERATIONS:,} operations; "
    if late:
        chaos_result.notes += f"{late} inside_merge kill(s) landed just after the MERGE's commit; "
    record_comparisons(chaos_result, comparisons, messages)
    for comparison in comparisons:
        comparison.check()
    assert pa.types.is_decimal(tables_read["accounts"].schema.field("amount").type)
    letters = (
        DeltaTable(f"{tmp_path}/dead_letters").to_pyarrow_table() if Path(f"{tmp_path}/dead_letters").exists() else None
    )
    assert letters is None or letters.num_rows == 0, letters.to_pylist()[:3] if letters is not None else None
    verify = subprocess.run(
        [sys.executable, "-m", "kafka2delta", "verify", "-c", str(config_path)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
    chaos_result.notes += "verify OK"
    print(
        f"\nreplication ({converter}): {SNAPSHOT_ROWS} snapshot rows per table, {OPERATIONS} operations, {KILLS} SIGKILLs (self-inflicted at {sorted(fired)}), "
        f"{messages} change events: every Delta table equals its PostgreSQL table; verify OK",
        flush=True,
    )
