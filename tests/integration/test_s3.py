"""The daemon on S3 (moto's server on loopback, dev/s3.py): ingest and restart, two daemons in one group,
a second writer committing to the same table, and put-if-absent commits — two commits of one log
version, exactly one wins. `kafka2delta verify` checks every table."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from dev import s3 as dev_s3
from tests.support.harness import BackgroundProducer, Message, Setup, wait_for

BUCKET = "k2d-test"


@pytest.fixture(scope="session")
def s3_module() -> ModuleType:
    return dev_s3


@pytest.fixture(scope="session")
def s3(s3_module: ModuleType) -> Iterator[Any]:
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    server = s3_module.LocalS3()
    server.start()
    try:
        server.create_bucket(BUCKET)
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_setup(setup_factory: Callable[..., Setup], s3: Any) -> Callable[..., Setup]:
    def make(partitions: int, **kwargs: Any) -> Setup:
        uri = f"s3://{BUCKET}/{uuid.uuid4().hex[:10]}/events"
        return setup_factory(partitions, table_uri=uri, storage_options=s3.storage_options(), **kwargs)

    return make


def log_key(setup: Setup, version: int) -> str:
    return f"{setup.table_uri.removeprefix(f's3://{BUCKET}/')}/_delta_log/{version:020d}.json"


def poison(topic_partitions: int, count: int) -> list[Message]:
    return [Message(p, b'{"id": "broken",') for p in range(topic_partitions) for _ in range(count)]


def assert_verified(setup: Setup, produced: int, dead_letters: int) -> dict[str, Any]:
    code, report = setup.verify()
    assert code == 0, report
    assert isinstance(report, dict)
    figures = {k: report[k] for k in ("produced", "rows", "dead_letters", "pending", "lost", "duplicated_total")}
    assert figures == {
        "produced": produced,
        "rows": produced - dead_letters,
        "dead_letters": dead_letters,
        "pending": 0,
        "lost": 0,
        "duplicated_total": 0,
    }, report
    assert report["log_gaps"] == [] and report["dead_letter_log_gaps"] == []
    print(f"verify {setup.table_uri}: {figures}, table v{report['table_version']}")
    return report


def test_two_commits_of_one_log_version_exactly_one_wins(s3: Any, s3_module: ModuleType) -> None:
    """Two writers both at version 0 commit version 1 at the same moment (the server holds both PUTs
    until both arrived): one PUT is stored, the other refused with 412; the loser commits version 2."""
    uri = f"s3://{BUCKET}/{uuid.uuid4().hex[:10]}/race"
    options = s3.storage_options()
    write_deltalake(uri, pa.table({"a": [0]}), storage_options=options)
    stale = [DeltaTable(uri, storage_options=options) for _ in range(2)]
    key = f"{uri.removeprefix(f's3://{BUCKET}/')}/_delta_log/{1:020d}.json"
    s3.hold_puts(BUCKET, key, 2, timeout=20)
    errors: list[BaseException] = []

    def append(i: int) -> None:
        try:
            write_deltalake(stale[i], pa.table({"a": [i + 1]}), mode="append")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=append, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    assert f"{BUCKET}/{key}" not in s3.unmet()
    assert sorted(s3.put_outcomes(BUCKET, key)) == [200, 412]
    table = DeltaTable(uri, storage_options=options)
    assert table.version() == 2
    assert sorted(table.to_pyarrow_table().column("a").to_pylist()) == [0, 1, 2]


def test_ingest_to_s3_then_restart_replays_nothing(s3_setup, daemon_factory) -> None:
    setup = s3_setup(2, max_messages_per_file=400)
    setup.topic.produce(600)
    setup.topic.produce_messages(poison(2, 3))
    daemon = daemon_factory(setup, "--until-caught-up")
    assert daemon.wait(180) == 0, daemon.log()[-3000:]
    assert_verified(setup, produced=1206, dead_letters=6)
    assert setup.txn_versions() == {0: 602, 1: 602}
    version = setup.table().version()

    # A second run finds nothing to do: no commit, same figures.
    again = daemon_factory(setup, "--until-caught-up")
    assert again.wait(180) == 0, again.log()[-3000:]
    assert setup.table().version() == version
    assert_verified(setup, produced=1206, dead_letters=6)

    # New messages: only they are ingested.
    setup.topic.produce(200, start=600)
    third = daemon_factory(setup, "--until-caught-up")
    assert third.wait(180) == 0, third.log()[-3000:]
    assert_verified(setup, produced=1606, dead_letters=6)
    assert setup.txn_versions() == {0: 802, 1: 802}


def test_two_daemons_in_one_group_on_one_s3_table(s3_setup, daemon_factory) -> None:
    setup = s3_setup(4, allowed_latency_s=0.5)
    setup.topic.produce_messages(poison(4, 2))
    producer = BackgroundProducer(setup.topic, per_partition=1500, chunk=100, pause_s=0.4)
    first = daemon_factory(setup)
    wait_for(lambda: "committed version" in first.log(), 120, "the first daemon's first commit")
    second = daemon_factory(setup)  # joins the group: a rebalance
    wait_for(lambda: "committed version" in second.log(), 120, "the second daemon's first commit")
    assert first.stop(120) == 0  # leaves the group while messages still arrive: another rebalance
    producer.join()
    assert second.stop(120) == 0
    last = daemon_factory(setup, "--until-caught-up")
    assert last.wait(180) == 0, last.log()[-3000:]
    assert_verified(setup, produced=4 * 1502, dead_letters=8)


def test_a_second_writer_commits_to_the_table_while_the_daemon_runs(s3_setup, daemon_factory, s3) -> None:
    setup = s3_setup(2, allowed_latency_s=0.3)
    setup.topic.produce_messages(poison(2, 1))
    producer = BackgroundProducer(setup.topic, per_partition=1000, chunk=50, pause_s=0.2)
    daemon = daemon_factory(setup)
    wait_for(lambda: "committed version" in daemon.log(), 120, "the daemon's first commit")

    options = setup.storage_options
    schema = pa.schema(setup.table().schema().to_arrow())
    written: list[str] = []
    held: list[str] = []
    for n in range(12):
        table = DeltaTable(setup.table_uri, storage_options=options)
        if n < 3:
            # Race the daemon's next commit for the same log version: the server holds this writer's
            # PUT of that version until the daemon's arrives (or 10 s pass: the daemon had nothing to commit).
            key = log_key(setup, table.version() + 1)
            s3.hold_puts(BUCKET, key, 2, timeout=10)
            held.append(key)
        ids = [f"w-{n}-{i}" for i in range(5)]
        write_deltalake(table, pa.Table.from_pylist([{"id": i, "seq": n} for i in ids], schema=schema), mode="append")
        written += ids
        time.sleep(0.2)
    producer.join()
    assert daemon.stop(120) == 0
    last = daemon_factory(setup, "--until-caught-up")
    assert last.wait(180) == 0, last.log()[-3000:]

    # Each raced version: one commit stored, the other refused (412) and committed at a later version.
    raced = [key for key in held if f"{BUCKET}/{key}" not in s3.unmet()]
    for key in held:
        outcomes = sorted(s3.put_outcomes(BUCKET, key))
        assert outcomes == [200, 412] if key in raced else outcomes[0] == 200 and set(outcomes[1:]) <= {412}, key
    assert raced, "the daemon committed nothing while the writer raced it"
    assert_verified(setup, produced=2 * 1001, dead_letters=2)
    ids = setup.ids()
    assert sorted(i for i in ids if i.startswith("w-")) == sorted(written)
    assert len(ids) == len(set(ids)) == 2 * 1000 + len(written)
    print(f"second writer: {len(written)} rows in 12 commits; versions raced with the daemon: {raced}")
