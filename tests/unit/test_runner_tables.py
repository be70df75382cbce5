"""The loop writing several tables (routing by topic): each table exact with its own txns, one table's
failure leaving the others committed, tables created on first use, and a table of today's one-topic
configuration that more topics join without a migration. Real local Delta tables, an in-memory source."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, Field, write_deltalake
from deltalake.exceptions import TableNotFoundError
from deltalake.schema import PrimitiveType

from kafka2delta import positions, verify
from kafka2delta.cli import build_pipeline, open_table, open_table_writer
from kafka2delta.config import Config, load_config
from kafka2delta.dead_letters import DeadLetterTable
from kafka2delta.deferred_tables import DeferredTable
from kafka2delta.edges import RebalanceListener
from kafka2delta.errors import ConfigError, FatalError, SchemaChanged
from kafka2delta.offsets import LogicalOffset, TxnIds
from kafka2delta.records import ConsumedBatch, TopicPartition
from kafka2delta.routing import Routes, TableSpec
from kafka2delta.tables import OpenedTable
from tests.support.runner import (
    LogSource,
    TopicsSource,
    daemon_loop,
    docs,
    expression_config,
    ids,
    ingest_until_caught_up,
    messages_of,
    tables_config,
)
from tests.support.verify_consumer import serve_topics

A0, A1, B0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)


def batches() -> list[ConsumedBatch]:
    return [
        messages_of(A0, 0, docs("a0-", 0, 5)),
        messages_of(B0, 0, docs("b0-", 0, 3)),
        messages_of(A1, 0, docs("a1-", 0, 2)),
    ]


def test_each_topic_goes_to_its_table_exactly_once(tmp_path: Path) -> None:
    cfg = tables_config(tmp_path, K2D_KAFKA__TOPICS="a,b", K2D_TABLE__URI=str(tmp_path / "{topic}"))
    source = TopicsSource(batches(), {A0: 5, A1: 2, B0: 3})
    metrics = ingest_until_caught_up(cfg, source)

    assert ids(tmp_path / "a") == sorted([*(f"a0-{o}" for o in range(5)), "a1-0", "a1-1"])
    assert ids(tmp_path / "b") == ["b0-0", "b0-1", "b0-2"]
    a, b = DeltaTable(str(tmp_path / "a")), DeltaTable(str(tmp_path / "b"))
    assert (a.transaction_version("a-0"), a.transaction_version("a-1"), b.transaction_version("b-0")) == (4, 1, 2)
    assert b.transaction_version("a-0") is None  # a table holds only its own topics' txns
    assert source.group_offsets == {A0: 5, A1: 2, B0: 3}
    table_b = str(tmp_path / "b")
    assert (
        metrics.registry.get_sample_value(
            "kafka2delta_rows_written_total", {"topic": "b", "partition": "0", "table": table_b}
        )
        == 3
    )
    commits = DeltaTable(str(tmp_path / "a")).history()
    assert {"a": {"0": [0, 4], "1": [0, 1]}} in [c.get("kafka2delta", {}).get("topics") for c in commits]


def test_one_tables_failure_leaves_the_others_committed_and_a_restart_exact(tmp_path: Path) -> None:
    """Table b's commit fails for good (the daemon stops) after table a committed: a crash between two tables'
    commits. The restart replays from each table's own txns: a is not written twice, b gets its rows."""
    cfg = tables_config(tmp_path, K2D_KAFKA__TOPICS="a,b", K2D_TABLE__URI=str(tmp_path / "{topic}"))

    def failing_b(spec: TableSpec) -> OpenedTable:
        opened = open_table(cfg, spec)
        if spec.uri.endswith("/b"):

            def refuse(*args: Any) -> int:
                raise FatalError("the storage of b refuses every commit")

            opened.writer.commit = refuse  # type: ignore[method-assign,assignment]
        return opened

    with pytest.raises(FatalError):
        ingest_until_caught_up(cfg, TopicsSource(batches(), {A0: 5, A1: 2, B0: 3}), failing_b)
    assert len(ids(tmp_path / "a")) == 7 and ids(tmp_path / "b") == []

    source = TopicsSource(batches(), {A0: 5, A1: 2, B0: 3})  # the broker serves everything again
    ingest_until_caught_up(cfg, source)
    assert source.starts == {A0: 5, A1: 2, B0: source.starts[B0]}  # a resumes after its txns, b from the start
    assert len(ids(tmp_path / "a")) == 7  # nothing twice
    assert ids(tmp_path / "b") == ["b0-0", "b0-1", "b0-2"]


def test_a_table_without_schema_is_created_from_its_first_rows(tmp_path: Path) -> None:
    free = tmp_path / "free"
    cfg = load_config(
        None,
        environ={
            "K2D_KAFKA__BOOTSTRAP_SERVERS": "unused:1",
            "K2D_KAFKA__TOPICS": "b",
            "K2D_DEAD_LETTERS__TABLE_URI": str(tmp_path / "dlq"),
            "K2D_ROUTES": f'[{{"name": "free", "topic": "b", "uri": "{free}", "schema_evolution": "merge",'
            ' "metadata_columns": ["partition", "offset"]}]',
        },
    )
    documents = [{"id": "x", "n": 1, "tags": ["p", "q"]}, {"id": "y", "n": 2}]
    ingest_until_caught_up(cfg, TopicsSource([messages_of(B0, 0, documents)], {B0: 2}))
    table = DeltaTable(str(free))
    assert set(table.schema().to_arrow().names) == {"id", "n", "tags", "kafka_partition", "kafka_offset"}
    assert sorted(table.to_pyarrow_table().column("n").to_pylist()) == [1, 2]
    assert table.transaction_version("b-0") == 1


def schemaless_config(tmp_path: Path, topic: str, **env: str) -> Config:
    """``topic`` into ``<tmp_path>/free``, a table with no schema (created from its first rows), dead letters in
    ``<tmp_path>/dlq``; ``env`` adds settings."""
    return load_config(
        None,
        environ={
            "K2D_KAFKA__BOOTSTRAP_SERVERS": "unused:1",
            "K2D_KAFKA__TOPIC": topic,
            "K2D_TABLE__URI": str(tmp_path / "free"),
            "K2D_TABLE__SCHEMA_EVOLUTION": "merge",
            "K2D_DEAD_LETTERS__TABLE_URI": str(tmp_path / "dlq"),
            **env,
        },
    )


