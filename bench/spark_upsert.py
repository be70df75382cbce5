"""The Spark side of ``bench.upsert``: Structured Streaming from Kafka, ``foreachBatch`` collapsing each
micro-batch to the last change per key (by partition, then offset) and MERGE into the Delta table (delta-spark:
update, insert, delete on a tombstone). Run by the harness as its own process (``local[2]``).

Writes one JSON line per micro-batch with changes to ``--batches``: the wall-clock time its MERGE committed and
the (partition, first, last) offsets it held; ``--ready-file`` once the query runs; stops at ``--stop-file``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from kafka2delta.config import SparkConfig
from kafka2delta.spark.session import get_session

ROW_DDL = "id BIGINT, name STRING, amount DOUBLE, payload STRING, changed_ms BIGINT"


def main() -> int:
    parser = argparse.ArgumentParser()
    for name in ("--bootstrap", "--topic", "--table", "--checkpoint", "--batches", "--ready-file", "--stop-file"):
        parser.add_argument(name, required=True)
    parser.add_argument("--trigger-s", type=float, default=1.0)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()

    spark = get_session(
        SparkConfig(master=args.master, log_level="WARN"),
        master=args.master,
        conf={},
        app_name="kafka2delta-bench-upsert",
    )
    from delta.tables import DeltaTable
    from pyspark.sql import Column
    from pyspark.sql import functions as F
    from pyspark.sql.window import Window

    target = DeltaTable.forPath(spark, args.table)
    out = Path(args.batches).open("a")  # noqa: SIM115 - closed in the finally below

    def apply(batch: Any, batch_id: int) -> None:
        rows = batch.selectExpr("partition", "offset", "CAST(key AS STRING) AS k", "CAST(value AS STRING) AS v")
        ranges = rows.groupBy("partition").agg(F.min("offset").alias("first"), F.max("offset").alias("last")).collect()
        if not ranges:
            return
        parsed = rows.select(
            F.get_json_object("k", "$.id").cast("long").alias("id"),
            "partition",
            "offset",
            F.col("v").isNull().alias("deleted"),
            F.from_json("v", ROW_DDL).alias("r"),
        )
        last = Window.partitionBy("id").orderBy(F.desc("partition"), F.desc("offset"))
        source = (
            parsed.withColumn("n", F.row_number().over(last))
            .where("n = 1")
            .selectExpr(
                "id",
                "deleted",
                "r.name AS name",
                "r.amount AS amount",
                "r.payload AS payload",
                "r.changed_ms AS changed_ms",
            )
        )
        values: dict[str, str | Column] = {c: f"s.{c}" for c in ("id", "name", "amount", "payload", "changed_ms")}
        (
            target.alias("t")
            .merge(source.alias("s"), "t.id = s.id")
            .whenMatchedDelete("s.deleted")
            .whenMatchedUpdate("NOT s.deleted", values)
            .whenNotMatchedInsert("NOT s.deleted", values)
            .execute()
        )
        ranges_out = [[r["partition"], r["first"], r["last"]] for r in ranges]
        out.write(json.dumps({"batch": batch_id, "committed": time.time(), "ranges": ranges_out}) + "\n")
        out.flush()

    source = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", args.topic)
        .option("startingOffsets", "earliest")
        .load()
    )
    query = (
        source.writeStream.foreachBatch(apply)
        .option("checkpointLocation", args.checkpoint)
        .trigger(processingTime=f"{args.trigger_s} seconds")
        .start()
    )
    try:
        while query.lastProgress is None:
            if query.exception() is not None:
                raise RuntimeError(str(query.exception()))
            time.sleep(0.2)
        Path(args.ready_file).write_text("ready\n")
        while not Path(args.stop_file).exists():
            if query.exception() is not None:
                raise RuntimeError(str(query.exception()))
            time.sleep(0.2)
    finally:
        query.stop()
        spark.stop()
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
