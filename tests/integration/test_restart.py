"""A clean stop mid-stream and a restart: no duplicate, no gap."""

import signal
import time
from functools import partial
from pathlib import Path

from tests.support.harness import BackgroundProducer, assert_exactly_once, wait_for


def test_sigterm_mid_stream_then_restart(setup_factory, daemon_factory) -> None:
    setup = setup_factory(2, max_messages_per_file=500, allowed_latency_s=0.5)
    daemon = daemon_factory(setup)
    # Arrivals go on until after the stop, however long the daemon takes to start: the stop comes mid-stream.
    producer = BackgroundProducer(setup.topic, per_partition=100_000, pause_s=0.1)
    wait_for(lambda: len(setup.ids()) > 0, 90, "a first commit")
    assert daemon.process.poll() is None
    assert daemon.stop() == 0, daemon.log()[-3000:]
    assert "received SIGTERM" in daemon.log()
    after_stop = setup.txn_versions()
    assert all(v is not None for v in after_stop.values())

    produced = producer.stop()
    per_partition = len(produced) // 2
    assert all(v < per_partition - 1 for v in after_stop.values()), "messages must arrive after the stop"
    again = daemon_factory(setup, "--until-caught-up")
    assert again.wait(180) == 0, again.log()[-3000:]
    assert_exactly_once(setup, produced)
    assert setup.txn_versions() == {0: per_partition - 1, 1: per_partition - 1}
    for version in after_stop.values():
        assert f"starting at {version + 1} (table txn version {version})" in again.log()


def test_sigterm_during_start_up_exits_cleanly(setup_factory, daemon_factory) -> None:
    """A rollout may overtake a pod that is still starting: whenever SIGTERM comes, the daemon exits 0, says so,
    and leaves no half-written commit (before, a SIGTERM during the imports ended it by the signal: exit -15)."""
    setup = setup_factory(2)
    BackgroundProducer(setup.topic, per_partition=200).join()
    outcomes = []
    for delay_s in (0.0, 0.3, 1.0, 2.5, 5.0):
        daemon = daemon_factory(setup)
        # Before the interpreter has run a line of ours nothing can catch SIGTERM (that takes ~0.1 s, 0.6 s on a
        # loaded machine): count from the moment the process catches it, as the kernel reports.
        wait_for(partial(catches_sigterm, daemon.process.pid), 30, "the start-up signal handler")
        time.sleep(delay_s)
        started = time.monotonic()
        code = daemon.stop(timeout=30)
        log = daemon.log()
        assert code == 0, f"SIGTERM after {delay_s} s: exit {code}\n{log[-3000:]}"
        assert time.monotonic() - started < 20, f"SIGTERM after {delay_s} s took too long to stop"
        assert "Traceback" not in log, log[-3000:]
        assert "during start-up: stopped before consuming" in log or "received SIGTERM: flushing" in log, log[-3000:]
        outcomes.append("start-up" if "during start-up" in log else "loop")
    assert outcomes[0] == "start-up", outcomes  # at once: still importing pyarrow
    # Whatever was committed on the way is exact, and a last run takes the rest.
    assert daemon_factory(setup, "--until-caught-up").wait(120) == 0
    assert setup.txn_versions() == {0: 199, 1: 199}
    assert sorted(setup.ids()) == sorted(set(setup.ids())) and len(setup.ids()) == 400


def catches_sigterm(pid: int) -> bool:
    """Whether the process has a handler for SIGTERM (``SigCgt`` in /proc/<pid>/status)."""
    status = Path(f"/proc/{pid}/status").read_text()
    caught = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(caught >> (signal.SIGTERM - 1) & 1)
