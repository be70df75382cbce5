"""Property tests of the coerce stage: the reference lane only ever fails with MessageError and its
rows always build; the fast lane declines or agrees with it on whatever Arrow can hold."""

from __future__ import annotations

import base64
import datetime as dt
from decimal import Decimal
from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kafka2delta.coercions import CoercionOptions, coerce_document
from kafka2delta.errors import MessageError
from kafka2delta.schema import parse_type
from tests.support.lanes import check_fast_lane

PROPERTY_SETTINGS = settings(
    max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
OPTIONS = [
    CoercionOptions(),
    CoercionOptions(epoch_unit="s"),
    CoercionOptions(epoch_unit="ms", epoch_units={"c": "us", "user.created": "s"}),
]

# -- values -------------------------------------------------------------------------------------

digits = st.text("0123456789", min_size=1, max_size=2)


@st.composite
def timestamp_texts(draw: st.DrawFn) -> str:
    """Mostly well-formed RFC 3339-ish text, with every part occasionally wrong."""
    year = draw(
        st.sampled_from(["0000", "0001", "1969", "1970", "2024", "2026", "9999"])
        | st.text("0123456789", min_size=4, max_size=4)
    )
    month = draw(st.sampled_from(["01", "02", "04", "11", "12"]) | digits)
    day = draw(st.sampled_from(["01", "28", "29", "30", "31"]) | digits)
    date = f"{year}-{month}-{day}"
    if draw(st.integers(0, 9)) == 0:
        return date
    separator = draw(st.sampled_from(["T", "t", " ", "T", "x"]))
    clock = draw(st.sampled_from(["00:00:00", "10:30:59", "23:59:59", "24:00:00", "12:60:00", "12:00:60", "1:00:00"]))
    fraction = draw(st.sampled_from(["", ""]) | st.text("0123456789", min_size=0, max_size=10).map(lambda f: "." + f))
    zone = draw(st.sampled_from(["", "Z", "z", "+05:30", "-00:00", "+23:59", "-12:00", "+24:00", "+0530", "+05", " Z"]))
    return f"{date}{separator}{clock}{fraction}{zone}"


number_texts = st.from_regex(r"\A[+-]?[0-9]{0,22}(\.[0-9]{0,22})?([eE][+-]?[0-9]{1,3})?\Z") | st.sampled_from(
    ["nan", "inf", "-0", "+.5", "1_000", " 1", "1e", ".", "0x10", "١"]
)
integer_texts = st.from_regex(r"\A[+-]?0{0,3}[0-9]{1,21}\Z")
date_texts = timestamp_texts().map(lambda text: text[:10])
bool_texts = st.sampled_from(["true", "false", "TRUE", "False", "tRuE", "yes", "1", "0", "", "truee", "falſe"])
base64_texts = st.binary(max_size=12).map(lambda raw: base64.b64encode(raw).decode()) | st.text(
    "AZaz09+/=- ", max_size=8
)
finite_floats = st.floats(allow_nan=False, allow_infinity=False)
any_floats = st.floats()
huge_ints = st.integers(min_value=-(2**140), max_value=2**140)
fixed_offsets = st.integers(-23 * 60, 23 * 60).map(lambda minutes: dt.timezone(dt.timedelta(minutes=minutes)))
naive_datetimes = st.datetimes(min_value=dt.datetime(1, 1, 2), max_value=dt.datetime(9999, 12, 30))
aware_datetimes = st.datetimes(
    min_value=dt.datetime(1, 1, 2), max_value=dt.datetime(9999, 12, 30), timezones=fixed_offsets
)
decimals = st.decimals(allow_nan=False, allow_infinity=False)

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | huge_ints
    | finite_floats
    | st.text(max_size=12)
    | timestamp_texts()
    | number_texts
    | bool_texts
    | base64_texts
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(["id", "country", "created", "tags", "inner", "x", "zz"]) | st.text(max_size=4),
            children,
            max_size=4,
        )
    ),
    max_leaves=10,
)
binary_decoder_values = (
    st.binary(max_size=8)
    | decimals
    | st.decimals()  # NaN, sNaN, ±Infinity too
    | st.dates()
    | naive_datetimes
    | aware_datetimes
    | st.times()
    | st.sampled_from([b"\xff\xfe", Decimal("NaN"), Decimal("-Infinity"), Decimal("1E+999999"), Decimal("1E-999999")])
)
any_values = json_values | binary_decoder_values

