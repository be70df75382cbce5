"""JMESPath transforms and the filter (stage ``transform``).

``[transforms]`` is an ordered list of ``target = "expression"``; each result is set at ``target``
(a dotted target builds nested objects) in the document, and later expressions see earlier results.
As in kafka-delta-ingest, a null result sets nothing: the target keeps what the document had.

Metadata: an expression that is exactly ``kafka.topic``, ``kafka.partition``, ``kafka.offset``,
``kafka.timestamp`` (epoch milliseconds; null when the broker gave none), ``kafka.timestamp_type``
(-1 none, 0 create, 1 log append), ``kafka.key`` (decoded per ``format.key``) or ``kafka.headers``
(object: header name → UTF-8 string, undecodable bytes replaced, a repeated name: the last wins)
yields that metadata. Inside larger expressions the metadata is a top-level object named ``kafka``
(``join('-', [kafka.topic, to_string(kafka.partition)])``), so a message field named ``kafka`` is
shadowed in expressions (it is still in the document; a target may not be ``kafka`` or ``kafka.*``).
An expression that uses ``@`` or ``kafka`` sees a shallow copy of the document (with ``kafka`` set),
so ``@`` in such an expression also shows the ``kafka`` object.

Custom functions (kafka-delta-ingest's): ``substr(string, start, length)`` (characters),
``epoch_seconds_to_iso8601``, ``epoch_millis_to_iso8601``, ``epoch_micros_to_iso8601`` (UTC, like
chrono's ``DateTime<Utc>`` Debug output: ``2021-07-20T23:18:18Z``, ``2021-07-20T23:18:18.123Z``) and
``epoch_millis_to_micro``.

Two lanes, one contract:

* :meth:`Transformer.apply_table` — the fast lane on an Arrow table: plain field paths, renames,
  metadata, literals, the custom functions, comparisons with a literal, ``!``, ``&&`` and ``||``
  become column operations. Rows where the reference would raise, or where Arrow cannot tell what the
  reference would do (an empty object vs an object of nulls, a type change at a target…), are declined.
* :meth:`Transformer.apply_document` — the reference lane: the JMESPath interpreter on one document.

The fast lane may decline rows (``fallback``) but never disagrees with the reference lane.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import jmespath  # type: ignore[import-untyped]
import pyarrow as pa
import pyarrow.compute as pc
from jmespath import exceptions as jmespath_exceptions
from jmespath import functions as jmespath_functions
from jmespath.visitor import TreeInterpreter  # type: ignore[import-untyped]

from kafka2delta.batches import PartitionMessages
from kafka2delta.errors import ConfigError, MessageError

STAGE = "transform"

FILTER_KEY = "filter.expression"

_KAFKA = "kafka"
_SCALAR_METADATA = ("topic", "partition", "offset", "timestamp", "timestamp_type")
_METADATA = (*_SCALAR_METADATA, "key", "headers")

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
_NANOS_PER_SECOND = 1_000_000_000
# Nanoseconds per unit of each epoch function's argument: chrono formats a DateTime built from i64
# nanoseconds, so the representable range is exactly the epochs whose nanoseconds fit in an i64.
_EPOCH_FUNCTIONS = {
    "epoch_seconds_to_iso8601": 1_000_000_000,
    "epoch_millis_to_iso8601": 1_000_000,
    "epoch_micros_to_iso8601": 1_000,
}
_MILLIS_TO_MICRO = "epoch_millis_to_micro"
# Doubles are exact integers only below 2**53: a larger epoch read as a double may not be the number
# the message holds, so the fast lane leaves those to the reference lane.
_EXACT_DOUBLE = 2**53
_UNIX_EPOCH = datetime(1970, 1, 1)

# Evaluation errors of the interpreter: its own (JMESPathError is a ValueError), TypeError from an
# ordering comparison of a number with a string, ArithmeticError from ceil/floor of infinities.
_EVALUATION_ERRORS = (ValueError, TypeError, ArithmeticError)


# --------------------------------------------------------------------------------------------------
# The custom functions (shared by both lanes' semantics; the reference lane calls them per message)
# --------------------------------------------------------------------------------------------------


class TransformFunctionError(ValueError):
    """A custom function got an argument it cannot handle (the message becomes a dead letter)."""


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _non_negative_integer(function: str, what: str, value: Any) -> int:
    # JSON does not tell 2 from 2.0, so an integral float counts as an integer.
    if type(value) is int and value >= 0:
        return value
    if type(value) is float and value.is_integer() and value >= 0:
        return int(value)
    raise TransformFunctionError(f"{function}() expects a non-negative integer {what}, got {value!r}")


def substr(text: Any, start: Any, length: Any) -> str:
    """``length`` characters of ``text`` from character ``start`` (kafka-delta-ingest's ``substr``)."""
    if type(text) is not str:
        raise TransformFunctionError(f"substr() expects a string, got {_json_type(text)}")
    first = _non_negative_integer("substr", "start", start)
    count = _non_negative_integer("substr", "length", length)
    return text[first : first + count]


def _truncated_epoch(function: str, value: Any, nanos_per_unit: int) -> int:
    """The number truncated to an integer of its unit, checked to fit in i64 nanoseconds."""
    if type(value) is not int and type(value) is not float:
        raise TransformFunctionError(f"{function}() expects a number, got {_json_type(value)}")
    if type(value) is float and not math.isfinite(value):
        raise TransformFunctionError(f"{function}() argument {value!r} is out of range")
    whole = int(value)  # truncates toward zero, like Rust's `as i64`
    if not -(_INT64_MAX // nanos_per_unit) <= whole <= _INT64_MAX // nanos_per_unit:
        raise TransformFunctionError(f"{function}() argument {value!r} is out of range")
    return whole


def format_epoch_nanos(nanos: int) -> str:
    """chrono's Debug format of ``DateTime<Utc>``: the fraction only when non-zero, 3, 6 or 9 digits."""
    seconds, fraction = divmod(nanos, _NANOS_PER_SECOND)
    text = (_UNIX_EPOCH + timedelta(seconds=seconds)).isoformat()
    if fraction == 0:
        return f"{text}Z"
    if fraction % 1_000_000 == 0:
        return f"{text}.{fraction // 1_000_000:03d}Z"
    if fraction % 1_000 == 0:
        return f"{text}.{fraction // 1_000:06d}Z"
    return f"{text}.{fraction:09d}Z"


def epoch_to_iso8601(function: str, value: Any) -> str:
    nanos_per_unit = _EPOCH_FUNCTIONS[function]
    return format_epoch_nanos(_truncated_epoch(function, value, nanos_per_unit) * nanos_per_unit)


def epoch_millis_to_micro(value: Any) -> int:
    return _truncated_epoch(_MILLIS_TO_MICRO, value, 1_000) * 1_000


_ANY: dict[str, list[str]] = {"types": []}  # the functions check their arguments themselves, for readable reasons


class _TransformFunctions(jmespath_functions.Functions):  # type: ignore[misc]
    """JMESPath's built-in functions plus kafka-delta-ingest's."""

    @jmespath_functions.signature(_ANY, _ANY, _ANY)  # type: ignore[untyped-decorator]
    def _func_substr(self, text: Any, start: Any, length: Any) -> str:
        return substr(text, start, length)

    @jmespath_functions.signature(_ANY)  # type: ignore[untyped-decorator]
    def _func_epoch_seconds_to_iso8601(self, value: Any) -> str:
        return epoch_to_iso8601("epoch_seconds_to_iso8601", value)

    @jmespath_functions.signature(_ANY)  # type: ignore[untyped-decorator]
    def _func_epoch_millis_to_iso8601(self, value: Any) -> str:
        return epoch_to_iso8601("epoch_millis_to_iso8601", value)

    @jmespath_functions.signature(_ANY)  # type: ignore[untyped-decorator]
    def _func_epoch_micros_to_iso8601(self, value: Any) -> str:
        return epoch_to_iso8601("epoch_micros_to_iso8601", value)

    @jmespath_functions.signature(_ANY)  # type: ignore[untyped-decorator]
    def _func_epoch_millis_to_micro(self, value: Any) -> int:
        return epoch_millis_to_micro(value)


# --------------------------------------------------------------------------------------------------
# Expression analysis
# --------------------------------------------------------------------------------------------------

Node = dict[str, Any]


def _parse(config_key: str, expression: str) -> Node:
    try:
        parsed: Node = jmespath.compile(expression).parsed
    except jmespath_exceptions.LexerError as exc:
        detail = f"{exc.message} at column {exc.lexer_position}"
    except jmespath_exceptions.IncompleteExpressionError:
        detail = "incomplete expression"
    except jmespath_exceptions.ParseError as exc:
        detail = f"{exc.msg} at column {exc.lex_position}"
    except jmespath_exceptions.EmptyExpressionError:
        detail = "cannot be empty"
    except jmespath_exceptions.JMESPathError as exc:
        detail = str(exc).splitlines()[0]
    else:
        _check_functions(config_key, expression, parsed)
        return parsed
    raise ConfigError(config_key, f"invalid JMESPath expression {expression!r}: {detail}")


def _nodes(node: Node) -> list[Node]:
    """Every node of the tree (slice nodes hold ints and None as children: skip those)."""
    found = [node]
    for child in node.get("children", ()):
        if isinstance(child, dict):
            found.extend(_nodes(child))
    return found


def _check_functions(config_key: str, expression: str, parsed: Node) -> None:
    """Unknown functions and wrong argument counts would fail every message: refuse them at start."""
    table: dict[str, Any] = _TransformFunctions.FUNCTION_TABLE
    for node in _nodes(parsed):
        if node["type"] != "function_expression":
            continue
        name, count = node["value"], len(node["children"])
        spec = table.get(name)
        if spec is None:
            raise ConfigError(config_key, f"unknown function {name}() in {expression!r}")
        signature = spec["signature"]
        variadic = bool(signature) and bool(signature[-1].get("variadic"))
        if (variadic and count < len(signature)) or (not variadic and count != len(signature)):
            expected = f"at least {len(signature)}" if variadic else str(len(signature))
            raise ConfigError(config_key, f"{name}() takes {expected} argument(s), got {count} in {expression!r}")


def _path_parts(node: Node) -> tuple[str, ...] | None:
    """The field names of a plain path (``a``, ``a.b``, ``"x y".c``, ``@.a``), or None."""
    kind = node["type"]
    if kind == "field":
        return (node["value"],)
    if kind == "current":
        return ()
    if kind == "subexpression":
        parts: tuple[str, ...] = ()
        for child in node["children"]:
            child_parts = _path_parts(child)
            if child_parts is None:
                return None
            parts += child_parts
        return parts
    return None


def _uses_field(parsed: Node, name: str) -> bool:
    return any(node["type"] == "field" and node["value"] == name for node in _nodes(parsed))


def _uses_current(parsed: Node) -> bool:
    return any(node["type"] == "current" for node in _nodes(parsed))


# --------------------------------------------------------------------------------------------------
# The reference lane
# --------------------------------------------------------------------------------------------------


class _MessageContext:
    """One message's metadata, computed only as far as an expression asks for it."""

    __slots__ = ("_object", "key", "messages", "position")

    def __init__(self, messages: PartitionMessages, position: int, key: Any) -> None:
        self.messages = messages
        self.position = position
        self.key = key
        self._object: dict[str, Any] | None = None

    def value(self, name: str) -> Any:
        messages, position = self.messages, self.position
        if name == "offset":
            return messages.offsets[position]
        if name == "partition":
            return messages.partition
        if name == "topic":
            return messages.topic
        if name == "timestamp":
            return None if messages.timestamp_type(position) == -1 else messages.timestamps_ms[position]
        if name == "timestamp_type":
            return messages.timestamp_type(position)
        if name == "key":
            return self.key
        if name == "headers":
            return _headers_object(messages, position)
        return None

    def object(self) -> dict[str, Any]:
        """The ``kafka`` object seen by expressions (built once per message)."""
        if self._object is None:
            self._object = {name: self.value(name) for name in _METADATA}
        return self._object


def _headers_object(messages: PartitionMessages, position: int) -> dict[str, str | None]:
    return {
        name: None if value is None else value.decode("utf-8", errors="replace")
        for name, value in messages.header_list(position)
    }


def _walk(value: Any, parts: Sequence[str]) -> Any:
    """JMESPath field access: a missing field, or a non-object in the way, is null."""
    for part in parts:
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _set_path(document: dict[str, Any], parts: tuple[str, ...], value: Any) -> None:
    """Set ``value`` at ``parts`` (nothing when it is null); objects on the way are copied, not
    mutated, because an earlier transform may have put the same object at two places (``b = a``)."""
    if value is None:
        return
    current = document
    for part in parts[:-1]:
        child = current.get(part)
        child = dict(child) if isinstance(child, dict) else {}
        current[part] = child
        current = child
    current[parts[-1]] = value


def _is_truthy(value: Any) -> bool:
    """JMESPath truthiness: false, null, "", [] and {} are false; 0 is true."""
    return not (value is None or value is False or value == "" or value == [] or value == {})


Evaluate = Callable[[dict[str, Any], _MessageContext], Any]


_CUSTOM_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "substr": substr,
    "epoch_seconds_to_iso8601": lambda value: epoch_to_iso8601("epoch_seconds_to_iso8601", value),
    "epoch_millis_to_iso8601": lambda value: epoch_to_iso8601("epoch_millis_to_iso8601", value),
    "epoch_micros_to_iso8601": lambda value: epoch_to_iso8601("epoch_micros_to_iso8601", value),
    _MILLIS_TO_MICRO: epoch_millis_to_micro,
}


def _direct_evaluator(node: Node) -> Evaluate | None:
    """Plain paths, metadata, literals and the custom functions over those, without the interpreter
    (the same values: the interpreter would only add dispatch, and these functions check their own
    arguments). None for anything else."""
    parts = _path_parts(node)
    if parts:
        if parts[0] == _KAFKA:
            if len(parts) == 1:
                return lambda document, context: context.object()
            name, rest = parts[1], parts[2:]
            if not rest:
                return lambda document, context: context.value(name)
            return lambda document, context: _walk(context.value(name), rest)
        if len(parts) == 1:
            field = parts[0]
            return lambda document, context: document.get(field)
        return lambda document, context: _walk(document, parts)
    if node["type"] == "literal":
        literal = node["value"]
        return lambda document, context: literal
    if node["type"] == "function_expression" and node["value"] in _CUSTOM_FUNCTIONS:
        function = _CUSTOM_FUNCTIONS[node["value"]]
        arguments = [_direct_evaluator(child) for child in node["children"]]
        if any(argument is None for argument in arguments):
            return None
        direct = [argument for argument in arguments if argument is not None]
        if len(direct) == 1:
            (only,) = direct
            return lambda document, context: function(only(document, context))
        if len(direct) == 3:
            first, second, third = direct
            return lambda document, context: function(
                first(document, context), second(document, context), third(document, context)
            )
    return None


def _reference_evaluator(parsed: Node, interpreter: Any) -> Evaluate:
    """The cheapest exact evaluation of one expression on one document."""
    evaluate = _direct_evaluator(parsed) or _interpreted_evaluator(parsed, interpreter)
    if any(node["type"] == "literal" and isinstance(node["value"], dict | list) for node in _nodes(parsed)):
        # The interpreter hands out the literal object itself: without a copy, every document would
        # share (and a later stage could change) one object.
        shared = evaluate
        return lambda document, context: copy.deepcopy(shared(document, context))
    return evaluate


def _interpreted_evaluator(parsed: Node, interpreter: Any) -> Evaluate:
    visit = interpreter.visit
    if _uses_field(parsed, _KAFKA):
        return lambda document, context: visit(parsed, {**document, _KAFKA: context.object()})
    if _uses_current(parsed):
        # The result may hold the document itself (``[@]``): evaluate on a copy so that setting the
        # result into the document never makes it contain itself.
        return lambda document, context: visit(parsed, dict(document))
    return lambda document, context: visit(parsed, document)


# --------------------------------------------------------------------------------------------------
# Fast-lane plans
# --------------------------------------------------------------------------------------------------

Scalar = str | int | float | bool | None


@dataclass(frozen=True)
class _PathPlan:
    parts: tuple[str, ...]


@dataclass(frozen=True)
class _MetaPlan:
    parts: tuple[str, ...]
    """Inside the ``kafka`` object: ("offset",), ("headers",), ("headers", name), ("key", *path)."""


@dataclass(frozen=True)
class _LiteralPlan:
    value: Scalar


@dataclass(frozen=True)
class _SubstrPlan:
    operand: Plan
    start: int
    length: int


@dataclass(frozen=True)
class _EpochPlan:
    function: str
    operand: Plan


@dataclass(frozen=True)
class _ComparePlan:
    op: str
    """eq, ne, lt, lte, gt, gte with ``operand`` on the left and ``literal`` on the right."""
    operand: Plan
    literal: Scalar


@dataclass(frozen=True)
class _NotPlan:
    operand: Plan


@dataclass(frozen=True)
class _LogicPlan:
    op: str
    """and_expression or or_expression."""
    left: Plan
    right: Plan


Plan = _PathPlan | _MetaPlan | _LiteralPlan | _SubstrPlan | _EpochPlan | _ComparePlan | _NotPlan | _LogicPlan

_FLIPPED = {"eq": "eq", "ne": "ne", "lt": "gt", "lte": "gte", "gt": "lt", "gte": "lte"}


class _NotCompilable(Exception):
    """The expression needs the interpreter."""


def _is_scalar_literal(node: Node) -> bool:
    if node["type"] != "literal":
        return False
    value = node["value"]
    if value is None or isinstance(value, str | bool | float):
        return True
    return isinstance(value, int) and _INT64_MIN <= value <= _INT64_MAX


def _literal_integer(node: Node) -> int:
    """A substr start/length that the fast lane can use as a constant."""
    if node["type"] != "literal":
        raise _NotCompilable("substr() with a computed start or length")
    try:
        return _non_negative_integer("substr", "argument", node["value"])
    except TransformFunctionError as exc:
        raise _NotCompilable(str(exc)) from exc


def _compile(node: Node) -> Plan:
    """A column plan for the expression, or _NotCompilable."""
    parts = _path_parts(node)
    if parts is not None:
        if not parts:
            raise _NotCompilable("the whole document (@)")
        if parts[0] == _KAFKA:
            return _compile_metadata(parts[1:])
        return _PathPlan(parts)
    kind = node["type"]
    children: list[Node] = node["children"]
    if kind == "literal":
        if not _is_scalar_literal(node):
            raise _NotCompilable("a literal array, object or huge integer")
        return _LiteralPlan(node["value"])
    if kind == "function_expression":
        name = node["value"]
        if name == "substr" and len(children) == 3:
            return _SubstrPlan(_compile(children[0]), _literal_integer(children[1]), _literal_integer(children[2]))
        if (name in _EPOCH_FUNCTIONS or name == _MILLIS_TO_MICRO) and len(children) == 1:
            return _EpochPlan(name, _compile(children[0]))
        raise _NotCompilable(f"function {name}()")
    if kind == "comparator":
        left, right = children
        if _is_scalar_literal(right) and not _is_scalar_literal(left):
            return _ComparePlan(node["value"], _compile(left), right["value"])
        if _is_scalar_literal(left) and not _is_scalar_literal(right):
            return _ComparePlan(_FLIPPED[node["value"]], _compile(right), left["value"])
        raise _NotCompilable("a comparison that is not between an expression and a literal")
    if kind == "not_expression":
        return _NotPlan(_compile(children[0]))
    if kind in ("and_expression", "or_expression"):
        return _LogicPlan(kind, _compile(children[0]), _compile(children[1]))
    raise _NotCompilable(kind)


def _compile_metadata(rest: tuple[str, ...]) -> Plan:
    if not rest:
        raise _NotCompilable("the whole kafka object")
    name = rest[0]
    if name not in _METADATA:
        return _LiteralPlan(None)
    if name in _SCALAR_METADATA and len(rest) > 1:
        return _LiteralPlan(None)  # a field of a number or string is null
    if name == "headers" and len(rest) > 2:
        return _LiteralPlan(None)  # header values are strings
    return _MetaPlan(rest)


def _plan_reads(plan: Plan, wanted: pa.DataType | None) -> list[tuple[tuple[str, ...], pa.DataType | None]]:
    """The document paths a plan reads, with the type its reader would want for each."""
    if isinstance(plan, _PathPlan):
        return [(plan.parts, wanted)]
    if isinstance(plan, _SubstrPlan):
        return _plan_reads(plan.operand, pa.string())
    if isinstance(plan, _EpochPlan):
        return _plan_reads(plan.operand, pa.float64())
    if isinstance(plan, _ComparePlan | _NotPlan):
        return _plan_reads(plan.operand, None)
    if isinstance(plan, _LogicPlan):
        return _plan_reads(plan.left, None) + _plan_reads(plan.right, None)
    return []


def _read_type(data_type: pa.DataType) -> pa.DataType:
    """How the JSON reader should read a value bound for a column of ``data_type``: temporal, decimal
    and binary values arrive as strings in JSON and are converted by the coercion stage."""
    if pa.types.is_temporal(data_type) or pa.types.is_decimal(data_type) or _is_binary(data_type):
        return pa.string()
    if pa.types.is_struct(data_type):
        return pa.struct([field.with_type(_read_type(field.type)) for field in data_type])
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        return pa.list_(data_type.value_field.with_type(_read_type(data_type.value_type)))
    return data_type


def _is_binary(data_type: pa.DataType) -> bool:
    return bool(
        pa.types.is_binary(data_type) or pa.types.is_large_binary(data_type) or pa.types.is_fixed_size_binary(data_type)
    )


def _schema_type(schema: pa.Schema, parts: tuple[str, ...]) -> pa.DataType | None:
    """The type of the table column (or nested struct field) at ``parts``, if there is one."""
    index = schema.get_field_index(parts[0])
    if index < 0:
        return None
    data_type = schema.field(index).type
    for part in parts[1:]:
        if not pa.types.is_struct(data_type) or data_type.get_field_index(part) < 0:
            return None
        data_type = data_type.field(data_type.get_field_index(part)).type
    return data_type


# --------------------------------------------------------------------------------------------------
# Fast-lane evaluation
# --------------------------------------------------------------------------------------------------

Mask = Any  # a pa.BooleanArray without nulls; None where a mask is optional means "no row"
Column = tuple[Any, Any]  # (pa.Array, declined Mask | None)


def _kind(data_type: pa.DataType) -> str:
    """The JSON type a column holds, as far as the fast lane can be sure of it."""
    if pa.types.is_null(data_type):
        return "null"
    if pa.types.is_boolean(data_type):
        return "bool"
    if pa.types.is_string(data_type) or pa.types.is_large_string(data_type):
        return "string"
    if pa.types.is_integer(data_type):
        return "int"
    if data_type == pa.float64():
        return "float"
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        return "list"
    if pa.types.is_struct(data_type):
        return "struct"
    if (
        pa.types.is_temporal(data_type)
        or pa.types.is_decimal(data_type)
        or pa.types.is_floating(data_type)
        or _is_binary(data_type)
    ):
        return "scalar"  # some string or number in the document, which one exactly the lane cannot know
    return "unknown"  # maps, unions, dictionaries…: could be objects


def _union(first: Mask | None, second: Mask | None) -> Mask | None:
    if first is None:
        return second
    if second is None:
        return first
    return pc.or_(first, second)


def _and_mask(condition: Mask, declined: Mask | None) -> Mask | None:
    return None if declined is None else pc.and_(condition, declined)


def _choose(condition: Mask, when_true: Any, when_false: Any) -> Column:
    """``when_true`` where ``condition`` else ``when_false``. One column has one type: where the rows
    would need a non-null value of another type, they are declined rather than converted."""
    if when_true.type == when_false.type:
        return pc.if_else(condition, when_true, when_false), None
    size = len(condition)
    if pa.types.is_null(when_true.type):
        return pc.if_else(condition, pa.nulls(size, when_false.type), when_false), None
    if pa.types.is_null(when_false.type):
        return pc.if_else(condition, when_true, pa.nulls(size, when_true.type)), None
    declined = pc.and_(pc.invert(condition), when_false.is_valid())
    return pc.if_else(condition, when_true, pa.nulls(size, when_true.type)), declined


def _as_int64(column: Any) -> Column:
    """Integers as int64; uint64 values beyond int64 are declined (they never come from JSON)."""
    if column.type == pa.uint64():
        fits = pc.fill_null(pc.less_equal(column, _INT64_MAX), True)
        return pc.if_else(fits, column, 0).cast(pa.int64()), pc.invert(fits)
    return column.cast(pa.int64()), None


def _python_column(values: list[Any]) -> Column:
    """A column of Python scalars (keys, header values); rows of a second type or non-scalars are
    declined (one column has one type)."""
    clean: list[Any] = []
    declined_rows: list[bool] = []
    chosen: type[str | bool | int | float] | None = None
    any_declined = False
    for value in values:
        value_type = type(value)
        if value is None:
            ok = True
        elif value_type not in (str, bool, int, float) or (value_type is int and not _INT64_MIN <= value <= _INT64_MAX):
            ok = False
        elif chosen is None or value_type is chosen:
            chosen = value_type
            ok = True
        else:
            ok = False
        clean.append(value if ok else None)
        declined_rows.append(not ok)
        any_declined = any_declined or not ok
    arrow_type = {None: pa.null(), str: pa.string(), bool: pa.bool_(), int: pa.int64(), float: pa.float64()}[chosen]
    declined = pa.array(declined_rows, pa.bool_()) if any_declined else None
    return pa.array(clean, arrow_type), declined


class _FastBatch:
    """The documents of one table as columns, updated transform by transform."""

    def __init__(
        self, table: pa.Table, messages: PartitionMessages, positions: Sequence[int], keys: Sequence[Any] | None
    ) -> None:
        self.size: int = table.num_rows
        self.columns: dict[str, Any] = {
            name: table.column(index).combine_chunks() for index, name in enumerate(table.column_names)
        }
        self.messages = messages
        self.positions = positions
        self.keys = keys
        self.declined: Mask | None = None
        self._metadata: dict[tuple[str, ...], Column] = {}
        self._position_array: Any = None

    def position_array(self) -> Any:
        if self._position_array is None:
            self._position_array = pa.array(self.positions, pa.int64())
        return self._position_array

    def decline(self, mask: Mask | None) -> None:
        self.declined = _union(self.declined, mask)

    def nulls(self) -> Column:
        return pa.nulls(self.size), None

    def constant(self, value: bool) -> Mask:
        return pa.repeat(pa.scalar(value, pa.bool_()), self.size)

    # -- values ------------------------------------------------------------------------------------

    def evaluate(self, plan: Plan) -> Column:
        if isinstance(plan, _PathPlan):
            return self.path(plan.parts)
        if isinstance(plan, _MetaPlan):
            if plan.parts not in self._metadata:
                self._metadata[plan.parts] = self.metadata(plan.parts)
            return self._metadata[plan.parts]
        if isinstance(plan, _LiteralPlan):
            if plan.value is None:
                return self.nulls()
            return pa.repeat(pa.scalar(plan.value), self.size), None
        if isinstance(plan, _SubstrPlan):
            return self.substr(plan)
        if isinstance(plan, _EpochPlan):
            return self.epoch(plan)
        if isinstance(plan, _ComparePlan):
            column, declined = self.evaluate(plan.operand)
            result, compare_declined = self.compare(column, plan.op, plan.literal)
            return result, _union(declined, compare_declined)
        if isinstance(plan, _NotPlan):
            truth, declined = self.truthy(plan.operand)
            return pc.invert(truth), declined
        return self.logic(plan)

    def path(self, parts: tuple[str, ...]) -> Column:
        column = self.columns.get(parts[0])
        if column is None:
            return self.nulls()
        for part in parts[1:]:
            data_type = column.type
            kind = _kind(data_type)
            if kind == "struct":
                indices = data_type.get_all_field_indices(part)
                if not indices:
                    return self.nulls()
                if len(indices) > 1:
                    return pa.nulls(self.size), column.is_valid()
                column = pc.struct_field(column, [indices[0]])  # null where the parent is null
            elif kind == "unknown":
                return pa.nulls(self.size), column.is_valid()
            else:
                return self.nulls()  # a field of a string, number, array… is null
        return column, None

    def metadata(self, parts: tuple[str, ...]) -> Column:
        messages, positions, name = self.messages, self.positions, parts[0]
        if name == "offset":
            return pa.array(messages.offsets, pa.int64()).take(self.position_array()), None
        if name == "partition":
            return pa.repeat(pa.scalar(messages.partition, pa.int64()), self.size), None
        if name == "topic":
            return pa.repeat(pa.scalar(messages.topic, pa.string()), self.size), None
        if name == "timestamp_type":
            return pa.array([messages.timestamp_type(position) for position in positions], pa.int64()), None
        if name == "timestamp":
            timestamps = messages.timestamps_ms
            values = [
                None if messages.timestamp_type(position) == -1 else timestamps[position] for position in positions
            ]
            return pa.array(values, pa.int64()), None
        if name == "key":
            keys = self.keys
            if keys is None:
                return self.nulls()
            return _python_column([_walk(keys[position], parts[1:]) for position in positions])
        # headers
        headers = [_headers_object(messages, position) for position in positions]
        if len(parts) == 2:
            return pa.array([found.get(parts[1]) for found in headers], pa.string()), None
        names = list(dict.fromkeys(name for found in headers for name in found))
        return pa.array(headers, pa.struct([(name, pa.string()) for name in names])), None

    def substr(self, plan: _SubstrPlan) -> Column:
        column, declined = self.evaluate(plan.operand)
        if _kind(column.type) != "string":
            # substr() raises for every value that is not a string, null included
            return pa.nulls(self.size, pa.string()), self.constant(True)
        if column.type != pa.string():
            column = column.cast(pa.string())
        result = pc.utf8_slice_codeunits(column, plan.start, plan.start + plan.length)  # code points
        return result, _union(declined, column.is_null())

    def epoch(self, plan: _EpochPlan) -> Column:
        column, declined = self.evaluate(plan.operand)
        nanos_per_unit = 1_000 if plan.function == _MILLIS_TO_MICRO else _EPOCH_FUNCTIONS[plan.function]
        bound = _INT64_MAX // nanos_per_unit
        kind = _kind(column.type)
        if kind == "int":
            integers, too_big = _as_int64(column)
            ok = pc.fill_null(pc.and_(pc.greater_equal(integers, -bound), pc.less_equal(integers, bound)), False)
            if too_big is not None:
                ok = pc.and_(ok, pc.invert(too_big))
        elif kind == "float":
            truncated = pc.trunc(column)
            # Both limits as one double that is exactly an integer (Arrow refuses an int64 scalar a
            # double cannot hold).
            limit = float(min(bound, _EXACT_DOUBLE - 1))
            ok = pc.fill_null(pc.and_(pc.is_finite(column), pc.less_equal(pc.abs(truncated), limit)), False)
            integers = pc.if_else(ok, truncated, 0.0).cast(pa.int64())
        else:
            result_type = pa.int64() if plan.function == _MILLIS_TO_MICRO else pa.string()
            return pa.nulls(self.size, result_type), self.constant(True)
        integers = pc.if_else(ok, integers, 0)  # rows out of range must not overflow below
        declined = _union(declined, pc.invert(ok))
        if plan.function == _MILLIS_TO_MICRO:
            return pc.if_else(ok, pc.multiply(integers, 1_000), None), declined
        nanos = pc.multiply(integers, nanos_per_unit).cast(pa.timestamp("ns"))
        return pc.if_else(ok, _format_timestamps(nanos), None), declined

    def logic(self, plan: _LogicPlan) -> Column:
        left, left_declined = self.evaluate(plan.left)
        left_true, truth_declined = self.truthy_value(left)
        right, right_declined = self.evaluate(plan.right)
        if plan.op == "and_expression":
            # `a && b` is a when a is falsy, else b (operands, not booleans); b runs only when a is truthy
            result, choose_declined = _choose(left_true, right, left)
            right_runs = left_true
        else:
            result, choose_declined = _choose(left_true, left, right)
            right_runs = pc.invert(left_true)
        declined = _union(
            _union(left_declined, truth_declined), _union(choose_declined, _and_mask(right_runs, right_declined))
        )
        return result, declined

    # -- truth -------------------------------------------------------------------------------------

    def truthy(self, plan: Plan) -> Column:
        """(JMESPath truthiness of the plan's value as a null-free mask, declined rows)."""
        if isinstance(plan, _ComparePlan):
            result, declined = self.evaluate(plan)
            return pc.fill_null(result, False), declined
        if isinstance(plan, _NotPlan):
            truth, declined = self.truthy(plan.operand)
            return pc.invert(truth), declined
        if isinstance(plan, _LogicPlan):
            left, left_declined = self.truthy(plan.left)
            right, right_declined = self.truthy(plan.right)
            if plan.op == "and_expression":
                return pc.and_(left, right), _union(left_declined, _and_mask(left, right_declined))
            return pc.or_(left, right), _union(left_declined, _and_mask(pc.invert(left), right_declined))
        column, declined = self.evaluate(plan)
        truth, truth_declined = self.truthy_value(column)
        return truth, _union(declined, truth_declined)

    def truthy_value(self, column: Any) -> Column:
        kind = _kind(column.type)
        if kind == "null":
            return self.constant(False), None
        if kind == "bool":
            return pc.fill_null(column, False), None
        if kind == "string":
            return pc.fill_null(pc.greater(pc.binary_length(column), 0), False), None
        if kind in ("int", "float"):
            return column.is_valid(), None  # 0 is true in JMESPath
        if kind == "list":
            return pc.fill_null(pc.greater(pc.list_value_length(column), 0), False), None
        if kind == "struct" and column.type.num_fields == 0:
            return self.constant(False), None  # every object is {}
        # A struct row cannot tell {} (false) from {"x": null} (true); other kinds are not known.
        return column.is_valid(), column.is_valid()

    # -- comparisons -------------------------------------------------------------------------------

    def compare(self, column: Any, op: str, literal: Scalar) -> Column:
        if op == "eq":
            return self.equals(column, literal)
        if op == "ne":
            equal, declined = self.equals(column, literal)
            return pc.invert(equal), declined
        return self.order(column, op, literal)

    def equals(self, column: Any, literal: Scalar) -> Column:
        """JMESPath ``==`` with a literal: Python equality, except that 0/1 never equal booleans and
        values of different JSON types are never equal (null only equals null)."""
        if literal is None:
            return column.is_null(), None
        kind = _kind(column.type)
        false = self.constant(False)
        if kind in ("scalar", "unknown"):
            return false, column.is_valid()
        if isinstance(literal, bool):
            if kind != "bool":
                return false, None
            return pc.fill_null(pc.equal(column, literal), False), None
        if isinstance(literal, str):
            if kind != "string":
                return false, None
            return pc.fill_null(pc.equal(column, literal), False), None
        if kind == "int":
            integers, declined = _as_int64(column)
            if isinstance(literal, float) and not literal.is_integer():
                return false, None  # covers nan and inf too: never equal to an integer
            target = int(literal)
            if not _INT64_MIN <= target <= _INT64_MAX:
                return false, None
            return pc.fill_null(pc.equal(integers, target), False), declined
        if kind == "float":
            assert isinstance(literal, int | float)
            if isinstance(literal, int) and abs(literal) > _EXACT_DOUBLE:
                return false, column.is_valid()  # the double cannot represent it: let Python decide
            return pc.fill_null(pc.equal(column, float(literal)), False), None
        return false, None

    def order(self, column: Any, op: str, literal: Scalar) -> Column:
        """``<``, ``<=``, ``>``, ``>=``: null unless both sides are numbers or both strings; a number
        against a string raises in the reference (Python's TypeError), so those rows are declined."""
        nulls = pa.nulls(self.size, pa.bool_())
        kind = _kind(column.type)
        literal_is_number = isinstance(literal, int | float) and not isinstance(literal, bool)
        if not (literal_is_number or isinstance(literal, str)) or kind in ("null", "bool", "list", "struct"):
            return nulls, None
        if kind in ("scalar", "unknown"):
            return nulls, column.is_valid()
        function = {"lt": pc.less, "lte": pc.less_equal, "gt": pc.greater, "gte": pc.greater_equal}[op]
        if kind == "string":
            if not isinstance(literal, str):
                return nulls, column.is_valid()
            return function(column, literal), None  # UTF-8 byte order is code point order, like Python
        if not isinstance(literal, int | float):
            return nulls, column.is_valid()  # a string literal against a number column
        if kind == "float":
            if isinstance(literal, int) and abs(literal) > _EXACT_DOUBLE:
                return nulls, column.is_valid()
            return function(column, float(literal)), None
        integers, declined = _as_int64(column)
        if isinstance(literal, int):
            if not _INT64_MIN <= literal <= _INT64_MAX:
                return nulls, _union(declined, column.is_valid())
            return function(integers, literal), declined
        if not math.isfinite(literal) or abs(literal) >= 2**62:
            return nulls, column.is_valid()
        if literal.is_integer():
            return function(integers, int(literal)), declined
        # An integer x is < 2.5 exactly when x <= 2, and > 2.5 exactly when x > 2: compare exactly in
        # integers rather than through a double that cannot hold every int64.
        floor = math.floor(literal)
        if op in ("lt", "lte"):
            return pc.less_equal(integers, floor), declined
        return pc.greater(integers, floor), declined

    # -- targets -----------------------------------------------------------------------------------

    def assign(self, parts: tuple[str, ...], value: Any) -> None:
        """Set ``value`` at the dotted target; where it is null the document keeps what it had."""
        if value.null_count == len(value):
            return  # the reference sets nothing at all, not even the objects on the way
        present = value.is_valid()
        column, declined = self._assign(self.columns.get(parts[0]), parts[1:], value, present)
        self.columns[parts[0]] = column
        self.decline(declined)

    def _assign(self, old: Any | None, parts: tuple[str, ...], value: Any, present: Mask) -> Column:
        if not parts:
            if old is None:
                return value, None
            return _choose(present, value, old)
        name, rest = parts[0], parts[1:]
        if old is not None and pa.types.is_struct(old.type):
            fields = list(old.type)
            indices = old.type.get_all_field_indices(name)
            if len(indices) > 1:
                return old, self.constant(True)
            children = old.flatten()  # children with the parent's nulls
            index = indices[0] if indices else len(fields)
            child, declined = self._assign(children[index] if indices else None, rest, value, present)
            if indices:
                children[index] = child
                fields[index] = fields[index].with_type(child.type)
            else:
                children.append(child)
                fields.append(pa.field(name, child.type))
            valid = pc.or_(old.is_valid(), present)
            return pa.StructArray.from_arrays(children, fields=fields, mask=pc.invert(valid)), declined
        # No object here: where the value is set, {name: …} replaces whatever was in the way.
        child, declined = self._assign(None, rest, value, present)
        created = pa.StructArray.from_arrays([child], names=[name], mask=pc.invert(present))
        if old is not None and not pa.types.is_null(old.type):
            # rows keeping a non-object here cannot share the column with the new objects
            declined = _union(declined, pc.and_(pc.invert(present), old.is_valid()))
        return created, declined


def _format_timestamps(nanos: Any) -> Any:
    """chrono's ``DateTime<Utc>`` Debug format for a timestamp[ns] column."""
    # strftime's %S on nanoseconds prints SS.fffffffff; keep 0, 3, 6 or 9 digits of the fraction.
    full = pc.strftime(nanos, format="%Y-%m-%dT%H:%M:%S")
    fraction = pc.utf8_slice_codeunits(full, 20, 29)
    whole = pc.equal(fraction, "000000000")
    millis = pc.ends_with(fraction, pattern="000000")
    micros = pc.ends_with(fraction, pattern="000")
    trimmed = pc.if_else(
        whole,
        pc.utf8_slice_codeunits(full, 0, 19),
        pc.if_else(
            millis,
            pc.utf8_slice_codeunits(full, 0, 23),
            pc.if_else(micros, pc.utf8_slice_codeunits(full, 0, 26), full),
        ),
    )
    return pc.binary_join_element_wise(trimmed, "Z", "")


# --------------------------------------------------------------------------------------------------
# The transformer
# --------------------------------------------------------------------------------------------------


@dataclass
class TransformedTable:
    table: pa.Table
    """The documents after every transform, for the rows kept (not filtered, not declined)."""
    kept: list[int]
    """For each row of ``table``, its row position in the input table (ascending)."""
    filtered: list[int]
    """Input row positions the filter dropped."""
    fallback: list[int]
    """Input row positions the fast lane declined; the caller runs them through apply_document."""


@dataclass(frozen=True)
class _Transform:
    target: tuple[str, ...]
    config_key: str
    evaluate: Evaluate
    plan: Plan | None


def _target_parts(target: str) -> tuple[str, ...]:
    config_key = f"transforms.{target}"
    parts = tuple(target.split("."))
    if not target or any(not part for part in parts):
        raise ConfigError(config_key, f"invalid target {target!r}: expected dot-separated field names")
    if parts[0] == _KAFKA:
        raise ConfigError(config_key, "targets under 'kafka' are reserved for the Kafka metadata")
    return parts


class Transformer:
    def __init__(self, transforms: Sequence[tuple[str, str]], filter_expression: str = "") -> None:
        """Compile everything; a bad expression raises ConfigError naming ``transforms.<target>`` or
        ``filter.expression``."""
        self._interpreter = TreeInterpreter(jmespath.Options(custom_functions=_TransformFunctions()))
        self._transforms: list[_Transform] = []
        interpreted: list[str] = []
        for target, expression in transforms:
            config_key = f"transforms.{target}"
            parts = _target_parts(target)
            parsed = _parse(config_key, expression)
            plan = self._try_compile(parsed, config_key, interpreted)
            self._transforms.append(
                _Transform(parts, config_key, _reference_evaluator(parsed, self._interpreter), plan)
            )
        self._filter: _Transform | None = None
        if filter_expression.strip():
            parsed = _parse(FILTER_KEY, filter_expression)
            plan = self._try_compile(parsed, FILTER_KEY, interpreted)
            self._filter = _Transform((), FILTER_KEY, _reference_evaluator(parsed, self._interpreter), plan)
        self.interpreted: tuple[str, ...] = tuple(interpreted)
        """Config keys of the expressions the fast lane cannot run, with why (for a log line)."""

    @staticmethod
    def _try_compile(parsed: Node, config_key: str, interpreted: list[str]) -> Plan | None:
        try:
            return _compile(parsed)
        except _NotCompilable as exc:
            interpreted.append(f"{config_key} ({exc})")
            return None

    @property
    def active(self) -> bool:
        """False when there are no transforms and no filter (the pipeline skips the stage)."""
        return bool(self._transforms) or self._filter is not None

    @property
    def uses_interpreter(self) -> bool:
        """True when some transform or the filter cannot run in the fast lane (whole batches then go
        through apply_document)."""
        return bool(self.interpreted)

    def source_fields(self, table_schema: pa.Schema) -> list[tuple[str, pa.DataType | None]]:
        """Dotted document paths the fast lane reads, with the Arrow type it wants each read as
        (None: no preference). The JSON deserializer adds them to its read schema."""
        if self.uses_interpreter:
            return []
        wanted: dict[tuple[str, ...], pa.DataType | None] = {}
        targets: list[tuple[str, ...]] = []
        steps = [*self._transforms, *([self._filter] if self._filter is not None else [])]
        for step in steps:
            assert step.plan is not None
            plain_type = None
            if isinstance(step.plan, _PathPlan) and step.target:
                column_type = _schema_type(table_schema, step.target)
                plain_type = None if column_type is None else _read_type(column_type)
            for parts, data_type in _plan_reads(step.plan, plain_type):
                if any(parts[: len(target)] == target for target in targets):
                    continue  # written by an earlier transform
                if any("." in part for part in parts):
                    continue  # cannot be spelled as a dotted path
                if parts in wanted and wanted[parts] != data_type:
                    wanted[parts] = None  # two readers disagree: no preference
                else:
                    wanted.setdefault(parts, data_type)
            if step.target:
                targets.append(step.target)
        return [(".".join(parts), data_type) for parts, data_type in wanted.items()]

    def apply_table(
        self, table: pa.Table, messages: PartitionMessages, positions: Sequence[int], keys: Sequence[Any] | None
    ) -> TransformedTable:
        """``table`` row i is the document of message ``positions[i]`` of ``messages``; ``keys`` are the
        decoded keys aligned with ``messages`` (None when keys are not decoded)."""
        size = table.num_rows
        if len(positions) != size:
            raise ValueError(f"{len(positions)} positions for a table of {size} rows")
        if self.uses_interpreter or len(set(table.column_names)) != len(table.column_names):
            return TransformedTable(table.slice(0, 0), [], [], list(range(size)))
        batch = _FastBatch(table, messages, positions, keys)
        for step in self._transforms:
            assert step.plan is not None
            value, declined = batch.evaluate(step.plan)
            batch.decline(declined)
            batch.assign(step.target, value)
        keep = None
        if self._filter is not None:
            assert self._filter.plan is not None
            keep, declined = batch.truthy(self._filter.plan)
            batch.decline(declined)
        result = pa.Table.from_arrays(list(batch.columns.values()), names=list(batch.columns))
        declined = batch.declined
        if declined is not None and not pc.any(declined).as_py():
            declined = None
        if keep is None and declined is None:
            return TransformedTable(result, list(range(size)), [], [])
        if keep is None:
            keep = batch.constant(True)
        if declined is not None:
            keep = pc.and_(keep, pc.invert(declined))
        filtered_mask = pc.invert(keep) if declined is None else pc.invert(pc.or_(keep, declined))
        kept: list[int] = pc.indices_nonzero(keep).to_pylist()
        filtered: list[int] = pc.indices_nonzero(filtered_mask).to_pylist()
        fallback: list[int] = [] if declined is None else pc.indices_nonzero(declined).to_pylist()
        if len(kept) != size:
            result = result.filter(keep)
        return TransformedTable(result, kept, filtered, fallback)

    def apply_document(
        self, document: dict[str, Any], messages: PartitionMessages, position: int, key: Any
    ) -> dict[str, Any] | None:
        """The transformed document, or None when the filter drops it. Raises MessageError(stage
        ``transform``) when an expression fails on this message."""
        context = _MessageContext(messages, position, key)
        step: _Transform | None = None
        try:
            for step in self._transforms:
                _set_path(document, step.target, step.evaluate(document, context))
            step = self._filter
            if step is not None and not _is_truthy(step.evaluate(document, context)):
                return None
        except _EVALUATION_ERRORS as exc:
            assert step is not None
            raise MessageError(STAGE, f"{step.config_key}: {_describe(exc)}") from exc
        return document


def _describe(exc: Exception) -> str:
    text = str(exc)
    if isinstance(exc, TypeError) and "not supported between" in text:
        return f"cannot compare: {text}"  # the interpreter orders a number against a string with Python's <
    return text
