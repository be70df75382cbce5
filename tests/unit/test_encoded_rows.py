"""Rows encoded as they are buffered: the same rows and statistics as a file written at the flush, less memory held,
and a row group Parquet refuses read again from Kafka with nothing lost or doubled."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pa_fs
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from deltalake.fs import DeltaStorageHandler
from prometheus_client import generate_latest

from kafka2delta.encoded_rows import EncodedRows, RowGroups
from kafka2delta.errors import RowGroupRefused
from kafka2delta.file_stats import extremes, file_stats
from kafka2delta.offsets import LogicalOffset, TxnIds
from kafka2delta.records import OffsetRange, ProcessedPartition, TopicPartition
from kafka2delta.value_buffers import FlushLimits, ValueBuffers
from kafka2delta.writer import DeltaWriter
from tests.support.runner import SCHEMA, LogSource, RecordingDeadLetters, make

T0 = TopicPartition("t", 0)
GROUPS = RowGroups("snappy", rows=100)
LIMITS = FlushLimits(
    allowed_latency_s=5, max_messages_per_file=10**6, min_bytes_per_file=2**30, max_buffered_bytes=2**30
)


def events(first: int, count: int, extra: bool = False) -> pa.Table:
    columns: dict[str, Any] = {
        "id": [f"event-{i:06d}" for i in range(first, first + count)],
        "type": [("click", "view")[i % 2] for i in range(first, first + count)],
        "amount": [float(i % 7) for i in range(first, first + count)],
    }
    if extra:
        columns["note"] = ["added"] * count
    return pa.table(columns)


def piece(first: int, count: int, extra: bool = False) -> ProcessedPartition:
    rows = events(first, count, extra)
    return ProcessedPartition(
        topic="t",
        partition=0,
        rows=rows,
        first_offset=first,
        last_offset=first + count - 1,
        max_timestamp_ms=0,
        row_offsets=list(range(first, first + count)),
    )


def test_a_lane_encodes_row_groups_as_they_fill_and_its_file_equals_the_rows(tmp_path: Path) -> None:
    buffers = ValueBuffers(LIMITS)
    for first in range(0, 1020, 30):
        buffers.add(piece(first, 30), 30, 0.0, "table", GROUPS)
    (buffer,) = buffers.take()["table"].values()
    assert buffer.encoded is not None and buffer.encoded.rows == 960  # 8 groups of 120 rows; 60 rows still Arrow
    assert buffer.pending_rows == 60
    arrow = events(0, 1020)
    assert buffer.encoded.nbytes < events(0, 960).nbytes / 2  # the encoded rows are compressed
    assert buffer.held_bytes == buffer.encoded.nbytes + buffer.pending_nbytes + 16 * 1020  # + offset, timestamp

    encoded = buffer.encoded_file(arrow.schema)
    assert encoded is not None and encoded.rows == 1020
    (tmp_path / "f.parquet").write_bytes(encoded.data.to_pybytes())
    written = pq.ParquetFile(tmp_path / "f.parquet")
    assert written.metadata.num_row_groups == 9
    assert written.read().equals(arrow)
    assert json.loads(encoded.stats) == json.loads(file_stats(arrow))
    assert buffer.to_table(arrow.schema).equals(arrow)  # the rows as Arrow, for the paths that need them


def test_a_column_added_while_buffering_leaves_the_rest_as_arrow_conformed_at_the_flush() -> None:
    buffers = ValueBuffers(LIMITS)
    for first in range(0, 300, 50):
        buffers.add(piece(first, 50), 50, 0.0, "table", GROUPS)
    buffers.add(piece(300, 50, extra=True), 50, 0.0, "table", GROUPS)
    buffers.add(piece(350, 150, extra=True), 150, 0.0, "table", GROUPS)
    (buffer,) = buffers.take()["table"].values()
    assert not buffer.encodable and buffer.encoded is not None and buffer.encoded.rows == 300
    schema = events(0, 1, extra=True).schema
    assert buffer.encoded_file(schema) is None  # the flush writes the rows as Arrow
    rows = buffer.to_table(schema)
    assert rows.column("id").to_pylist() == [f"event-{i:06d}" for i in range(500)]
    assert rows.column("note").to_pylist() == [None] * 300 + ["added"] * 200


def test_a_refused_row_group_names_the_lane_and_keeps_it_arrow_until_its_next_commit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = pq.ParquetWriter.write_table

    def picky(writer: pq.ParquetWriter, table: pa.Table, row_group_size: int | None = None) -> None:
        if "event-000150" in table.column("id").to_pylist():
            raise pa.ArrowInvalid("cannot write poison")
        real(writer, table, row_group_size)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", picky)
    buffers = ValueBuffers(LIMITS)
    buffers.add(piece(0, 120), 120, 0.0, "table", GROUPS)
    with pytest.raises(RowGroupRefused) as refused:
        buffers.add(piece(120, 120), 120, 0.0, "table", GROUPS)
    assert (refused.value.tp, refused.value.table) == (T0, "table")
    assert "cannot write poison" in str(refused.value)
    buffers.drop(T0)  # what the loop's resync does
    buffers.add(piece(0, 240), 240, 0.0, "table", GROUPS)
    (buffer,) = buffers.take()["table"].values()
    assert buffer.encoded is None and buffer.pending_rows == 240  # read again, kept as Arrow
    buffers.add(piece(240, 120), 120, 0.0, "table", GROUPS)
    (buffer,) = buffers.take()["table"].values()
    assert buffer.encoded is not None  # after that commit, encoded again


def test_an_encoder_that_refused_a_group_refuses_its_file_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parquet closes its file when it refuses a group; what ``close`` would still give has no footer."""
    encoded = EncodedRows.start(events(0, 10), "snappy")

    def refuse(writer: pq.ParquetWriter, table: pa.Table, row_group_size: int | None = None) -> None:
        raise pa.ArrowInvalid("cannot write poison")

    monkeypatch.setattr(pq.ParquetWriter, "write_table", refuse)
    with pytest.raises(RowGroupRefused):
        encoded.add(events(10, 10))
    monkeypatch.undo()
    with pytest.raises(RowGroupRefused, match="cannot write poison"):
        encoded.finish()
    with pytest.raises(RowGroupRefused, match="cannot write poison"):
        encoded.add(events(10, 10))