# -- the reference lane -------------------------------------------------------------------------

SCHEMA = pa.schema(
    [
        ("s", pa.string()),
        ("b", pa.binary()),
        ("flag", pa.bool_()),
        ("i8", pa.int8()),
        ("i16", pa.int16()),
        ("i32", pa.int32()),
        ("i64", pa.int64()),
        ("f32", pa.float32()),
        ("f64", pa.float64()),
        ("d", pa.date32()),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("ntz", pa.timestamp("us")),
        ("dec", pa.decimal128(10, 2)),
        ("big", pa.decimal128(38, 0)),
        ("tags", parse_type("array<int>")),
        ("m", parse_type("map<string,long>")),
        ("mi", parse_type("map<int,string>")),
        (
            "user",
            pa.struct(
                [
                    pa.field("id", pa.int64(), nullable=False),
                    pa.field("created", pa.timestamp("us", tz="UTC")),
                    pa.field("tags", parse_type("array<string>")),
                    pa.field("inner", parse_type("struct<x:double,when:date>")),
                ]
            ),
        ),
        pa.field("req", pa.string(), nullable=False),
    ]
)

documents = st.fixed_dictionaries(
    {"req": st.text(max_size=5) | any_values},
    optional={column.name: any_values for column in SCHEMA if column.name != "req"} | {"extra": any_values},
)


def assert_reference_row_builds(document: dict[str, Any], schema: pa.Schema, options: CoercionOptions) -> bool:
    try:
        row, unknown = coerce_document(document, schema, options)
    except MessageError as exc:
        assert exc.stage == "coerce" and exc.reason.startswith("column '")
        return False
    assert list(row) == schema.names
    assert unknown >= 0
    pa.Table.from_pylist([row], schema=schema)  # must not raise
    return True


@PROPERTY_SETTINGS
@given(documents, st.sampled_from(OPTIONS))
def test_reference_lane_only_raises_message_errors_and_its_rows_build(
    document: dict[str, Any], options: CoercionOptions
) -> None:
    assert_reference_row_builds(document, SCHEMA, options)


@PROPERTY_SETTINGS
@given(st.sampled_from(list(SCHEMA)), any_values, st.sampled_from(OPTIONS))
def test_reference_lane_one_column_at_a_time(column: pa.Field, value: Any, options: CoercionOptions) -> None:
    assert_reference_row_builds({"c": value}, pa.schema([column.with_name("c")]), options)


# -- the fast lane agrees -----------------------------------------------------------------------