def test_values_without_fields_before_the_table_has_a_column_are_dead_letters(tmp_path: Path) -> None:
    """Found by review: ``{}`` while a new table has no column yet is no row Arrow or Delta can hold; it was
    neither a row, a dead letter nor a counted skip. Once a column exists, ``{}`` is a row of nulls."""
    uri = tmp_path / "free"
    cfg = schemaless_config(tmp_path, "b")
    metrics = ingest_until_caught_up(cfg, TopicsSource([messages_of(B0, 0, [{}, {}])], {B0: 2}))
    assert not (uri / "_delta_log").exists()
    # No main commit (no row to create the table from), yet the dead letters are final: counted.
    dead = {"topic": "b", "stage": "coerce"}
    assert metrics.registry.get_sample_value("kafka2delta_messages_dead_lettered_total", dead) == 2
    letters = DeltaTable(str(tmp_path / "dlq")).to_pyarrow_table().to_pylist()
    assert [(r["offset"], r["stage"], r["error"]) for r in letters] == [
        (offset, "coerce", "no column yet: the table has none and the value no field with a value to add one")
        for offset in (0, 1)
    ]
    ingest_until_caught_up(cfg, TopicsSource([messages_of(B0, 2, [{"n": 1}, {}])], {B0: 4}))
    table = DeltaTable(str(uri))
    assert table.to_pyarrow_table().to_pylist() == [{"n": 1}, {"n": None}]
    assert table.transaction_version("b-0") == 3
    assert DeltaTable(str(tmp_path / "dlq")).to_pyarrow_table().num_rows == 2


def test_a_resync_before_anything_is_held_reads_again_from_where_the_partition_began(tmp_path: Path) -> None:
    """Found by review: with ``auto_offset_reset = latest``, a resync before any table held the partition (here
    another daemon makes our table first: a schema change at our first commit) sought to the end of the partition,
    and the messages taken since the assignment were never written. It reads again from where reading began."""
    uri = tmp_path / "free"
    cfg = schemaless_config(tmp_path, "t", K2D_KAFKA__AUTO_OFFSET_RESET="latest")

    class MessagesAfterTheAssignment(LogSource):
        """Empty when assigned (latest: offset 0); then two messages, and the other daemon's table right after."""

        def start(self, listener: RebalanceListener) -> None:
            self.high = 0
            super().start(listener)

        def consume(self, max_messages: int, timeout: float) -> ConsumedBatch:
            batch = super().consume(max_messages, timeout)
            if self.position == 2 and not (uri / "_delta_log").exists():
                write_deltalake(str(uri), pa.table({"n": pa.array([7], pa.int64())}))
            return batch

    source = MessagesAfterTheAssignment([b'{"n": 1}', b'{"n": 2}'], latest=0)  # latest: the end when assigned
    ingest_until_caught_up(cfg, source)
    assert source.seeks == [(0, 0)]  # where it began, not "latest"
    assert sorted(DeltaTable(str(uri)).to_pyarrow_table().column("n").to_pylist()) == [1, 2, 7]


def test_latest_starts_where_the_assignment_read_the_end_not_where_the_broker_is_at_the_first_fetch(
    tmp_path: Path,
) -> None:
    """Found by review: with ``auto_offset_reset = latest`` and no table holding the partition, the consumer was
    given "latest", which the broker resolves when it first fetches; the start marks and the lag count from the end
    read at the assignment. Messages in between were read by no table, but a restart after a crash between two
    tables' commits read them for the one marked (at the earlier end), and the other had passed them: they start at
    the end read, as an offset."""
    uri = tmp_path / "free"
    cfg = schemaless_config(tmp_path, "t", K2D_KAFKA__AUTO_OFFSET_RESET="latest")

    class MessagesBeforeTheFirstFetch(LogSource):
        """Empty when assigned; two messages by the time the consumer first fetches."""

        def start(self, listener: RebalanceListener) -> None:
            self.high = 0
            super().start(listener)

    source = MessagesBeforeTheFirstFetch([b'{"n": 1}', b'{"n": 2}'], latest=2)  # the end at the first fetch
    ingest_until_caught_up(cfg, source)
    assert source.starts == {0: 0}
    assert sorted(DeltaTable(str(uri)).to_pyarrow_table().column("n").to_pylist()) == [1, 2]


def test_a_latest_start_the_broker_lost_before_the_first_fetch_is_out_of_range(tmp_path: Path) -> None:
    """Found by review: the start given at the assignment (the end read then) was not what the out-of-range report
    was checked against (nothing was taken yet): "latest" again, logged at INFO, not counted."""
    cfg = schemaless_config(tmp_path, "t", K2D_KAFKA__AUTO_OFFSET_RESET="latest")

    class TruncatedBeforeTheFirstFetch(LogSource):
        """Five messages when assigned; then the log is cut back to two (an unclean leader election)."""

        def consume(self, max_messages: int, timeout: float) -> ConsumedBatch:
            if self.high == 5:
                self.high = 2
                return ConsumedBatch(out_of_range=[self.tp(0)])
            return super().consume(max_messages, timeout)

    source = TruncatedBeforeTheFirstFetch([b'{"n": 1}'] * 5, latest=5)
    with pytest.raises(FatalError, match=r"next offset 5 is outside the broker's range \[0, 2\]"):
        ingest_until_caught_up(cfg, source)
    assert source.starts == {0: 5}
    # With a policy that goes on: counted, and read from where the policy says.
    jumping = schemaless_config(
        tmp_path / "jump", "t", K2D_KAFKA__AUTO_OFFSET_RESET="latest", K2D_KAFKA__MISSING_OFFSET_POLICY="earliest"
    )
    metrics = ingest_until_caught_up(jumping, TruncatedBeforeTheFirstFetch([b'{"n": 1}'] * 5, latest=5))
    counted = {"topic": "t", "partition": "0"}
    assert metrics.registry.get_sample_value("kafka2delta_offsets_out_of_range_total", counted) == 1
    assert DeltaTable(str(tmp_path / "jump" / "free")).to_pyarrow_table().num_rows == 5  # from offset 0


def test_an_earliest_start_retention_took_before_the_first_fetch_reads_on_from_the_earliest_left(
    tmp_path: Path,
) -> None:
    """Found by review of the fix above: the start given at the assignment stands for an out-of-range report only
    from latest; from earliest the report reads on from what retention left, as before."""
    cfg = schemaless_config(tmp_path, "t")

    class RetentionBeforeTheFirstFetch(LogSource):
        low = 0

        def consume(self, max_messages: int, timeout: float) -> ConsumedBatch:
            if self.low == 0:
                self.low = 2
                return ConsumedBatch(out_of_range=[self.tp(0)])
            return super().consume(max_messages, timeout)

        def watermarks(self, tp: TopicPartition, cached: bool = False) -> tuple[int, int]:
            return self.low, self.high

        def seek(self, tp: TopicPartition, start: int | LogicalOffset) -> None:
            super().seek(tp, start)
            self.position = max(self.position, self.low)

    ingest_until_caught_up(cfg, RetentionBeforeTheFirstFetch([b'{"n": %d}' % n for n in range(5)]))
    assert sorted(DeltaTable(str(tmp_path / "free")).to_pyarrow_table().column("n").to_pylist()) == [2, 3, 4]


