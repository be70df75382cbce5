"""`make demo`: a 4-partition topic, 100,000 events, `kafka2delta ingest --until-caught-up`, then a look at the table.

The daemon runs from config.example.toml with K2D_* overrides, exactly as a container would.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from deltalake import DeltaTable

from dev.events import produce_events
from dev.kafka.broker import create_topic

ROOT = Path(__file__).resolve().parents[1]


def recreate_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    if topic in admin.list_topics(timeout=10).topics:
        admin.delete_topics([topic])[topic].result(30)
        deadline = time.monotonic() + 60
        while topic in admin.list_topics(timeout=10).topics and time.monotonic() < deadline:
            time.sleep(0.5)
    for attempt in range(20):
        try:
            create_topic(bootstrap, topic, partitions)
            return
        except KafkaException as exc:  # the broker may still be finishing the deletion
            if attempt == 19:
                raise
            print(f"   waiting for the old topic to go: {exc}")
            time.sleep(0.5)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", default="demo-events")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--table", default=str(ROOT / "data" / "demo-events"))
    args = parser.parse_args()

    print(f"== topic {args.topic} ({args.partitions} partitions) on {args.bootstrap}, table {args.table} (both fresh)")
    shutil.rmtree(args.table, ignore_errors=True)
    recreate_topic(args.bootstrap, args.topic, args.partitions)
    per_partition = args.messages // args.partitions
    seconds = produce_events(args.bootstrap, args.topic, args.partitions, per_partition)
    print(f"== produced {per_partition * args.partitions:,} events in {seconds:.1f} s")

    env = {
        **os.environ,
        "K2D_KAFKA__BOOTSTRAP_SERVERS": args.bootstrap,
        "K2D_KAFKA__TOPIC": args.topic,
        "K2D_KAFKA__GROUP_ID": "kafka2delta-demo",
        "K2D_TABLE__URI": args.table,
        "K2D_INGEST__ALLOWED_LATENCY_S": "2",
    }
    command = [
        sys.executable,
        "-m",
        "kafka2delta",
        "ingest",
        "-c",
        str(ROOT / "config.example.toml"),
        "--until-caught-up",
    ]
    print("== " + " ".join(command[1:]))
    started = time.monotonic()
    result = subprocess.run(command, env=env, cwd=ROOT)
    elapsed = time.monotonic() - started
    if result.returncode != 0:
        print(f"ingest failed with exit code {result.returncode}", file=sys.stderr)
        return result.returncode

    table = DeltaTable(args.table)
    rows = table.to_pyarrow_table()
    print(f"\n== ingested in {elapsed:.1f} s (process start to exit); table version {table.version()}")
    print(f"== rows in the table: {rows.num_rows:,} (unique ids: {len(set(rows.column('id').to_pylist())):,})")
    print("== committed offsets in the Delta log (txn app id → last offset):")
    for partition in range(args.partitions):
        app_id = f"{args.topic}-{partition}"
        print(f"   {app_id}: {table.transaction_version(app_id)}")
    print("== a few rows:")
    for row in rows.slice(0, 5).to_pylist():
        print(f"   {row}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
