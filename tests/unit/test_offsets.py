import pytest

from kafka2delta.errors import FatalError
from kafka2delta.offsets import CommitOutcome, LogicalOffset, classify_commit, start_position, txn_app_id


def test_txn_app_id() -> None:
    assert txn_app_id("orders", 7) == "orders-7"


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
