"""Logging: plain and JSON lines, topic/partition/offset fields, and secrets that never appear — not in the
message, its arguments, an exception's text, a stack, or a JSON field."""

from __future__ import annotations

import io
import json
import logging
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from kafka2delta.config import Config, load_config
from kafka2delta.logs import Redactor, sas_values, setup_logging

ROOT = Path(__file__).resolve().parents[2]
SASL_PASSWORD = 'sasl-"pa\\ss"-9f3k'  # a quote and a backslash: its JSON and repr forms differ from it
REGISTRY_PASSWORD = "registry-p@ss/w0rd"  # URL-quoted it reads registry-p%40ss%2Fw0rd


def secret_config(tmp_path: Path) -> Config:
    return load_config(
        None,
        environ={
            "K2D_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:1",
            "K2D_KAFKA__TOPIC": "events",
            "K2D_TABLE__URI": str(tmp_path / "t"),
            "K2D_KAFKA__SETTINGS__SASL_PASSWORD": SASL_PASSWORD,
            "K2D_SCHEMA_REGISTRY__USERNAME": "ingest",
            "K2D_SCHEMA_REGISTRY__PASSWORD": REGISTRY_PASSWORD,
            "K2D_LOGGING__FORMAT": "json",
        },
    )


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def lines(stream: io.StringIO) -> list[str]:
    return [line for line in stream.getvalue().splitlines() if line]


def test_json_lines_carry_time_level_logger_message_and_the_message_position(restore_logging: None) -> None:
    stream = io.StringIO()
    setup_logging("INFO", "json", (), stream)
    log = logging.getLogger("kafka2delta.runner")
    log.warning("dead letter %s stage=%s reason=%s", "events[3]@1042", "coerce", "column 'id' is required")
    log.info("committed version %d (latency): %s", 7, "events[0]@0..9, events[1]@0..4")
    log.warning("%s[%d]: another writer committed up to offset %s", "events", 2, 17)
    log.info("explicit", extra={"topic": "other", "partition": 1, "offset": 5})
    logging.getLogger("kafka2delta.librdkafka").debug("not shown at INFO")
    records = [json.loads(line) for line in lines(stream)]
    assert len(records) == 4
    first = records[0]
    assert set(first) == {"time", "level", "logger", "message", "topic", "partition", "offset"}
    assert first["level"] == "WARNING" and first["logger"] == "kafka2delta.runner"
    assert first["message"].startswith("dead letter events[3]@1042 stage=coerce")
    assert (first["topic"], first["partition"], first["offset"]) == ("events", 3, 1042)
    assert first["time"].endswith("Z") and "T" in first["time"]
    assert "topic" not in records[1]  # several ranges: about many messages, no fields
    assert (records[2]["topic"], records[2]["partition"]) == ("events", 2) and "offset" not in records[2]
    assert (records[3]["topic"], records[3]["partition"], records[3]["offset"]) == ("other", 1, 5)


def test_plain_lines_keep_the_house_format(restore_logging: None) -> None:
    stream = io.StringIO()
    setup_logging("INFO", "plain", (), stream)
    logging.getLogger("kafka2delta.runner").warning("dead letter %s", "events[3]@1042")
    (line,) = lines(stream)
    assert line.endswith(" WARNING kafka2delta.runner: dead letter events[3]@1042")


@pytest.mark.parametrize("fmt", ["plain", "json"])
def test_secrets_never_appear(fmt: str, tmp_path: Path, restore_logging: None) -> None:
    config = secret_config(tmp_path)
    assert set(config.secret_values()) == {SASL_PASSWORD, REGISTRY_PASSWORD}
    stream = io.StringIO()
    setup_logging("DEBUG", fmt, config.secret_values(), stream)  # type: ignore[arg-type]
    log = logging.getLogger("kafka2delta.registry")
    log.info("config: %s", config.masked())
    log.info("connecting with %s", SASL_PASSWORD)
    log.info("registry url http://user:%s@registry:8081/", REGISTRY_PASSWORD)
    try:
        raise ConnectionError(f"401 for user:{REGISTRY_PASSWORD} and {SASL_PASSWORD!r}")
    except ConnectionError:
        log.exception("registry call failed")
    try:
        raise ValueError({"sasl.password": SASL_PASSWORD})  # repr-escaped inside a dict
    except ValueError as exc:
        log.error("bad settings: %r", exc, exc_info=True)
    log.warning("as JSON: %s", json.dumps({"password": SASL_PASSWORD}))
    log.warning("quoted: https://registry/?p=registry-p%40ss%2Fw0rd")
    log.info("in a field", extra={"topic": f"t-{REGISTRY_PASSWORD}"})
    log.info("with a stack", stack_info=True)
    output = stream.getvalue()
    for secret in (SASL_PASSWORD, REGISTRY_PASSWORD, 'sasl-\\"pa\\\\ss\\"-9f3k', 'sasl-\\"pa', "pa\\\\ss", "p%40ss"):
        assert secret not in output, (secret, output)
    assert output.count("***") >= 8
    if fmt == "json":
        records = [json.loads(line) for line in lines(stream)]
        assert len(records) == 9
        assert "ConnectionError" in records[3]["exception"] and "***" in records[3]["exception"]
        assert records[7]["topic"] == "t-***"


