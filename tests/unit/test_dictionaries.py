"""Which columns a file dictionary-encodes: nearly distinct ones are written plain, every other keeps its dictionary."""

import decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kafka2delta.dictionaries import MIN_SAMPLE, dictionary_columns, parquet_leaf_paths
from kafka2delta.offsets import TxnIds
from kafka2delta.records import OffsetRange, TopicPartition
from kafka2delta.writer import DeltaWriter

ROWS = 20_000


def events(rows: int = ROWS) -> pa.Table:
    """Columns of the kinds a Kafka table holds: unique (offset, id, a struct's id), a bounded domain (user ids of
    a 500-value range), a few values (type), a list, a boolean."""
    return pa.table(
        {
            "offset": pa.array(range(rows), pa.int64()),
            "id": [f"event-{i:08d}" for i in range(rows)],
            "user_id": [i % 500 for i in range(rows)],
            "type": [("click", "view", "buy")[i % 3] for i in range(rows)],
            "order": pa.array([{"id": i, "country": "FR"} for i in range(rows)]),
            "tags": [["a", "b"]] * rows,
            "flag": [i % 2 == 0 for i in range(rows)],
        }
    )


def encodings(path: Path) -> dict[str, bool]:
    """Whether each leaf column of a Parquet file has dictionary-encoded pages."""
    meta = pq.ParquetFile(path).metadata
    columns = [meta.row_group(g).column(c) for g in range(meta.num_row_groups) for c in range(meta.num_columns)]
    return {column.path_in_schema: "RLE_DICTIONARY" in column.encodings for column in columns}


def test_nearly_distinct_columns_are_plain_and_the_rest_keep_their_dictionaries() -> None:
    chosen = dictionary_columns(events())
    assert chosen == ["user_id", "type", "order.country", "tags.list.element", "flag"]


def test_a_parquet_file_written_with_the_choice_has_those_encodings(tmp_path: Path) -> None:
    rows = events()
    pq.write_table(rows, tmp_path / "f.parquet", use_dictionary=dictionary_columns(rows))
    written = encodings(tmp_path / "f.parquet")
    assert {path for path, dictionary in written.items() if not dictionary} == {"offset", "id", "order.id", "flag"}
    assert pq.read_table(tmp_path / "f.parquet").equals(rows)


def test_a_column_with_few_values_or_many_nulls_keeps_its_dictionary() -> None:
    small = events(MIN_SAMPLE - 1)
    assert dictionary_columns(small) is True  # too few values to judge
    sparse = pa.table({"id": [str(i) if i % 100 == 0 else None for i in range(ROWS)]})
    assert dictionary_columns(sparse) is True  # 200 values present: under MIN_SAMPLE


def test_nothing_distinct_means_every_column_as_before() -> None:
    assert dictionary_columns(pa.table({"type": ["a", "b"] * ROWS, "n": [1, 2] * ROWS})) is True


def test_leaf_paths_are_the_ones_parquet_names() -> None:
    assert parquet_leaf_paths(events().schema) == (
        "offset",
        "id",
        "user_id",
        "type",
        "order.id",
        "order.country",
        "tags.list.element",
        "flag",
    )


def test_a_column_whose_name_holds_a_dot_is_still_matched() -> None:
    rows = pa.table({"a.b": pa.array(range(ROWS), pa.int64()), "a": pa.array([{"c": 1}] * ROWS)})
    assert dictionary_columns(rows) == ["a.c"]


def test_the_delta_writer_writes_the_kafka_offset_plain(tmp_path: Path) -> None:
    rows = pa.table({"type": ["x", "y"] * (ROWS // 2), "_kafka_offset": pa.array(range(ROWS), pa.int64())})
    writer = DeltaWriter.open(str(tmp_path / "t"), {}, TxnIds("app").main, "snappy", 10, rows.schema)
    (action,) = writer.write_files(TopicPartition("e", 0), OffsetRange(0, ROWS - 1), rows)
    assert encodings(tmp_path / "t" / action.path) == {"type": True, "_kafka_offset": False}


def test_a_column_type_that_cannot_be_counted_keeps_its_dictionary() -> None:
    rows = pa.table({"v": pa.array([str(i) for i in range(ROWS)], pa.string_view()), "n": range(ROWS)})
    assert dictionary_columns(rows) == ["v"]


def test_nans_count_as_one_value() -> None:
    """NaN never equals NaN in a sorted copy: counted one by one, 3,000 NaNs among 17,000 distinct floats would
    pass the 90% bar; as one value (as Arrow's count_distinct counts them) they do not."""
    nans = pa.table({"x": [float("nan")] * 3_000 + [i / 7 for i in range(17_000)], "k": ["a"] * ROWS})
    assert dictionary_columns(nans) is True
    few_nans = pa.table({"x": [float("nan")] * 1_000 + [i / 7 for i in range(19_000)], "k": ["a"] * ROWS})
    assert dictionary_columns(few_nans) == ["k"]


@pytest.mark.parametrize(
    "kind", [pa.int64(), pa.string(), pa.binary(), pa.timestamp("us", "UTC"), pa.decimal128(12, 2), pa.float64()]
)
def test_the_bar_is_counted_exactly_over_chunks_and_nulls(kind: pa.DataType) -> None:
    """90% of the non-null sampled values: 18,001 distinct of 20,000 is plain, 17,999 keeps its dictionary, whichever
    chunk a repeated value sits in and however many nulls lie between."""

    def column(distinct: int) -> pa.ChunkedArray:
        values = [_as(kind, i if i < distinct else i - distinct) for i in range(ROWS)]  # repeats last, a chunk away
        with_nulls = [v for i, value in enumerate(values) for v in ((value, None) if i % 7 == 0 else (value,))]
        return pa.chunked_array([pa.array(with_nulls[:9_000], kind), pa.array(with_nulls[9_000:], kind)])

    def table(distinct: int) -> pa.Table:
        values = column(distinct)
        return pa.table({"c": values, "k": ["a"] * len(values)})

    assert dictionary_columns(table(18_001)) == ["k"]
    assert dictionary_columns(table(17_999)) is True


def _as(kind: pa.DataType, value: int) -> object:
    if pa.types.is_string(kind):
        return f"v{value:06d}"
    if pa.types.is_binary(kind):
        return value.to_bytes(4, "big")
    if pa.types.is_decimal(kind):
        return decimal.Decimal(value) / 100
    if pa.types.is_floating(kind):
        return value / 8
    return value
