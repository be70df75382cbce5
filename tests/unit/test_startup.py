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


class _FakeLibc:
    def __init__(self, glibc: bool) -> None:
        self.calls: list[tuple[int, int]] = []
        if glibc:
            self.gnu_get_libc_version = lambda: b"2.36"

    def mallopt(self, parameter: int, value: int) -> int:
        self.calls.append((parameter, value))
        return 1


@pytest.mark.parametrize(
    ("environment", "glibc", "expected"),
    [
        ({}, True, [(-8, startup.MALLOC_ARENAS)]),  # M_ARENA_MAX
        ({"MALLOC_ARENA_MAX": "8"}, True, []),  # the operator's choice: glibc reads it itself
        ({}, False, []),  # musl and others keep their allocator as it is
    ],
)
def test_the_daemon_caps_glibcs_malloc_arenas(monkeypatch, environment, glibc, expected) -> None:
    libc = _FakeLibc(glibc)
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr("ctypes.CDLL", lambda name: libc)
    monkeypatch.setattr("sys.platform", "linux")
    startup.limit_malloc_arenas()
    assert libc.calls == expected


def test_the_daemons_librdkafka_queue_is_bounded_by_default() -> None:
    from kafka2delta.config import KafkaConfig
    from kafka2delta.kafka import KafkaSource

    settings = KafkaSource(KafkaConfig(bootstrap_servers="b:9092", topic="t", group_id="g"))._settings
    assert settings["queued.max.messages.kbytes"] == "16384"
    assert settings["queued.min.messages"] == "5000"
    assert settings["fetch.queue.backoff.ms"] == "10"
    overridden = KafkaConfig(bootstrap_servers="b:9092", topic="t", group_id="g", settings={"queued.min.messages": "1"})
    assert KafkaSource(overridden)._settings["queued.min.messages"] == "1"
