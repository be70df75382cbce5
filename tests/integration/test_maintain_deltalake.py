"""``maintain optimize`` and ``maintain vacuum`` through delta-rs (``--engine deltalake``: no Spark, no JVM) on a
local table the daemon writes: a killed daemon's orphans are vacuumed and nothing committed is; compaction while the
daemon commits loses and duplicates nothing; the daemon replays nothing afterwards. The same lane on Azure and GCS
(its default there) is in ``test_object_stores.py``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kafka2delta.spark import maintenance_deltalake
from kafka2delta.spark.tables import data_files, open_table
from tests.support.chaos import crash_leaving_orphans
from tests.support.harness import BackgroundProducer, Daemon, Setup, assert_exactly_once, wait_for

pytestmark = pytest.mark.integration


def maintain(setup: Setup, *argv: str) -> dict[str, Any]:
    """The report of ``kafka2delta maintain <argv>`` on the topic's table, through delta-rs (exit 0)."""
    code, reports = setup.maintain(*argv)
    assert code == 0 and isinstance(reports, list), reports
    [report] = [r for r in reports if r["table"] == setup.table_uri]
    assert report["status"] == "ok" and report["details"]["engine"] == "deltalake", report
    return report


def test_delta_rs_vacuums_a_killed_daemons_orphans_only_and_compacts_while_the_daemon_commits(
    setup_factory: Callable[..., Setup], daemon_factory: Callable[..., Daemon], monkeypatch: pytest.MonkeyPatch
) -> None:
    setup = setup_factory(2, max_messages_per_file=50)
    produced, orphans, committed = crash_leaving_orphans(setup, daemon_factory)

    dry = maintain(setup, "vacuum", "--engine", "deltalake", "--retain-hours", "1", "--dry-run")
    assert dry["details"]["would_delete"] == len(orphans) and dry["files_after"] == dry["files_before"]
    report = maintain(setup, "vacuum", "--engine", "deltalake", "--retain-hours", "1")
    print(f"\nvacuum (delta-rs): {report}")
    assert report["details"]["orphans"] == report["details"]["deleted"] == len(orphans)
    assert {f.path for f in data_files(setup.table_uri)} == committed
    assert_exactly_once(setup, produced)

    # Compaction while the daemon commits small files: no row lost or doubled, and its txns are kept.
    daemon = daemon_factory(setup, env={"K2D_INGEST__ALLOWED_LATENCY_S": "0.2"})
    producer = BackgroundProducer(setup.topic, 1_500, start=100, chunk=10, pause_s=0.1)  # 15 s and more
    wait_for(lambda: len(setup.ids()) > 300, 60, "the daemon's commits")
    first = maintain(setup, "optimize", "--engine", "deltalake")
    assert first["files_after"] < first["files_before"] and first["details"]["files_removed"] > 1, first
    # A compaction that read the table before the daemon's next two commits: it commits after them, losing none.
    compacted = first["details"]["commit_version"]
    wait_for(lambda: setup.table().version() >= compacted + 2, 60, "new small files")
    stale = open_table(setup.table_uri)
    read = stale.version()
    wait_for(lambda: setup.table().version() >= read + 2, 60, "two more commits of the daemon")
    monkeypatch.setattr(maintenance_deltalake, "open_table", lambda *args, **kwargs: stale)
    raced = maintenance_deltalake.optimize(setup.table_uri)
    assert raced.details["read_version"] == read and raced.details["concurrent_commits"] >= 2, raced.details
    produced += producer.join()
    wait_for(lambda: len(setup.ids()) >= len(produced), 120, "every row")
    assert daemon.stop() == 0, daemon.log()[-3000:]
    assert_exactly_once(setup, produced)
    print(f"optimize (delta-rs) that read v{read} while the daemon committed: {raced.details}")
    version = setup.table().version()
    assert daemon_factory(setup, "--until-caught-up").wait(120) == 0
    assert setup.table().version() == version  # the txns say everything is in: nothing replayed