def test_merged_statistics_equal_the_whole_files() -> None:
    """Bounds per row group, merged: strings cut at 32 characters, NaN, nulls, timestamps rounded to milliseconds."""
    long = "x" * 40
    rows = pa.table(
        {
            "s": ["b", long, "a", None],
            "f": [1.0, 2.0, float("nan"), 0.5],
            "n": pa.array([None, None, 3, 4], pa.int64()),
            "ts": pa.array(
                [dt.datetime(2026, 1, 1, 0, 0, 0, 1500, tzinfo=dt.UTC)] * 2 + [None, None], pa.timestamp("us", "UTC")
            ),
            "nested": [{"a": 1}] * 4,
        }
    )
    for cut in range(1, 4):
        merged = extremes(rows.slice(0, cut)).merge(extremes(rows.slice(cut)))
        assert json.loads(merged.to_json()) == json.loads(file_stats(rows)), cut
    whole = json.loads(file_stats(rows))
    assert "s" not in whole["maxValues"] and whole["minValues"]["s"] == "a"
    assert (whole["minValues"]["f"], whole["maxValues"]["f"]) == (0.5, 2.0)  # Arrow's min_max passes NaN over
    assert whole["maxValues"]["ts"] == "2026-01-01T00:00:00.002Z"


def test_an_encoded_file_reads_back_in_its_schema() -> None:
    rows = events(0, 10)
    encoded = EncodedRows.start(rows, "zstd")
    assert encoded.read().equals(rows) and encoded.finish().schema.equals(rows.schema)


