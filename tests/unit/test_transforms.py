"""Transforms and the filter: the reference lane (apply_document), the fast lane (apply_table), and
that the fast lane never disagrees with the reference for a row it keeps."""

from __future__ import annotations

import copy
import time
from typing import Any

import pyarrow as pa
import pytest

from kafka2delta.errors import ConfigError, MessageError
from kafka2delta.records import PartitionMessages, Stage
from kafka2delta.transforms import Transformer, format_epoch_nanos
from tests.support.lanes import normalized

STAGE: Stage = "transform"


def make_messages(
    count: int,
    *,
    topic: str = "events",
    partition: int = 3,
    first_offset: int = 100,
    keys: list[bytes | None] | None = None,
    headers: list[list[tuple[str, bytes | None]] | None] | None = None,
    timestamp_types: list[int] | None = None,
) -> PartitionMessages:
    return PartitionMessages(
        topic=topic,
        partition=partition,
        offsets=list(range(first_offset, first_offset + count)),
        payloads=[b"{}"] * count,
        timestamps_ms=[1_626_823_098_519 + i for i in range(count)],
        keys=keys,
        headers=headers,
        timestamp_types=timestamp_types,
    )


def reference(
    transformer: Transformer, document: dict[str, Any], messages: PartitionMessages | None = None, key: Any = None
) -> dict[str, Any] | None:
    return transformer.apply_document(copy.deepcopy(document), messages or make_messages(1), 0, key)


def check_lanes_agree(
    transformer: Transformer,
    documents: list[dict[str, Any]],
    schema: pa.Schema,
    messages: PartitionMessages,
    keys: list[Any] | None = None,
) -> Any:
    """Run both lanes; every row the fast lane keeps or filters must match the reference exactly."""
    table = pa.Table.from_pylist(documents, schema=schema)
    result = transformer.apply_table(table, messages, list(range(len(documents))), keys)
    assert sorted(result.kept + result.filtered + result.fallback) == list(range(len(documents)))
    assert result.table.num_rows == len(result.kept)
    fast_rows = result.table.to_pylist()
    for row, fast in zip(result.kept, fast_rows, strict=True):
        # The reference sees what Arrow holds (a float column holds floats), as it would in the pipeline.
        document = {name: value for name, value in table.slice(row, 1).to_pylist()[0].items()}
        expected = transformer.apply_document(document, messages, row, None if keys is None else keys[row])
        assert expected is not None, f"row {row} kept by the fast lane, filtered by the reference"
        assert normalized(fast) == normalized(expected), f"row {row}"
    for row in result.filtered:
        document = table.slice(row, 1).to_pylist()[0]
        assert transformer.apply_document(document, messages, row, None if keys is None else keys[row]) is None
    return result


# --------------------------------------------------------------------------------------------------
# The reference lane
# --------------------------------------------------------------------------------------------------


def test_later_transforms_read_earlier_targets() -> None:
    transformer = Transformer(
        [("name", "user.name"), ("short", "substr(name, `0`, `3`)"), ("meta.short", "short"), ("copy", "meta")]
    )
    result = reference(transformer, {"user": {"name": "William"}})
    assert result == {
        "user": {"name": "William"},
        "name": "William",
        "short": "Wil",
        "meta": {"short": "Wil"},
        "copy": {"short": "Wil"},
    }


def test_nested_targets_create_objects_keep_siblings_and_replace_non_objects() -> None:
    transformer = Transformer([("meta.ids.user", "user.id"), ("meta.source", "'web'")])
    assert reference(transformer, {"user": {"id": 7}, "meta": {"x": 1}}) == {
        "user": {"id": 7},
        "meta": {"x": 1, "ids": {"user": 7}, "source": "web"},
    }
    replaced = reference(transformer, {"user": {"id": 7}, "meta": "scalar"})
    assert replaced is not None and replaced["meta"] == {
        "ids": {"user": 7},
        "source": "web",
    }


def test_a_null_result_sets_nothing() -> None:
    transformer = Transformer([("name", "nickname"), ("meta.id", "missing")])
    assert reference(transformer, {"name": "kept", "nickname": None}) == {"name": "kept", "nickname": None}
    assert reference(transformer, {"meta": "scalar"}) == {"meta": "scalar"}  # not even the objects on the way