def test_a_mark_held_back_by_its_interval_is_written_at_the_stop(tmp_path: Path) -> None:
    """Found by review: the second flush's end, within the minute of the first mark, was never marked; the restart
    read it again, or refused to start once retention had passed the old mark."""
    uri = tmp_path / "free"
    cfg = schemaless_config(tmp_path, "t", K2D_INGEST__MAX_MESSAGES_PER_FILE="3")
    ingest_until_caught_up(cfg, LogSource([b"x{"] * 6, chunk=3))
    prefix = Routes(cfg).dead_letter_txn_ids("t").prefix
    letters = DeadLetterTable.open(str(tmp_path / "dlq"), {}, prefix, "snappy", 10)
    assert letters.start_marks(str(uri), [TopicPartition("t", 0)]) == {TopicPartition("t", 0): 5}


def test_a_crash_between_the_dead_letters_and_the_mark_of_a_table_not_made_yet_reads_on_from_the_last_mark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DESIGN.md's crash table: the flush's dead letters committed, its mark not; the restart reads on from the
    previous mark, recognises the dead letters recorded since, and writes each message once."""
    monkeypatch.setattr(positions, "UNMADE_MARK_INTERVAL_S", 0.0)
    cfg = schemaless_config(tmp_path, "t", K2D_INGEST__MAX_MESSAGES_PER_FILE="3")
    log = [b"x{", b"", b"x{", b"x{", b"x{", b"", b'{"n": 1}', b"x{"]
    written = DeadLetterTable.mark_starts
    marks = []

    def killed_at_the_second(self: DeadLetterTable, table: str, starts: Mapping[TopicPartition, int]) -> int:
        marks.append(dict(starts))
        if len(marks) == 2:
            raise KeyboardInterrupt  # a kill: nothing after it runs
        return written(self, table, starts)

    monkeypatch.setattr(DeadLetterTable, "mark_starts", killed_at_the_second)
    with pytest.raises(KeyboardInterrupt):
        ingest_until_caught_up(cfg, LogSource(log[:6], chunk=3))
    monkeypatch.setattr(DeadLetterTable, "mark_starts", written)
    restarted = LogSource(log, chunk=3)
    metrics = ingest_until_caught_up(cfg, restarted)
    assert marks[0] == {TopicPartition("t", 0): 2} and restarted.starts == {0: 3}  # the first mark
    assert sorted(DeltaTable(str(tmp_path / "dlq")).to_pyarrow_table().column("offset").to_pylist()) == [0, 2, 3, 4, 7]
    assert DeltaTable(str(tmp_path / "free")).to_pyarrow_table().column("n").to_pylist() == [1]
    recorded = {"topic": "t", "partition": "0", "reason": "dead_letter_recorded"}
    assert metrics.registry.get_sample_value("kafka2delta_messages_skipped_total", recorded) == 2  # 3 and 4


def test_dead_letters_counted_before_the_table_existed_are_not_counted_again_by_a_replay(tmp_path: Path) -> None:
    """Found by review: dead letters recorded while a table could not be created yet are counted at once (they are
    final); another writer then creating the table makes our commit a schema change, whose replay takes them as
    recorded: counted a second time, as skips, before this."""
    uri = tmp_path / "free"
    cfg = schemaless_config(tmp_path, "t", K2D_INGEST__ALLOWED_LATENCY_S="0.001")

    class AnotherWriterCreatesTheTable(LogSource):
        """Holds offsets 2 and 3 back until the first flush has recorded its dead letters, then creates the table."""

        def consume(self, max_messages: int, timeout: float) -> ConsumedBatch:
            if self.position == 2 and not (uri / "_delta_log").exists():
                if not (tmp_path / "dlq" / "_delta_log" / "00000000000000000001.json").exists():
                    return ConsumedBatch()  # the first flush has not committed its dead letters yet (0 is creation)
                write_deltalake(str(uri), pa.table({"n": pa.array([7], pa.int64())}))
            return super().consume(max_messages, timeout)

    source = AnotherWriterCreatesTheTable([b"{}", b"{}", b'{"n": 1}', b'{"n": 2}'], chunk=2)
    metrics = ingest_until_caught_up(cfg, source)
    assert source.seeks  # the schema change made it read the partition again
    assert sorted(DeltaTable(str(uri)).to_pyarrow_table().column("n").to_pylist()) == [1, 2, 7]
    dead = {"topic": "t", "stage": "coerce"}
    assert metrics.registry.get_sample_value("kafka2delta_messages_dead_lettered_total", dead) == 2
    recorded = {"topic": "t", "partition": "0", "reason": "dead_letter_recorded"}
    assert not metrics.registry.get_sample_value("kafka2delta_messages_skipped_total", recorded)


def test_a_partition_whose_table_is_not_made_yet_is_marked_where_its_dead_letters_end(tmp_path: Path) -> None:
    """Found by review: a table made by its first rows whose messages were all dead letters so far recorded nothing
    but its dead letters: each restart read the partition again from auto_offset_reset (every recorded dead letter
    loaded, each counted again as a skip). The flush that could not make the table marks where the partition is
    held up to, in the dead-letter table, as a table of [routing] expression; its first rows retire the mark."""
    uri = tmp_path / "free"
    cfg = schemaless_config(tmp_path, "t")
    ingest_until_caught_up(cfg, LogSource([b"{}", b"{}", b"{}"]))
    assert not (uri / "_delta_log").exists()

    def mark() -> int | None:
        prefix = Routes(cfg).dead_letter_txn_ids("t").prefix
        letters = DeadLetterTable.open(str(tmp_path / "dlq"), {}, prefix, "snappy", 10)
        return letters.start_marks(str(uri), [TopicPartition("t", 0)])[TopicPartition("t", 0)]

    assert mark() == 2
    restarted = LogSource([b"{}", b"{}", b"{}", b'{"n": 1}'])
    metrics = ingest_until_caught_up(cfg, restarted)
    assert restarted.starts == {0: 3}  # after the mark, not from auto_offset_reset
    recorded = {"topic": "t", "partition": "0", "reason": "dead_letter_recorded"}
    assert not metrics.registry.get_sample_value("kafka2delta_messages_skipped_total", recorded)
    assert DeltaTable(str(uri)).to_pyarrow_table().column("n").to_pylist() == [1]
    assert DeltaTable(str(tmp_path / "dlq")).to_pyarrow_table().column("offset").to_pylist() == [0, 1, 2]
    assert mark() is None  # retired: the table holds a txn of its own


def test_a_json_table_without_schema_needs_merge(tmp_path: Path) -> None:
    cfg = load_config(
        None,
        environ={
            "K2D_KAFKA__BOOTSTRAP_SERVERS": "unused:1",
            "K2D_KAFKA__TOPICS": "b",
            "K2D_DEAD_LETTERS__TABLE_URI": str(tmp_path / "dlq"),
            "K2D_ROUTES": f'[{{"topic": "b", "uri": "{tmp_path / "free"}"}}]',
        },
    )
    with pytest.raises(Exception, match=r"routes\[0\]\.schema"):
        ingest_until_caught_up(cfg, TopicsSource([messages_of(B0, 0, [{"id": "x"}])], {B0: 1}))


def test_a_one_topic_table_keeps_ingesting_when_more_topics_join_it(tmp_path: Path) -> None:
    """Yesterday: topic a alone into /all with app id shop (txn shop-0). Today: topics a and b into /all."""
    uri = str(tmp_path / "all")
    yesterday = tables_config(tmp_path, K2D_KAFKA__TOPIC="a", K2D_TABLE__URI=uri, K2D_TABLE__APP_ID="shop")
    ingest_until_caught_up(yesterday, TopicsSource([messages_of(A0, 0, docs("a0-", 0, 4))], {A0: 4}))
    assert DeltaTable(uri).transaction_version("shop-0") == 3

    today = tables_config(tmp_path, K2D_KAFKA__TOPICS="a,b", K2D_TABLE__URI=uri, K2D_TABLE__APP_ID="shop")
    source = TopicsSource(
        [messages_of(A0, 0, docs("a0-", 0, 6)), messages_of(B0, 0, docs("b0-", 0, 2))], {A0: 6, B0: 2}
    )
    ingest_until_caught_up(today, source)
    assert source.starts[A0] == 4  # after yesterday's txn shop-0, no migration step
    assert ids(tmp_path / "all") == sorted([*(f"a0-{o}" for o in range(6)), "b0-0", "b0-1"])
    table = DeltaTable(uri)
    assert (table.transaction_version("shop-a-0"), table.transaction_version("shop-b-0")) == (5, 1)


# --- [routing] expression: one partition's messages split across tables ------------------------------


E0 = TopicPartition("e", 0)


def events() -> list[dict[str, Any]]:
    kinds = ["clicks", "clicks", "orders", "refunds", None, "clicks", "clicks"]
    return [{"id": f"e{offset}", **({"kind": kind} if kind else {})} for offset, kind in enumerate(kinds)]


def dead_letters(tmp_path: Path) -> list[dict[str, Any]]:
    rows = DeltaTable(str(tmp_path / "dlq")).to_pyarrow_table().to_pylist()
    return sorted(rows, key=lambda row: row["offset"])


def test_an_expression_splits_a_partition_across_tables(tmp_path: Path) -> None:
    source = TopicsSource([messages_of(E0, 0, events()[:3]), messages_of(E0, 3, events()[3:])], {E0: 7})
    metrics = ingest_until_caught_up(expression_config(tmp_path), source)

    assert ids(tmp_path / "clicks") == ["e0", "e1", "e5", "e6"]
    assert ids(tmp_path / "orders") == ["e2"]
    # Both tables' txns reach the partition's last offset, though the second piece had no order.
    clicks, orders = DeltaTable(str(tmp_path / "clicks")), DeltaTable(str(tmp_path / "orders"))
    assert (clicks.transaction_version("e-0"), orders.transaction_version("e-0")) == (6, 6)
    letters = dead_letters(tmp_path)
    assert [(row["offset"], row["stage"]) for row in letters] == [(3, "route"), (4, "route")]
    assert "no route named 'refunds'" in letters[0]["error"] and "clicks, orders" in letters[0]["error"]
    assert letters[1]["error"] == "the route expression gave no value"
    assert metrics.registry.get_sample_value("kafka2delta_messages_failed_total", {"topic": "e", "stage": "route"}) == 2
    assert source.group_offsets == {E0: 7}


def test_a_table_a_partition_sends_no_row_gets_no_rows_written_series_for_it(tmp_path: Path) -> None:
    """Every table gets a lane for every piece, so its txn moves; found by review: its empty lanes made a
    rows_written series at 0 for every partition × table."""
    e1 = TopicPartition("e", 1)
    source = TopicsSource([messages_of(E0, 0, events()[:3]), messages_of(e1, 0, events()[:2])], {E0: 3, e1: 2})
    metrics = ingest_until_caught_up(expression_config(tmp_path), source)

    assert DeltaTable(str(tmp_path / "orders")).transaction_version("e-1") == 1  # its empty lane committed

    def rows(partition: int, table: str) -> float | None:
        labels = {"topic": "e", "partition": str(partition), "table": table}
        return metrics.registry.get_sample_value("kafka2delta_rows_written_total", labels)

    assert (rows(0, "clicks"), rows(0, "orders"), rows(1, "clicks"), rows(1, "orders")) == (2, 1, 2, None)


def test_a_crash_between_two_tables_commits_of_one_partition_leaves_each_exact(tmp_path: Path) -> None:
    """orders refuses its commit after clicks committed the same partition's offsets: the restart reads again
    from orders' version; clicks drops what it holds, orders takes its rows, nothing is a dead letter twice."""
    cfg = expression_config(tmp_path)

    def failing_orders(spec: TableSpec) -> OpenedTable:
        opened = open_table(cfg, spec)
        if spec.uri.endswith("/orders"):

            def refuse(*args: Any) -> int:
                raise FatalError("the storage of orders refuses every commit")

            opened.writer.commit = refuse  # type: ignore[method-assign,assignment]
        return opened

    first = [messages_of(E0, 0, events()[:3])]  # orders gets one row: its first commit goes first
    ingest_until_caught_up(cfg, TopicsSource(first, {E0: 3}))
    assert ids(tmp_path / "orders") == ["e2"]
    with pytest.raises(FatalError):
        ingest_until_caught_up(
            cfg,
            TopicsSource([messages_of(E0, 3, [*events()[3:], {"id": "e7", "kind": "orders"}])], {E0: 8}),
            failing_orders,
        )
    clicks = DeltaTable(str(tmp_path / "clicks"))
    assert (clicks.transaction_version("e-0"), DeltaTable(str(tmp_path / "orders")).transaction_version("e-0")) == (
        7,
        2,
    )

    source = TopicsSource([messages_of(E0, 0, [*events(), {"id": "e7", "kind": "orders"}])], {E0: 8})
    ingest_until_caught_up(cfg, source)
    assert source.starts == {E0: 3}  # the lower version + 1
    assert ids(tmp_path / "clicks") == ["e0", "e1", "e5", "e6"]  # nothing twice
    assert ids(tmp_path / "orders") == ["e2", "e7"]
    assert [(row["offset"], row["stage"]) for row in dead_letters(tmp_path)] == [(3, "route"), (4, "route")]


