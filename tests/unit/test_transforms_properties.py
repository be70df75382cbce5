"""Property tests: on random documents the fast lane agrees with the reference lane for every row it
keeps or filters, and the reference lane fails only with MessageError."""

from __future__ import annotations

import copy
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafka2delta.errors import MessageError
from kafka2delta.records import PartitionMessages
from kafka2delta.transforms import Transformer
from tests.support.lanes import normalized

PATHS = [
    ("t_copy", "a"),
    ("o.z", "n"),
    ("a", "o.y"),  # overwrites a, or keeps it where o.y is null (maybe a value of another type)
    ("deep.p.q", "s"),
    ("t_offset", "kafka.offset"),
    ("t_key", "kafka.key"),
    ("t_again", "t_copy"),  # reads an earlier result
    ("o", "o.x"),  # an object replaced by one of its fields
]
LOGIC = [
    ("t_or", "a == 'x' || n > `2`"),
    ("t_pick", "o.x || s"),
    ("t_not", "!b"),
    ("t_and", "n && s"),
    ("t_cmp", "f < `0.5`"),
    ("t_eq", "n == `1`"),
    ("t_ne", "s != 'x'"),
    ("t_le", "`2.5` >= n"),
]
FUNCTIONS = [
    ("t_sub", "substr(s, `1`, `3`)"),
    ("t_ms", "epoch_millis_to_iso8601(n)"),
    ("t_s", "epoch_seconds_to_iso8601(f)"),
    ("t_us", "epoch_millis_to_micro(n)"),
    ("s", "t_sub"),  # reads an earlier result
    ("o.iso", "epoch_micros_to_iso8601(o.x)"),
]
FILTER = "!(b == `false`) && (n == `null` || n >= `0` || s != 'zz' || t_pick)"
FAST_TRANSFORMERS = {
    "paths": Transformer(PATHS, "b != `false`"),
    "logic": Transformer(LOGIC, FILTER),
    "paths and logic": Transformer([*PATHS, *LOGIC], FILTER),
    # one function per transformer: a row survives when its one argument is fine
    "substr": Transformer(FUNCTIONS[0:1] + FUNCTIONS[4:5]),
    "millis": Transformer(FUNCTIONS[1:2] + FUNCTIONS[3:4]),
    "seconds": Transformer(FUNCTIONS[2:3]),
    "micros": Transformer(FUNCTIONS[5:6]),
}
TRANSFORMS = [*PATHS, *LOGIC, *FUNCTIONS]

INTERPRETED = Transformer(
    [
        *TRANSFORMS,
        ("t_len", "length(a)"),
        ("t_num", "to_number(s)"),
        ("t_lt", "a < n"),
        ("t_sort", "sort(l)"),
        ("t_join", "join('-', [kafka.topic, to_string(a)])"),
        ("t_floor", "floor(f)"),
        ("t_keys", "keys(o)"),
        ("t_self", "[@]"),
        ("t_iso", "epoch_micros_to_iso8601(o.x)"),
    ],
    "a || n",
)
assert INTERPRETED.uses_interpreter

text = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=8)
# Mostly epochs in range, sometimes anything (out of range, NaN, infinities).
floats = st.floats(min_value=-1e10, max_value=1e10) | st.floats(allow_nan=True, allow_infinity=True)
integers = st.integers(min_value=-(10**13), max_value=10**13) | st.integers(min_value=-(2**63), max_value=2**63 - 1)
SCALARS: dict[str, tuple[pa.DataType, st.SearchStrategy[Any]]] = {
    "str": (pa.string(), text | st.sampled_from(["x", "zz", "", "2021-07-20T23:18:18Z"])),
    "int": (pa.int64(), integers | st.sampled_from([0, 1, 2, 3, -1])),
    "float": (pa.float64(), floats | st.sampled_from([0.0, 0.5, -0.5, 2.5])),
    "bool": (pa.bool_(), st.booleans()),
}
MISSING = object()


