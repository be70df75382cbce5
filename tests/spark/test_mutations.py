"""Mutation and GDPR/retention jobs end to end from their topics; a replayed micro-batch changes nothing; a new
checkpoint is refused while the table holds the job's txn; the daemon appends afterwards; verify tells what the jobs did
to an upsert table from faults."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable, write_deltalake

from kafka2delta.coordinator import Coordinator, NoBackend
from kafka2delta.dead_letters import dead_letter_rows
from kafka2delta.errors import ConfigError
from kafka2delta.records import DeadLetter
from kafka2delta.spark.jobs import StreamingJob
from kafka2delta.spark.tables import check_writable
from tests.support.harness import Daemon, Message, Setup, Topic
from tests.support.spark_jobs import SCHEMA, config, delete, event, forget, jobs_section, update

pytestmark = pytest.mark.integration


def _rows(setup: Setup) -> dict[str, tuple[Any, ...]]:
    table = DeltaTable(setup.table_uri).to_pyarrow_table(columns=["id", "lead_id", "contact_id", "subject_id"])
    return {r["id"]: (r["lead_id"], r["contact_id"], r["subject_id"]) for r in table.to_pylist()}


def _forget_last_batch(checkpoint: Path) -> int:
    """Make Spark run the last micro-batch again, as after a crash between its commits and the checkpoint's."""
    commits = sorted((checkpoint / "commits").glob("[0-9]*"), key=lambda p: int(p.name))
    last = commits[-1]
    last.unlink()
    (checkpoint / "commits" / f".{last.name}.crc").unlink(missing_ok=True)
    return int(last.name)


def test_mutation_and_ttl_jobs_from_their_topics(
    spark: Any,
    tmp_path: Path,
    setup_factory: Callable[..., Setup],
    topic_factory: Callable[[int], Topic],
    daemon_factory: Callable[..., Daemon],
) -> None:
    mutations, gdpr = topic_factory(2), topic_factory(1)
    checkpoints = tmp_path / "checkpoints"
    jobs = jobs_section(mutations.name, gdpr.name, checkpoints, dead_letter_retention_days=30)
    setup = setup_factory(1, schema=SCHEMA, sections={"jobs": jobs})
    events = [event(f"e{i}", f"L{i % 10}", f"U{i % 7}", old=i % 10 == 9) for i in range(100)]
    setup.topic.produce_messages([Message(0, json.dumps(e).encode()) for e in events])
    assert daemon_factory(setup, "--until-caught-up").wait(120) == 0
    cfg = config(setup.config_path)
    none = Coordinator(NoBackend(), "t")

    # Mutations: an update, an update, a delete, the first lead again (a later group), and a bad request.
    mutations.produce_messages(
        [
            Message(0, update("L1", "C1")),
            Message(0, update("L2", "C2")),
            Message(0, delete("L3")),
            Message(0, update("L1", "C1b")),
            Message(1, b'{"op":"explode"}'),
        ]
    )
    report = StreamingJob(spark, cfg, "mutate", none).run(available_now=True)
    print(f"\nmutate: {report.text()}")
    rows = _rows(setup)
    assert report.status == "ok" and report.details["invalid"] == 1
    assert report.details["rows_updated"] == 30 and report.details["rows_deleted"] == 10  # L1 twice, L2, L3
    assert not any(lead == "L3" for lead, _, _ in rows.values())
    assert {c for lead, c, _ in rows.values() if lead == "L1"} == {"C1b"}
    assert {c for lead, c, _ in rows.values() if lead == "L2"} == {"C2"}
    assert {c for lead, c, _ in rows.values() if lead not in ("L1", "L2")} == {None}

    # Replay the micro-batch (Spark re-runs it from its offsets log): the txn versions skip every group.
    version = DeltaTable(setup.table_uri).version()
    assert _forget_last_batch(checkpoints / "mutate") == 0
    replay = StreamingJob(spark, cfg, "mutate", none).run(available_now=True)
    assert replay.details["batches"] == 1 and replay.details["replayed_commits_skipped"] == 2
    assert replay.details["commits"] == 0
    assert DeltaTable(setup.table_uri).version() == version
    assert _rows(setup) == rows

    # A new checkpoint (deleted, or another jobs.checkpoint_dir) would restart batch ids at 0, below the table's
    # txn version: refused, and nothing is skipped; the job name picks the checkpoint and the txnAppId.
    mutations.produce_messages([Message(0, delete("L4"))])
    shutil.move(checkpoints / "mutate", tmp_path / "old-mutate")
    with pytest.raises(ConfigError, match=r"jobs\.checkpoint_dir.*--job-name"):
        StreamingJob(spark, cfg, "mutate", none).run(available_now=True)
    assert DeltaTable(setup.table_uri).version() == version
    shutil.move(tmp_path / "old-mutate", checkpoints / "mutate")
    report = StreamingJob(spark, cfg, "mutate", none).run(available_now=True)
    assert report.details["rows_deleted"] == 10 and report.details["replayed_commits_skipped"] == 0
    assert DeltaTable(setup.table_uri).transaction_version(f"{cfg.app_id}-mutate") == 1_000_000
    rows = {i: r for i, r in rows.items() if r[0] != "L4"}
    assert _rows(setup) == rows

    # GDPR deletes by subject, the retention delete of rows older than 30 days, and of dead letters recorded more
    # than 30 days ago (three of another topic's: two 40 days old, one 10).
    letters = f"{setup.table_uri}_dead_letters"
    now = dt.datetime.now(dt.UTC)
    old = [DeadLetter("elsewhere", 0, offset, "deserialize", "not JSON", b"{") for offset in range(3)]
    write_deltalake(letters, dead_letter_rows(old[:2], "elsewhere", now - dt.timedelta(days=40)), mode="append")
    write_deltalake(letters, dead_letter_rows(old[2:], "elsewhere", now - dt.timedelta(days=10)), mode="append")
    gdpr.produce_messages([Message(0, forget("U4")), Message(0, forget("U5")), Message(0, b"{}")])
    report = StreamingJob(spark, cfg, "ttl", none).run(available_now=True)
    print(f"ttl: {report.text()}")
    assert report.details["dead_letters_deleted"] == 2
    assert DeltaTable(letters).to_pyarrow_table(columns=["offset"]).column("offset").to_pylist() == [2]
    expected = {
        i: r for i, r in rows.items() if r[2] not in ("U4", "U5") and events[int(i[1:])]["ts"] != "2001-01-01T00:00:00Z"
    }
    assert _rows(setup) == expected
    assert report.details["retention_deleted"] > 0 and report.details["invalid"] == 1
    version = DeltaTable(setup.table_uri).version()
    _forget_last_batch(checkpoints / "ttl")
    replay = StreamingJob(spark, cfg, "ttl", none).run(available_now=True)
    assert replay.details["replayed_commits_skipped"] == 1 and replay.details["retention_deleted"] == 0
    assert DeltaTable(setup.table_uri).version() == version
    assert _rows(setup) == expected
    check_writable(setup.table_uri)

    # The daemon appends to the table the jobs changed.
    more = [event(f"n{i}", "L1", "U4") for i in range(10)]
    setup.topic.produce_messages([Message(0, json.dumps(e).encode()) for e in more])
    assert daemon_factory(setup, "--until-caught-up").wait(120) == 0
    assert set(_rows(setup)) == set(expected) | {e["id"] for e in more}

    # verify tells the rows the jobs deleted from lost ones (their removed files are still on storage).
    code, checked = setup.verify()
    assert isinstance(checked, dict) and code == 0, checked
    assert (checked["lost"], checked["deleted"], checked["rows"]) == (
        0,
        len(events) - len(expected),
        len(expected) + 10,
    )
    assert len(checked["deleted_by_version"][setup.table_uri]) == 4  # mutate: L3, then L4; ttl: GDPR, then retention