def schemaless_routes_config(tmp_path: Path, **env: str) -> Config:
    """Topic ``e`` split by ``kind`` into ``clicks`` and ``orders``, tables with no schema (made by their first rows)."""
    routes = [{"name": "clicks", "uri": str(tmp_path / "clicks")}, {"name": "orders", "uri": str(tmp_path / "orders")}]
    return tables_config(
        tmp_path,
        K2D_TABLE__SCHEMA="{}",
        K2D_TABLE__SCHEMA_EVOLUTION="merge",
        K2D_KAFKA__TOPIC="e",
        K2D_ROUTES=json.dumps(routes),
        K2D_ROUTING__EXPRESSION="kind",
        **env,
    )


def start_marks(tmp_path: Path) -> dict[str, int | None]:
    """The start marks of partition e-0 in clicks and orders, as the dead-letter table holds them."""
    letters = DeadLetterTable.open(str(tmp_path / "dlq"), {}, TxnIds().prefix, "snappy", 10)
    return {name: letters.start_marks(str(tmp_path / name), [E0])[E0] for name in ("clicks", "orders")}


def refusing_orders_rows(cfg: Config) -> Callable[[TableSpec], OpenedTable]:
    """The daemon's tables, orders refusing every commit with rows (a crash there)."""

    def opener(spec: TableSpec) -> OpenedTable:
        opened = open_table(cfg, spec)
        if spec.uri.endswith("/orders"):
            empty_commit = opened.writer.commit  # the start commit's (refused: the table does not exist)

            def refuse(actions: Any, *args: Any) -> int:
                if not actions:
                    return empty_commit(actions, *args)
                raise FatalError("the storage of orders refuses its first rows")

            opened.writer.commit = refuse  # type: ignore[method-assign,assignment]
            opened.writer.commit_evolution = refuse  # type: ignore[method-assign,assignment]
        return opened

    return opener


