"""Fan-out: one topic split by ``[routing] expression`` into two tables (and unknown routes into dead
letters), so one partition's flush commits two tables one after the other. SIGKILL between those two
commits (also between the first commits of tables without a schema, which their first rows make), and random
SIGKILLs of two daemons in one group; then ``kafka2delta verify`` (which reads every route's table of the topic
as one) must find lost 0, duplicated 0, no offset both a row and a dead letter.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
import time
from typing import Any

import pytest
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from tests.support.chaos import (
    FAST_GROUP,
    POISON,
    ChaosProducer,
    ChaosResult,
    chaos_setup,
    drain,
    poisoned,
    scale,
    stop,
)
from tests.support.harness import Setup, event, wait_for

ROUTES = ("click", "purchase")
UNKNOWN_EVERY = 41  # one message in 41 names a route that does not exist (a dead letter, stage route)


def unknown_route(seq: int) -> bool:
    return seq % UNKNOWN_EVERY == 7


def payload(partition: int, seq: int) -> bytes:
    if unknown_route(seq):
        return json.dumps({**json.loads(event(partition, seq)), "type": "refund"}).encode()
    return poisoned(50)(partition, seq)


def unpoisoned(partition: int, seq: int) -> bytes:
    """Events and unknown routes only: for tables typed by their first rows, a text ``seq`` is no poison."""
    return (
        json.dumps({**json.loads(event(partition, seq)), "type": "refund"}).encode()
        if unknown_route(seq)
        else event(partition, seq)
    )


def fan_out_setup(setup_factory: Any, partitions: int, schemaless: bool = False, **ingest: Any) -> Setup:
    table: dict[str, Any] = {"metadata_columns": ["topic", "partition", "offset"]}
    if schemaless:  # every table made from its first rows
        table["schema_evolution"] = "merge"
        ingest["schema"] = {}
    setup = chaos_setup(setup_factory, partitions, table=table, **ingest)
    lines = ["[routing]", 'expression = "type"']
    for name in ROUTES:
        lines += ["[[routes]]", f'name = "{name}"', f'uri = "{setup.tmp_path / name}"']
    setup.config_path.write_text(setup.config_path.read_text() + "\n".join(lines) + "\n")
    return setup


def rows(setup: Setup, name: str) -> int:
    try:
        return DeltaTable(str(setup.tmp_path / name)).to_pyarrow_table(columns=["id"]).num_rows
    except TableNotFoundError:  # not created yet
        return 0


def txns(setup: Setup, name: str) -> dict[int, int | None]:
    table = DeltaTable(str(setup.tmp_path / name))
    return {p: table.transaction_version(f"{setup.app_id}-{p}") for p in range(setup.topic.partitions)}


def verified(setup: Setup, chaos_result: ChaosResult, per_partition: int, poison: bool = True) -> dict[str, Any]:
    """``kafka2delta verify`` over both tables and the dead-letter table; each table holds only its route, and the
    dead letters are exactly the poison messages and the unknown routes."""
    code, report = setup.verify()
    assert isinstance(report, dict), report
    figures = {key: report[key] for key in ("lost", "duplicated_total", "in_both_total", "unexpected_total")}
    assert code == 0 and report["ok"] and set(figures.values()) == {0}, json.dumps(report)[:3000]
    assert report["produced"] == per_partition * setup.topic.partitions
    bad = sum(unknown_route(seq) or (poison and POISON in poisoned(50)(0, seq)) for seq in range(per_partition))
    expected_letters = bad * setup.topic.partitions
    assert report["dead_letters"] == expected_letters, (report["dead_letters"], expected_letters)
    chaos_result.figures = {
        "messages": report["produced"],
        "rows": report["rows"],
        "dead_letters": report["dead_letters"],
        "poison": expected_letters,
        "lost": report["lost"],
        "duplicated": report["duplicated_total"],
        "in_both": report["in_both_total"],
        "unexpected": report["unexpected_total"],
    }
    for name in ROUTES:
        types = set(
            DeltaTable(str(setup.tmp_path / name)).to_pyarrow_table(columns=["type"]).column("type").to_pylist()
        )
        assert types == {name}, f"table {name} holds types {types}"
    letters = DeltaTable(setup.dead_letter_uri).to_pyarrow_table(columns=["stage"]).column("stage").to_pylist()
    assert "route" in letters and report["dead_letters"] == len(letters)
    # `kafka2delta status` lists both tables of the topic, each at the partition's last offset.
    status = subprocess.run(
        [sys.executable, "-m", "kafka2delta", "status", "-c", str(setup.config_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    for name in ROUTES:
        assert f"table {setup.tmp_path / name} version" in status, status
    last = per_partition - 1
    assert status.count(f" {setup.app_id}-0 ") == len(ROUTES) and f" {last} " in status, status
    verdict_note = (
        f"verify: produced {report['produced']}, rows {report['rows']} "
        f"({', '.join(f'{n} {rows(setup, n)}' for n in ROUTES)}), dead letters {report['dead_letters']} "
        f"({letters.count('route')} unknown routes), lost 0, duplicated 0"
    )
    chaos_result.notes = "; ".join(filter(None, [chaos_result.notes, verdict_note]))
    return report


@pytest.mark.parametrize(
    ("point", "schemaless"),
    [("between_table_commits", False), ("after_delta_commit", False), ("between_table_commits", True)],
    ids=["between_table_commits", "after_delta_commit", "between_the_first_commits_of_tables_without_schema"],
)
def test_kill_between_the_tables_of_one_flush(
    setup_factory, daemon_factory, chaos_result: ChaosResult, point: str, schemaless: bool
) -> None:
    per_partition = scale(2_000, 50_000)
    setup = fan_out_setup(setup_factory, 3, schemaless, max_messages_per_file=scale(400, 5_000), allowed_latency_s=0.5)
    events = unpoisoned if schemaless else payload
    kind = "tables without a schema, made by their first rows" if schemaless else "route expression"
    chaos_result.scenario = f"fan-out by {kind}, SIGKILL at `{point}`, restart"
    half = per_partition // 2
    setup.topic.produce(half, payload=events)
    producer = ChaosProducer(setup.topic, half, start=half, chunk=scale(100, 1_000), payload=events)
    # Without a schema: at the first flush, between the first table made and the next (its start mark the only
    # record of where it starts).
    kill_at = 1 if schemaless else scale(3, 6)
    crashed = daemon_factory(setup, env={**FAST_GROUP, "K2D_FAULT_INJECT": f"{point}:{kill_at}"})
    assert crashed.wait(300) == -9, crashed.log()[-3000:]
    chaos_result.fault(f"SIGKILL at {point}")
    if point == "between_table_commits":
        # Without a schema the second table does not exist yet: the first must have committed all the same.
        first, second = txns(setup, ROUTES[0]), txns(setup, ROUTES[1]) if rows(setup, ROUTES[1]) else {}
        committed = any(version is not None for version in first.values())
        assert committed and first != second, f"one table should be ahead of the other: {first} vs {second}"
    if schemaless:  # the second table was not made; where its partitions start is in the dead-letter table
        assert rows(setup, ROUTES[1]) == 0
        digest = hashlib.sha256(str(setup.tmp_path / ROUTES[1]).encode()).hexdigest()[:12]
        letters = DeltaTable(setup.dead_letter_uri)
        marks = [letters.transaction_version(f"{setup.app_id}-{setup.app_id}-start-{digest}-{p}") for p in range(3)]
        assert any(mark is not None for mark in marks), marks
    restarted = daemon_factory(setup, env=FAST_GROUP)
    wait_for(lambda: "assigned " in restarted.log(), 120, "the restart's assignment")
    producer.join()
    stop(restarted)
    drain(daemon_factory, setup)
    verified(setup, chaos_result, per_partition, poison=not schemaless)


def test_fan_out_random_sigkills_two_instances(setup_factory, daemon_factory, chaos_result: ChaosResult) -> None:
    per_partition = scale(3_000, 100_000)
    kills = scale(3, 16)
    seed = int(os.environ.get("K2D_CHAOS_SEED") or random.randrange(1 << 30))
    rng = random.Random(seed)
    chaos_result.scenario = "fan-out by route expression, random SIGKILLs, 2 instances in one group, 4 partitions"
    chaos_result.notes = f"seed {seed}"
    setup = fan_out_setup(setup_factory, 4, max_messages_per_file=scale(1_000, 10_000), allowed_latency_s=1)
    producer = ChaosProducer(setup.topic, per_partition, chunk=scale(250, 2_500), pause_s=0.5, payload=payload)
    daemons = [daemon_factory(setup, env=FAST_GROUP) for _ in range(2)]
    wait_for(lambda: rows(setup, ROUTES[0]) > 0, 120, "a first commit")
    for _ in range(kills):
        time.sleep(rng.uniform(1.0, scale(3, 6)))
        victim = rng.randrange(2)
        if daemons[victim].process.poll() is not None:
            raise AssertionError(f"daemon {victim} exited by itself: {daemons[victim].log()[-3000:]}")
        daemons[victim].kill()
        chaos_result.fault("daemon SIGKILL")
        time.sleep(rng.uniform(0.0, 3.0))
        daemons[victim] = daemon_factory(setup, env=FAST_GROUP)
    producer.join()
    for daemon in daemons:
        stop(daemon, 300)
    drain(daemon_factory, setup, timeout=900)
    verified(setup, chaos_result, per_partition)
