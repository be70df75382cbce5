"""PostgreSQL → Debezium replication for the chaos tests: the source tables and a random workload on them,
waiting for Debezium and the daemon, and comparing a source table with its Delta table value by value."""

from __future__ import annotations

import datetime as dt
import json
import random
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaException
from confluent_kafka import TopicPartition as KafkaTopicPartition

from dev.postgres.postgres import Database
from tests.support.chaos import ChaosResult
from tests.support.harness import Daemon

ACCOUNTS = """CREATE TABLE accounts (
    id bigint PRIMARY KEY, amount numeric(38,10), ratio numeric, name text, active boolean, opened date,
    at time, created timestamp, updated timestamptz, doc jsonb, uid uuid, scores int[])"""
LINES = "CREATE TABLE lines (order_id int, line int, qty int, note text, PRIMARY KEY (order_id, line))"
TAGS = "CREATE TABLE tags (id int PRIMARY KEY, label text)"
KEYS = {"accounts": ["id"], "lines": ["order_id", "line"], "tags": ["id"]}


def account(rng: random.Random, key: int) -> tuple[Any, ...]:
    def maybe(value: Any) -> Any:
        return None if rng.random() < 0.1 else value

    return (
        key,
        maybe(Decimal(rng.randint(-(10**15), 10**15)).scaleb(-10)),
        maybe(Decimal(rng.randint(-(10**9), 10**9)).scaleb(-rng.randint(0, 12))),
        maybe(rng.choice(["plain", "héllo wörld ✓", "日本語 🙂", "", "a'quote"])),
        maybe(rng.random() < 0.5),
        maybe(f"20{rng.randint(0, 30):02d}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"),
        maybe(
            f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}.{rng.randint(0, 999999):06d}"
        ),
        maybe(f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d} 12:34:56.{rng.randint(0, 999999):06d}"),
        maybe(f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d} 01:02:03.5+0{rng.randint(0, 9)}:00"),
        maybe(json.dumps({"n": rng.randint(0, 9), "tags": ["x", None], "é": True})),
        maybe(str(uuid.UUID(int=rng.getrandbits(128)))),
        maybe([rng.randint(-5, 5), None][: rng.randint(0, 2)]),
    )


