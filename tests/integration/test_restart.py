"""A clean stop mid-stream and a restart: no duplicate, no gap."""

from tests.integration.conftest import assert_exactly_once, wait_for


def test_sigterm_mid_stream_then_restart(setup_factory, daemon_factory) -> None:
    setup = setup_factory(2, max_messages_per_file=500)
    produced = setup.topic.produce(per_partition=3000)
    daemon = daemon_factory(setup)
    wait_for(lambda: len(setup.ids()) > 0, 90, "a first commit")
    assert daemon.stop() == 0, daemon.log()[-3000:]
    assert "received SIGTERM" in daemon.log()
    after_stop = setup.txn_versions()
    assert all(v is not None for v in after_stop.values())

    produced += setup.topic.produce(per_partition=1000, start=3000)
    again = daemon_factory(setup, "--until-caught-up")
    assert again.wait(180) == 0, again.log()[-3000:]
    assert_exactly_once(setup, produced)
    assert setup.txn_versions() == {0: 3999, 1: 3999}
    for _partition, version in after_stop.items():
        assert f"starting at {version + 1} (table txn version {version})" in again.log()