def test_a_copied_object_is_not_changed_through_its_copy() -> None:
    transformer = Transformer([("b", "a"), ("b.x", "`1`"), ("snapshot", "@"), ("a.y", "`2`")])
    result = reference(transformer, {"a": {"v": 0}})
    assert result is not None
    assert result["a"] == {"v": 0, "y": 2}
    assert result["b"] == {"v": 0, "x": 1}
    assert result["snapshot"] == {"a": {"v": 0}, "b": {"v": 0, "x": 1}}  # a copy, not the document itself


def test_literal_objects_are_not_shared_between_documents() -> None:
    transformer = Transformer([("tags", "`[1]`"), ("meta", 'missing || `{"a": 1}`')])
    first, second = reference(transformer, {}), reference(transformer, {})
    assert first == second == {"tags": [1], "meta": {"a": 1}}
    assert first is not None and second is not None
    assert first["tags"] is not second["tags"] and first["meta"] is not second["meta"]


def test_apply_document_returns_the_document_it_was_given() -> None:
    document: dict[str, Any] = {"a": 1}
    assert Transformer([("b", "a")]).apply_document(document, make_messages(1), 0, None) is document


def test_scalar_metadata() -> None:
    transformer = Transformer(
        [
            ("topic", "kafka.topic"),
            ("partition", "kafka.partition"),
            ("offset", "kafka.offset"),
            ("timestamp", "kafka.timestamp"),
            ("timestamp_type", "kafka.timestamp_type"),
            ("nothing", "kafka.nope"),
        ]
    )
    messages = make_messages(3, timestamp_types=[0, 1, -1])
    documents = [transformer.apply_document({"timestamp": "old"}, messages, i, None) for i in range(3)]
    assert documents[0] == {
        "timestamp": 1_626_823_098_519,
        "topic": "events",
        "partition": 3,
        "offset": 100,
        "timestamp_type": 0,
    }
    assert documents[1] is not None and documents[1]["timestamp_type"] == 1
    assert documents[1]["timestamp"] == 1_626_823_098_520
    # no timestamp: null, so the document keeps its own field
    assert documents[2] is not None and documents[2]["timestamp"] == "old"
    assert documents[2]["timestamp_type"] == -1
    # sources without timestamp types answer "create time"
    assert reference(Transformer([("t", "kafka.timestamp_type")]), {}) == {"t": 0}


def test_key_as_string_and_as_json_object() -> None:
    transformer = Transformer(
        [("key", "kafka.key"), ("user", "kafka.key.user"), ("prefix", "substr(kafka.key, `0`, `3`)")]
    )
    assert reference(transformer, {}, key="abcdef") == {"key": "abcdef", "prefix": "abc"}
    with pytest.raises(MessageError, match=r"transforms\.prefix: substr\(\) expects a string, got object"):
        reference(transformer, {}, key={"user": "u1"})
    assert reference(Transformer([("key", "kafka.key"), ("user", "kafka.key.user")]), {}, key={"user": "u1"}) == {
        "key": {"user": "u1"},
        "user": "u1",
    }
    assert reference(Transformer([("key", "kafka.key")]), {"key": "kept"}, key=None) == {"key": "kept"}


def test_headers_decode_utf8_with_replacement_and_the_last_repeated_name_wins() -> None:
    headers: list[list[tuple[str, bytes | None]] | None] = [
        [("trace", b"t-1"), ("bad", b"caf\xe9"), ("dup", b"first"), ("dup", b"second"), ("empty", None)]
    ]
    messages = make_messages(1, headers=headers)
    transformer = Transformer(
        [("headers", "kafka.headers"), ("trace", "kafka.headers.trace"), ("bad", "kafka.headers.bad")]
    )
    assert transformer.apply_document({}, messages, 0, None) == {
        "headers": {"trace": "t-1", "bad": "caf\ufffd", "dup": "second", "empty": None},
        "trace": "t-1",
        "bad": "caf\ufffd",
    }
    assert transformer.apply_document({}, make_messages(1), 0, None) == {"headers": {}}


