"""The entry point: a stop signal during the daemon's start-up is a clean exit 0; other commands keep the
default handlers (a stopped ``verify`` or Spark job must not exit 0 as if it had done its work)."""

import logging
import os
import signal
import sys
import time
from collections.abc import Iterator

import pytest

from kafka2delta import cli, startup
from kafka2delta.config import load_config


@pytest.fixture(autouse=True)
def restore_handlers(monkeypatch) -> Iterator[None]:
    saved = {signum: signal.getsignal(signum) for signum in startup.STOP_SIGNALS}
    monkeypatch.setattr(startup, "_received", [])  # what a test's signal leaves there stays in the test
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


def test_a_sigterm_whose_exception_a_library_swallowed_still_stops_the_daemon(monkeypatch, tmp_path, caplog) -> None:
    """Raised inside code that takes every exception (here a bare ``except:``), the start-up's exception never
    reaches the entry point, and the signal is ignored from then on: the loop must still stop, exit 0 (seen once
    in a clean-clone run, which code took it unknown: a daemon SIGTERMed 0.3 s into its start ran until killed)."""
    config = load_config(
        None,
        environ={
            "K2D_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:1",  # never answers: the stop must not wait for it
            "K2D_KAFKA__TOPIC": "events",
            "K2D_TABLE__URI": str(tmp_path / "t"),
            "K2D_TABLE__SCHEMA": '{"id": "string"}',
        },
    )

    def start_with_a_careless_import() -> int:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # interrupted by the handler's exception, which this bare except takes
        except:  # noqa: E722 - the careless library
            pass
        return cli._ingest(config, until_caught_up=False)

    monkeypatch.setattr(sys, "argv", ["kafka2delta", "ingest"])
    monkeypatch.setattr(cli, "main", start_with_a_careless_import)
    started = time.monotonic()
    with caplog.at_level(logging.INFO):
        assert startup.main() == 0
    assert time.monotonic() - started < 15  # not the 30 s of waiting for the broker
    assert "received SIGTERM: flushing, committing and stopping" in caplog.messages
    # And says when it came (found again in a clean-clone run: test_sigterm_during_start_up_exits_cleanly read such a
    # stop as one in the loop).
    assert "received SIGTERM during start-up: stopping now that the loop is ready" in caplog.messages


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


def test_released_sigterm_ends_a_command_by_system_exit() -> None:
    # Not the default handler: in a container the command is PID 1, and the kernel drops a signal left to its
    # default there (a maintenance CronJob's pod would wait out its grace period). finally blocks run.
    saved = signal.getsignal(signal.SIGTERM)
    ran_finally = []
    try:
        startup.release()
        with pytest.raises(SystemExit) as raised:
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # the handler raises here
            finally:
                ran_finally.append(True)
        assert raised.value.code == 143 and ran_finally == [True]
    finally:
        signal.signal(signal.SIGTERM, saved)


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
        ({}, True, [(-8, startup.MALLOC_ARENAS), (-3, startup.MMAP_THRESHOLD)]),  # M_ARENA_MAX, M_MMAP_THRESHOLD
        ({"MALLOC_ARENA_MAX": "8"}, True, [(-3, startup.MMAP_THRESHOLD)]),  # the operator's choice: glibc reads it
        ({"MALLOC_MMAP_THRESHOLD_": "131072"}, True, [(-8, startup.MALLOC_ARENAS)]),
        ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=4"}, True, [(-3, startup.MMAP_THRESHOLD)]),
        (
            {"GLIBC_TUNABLES": "glibc.malloc.tcache_count=0:glibc.malloc.mmap_threshold=65536"},
            True,
            [(-8, startup.MALLOC_ARENAS)],
        ),
        (
            {"GLIBC_TUNABLES": "glibc.malloc.tcache_count=0"},
            True,
            [(-8, startup.MALLOC_ARENAS), (-3, startup.MMAP_THRESHOLD)],
        ),
        ({}, False, []),  # musl and others keep their allocator as it is
    ],
)
def test_the_daemon_tunes_glibcs_malloc(monkeypatch, environment, glibc, expected) -> None:
    libc = _FakeLibc(glibc)
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr("ctypes.CDLL", lambda name: libc)
    monkeypatch.setattr("sys.platform", "linux")
    startup.tune_malloc()
    assert libc.calls == expected


def test_the_daemons_librdkafka_queue_is_bounded_by_default() -> None:
    from kafka2delta.config import KafkaConfig
    from kafka2delta.kafka import KafkaSource

    settings = KafkaSource(KafkaConfig(bootstrap_servers="b:9092", topic="t", group_id="g"))._settings
    assert settings["queued.max.messages.kbytes"] == "16384"
    assert settings["queued.min.messages"] == "5000"
    assert settings["fetch.queue.backoff.ms"] == "10"
    assert settings["fetch.max.bytes"] == "1048576"
    overridden = KafkaConfig(bootstrap_servers="b:9092", topic="t", group_id="g", settings={"queued.min.messages": "1"})
    assert KafkaSource(overridden)._settings["queued.min.messages"] == "1"


def test_a_larger_message_max_bytes_raises_the_fetch_bound_with_it() -> None:
    """librdkafka refuses a consumer whose fetch.max.bytes is below message.max.bytes: the daemon's smaller default
    must follow an operator's larger messages, and an explicit fetch.max.bytes still wins."""
    from confluent_kafka import Consumer

    from kafka2delta.config import KafkaConfig
    from kafka2delta.kafka import KafkaSource

    def settings(**kafka_settings: str) -> dict[str, object]:
        config = KafkaConfig(bootstrap_servers="127.0.0.1:9", topic="t", group_id="g", settings=kafka_settings)
        return KafkaSource(config)._settings

    larger = settings(**{"message.max.bytes": "10000000"})
    assert larger["fetch.max.bytes"] == "10000000"
    own = {k: v for k, v in larger.items() if isinstance(v, (str, int, bool))}
    Consumer(own).close()  # librdkafka accepts it (no broker needed to build one)
    assert settings(**{"message.max.bytes": "10000000", "fetch.max.bytes": "20000000"})["fetch.max.bytes"] == "20000000"
    assert settings(**{"message.max.bytes": "1000"})["fetch.max.bytes"] == "1048576"
    # A larger per-partition fetch asked for is not cut back to 1 MiB responses, under either name.
    assert settings(**{"max.partition.fetch.bytes": "4194304"})["fetch.max.bytes"] == "4194304"
    assert settings(**{"fetch.message.max.bytes": "3000000"})["fetch.max.bytes"] == "3000000"
