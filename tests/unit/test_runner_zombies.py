"""Two processes on one partition split across two tables (a route expression): a zombie that still holds the
partition and the new owner, in the windows a crash between the tables' commits leaves. Found by review; each
ends with every offset exactly once a row, a dead letter or a skip."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from kafka2delta.cli import open_table
from kafka2delta.config import Config
from kafka2delta.errors import FatalError
from kafka2delta.records import ConsumedBatch, TopicPartition
from kafka2delta.routing import TableSpec
from kafka2delta.runner import Ingestor
from kafka2delta.tables import OpenedTable
from tests.support.runner import (
    TopicsSource,
    daemon_loop,
    expression_config,
    ids,
    ingest_until_caught_up,
    messages_of,
)

E0 = TopicPartition("e", 0)
KINDS = ["clicks", "clicks", "orders", "refunds", None, "orders-without-id", "clicks", "clicks", "orders", "clicks"]


def events(first: int, last: int) -> ConsumedBatch:
    """Offsets ``first..last``: 3 routes nowhere and 4 has no route (dead letters of the router), 5 is an order
    without its id (a dead letter of orders' own stages)."""

    def event(offset: int) -> dict[str, Any]:
        kind = KINDS[offset]
        if kind == "orders-without-id":
            return {"kind": "orders"}
        return {"id": f"e{offset}", **({"kind": kind} if kind else {})}

    return messages_of(E0, first, [event(offset) for offset in range(first, last + 1)])


def ingestor(cfg: Config, opener: Any) -> Ingestor:
    return daemon_loop(cfg, TopicsSource([], {E0: 10}), opener)[0]


def refusing_orders(cfg: Config, how: str) -> Any:
    """Tables as the daemon opens them, but orders' ``how`` (a method of its writer) raises FatalError: the
    process dies there."""

    def opener(spec: TableSpec) -> OpenedTable:
        opened = open_table(cfg, spec)
        if spec.uri.endswith("/orders"):

            def killed(*args: Any) -> Any:
                raise FatalError(f"killed in orders' {how}")

            setattr(opened.writer, how, killed)
        return opened

    return opener


def dead_letters(tmp_path: Path) -> list[tuple[int, str]]:
    return sorted(
        (row["offset"], row["stage"]) for row in DeltaTable(str(tmp_path / "dlq")).to_pyarrow_table().to_pylist()
    )


def txns(tmp_path: Path) -> tuple[int | None, int | None, int | None]:
    return (
        DeltaTable(str(tmp_path / "clicks")).transaction_version("e-0"),
        DeltaTable(str(tmp_path / "orders")).transaction_version("e-0"),
        DeltaTable(str(tmp_path / "dlq")).transaction_version("e-dlq-0"),
    )


def test_a_zombies_dead_letter_inside_an_older_window_is_not_recorded_again(tmp_path: Path) -> None:
    """After a crash between the tables' commits (clicks and the dead letters at 7, orders at 2), a zombie records
    orders' dead letter @5 without moving the dead-letter txn (it is inside the window) and dies; the new owner,
    whose lane 3..9 moves the txn to 9, must find @5 recorded instead of recording it twice."""
    cfg = expression_config(tmp_path)
    ingest_until_caught_up(cfg, TopicsSource([events(0, 2)], {E0: 3}))
    with pytest.raises(FatalError, match="refresh_schema"):  # the crash between the tables' commits
        ingest_until_caught_up(cfg, TopicsSource([events(3, 7)], {E0: 8}), refusing_orders(cfg, "refresh_schema"))
    assert txns(tmp_path) == (7, 2, 7)
    zombie = ingestor(cfg, refusing_orders(cfg, "commit"))
    owner = ingestor(cfg, lambda spec: open_table(cfg, spec))
    zombie.assigned([E0])
    owner.assigned([E0])  # both read clicks 7, orders 2, dead letters 7
    zombie._accept(events(3, 7))
    with pytest.raises(FatalError, match="commit"):
        zombie._flush("latency")  # orders: its dead letter @5 is recorded, then the process dies
    assert dead_letters(tmp_path) == [(3, "route"), (4, "route"), (5, "coerce")]
    owner._accept(events(3, 9))
    owner._flush("latency")
    assert txns(tmp_path) == (9, 9, 9)
    assert dead_letters(tmp_path) == [(3, "route"), (4, "route"), (5, "coerce")]
    assert ids(tmp_path / "clicks") == ["e0", "e1", "e6", "e7", "e9"]
    assert ids(tmp_path / "orders") == ["e2", "e8"]


def test_a_zombies_dead_letter_found_recorded_is_one_skip_of_the_owner(tmp_path: Path) -> None:
    """The windows of the test above: the owner finds @5 recorded by the zombie and does not record it again. It is
    counted once, as a skip of the owner's, whose main commit covers it; not as a dead letter of the owner's nor of
    the zombie, whose main commit never landed (found by review: both counted it, and the owner's dead-letter and
    orders commits said they held one dead letter)."""
    cfg = expression_config(tmp_path)
    ingest_until_caught_up(cfg, TopicsSource([events(0, 2)], {E0: 3}))
    with pytest.raises(FatalError, match="refresh_schema"):
        ingest_until_caught_up(cfg, TopicsSource([events(3, 7)], {E0: 8}), refusing_orders(cfg, "refresh_schema"))
    zombie, zombie_metrics = daemon_loop(cfg, TopicsSource([], {E0: 10}), refusing_orders(cfg, "commit"))
    owner, owner_metrics = daemon_loop(cfg, TopicsSource([], {E0: 10}), lambda spec: open_table(cfg, spec))
    zombie.assigned([E0])
    owner.assigned([E0])
    zombie._accept(events(3, 7))
    with pytest.raises(FatalError, match="commit"):
        zombie._flush("latency")
    owner._accept(events(3, 9))
    owner._flush("latency")
    assert dead_letters(tmp_path) == [(3, "route"), (4, "route"), (5, "coerce")]

    dead, skipped = "kafka2delta_messages_dead_lettered_total", "kafka2delta_messages_skipped_total"
    for metrics in (zombie_metrics, owner_metrics):
        assert metrics.registry.get_sample_value(dead, {"topic": "e", "stage": "coerce"}) is None
    recorded = {"topic": "e", "partition": "0", "reason": "dead_letter_recorded"}
    assert owner_metrics.registry.get_sample_value(skipped, recorded) == 3  # 3 and 4 read as recorded, 5 found
    assert dict(owner.status().dead_letters_by_stage) == {}
    assert DeltaTable(str(tmp_path / "dlq")).history()[0]["kafka2delta"]["dead_letters"] == 0
    assert DeltaTable(str(tmp_path / "orders")).history()[0]["kafka2delta"]["dead_letters"] == 0


def test_an_out_of_range_seek_in_the_same_turn_still_stops_later_tables_after_a_conflict(tmp_path: Path) -> None:
    """The new owner commits 3..9 to both tables; the zombie, holding 3..9 and seeking an out-of-range offset in
    the same turn (so the partition was already marked resynced), flushes: clicks' conflict resyncs the partition
    and orders must then not commit it (checked against the versions the resync just read, it would pass)."""
    cfg = expression_config(tmp_path)
    ingest_until_caught_up(cfg, TopicsSource([events(0, 2)], {E0: 3}))
    zombie = ingestor(cfg, lambda spec: open_table(cfg, spec))
    owner = ingestor(cfg, lambda spec: open_table(cfg, spec))
    zombie.assigned([E0])
    owner.assigned([E0])
    owner._accept(events(3, 9))
    owner._flush("latency")
    zombie._accept(events(3, 9))
    zombie._resynced.add(E0)  # what _offset_out_of_range does in the same loop turn
    zombie._flush("latency")
    assert ids(tmp_path / "clicks") == ["e0", "e1", "e6", "e7", "e9"]
    assert ids(tmp_path / "orders") == ["e2", "e8"]
    assert dead_letters(tmp_path) == [(3, "route"), (4, "route"), (5, "coerce")]