def test_metadata_inside_larger_expressions_and_a_shadowed_kafka_field() -> None:
    transformer = Transformer(
        [
            ("id", "join('-', [kafka.topic, to_string(kafka.partition), to_string(kafka.offset)])"),
            ("late", "kafka.offset > `99`"),
            ("own", "kafka.mine"),  # a message field named kafka is shadowed in expressions
        ]
    )
    assert transformer.uses_interpreter
    result = reference(transformer, {"kafka": {"mine": 1}})
    assert result == {"kafka": {"mine": 1}, "id": "events-3-100", "late": True}


def test_substr_matches_kafka_delta_ingest_and_counts_characters() -> None:
    transformer = Transformer(
        [("will", "substr(name, `0`, `4`)"), ("liam", "substr(name, `3`, `4`)"), ("past", "substr(name, `10`, `2`)")]
    )
    assert reference(transformer, {"name": "William"}) == {
        "name": "William",
        "will": "Will",
        "liam": "liam",
        "past": "",
    }
    text = Transformer([("s", "substr(t, `1`, `3`)")])
    assert reference(text, {"t": "日本語テキスト"})["s"] == "本語テ"  # type: ignore[index]
    assert reference(text, {"t": "😀héllo"})["s"] == "hél"  # type: ignore[index]


@pytest.mark.parametrize(
    ("expression", "value", "expected"),
    [
        ("epoch_seconds_to_iso8601(v)", 1626823098, "2021-07-20T23:18:18Z"),
        ("epoch_seconds_to_iso8601(v)", 1626823098.51995, "2021-07-20T23:18:18Z"),  # truncated to seconds
        ("epoch_seconds_to_iso8601(v)", -1, "1969-12-31T23:59:59Z"),
        ("epoch_millis_to_iso8601(v)", 1626823098519, "2021-07-20T23:18:18.519Z"),
        ("epoch_millis_to_iso8601(v)", 1626823098000, "2021-07-20T23:18:18Z"),
        ("epoch_millis_to_iso8601(v)", -1, "1969-12-31T23:59:59.999Z"),
        ("epoch_micros_to_iso8601(v)", 1626823098000000, "2021-07-20T23:18:18Z"),
        ("epoch_micros_to_iso8601(v)", 1626823098123456, "2021-07-20T23:18:18.123456Z"),
        ("epoch_micros_to_iso8601(v)", 1626823098120000, "2021-07-20T23:18:18.120Z"),
        ("epoch_micros_to_iso8601(v)", 1626823098100001.75, "2021-07-20T23:18:18.100001Z"),
        ("epoch_millis_to_micro(v)", 1732279537028, 1732279537028000),
        ("epoch_millis_to_micro(v)", 1732279537028.9, 1732279537028000),
        ("epoch_seconds_to_iso8601(to_number(v))", "1626823098.51995", "2021-07-20T23:18:18Z"),
    ],
)
def test_epoch_functions(expression: str, value: Any, expected: Any) -> None:
    assert reference(Transformer([("out", expression)]), {"v": value}) == {"v": value, "out": expected}


def test_nanosecond_fractions_print_nine_digits() -> None:
    assert format_epoch_nanos(1_626_823_098_000_000_001) == "2021-07-20T23:18:18.000000001Z"
    assert format_epoch_nanos(-(2**63)) == "1677-09-21T00:12:43.145224192Z"
    assert format_epoch_nanos(2**63 - 1) == "2262-04-11T23:47:16.854775807Z"


@pytest.mark.parametrize(
    ("expression", "document", "reason"),
    [
        ("substr(name, `0`, `4`)", {}, "transforms.out: substr() expects a string, got null"),
        ("substr(name, `0`, `4`)", {"name": 5}, "transforms.out: substr() expects a string, got number"),
        (
            "substr(name, `-1`, `4`)",
            {"name": "x"},
            "transforms.out: substr() expects a non-negative integer start, got -1",
        ),
        (
            "substr(name, `0`, `1.5`)",
            {"name": "x"},
            "transforms.out: substr() expects a non-negative integer length, got 1.5",
        ),
        (
            "epoch_seconds_to_iso8601(ts)",
            {"ts": "1"},
            "transforms.out: epoch_seconds_to_iso8601() expects a number, got string",
        ),
        (
            "epoch_millis_to_iso8601(ts)",
            {"ts": True},
            "transforms.out: epoch_millis_to_iso8601() expects a number, got boolean",
        ),
        (
            "epoch_seconds_to_iso8601(ts)",
            {"ts": 1e12},
            "transforms.out: epoch_seconds_to_iso8601() argument 1000000000000.0 is out of range",
        ),
        (
            "epoch_millis_to_micro(ts)",
            {"ts": 2**62},
            f"transforms.out: epoch_millis_to_micro() argument {2**62} is out of range",
        ),
        (
            "epoch_micros_to_iso8601(ts)",
            {"ts": float("nan")},
            "transforms.out: epoch_micros_to_iso8601() argument nan is out of range",
        ),
        ("length(n)", {"n": 5}, "transforms.out: In function length(), invalid type for value: 5"),
        ("n < `1`", {"n": "a"}, "transforms.out: cannot compare: '<' not supported"),
    ],
)
def test_an_expression_failing_on_a_message_is_a_message_error_naming_the_target(
    expression: str, document: dict[str, Any], reason: str
) -> None:
    with pytest.raises(MessageError) as caught:
        reference(Transformer([("out", expression)]), document)
    assert caught.value.stage == STAGE
    assert caught.value.reason.startswith(reason)


