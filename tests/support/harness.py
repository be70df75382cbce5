"""The real-broker test harness: topics and producers, the daemon as a subprocess, reading its tables.

The fixtures that build these (``topic_factory``, ``setup_factory``, ``daemon_factory``) are in
``tests/conftest.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

ROOT = Path(__file__).resolve().parents[2]


# Rows record where they came from unless a test opts out (setup_factory(metadata_columns=None)):
# what `kafka2delta verify` reads.
METADATA_COLUMNS = ["topic", "partition", "offset"]


SCHEMA = {
    "id": "string not null",
    "seq": "long",
    "type": "string",
    "amount": "double",
    "ts": "timestamp",
    "user": "struct<id:long,country:string>",
}


def event(partition: int, seq: int) -> bytes:
    return json.dumps(
        {
            "id": f"p{partition}-{seq}",
            "seq": seq,
            "type": "click" if seq % 3 else "purchase",
            "amount": seq * 0.5,
            "ts": "2026-11-22T10:00:00.123456Z",
            "user": {"id": seq % 97, "country": "FR"},
        }
    ).encode()


@dataclass
class Message:
    partition: int
    value: bytes | None
    key: bytes | None = None
    headers: list[tuple[str, str | bytes | None]] | None = None


@dataclass
class Topic:
    name: str
    partitions: int
    bootstrap: str

    def produce_messages(self, messages: list[Message]) -> None:
        """Produce ``messages`` as they are (partition, key, value, headers), in order."""
        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 20, "batch.num.messages": 10000})
        for message in messages:
            while True:
                try:
                    producer.produce(
                        self.name,
                        value=message.value,
                        key=message.key,
                        partition=message.partition,
                        headers=message.headers,
                    )
                    break
                except BufferError:
                    producer.poll(0.1)
        assert producer.flush(60) == 0

    def produce(
        self, per_partition: int, start: int = 0, payload: Callable[[int, int], bytes | None] = event
    ) -> list[str]:
        """Produce ``per_partition`` events to each partition; return the ids produced (None payloads excluded)."""
        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 20, "batch.num.messages": 10000})
        ids = []
        for seq in range(start, start + per_partition):
            for partition in range(self.partitions):
                value = payload(partition, seq)
                while True:
                    try:
                        producer.produce(self.name, value=value, partition=partition)
                        break
                    except BufferError:
                        producer.poll(0.1)
                if value:
                    ids.append(f"p{partition}-{seq}")
        assert producer.flush(60) == 0
        return ids


class BackgroundProducer:
    """Produces ``per_partition`` events per partition in small chunks while a daemon runs (or until ``stop``)."""

    def __init__(
        self, topic: Topic, per_partition: int, start: int = 0, chunk: int = 100, pause_s: float = 0.05
    ) -> None:
        self.ids: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(topic, per_partition, start, chunk, pause_s))
        self._thread.start()

    def _run(self, topic: Topic, per_partition: int, start: int, chunk: int, pause_s: float) -> None:
        for first in range(start, start + per_partition, chunk):
            if self._stop.is_set():
                return
            self.ids.extend(topic.produce(min(chunk, start + per_partition - first), start=first))
            time.sleep(pause_s)

    def running(self) -> bool:
        return self._thread.is_alive()

    def join(self) -> list[str]:
        self._thread.join(300)
        assert not self._thread.is_alive()
        return self.ids

    def stop(self) -> list[str]:
        """Stop after the chunk under way; the ids produced."""
        self._stop.set()
        return self.join()


class Daemon:
    def __init__(self, args: list[str], env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in wait()
        self.process = subprocess.Popen(args, env=env, stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT)

    def wait(self, timeout: float = 120) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"daemon did not exit in {timeout} s; log:\n{self.log()[-4000:]}") from None
        finally:
            self._log.close()

    def stop(self, timeout: float = 60) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.wait(timeout)

    def kill(self) -> None:
        self.process.kill()
        self.wait()

    def kill_if_running(self) -> None:
        """For a test's teardown: a failed assertion must not leave the process running into the next tests."""
        if self.process.poll() is None:
            self.kill()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@dataclass