def crash_before_the_orders_first_commit(tmp_path: Path, cfg: Config) -> None:
    """Run ``events()`` through ``cfg`` until orders refuses its first rows (after clicks committed)."""
    with pytest.raises(FatalError):
        ingest_until_caught_up(cfg, TopicsSource([messages_of(E0, 0, events())], {E0: 7}), refusing_orders_rows(cfg))
    assert DeltaTable(str(tmp_path / "clicks")).transaction_version("e-0") == 6 and not (tmp_path / "orders").exists()


def test_a_crash_between_the_first_commits_of_two_tables_made_from_their_rows_leaves_each_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Neither table has a schema, so neither exists before its first rows and neither can take the empty commit
    that marks where the partition starts in it. The flush that commits both first marks the second in the
    dead-letter table; clicks is made and orders' first commit fails: the restart reads from orders' mark, and
    orders gets its row (before the marks, orders was taken for a route added since and e2 was lost)."""
    cfg = schemaless_routes_config(tmp_path)
    crash_before_the_orders_first_commit(tmp_path, cfg)
    orders = hashlib.sha256(str(tmp_path / "orders").encode()).hexdigest()[:12]
    assert DeltaTable(str(tmp_path / "dlq")).transaction_version(f"e-e-start-{orders}-0") == -1  # before offset 0
    assert start_marks(tmp_path) == {"clicks": None, "orders": -1}  # the first committed needs none
    # verify takes orders' rows for pending (the restart writes them), not lost: it reads the marks too.
    serve_topics(monkeypatch, {"e": {0: [(o, json.dumps(d).encode(), None) for o, d in enumerate(events())]}})
    [report] = verify.check(cfg)
    assert isinstance(report, verify.Report) and report.ok, report.render()
    assert [(p.committed, p.pending, p.missing) for p in report.partitions] == [(-1, 7, [])]

    source = TopicsSource([messages_of(E0, 0, events())], {E0: 7})
    ingest_until_caught_up(cfg, source)
    assert source.starts == {E0: 0}  # orders' mark + 1
    assert ids(tmp_path / "clicks") == ["e0", "e1", "e5", "e6"]  # nothing twice
    assert ids(tmp_path / "orders") == ["e2"]
    assert DeltaTable(str(tmp_path / "orders")).transaction_version("e-0") == 6  # its own txn: the mark is moot,
    # and retired in the log (else it came back if the table lost its txn: rebuilt, or its txn expired).
    assert DeltaTable(str(tmp_path / "dlq")).transaction_version(f"e-e-start-{orders}-0") == -2
    assert start_marks(tmp_path) == {"clicks": None, "orders": None}
    assert [(row["offset"], row["stage"]) for row in dead_letters(tmp_path)] == [(3, "route"), (4, "route")]
    again = TopicsSource([], {E0: 7})
    ingest_until_caught_up(cfg, again)
    assert again.starts == {E0: 7}


def test_a_table_made_from_its_rows_that_gets_none_holds_no_partition_back(tmp_path: Path) -> None:
    """Found by review: orders, with no schema, never gets a row. It is never marked (a mark is written only when
    two such tables commit rows of a partition in one flush), so the restart starts after clicks' version and the
    group offsets move on. A mark whose table then gets no row (the replay made its rows dead letters) is retired
    by that flush, or it would hold the partition at it for good."""
    cfg = schemaless_routes_config(tmp_path)
    only_clicks = [{"id": f"e{offset}", "kind": "clicks"} for offset in range(7)]
    first = TopicsSource([messages_of(E0, 0, only_clicks)], {E0: 7})
    ingest_until_caught_up(cfg, first)
    assert first.group_offsets == {E0: 7} and start_marks(tmp_path) == {"clicks": None, "orders": None}
    restart = TopicsSource([], {E0: 7})
    ingest_until_caught_up(cfg, restart)
    assert restart.starts == {E0: 7} and not (tmp_path / "orders").exists()

    other = tmp_path / "retired"
    cfg = schemaless_routes_config(other)
    crash_before_the_orders_first_commit(other, cfg)
    assert start_marks(other)["orders"] == -1
    # The replay finds e2 a refund now (no route: a dead letter): orders' lane has no row, its mark is retired.
    replayed = [{**event, "kind": "refunds"} if event["id"] == "e2" else event for event in events()]
    source = TopicsSource([messages_of(E0, 0, replayed)], {E0: 7})
    ingest_until_caught_up(cfg, source)
    assert source.starts == {E0: 0} and start_marks(other) == {"clicks": None, "orders": None}
    assert ids(other / "clicks") == ["e0", "e1", "e5", "e6"] and not (other / "orders").exists()
    again = TopicsSource([], {E0: 7})
    ingest_until_caught_up(cfg, again)
    assert again.starts == {E0: 7}


def test_a_mark_is_kept_while_the_replay_is_behind_the_other_tables(tmp_path: Path) -> None:
    """Found by review: after the crash, the replay's first flush (files of 2 messages) holds offsets 0-1 only,
    where orders has no row; its mark was retired there, clicks (at 6) then held the partition, and e2 was
    dropped. A mark is retired only once its table's lane has reached every other table's version."""
    crash_before_the_orders_first_commit(tmp_path, schemaless_routes_config(tmp_path))
    cfg = schemaless_routes_config(tmp_path, K2D_INGEST__MAX_MESSAGES_PER_FILE="2")
    replay = TopicsSource([messages_of(E0, 0, events()[:2]), messages_of(E0, 2, events()[2:])], {E0: 7})
    ingest_until_caught_up(cfg, replay)
    assert replay.starts == {E0: 0} and ids(tmp_path / "orders") == ["e2"]
    assert ids(tmp_path / "clicks") == ["e0", "e1", "e5", "e6"]


def test_a_new_tables_rows_after_a_table_with_a_txn_are_marked_too(tmp_path: Path) -> None:
    """Found by review: the flush commits clicks first (it already holds e-0, but not yet e-1), then orders' first
    row o3 of e-0. Only new tables after another new one were marked, so after a crash between the two, e-0
    restarted after clicks' version and o3 was lost. Every new table's rows after any other commit of the
    partition are marked now."""
    cfg = schemaless_routes_config(tmp_path, K2D_INGEST__MAX_MESSAGES_PER_FILE="3")
    E1 = TopicPartition("e", 1)

    def clicks(*offsets: int) -> list[dict[str, Any]]:
        return [{"id": f"c{offset}", "kind": "clicks"} for offset in offsets]

    second = messages_of(E0, 3, [{"id": "o3", "kind": "orders"}, *clicks(4)])
    second.partitions.update(messages_of(E1, 0, clicks(10, 11)).partitions)
    crashing = TopicsSource([messages_of(E0, 0, clicks(0, 1, 2)), second], {E0: 5, E1: 2})
    with pytest.raises(FatalError):
        ingest_until_caught_up(cfg, crashing, refusing_orders_rows(cfg))
    assert DeltaTable(str(tmp_path / "clicks")).transaction_version("e-0") == 4 and not (tmp_path / "orders").exists()
    assert start_marks(tmp_path) == {"clicks": None, "orders": 2}

    log = [
        messages_of(E0, 0, [*clicks(0, 1, 2), {"id": "o3", "kind": "orders"}, *clicks(4)]),
        messages_of(E1, 0, clicks(10, 11)),
    ]
    restart = TopicsSource(log, {E0: 5, E1: 2})
    ingest_until_caught_up(cfg, restart)
    assert restart.starts[E0] == 3 and ids(tmp_path / "orders") == ["o3"]
    assert ids(tmp_path / "clicks") == ["c0", "c1", "c10", "c11", "c2", "c4"]


def test_a_route_added_later_starts_where_the_partition_is(tmp_path: Path) -> None:
    """Yesterday refunds had no route (dead letters); today it has one: it takes the messages from where the
    partition's other tables are, not the earlier ones (those are dead letters already)."""
    ingest_until_caught_up(expression_config(tmp_path), TopicsSource([messages_of(E0, 0, events())], {E0: 7}))
    routes = [
        {"name": "clicks", "uri": str(tmp_path / "clicks")},
        {"name": "orders", "uri": str(tmp_path / "orders")},
        {"name": "refunds", "uri": str(tmp_path / "refunds")},
    ]
    today = tables_config(tmp_path, K2D_KAFKA__TOPIC="e", K2D_ROUTES=json.dumps(routes), K2D_ROUTING__EXPRESSION="kind")
    more = [*events(), {"id": "e7", "kind": "refunds"}]
    source = TopicsSource([messages_of(E0, 0, more)], {E0: 8})
    ingest_until_caught_up(today, source)
    assert source.starts == {E0: 7}
    assert ids(tmp_path / "refunds") == ["e7"]
    assert DeltaTable(str(tmp_path / "refunds")).transaction_version("e-0") == 7
    assert [row["offset"] for row in dead_letters(tmp_path)] == [3, 4]


