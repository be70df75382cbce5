"""Helpers of the multi-topic routing tests (tests/integration/test_routing.py): config files for several
topics, reading one table per topic, creating many topics at once, a daemon measured by ``wait4``, and the
generator of the legacy single-topic fixture (tests/fixtures/legacy_single_topic/, see its README)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic  # what confluent_kafka.admin re-exports (not in its __all__)
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from tests.support.harness import METADATA_COLUMNS, ROOT, SCHEMA, Setup, Topic, event, toml_section

FIXTURES = ROOT / "tests" / "fixtures"
LEGACY_FIXTURE = FIXTURES / "legacy_single_topic"
LEGACY_TOPIC = "k2d-legacy-orders"
"""The fixed topic name the legacy fixture's table was written from (its commits name it)."""
LEGACY_PARTITIONS = 2
LEGACY_APP_ID = "shop"
LEGACY_ROUNDS = ((0, 12), (12, 12))
"""(first seq, messages per partition) of each run of the release that wrote the fixture: two commits."""
LEGACY_BAD = {(0, 5)}
"""(partition, seq) of the malformed messages among the fixture's (a dead letter each)."""
LEGACY_TABLE = "orders"
"""The fixture's table directory; its dead-letter table is ``orders_dead_letters`` (the release's default)."""

BROKEN = b'{"id": "broken'


def legacy_payload(partition: int, seq: int) -> bytes:
    """The legacy topic's messages: ``event`` except a malformed one at each of :data:`LEGACY_BAD`."""
    return BROKEN if (partition, seq) in LEGACY_BAD else event(partition, seq)


def write_config(
    path: Path,
    bootstrap: str,
    kafka: dict[str, Any],
    table: dict[str, Any],
    *,
    schema: dict[str, str] | None = None,
    ingest: dict[str, Any] | None = None,
    refresh_ms: int | None = None,
    metrics_port: int | None = None,
) -> Path:
    """A config file: ``kafka`` holds the subscription (topic, topics or topic_pattern) and anything else of
    [kafka]; ``table`` the [table] keys (uri, app_id, metadata_columns …); ``metrics_port`` serves /metrics and
    /status.json on loopback."""
    settings = {"session.timeout.ms": "10000", "heartbeat.interval.ms": "1000"}
    if refresh_ms is not None:
        settings["topic.metadata.refresh.interval.ms"] = str(refresh_ms)
    lines = [
        *toml_section("kafka", {"bootstrap_servers": bootstrap, "group_id": f"g-{path.parent.name}", **kafka}),
        *toml_section("kafka.settings", settings),
        *toml_section("table", {"metadata_columns": METADATA_COLUMNS, **table}),
        *toml_section("table.schema", schema if schema is not None else SCHEMA),
        *toml_section("ingest", {"allowed_latency_s": 1.0, "progress_interval_s": 2.0, **(ingest or {})}),
        *(toml_section("metrics", {"port": metrics_port, "host": "127.0.0.1"}) if metrics_port else []),
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def setup_for(config: Path, topic: Topic, table_uri: str | Path) -> Setup:
    """A :class:`Setup` for ``daemon_factory`` and ``Setup.verify`` (both use only its config file)."""
    return Setup(topic, str(table_uri), config, config.parent, topic.name)


def open_table(uri: str | Path) -> DeltaTable | None:
    try:
        return DeltaTable(str(uri))
    except TableNotFoundError:
        return None


def rows(uri: str | Path, columns: Sequence[str] | None = None) -> list[dict[str, Any]]:
    table = open_table(uri)
    if table is None:
        return []
    found: list[dict[str, Any]] = table.to_pyarrow_table(columns=list(columns) if columns else None).to_pylist()
    return found


def ids(uri: str | Path) -> list[str]:
    return [row["id"] for row in rows(uri, ["id"])]


def topic_ids(uri: str | Path) -> Counter[tuple[str, str]]:
    """(kafka_topic, id) of every row, counted: a table several topics write holds the same ids per topic."""
    return Counter((row["kafka_topic"], row["id"]) for row in rows(uri, ["kafka_topic", "id"]))


def txn_versions(uri: str | Path, app_ids: Iterable[str]) -> dict[str, int | None]:
    table = DeltaTable(str(uri))
    return {app_id: table.transaction_version(app_id) for app_id in app_ids}


def expected_ids(partitions: int, seqs: Iterable[int], bad: Iterable[tuple[int, int]] = ()) -> list[str]:
    """The ids ``event`` gives ``seqs`` in each partition, less the (partition, seq) of ``bad``."""
    skip = set(bad)
    return [f"p{p}-{s}" for s in seqs for p in range(partitions) if (p, s) not in skip]


def duplicates(values: Iterable[Any]) -> dict[Any, int]:
    return {value: count for value, count in Counter(values).items() if count > 1}


def create_topics(bootstrap: str, names: Sequence[str], partitions: int = 1, timeout: float = 60) -> None:
    """Create ``names`` in ONE CreateTopics request and wait until every partition has a leader."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1) for name in names],
        operation_timeout=timeout,
        request_timeout=timeout,
    )
    for future in futures.values():
        future.result(timeout=timeout)
    deadline = time.monotonic() + timeout
    waiting = set(names)
    while waiting:
        try:
            metadata = admin.list_topics(timeout=10).topics
        except KafkaException:
            metadata = {}
        waiting = {
            name
            for name in waiting
            if name not in metadata
            or metadata[name].error is not None
            or len(metadata[name].partitions) < partitions
            or any(p.leader < 0 or p.error is not None for p in metadata[name].partitions.values())
        }
        if waiting and time.monotonic() > deadline:
            raise TimeoutError(f"{len(waiting)} topics without leaders after {timeout} s: {sorted(waiting)[:5]}")
        if waiting:
            time.sleep(0.2)


def produce(bootstrap: str, messages: Iterable[tuple[str, int, bytes | None]]) -> None:
    """Produce (topic, partition, value) messages in order, with one producer."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for topic, partition, value in messages:
        while True:
            try:
                producer.produce(topic, value=value, partition=partition)
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(60) == 0


def daemon_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("K2D_")}


