"""The CLI process: bad config exits 2 with one line naming the key; secrets never printed."""

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kafka2delta", *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=60
    )


def test_version() -> None:
    result = run("--version")
    assert result.returncode == 0 and result.stdout.startswith("kafka2delta ")


def test_bad_config_exits_2_naming_the_key(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(
        '[kafka]\nbootstrap_servers = "x:1"\ntopic = "t"\n[table]\nuri = "/tmp/x"\n[ingest]\nmax_messages_per_file = -3\n'
    )
    result = run("ingest", "-c", str(config))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "ingest.max_messages_per_file" in lines[0] and "positive integer" in lines[0]


def test_env_error_names_the_variable_and_masks_secrets(tmp_path: Path) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "K2D_KAFKA__BOOTSTRAP_SERVERS": "x:1",
        "K2D_KAFKA__TOPIC": "t",
        "K2D_TABLE__URI": str(tmp_path / "t"),
        "K2D_INGEST__ALLOWED_LATENCY_S": "soon",
        "K2D_KAFKA__SETTINGS__SASL_PASSWORD": "hunter2-secret",
    }
    result = run("ingest", env=env)
    assert result.returncode == 2
    assert "K2D_INGEST__ALLOWED_LATENCY_S" in result.stderr and "hunter2-secret" not in result.stderr


def test_missing_required_key(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('[kafka]\nbootstrap_servers = "x:1"\n[table]\nuri = "/tmp/x"\n')
    result = run("ingest", "-c", str(config))
    assert result.returncode == 2 and "kafka.topic: required key missing" in result.stderr


def test_maintain_refuses_contradicting_arguments_before_spark_starts(tmp_path: Path) -> None:
    """Exit 2 with one line naming the argument, before the tables are listed and the JVM starts: the table does
    not even exist, and no Spark line is logged."""
    config = tmp_path / "c.toml"
    config.write_text(f'[kafka]\nbootstrap_servers = "x:1"\ntopic = "t"\n[table]\nuri = "{tmp_path / "absent"}"\n')
    refusals = {
        "--retain-hours": ("vacuum", "--retain-hours", "0.5"),
        "--purge-deletion-vectors": ("optimize", "--zorder-by", "id", "--purge-deletion-vectors"),
        "--target-file-size": ("optimize", "--target-file-size", "0"),
    }
    for argument, args in refusals.items():
        result = run("maintain", *args, "-c", str(config))
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and argument in lines[0], result.stderr


def test_a_jobs_sigterm_stops_after_the_turn_without_a_lock_or_a_log_line_in_the_handler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``jobs`` under a SIGTERM (a Deployment's rollout): the turn under way ends, the report is printed, exit 0.
    The handler runs wherever the signal interrupts the main thread: here while it writes a log line and holds
    the stop Event's lock, where logging again would raise and setting the Event would hang."""
    from kafka2delta.cli import _parser
    from kafka2delta.config import load_config
    from kafka2delta.coordinator import Coordinator, NoBackend
    from kafka2delta.spark import commands, jobs
    from kafka2delta.spark.report import Report

    class TurnUnderWay:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def run(self, *, stop: threading.Event, **kwargs: Any) -> Report:
            with stop._cond:  # type: ignore[attr-defined]  # the signal comes inside the Event's lock, in a log line
                logging.getLogger("kafka2delta.spark.jobs").info("turn 1: %s", LoudArgument())
            assert stop.wait(10), "the stop never came"
            return Report("ttl", "t")

    class LoudArgument:
        sent = False

        def __str__(self) -> str:
            if not LoudArgument.sent:  # once: each log handler formats the record, some after the test
                LoudArgument.sent = True
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.2)  # the handler runs at the next bytecode of this thread
            return "under way"

    monkeypatch.setattr(jobs, "StreamingJob", TurnUnderWay)
    config_path = tmp_path / "c.toml"
    config_path.write_text(f'[kafka]\nbootstrap_servers = "x:1"\ntopic = "t"\n[table]\nuri = "{tmp_path / "t"}"\n')
    args = _parser().parse_args(["jobs", "ttl", "-c", str(config_path)])
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM)}

    def hung(signum: int, frame: Any) -> None:
        raise TimeoutError("the SIGTERM handler hung on a lock the main thread held")

    signal.signal(signal.SIGALRM, hung)  # a handler that takes the lock would hang the test, not fail it
    signal.alarm(30)
    try:
        with caplog.at_level(logging.INFO):
            code = commands._job(args, load_config(config_path, {}), None, Coordinator(NoBackend(), "t"), "ttl")  # type: ignore[arg-type]
    finally:
        signal.alarm(0)
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    assert code == 0
    assert "received SIGTERM: stopping after this turn" in caplog.messages
    assert "turn 1: under way" in caplog.messages


def test_the_daemon_gives_its_status_board_the_logs_redactor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``ingest`` builds one Redactor from the config's secrets: the log handler's and the loop's (its status board
    masks the same secrets as the logs, a SAS token's signature among them)."""
    from kafka2delta import cli
    from kafka2delta.logs import Redactor

    given: dict[str, Any] = {}

    class Loop:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            given.update(kwargs)

        def run(self, until_caught_up: bool = False) -> None:
            pass

    environ = {
        "K2D_KAFKA__BOOTSTRAP_SERVERS": "x:1",
        "K2D_KAFKA__TOPIC": "t",
        "K2D_TABLE__URI": str(tmp_path / "t"),
        "K2D_TABLE__STORAGE_OPTIONS__AZURE_STORAGE_SAS_KEY": "sv=2022-11-02&sig=c2lnbmF0dXJl%2Bc2ln%3D",
        "K2D_METRICS__PORT": "0",
    }
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(cli, "Ingestor", Loop)
    monkeypatch.setattr(cli, "KafkaSource", lambda *args, **kwargs: None)
    monkeypatch.setattr(cli, "open_dead_letters", lambda *args, **kwargs: None)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    signals = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        assert cli.main(["ingest"]) == 0
        redact = given["redact"]
        assert isinstance(redact, Redactor) and redact("GET /t?sig=c2lnbmF0dXJl+c2ln=") == "GET /t?sig=***"
        assert any(getattr(f, "_redact", None) is redact for f in root.handlers[0].filters)  # the logs' own
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        for signum, handler in signals.items():
            signal.signal(signum, handler)
