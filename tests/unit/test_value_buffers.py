import dataclasses

import pyarrow as pa

from kafka2delta.records import DeadLetter, ProcessedPartition, TopicPartition
from kafka2delta.value_buffers import Due, FlushLimits, ValueBuffers

T0, T1 = TopicPartition("t", 0), TopicPartition("t", 1)
A0, B0 = TopicPartition("a", 0), TopicPartition("b", 0)
LIMITS = FlushLimits(
    allowed_latency_s=2.0, max_messages_per_file=100, min_bytes_per_file=10_000, max_buffered_bytes=15_000
)


def processed(partition: int, first: int, last: int, rows: int, topic: str = "t") -> ProcessedPartition:
    table = pa.table({"n": pa.array(range(rows), pa.int64())})
    return ProcessedPartition(
        topic=topic,
        partition=partition,
        rows=table,
        row_offsets=list(range(first, first + rows)),
        first_offset=first,
        last_offset=last,
        max_timestamp_ms=0,
    )


def test_latency_limit() -> None:
    buffers = ValueBuffers(LIMITS)
    assert buffers.due(0.0) is None
    buffers.add(processed(0, 0, 9, 10), 10, now=100.0, table="/t")
    assert buffers.due(101.9) is None
    assert buffers.seconds_until_due(101.0) == 1.0
    assert buffers.due(102.0) == Due({"/t": "latency"})


def test_a_paced_table_waits_longer_and_the_others_do_not() -> None:
    buffers = ValueBuffers(LIMITS)
    buffers.set_latency("/shared", 5.0)  # a commit budget shared with other writers
    buffers.add(processed(0, 0, 9, 10), 10, now=100.0, table="/shared")
    buffers.add(processed(1, 0, 9, 10), 10, now=100.0, table="/own")
    assert buffers.due(102.0) == Due({"/own": "latency"})
    buffers.take(frozenset({"/own"}))
    assert buffers.seconds_until_due(102.0) == 3.0
    assert buffers.due(104.9) is None
    assert buffers.due(105.0) == Due({"/shared": "latency"})
    buffers.set_latency("/shared", 1.0)  # never below allowed_latency_s
    assert buffers.due(101.9) is None and buffers.due(102.0) == Due({"/shared": "latency"})


def test_records_limit_counts_messages_not_rows() -> None:
    buffers = ValueBuffers(LIMITS)
    buffers.add(processed(0, 0, 99, 0), 100, now=0.0, table="/t")  # all dead letters: still a full batch
    assert buffers.due(0.0) == Due({"/t": "records"})


def test_bytes_limits() -> None:
    buffers = ValueBuffers(LIMITS)
    buffers.add(processed(0, 0, 49, 1300), 50, now=0.0, table="/t")  # 10,400 bytes of int64
    assert buffers.due(0.0) == Due({"/t": "bytes"})
    buffers = ValueBuffers(LIMITS)
    buffers.add(processed(0, 0, 9, 1000), 10, now=0.0, table="/t")
    buffers.add(processed(1, 0, 9, 1000), 10, now=0.0, table="/t")
    assert buffers.due(0.0) == Due({"/t": "buffer_bytes"})


def test_due_per_table_not_every_buffer() -> None:
    """A full file or a late partition makes its own table due; the other tables keep buffering."""
    buffers = ValueBuffers(LIMITS)
    buffers.add(processed(0, 0, 99, 10, topic="a"), 100, now=0.0, table="/a")
    buffers.add(processed(0, 0, 9, 10, topic="b"), 10, now=0.0, table="/b")
    assert buffers.due(0.0) == Due({"/a": "records"})
    assert buffers.take(frozenset({"/a"})).keys() == {"/a"}
    assert buffers.due(1.0) is None
    buffers.add(processed(0, 100, 109, 10, topic="a"), 10, now=1.5, table="/a")
    assert buffers.due(2.0) == Due({"/b": "latency"})  # /a's new buffer is only 0.5 s old
    buffers.add(processed(1, 0, 99, 10, topic="a"), 100, now=2.0, table="/a")
    # Each table due for its own reason (found by review: /b's latency was counted as "records").
    assert buffers.due(2.0) == Due({"/a": "records", "/b": "latency"})