def test_a_route_may_have_its_own_dead_letter_table(tmp_path: Path) -> None:
    routes = [
        {"topic": "a", "uri": str(tmp_path / "a"), "dead_letter_table_uri": str(tmp_path / "a_letters")},
        {"topic": "b", "uri": str(tmp_path / "b")},
    ]
    cfg = tables_config(tmp_path, K2D_KAFKA__TOPICS="a,b", K2D_ROUTES=json.dumps(routes))
    bad = messages_of(A0, 0, [{"id": "a0-0"}, {"id": 7, "nested": {"x": 1}}])
    bad.partitions[A0].payloads[1] = b"{not json"
    worse = messages_of(B0, 0, [{"id": "b0-0"}])
    worse.partitions[B0].payloads[0] = b"[oops"
    ingest_until_caught_up(cfg, TopicsSource([bad, worse], {A0: 2, B0: 1}))

    def letters(uri: Path) -> list[tuple[str, int, int]]:
        rows = DeltaTable(str(uri)).to_pyarrow_table().to_pylist()
        return [(row["topic"], row["partition"], row["offset"]) for row in rows]

    assert letters(tmp_path / "a_letters") == [("a", 0, 1)]
    assert letters(tmp_path / "dlq") == [("b", 0, 0)]
    assert DeltaTable(str(tmp_path / "a_letters")).transaction_version("a-dlq-0") == 1
    assert ids(tmp_path / "a") == ["a0-0"]


def test_routes_writing_one_table_share_its_dead_letter_table(tmp_path: Path) -> None:
    routes = [
        {"topic": "a", "uri": str(tmp_path / "all"), "dead_letter_table_uri": str(tmp_path / "a_letters")},
        {"topic": "b", "uri": str(tmp_path / "all")},
    ]
    with pytest.raises(Exception, match=r"routes\[1\]\.dead_letter_table_uri.*same table"):
        Routes(tables_config(tmp_path, K2D_KAFKA__TOPICS="a,b", K2D_ROUTES=json.dumps(routes)))


class StoppingSource(TopicsSource):
    """Serves its batches, then stops the daemon (a SIGTERM) before it reaches the high watermarks."""

    def start(self, listener: Any) -> None:
        self.ingestor = listener
        super().start(listener)

    def consume(self, max_messages: int, timeout: float) -> ConsumedBatch:
        if not self.batches:
            self.ingestor.request_stop()
            return ConsumedBatch()
        return self.batches.pop(0)


def test_a_replay_stopped_before_it_passes_a_table_ahead_never_moves_that_tables_txn_back(tmp_path: Path) -> None:
    """After a crash between the tables' commits (clicks at 7, orders at 2), the restart reads from 3 and is
    stopped after 3-4: its shutdown flush must leave clicks at 7 (a lane behind it would move its txn back to
    4, and the next run would write e5 and e6 into clicks twice)."""
    cfg = expression_config(tmp_path)

    def failing_orders(spec: TableSpec) -> OpenedTable:
        opened = open_table(cfg, spec)
        if spec.uri.endswith("/orders"):

            def refuse(*args: Any) -> int:
                raise FatalError("orders refuses")

            opened.writer.commit = refuse  # type: ignore[method-assign,assignment]
        return opened

    extra = {"id": "e7", "kind": "orders"}
    ingest_until_caught_up(cfg, TopicsSource([messages_of(E0, 0, events()[:3])], {E0: 3}))
    with pytest.raises(FatalError):
        ingest_until_caught_up(cfg, TopicsSource([messages_of(E0, 3, [*events()[3:], extra])], {E0: 8}), failing_orders)
    assert DeltaTable(str(tmp_path / "clicks")).transaction_version("e-0") == 7

    ingest_until_caught_up(cfg, StoppingSource([messages_of(E0, 3, events()[3:5])], {E0: 8}))
    assert DeltaTable(str(tmp_path / "clicks")).transaction_version("e-0") == 7
    assert DeltaTable(str(tmp_path / "orders")).transaction_version("e-0") == 4

    ingest_until_caught_up(cfg, TopicsSource([messages_of(E0, 0, [*events(), extra])], {E0: 8}))
    assert ids(tmp_path / "clicks") == ["e0", "e1", "e5", "e6"]
    assert ids(tmp_path / "orders") == ["e2", "e7"]


