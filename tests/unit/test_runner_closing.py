"""Tables no assigned partition writes any longer (a topic deleted, its partitions moved to another daemon) are
closed after ``ingest.unused_table_close_s``, with their status rows and metrics series; a partition assigned again
reopens its table from the log. Real local Delta tables, an in-memory source and a hand-set clock."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from kafka2delta.config import Config
from kafka2delta.edges import RebalanceListener
from kafka2delta.metrics import Metrics
from kafka2delta.records import ConsumedBatch, TopicPartition
from tests.support.runner import TopicsSource, daemon_loop, docs, ids, messages_of, tables_config

A0, B0 = TopicPartition("a", 0), TopicPartition("b", 0)


class ScriptedSource(TopicsSource):
    """A TopicsSource whose consume calls first run ``steps`` (rebalance callbacks run inside consume), each given
    the listener; every consume moves the clock ``now`` on 10 s."""

    def __init__(
        self,
        steps: list[Callable[[RebalanceListener], ConsumedBatch]],
        highs: dict[TopicPartition, int],
        now: list[float],
    ) -> None:
        super().__init__([], highs)
        self.steps, self.now = steps, now
        self.listener: RebalanceListener | None = None

    def start(self, listener: RebalanceListener) -> None:
        self.listener = listener
        super().start(listener)

    def consume(self, max_messages: int, timeout: float) -> ConsumedBatch:
        self.now[0] += 10
        if not self.steps:
            return super().consume(max_messages, timeout)
        assert self.listener is not None
        return self.steps.pop(0)(self.listener)


def series(metrics: Metrics, label: str, value: str) -> list[str]:
    """The names of the samples labelled ``label=value``."""
    return [s.name for m in metrics.registry.collect() for s in m.samples if s.labels.get(label) == value]


def b_moves_away_and_back(
    cfg: Config, names: tuple[str, str], caplog: pytest.LogCaptureFixture
) -> tuple[dict[str, Any], Metrics]:
    """Topics a and b ingested; then b's partition is revoked (deleted, or moved to another daemon), the clock runs
    on 10 s a consume, and it is assigned again. ``seen`` holds, at 10 s and 40 s after the revoke and once b is back:
    the status page's tables, the series labelled with each table name of ``names`` (a's, b's), and topic b's."""
    seen: dict[str, Any] = {}

    def first(listener: RebalanceListener) -> ConsumedBatch:
        both = messages_of(A0, 0, docs("a0-", 0, 4))
        both.partitions.update(messages_of(B0, 0, docs("b0-", 0, 4)).partitions)
        return both

    def revoke_b(listener: RebalanceListener) -> ConsumedBatch:
        listener.revoked([B0])  # commits what b0 holds
        return ConsumedBatch()

    def look(when: str) -> Callable[[RebalanceListener], ConsumedBatch]:
        def step(listener: RebalanceListener) -> ConsumedBatch:
            seen[when] = (
                sorted(t.name for t in ingestor.status().tables),
                series(metrics, "table", names[1]),
                series(metrics, "topic", "b"),
                series(metrics, "table", names[0]),
            )
            return ConsumedBatch()

        return step

    def assign_b(listener: RebalanceListener) -> ConsumedBatch:
        seen["start"] = listener.assigned([B0])[B0]
        return messages_of(B0, 2, docs("b0-", 2, 4))  # a replayed fetch: offsets 2 and 3 are in the table

    def empty(listener: RebalanceListener) -> ConsumedBatch:
        return ConsumedBatch()

    def last_of_a(listener: RebalanceListener) -> ConsumedBatch:
        return messages_of(A0, 4, docs("a0-", 4, 1))

    now = [0.0]
    steps = [first, revoke_b, look("before"), empty, empty, look("after"), assign_b, look("reopened"), last_of_a]
    source = ScriptedSource(steps, {A0: 5, B0: 6}, now)  # a0 not caught up before the last step
    ingestor, metrics = daemon_loop(cfg, source, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="kafka2delta.tables"):
        ingestor.run(until_caught_up=True)
    return seen, metrics


def test_a_table_no_assigned_partition_writes_is_closed_and_reopened_from_its_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Topic b's partition goes away: 30 s later its table is closed, its status row and its and its topic's metrics
    series gone; assigned again, it resumes after its txn, nothing written twice."""
    cfg = tables_config(
        tmp_path,
        K2D_KAFKA__TOPICS="a,b",
        K2D_TABLE__URI=str(tmp_path / "{topic}"),
        K2D_INGEST__UNUSED_TABLE_CLOSE_S="30",
    )
    table_a, table_b = str(tmp_path / "a"), str(tmp_path / "b")
    seen, metrics = b_moves_away_and_back(cfg, (table_a, table_b), caplog)

    tables_before, b_series_before, _, a_series = seen["before"]  # 10 s after the revoke: still open
    assert tables_before == [table_a, table_b] and "kafka2delta_rows_written_total" in b_series_before
    assert seen["after"] == ([table_a], [], [], a_series)  # 40 s after: closed, a untouched
    assert "kafka2delta_rows_written_total" in a_series
    assert f"closed table {table_b}: no assigned partition has written it for 30 s" in caplog.text
    assert "released topics b" in caplog.text
    assert seen["start"] == 4
    tables_reopened, b_series_reopened, *_ = seen["reopened"]
    assert tables_reopened == [table_a, table_b]
    assert b_series_reopened == []  # nothing committed to b yet at that step
    assert ids(tmp_path / "b") == [f"b0-{o}" for o in range(6)]
    assert DeltaTable(table_b).transaction_version("b-0") == 5
    labels = {"topic": "b", "partition": "0", "table": table_b}
    assert metrics.registry.get_sample_value("kafka2delta_rows_written_total", labels) == 2  # from 0 again


def test_closing_one_table_of_a_named_route_keeps_the_series_its_other_tables_share(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by review: a route's name labels every table its {topic} URI makes, and closing b's table removed the
    status row and the table series of a's, which stays open."""
    route = {"name": "events", "topic_pattern": "^[ab]$", "uri": str(tmp_path / "{topic}")}
    cfg = tables_config(
        tmp_path, K2D_KAFKA__TOPICS="a,b", K2D_ROUTES=json.dumps([route]), K2D_INGEST__UNUSED_TABLE_CLOSE_S="30"
    )
    seen, _ = b_moves_away_and_back(cfg, ("events", "events"), caplog)

    tables_after, events_series, b_series, _ = seen["after"]
    assert tables_after == ["events"] and b_series == []
    assert "kafka2delta_last_committed_version" in events_series and "kafka2delta_commits_total" in events_series
    assert f"closed table events ({tmp_path / 'b'}): no assigned partition" in caplog.text
    assert ids(tmp_path / "b") == [f"b0-{o}" for o in range(6)]
