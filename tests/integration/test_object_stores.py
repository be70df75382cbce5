"""The daemon on Azure (Azurite) and Google Cloud Storage (fake-gcs-server), each on loopback behind the test
proxy of dev/object_stores: the S3 test set for each store. Two commits of one log version (exactly one is
stored, the other refused by the emulator's own put-if-absent check), ingest and restart, two daemons in one
group through rebalances, a second writer committing to the table while the daemon runs. `kafka2delta verify`
checks every table."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from kafka2delta.spark.maintenance_deltalake import delete_files
from kafka2delta.spark.tables import data_files
from kafka2delta.writer import table_filesystem
from tests.support.harness import BackgroundProducer, Message, Setup, wait_for
from tests.support.object_stores import STORES, Store, StoreName, start_store


@pytest.fixture(scope="session", params=STORES)
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    name: StoreName = request.param
    started = start_store(name)
    try:
        yield started
    finally:
        started.emulator.close()


@pytest.fixture
def store_setup(setup_factory: Callable[..., Setup], store: Store) -> Callable[..., Setup]:
    def make(partitions: int, abfss: bool = False, **kwargs: Any) -> Setup:
        uri = store.uri("events", abfss=abfss)
        return setup_factory(partitions, table_uri=uri, storage_options=store.options(), **kwargs)

    return make


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


def test_two_commits_of_one_log_version_exactly_one_wins(store: Store) -> None:
    """Two writers both at version 0 commit version 1 at the same moment (the proxy holds both PUTs until
    both arrived, then lets them go together): the emulator stores one and refuses the other; the loser
    commits version 2."""
    uri = store.uri("race")
    options = store.options()
    write_deltalake(uri, pa.table({"a": [0]}), storage_options=options)
    stale = [DeltaTable(uri, storage_options=options) for _ in range(2)]
    store.hold_commit(uri, 1, 2, timeout=20)
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
    assert not store.unmet(uri, 1)
    assert sorted(store.commit_outcomes(uri, 1)) == [store.stored, store.refused]
    assert store.commit_outcomes(uri, 2) == [store.stored]  # the loser, one version later
    table = DeltaTable(uri, storage_options=options)
    assert table.version() == 2
    assert sorted(table.to_pyarrow_table().column("a").to_pylist()) == [0, 1, 2]


def test_ingest_then_restart_replays_nothing(store_setup, daemon_factory, store: Store) -> None:
    # Azure as ADLS Gen2 names it (abfss://container@account.dfs.core.windows.net/…), GCS as gs://.
    setup = store_setup(2, abfss=store.name == "azure", max_messages_per_file=400)
    setup.topic.produce(600)
    setup.topic.produce_messages(poison(2, 3))
    daemon = daemon_factory(setup, "--until-caught-up")
    assert daemon.wait(180) == 0, daemon.log()[-3000:]
    assert setup.txn_versions() == {0: 602, 1: 602}
    assert (len(set(setup.ids())), len(setup.dead_letters())) == (1200, 6)
    version = setup.table().version()
    files = [uri.rsplit("/", 1)[1] for uri in setup.table().file_uris()]
    assert files and all(f.startswith(f"{setup.topic.name}-") for f in files), files  # the daemon's Parquet writer

    # A second run finds nothing to do: no commit, same figures.
    again = daemon_factory(setup, "--until-caught-up")
    assert again.wait(180) == 0, again.log()[-3000:]
    assert setup.table().version() == version

    # New messages: only they are ingested.
    setup.topic.produce(200, start=600)
    third = daemon_factory(setup, "--until-caught-up")
    assert third.wait(180) == 0, third.log()[-3000:]
    assert_verified(setup, produced=1606, dead_letters=6)
    assert setup.txn_versions() == {0: 802, 1: 802}


def test_two_daemons_in_one_group_on_one_table(store_setup, daemon_factory) -> None:
    setup = store_setup(4, allowed_latency_s=0.5)
    setup.topic.produce_messages(poison(4, 2))
    # About 16 s of messages: both daemons start and commit while they still arrive.
    producer = BackgroundProducer(setup.topic, per_partition=600, chunk=15, pause_s=0.4)
    first = daemon_factory(setup)
    wait_for(lambda: "committed version" in first.log(), 120, "the first daemon's first commit")
    second = daemon_factory(setup)  # joins the group: a rebalance
    wait_for(lambda: "committed version" in second.log(), 120, "the second daemon's first commit")
    assert first.stop(120) == 0  # leaves the group while messages still arrive: another rebalance
    producer.join()
    assert second.stop(120) == 0
    last = daemon_factory(setup, "--until-caught-up")
    assert last.wait(180) == 0, last.log()[-3000:]
    assert_verified(setup, produced=4 * 602, dead_letters=8)


def test_a_second_writer_commits_to_the_table_while_the_daemon_runs(store_setup, daemon_factory, store) -> None:
    setup = store_setup(2, allowed_latency_s=0.3)
    setup.topic.produce_messages(poison(2, 1))
    # About 12 s of messages: the daemon still commits every 0.3 s while the writer races it.
    producer = BackgroundProducer(setup.topic, per_partition=600, chunk=20, pause_s=0.4)
    daemon = daemon_factory(setup)
    wait_for(lambda: "committed version" in daemon.log(), 120, "the daemon's first commit")

    options = setup.storage_options
    schema = pa.schema(setup.table().schema().to_arrow())
    written: list[str] = []
    held: list[int] = []
    for n in range(8):
        table = DeltaTable(setup.table_uri, storage_options=options)
        if n < 3:
            # Race the daemon's next commit for the same log version: the proxy holds this writer's PUT of
            # that version until the daemon's arrives (or 10 s pass: the daemon had nothing to commit).
            held.append(table.version() + 1)
            store.hold_commit(setup.table_uri, held[-1], 2, timeout=10)
        ids = [f"w-{n}-{i}" for i in range(5)]
        write_deltalake(table, pa.Table.from_pylist([{"id": i, "seq": n} for i in ids], schema=schema), mode="append")
        written += ids
        time.sleep(0.2)
    producer.join()
    assert daemon.stop(120) == 0
    last = daemon_factory(setup, "--until-caught-up")
    assert last.wait(180) == 0, last.log()[-3000:]

    # Each raced version: one commit stored, the other refused and committed at a later version.
    raced = [version for version in held if not store.unmet(setup.table_uri, version)]
    for version in held:
        outcomes = sorted(store.commit_outcomes(setup.table_uri, version))
        if version in raced:
            assert outcomes == [store.stored, store.refused], (version, outcomes)
        else:
            assert outcomes[0] == store.stored and set(outcomes[1:]) <= {store.refused}, (version, outcomes)
    assert raced, "the daemon committed nothing while the writer raced it"
    assert_verified(setup, produced=2 * 601, dead_letters=2)
    ids = setup.ids()
    assert sorted(i for i in ids if i.startswith("w-")) == sorted(written)
    assert len(ids) == len(set(ids)) == 2 * 600 + len(written)
    print(f"{store.name}: second writer {len(written)} rows in 8 commits; versions raced with the daemon: {raced}")


def test_maintain_compacts_and_vacuums_there_through_delta_rs_while_the_daemon_runs(
    store_setup, daemon_factory
) -> None:
    """The Spark jobs cannot reach these stores: ``maintain`` takes delta-rs there (``--engine auto``), no JVM."""
    setup = store_setup(2, allowed_latency_s=0.3)
    # About 16 s of messages: the daemon still commits small files when maintain compacts them.
    producer = BackgroundProducer(setup.topic, per_partition=600, chunk=15, pause_s=0.4)
    daemon = daemon_factory(setup)
    wait_for(lambda: daemon.log().count("committed version") >= 3, 120, "the daemon's first commits")
    code, reports = setup.maintain("optimize")
    assert code == 0 and isinstance(reports, list), reports
    [compacted] = [r for r in reports if r["table"] == setup.table_uri]
    assert compacted["status"] == "ok" and compacted["details"]["engine"] == "deltalake", compacted
    assert compacted["files_after"] < compacted["files_before"], compacted
    code, reports = setup.maintain("vacuum", "--retain-hours", "1")  # every removed file is younger: none goes
    assert code == 0 and isinstance(reports, list), reports
    [vacuumed] = [r for r in reports if r["table"] == setup.table_uri]
    assert vacuumed["status"] == "ok" and vacuumed["details"]["deleted"] == 0, vacuumed
    # An orphan cannot be aged on the emulators: the deletion itself, by the path form the listing gives.
    filesystem, root = table_filesystem(setup.table_uri, setup.storage_options)
    # Through a buffer, as the daemon writes there: delta-rs's object_store streams take bytes only.
    with pa.BufferedOutputStream(filesystem.open_output_stream(f"{root}/part-00000-orphan.parquet"), 1024) as out:
        out.write(b"never committed")
    assert "part-00000-orphan.parquet" in {f.path for f in data_files(setup.table_uri, setup.storage_options)}
    delete_files(setup.table_uri, setup.storage_options, ["part-00000-orphan.parquet"])
    assert "part-00000-orphan.parquet" not in {f.path for f in data_files(setup.table_uri, setup.storage_options)}
    producer.join()
    assert daemon.stop(120) == 0
    last = daemon_factory(setup, "--until-caught-up")
    assert last.wait(180) == 0, last.log()[-3000:]
    assert_verified(setup, produced=2 * 600, dead_letters=0)
    print(f"optimize there: {compacted['details']}; vacuum: {vacuumed['details']}")
