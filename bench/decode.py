"""Decode micro-benchmark: CPU per message of the deserialize stage and of the whole pure pipeline, per format.

``python -m bench.decode [--messages 200000] [--batch 10000] [--runs 5] [--formats json,avro,...] [--json FILE]``

In process, no broker: the bench's ~250-B demo event (``bench/datasets.py``) is built ``--messages`` times in
each format and cut into :class:`PartitionMessages` of ``--batch`` messages (``kafka.consume_batch_size``,
10,000 by default). Two figures per format, CPU µs per message (``time.process_time``, median of ``--runs``):

- ``deserialize``: ``Deserializer.decode`` alone (built by ``build_deserializer``, as ``cli.build_pipeline``
  does, after the pipeline has given it its read schema);
- ``pipeline``: ``Pipeline.process`` (deserialize + the three transforms + coerce to the bench's table schema).

Formats: ``json`` (the demo event), ``avro`` (Confluent wire format: magic byte, schema id, datum; the writer
schema from an in-memory registry), ``avro-file`` (bare datums with ``format.avro_schema_file``, the form the
scaling bench produces), ``protobuf`` (Confluent wire format, the event as a proto3 message), and ``avro-glue``,
``protobuf-glue`` (the same datums in the AWS Glue Schema Registry's wire format, uncompressed, the schema version
from an in-memory Glue registry). A warm-up batch
before timing loads the schemas (and compiles the ``.proto``). ``--profile FORMAT`` prints a cProfile of
that format's pipeline instead of timing.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import json
import pstats
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from bench.datasets import (
    AVRO_SCHEMA,
    DATASETS,
    EVENT_PROTO,
    TRANSFORMS,
    Maker,
    Timestamps,
    avro_writer,
    protobuf_writer,
)
from dev.events import event_json
from kafka2delta.config import FormatConfig, SchemaRegistryConfig
from kafka2delta.errors import MessageError
from kafka2delta.pipeline import Pipeline
from kafka2delta.records import PartitionMessages
from kafka2delta.registry import RegisteredSchema, SchemaRegistry
from kafka2delta.registry_glue import GlueRegistry
from kafka2delta.schema import parse_schema
from kafka2delta.serialization import Deserializer, build_deserializer
from kafka2delta.transforms import Transformer

FORMATS = ("json", "avro", "avro-file", "protobuf", "avro-glue", "protobuf-glue")
SCHEMA_ID = 1
GLUE_VERSION = uuid.UUID("6f1c2d3e-4b5a-4c6d-8e7f-000000000001")


class MemoryRegistry(SchemaRegistry):
    """The registry edge, answering from memory (no HTTP)."""

    def __init__(self, schemas: dict[int, RegisteredSchema]) -> None:
        super().__init__(SchemaRegistryConfig(url="http://registry.invalid"))
        self._schemas = schemas

    def schema(self, schema_id: int) -> RegisteredSchema:
        found = self._schemas.get(schema_id)
        if found is None:
            raise MessageError("deserialize", f"schema id {schema_id} is not in the registry")
        return found

    def referenced(self, subject: str, version: int) -> RegisteredSchema:
        raise MessageError("deserialize", f"no references here ({subject} v{version})")


class MemoryGlue(GlueRegistry):
    """The Glue registry edge, answering from memory (no boto3 client is made)."""

    def __init__(self, schema: RegisteredSchema) -> None:  # the edge's own state (a boto3 client) is never used
        self._schema = schema

    def schema_version(self, version_id: uuid.UUID) -> RegisteredSchema:
        if version_id != GLUE_VERSION:
            raise MessageError("deserialize", f"schema version {version_id} is not in the Glue schema registry")
        return self._schema


def glue_framed(make: Maker) -> Maker:
    """``make``'s Confluent-framed payloads in Glue's wire format instead (header 3, no compression, the version)."""
    header = bytes([3, 0]) + GLUE_VERSION.bytes

    def glue_event(partition: int, seq: int, ts: str) -> bytes:
        return header + make(partition, seq, ts)[5:]  # the datum (Protobuf: the message index 0, then the message)

    return glue_event


def build_pipeline(format_name: str, work: Path) -> tuple[Pipeline, Deserializer, Maker]:
    """The pipeline ``cli.build_pipeline`` would build for the bench's table and transforms, and the payload maker."""
    registry: SchemaRegistry | GlueRegistry | None = None
    if format_name == "json":
        config = FormatConfig(type="json")
        make: Maker = event_json
    elif format_name == "avro":
        registry = MemoryRegistry({SCHEMA_ID: RegisteredSchema(SCHEMA_ID, "AVRO", json.dumps(AVRO_SCHEMA))})
        config = FormatConfig(type="avro")
        make = avro_writer(SCHEMA_ID)
    elif format_name == "avro-file":
        avsc = work / "event.avsc"
        avsc.write_text(json.dumps(AVRO_SCHEMA))
        config = FormatConfig(type="avro", avro_schema_file=str(avsc))
        make = avro_writer()
    elif format_name == "protobuf":
        registry = MemoryRegistry({SCHEMA_ID: RegisteredSchema(SCHEMA_ID, "PROTOBUF", EVENT_PROTO)})
        config = FormatConfig(type="protobuf")
        make = protobuf_writer(SCHEMA_ID)
    elif format_name == "avro-glue":
        registry = MemoryGlue(RegisteredSchema(1, "AVRO", json.dumps(AVRO_SCHEMA)))
        config = FormatConfig(type="avro")
        make = glue_framed(avro_writer(SCHEMA_ID))
    elif format_name == "protobuf-glue":
        registry = MemoryGlue(RegisteredSchema(1, "PROTOBUF", EVENT_PROTO))
        config = FormatConfig(type="protobuf")
        make = glue_framed(protobuf_writer(SCHEMA_ID))
    else:
        raise SystemExit(f"unknown format {format_name!r} (one of {', '.join(FORMATS)})")
    deserializer = build_deserializer(config, registry, "events")
    table_schema = parse_schema(DATASETS["json"].table_schema())
    transformer = Transformer(tuple(TRANSFORMS.items()))
    return Pipeline(deserializer, table_schema, transformer), deserializer, make