def test_the_cli_writes_json_lines_without_secrets(tmp_path: Path) -> None:
    """The entry point configures JSON logging from logging.format (librdkafka's lines too). With the broker out,
    a SIGTERM stops the start-up at once: exit 0, nothing to commit (it used to wait out the 30-s metadata
    deadline and exit 1)."""
    env = {
        "PATH": "/usr/bin:/bin",
        "K2D_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:1",
        "K2D_KAFKA__TOPIC": "events",
        "K2D_KAFKA__SETTINGS__SASL_PASSWORD": SASL_PASSWORD,
        "K2D_KAFKA__SETTINGS__SOCKET_CONNECTION_SETUP_TIMEOUT_MS": "1000",
        "K2D_SCHEMA_REGISTRY__USERNAME": "ingest",
        "K2D_SCHEMA_REGISTRY__PASSWORD": REGISTRY_PASSWORD,
        "K2D_TABLE__URI": str(tmp_path / "t"),
        "K2D_TABLE__SCHEMA": '{"id": "string"}',
        "K2D_LOGGING__FORMAT": "json",
        "K2D_METRICS__PORT": "0",
    }
    daemon = subprocess.Popen(
        [sys.executable, "-m", "kafka2delta", "ingest"], stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env
    )
    assert daemon.stderr is not None
    deadline = threading.Timer(60, daemon.kill)  # a daemon that hangs fails the exit code below, not the suite
    deadline.start()
    seen = []
    for line in daemon.stderr:  # until librdkafka has said it cannot connect
        seen.append(line)
        if '"kafka2delta.librdkafka"' in line:
            break
    daemon.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    stderr = "".join(seen) + daemon.stderr.read()  # the same reader as above: nothing it buffered is lost
    daemon.wait()
    stopped_s = time.monotonic() - signalled
    deadline.cancel()
    assert daemon.returncode == 0, stderr[-3000:]
    assert stopped_s < 15, f"{stopped_s:.1f} s from SIGTERM to exit: it waited for the broker"  # was 30 s
    assert SASL_PASSWORD not in stderr and REGISTRY_PASSWORD not in stderr
    records = [json.loads(line) for line in stderr.splitlines() if line.strip()]
    assert records and all({"time", "level", "logger", "message"} <= set(r) for r in records)
    messages = [r["message"] for r in records]
    assert "received SIGTERM: flushing, committing and stopping" in messages
    assert "stop asked for before Kafka answered: not joining the group" in messages


SIGNATURE = "Zk9v+YmFy/c2VjcmV0LXNpZ25hdHVyZQ=="  # base64: '+', '/' and '=' change when percent-encoded
SAS_TOKEN = f"?sv=2022-11-02&ss=b&srt=sco&sp=rl&se=2027-01-01T00:00:00Z&spr=https&sig={quote(SIGNATURE, safe='')}"


@pytest.mark.parametrize("configured", [SAS_TOKEN, SAS_TOKEN.replace(quote(SIGNATURE, safe=""), SIGNATURE)])
def test_a_sas_tokens_signature_is_masked_in_any_order_and_encoding(configured: str) -> None:
    """object_store decodes the SAS token, splits it and re-encodes each value into its request URIs: its errors
    show the parameters in another order than the configured string, the signature encoded or not."""
    redact = Redactor([configured])
    uri = "https://acct.blob.core.windows.net/c/t/_delta_log/00000000000000000007.json"
    encoded = f"{uri}?sp=rl&sig={quote(SIGNATURE, safe='')}&sv=2022-11-02 (HTTP 403)"
    decoded = f"{uri}?sig={SIGNATURE}&sv=2022-11-02"
    assert redact(encoded) == f"{uri}?sp=rl&sig=***&sv=2022-11-02 (HTTP 403)"
    assert redact(decoded) == f"{uri}?sig=***&sv=2022-11-02"
    assert redact(f"{configured!r}") == "'***'"  # the whole token, as before
    # Its public parameters are ordinary text elsewhere: they stay.
    assert redact("https://registry:8081 sco 2022-11-02 rl") == "https://registry:8081 sco 2022-11-02 rl"


def test_only_a_sas_token_is_split() -> None:
    """A secret with & and = but no signature is masked whole only: its parts may be ordinary words."""
    assert sas_values("user=ingest&scope=orders") == set()
    assert sas_values("hunter2-pw") == set() and sas_values("a=b=c") == set()
    assert Redactor(["user=ingest&scope=orders"])("orders from ingest") == "orders from ingest"
    assert sas_values(f"sv=2022-11-02&sig={quote(SIGNATURE, safe='')}&skoid=0f3c") == {
        quote(SIGNATURE, safe=""),
        SIGNATURE,
        "0f3c",
    }


def test_the_cli_redactor_is_the_logs_redactor(restore_logging: None) -> None:
    """setup_logging takes the entry point's Redactor (the status page's too) instead of building its own."""
    redact, stream = Redactor([SAS_TOKEN]), io.StringIO()
    handler = setup_logging("INFO", "plain", redact, stream)
    assert any(getattr(f, "_redact", None) is redact for f in handler.filters)
    logging.getLogger("kafka2delta.writer").warning("refused: %s", f"GET /c?sig={quote(SIGNATURE, safe='')}")
    assert stream.getvalue().rstrip().endswith("refused: GET /c?sig=***")
