"""Malformed messages are skipped with a logged reason; everything else lands; offsets still advance."""

from tests.integration.conftest import assert_exactly_once, event


def payload(partition: int, seq: int) -> bytes | None:
    if seq % 50 == 7:
        return b'{"id": "broken'
    if seq % 50 == 8:
        return None  # empty: skipped and counted
    if seq % 50 == 9:
        return b'{"id": null, "seq": 1}'  # required column missing
    return event(partition, seq)


def test_malformed_json_is_skipped_with_a_reason(setup_factory, daemon_factory) -> None:
    setup = setup_factory(2)
    produced = setup.topic.produce(per_partition=500, payload=payload)
    bad = {f"p{p}-{s}" for p in range(2) for s in range(500) if s % 50 in (7, 9)}
    daemon = daemon_factory(setup, "--until-caught-up")
    assert daemon.wait(120) == 0, daemon.log()[-3000:]
    assert_exactly_once(setup, [i for i in produced if i not in bad])
    assert setup.txn_versions() == {0: 499, 1: 499}  # the last message (a bad one) is final too
    log = daemon.log()
    assert f"dead letter {setup.topic.name}[0]@7 stage=deserialize" in log
    assert f"dead letter {setup.topic.name}[1]@9 stage=coerce reason=column 'id' is required" in log
    assert log.count("dead letter ") == len(bad) == 40
