"""The chaos suite's tools: a producer that mixes poison messages in, faults, and the verdict of the
independent checker (:mod:`kafka2delta.verify`): lost 0, duplicated 0, every poison message a dead letter.

Short forms run in the default suite; ``K2D_CHAOS=full`` (``make chaos``) runs the full forms with larger
counts (:func:`scale`).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from kafka2delta.kafka import topic_partitions
from kafka2delta.records import PartitionMessages
from kafka2delta.spark.tables import data_files, referenced_paths
from kafka2delta.verify import Report, compare, log_gaps, read_topic, rows_beyond_txn
from kafka2delta.verify_reading import dead_letter_filter, read_table
from tests.support.harness import Daemon, Setup, Topic, event, wait_for

FORM = "full" if os.environ.get("K2D_CHAOS", "").lower() == "full" else "short"


FULL = FORM == "full"


POISON = b"POISON"


METADATA = ["partition", "offset"]


# Daemons of the chaos suite leave a dead member's group sooner (the broker's minimum session timeout).
FAST_GROUP = {"K2D_KAFKA__SETTINGS__SESSION_TIMEOUT_MS": "6000"}


def scale(short: int, full: int) -> int:
    return full if FULL else short


def poisoned(every: int) -> Callable[[int, int], bytes]:
    """Events where one message in ``every`` is poison: alternately invalid JSON and a wrong type
    (a text ``seq`` for a ``long`` column). Each carries the marker the checker looks for."""

    def payload(partition: int, seq: int) -> bytes:
        if seq % every != every // 2:
            return event(partition, seq)
        marker = f"POISON-p{partition}-{seq}"
        if (seq // every) % 2:
            return b'{"id": "' + marker.encode() + b'", "seq": '  # truncated: invalid JSON
        return json.dumps({"id": marker, "seq": "not a number", "type": "click"}).encode()

    return payload


class ChaosProducer:
    """Produces ``per_partition`` events to every partition in chunks (with poison), in a thread. It
    rides out broker outages: each chunk is flushed until delivered (librdkafka retries)."""

    def __init__(
        self,
        topic: Topic,
        per_partition: int,
        every: int = 50,
        chunk: int = 200,
        pause_s: float = 0.05,
        start: int = 0,
        payload: Callable[[int, int], bytes] | None = None,
    ) -> None:
        """``payload(partition, seq)``: the messages (default: events with one poison message in ``every``)."""
        self.produced = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._args = (topic, per_partition, chunk, pause_s, start)
        self._payload = payload or poisoned(every)
        self._thread = threading.Thread(target=self._run, name="chaos-producer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        topic, per_partition, chunk, pause_s, start = self._args
        payload = self._payload
        producer = Producer(
            {"bootstrap.servers": topic.bootstrap, "linger.ms": 20, "batch.num.messages": 10000, "log_level": 0}
        )
        try:
            for first in range(start, start + per_partition, chunk):
                if self._stop.is_set():
                    break
                for seq in range(first, min(first + chunk, start + per_partition)):
                    for partition in range(topic.partitions):
                        while True:
                            try:
                                producer.produce(topic.name, value=payload(partition, seq), partition=partition)
                                break
                            except BufferError:
                                producer.poll(0.1)
                deadline = time.monotonic() + 600
                while producer.flush(5) and time.monotonic() < deadline:
                    pass  # the broker is away: librdkafka retries until message.timeout.ms
                assert producer.flush(0) == 0, "messages not delivered in 10 minutes"
                self.produced += (min(first + chunk, start + per_partition) - first) * topic.partitions
                time.sleep(pause_s)
        except BaseException as exc:  # reported by join() and running()
            self.error = exc

    def done(self) -> bool:
        return not self._thread.is_alive()

    def running(self) -> bool:
        """Still producing (a producer that failed is reported here, not taken for a finished one)."""
        if self.error is not None:
            raise AssertionError(f"the producer failed: {self.error!r}") from self.error
        return not self.done()

    def stop(self) -> int:
        """Stop after the chunk in flight (the faults are over); return the messages produced."""
        self._stop.set()
        return self.join()

    def join(self, timeout: float = 900) -> int:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the producer did not finish"
        if self.error is not None:
            raise self.error
        return self.produced


@dataclass
class Verdict:
    report: Report
    messages: int
    rows: int
    dead_letters: int
    poison: int
    poison_not_dead_lettered: int
    dead_letters_not_poison: int
    pending: int

    @property
    def figures(self) -> dict[str, int]:
        return {
            "messages": self.messages,
            "rows": self.rows,
            "dead_letters": self.dead_letters,
            "poison": self.poison,
            "lost": self.report.lost,
            "duplicated": self.report.duplicated,
            "in_both": sum(len(p.in_both) for p in self.report.partitions),
            "unexpected": sum(len(p.unexpected) for p in self.report.partitions),
            "beyond_txn": self.report.beyond_txn,
            "log_gaps": self.report.gaps,
            "poison_not_dead_lettered": self.poison_not_dead_lettered,
            "dead_letters_not_poison": self.dead_letters_not_poison,
            "pending": self.pending,
        }


def verify(
    bootstrap: str,
    topic: str,
    table_uri: str,
    app_id: str,
    storage_options: Mapping[str, str] | None = None,
    dead_letter_uri: str | None = None,
) -> Verdict:
    """Run kafka2delta.verify's checks and compare the dead-letter table with the poison sent."""
    options = dict(storage_options or {})
    letters_uri = dead_letter_uri or f"{table_uri}_dead_letters"
    poison: dict[int, set[int]] = defaultdict(set)

    def spot(messages: PartitionMessages) -> list[int]:
        for offset, payload in zip(messages.offsets, messages.payloads, strict=True):
            if payload is not None and POISON in payload:
                poison[messages.partition].add(offset)
        return []  # no filter: every message is a row or a dead letter

    # As verify does: each table's rows and txns from one snapshot, both read before the topic.
    topic_partition_ids = topic_partitions(bootstrap, topic, {})
    table = read_table(
        table_uri, options, app_id, topic_partition_ids, "kafka_partition", "kafka_offset", lambda schema: None
    )
    letters = read_table(
        letters_uri, options, f"{app_id}-dlq", topic_partition_ids, "partition", "offset",
        lambda schema: dead_letter_filter(app_id, topic),
    )  # fmt: skip
    offsets = read_topic(bootstrap, topic, {}, filtered=spot)
    rows = table.rows
    report = Report(
        topic, table_uri, letters_uri, compare(offsets, rows, letters.rows, table.txns, letters.txns, rows_beyond_txn(table)),
        {table_uri: log_gaps(table_uri, options)}, log_gaps(letters_uri, options),
    )  # fmt: skip
    letter_offsets: dict[int, set[int]] = defaultdict(set)
    for partition, offset in zip(
        letters.rows.column("partition").to_pylist(), letters.rows.column("offset").to_pylist(), strict=True
    ):
        if offset >= offsets.low.get(partition, 0):  # earlier ones were deleted by retention: not readable
            letter_offsets[partition].add(offset)
    partitions = set(poison) | set(letter_offsets)
    return Verdict(
        report=report,
        messages=sum(len(o) for o in offsets.offsets.values()),
        rows=rows.num_rows,
        dead_letters=sum(len(o) for o in letter_offsets.values()),  # at offsets the topic still holds
        poison=sum(len(o) for o in poison.values()),
        poison_not_dead_lettered=sum(len(poison[p] - letter_offsets[p]) for p in partitions),
        dead_letters_not_poison=sum(len(letter_offsets[p] - poison[p]) for p in partitions),
        pending=sum(p.pending for p in report.partitions),
    )