def with_unit(values: st.SearchStrategy[dt.datetime], unit: str) -> st.SearchStrategy[dt.datetime]:
    """Datetimes an Arrow timestamp of ``unit`` holds exactly (so the table is the document)."""
    if unit == "s":
        return values.map(lambda v: v.replace(microsecond=0))
    if unit == "ms":
        return values.map(lambda v: v.replace(microsecond=v.microsecond // 1000 * 1000))
    return values


ns_range: dict[str, Any] = {"min_value": dt.datetime(1678, 1, 1), "max_value": dt.datetime(2261, 12, 31)}

# (value strategy, Arrow type of the column: None = what pa.array infers)
COLUMN_KINDS: list[tuple[st.SearchStrategy[Any], pa.DataType | None]] = [
    (st.integers(-300, 300), None),
    (st.integers(-(2**63), 2**63 - 1), None),
    (st.integers(0, 2**64 - 1), pa.uint64()),
    (st.integers(-128, 127), pa.int8()),
    (st.integers(0, 65535), pa.uint16()),
    (finite_floats, None),
    (any_floats, None),
    (st.integers(-(2**62), 2**62).map(float), None),
    (st.integers(-(2**53), 2**53) | st.floats(-1e6, 1e6), None),  # an inferred double holding JSON ints
    (st.floats(width=32, allow_nan=False), pa.float32()),
    (number_texts, None),
    (integer_texts, None),
    (number_texts, pa.large_string()),
    (timestamp_texts(), None),
    (date_texts, None),
    (bool_texts, None),
    (st.booleans(), None),
    (base64_texts, None),
    (st.binary(max_size=8), None),
    (st.binary(min_size=3, max_size=3), pa.binary(3)),
    (st.decimals(allow_nan=False, allow_infinity=False, places=2, min_value=-(10**12), max_value=10**12), None),
    (st.decimals(allow_nan=False, allow_infinity=False), None),
    (
        st.decimals(allow_nan=False, allow_infinity=False, places=0, min_value=-(10**37), max_value=10**37),
        pa.decimal128(38, 0),
    ),
    (st.dates(), None),
    (naive_datetimes, None),
    (aware_datetimes, None),
    (with_unit(naive_datetimes, "s"), pa.timestamp("s")),
    (with_unit(aware_datetimes, "ms"), pa.timestamp("ms", "UTC")),
    (with_unit(aware_datetimes, "ms"), pa.timestamp("ms", "Asia/Kolkata")),
    (st.datetimes(**ns_range, timezones=fixed_offsets), pa.timestamp("ns", "UTC")),
    (st.times(), None),
    (st.lists(st.integers(-(2**40), 2**40) | st.none(), max_size=4), None),
    (st.lists(number_texts, max_size=3), None),
    (st.lists(st.lists(st.integers(-5, 5), max_size=2), max_size=3), None),
    (
        st.fixed_dictionaries(
            {"id": st.integers(-5, 5)}, optional={"country": st.text(max_size=3), "x": st.integers()}
        ),
        None,
    ),
    (st.fixed_dictionaries({"id": integer_texts}, optional={"country": st.none(), "created": timestamp_texts()}), None),
    (
        st.dictionaries(st.text(max_size=3), st.integers(-(2**40), 2**40) | st.none(), max_size=3),
        pa.map_(pa.string(), pa.int64()),
    ),
    (st.dictionaries(integer_texts, st.text(max_size=3), max_size=3), pa.map_(pa.string(), pa.string())),
    (st.dictionaries(st.text(max_size=3), finite_floats, max_size=3), pa.map_(pa.string(), pa.float64())),
    (st.dictionaries(st.text(max_size=3), st.integers(-5, 5), max_size=3), None),  # an inferred struct
]

TARGETS = [
    "string",
    "binary",
    "boolean",
    "byte",
    "short",
    "int",
    "long",
    "float",
    "double",
    "date",
    "timestamp",
    "timestamp_ntz",
    "decimal(10,2)",
    "decimal(38,0)",
    "decimal(5,5)",
    "array<long>",
    "array<double>",
    "array<array<string>>",
    "map<string,long>",
    "map<int,string>",
    "map<string,decimal(12,3)>",
    "struct<id:long,country:string>",
    "struct<id:string,created:timestamp>",
]


def same_document(held: Any, original: Any) -> bool:
    """Arrow's copy equals the document, up to what JSON cannot tell apart either: an absent key and
    a null one (inferred structs), 1 and 1.0 (inferred doubles)."""
    if isinstance(original, dict):
        return isinstance(held, dict) and all(
            same_document(held.get(key), original.get(key)) for key in set(held) | set(original)
        )
    if isinstance(original, list):
        return (
            isinstance(held, list)
            and len(held) == len(original)
            and all(same_document(h, o) for h, o in zip(held, original, strict=True))
        )
    if isinstance(original, float) and original != original:
        return isinstance(held, float) and held != held
    return bool(held == original) and (held is None) == (original is None)


@st.composite
def columns(draw: st.DrawFn) -> tuple[list[Any], pa.DataType | None]:
    values, arrow_type = draw(st.sampled_from(COLUMN_KINDS))
    return draw(st.lists(st.none() | values, min_size=1, max_size=8)), arrow_type


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(columns(), st.sampled_from(TARGETS), st.booleans(), st.sampled_from(OPTIONS))
def test_fast_lane_declines_or_agrees_with_the_reference(
    column: tuple[list[Any], pa.DataType | None], target: str, nullable: bool, options: CoercionOptions
) -> None:
    values, arrow_type = column
    try:
        array = pa.array(values, type=arrow_type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError, TypeError, ValueError):
        assume(False)
        return
    # What the table holds must be the document: skip values Arrow cannot hold faithfully.
    try:
        assume(same_document(array.to_pylist(maps_as_pydicts="strict"), values))
    except (pa.ArrowException, ValueError, KeyError):
        assume(False)
    schema = pa.schema([pa.field("c", parse_type(target), nullable=nullable)])
    check_fast_lane([{"c": value} for value in values], pa.table({"c": array}), schema, options)
