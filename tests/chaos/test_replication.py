"""PostgreSQL → Debezium (Kafka Connect) → kafka2delta upsert tables, with the daemon SIGKILLed at random while a
random workload runs: afterwards each Delta table equals ``SELECT * FROM`` its source table, row by row and
value by value, and ``kafka2delta verify`` agrees.

Three tables with a mix of types (a bigint key with numeric(38,10), numeric without scale, unicode text,
boolean, date, time, timestamp, timestamptz, jsonb, uuid, an int array and NULLs; a composite key; an int key),
a snapshot of existing rows, then inserts, updates, deletes, one primary-key change and an ``ALTER TABLE … ADD
COLUMN``, all replicated by one daemon. Short form in ``make test`` (1,000 snapshot rows, 2 kills); full form
with ``K2D_CHAOS=full`` (10,000 rows, 8 kills).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import subprocess
import sys
import time
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, KafkaException
from confluent_kafka import TopicPartition as KafkaTopicPartition
from deltalake import DeltaTable

from dev.connect.connect import ConnectClient, Converter, debezium_postgres_config
from dev.postgres.postgres import Database
from tests.support.harness import ROOT, Daemon

FULL = os.environ.get("K2D_CHAOS") == "full"
SNAPSHOT_ROWS = 10_000 if FULL else 1_000
KILLS = 8 if FULL else 2
FAULTS = ("before_merge:2", "after_delta_commit:2", "after_parquet_write:2")
OPERATIONS = 6_000 if FULL else 600

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


def config_text(tmp_path: Path, bootstrap: str, prefix: str, converter: str, registry: str | None) -> str:
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
mode = "upsert"
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


@pytest.mark.parametrize("converter", ["json", "json-plain", "avro"])
def test_postgres_tables_equal_their_delta_tables_through_debezium_and_sigkills(
    postgres: Database,
    kafka_connect: ConnectClient,
    kafka_bootstrap: str,
    tmp_path: Path,
    converter: Converter,
    request: pytest.FixtureRequest,
) -> None:
    registry = request.getfixturevalue("schema_registry_url") if converter == "avro" else None
    prefix = f"rep{uuid.uuid4().hex[:8]}"
    workload = Workload(postgres, prefix, seed=20261125)  # a schema of its own in the shared database
    workload.snapshot(SNAPSHOT_ROWS)
    tables = [f"{prefix}.{name}" for name in KEYS]
    topics = [f"{prefix}.{name}" for name in tables]
    connector = debezium_postgres_config(
        postgres, topic_prefix=prefix, tables=tables, converter=converter, registry_url=registry
    )
    kafka_connect.add_connector(prefix, connector)
    config_path = tmp_path / "config.toml"
    config_path.write_text(config_text(tmp_path, kafka_bootstrap, prefix, converter, registry))
    env = {k: v for k, v in os.environ.items() if not k.startswith("K2D_")}
    args = [sys.executable, "-m", "kafka2delta", "ingest", "-c", str(config_path)]
    logs = iter(range(1000))

    def start(*extra: str, fault: str | None = None) -> Daemon:
        armed = {**env, "K2D_FAULT_INJECT": fault} if fault else env
        return Daemon([*args, *extra], armed, tmp_path / f"daemon-{next(logs)}.log")

    deadline = time.monotonic() + 60  # the worker creates the topics as the snapshot reaches them
    while not snapshot_arrived(kafka_bootstrap, topics):
        assert time.monotonic() < deadline, "Debezium's snapshot did not reach every topic in 60 s"
        time.sleep(0.5)
    rng = random.Random(7)
    kill_at = sorted(rng.sample(range(OPERATIONS), KILLS))
    # The first restarts kill themselves at a named step of their second commit (the MERGE computed and not
    # made; after its commit; after the rows were checked), the last ones are SIGKILLed from outside.
    faults = [FAULTS[i] if i < len(FAULTS) and i < KILLS - 1 else None for i in range(KILLS)]
    daemon = start()
    with workload.connect() as conn:
        for step in range(OPERATIONS):
            workload.step(conn)
            if step == OPERATIONS // 3:
                workload.change_primary_key(conn)
            if step == OPERATIONS // 2:
                workload.add_column(conn)
            if kill_at and step == kill_at[0]:
                kill_at.pop(0)
                committed(daemon)  # kill a daemon that is committing, at a random moment of its work
                time.sleep(rng.uniform(0.0, 1.5))
                daemon.kill()  # nothing to do when it already killed itself at its fault point
                daemon = start(fault=faults[KILLS - len(kill_at) - 1])
            if step % 50 == 0:
                time.sleep(0.05)
    wait_quiet(kafka_bootstrap, topics)
    messages = sum(high_watermarks(kafka_bootstrap, topics).values())
    fired = [
        line.split("SIGKILL at ")[1]
        for log in tmp_path.glob("daemon-*.log")
        for line in log.read_text().splitlines()
        if "fault injection: SIGKILL at" in line
    ]
    assert daemon.stop() == 0, daemon.log()[-3000:]
    final = start("--until-caught-up")
    assert final.wait(300) == 0, final.log()[-3000:]

    with workload.connect() as conn:
        for name, key in KEYS.items():
            cursor = conn.execute(f"SELECT * FROM {name}")
            columns = [c.name for c in cursor.description or []]
            source = {
                tuple(row[columns.index(k)] for k in key): {c: normalized(v) for c, v in zip(columns, row, strict=True)}
                for row in cursor.fetchall()
            }
            table = DeltaTable(f"{tmp_path}/tables/{prefix}.{prefix}.{name}").to_pyarrow_table()
            assert set(columns) <= set(table.column_names), (name, columns, table.column_names)
            delta = {
                tuple(row[k] for k in key): {c: delta_value(c, row[c], converter) for c in columns}
                for row in table.to_pylist()
            }
            assert len(delta) == table.num_rows  # one row per key
            missing = sorted(set(source) - set(delta))[:5]
            extra = sorted(set(delta) - set(source))[:5]
            assert not missing and not extra, f"{name}: missing {missing}, extra {extra}"
            differing = [k for k in source if source[k] != delta[k]]
            assert not differing, (
                f"{name}: {len(differing)} rows differ, e.g. {source[differing[0]]} != {delta[differing[0]]}"
            )
            if name == "accounts":
                assert pa.types.is_decimal(table.schema.field("amount").type)
    letters = (
        DeltaTable(f"{tmp_path}/dead_letters").to_pyarrow_table() if Path(f"{tmp_path}/dead_letters").exists() else None
    )
    assert letters is None or letters.num_rows == 0, letters.to_pylist()[:3] if letters is not None else None
    verify = subprocess.run(
        [sys.executable, "-m", "kafka2delta", "verify", "-c", str(config_path)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
    print(
        f"\nreplication ({converter}): {SNAPSHOT_ROWS} snapshot rows per table, {OPERATIONS} operations, {KILLS} SIGKILLs (self-inflicted at {sorted(fired)}), "
        f"{messages} change events: every Delta table equals its PostgreSQL table; verify OK",
        flush=True,
    )
    kafka_connect.delete_connector(prefix)