def assert_verdict(verdict: Verdict) -> None:
    figures = verdict.figures
    bad = {
        k: figures[k]
        for k in (
            "lost",
            "duplicated",
            "in_both",
            "unexpected",
            "beyond_txn",
            "log_gaps",
            "poison_not_dead_lettered",
            "dead_letters_not_poison",
            "pending",
        )
        if figures[k]
    }
    assert not bad, f"{bad}\n{verdict.report.render()}"
    assert verdict.poison > 0, "every scenario mixes poison in"


def chaos_setup(make_setup: Callable[..., Setup], partitions: int, **kwargs: Any) -> Setup:
    """A setup whose rows record their Kafka partition and offset (what the checker reads), in row groups of 100
    rows: every fault meets lanes whose rows are being encoded into their next file while buffered."""
    table = {"metadata_columns": METADATA, **kwargs.pop("table", {})}
    return make_setup(partitions, table=table, **{"row_group_rows": 100, **kwargs})


def drain(
    start_daemon: Callable[..., Daemon],
    setup: Setup,
    env: Mapping[str, str] | None = None,
    timeout: float = 600,
) -> Daemon:
    """A last daemon run that commits everything up to the high watermarks and exits 0."""
    final = start_daemon(setup, "--until-caught-up", env={**FAST_GROUP, **(env or {})})
    assert final.wait(timeout) == 0, final.log()[-4000:]
    return final