def test_a_failing_filter_names_the_filter() -> None:
    with pytest.raises(MessageError, match=r"filter\.expression: substr\(\) expects a string, got null"):
        reference(Transformer([], "substr(name, `0`, `1`) == 'x'"), {})


@pytest.mark.parametrize(
    ("filter_expression", "document", "kept"),
    [
        ("type == 'click'", {"type": "click"}, True),
        ("type == 'click'", {"type": "view"}, False),
        ("type == 'click'", {}, False),  # missing field: null == 'click' is false
        ("type != 'heartbeat'", {}, True),  # null != 'heartbeat' is true
        ("type", {"type": None}, False),  # null is false
        ("type", {"type": ""}, False),
        ("type", {"type": 0}, True),  # 0 is true in JMESPath
        ("tags", {"tags": []}, False),
        ("obj", {"obj": {}}, False),
        ("n > `3`", {"n": "text"}, None),  # raises: a string against a number
        ("n > `3`", {"n": True}, False),  # null: ordering a boolean
        ("!missing", {}, True),
        ("a && b", {"a": 1, "b": "x"}, True),
        ("a || b", {"a": "", "b": ""}, False),
    ],
)
def test_filter(filter_expression: str, document: dict[str, Any], kept: bool | None) -> None:
    transformer = Transformer([("seen", "'yes'")], filter_expression)
    if kept is None:
        with pytest.raises(MessageError):
            reference(transformer, document)
        return
    result = reference(transformer, document)
    assert (result is not None) == kept
    if result is not None:
        assert result["seen"] == "yes"  # the filter runs after the transforms


def test_the_filter_sees_transformed_documents_and_metadata() -> None:
    transformer = Transformer([("kind", "payload.type")], "kind == 'click' && kafka.partition == `3`")
    assert reference(transformer, {"payload": {"type": "click"}}) is not None
    assert reference(transformer, {"payload": {"type": "view"}}) is None


