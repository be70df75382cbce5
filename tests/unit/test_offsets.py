import pytest

from kafka2delta.errors import FatalError
from kafka2delta.offsets import CommitOutcome, LogicalOffset, TxnIds, classify_commit, start_position
from kafka2delta.records import TopicPartition


def test_txn_app_id() -> None:
    assert TxnIds("orders").main(TopicPartition("events", 7)) == "orders-7"


def test_txn_ids_name_the_topic_when_several_can_write_a_table() -> None:
    orders, refunds = TopicPartition("orders", 7), TopicPartition("refunds", 7)
    # Default app id: the topic, one topic or several: a table keeps its ids when more topics join it.
    assert TxnIds().main(orders) == TxnIds(multi_topic=True).main(orders) == "orders-7"
    assert TxnIds().dead_letters(orders) == "orders-dlq-7"
    # An explicit app id is the whole prefix for one topic, and is followed by the topic for several.
    assert TxnIds("shop").main(orders) == "shop-7" and TxnIds("shop").legacy_main(orders) is None
    shared = TxnIds("shop", multi_topic=True)
    assert (shared.main(orders), shared.main(refunds)) == ("shop-orders-7", "shop-refunds-7")
    assert (shared.dead_letters(refunds), shared.legacy_main(orders)) == ("shop-refunds-dlq-7", "shop-7")


def test_start_after_committed_offset_including_zero() -> None:
    assert start_position(0, 0, 10, "earliest", "fail", "t[0]").offset == 1
    assert start_position(41, 0, 100, "earliest", "fail", "t[0]").offset == 42
    assert start_position(99, 0, 100, "earliest", "fail", "t[0]").offset == 100  # caught up exactly


def test_no_txn_follows_auto_offset_reset() -> None:
    assert start_position(None, 5, 10, "earliest", "fail", "t[0]").offset is LogicalOffset.EARLIEST
    assert start_position(None, 5, 10, "latest", "fail", "t[0]").offset is LogicalOffset.LATEST


def test_vanished_offsets_follow_the_policy_loudly() -> None:
    with pytest.raises(FatalError, match=r"t\[2\].*retention.*missing_offset_policy"):
        start_position(9, 50, 100, "earliest", "fail", "t[2]")
    jump = start_position(9, 50, 100, "earliest", "earliest", "t[2]")
    assert jump.offset == 50 and jump.out_of_range
    assert start_position(9, 50, 100, "earliest", "latest", "t[2]").offset == 100
    with pytest.raises(FatalError, match="recreated"):
        start_position(500, 0, 100, "earliest", "fail", "t[2]")


def test_classify_commit() -> None:
    expected = {0: 10, 1: None, 2: 5}
    ours = {0: 20, 1: 3, 2: 9}
    outcome = classify_commit(expected, ours, {0: 20, 1: None, 2: 7})
    assert outcome == {0: CommitOutcome.COMMITTED, 1: CommitOutcome.NOT_COMMITTED, 2: CommitOutcome.MOVED}
    # A partition the commit does not move (a replay in an older window) tells nothing, unless someone moved it.
    unmoved = classify_commit({0: 10, 3: 5}, {0: 20, 3: 5}, {0: 10, 3: 5})
    assert unmoved == {0: CommitOutcome.NOT_COMMITTED}
    assert classify_commit({3: 5}, {3: 5}, {3: 9}) == {3: CommitOutcome.MOVED}
