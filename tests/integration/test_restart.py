"""A clean stop mid-stream and a restart: no duplicate, no gap."""

from tests.support.harness import BackgroundProducer, assert_exactly_once, wait_for


def test_sigterm_mid_stream_then_restart(setup_factory, daemon_factory) -> None:
    setup = setup_factory(2, max_messages_per_file=500, allowed_latency_s=0.5)
    producer = BackgroundProducer(setup.topic, per_partition=4000)
    daemon = daemon_factory(setup)
    wait_for(lambda: len(setup.ids()) > 0, 90, "a first commit")
    assert daemon.process.poll() is None
    assert daemon.stop() == 0, daemon.log()[-3000:]
    assert "received SIGTERM" in daemon.log()
    after_stop = setup.txn_versions()
    assert all(v is not None for v in after_stop.values())

    produced = producer.join()
    assert any(v < 3999 for v in after_stop.values()), "the stop should come while messages are still arriving"
    again = daemon_factory(setup, "--until-caught-up")
    assert again.wait(180) == 0, again.log()[-3000:]
    assert_exactly_once(setup, produced)
    assert setup.txn_versions() == {0: 3999, 1: 3999}
    for version in after_stop.values():
        assert f"starting at {version + 1} (table txn version {version})" in again.log()