def test_verify_tells_what_the_jobs_did_to_an_upsert_table_from_faults(
    spark: Any,
    tmp_path: Path,
    setup_factory: Callable[..., Setup],
    topic_factory: Callable[[int], Topic],
    daemon_factory: Callable[..., Daemon],
) -> None:
    """Keys `jobs ttl` deleted and rows `jobs mutate` changed after the daemon upserted them are counted as deleted
    and changed later (read from the jobs' commits), not as missing or differing."""
    mutations, gdpr = topic_factory(1), topic_factory(1)
    jobs = jobs_section(mutations.name, gdpr.name, tmp_path / "checkpoints")
    sections = {"jobs": jobs, "format": {"key": "string"}}
    setup = setup_factory(1, schema=SCHEMA, sections=sections, table={"mode": "upsert", "key": ["id"]})
    events = [event(f"e{i}", f"L{i % 5}", f"U{i % 7}") for i in range(40)]
    events += [{**e, "contact_id": "second"} for e in events[:10]]  # a second change of ten keys
    setup.topic.produce_messages([Message(0, json.dumps(e).encode()) for e in events])
    assert daemon_factory(setup, "--until-caught-up").wait(120) == 0
    cfg, none = config(setup.config_path), Coordinator(NoBackend(), "t")
    mutations.produce_messages([Message(0, update("L1", "C1"))])
    assert StreamingJob(spark, cfg, "mutate", none).run(available_now=True).details["rows_updated"] == 8
    gdpr.produce_messages([Message(0, forget("U4"))])
    assert StreamingJob(spark, cfg, "ttl", none).run(available_now=True).details["rows_deleted"] == 6

    code, checked = setup.verify()
    assert isinstance(checked, dict) and code == 0, checked
    gone = sorted(repr(f"e{i}") for i in range(40) if i % 7 == 4)
    changed = sorted(repr(f"e{i}") for i in range(40) if i % 5 == 1 and i % 7 != 4)
    assert (checked["missing_keys"], checked["different"]) == ([], [])
    assert (checked["deleted_later_keys"], checked["changed_later_keys"]) == (gone, changed)
    # One commit each (the jobs change rows by MERGE): the update of L1's keys, the GDPR delete of U4's.
    assert [c["operation"] for c in checked["later_commits"].values()] == ["MERGE", "MERGE"]
    assert [c["keys"] for c in checked["later_commits"].values()] == [len(changed), len(gone)]