def test_topics_of_one_daemon_do_not_share_dead_letter_txns(tmp_path: Path) -> None:
    """An explicit app id and a table per topic: topic a's dead letters must not move topic b's dead-letter txn
    (b's next commit would be taken for a zombie's: dropped and replayed, again and again)."""
    cfg = tables_config(
        tmp_path, K2D_KAFKA__TOPICS="a,b", K2D_TABLE__URI=str(tmp_path / "{topic}"), K2D_TABLE__APP_ID="shop"
    )
    bad = messages_of(A0, 0, docs("a0-", 0, 3))
    bad.partitions[A0].payloads[1] = b"{broken"
    worse = messages_of(B0, 0, docs("b0-", 0, 3))
    worse.partitions[B0].payloads[0] = b"[oops"
    source = TopicsSource([bad, worse, messages_of(A0, 3, docs("a0-", 3, 2))], {A0: 5, B0: 3})
    metrics = ingest_until_caught_up(cfg, source)
    assert (
        metrics.registry.get_sample_value(
            "kafka2delta_commit_conflicts_total", {"topic": "b", "partition": "0", "table": str(tmp_path / "b")}
        )
        is None
    )
    dlq = DeltaTable(str(tmp_path / "dlq"))
    assert (dlq.transaction_version("shop-a-dlq-0"), dlq.transaction_version("shop-b-dlq-0")) == (4, 2)
    assert ids(tmp_path / "a") == ["a0-0", "a0-2", "a0-3", "a0-4"] and ids(tmp_path / "b") == ["b0-1", "b0-2"]


def test_legacy_txn_ids_are_migrated_once_so_no_history_is_needed_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Partition a[1] has no new message after topics joined the table: its legacy id shop-1 is copied to
    shop-a-1 at the first read, so a later start needs no commit history naming the owner topic."""
    uri = str(tmp_path / "all")
    yesterday = tables_config(tmp_path, K2D_KAFKA__TOPIC="a", K2D_TABLE__URI=uri, K2D_TABLE__APP_ID="shop")
    ingest_until_caught_up(
        yesterday,
        TopicsSource([messages_of(A0, 0, docs("a0-", 0, 4)), messages_of(A1, 0, docs("a1-", 0, 2))], {A0: 4, A1: 2}),
    )
    today = tables_config(tmp_path, K2D_KAFKA__TOPICS="a,b", K2D_TABLE__URI=uri, K2D_TABLE__APP_ID="shop")
    ingest_until_caught_up(today, TopicsSource([messages_of(A0, 4, docs("a0-", 4, 1))], {A0: 5, A1: 2, B0: 0}))
    table = DeltaTable(uri)
    assert (table.transaction_version("shop-a-0"), table.transaction_version("shop-a-1")) == (4, 1)

    monkeypatch.setattr("kafka2delta.writer._HISTORY_LOOKED_AT", 0)  # the single-topic commits are out of reach
    source = TopicsSource([messages_of(A1, 2, docs("a1-", 2, 1))], {A0: 5, A1: 3, B0: 0})
    ingest_until_caught_up(today, source)
    assert source.starts[A1] == 2
    assert ids(tmp_path / "all").count("a1-0") == 1 and "a1-2" in ids(tmp_path / "all")


def test_legacy_dead_letter_txn_ids_keep_their_topic_when_another_topic_dead_letters_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by review: yesterday one topic z (txn ids ``shop-dlq-0``) crashed after recording its dead letter @3;
    today topics a and z each have a table, and a pod holding only a records a dead letter first. Its commit must
    not look like a one-topic one (the owner of ``shop-dlq-0`` would be taken to be a, and z@3 recorded again),
    and the owner is named in a property at once, so a later start needs no history."""
    yesterday = tables_config(
        tmp_path, K2D_KAFKA__TOPIC="z", K2D_TABLE__URI=str(tmp_path / "z"), K2D_TABLE__APP_ID="shop"
    )
    z0 = TopicPartition("z", 0)

    def broken_at(batch: ConsumedBatch, tp: TopicPartition, offset: int) -> ConsumedBatch:
        messages = batch.partitions[tp]
        messages.payloads[offset - messages.offsets[0]] = b"{broken"
        return batch

    def refusing_z(spec: TableSpec) -> OpenedTable:
        opened = open_table(yesterday, spec)

        def crash(*args: Any) -> int:
            raise FatalError("crash after the dead-letter commit")

        opened.writer.commit = crash  # type: ignore[method-assign,assignment]
        return opened

    ingest_until_caught_up(yesterday, TopicsSource([messages_of(z0, 0, docs("z", 0, 2))], {z0: 2}))
    with pytest.raises(FatalError):
        ingest_until_caught_up(
            yesterday, TopicsSource([broken_at(messages_of(z0, 2, docs("z", 2, 3)), z0, 3)], {z0: 5}), refusing_z
        )
    today = tables_config(
        tmp_path, K2D_KAFKA__TOPICS="a,z", K2D_TABLE__URI=str(tmp_path / "{topic}"), K2D_TABLE__APP_ID="shop"
    )
    ingest_until_caught_up(today, TopicsSource([broken_at(messages_of(A0, 0, docs("a", 0, 3)), A0, 1)], {A0: 3}))
    dlq = DeltaTable(str(tmp_path / "dlq"))
    assert dlq.metadata().configuration.get("kafka2delta.legacyTxnTopic") == "z"
    [newest] = dlq.history(1)  # a's dead letter: its txn id shop-a-dlq-0 names the topic, and its commit says so
    assert newest["kafka2delta"]["multi_topic"] is True and newest["kafka2delta"]["topic"] == "a"

    monkeypatch.setattr("kafka2delta.writer._HISTORY_LOOKED_AT", 0)  # the one-topic commits are out of reach
    source = TopicsSource([broken_at(messages_of(z0, 2, docs("z", 2, 3)), z0, 3)], {z0: 5, A0: 3})
    ingest_until_caught_up(today, source)
    assert source.starts[z0] == 2
    letters = DeltaTable(str(tmp_path / "dlq")).to_pyarrow_table().to_pylist()
    assert sorted((row["topic"], row["offset"]) for row in letters) == [("a", 1), ("z", 3)]
    assert ids(tmp_path / "z") == ["z0", "z1", "z2", "z4"]