# --------------------------------------------------------------------------------------------------
# Configuration errors, active, uses_interpreter, source_fields
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("transforms", "filter_expression", "key", "problem"),
    [
        ([("out", "a.")], "", "transforms.out", "invalid JMESPath expression 'a.'"),
        ([("out", "a[")], "", "transforms.out", "incomplete expression"),
        ([("out", "`{")], "", "transforms.out", "Unclosed ` delimiter"),
        ([("out", "")], "", "transforms.out", "cannot be empty"),
        ([("out", "nope(a)")], "", "transforms.out", "unknown function nope()"),
        ([("out", "substr(a, `0`)")], "", "transforms.out", "substr() takes 3 argument(s), got 2"),
        ([("out", "not_null()")], "", "transforms.out", "not_null() takes at least 1 argument(s), got 0"),
        ([("kafka.offset", "a")], "", "transforms.kafka.offset", "reserved for the Kafka metadata"),
        ([("kafka", "a")], "", "transforms.kafka", "reserved for the Kafka metadata"),
        ([("a..b", "a")], "", "transforms.a..b", "invalid target"),
        ([], "a ==", "filter.expression", "incomplete expression"),
    ],
)
def test_bad_configuration(transforms: list[tuple[str, str]], filter_expression: str, key: str, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Transformer(transforms, filter_expression)
    assert caught.value.key == key
    assert problem in caught.value.problem
    assert "\n" not in str(caught.value)


def test_active() -> None:
    assert not Transformer([]).active
    assert not Transformer([], "  ").active
    assert Transformer([], "a").active
    assert Transformer([("a", "b")]).active


@pytest.mark.parametrize(
    "expression",
    [
        "join('-', [kafka.topic, to_string(kafka.partition)])",
        "a == b",
        "length(a)",
        "a[0]",
        "@",
        "kafka",
        "`[1, 2]`",
        "substr(a, b, `1`)",
    ],
)
def test_uncompilable_expressions_use_the_interpreter(expression: str) -> None:
    transformer = Transformer([("ok", "a.b"), ("x", expression)])
    assert transformer.uses_interpreter
    assert transformer.interpreted and transformer.interpreted[0].startswith("transforms.x")
    assert transformer.source_fields(pa.schema([])) == []
    result = transformer.apply_table(pa.table({"a": [1, 2]}), make_messages(2), [0, 1], None)
    assert result.fallback == [0, 1] and result.kept == []
    assert Transformer([], expression).uses_interpreter


def test_compilable_chains_do_not_use_the_interpreter() -> None:
    transformer = Transformer(
        [
            ("date", "substr(ts, `0`, `10`)"),
            ("offset", "kafka.offset"),
            ("meta.user_id", "user.id"),
            ("renamed", '"odd name".x'),
            ("iso", "epoch_millis_to_iso8601(ms)"),
            ("flag", "n >= `3` && !(kind == 'x') || kafka.key.vip"),
            ("header", "kafka.headers.trace"),
            ("constant", "`42`"),
        ],
        "kind != 'heartbeat'",
    )
    assert not transformer.uses_interpreter and transformer.interpreted == ()


def test_source_fields() -> None:
    transformer = Transformer(
        [
            ("date", "substr(ts, `0`, `10`)"),
            ("created", "created_at"),
            ("amount", "payload.amount"),
            ("meta.user_id", "user.id"),
            ("seconds", "epoch_seconds_to_iso8601(epoch)"),
            ("copy", "date"),  # written by an earlier transform: not a source
            ("offset", "kafka.offset"),
        ],
        "kind == 'click' && meta.user_id != `0`",
    )
    schema = pa.schema(
        [
            ("date", pa.date32()),
            ("created", pa.timestamp("us", "UTC")),
            ("amount", pa.decimal128(10, 2)),
            ("meta", pa.struct([("user_id", pa.int64())])),
            ("seconds", pa.string()),
        ]
    )
    assert transformer.source_fields(schema) == [
        ("ts", pa.string()),
        ("created_at", pa.string()),
        ("payload.amount", pa.string()),
        ("user.id", pa.int64()),
        ("epoch", pa.float64()),
        ("kind", None),
    ]


# --------------------------------------------------------------------------------------------------
# The fast lane
# --------------------------------------------------------------------------------------------------

MIXED_SCHEMA = pa.schema(
    [
        ("ts", pa.string()),
        ("name", pa.string()),
        ("user", pa.struct([("id", pa.int64()), ("name", pa.string())])),
        ("meta", pa.struct([("x", pa.int64()), ("user_id", pa.int64())])),
        ("ms", pa.int64()),
        ("seconds", pa.float64()),
        ("n", pa.int64()),
        ("kind", pa.string()),
        ("date", pa.string()),
    ]
)

MIXED_DOCUMENTS: list[dict[str, Any]] = [
    # 0: everything present
    {
        "ts": "2021-03-16T14:38:58Z",
        "name": "William",
        "user": {"id": 7, "name": "Ann"},
        "meta": {"x": 1},
        "ms": 1626823098519,
        "seconds": 1626823098.51995,
        "n": 5,
        "kind": "click",
    },
    # 1: ts null -> substr raises in the reference: declined
    {"ts": None, "name": "x", "user": {"id": 8}, "ms": 0, "seconds": 0.0, "n": 1, "kind": "view"},
    # 2: non-ASCII text, no user, a date the substr result replaces
    {
        "ts": "日本語テキストです。長い",
        "name": "😀héllo",
        "ms": -1,
        "seconds": -1.5,
        "n": 0,
        "kind": "click",
        "date": "keep me",
    },
    # 3: filtered out by kind
    {"ts": "2021-01-01", "name": "", "user": {"id": None}, "ms": 1, "seconds": 1.0, "n": 3, "kind": "heartbeat"},
    # 4: ms out of range -> declined
    {"ts": "2021-01-01", "name": "a", "ms": 2**62, "seconds": 2.0, "n": 4, "kind": "click"},
    # 5: seconds not finite-able / huge -> declined
    {"ts": "2021-01-01", "name": "a", "ms": 5, "seconds": 1e300, "n": 4, "kind": "click"},
    # 6: missing kind (null != 'heartbeat' is true), short text
    {
        "ts": "2021",
        "name": "Al",
        "user": {"id": 9, "name": None},
        "meta": None,
        "ms": 1626823098000,
        "seconds": 3.0,
        "n": None,
    },
]

MIXED_TRANSFORMS = [
    ("date", "substr(ts, `0`, `10`)"),
    ("offset", "kafka.offset"),
    ("meta.user_id", "user.id"),
    ("short", "substr(name, `1`, `3`)"),
    ("iso_ms", "epoch_millis_to_iso8601(ms)"),
    ("iso_s", "epoch_seconds_to_iso8601(seconds)"),
    ("micros", "epoch_millis_to_micro(ms)"),
    ("big", "n > `3`"),
    ("label", "nickname || name"),
    ("both", "n && kind"),
    ("not_kind", "!kind"),
    ("partition", "kafka.partition"),
    ("topic", "kafka.topic"),
    ("ts_type", "kafka.timestamp_type"),
    ("kts", "kafka.timestamp"),
    ("deep.a.b", "kind"),
]


def test_fast_lane_agrees_with_the_reference_on_mixed_rows() -> None:
    transformer = Transformer(MIXED_TRANSFORMS, "kind != 'heartbeat'")
    assert not transformer.uses_interpreter
    messages = make_messages(len(MIXED_DOCUMENTS), timestamp_types=[0, 1, -1, 0, 0, 0, 1])
    result = check_lanes_agree(transformer, MIXED_DOCUMENTS, MIXED_SCHEMA, messages)
    assert result.kept == [0, 2, 6]
    assert result.filtered == [3]
    assert result.fallback == [1, 4, 5]
    rows = result.table.to_pylist()
    assert rows[0]["date"] == "2021-03-16" and rows[0]["meta"] == {"x": 1, "user_id": 7}
    assert rows[0]["iso_ms"] == "2021-07-20T23:18:18.519Z" and rows[0]["iso_s"] == "2021-07-20T23:18:18Z"
    assert rows[1]["date"] == "日本語テキストです。" and rows[1]["short"] == "hél"
    assert rows[1]["kts"] is None and rows[1]["label"] == "😀héllo"
    assert rows[2]["deep"] is None and rows[2]["both"] is None


def test_a_null_result_keeps_the_old_value_unless_the_types_differ() -> None:
    schema = pa.schema([("a", pa.string()), ("b", pa.int64()), ("target", pa.string())])
    documents: list[dict[str, Any]] = [
        {"a": "new", "b": 1, "target": "old"},
        {"a": None, "b": 1, "target": "old"},  # keeps "old"
        {"a": None, "b": None, "target": None},
    ]
    same_type = check_lanes_agree(Transformer([("target", "a")]), documents, schema, make_messages(3))
    assert same_type.kept == [0, 1, 2]
    assert [row["target"] for row in same_type.table.to_pylist()] == ["new", "old", None]
    # b is a number; where it is null the string "old" must stay: that row cannot share the column
    other_type = check_lanes_agree(Transformer([("target", "b")]), documents, schema, make_messages(3))
    assert other_type.kept == [0, 1, 2]  # row 2 had nothing at the target
    documents[2]["target"] = "old"
    other_type = check_lanes_agree(Transformer([("target", "b")]), documents, schema, make_messages(3))
    assert other_type.fallback == [2]


def test_nested_targets_in_the_fast_lane() -> None:
    schema = pa.schema([("id", pa.int64()), ("meta", pa.string()), ("obj", pa.struct([("x", pa.int64())]))])
    documents: list[dict[str, Any]] = [
        {"id": 1, "meta": None, "obj": {"x": 1}},
        {"id": 2, "meta": "scalar", "obj": None},  # the scalar is replaced by an object
        {"id": None, "meta": None, "obj": {"x": None}},
        {"id": None, "meta": "scalar", "obj": None},  # nothing set: the scalar stays, which Arrow cannot mix
    ]
    transformer = Transformer([("meta.ids.user", "id"), ("obj.y.z", "id"), ("obj.x", "id")])
    result = check_lanes_agree(transformer, documents, schema, make_messages(4))
    assert result.kept == [0, 1, 2] and result.fallback == [3]
    rows = result.table.to_pylist()
    assert rows[0]["meta"] == {"ids": {"user": 1}} and rows[0]["obj"] == {"x": 1, "y": {"z": 1}}
    assert rows[1]["meta"] == {"ids": {"user": 2}} and rows[1]["obj"] == {"x": 2, "y": {"z": 2}}
    assert rows[2]["meta"] is None and rows[2]["obj"] == {"x": None, "y": None}


def test_key_and_headers_in_the_fast_lane() -> None:
    headers: list[list[tuple[str, bytes | None]] | None] = [
        [("trace", b"t-0"), ("dup", b"a"), ("dup", b"b")],
        None,
        [("trace", b"\xff\xfe")],
        [("other", None)],
    ]
    messages = make_messages(4, headers=headers)
    schema = pa.schema([("v", pa.int64())])
    documents: list[dict[str, Any]] = [{"v": i} for i in range(4)]
    transformer = Transformer(
        [
            ("key", "kafka.key"),
            ("trace", "kafka.headers.trace"),
            ("headers", "kafka.headers"),
            ("p", "substr(kafka.key, `0`, `2`)"),
        ]
    )
    string_keys = check_lanes_agree(transformer, documents, schema, messages, ["k0", None, "k2", "k3"])
    assert string_keys.fallback == [1]  # substr of a null key raises
    assert [row["trace"] for row in string_keys.table.to_pylist()] == ["t-0", "\ufffd\ufffd", None]
    # JSON keys: objects cannot be a string column: those rows go to the reference lane
    json_keys = check_lanes_agree(transformer, documents, schema, messages, ["k0", {"user": 1}, "k2", 5])
    assert json_keys.fallback == [1, 3]
    by_path = Transformer([("user", "kafka.key.user")])
    result = check_lanes_agree(by_path, documents, schema, messages, [{"user": "a"}, None, {"user": "c"}, "plain"])
    assert result.kept == [0, 1, 2, 3]
    assert [row.get("user") for row in result.table.to_pylist()] == ["a", None, "c", None]


def test_comparisons_in_the_fast_lane_follow_jmespath() -> None:
    schema = pa.schema(
        [
            ("s", pa.string()),
            ("i", pa.int64()),
            ("f", pa.float64()),
            ("b", pa.bool_()),
            ("o", pa.struct([("x", pa.int64())])),
            ("l", pa.list_(pa.int64())),
        ]
    )
    documents: list[dict[str, Any]] = [
        {"s": "a", "i": 1, "f": 1.0, "b": True, "o": {"x": 1}, "l": [1]},
        {"s": "b", "i": 0, "f": 0.5, "b": False, "o": None, "l": []},
        {"s": None, "i": None, "f": None, "b": None, "o": None, "l": None},
        {"s": "", "i": 3, "f": float("nan"), "b": True, "o": {"x": None}, "l": None},
        {"s": "é", "i": -2, "f": -2.5, "b": False, "o": None, "l": [0]},
    ]
    transformers = [
        ("s == 'a'", None),
        ("s != 'a'", None),
        ("i == `1`", None),
        ("i == `1.0`", None),
        ("b == `1`", None),
        ("f == `1`", None),
        ("i < `2.5`", None),
        ("i >= `-2.5`", None),
        ("f > `0`", None),
        ("s < 'b'", None),
        ("s > `1`", "rows with a string"),
        ("i < 'x'", "rows with a number"),
        ("b < `1`", None),
        ("l", None),
        ("s", None),
        ("i", None),
        ("o", "rows with an object"),
        ("!i", None),
        ("`null` == s", None),
        ("i == `null`", None),
        ("!(s == 'a') && i > `0` || b", None),
        ("s || i", None),
        ("i && s", None),
    ]
    messages = make_messages(len(documents))
    for expression, declines in transformers:
        as_value = check_lanes_agree(Transformer([("out", expression)]), documents, schema, messages)
        as_filter = check_lanes_agree(Transformer([], expression), documents, schema, messages)
        assert bool(as_filter.fallback) == (declines is not None), expression
        assert set(as_value.fallback) <= set(range(len(documents)))


def test_epoch_formats_in_the_fast_lane() -> None:
    schema = pa.schema([("us", pa.int64()), ("ms", pa.float64())])
    documents: list[dict[str, Any]] = [
        {"us": 1626823098123456, "ms": 1626823098519.9},
        {"us": 1626823098120000, "ms": -0.5},
        {"us": -1, "ms": -1.5},
        {"us": 9223372036854775, "ms": float("inf")},
        {"us": -9223372036854775, "ms": 9223372036854.0},
        {"us": 9223372036854776, "ms": 9223372036855.0},
    ]
    transformer = Transformer([("a", "epoch_micros_to_iso8601(us)"), ("b", "epoch_millis_to_iso8601(ms)")])
    result = check_lanes_agree(transformer, documents, schema, make_messages(len(documents)))
    assert result.kept == [0, 1, 2, 4] and result.fallback == [3, 5]
    rows = result.table.to_pylist()
    assert [row["a"] for row in rows] == [
        "2021-07-20T23:18:18.123456Z",
        "2021-07-20T23:18:18.120Z",
        "1969-12-31T23:59:59.999999Z",
        "1677-09-21T00:12:43.145225Z",
    ]
    assert [row["b"] for row in rows] == [
        "2021-07-20T23:18:18.519Z",
        "1970-01-01T00:00:00Z",
        "1969-12-31T23:59:59.999Z",
        "2262-04-11T23:47:16.854Z",
    ]


def test_substr_on_a_non_string_column_is_declined() -> None:
    schema = pa.schema([("n", pa.int64())])
    result = check_lanes_agree(
        Transformer([("s", "substr(n, `0`, `1`)")]), [{"n": 1}, {"n": None}], schema, make_messages(2)
    )
    assert result.fallback == [0, 1]


def test_objects_without_fields_and_unknown_columns() -> None:
    schema = pa.schema([("e", pa.struct([])), ("t", pa.timestamp("us"))])
    documents: list[dict[str, Any]] = [{"e": {}, "t": None}, {"e": None, "t": None}]
    result = check_lanes_agree(Transformer([], "e || t"), documents, schema, make_messages(2))
    assert result.filtered == [0, 1]


def test_a_chunked_table_and_positions_into_a_larger_batch() -> None:
    table = pa.concat_tables([pa.table({"ts": ["2021-01-01T00:00:00Z"]}), pa.table({"ts": ["2022-02-02T00:00:00Z"]})])
    messages = make_messages(5)
    result = Transformer([("date", "substr(ts, `0`, `10`)"), ("offset", "kafka.offset")]).apply_table(
        table, messages, [1, 4], None
    )
    assert result.table.to_pylist() == [
        {"ts": "2021-01-01T00:00:00Z", "date": "2021-01-01", "offset": 101},
        {"ts": "2022-02-02T00:00:00Z", "date": "2022-02-02", "offset": 104},
    ]


def test_throughput_figures() -> None:
    """Prints the figures (pytest -s); no assertion on time."""
    size = 10_000
    documents = [
        {"ts": f"2024-05-{1 + i % 28:02d}T12:34:56Z", "user": {"id": i, "name": f"u{i}"}, "kind": "click"}
        for i in range(size)
    ]
    table = pa.Table.from_pylist(documents)
    messages = make_messages(size)
    positions = list(range(size))
    transformer = Transformer(
        [("date", "substr(ts, `0`, `10`)"), ("offset", "kafka.offset"), ("meta.user_id", "user.id")]
    )
    transformer.apply_table(table, messages, positions, None)
    repeats = 20
    started = time.perf_counter()
    for _ in range(repeats):
        result = transformer.apply_table(table, messages, positions, None)
    fast = repeats * size / (time.perf_counter() - started)
    assert len(result.kept) == size
    started = time.perf_counter()
    for position, document in enumerate(documents):
        transformer.apply_document(dict(document), messages, position, None)
    reference_rate = size / (time.perf_counter() - started)
    print(f"\nfast lane: {fast:,.0f} rows/s; apply_document: {reference_rate:,.0f} documents/s")
