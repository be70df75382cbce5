import pyarrow as pa

from kafka2delta.records import ProcessedPartition
from kafka2delta.value_buffers import FlushLimits, ValueBuffers

LIMITS = FlushLimits(
    allowed_latency_s=2.0, max_messages_per_file=100, min_bytes_per_file=10_000, max_buffered_bytes=15_000
)


def processed(partition: int, first: int, last: int, rows: int) -> ProcessedPartition:
    table = pa.table({"n": pa.array(range(rows), pa.int64())})
    return ProcessedPartition(
        partition=partition,
        rows=table,
        row_offsets=list(range(first, first + rows)),
        first_offset=first,
        last_offset=last,
        max_timestamp_ms=0,
    )


def test_latency_limit() -> None:
    buffers = ValueBuffers(LIMITS)
    assert buffers.flush_reason(0.0) is None
    buffers.add(processed(0, 0, 9, 10), 10, now=100.0)
    assert buffers.flush_reason(101.9) is None
    assert buffers.seconds_until_due(101.0) == 1.0
    assert buffers.flush_reason(102.0) == "latency"


def test_records_limit_counts_messages_not_rows() -> None:
    buffers = ValueBuffers(LIMITS)
    buffers.add(processed(0, 0, 99, 0), 100, now=0.0)  # all dead letters: still a full batch
    assert buffers.flush_reason(0.0) == "records"


def test_bytes_limits() -> None:
    buffers = ValueBuffers(LIMITS)
    buffers.add(processed(0, 0, 49, 1300), 50, now=0.0)  # 10,400 bytes of int64
    assert buffers.flush_reason(0.0) == "bytes"
    buffers = ValueBuffers(LIMITS)
    buffers.add(processed(0, 0, 9, 1000), 10, now=0.0)
    buffers.add(processed(1, 0, 9, 1000), 10, now=0.0)
    assert buffers.flush_reason(0.0) == "buffer_bytes"


def test_take_and_offsets() -> None:
    buffers = ValueBuffers(LIMITS)
    buffers.add(processed(0, 0, 4, 5), 5, now=0.0)
    buffers.add(processed(0, 5, 9, 0), 5, now=1.0)
    buffers.add(processed(1, 30, 31, 2), 2, now=1.0)
    taken = buffers.take({0})
    assert list(taken) == [0]
    assert (taken[0].first_offset, taken[0].last_offset, taken[0].messages, taken[0].rows) == (0, 9, 10, 5)
    assert 1 in buffers and 0 not in buffers
    assert buffers.take().keys() == {1}
    assert not buffers


def test_room_until_the_file_is_full() -> None:
    buffers = ValueBuffers(LIMITS)
    assert buffers.room(0) == 100
    buffers.add(processed(0, 0, 59, 60), 60, now=0.0)
    assert buffers.room(0) == 40 and buffers.room(1) == 100