def stop(daemon: Daemon, timeout: float = 180) -> None:
    """SIGTERM once the daemon runs its loop (its handler is installed by then), and expect exit 0."""
    wait_for(lambda: "assigned " in daemon.log() or daemon.process.poll() is not None, 180, "an assignment")
    code = daemon.stop(timeout)
    assert code == 0, daemon.log()[-4000:]


def check(setup: Setup, storage_options: Mapping[str, str] | None = None, table_uri: str | None = None) -> Verdict:
    verdict = verify(
        setup.topic.bootstrap, setup.topic.name, table_uri or setup.table_uri, setup.app_id, storage_options
    )
    assert_verdict(verdict)
    return verdict


def wait_committed(setup: Setup, minimum: int = 1, timeout: float = 120) -> None:
    """Until the table holds at least ``minimum`` rows."""

    def enough() -> bool:
        try:
            return len(setup.ids()) >= minimum
        except Exception:  # a table being created
            return False

    wait_for(enough, timeout, f"{minimum} committed rows")


def random_pause(low: float, high: float, rng: random.Random | None = None) -> float:
    pause = (rng or random).uniform(low, high)
    time.sleep(pause)
    return pause


@dataclass
class ChaosResult:
    """What one scenario did and what the checker saw; written to ``results/<form>/<test>.json``."""

    scenario: str = ""
    faults: dict[str, int] = field(default_factory=dict)
    notes: str = ""
    verdict: Verdict | None = None
    figures: dict[str, int] = field(default_factory=dict)
    """Verdict figures of a scenario checked another way (``kafka2delta verify`` over several tables)."""

    def fault(self, name: str, count: int = 1) -> None:
        self.faults[name] = self.faults.get(name, 0) + count


@contextlib.contextmanager
def read_only(*directories: Path) -> Iterator[None]:
    """No entry can be created or removed in ``directories`` (chmod a-w; root ignores modes, so as
    root the directories are also made immutable with chattr +i)."""
    modes = {d: d.stat().st_mode for d in directories}
    immutable: list[Path] = []
    try:
        for directory in directories:
            directory.chmod(0o555)
            if os.geteuid() == 0:
                subprocess.run(["chattr", "+i", str(directory)], check=True)
                immutable.append(directory)
        yield
    finally:
        for directory in immutable:
            subprocess.run(["chattr", "-i", str(directory)], check=True)
        for directory, mode in modes.items():
            directory.chmod(mode)


def crash_leaving_orphans(setup: Setup, daemon_factory: Callable[..., Daemon]) -> tuple[list[str], set[str], set[str]]:
    """100 messages ingested by a daemon that SIGKILLs itself after writing Parquet, before committing, then by one
    that catches up (replaying into new files); every data file then made two hours old, so only the log tells the
    orphans from the committed files. The ids produced, the orphans and the committed files (paths in the table)."""
    produced = setup.topic.produce(100)
    crashed = daemon_factory(setup, env={**FAST_GROUP, "K2D_FAULT_INJECT": "after_parquet_write"})
    assert crashed.wait(120) == -9  # SIGKILLed itself after writing Parquet, before committing
    orphans = {f.path for f in data_files(setup.table_uri)} - referenced_paths(setup.table_uri)
    assert orphans, "the crash left no uncommitted file"
    assert daemon_factory(setup, "--until-caught-up").wait(120) == 0
    committed = referenced_paths(setup.table_uri)
    assert not orphans & committed
    old = time.time() - 2 * 3600
    for f in data_files(setup.table_uri):
        os.utime(os.path.join(setup.table_uri, f.path), (old, old))
    return produced, orphans, committed