class Setup:
    topic: Topic
    table_uri: str
    config_path: Path
    tmp_path: Path
    app_id: str
    storage_options: dict[str, str] = field(default_factory=dict)

    def table(self) -> DeltaTable:
        return DeltaTable(self.table_uri, storage_options=self.storage_options or None)

    def ids(self) -> list[str]:
        # Not DeltaTable.is_deltatable: it holds the GIL while it waits for storage, and an S3 server
        # in this process (dev/s3.py) could then never answer.
        try:
            table = self.table()
        except TableNotFoundError:
            return []
        ids: list[str] = table.to_pyarrow_table(columns=["id"]).column("id").to_pylist()
        return ids

    def txn_versions(self) -> dict[int, int | None]:
        table = self.table()
        return {p: table.transaction_version(f"{self.app_id}-{p}") for p in range(self.topic.partitions)}

    @property
    def dead_letter_uri(self) -> str:
        return f"{self.table_uri}_dead_letters"

    def rows(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self.table().to_pyarrow_table().to_pylist()
        return rows

    def dead_letters(self) -> list[dict[str, Any]]:
        """The dead-letter table's rows, by (partition, offset)."""
        try:
            table = DeltaTable(self.dead_letter_uri, storage_options=self.storage_options or None)
        except TableNotFoundError:
            return []
        rows = table.to_pyarrow_table().to_pylist()
        return sorted(rows, key=lambda r: (r["partition"], r["offset"]))

    def dead_letter_txn_versions(self) -> dict[int, int | None]:
        table = DeltaTable(self.dead_letter_uri, storage_options=self.storage_options or None)
        return {p: table.transaction_version(f"{self.app_id}-dlq-{p}") for p in range(self.topic.partitions)}

    def verify(self, *extra: str, timeout: float = 180) -> tuple[int, dict[str, Any] | str]:
        """Run ``kafka2delta verify --json`` on this setup's config: the exit code and the JSON report
        (or, when the output is not JSON, the output)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("K2D_")}
        done = subprocess.run(
            [sys.executable, "-m", "kafka2delta", "verify", "-c", str(self.config_path), "--json", *extra],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        try:
            return done.returncode, json.loads(done.stdout)
        except ValueError:
            return done.returncode, done.stdout + done.stderr

    def maintain(self, *argv: str, timeout: float = 300) -> tuple[int, list[dict[str, Any]] | str]:
        """Run ``kafka2delta maintain <argv> -c <config> --json`` as a process: the exit code and the JSON report of
        each table (or, when there is none, the output)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("K2D_")}
        done = subprocess.run(
            [sys.executable, "-m", "kafka2delta", "maintain", *argv, "-c", str(self.config_path), "--json"],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        reports = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        return done.returncode, reports or done.stdout + done.stderr


def toml_section(name: str, values: dict[str, Any]) -> list[str]:
    """A TOML table; keys and strings are written as JSON strings, which TOML reads the same way."""
    lines = [f"[{name}]"]
    for key, value in values.items():
        lines.append(f"{json.dumps(key)} = {json.dumps(value)}")
    return lines


def wait_for(condition: Callable[..., bool], timeout: float, what: str) -> None:
    """Poll ``condition()`` until true; fail naming ``what`` after ``timeout`` seconds. (``Callable[...]``: tests
    pass lambdas that bind loop values as defaults, ``lambda t=target: …``.)"""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def assert_exactly_once(setup: Setup, produced: list[str]) -> None:
    ids = setup.ids()
    duplicates = len(ids) - len(set(ids))
    missing = set(produced) - set(ids)
    extra = set(ids) - set(produced)
    assert (duplicates, len(missing), len(extra)) == (0, 0, 0), (
        f"duplicates={duplicates} missing={sorted(missing)[:10]} extra={sorted(extra)[:10]}"
    )
