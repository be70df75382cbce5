"""Compaction of the daemon's small files, with the daemon appending during and after it (no conflicts)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import pytest

from kafka2delta.spark.maintenance import optimize
from kafka2delta.spark.tables import check_writable, table_stats
from tests.support.harness import BackgroundProducer, Daemon, Setup, assert_exactly_once, wait_for

pytestmark = pytest.mark.integration


def test_compaction_200_small_files_while_the_daemon_appends(
    spark: Any, setup_factory: Callable[..., Setup], daemon_factory: Callable[..., Daemon]
) -> None:
    # 4 partitions x 500 events, a commit every 10 messages of a partition: ~200 small files.
    setup = setup_factory(4, max_messages_per_file=10, allowed_latency_s=30.0)
    produced = setup.topic.produce(500)
    assert daemon_factory(setup, "--until-caught-up").wait(180) == 0
    before = table_stats(setup.table_uri)
    assert before.files >= 200 and before.rows == 2000

    # The daemon keeps ingesting (small files) while the 200 files are compacted: the producer spreads 300
    # events per partition over more than OPTIMIZE's run, and the daemon commits every 10 of a partition.
    daemon = daemon_factory(setup)
    producer = BackgroundProducer(setup.topic, 300, start=500, chunk=10, pause_s=0.6)
    target = max(before.bytes // 4, 64 * 1024)
    report = optimize(spark, setup.table_uri, target_file_size=target)
    produced += producer.join()
    wait_for(lambda: len(setup.ids()) >= len(produced), 120, "the daemon to ingest everything")
    assert daemon.stop() == 0
    print(f"\ncompaction: {report.text()}")

    # Delta's commit info: OPTIMIZE read version r and committed as version c; the versions between are the
    # daemon's appends that landed while it ran (nobody else writes this table), and neither side conflicted.
    read, commit = report.details["read_version"], report.details["commit_version"]
    assert read >= before.version and commit > read + 1, report.text()
    assert report.details["concurrent_commits"] == commit - read - 1
    removed, added = report.details["files_removed"], report.details["files_added"]
    assert removed >= before.files  # every small file of the snapshot it read
    # Delta bins the input files by size: one output file per target_file_size of input.
    assert 1 <= added <= math.ceil(report.details["bytes_removed"] / target) + 1, report.text()
    assert added <= 8
    assert_exactly_once(setup, produced)  # same row set, plus the rows appended meanwhile
    log = daemon.log()
    assert not re.search(r"conflict|CommitFailed", log, re.IGNORECASE), log[-3000:]
    check_writable(setup.table_uri)

    # And afterwards: the daemon appends to the compacted table.
    produced += setup.topic.produce(50, start=800)
    assert daemon_factory(setup, "--until-caught-up").wait(120) == 0
    assert_exactly_once(setup, produced)