class Workload:
    """Random changes to the three tables, keeping track of the keys each holds."""

    def __init__(self, database: Database, schema: str, seed: int) -> None:
        self.database = database
        self.schema = schema
        self.rng = random.Random(seed)
        self.keys: dict[str, list[Any]] = {name: [] for name in KEYS}
        self.next_id = 1
        self.extra_added = False

    def connect(self) -> Any:
        conn = self.database.connect()
        conn.execute(f"SET search_path TO {self.schema}")
        return conn

    def snapshot(self, rows: int) -> None:
        with self.database.connect() as conn:
            conn.execute(f"CREATE SCHEMA {self.schema}")
        with self.connect() as conn:
            for statement in (ACCOUNTS, LINES, TAGS):
                conn.execute(statement)
            with conn.cursor() as cursor:
                cursor.executemany(
                    "INSERT INTO accounts VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)",
                    [account(self.rng, self._new_id("accounts")) for _ in range(rows)],
                )
                lines = [(i // 4, i % 4, self.rng.randint(1, 100), "snap") for i in range(rows)]
                cursor.executemany("INSERT INTO lines VALUES (%s,%s,%s,%s)", lines)
                self.keys["lines"] = [(o, line) for o, line, _, _ in lines]
                tags = [(i, f"tag {i}") for i in range(rows // 10)]
                cursor.executemany("INSERT INTO tags VALUES (%s,%s)", tags)
                self.keys["tags"] = [i for i, _ in tags]

    def _new_id(self, table: str) -> int:
        self.next_id += 1
        self.keys[table].append(self.next_id)
        return self.next_id

    def step(self, conn: Any) -> None:
        rng = self.rng
        table = rng.choice(["accounts", "accounts", "lines", "tags"])
        kind = rng.choices(["insert", "update", "delete"], [2, 7, 1])[0]
        keys = self.keys[table]
        if kind != "insert" and not keys:
            kind = "insert"
        if table == "accounts":
            if kind == "insert":
                conn.execute(
                    "INSERT INTO accounts VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)",
                    account(rng, self._new_id("accounts")),
                )
            elif kind == "update":
                row = account(rng, rng.choice(keys))
                extra = ", extra = %s" if self.extra_added else ""
                values = [*row[1:], *([f"x{rng.randint(0, 99)}"] if self.extra_added else []), row[0]]
                conn.execute(
                    "UPDATE accounts SET amount=%s, ratio=%s, name=%s, active=%s, opened=%s, at=%s, created=%s, "
                    f"updated=%s, doc=%s, uid=%s, scores=%s{extra} WHERE id=%s",
                    values,
                )
            else:
                conn.execute("DELETE FROM accounts WHERE id=%s", (keys.pop(rng.randrange(len(keys))),))
        elif table == "lines":
            if kind == "insert":
                key = (100_000 + self.next_id, 0)
                self.next_id += 1
                keys.append(key)
                conn.execute("INSERT INTO lines VALUES (%s,%s,%s,%s)", (*key, rng.randint(1, 9), "new"))
            elif kind == "update":
                conn.execute(
                    "UPDATE lines SET qty=%s WHERE order_id=%s AND line=%s", (rng.randint(0, 999), *rng.choice(keys))
                )
            else:
                conn.execute("DELETE FROM lines WHERE order_id=%s AND line=%s", keys.pop(rng.randrange(len(keys))))
        elif kind == "insert":
            conn.execute("INSERT INTO tags VALUES (%s,%s)", (self._new_id("tags"), "new tag"))
        elif kind == "update":
            conn.execute("UPDATE tags SET label=%s WHERE id=%s", (f"label {rng.randint(0, 9)}", rng.choice(keys)))
        else:
            conn.execute("DELETE FROM tags WHERE id=%s", (keys.pop(rng.randrange(len(keys))),))

    def change_primary_key(self, conn: Any) -> None:
        old = self.keys["tags"].pop(0)
        new = self._new_id("tags")
        conn.execute("UPDATE tags SET id=%s, label='moved' WHERE id=%s", (new, old))

    def add_column(self, conn: Any) -> None:
        conn.execute("ALTER TABLE accounts ADD COLUMN extra text")
        self.extra_added = True


# Without the embedded schema the tables need theirs; a time of day has no type then: its microseconds.
PLAIN_SCHEMAS = {
    "accounts": {
        "id": "long",
        "amount": "decimal(38,10)",
        "ratio": "string",
        "name": "string",
        "active": "boolean",
        "opened": "date",
        "at": "long",
        "created": "timestamp_ntz",
        "updated": "timestamp",
        "doc": "string",
        "uid": "string",
        "scores": "array<int>",
    },
    "lines": {"order_id": "int", "line": "int", "qty": "int", "note": "string"},
    "tags": {"id": "int", "label": "string"},
}


def run_workload(workload: Workload, operations: int, on_step: Callable[[int], None]) -> None:
    """``operations`` random changes, with a primary-key change at a third and an added column at half of them;
    ``on_step(step)`` after each (to kill and restart what the test kills)."""
    with workload.connect() as conn:
        for step in range(operations):
            workload.step(conn)
            if step == operations // 3:
                workload.change_primary_key(conn)
            if step == operations // 2:
                workload.add_column(conn)
            on_step(step)
            if step % 50 == 0:
                time.sleep(0.05)


class KilledDaemon:
    """The daemon of a replication test (``kafka2delta ingest -c <config>``), killed at ``kills`` random steps of
    the workload (:meth:`on_step`) and restarted: the first restarts kill themselves at ``faults`` (one each),
    the last one is SIGKILLed from outside only. Its logs are ``<logs>/daemon-<n>.log``."""

    def __init__(
        self,
        config: Path,
        env: dict[str, str],
        logs: Path,
        *,
        operations: int,
        kills: int,
        faults: Sequence[str],
        seed: int,
    ) -> None:
        self._args = [sys.executable, "-m", "kafka2delta", "ingest", "-c", str(config)]
        self._env, self._logs, self._runs = env, logs, iter(range(1000))
        self._rng = random.Random(seed)
        self._kill_at = sorted(self._rng.sample(range(operations), kills))
        self._faults = [faults[i] if i < len(faults) and i < kills - 1 else None for i in range(kills)]
        self._kills = kills
        self._started: list[Daemon] = []
        self.current = self.start()

    def start(self, *extra: str, fault: str | None = None) -> Daemon:
        env = {**self._env, "K2D_FAULT_INJECT": fault} if fault else self._env
        daemon = Daemon([*self._args, *extra], env, self._logs / f"daemon-{next(self._runs)}.log")
        self._started.append(daemon)
        return daemon

    def kill_all(self) -> None:
        """Kill the daemons still running (a test's teardown, after a failed assertion)."""
        for daemon in self._started:
            daemon.kill_if_running()

    @property
    def planned_faults(self) -> list[str]:
        """The fault points the restarts were given (``point`` of ``point:n``), in order: each must have fired."""
        return [fault.split(":")[0] for fault in self._faults if fault]

    def record_kills(self, result: ChaosResult) -> list[str]:
        """The kills made so far, in ``result``'s faults: the fault points that fired (each a SIGKILL the daemon
        made itself, named by its logs), the rest from outside. Returns the fault points that fired."""
        fired = [line.split(" ")[0] for line in self._kill_lines()]
        for point in fired:
            result.fault(f"daemon SIGKILL at {point}")
        result.fault("daemon SIGKILL", self._kills - len(self._kill_at) - len(fired))
        return fired

    def files_left_inside_merges(self) -> list[Path]:
        """The data files the ``inside_merge`` kills found written (the logs name each): their MERGE's commit was
        not made when the kill was sent (the caller checks the log too: a descheduled watcher can kill late)."""
        return [Path(line.split("(")[1].split(" written")[0]) for line in self._kill_lines() if "inside_merge" in line]

    def _kill_lines(self) -> list[str]:
        """What follows "SIGKILL at " in each fault-injection line of the logs that killed: the point, then its
        details (an ``inside_merge`` line is logged before its last look at the log, and a "missed" line follows it
        when the commit came first)."""
        kills: list[str] = []
        for log in sorted(self._logs.glob("daemon-*.log")):
            for line in log.read_text().splitlines():
                if "fault injection: SIGKILL at" in line:
                    kills.append(line.split("SIGKILL at ")[1])
                elif "fault injection: inside_merge missed" in line:
                    kills.pop()
        return kills

    def on_step(self, step: int) -> None:
        if self._kill_at and step == self._kill_at[0]:
            self._kill_at.pop(0)
            committed(self.current)  # kill a daemon that is committing, at a random moment of its work
            time.sleep(self._rng.uniform(0.0, 1.5))
            self.current.kill()  # nothing to do when it already killed itself at its fault point
            self.current = self.start(fault=self._faults[self._kills - len(self._kill_at) - 1])


def high_watermarks(bootstrap: str, topics: list[str]) -> dict[str, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"hw-{uuid.uuid4().hex[:6]}"})
    try:
        return {t: consumer.get_watermark_offsets(KafkaTopicPartition(t, 0), timeout=10)[1] for t in topics}
    finally:
        consumer.close()


def snapshot_arrived(bootstrap: str, topics: list[str]) -> bool:
    try:
        return all(high_watermarks(bootstrap, topics).values())
    except KafkaException:  # a topic the worker has not created yet
        return False


def wait_for_snapshot(bootstrap: str, topics: list[str], timeout: float = 60) -> None:
    """Until Debezium's snapshot reached every topic (the worker creates them as it does)."""
    deadline = time.monotonic() + timeout
    while not snapshot_arrived(bootstrap, topics):
        assert time.monotonic() < deadline, f"Debezium's snapshot did not reach every topic in {timeout:g} s"
        time.sleep(0.5)


def wait_quiet(bootstrap: str, topics: list[str], quiet_s: float = 4.0, timeout: float = 120) -> None:
    """Until Debezium has produced everything: the topics' ends stop moving."""
    deadline = time.monotonic() + timeout
    last, since = high_watermarks(bootstrap, topics), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = high_watermarks(bootstrap, topics)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
    raise AssertionError(f"Debezium kept producing for {timeout} s: {last}")


def committed(daemon: Daemon, timeout: float = 60) -> None:
    """Until the daemon's log shows a commit (it has caught up with its partitions' assignment)."""
    deadline = time.monotonic() + timeout
    while "committed version" not in daemon.log():
        assert time.monotonic() < deadline, f"no commit in {timeout} s:\n{daemon.log()[-3000:]}"
        time.sleep(0.2)


def normalized(value: Any) -> Any:
    """A value as both sides can be compared: PostgreSQL's through psycopg, Delta's through Arrow."""
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, Decimal):
        return value.normalize()
    if hasattr(value, "isoformat") and type(value).__name__ == "time":
        return value.isoformat()
    return value


def delta_value(column: str, value: Any, converter: str) -> Any:
    if value is None:
        return None
    if column == "at" and converter == "json-plain":  # microseconds since midnight
        seconds, micros = divmod(value, 1_000_000)
        return dt.time(seconds // 3600, seconds // 60 % 60, seconds % 60, micros).isoformat()
    if column == "ratio":
        return Decimal(value).normalize()  # numeric without scale: the exact text
    if column == "doc":
        return json.loads(value)
    return normalized(value)


@dataclass
class Comparison:
    """A current-state Delta table against its source table, key by key."""

    name: str
    source_rows: int
    missing: list[tuple[Any, ...]]
    """Keys of the source the table lacks (a change lost)."""
    extra: list[tuple[Any, ...]]
    """Keys the table holds and the source does not (a delete lost)."""
    differing: list[tuple[Any, ...]]
    """Keys whose values differ (an update lost, or applied out of order)."""
    duplicated: int
    """Table rows beyond one per key."""
    columns_missing: list[str]
    """Source columns the table lacks (then every source row counts as wrong)."""
    example: str = ""

    @property
    def wrong(self) -> int:
        """Rows the table gets wrong: missing, extra or differing."""
        if self.columns_missing:
            return self.source_rows + len(self.extra)
        return len(self.missing) + len(self.extra) + len(self.differing)

    def check(self) -> None:
        assert not self.columns_missing, f"{self.name}: the table lacks the columns {self.columns_missing}"
        assert self.duplicated == 0, f"{self.name}: {self.duplicated} rows beyond one per key"
        assert not self.missing and not self.extra, f"{self.name}: missing {self.missing[:5]}, extra {self.extra[:5]}"
        assert not self.differing, f"{self.name}: {len(self.differing)} rows differ, e.g. {self.example}"


def compare_tables(conn: Any, name: str, rows: Sequence[dict[str, Any]], converter: str) -> Comparison:
    """The Delta table's ``rows`` against ``SELECT * FROM name``, row by row and value by value."""
    key = KEYS[name]
    cursor = conn.execute(f"SELECT * FROM {name}")
    columns = [c.name for c in cursor.description or []]
    source = {
        tuple(row[columns.index(k)] for k in key): {c: normalized(v) for c, v in zip(columns, row, strict=True)}
        for row in cursor.fetchall()
    }
    present = set(rows[0]) if rows else set(columns)
    delta = {
        tuple(row[k] for k in key): {c: delta_value(c, row[c], converter) for c in columns if c in present}
        for row in rows
    }
    differing = [k for k in source if k in delta and source[k] != delta[k]]
    return Comparison(
        name,
        len(source),
        missing=sorted(set(source) - set(delta)),
        extra=sorted(set(delta) - set(source)),
        differing=differing,
        duplicated=len(rows) - len(delta),
        columns_missing=[c for c in columns if c not in present],
        example=f"{source[differing[0]]} != {delta[differing[0]]}" if differing else "",
    )


def assert_equal_tables(conn: Any, name: str, rows: Sequence[dict[str, Any]], converter: str) -> None:
    """The Delta table's ``rows`` equal ``SELECT * FROM name`` row by row and value by value (one row per key)."""
    compare_tables(conn, name, rows, converter).check()


def record_comparisons(result: ChaosResult, comparisons: Sequence[Comparison], messages: int) -> None:
    """A replication scenario's figures for the fault matrix: ``lost`` counts the rows the tables get wrong
    (missing, extra or differing from the source), ``duplicated`` the rows beyond one per key."""
    result.figures.update(
        messages=messages,
        lost=sum(c.wrong for c in comparisons),
        duplicated=sum(c.duplicated for c in comparisons),
    )
    equal = sum(c.wrong == 0 and c.duplicated == 0 for c in comparisons)
    sizes = ", ".join(f"{c.name} {c.source_rows:,}" for c in comparisons)
    result.notes += f"tables equal to PostgreSQL row by row: {equal} of {len(comparisons)} (source rows: {sizes}); "


def config_text(
    tmp_path: Path, bootstrap: str, prefix: str, converter: str, registry: str | None, mode: str = "upsert"
) -> str:
    """The daemon's config: the three tables' topics, each routed to ``<tmp_path>/tables/<topic>`` in ``mode``."""
    routes = "\n".join(
        f'[[routes]]\ntopic = "{prefix}.{prefix}.{name}"\nkey = {json.dumps(key)}\n'
        + (f"[routes.schema]\n{_toml_table(PLAIN_SCHEMAS[name])}" if converter == "json-plain" else "")
        for name, key in KEYS.items()
    )
    if converter == "avro":
        formats = f'type = "avro"\nkey = "avro"\nenvelope = "debezium"\n[schema_registry]\nurl = "{registry}"'
    else:
        formats = 'key = "json"\nenvelope = "debezium"'
    topics = json.dumps([f"{prefix}.{prefix}.{name}" for name in KEYS])
    return f"""
[kafka]
bootstrap_servers = "{bootstrap}"
topics = {topics}
group_id = "{prefix}"
[kafka.settings]
"session.timeout.ms" = "6000"
"heartbeat.interval.ms" = "1000"
"topic.metadata.refresh.interval.ms" = "2000"
[table]
uri = "{tmp_path}/tables/{{topic}}"
mode = "{mode}"
schema_evolution = "merge"
[format]
{formats}
[ingest]
allowed_latency_s = 1.0
progress_interval_s = 2.0
[dead_letters]
table_uri = "{tmp_path}/dead_letters"

{routes}
"""


def _toml_table(columns: dict[str, str]) -> str:
    return "".join(f'{name} = "{kind}"\n' for name, kind in columns.items())
