"""Where the daemon's time goes: the catch-up scenario under py-spy (sampling, native frames included).

    python -m bench.hotpath [--messages 2000000] [--partitions 4] [--dataset json]   # `make bench-profile`

Writes bench/results/profile-<dataset>.txt (the summary below) and profile-<dataset>.collapsed.gz (py-spy's
collapsed stacks, gzipped: open with speedscope or flamegraph.pl). The summary gives, as a share of all samples of
the daemon's threads: the time under each of the daemon's functions (inclusive), and the leaf frames (where
the CPU actually is: Python, Arrow, Parquet, librdkafka, delta-rs).
"""

from __future__ import annotations

import argparse
import collections
import gzip
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from bench import daemon
from bench.measure import load_average
from bench.producer import produce_backlog
from bench.run import BROKER_JVM_OPTS, log
from dev.kafka.broker import LocalBroker, create_topic

HERE = Path(__file__).resolve().parent

FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^():]*)(?::(?P<line>\d+))?\)$")


def _frames(stack: str) -> list[tuple[str, str]]:
    """(function, file) of each frame, outermost first."""
    found = []
    for frame in stack.split(";"):
        match = FRAME.match(frame)
        found.append((match["func"], match["file"]) if match else (frame, ""))
    return found


def summarize(collapsed: Path, top: int = 25) -> str:
    inclusive: collections.Counter[str] = collections.Counter()
    leaves: collections.Counter[str] = collections.Counter()
    stages: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        total += count
        frames = _frames(stack)
        seen = set()
        for func, file in frames:
            if "kafka2delta" in file:
                name = f"{Path(file).name}:{func}"
                if name not in seen:
                    inclusive[name] += count
                    seen.add(name)
        func, file = frames[-1]
        leaves[f"{func} ({Path(file).name or '?'})"] += count
        stages[_stage(frames)] += count
    if not total:
        return "no samples\n"
    out = [f"{total} samples (100 per second of each thread)", "", "Stage (by the innermost daemon function):"]
    out += [f"  {n / total:6.1%}  {name}" for name, n in stages.most_common()]
    out += ["", f"Top {top} daemon functions, inclusive:"]
    out += [f"  {n / total:6.1%}  {name}" for name, n in inclusive.most_common(top)]
    out += ["", f"Top {top} leaf frames (self time):"]
    out += [f"  {n / total:6.1%}  {name}" for name, n in leaves.most_common(top)]
    return "\n".join(out) + "\n"


# Where a frame of the package belongs: a stage package (every module in it) or one module, by its path inside
# kafka2delta/ (the house has one room per stage: serialization/, transforms/, coercions/, changes/).
STAGES = (
    ("kafka.py", "consume (librdkafka, message objects)"),
    ("records.py", "consume (message objects → batch)"),
    ("bisection.py", "consume (message objects → batch)"),
    ("serialization/", "deserialize (JSON/Avro/Protobuf → Arrow)"),
    ("registry.py", "deserialize (JSON/Avro/Protobuf → Arrow)"),
    ("registry_glue.py", "deserialize (JSON/Avro/Protobuf → Arrow)"),
    ("changes/", "change events (envelopes, collapse)"),
    ("transforms/", "transforms"),
    ("coercions/", "coerce to the table schema"),
    ("schema.py", "coerce to the table schema"),
    ("value_buffers.py", "buffer"),
    ("encoded_rows.py", "buffer"),
    ("dictionaries.py", "buffer"),
    ("file_stats.py", "buffer"),
    ("writer.py", "write Parquet + Delta commit"),
    ("merging.py", "write Parquet + Delta commit"),
    ("deferred_tables.py", "write Parquet + Delta commit"),
    ("committer.py", "commit (glue: txns, dead letters, evolution)"),
    ("txn_versions.py", "commit (glue: txns, dead letters, evolution)"),
    ("coordinator.py", "commit (glue: txns, dead letters, evolution)"),
    ("dead_letters.py", "dead-letter table"),
    ("pipeline.py", "pipeline (glue)"),
    ("splitting.py", "pipeline (glue)"),
    ("routing.py", "pipeline (glue)"),
    ("runner.py", "loop (glue)"),
    ("progress.py", "loop (glue)"),
    ("retries.py", "loop (glue)"),
    ("assignment.py", "loop (glue)"),
    ("positions.py", "loop (glue)"),
    ("offsets.py", "loop (glue)"),
    ("tables.py", "loop (glue)"),
    ("pacing.py", "loop (glue)"),
    ("metrics.py", "loop (glue)"),
    ("turns.py", "loop (glue)"),
    ("faults.py", "loop (glue)"),
    ("status.py", "status page and logs"),
    ("logs.py", "status page and logs"),
    ("cli.py", "start-up"),
    ("startup.py", "start-up"),
    ("config/", "start-up"),
    ("edges.py", "start-up"),
)


def _stage(frames: list[tuple[str, str]]) -> str:
    for func, file in reversed(frames):
        if "kafka2delta" not in file:
            continue
        inside = Path(file).as_posix().rsplit("kafka2delta/", 1)[-1]
        if func == "<module>":  # a module of the package being imported, not its stage at work (found by review)
            return "start-up (imports)"
        for module, stage in STAGES:
            if inside == module or (module.endswith("/") and inside.startswith(module)):
                return stage
        return f"other ({inside}:{func})"
    if any("importlib" in file or func == "<module>" for func, file in frames):
        return "start-up (imports)"
    return "outside the daemon's code (threads of librdkafka/Rust, interpreter)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--dataset", default="json")
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="k2d-profile-"))
    collapsed = out / f"profile-{args.dataset}.collapsed"
    try:
        with LocalBroker(work / "kafka", jvm_opts=BROKER_JVM_OPTS) as broker:
            topic = f"profile-{args.dataset}"
            create_topic(broker.bootstrap_servers, topic, args.partitions)
            produced = produce_backlog(broker.bootstrap_servers, topic, args.partitions, args.messages, args.dataset)
            log(f"produced {produced['messages']:,} messages")
            try:
                result = daemon.catchup(
                    broker.bootstrap_servers,
                    topic,
                    int(produced["messages"]),
                    int(produced["bytes"]),
                    args.dataset,
                    work / "daemon",
                    profile=collapsed,
                )
            except RuntimeError:
                print((work / "daemon" / "daemon.log").read_text()[-3000:], file=sys.stderr)
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    header = (
        f"Load average at the end {load_average()} on {os.cpu_count()} CPUs (shares hold under load; rates do not).\n"
        f"Daemon catch-up under py-spy (--native, 100 Hz): {result['messages']:,} {args.dataset} messages on "
        f"{args.partitions} partitions, three transforms: {result['msgs_per_s']:,} msg/s under the profiler, "
        f"{result['cpu_s_per_million']} CPU s per million.\n\n"
    )
    text = header + summarize(collapsed)
    (out / f"profile-{args.dataset}.txt").write_text(text)
    with collapsed.open("rb") as raw, gzip.open(f"{collapsed}.gz", "wb") as packed:
        shutil.copyfileobj(raw, packed)
    collapsed.unlink()
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
