"""Two daemons in one group on a 4-partition topic: the second joins mid-stream, the first stops."""

import threading

from tests.support.harness import assert_exactly_once, wait_for


def test_second_daemon_joins_then_first_stops(setup_factory, daemon_factory) -> None:
    setup = setup_factory(4, max_messages_per_file=500)
    produced = setup.topic.produce(per_partition=1000)
    first = daemon_factory(setup)
    wait_for(lambda: len(setup.ids()) > 0, 90, "the first daemon's first commit")

    # Keep producing while the group rebalances twice.
    more: list[str] = []
    producer = threading.Thread(target=lambda: more.extend(setup.topic.produce(per_partition=3000, start=1000)))
    producer.start()
    second = daemon_factory(setup)
    wait_for(lambda: "assigned" in second.log() and "starting at" in second.log(), 90, "the second daemon's assignment")
    assert first.stop() == 0, first.log()[-3000:]
    assert "revoked" in first.log()
    producer.join()
    produced += more

    wait_for(lambda: len(setup.ids()) >= len(produced), 120, "the second daemon to catch up")
    assert second.stop() == 0, second.log()[-3000:]
    assert_exactly_once(setup, produced)
    assert setup.txn_versions() == {p: 3999 for p in range(4)}
