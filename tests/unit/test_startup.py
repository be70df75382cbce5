"""The entry point: a stop signal during the daemon's start-up is a clean exit 0; other commands keep the
default handlers (a stopped ``verify`` or Spark job must not exit 0 as if it had done its work)."""

import os
import signal
import sys
import time
from collections.abc import Iterator

import pytest

from kafka2delta import cli, startup


@pytest.fixture(autouse=True)
def restore_handlers() -> Iterator[None]:
    saved = {signum: signal.getsignal(signum) for signum in startup.STOP_SIGNALS}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def test_sigterm_during_the_daemons_start_up_exits_0(monkeypatch, capsys, caplog) -> None:
    def slow_start() -> int:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # interrupted by the handler's exception
        raise AssertionError("the signal did not stop the start-up")

    monkeypatch.setattr(sys, "argv", ["kafka2delta", "ingest", "-c", "config.toml"])
    monkeypatch.setattr(cli, "main", slow_start)
    assert startup.main() == 0
    said = capsys.readouterr().err + caplog.text  # stderr, or the log once logging is set up (here: pytest's)
    assert "received SIGTERM during start-up: stopped before consuming" in said
    # A second signal on the way out is ignored, not a traceback.
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN


@pytest.mark.parametrize("command", ["verify", "status", "maintain", "jobs"])
def test_other_commands_keep_the_default_handlers(monkeypatch, command: str) -> None:
    seen = {}

    def run() -> int:
        seen["handler"] = signal.getsignal(signal.SIGTERM)
        return 3

    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    monkeypatch.setattr(sys, "argv", ["kafka2delta", command, "-c", "config.toml"])
    monkeypatch.setattr(cli, "main", run)
    assert startup.main() == 3
    assert seen["handler"] is signal.SIG_DFL