def maybe(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A value three times in five, else null or missing."""
    return st.integers(0, 4).flatmap(lambda pick: values if pick < 3 else st.just(None if pick == 3 else MISSING))


NATURAL = {"a": "str", "s": "str", "n": "int", "f": "float", "b": "bool", "o": "struct", "x": "int", "y": "str"}


@st.composite
def field_type(draw: st.DrawFn, name: str, nested: bool) -> tuple[pa.DataType, st.SearchStrategy[Any]]:
    """Mostly the type the expressions expect (so that rows survive every transform), else any."""
    natural = NATURAL.get(name)
    if natural is not None and (natural != "struct" or nested) and draw(st.integers(0, 3)) > 0:
        kind = natural
    else:
        kind = draw(st.sampled_from([*SCALARS, "struct"] if nested else list(SCALARS)))
    if kind != "struct":
        return SCALARS[kind]
    members = {member: draw(field_type(member, nested=False)) for member in ("x", "y")}
    data_type = pa.struct([(name, member[0]) for name, member in members.items()])
    return data_type, fixed_object(members)


def fixed_object(members: dict[str, tuple[pa.DataType, st.SearchStrategy[Any]]]) -> st.SearchStrategy[Any]:
    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for name, (_, values) in members.items():
            value = draw(maybe(values))
            if value is not MISSING:
                found[name] = value
        return found

    return build()


@st.composite
def batches(draw: st.DrawFn) -> tuple[pa.Schema, list[dict[str, Any]], list[Any]]:
    """One schema (each field a type for the whole batch, as Arrow's reader makes it), and rows."""
    fields = {name: draw(field_type(name, nested=True)) for name in ("a", "s", "n", "f", "b", "o", "t_pick")}
    schema = pa.schema([(name, data_type) for name, (data_type, _) in fields.items()])
    documents = []
    for _ in range(draw(st.integers(min_value=1, max_value=12))):
        document: dict[str, Any] = {}
        for name, (_, values) in fields.items():
            value = draw(maybe(values))
            if value is not MISSING:
                document[name] = value
        documents.append(document)
    # Keys are strings (format.key = "string") or JSON values of any type.
    key_values = text if draw(st.booleans()) else st.none() | text | st.integers(0, 5)
    keys = draw(st.lists(st.none() | key_values, min_size=len(documents), max_size=len(documents)))
    return schema, documents, keys


def messages_for(count: int) -> PartitionMessages:
    return PartitionMessages(
        topic="topic",
        partition=1,
        offsets=list(range(40, 40 + count)),
        payloads=[b"{}"] * count,
        timestamps_ms=[1_700_000_000_000 + i for i in range(count)],
    )


def reference(
    transformer: Transformer, document: dict[str, Any], messages: PartitionMessages, row: int, key: Any
) -> Any:
    try:
        return transformer.apply_document(copy.deepcopy(document), messages, row, key)
    except MessageError as error:
        return error


@pytest.mark.parametrize("name", list(FAST_TRANSFORMERS))
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=batches())
def test_the_fast_lane_agrees_with_the_reference(
    name: str, batch: tuple[pa.Schema, list[dict[str, Any]], list[Any]]
) -> None:
    transformer = FAST_TRANSFORMERS[name]
    schema, documents, keys = batch
    assert not transformer.uses_interpreter
    messages = messages_for(len(documents))
    table = pa.Table.from_pylist(documents, schema=schema)
    result = transformer.apply_table(table, messages, list(range(len(documents))), keys)
    assert sorted(result.kept + result.filtered + result.fallback) == list(range(len(documents)))
    for row, fast in zip(result.kept, result.table.to_pylist(), strict=True):
        expected = reference(transformer, documents[row], messages, row, keys[row])
        assert isinstance(expected, dict), f"row {row}: fast lane kept it, reference gave {expected!r}"
        assert normalized(fast) == normalized(expected), f"row {row}"
    for row in result.filtered:
        assert reference(transformer, documents[row], messages, row, keys[row]) is None, f"row {row}"


json_values = st.recursive(
    st.none() | st.booleans() | integers | floats | text,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.sampled_from("axyz"), children, max_size=3),
    max_leaves=8,
)
documents = st.dictionaries(st.sampled_from(["a", "s", "n", "f", "b", "o", "l", "kafka", "t_sub"]), json_values)


@settings(max_examples=300, deadline=None)
@given(documents, st.none() | text | json_values)
def test_the_reference_fails_only_with_message_errors(document: dict[str, Any], key: Any) -> None:
    messages = messages_for(1)
    for transformer in (*FAST_TRANSFORMERS.values(), INTERPRETED):
        result = reference(transformer, document, messages, 0, key)
        assert result is None or isinstance(result, dict | MessageError)