@pytest.mark.parametrize("chunk", [5, 40])
def test_the_loop_reads_a_refused_partition_again_and_commits_each_message_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    """Parquet refuses the row group holding offset 17 while buffering: the partition is read again from the
    table's version, its rows kept as Arrow, and the commit finds the row at fault (a dead letter, stage write).
    With ``chunk`` 40 the refused batch is the one that reached the partition's end: the run is not caught up
    until it has read the partition again."""
    real_group, real_file = pq.ParquetWriter.write_table, pq.write_table

    def poisoned(table: pa.Table) -> bool:
        return "id" in table.column_names and "p0-17" in table.column("id").to_pylist()

    def picky_group(writer: pq.ParquetWriter, table: pa.Table, row_group_size: int | None = None) -> None:
        if poisoned(table):
            raise pa.ArrowInvalid("cannot write poison")
        real_group(writer, table, row_group_size)

    def picky_file(table: pa.Table, where: Any, **kwargs: Any) -> None:
        if poisoned(table):
            raise pa.ArrowInvalid("cannot write poison")
        real_file(table, where, **kwargs)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", picky_group)
    monkeypatch.setattr(pq, "write_table", picky_file)
    payloads = [json.dumps({"id": f"p0-{o}"}).encode() for o in range(40)]
    source = LogSource(payloads, chunk=chunk, end_with_last=True)
    writer = DeltaWriter.open(str(tmp_path / "t"), {}, TxnIds().main, "snappy", 10, SCHEMA)
    sink = RecordingDeadLetters(tmp_path)
    ingestor, metrics = make(tmp_path, source, writer, sink, row_group_rows="4")
    ingestor.run(until_caught_up=True)

    table = DeltaTable(str(tmp_path / "t"))
    ids = table.to_pyarrow_table().column("id").to_pylist()
    assert sorted(ids) == sorted(f"p0-{o}" for o in range(40) if o != 17)
    assert sink.offsets() == [(0, 17)]
    assert table.transaction_version("t-0") == 39
    assert source.seeks == [(0, LogicalOffset("earliest"))]  # read again once, from the start (nothing committed)
    assert source.group_offsets == [{0: 40}]
    dead_lettered = 'kafka2delta_messages_dead_lettered_total{stage="write",topic="t"} 1.0'
    assert dead_lettered in generate_latest(metrics.registry).decode()


def test_the_loop_writes_a_catch_up_as_one_file_of_several_row_groups(tmp_path: Path) -> None:
    payloads = [json.dumps({"id": f"p0-{o}"}).encode() for o in range(50)]
    source = LogSource(payloads, chunk=5, end_with_last=True)
    writer = DeltaWriter.open(str(tmp_path / "t"), {}, TxnIds().main, "snappy", 10, SCHEMA)
    ingestor, _ = make(tmp_path, source, writer, RecordingDeadLetters(tmp_path), row_group_rows="10")
    ingestor.run(until_caught_up=True)

    table = DeltaTable(str(tmp_path / "t"))
    (path,) = table.file_uris()
    assert pq.ParquetFile(path).metadata.num_row_groups == 5
    assert table.to_pyarrow_table().column("id").to_pylist() == [f"p0-{o}" for o in range(50)]
    (action,) = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    assert action["num_records"] == 50 and action["min.id"] == "p0-0" and action["max.id"] == "p0-9"
    assert table.transaction_version("t-0") == 49


def test_an_encoded_file_is_put_through_delta_rs_object_store_streams(tmp_path: Path) -> None:
    """Azure and GCS tables write through delta-rs's object_store (a Python filesystem whose streams take bytes
    only): the same file lands, whole."""
    rows = pa.table({"id": [os.urandom(16).hex() for _ in range(300_000)]})  # ~10 MB that does not compress
    writer = DeltaWriter.open(str(tmp_path / "t"), {}, TxnIds().main, "snappy", 10, rows.schema)
    writer._filesystem = pa_fs.PyFileSystem(DeltaStorageHandler("file:///", {}))
    writer._root = str(tmp_path / "t").lstrip("/")
    encoded = EncodedRows.start(rows, "snappy").finish()
    assert encoded.data.size > 8 * 1024 * 1024  # more than one slice of the put
    (action,) = writer.put_file(T0, OffsetRange(0, 299_999), encoded)
    assert (tmp_path / "t" / action.path).read_bytes() == encoded.data.to_pybytes()
    assert action.size == encoded.data.size and json.loads(action.stats)["numRecords"] == 300_000