def test_a_table_another_daemon_creates_after_our_schema_check_is_a_schema_change(tmp_path: Path) -> None:
    """Found by review: the table another daemon created between the committer's schema check and our first commit
    was opened and our rows merged into it, cast to its columns (1.5 and 2.7 into a long column: 1 and 2)."""
    uri = str(tmp_path / "t")
    deferred = DeferredTable(uri, {}, lambda tp: f"e-{tp.partition}", "snappy", 100, ())
    assert deferred.refresh_schema() == pa.schema([])  # the committer's check: nothing there yet
    DeltaTable.create(uri, pa.schema([pa.field("x", pa.int64())]))  # the other daemon's first batch: x long
    rows = pa.table({"x": pa.array([1.5, 2.7], pa.float64())})  # ours: x double
    with pytest.raises(SchemaChanged) as changed:
        deferred.commit_evolution(rows, {E0: None}, {E0: 1}, {})
    assert changed.value.schema.field("x").type == pa.int64()
    assert DeltaTable(uri).version() == 0 and DeltaTable(uri).transaction_version("e-0") is None


def test_a_table_another_daemon_creates_in_our_create_race_is_a_schema_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same when the other daemon's create wins the race with ours (``mode="ignore"`` opens its table)."""
    uri = str(tmp_path / "t")
    DeltaTable.create(uri, pa.schema([pa.field("x", pa.int64())]))

    def not_there_yet(*args: Any, **kwargs: Any) -> DeltaTable:
        raise TableNotFoundError("not there when we looked")

    monkeypatch.setattr("kafka2delta.deferred_tables.DeltaTable", not_there_yet)
    deferred = DeferredTable(uri, {}, lambda tp: f"e-{tp.partition}", "snappy", 100, ())
    with pytest.raises(SchemaChanged):
        deferred.commit_evolution(pa.table({"x": pa.array([1.5])}), {E0: None}, {E0: 1}, {})
    assert DeltaTable(uri).version() == 0


def test_marking_a_new_partition_after_another_writers_schema_change_marks_it(tmp_path: Path) -> None:
    """Found by review: the empty commit giving a partition its first txn met another daemon's schema change, and
    SchemaChanged escaped the assignment callback (the daemon stopped)."""
    cfg = expression_config(tmp_path)
    e1 = TopicPartition("e", 1)
    source = TopicsSource([messages_of(E0, 0, [{"id": "a", "kind": "clicks"}, {"id": "b", "kind": "orders"}])], {E0: 2})
    ingestor, _ = daemon_loop(cfg, source)
    ingestor.run(until_caught_up=True)  # tables open, E0 marked and committed
    DeltaTable(str(tmp_path / "orders")).alter.add_columns([Field("extra", PrimitiveType("string"), nullable=True)])
    source.highs[e1] = 0  # the topic gains a partition, handed to this daemon
    ingestor.assigned([e1])
    assert DeltaTable(str(tmp_path / "orders")).transaction_version("e-1") == -1


def test_a_table_made_from_its_first_rows_then_evolves_as_configured(tmp_path: Path) -> None:
    """Found by review: a table without a schema merges the first rows' fields to be made, and merging stayed on
    for the process. With ``schema_evolution = "none"`` a field the table lacks then became a column here, not in
    a daemon started after the table existed: outcomes depended on the process (invariant 8)."""
    uri = tmp_path / "free"
    cfg = schemaless_config(tmp_path, "t", K2D_TABLE__SCHEMA_EVOLUTION="none", K2D_INGEST__ALLOWED_LATENCY_S="0.001")

    def opener(spec: TableSpec) -> OpenedTable:
        # As Avro or Protobuf open such a table (JSON needs "merge" to take one, open_table): same pipeline.
        writer = open_table_writer(cfg, spec, create=True)
        return OpenedTable(writer=writer, pipeline=build_pipeline(cfg, writer.schema, spec))

    class AfterTheFirstCommit(LogSource):
        def consume(self, max_messages: int, timeout: float) -> ConsumedBatch:
            if self.position == 1 and not (uri / "_delta_log").exists():
                return ConsumedBatch()  # the first message's flush has not made the table yet
            return super().consume(max_messages, timeout)

    source = AfterTheFirstCommit([b'{"n": 1}', b'{"n": 2, "extra": "x"}'], chunk=1)
    ingest_until_caught_up(cfg, source, opener)
    table = DeltaTable(str(uri))
    assert table.schema().to_arrow().names == ["n"]
    assert sorted(table.to_pyarrow_table().column("n").to_pylist()) == [1, 2]


def test_a_pattern_topic_named_like_the_dead_letter_table_is_refused_when_its_table_is_opened(tmp_path: Path) -> None:
    cfg = tables_config(
        tmp_path, K2D_KAFKA__TOPIC_PATTERN="^", K2D_TABLE__URI=str(tmp_path / "{topic}"), K2D_DEAD_LETTERS__TABLE_URI=""
    )
    letters = TopicPartition("_dead_letters", 0)
    source = TopicsSource([messages_of(letters, 0, docs("x", 0, 1))], {letters: 1})
    with pytest.raises(ConfigError, match=r"table\.uri: takes topic '_dead_letters' .* is the dead-letter table"):
        ingest_until_caught_up(cfg, source)
    assert DeltaTable(str(tmp_path / "_dead_letters")).version() == 0  # created at start, nothing written to it


def test_two_spellings_of_one_table_share_its_sink_and_name_the_topic_in_its_txns(tmp_path: Path) -> None:
    """Found by review: ``<dir>/all`` and ``<dir>/all/`` were two tables, both with txn ids ``shop-<partition>``."""
    routes = [{"topic": "a", "uri": str(tmp_path / "all")}, {"topic": "b", "uri": f"{tmp_path / 'all'}/"}]
    cfg = tables_config(tmp_path, K2D_KAFKA__TOPICS="a,b", K2D_ROUTES=json.dumps(routes), K2D_TABLE__APP_ID="shop")
    ingest_until_caught_up(cfg, TopicsSource(batches(), {A0: 5, A1: 2, B0: 3}))
    table = DeltaTable(str(tmp_path / "all"))
    assert len(ids(tmp_path / "all")) == 10
    versions = [table.transaction_version(app_id) for app_id in ("shop-a-0", "shop-a-1", "shop-b-0", "shop-0")]
    assert versions == [4, 1, 2, None]


def test_a_table_made_without_a_configured_partition_column_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by review: a partition column the first rows lacked was left out of the table without a word (a table's
    partitioning is fixed when it is made)."""
    uri = str(tmp_path / "t")
    deferred = DeferredTable(uri, {}, lambda tp: f"e-{tp.partition}", "snappy", 100, ["day", "x"])
    deferred.refresh_schema()
    with caplog.at_level(logging.WARNING, logger="kafka2delta.deferred_tables"):
        deferred.commit_evolution(pa.table({"x": [1, 2], "y": ["a", "b"]}), {E0: None}, {E0: 1}, {})
    assert DeltaTable(uri).metadata().partition_columns == ["x"]
    assert "created without partition column(s) ['day']" in caplog.text