def test_global_bound_flushes_the_largest_tables_until_half_is_left() -> None:
    """What a buffer holds: 8 bytes of Arrow a row here, and 16 for its offset and timestamp."""
    limits = FlushLimits(
        allowed_latency_s=60, max_messages_per_file=10_000, min_bytes_per_file=1_000_000, max_buffered_bytes=60_000
    )
    buffers = ValueBuffers(limits)
    buffers.add(processed(0, 0, 999, 1000, topic="a"), 1000, now=0.0, table="/a")  # 24,000 bytes
    buffers.add(processed(0, 0, 699, 700, topic="b"), 700, now=0.0, table="/b")  # 16,800
    buffers.add(processed(0, 0, 599, 600, topic="c"), 600, now=0.0, table="/c")  # 14,400
    assert buffers.buffered_bytes == 55_200
    assert buffers.due(0.0) is None  # 55,200 < 60,000
    buffers.add(processed(1, 0, 299, 300, topic="c"), 300, now=0.0, table="/c")  # /c: 21,600; 62,400 in all
    # Largest first: /a (24,000) leaves 38,400, /c (21,600) leaves 16,800 < 30,000: /b keeps its buffer.
    assert buffers.due(0.0) == Due({"/a": "buffer_bytes", "/c": "buffer_bytes"})


def test_dead_letters_count_in_the_global_bound() -> None:
    """Found by review: a partition whose every message failed held their payloads beyond the bound, unseen."""
    buffers = ValueBuffers(LIMITS)
    letters = [
        DeadLetter("t", 0, offset, "deserialize", "not JSON", b"x" * 1000, key=b"k", payload_json=None)
        for offset in range(20)
    ]
    empty = processed(0, 0, 19, 0)
    buffers.add(dataclasses.replace(empty, dead_letters=letters), 20, now=0.0, table="/t")
    assert buffers.buffered_bytes == 20 * (1000 + 1 + len("not JSON"))
    assert buffers.due(0.0) == Due({"/t": "buffer_bytes"})  # 20,180 bytes > 15,000


def test_lanes_of_one_partition() -> None:
    """A partition split across tables (routing by expression) has a lane per table; each lane covers every
    message of the partition, so a message is counted once and the room is the fullest lane's."""
    buffers = ValueBuffers(LIMITS)
    buffers.add(processed(0, 0, 59, 40), 60, now=0.0, table="/x")
    buffers.add(processed(0, 0, 59, 20), 60, now=0.0, table="/y")
    assert buffers.room(T0) == 40
    assert buffers.buffered_messages == 60
    assert buffers.tables_of(T0) == {"/x", "/y"}
    assert buffers.partitions() == [T0]
    taken = buffers.take(partitions={T0})
    assert {uri: lanes[T0].rows for uri, lanes in taken.items()} == {"/x": 40, "/y": 20}
    assert not buffers


def test_take_and_offsets() -> None:
    buffers = ValueBuffers(LIMITS)
    buffers.add(processed(0, 0, 4, 5), 5, now=0.0, table="/t")
    buffers.add(processed(0, 5, 9, 0), 5, now=1.0, table="/t")
    buffers.add(processed(1, 30, 31, 2), 2, now=1.0, table="/t")
    taken = buffers.take(partitions={T0})["/t"]
    assert list(taken) == [T0]
    assert (taken[T0].first_offset, taken[T0].last_offset, taken[T0].messages, taken[T0].rows) == (0, 9, 10, 5)
    assert T1 in buffers and T0 not in buffers
    assert buffers.take()["/t"].keys() == {T1}
    assert not buffers


def test_room_until_the_file_is_full() -> None:
    buffers = ValueBuffers(LIMITS)
    assert buffers.room(T0) == 100
    buffers.add(processed(0, 0, 59, 60), 60, now=0.0, table="/t")
    assert buffers.room(T0) == 40 and buffers.room(T1) == 100


def test_row_offsets_of_whole_spans_and_of_gapped_pieces() -> None:
    """A piece holding every offset of its span keeps it as a range; one with gaps (dead letters, filtered
    messages) keeps each offset; both read back in row order, and a rejection keeps the rest's."""
    buffers = ValueBuffers(LIMITS)
    buffers.add(processed(0, 0, 4, 5), 5, now=0.0, table="/t")
    gapped = processed(0, 5, 9, 3)
    gapped.row_offsets = [5, 7, 9]
    buffers.add(gapped, 5, now=0.0, table="/t")
    (buffer,) = buffers.take()["/t"].values()
    assert buffer.row_offsets[0] == range(0, 5)
    assert buffer.offsets().to_pylist() == [0, 1, 2, 3, 4, 5, 7, 9]
    schema = pa.schema([("n", pa.int64())])
    buffer.reject_rows([1, 6], schema)
    assert buffer.offsets().to_pylist() == [0, 2, 3, 4, 5, 9]
    assert buffer.to_table(schema).column("n").to_pylist() == [0, 2, 3, 4, 0, 2]
