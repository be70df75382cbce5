"""A first throughput figure: produce N events, time `kafka2delta ingest --until-caught-up`.

Not a test and no assertion: it prints (and saves to bench/results/throughput[-<transforms>]-latest.json)
the wall time, messages/s, MB/s, CPU seconds per million messages and the daemon's peak RSS.

``--transforms fast`` adds three transforms typical of kafka-delta-ingest users that compile to column
operations; ``--transforms interpreter`` gives the same columns through the JMESPath interpreter
(one expression the fast lane cannot compile sends every batch to the per-message lane).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from deltalake import DeltaTable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "dev"))
sys.path.insert(0, str(ROOT / "dev" / "kafka"))

from broker import create_topic  # noqa: E402
from events import EVENT_SCHEMA, make_event, produce_events  # noqa: E402

TRANSFORMS = {
    "none": {},
    "fast": {"day": "substr(ts, `0`, `10`)", "offset": "kafka.offset", "user_id": "user.id"},
    # The same values; join() is not compiled, so the interpreter runs every transform of every message.
    "interpreter": {"day": "join('', [substr(ts, `0`, `10`)])", "offset": "kafka.offset", "user_id": "user.id"},
}
TRANSFORM_COLUMNS = {"day": "date", "offset": "long", "user_id": "long"}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--allowed-latency-s", type=float, default=5.0)
    parser.add_argument("--transforms", choices=sorted(TRANSFORMS), default="none")
    args = parser.parse_args()
    transforms = TRANSFORMS[args.transforms]
    schema = {**EVENT_SCHEMA, **(TRANSFORM_COLUMNS if transforms else {})}

    topic = f"bench-{uuid.uuid4().hex[:8]}"
    create_topic(args.bootstrap, topic, args.partitions)
    per_partition = args.messages // args.partitions
    total = per_partition * args.partitions
    produce_s = produce_events(args.bootstrap, topic, args.partitions, per_partition)
    print(f"produced {total:,} messages to {topic} in {produce_s:.1f} s")

    with tempfile.TemporaryDirectory(prefix="k2d-bench-") as work:
        table_uri = str(Path(work) / "table")
        env = {
            **os.environ,
            "K2D_KAFKA__BOOTSTRAP_SERVERS": args.bootstrap,
            "K2D_KAFKA__TOPIC": topic,
            "K2D_KAFKA__GROUP_ID": topic,
            "K2D_TABLE__URI": table_uri,
            "K2D_TABLE__SCHEMA": json.dumps(schema),
            "K2D_TRANSFORMS": json.dumps(transforms),
            "K2D_INGEST__ALLOWED_LATENCY_S": str(args.allowed_latency_s),
            "K2D_LOGGING__LEVEL": "WARNING",
        }
        command = [sys.executable, "-m", "kafka2delta", "ingest", "--until-caught-up"]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        subprocess.run(command, env=env, cwd=ROOT, check=True)
        wall = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        table = DeltaTable(table_uri)
        rows = table.count()
        commits = table.version()

    now = datetime.datetime.now(datetime.UTC)
    sample = [
        make_event(p, seq, now)
        for p in range(args.partitions)
        for seq in range(0, per_partition, max(1, per_partition // 100))
    ]
    payload_bytes = sum(map(len, sample)) / len(sample) * total
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    result = {
        "scenario": "catchup-json-250B" + (f"-transforms-{args.transforms}" if transforms else ""),
        "transforms": transforms,
        "messages": total,
        "partitions": args.partitions,
        "rows_in_table": rows,
        "commits": commits,
        "wall_s": round(wall, 2),
        "msgs_per_s": round(total / wall),
        "avg_message_bytes": round(payload_bytes / total),
        "mb_per_s": round(payload_bytes / wall / 1e6, 1),
        "cpu_s_per_million": round(cpu / total * 1e6, 2),
        "peak_rss_mb": round(after.ru_maxrss / 1024),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "note": "wall time includes process start, group join and the final commit",
    }
    print(json.dumps(result, indent=2))
    (ROOT / "bench" / "results").mkdir(exist_ok=True)
    name = "throughput-latest.json" if not transforms else f"throughput-{args.transforms}-latest.json"
    (ROOT / "bench" / "results" / name).write_text(json.dumps(result, indent=2) + "\n")
    if rows != total:
        print(f"WARNING: {rows} rows for {total} messages", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