@dataclass
class Measured:
    exit_code: int
    max_rss_kib: int
    """The daemon process's peak resident set (``ru_maxrss`` of its own ``wait4``)."""
    wall_s: float


def run_measured(args: Sequence[str], log_path: Path, timeout: float) -> Measured:
    """Run a command to its end and return its exit code, peak RSS and wall time. The peak is the process's
    own rusage, read by ``os.wait4`` on its pid: exact, and not mixed with any other child of the tests."""
    started = time.monotonic()
    with open(log_path, "ab") as log:
        process = subprocess.Popen(args, env=daemon_env(), stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            while True:
                pid, status, usage = os.wait4(process.pid, os.WNOHANG)
                if pid:
                    wall = time.monotonic() - started
                    process.returncode = os.waitstatus_to_exitcode(status)  # Popen must not wait for it again
                    return Measured(process.returncode, usage.ru_maxrss, wall)
                if time.monotonic() - started > timeout:
                    process.send_signal(signal.SIGKILL)
                    process.wait()
                    raise AssertionError(f"{args} did not exit in {timeout} s; log:\n{log_path.read_text()[-4000:]}")
                time.sleep(0.1)
        finally:
            if process.returncode is None:
                process.kill()
                process.wait()


# --- the legacy fixture -----------------------------------------------------------------------------------


def make_legacy_fixture(bootstrap: str, release: Path, out: Path) -> None:
    """Write the legacy fixture with the release unpacked in ``release`` (``git archive <commit> kafka2delta
    pyproject.toml``): topic :data:`LEGACY_TOPIC` (created here: it must not exist), one run of the release
    per :data:`LEGACY_ROUNDS`, then the table and its dead-letter table copied to ``out``."""
    create_topics(bootstrap, [LEGACY_TOPIC], LEGACY_PARTITIONS)
    with tempfile.TemporaryDirectory() as work:
        lake = Path(work)
        config = lake / "config.toml"
        lines = [
            *toml_section(
                "kafka", {"bootstrap_servers": bootstrap, "topic": LEGACY_TOPIC, "group_id": "k2d-legacy-fixture"}
            ),
            *toml_section(
                "table",
                {"uri": str(lake / LEGACY_TABLE), "app_id": LEGACY_APP_ID, "metadata_columns": METADATA_COLUMNS},
            ),
            *toml_section("table.schema", SCHEMA),
            *toml_section("ingest", {"allowed_latency_s": 1.0}),
        ]
        config.write_text("\n".join(lines) + "\n")
        env = {**daemon_env(), "PYTHONPATH": str(release)}
        for first, count in LEGACY_ROUNDS:
            produce(
                bootstrap,
                (
                    (LEGACY_TOPIC, p, legacy_payload(p, seq))
                    for seq in range(first, first + count)
                    for p in range(LEGACY_PARTITIONS)
                ),
            )
            done = subprocess.run(
                [sys.executable, "-m", "kafka2delta", "ingest", "-c", str(config), "--until-caught-up"],
                cwd=release,
                env=env,
                capture_output=True,
                text=True,
                timeout=180,
            )
            print(done.stdout + done.stderr)
            assert done.returncode == 0
        out.mkdir(parents=True, exist_ok=True)
        for name in (LEGACY_TABLE, f"{LEGACY_TABLE}_dead_letters"):
            shutil.rmtree(out / name, ignore_errors=True)
            shutil.copytree(lake / name, out / name)
        for log_file in sorted(out.glob("*/_delta_log/*.json")):
            scrub_location(log_file)
            text = log_file.read_text()
            assert work not in text and "file:" not in text, (log_file, text)


def scrub_location(log_file: Path) -> None:
    """Drop ``operationParameters.location`` (the absolute directory the table was created in) from the
    commitInfo of a CREATE TABLE: informational only, no reader uses it. Every other line is kept as it is."""
    lines = []
    for line in log_file.read_text().splitlines():
        action = json.loads(line)
        parameters = action.get("commitInfo", {}).get("operationParameters", {})
        if "location" in parameters:
            del parameters["location"]
            line = json.dumps(action, separators=(",", ":"))
        lines.append(line)
    log_file.write_text("\n".join(lines) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="write tests/fixtures/legacy_single_topic with a release")
    parser.add_argument("--bootstrap", required=True, help="a broker where topic k2d-legacy-orders does not exist")
    parser.add_argument("--release", required=True, type=Path, help="the release's kafka2delta, unpacked")
    parser.add_argument("--out", type=Path, default=LEGACY_FIXTURE)
    args = parser.parse_args(argv)
    make_legacy_fixture(args.bootstrap, args.release.resolve(), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