def build_batches(make: Maker, messages: int, batch: int) -> list[PartitionMessages]:
    stamps = Timestamps(dt.datetime(2026, 11, 26, tzinfo=dt.UTC))
    batches = []
    for start in range(0, messages, batch):
        seqs = range(start, min(start + batch, messages))
        payloads: list[bytes | None] = [make(0, seq, stamps.at(seq)) for seq in seqs]
        batches.append(
            PartitionMessages(
                topic="events",
                partition=0,
                offsets=list(seqs),
                payloads=payloads,
                timestamps_ms=[1_764_115_200_000] * len(seqs),
            )
        )
    return batches


def _cpu(run: Callable[[], object]) -> float:
    started = time.process_time()
    run()
    return time.process_time() - started


def measure(format_name: str, messages: int, batch: int, runs: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="k2d-decode-") as work:
        pipeline, deserializer, make = build_pipeline(format_name, Path(work))
        batches = build_batches(make, messages, batch)
        warm = pipeline.process(batches[0])
        if warm.dead_letters or warm.rows.num_rows != len(batches[0]):
            raise RuntimeError(f"{format_name}: {len(warm.dead_letters)} dead letters in the warm-up batch")
        everything = [list(range(len(b))) for b in batches]

        def deserialize() -> None:
            for b, positions in zip(batches, everything, strict=True):
                deserializer.decode(b, positions)

        def process() -> None:
            for b in batches:
                pipeline.process(b)

        decode_s = [_cpu(deserialize) for _ in range(runs)]
        pipeline_s = [_cpu(process) for _ in range(runs)]
    size = sum(len(p or b"") for p in batches[0].payloads) / len(batches[0])
    return {
        "payload_bytes": round(size, 1),
        "deserialize_us": round(statistics.median(decode_s) / messages * 1e6, 3),
        "pipeline_us": round(statistics.median(pipeline_s) / messages * 1e6, 3),
        "deserialize_runs_s": [round(s, 4) for s in decode_s],
        "pipeline_runs_s": [round(s, 4) for s in pipeline_s],
    }


def profile(format_name: str, messages: int, batch: int, top: int) -> None:
    with tempfile.TemporaryDirectory(prefix="k2d-decode-") as work:
        pipeline, _, make = build_pipeline(format_name, Path(work))
        batches = build_batches(make, messages, batch)
        pipeline.process(batches[0])
        profiler = cProfile.Profile()
        profiler.enable()
        for b in batches:
            pipeline.process(b)
        profiler.disable()
    pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(top)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.decode", description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=10_000, help="messages per PartitionMessages")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    parser.add_argument("--profile", metavar="FORMAT", help="cProfile this format's pipeline instead of timing")
    args = parser.parse_args(argv)
    if args.profile:
        profile(args.profile, args.messages, args.batch, 30)
        return 0
    results: dict[str, Any] = {}
    print(f"{args.messages:,} messages in batches of {args.batch:,}, CPU µs per message, median of {args.runs} runs")
    print(f"{'format':<14} {'bytes':>6} {'deserialize':>12} {'pipeline':>9}")
    for name in args.formats.split(","):
        figures = results[name] = measure(name, args.messages, args.batch, args.runs)
        size, decode, whole = figures["payload_bytes"], figures["deserialize_us"], figures["pipeline_us"]
        print(f"{name:<14} {size:>6.0f} {decode:>12.2f} {whole:>9.2f}")
    if args.json:
        meta = {"messages": args.messages, "batch": args.batch, "runs": args.runs, "pyarrow": pa.__version__}
        args.json.write_text(json.dumps({"meta": meta, "formats": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
