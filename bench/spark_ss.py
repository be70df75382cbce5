"""The same ingestion with Spark Structured Streaming: Kafka source → the same transforms in Spark SQL → Delta sink.

Run by the harness as its own process (``local[2]``, trigger every 1 s), so that its CPU and memory (the
Python driver and its JVM) are measured like the daemon's. The session comes from
``kafka2delta.spark.session`` (Delta Lake and the pinned ``spark-sql-kafka-0-10`` jar from Maven Central).

- ``--mode catchup``: ingest the topic's backlog of ``--messages``; stop once the sink has taken them all.
- ``--mode prefetch``: only start a session, so that Ivy fetches the jars before anything is timed;
- ``--mode steady``: ingest until the file ``--stop-file`` appears; writes ``--ready-file`` once the first
  (empty) micro-batch is done, so that the harness starts its producer against a running query.

Prints one JSON line: epoch seconds of the milestones and the micro-batch counts.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

STARTED = time.time()

# After STARTED: the start-up time the harness reports includes these imports (PySpark's are slow).
from bench.datasets import SPARK_TRANSFORMS  # noqa: E402
from kafka2delta.config import SparkConfig  # noqa: E402
from kafka2delta.spark.session import get_session  # noqa: E402

EVENT_DDL = "id STRING, type STRING, amount DOUBLE, ts STRING, user STRUCT<id: BIGINT, country: STRING>"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--table", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--mode", choices=["catchup", "steady", "prefetch"], required=True)
    parser.add_argument("--messages", type=int, default=0)
    parser.add_argument("--trigger-s", type=float, default=1.0)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--ready-file")
    parser.add_argument("--stop-file")
    parser.add_argument("--timeout-s", type=float, default=900)
    args = parser.parse_args()

    spark = get_session(
        SparkConfig(master=args.master, log_level="WARN"),
        master=args.master,
        conf={"spark.sql.streaming.numRecentProgressUpdates": "1000"},
        app_name="kafka2delta-bench",
    )
    session_ready = time.time()
    if args.mode == "prefetch":  # the jars are in Ivy's cache now
        spark.stop()
        return 0
    source = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", args.topic)
        .option("startingOffsets", "earliest")
        .option("failOnDataLoss", "false")
        .load()
    )
    columns = [
        "e.id AS id",
        "e.type AS type",
        "e.amount AS amount",
        "CAST(e.ts AS TIMESTAMP) AS ts",
        "e.user AS user",
        *(f"{expression} AS {target}" for target, expression in SPARK_TRANSFORMS.items()),
    ]
    if args.mode == "steady":
        columns.append("timestamp AS kafka_timestamp")
    events = source.selectExpr(f"from_json(CAST(value AS STRING), '{EVENT_DDL}') AS e", "offset", "timestamp")
    query = (
        events.selectExpr(*columns)
        .writeStream.format("delta")
        .outputMode("append")
        .option("checkpointLocation", args.checkpoint)
        .trigger(processingTime=f"{args.trigger_s} seconds")
        .start(args.table)
    )
    query_started = time.time()
    rows_by_batch: dict[int, int] = {}
    durations: dict[int, int] = {}  # ms per micro-batch that had rows
    first_batch_done: float | None = None
    done: float | None = None
    deadline = time.monotonic() + args.timeout_s
    ready_written = False
    try:
        while time.monotonic() < deadline:
            if query.exception() is not None:
                raise RuntimeError(str(query.exception()))
            for progress in query.recentProgress:
                rows_by_batch[progress["batchId"]] = progress["numInputRows"]
                if progress["numInputRows"]:
                    durations[progress["batchId"]] = progress["durationMs"].get("triggerExecution", 0)
            if rows_by_batch and first_batch_done is None:
                first_batch_done = time.time()
            if args.mode == "steady":
                if first_batch_done is not None and not ready_written and args.ready_file:
                    Path(args.ready_file).write_text("ready\n")
                    ready_written = True
                if args.stop_file and Path(args.stop_file).exists():
                    done = time.time()
                    break
            elif sum(rows_by_batch.values()) >= args.messages:
                done = time.time()
                break
            time.sleep(0.1)
    finally:
        query.stop()
        stopped = time.time()
        spark.stop()
    print(
        json.dumps(
            {
                "process_started": STARTED,
                "session_ready": session_ready,
                "query_started": query_started,
                "first_batch_done": first_batch_done,
                "done": done,
                "stopped": stopped,
                "batches": len(rows_by_batch),
                "rows": sum(rows_by_batch.values()),
                "rows_by_batch_max": max(rows_by_batch.values(), default=0),
                # (rows, ms) of the first micro-batches with rows: the first one pays the JVM's warm-up.
                "first_batches": [[rows_by_batch[b], durations[b]] for b in sorted(durations)[:10]],
            }
        ),
        flush=True,
    )
    return 0 if done is not None else 1


if __name__ == "__main__":
    sys.exit(main())
