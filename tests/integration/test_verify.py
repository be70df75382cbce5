"""`kafka2delta verify` against a real broker: a clean ingest (poison messages and a filter mixed in)
passes; a duplicated row and lost rows are found and named; rows a DELETE took out are counted as deleted."""

import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake

from tests.support.harness import ROOT, event

PER_PARTITION = 300
POISON_SEQS = {7, 11, 150}  # a dead letter each, in every partition
FILTER = "type != 'purchase'"  # seq % 3 == 0 is filtered


def payload(partition: int, seq: int) -> bytes:
    if seq in POISON_SEQS:
        return b'{"id": "broken",'
    return event(partition, seq)


def test_verify_passes_a_clean_ingest_then_names_duplicated_and_missing_offsets(setup_factory, daemon_factory) -> None:
    setup = setup_factory(3, sections={"filter": {"expression": FILTER}}, max_messages_per_file=120)
    setup.topic.produce(PER_PARTITION, payload=payload)
    daemon = daemon_factory(setup, "--until-caught-up")
    assert daemon.wait(180) == 0, daemon.log()[-3000:]

    code, report = setup.verify()
    assert code == 0, report
    assert isinstance(report, dict)
    filtered = sum(1 for seq in range(PER_PARTITION) if seq % 3 == 0 and seq not in POISON_SEQS)
    rows = PER_PARTITION - filtered - len(POISON_SEQS)
    assert (report["ok"], report["lost"], report["duplicated_total"], report["in_both_total"]) == (True, 0, 0, 0)
    assert (report["produced"], report["rows"], report["dead_letters"], report["skipped"], report["pending"]) == (
        3 * PER_PARTITION,
        3 * rows,
        3 * len(POISON_SEQS),
        3 * filtered,
        0,
    )
    for partition in report["partitions"]:
        assert (partition["low"], partition["high"], partition["committed"]) == (0, PER_PARTITION, PER_PARTITION - 1)
        assert partition["dead_letter_committed"] >= max(POISON_SEQS)
        assert (partition["rows"], partition["dead_letters"], partition["skipped"]) == (
            rows,
            len(POISON_SEQS),
            filtered,
        )
    assert report["log_gaps"] == [] and report["dead_letter_log_gaps"] == []
    print("verify (clean):", {k: report[k] for k in ("produced", "rows", "dead_letters", "skipped", "lost")})

    # Tamper: a second copy of two rows of partition 1 …
    table = DeltaTable(setup.table_uri)
    rows_1 = table.to_pyarrow_table(filters=[("kafka_partition", "=", 1), ("kafka_offset", "in", [4, 5])])
    assert rows_1.num_rows == 2
    write_deltalake(setup.table_uri, rows_1, mode="append")
    # … and the rows of offsets 20, 22 and 23 of partition 2 lost: the table overwritten without them (a DELETE
    # would be counted as deleted, not lost: checked at the end).
    current = DeltaTable(setup.table_uri).to_pyarrow_table()
    lost = pc.and_(pc.equal(current["kafka_partition"], 2), pc.is_in(current["kafka_offset"], pa.array([20, 22, 23])))
    write_deltalake(setup.table_uri, current.filter(pc.invert(lost)), mode="overwrite")

    code, report = setup.verify()
    assert code == 1, report
    assert isinstance(report, dict)
    assert (report["ok"], report["lost"], report["duplicated_total"]) == (False, 3, 2)
    by_partition = {p["partition"]: p for p in report["partitions"]}
    assert by_partition[1]["duplicated"] == [4, 5] and by_partition[1]["missing"] == []
    assert by_partition[2]["missing"] == [20, 22, 23] and by_partition[2]["duplicated"] == []
    assert by_partition[0]["missing"] == by_partition[0]["duplicated"] == []

    # The text report names them too.
    env = {k: v for k, v in os.environ.items() if not k.startswith("K2D_")}
    done = subprocess.run(
        [sys.executable, "-m", "kafka2delta", "verify", "-c", str(setup.config_path), "--timeout", "120"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    summary = done.stdout.strip().splitlines()[-1]
    assert summary.startswith("FAILED: lost 3, duplicated 2"), done.stdout
    assert "missing 2:[20, 22, 23]" in summary and "duplicated 1:[4, 5]" in summary, summary

    # Rows a DELETE took out (a GDPR erase, jobs ttl) are no loss: counted as deleted, by version.
    DeltaTable(setup.table_uri).delete("kafka_partition = 0 AND kafka_offset IN (1, 2)")
    code, report = setup.verify()
    assert isinstance(report, dict) and code == 1, report
    assert (report["lost"], report["deleted"], report["duplicated_total"]) == (3, 2, 2)
    assert [p["deleted"] for p in sorted(report["partitions"], key=lambda p: p["partition"])] == [2, 0, 0]
    print("verify (tampered):\n" + done.stdout)


def test_verify_needs_the_metadata_columns(setup_factory) -> None:
    setup = setup_factory(1, metadata_columns=None)
    code, output = setup.verify()
    assert code == 2
    assert "table.metadata_columns" in str(output) and "partition" in str(output)


def test_verify_with_metadata_on_but_a_table_without_the_columns(setup_factory, daemon_factory) -> None:
    """Metadata turned on after rows were written without it: the table lacks the columns."""
    setup = setup_factory(1, metadata_columns=None)
    setup.topic.produce(5)
    assert daemon_factory(setup, "--until-caught-up").wait(120) == 0
    text = setup.config_path.read_text().replace("[table]\n", '[table]\n"metadata_columns" = ["partition", "offset"]\n')
    setup.config_path.write_text(text)
    code, output = setup.verify()
    assert code == 2 and "table.metadata_columns" in str(output) and "kafka_partition" in str(output), output
