"""Fast-lane plans: what an expression compiles to when column operations can run it (plain paths,
metadata, scalar literals, the custom functions with constant arguments, comparisons with a literal,
``!``, ``&&``, ``||``), and which document paths a plan reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from kafka2delta.transforms.expressions import KAFKA, METADATA, SCALAR_METADATA, Node, path_parts
from kafka2delta.transforms.functions import (
    EPOCH_FUNCTIONS,
    INT64_MAX,
    INT64_MIN,
    MILLIS_TO_MICRO,
    TransformFunctionError,
    non_negative_integer,
)

Scalar = str | int | float | bool | None


@dataclass(frozen=True)
class PathPlan:
    parts: tuple[str, ...]


@dataclass(frozen=True)
class MetaPlan:
    parts: tuple[str, ...]
    """Inside the ``kafka`` object: ("offset",), ("headers",), ("headers", name), ("key", *path)."""


@dataclass(frozen=True)
class LiteralPlan:
    value: Scalar


@dataclass(frozen=True)
class SubstrPlan:
    operand: Plan
    start: int
    length: int


@dataclass(frozen=True)
class EpochPlan:
    function: str
    operand: Plan


@dataclass(frozen=True)
class ComparePlan:
    op: str
    """eq, ne, lt, lte, gt, gte with ``operand`` on the left and ``literal`` on the right."""
    operand: Plan
    literal: Scalar


@dataclass(frozen=True)
class NotPlan:
    operand: Plan


@dataclass(frozen=True)
class LogicPlan:
    op: str
    """and_expression or or_expression."""
    left: Plan
    right: Plan


Plan = PathPlan | MetaPlan | LiteralPlan | SubstrPlan | EpochPlan | ComparePlan | NotPlan | LogicPlan

_FLIPPED = {"eq": "eq", "ne": "ne", "lt": "gt", "lte": "gte", "gt": "lt", "gte": "lte"}


class NotCompilable(Exception):
    """The expression needs the interpreter."""


def _is_scalar_literal(node: Node) -> bool:
    if node["type"] != "literal":
        return False
    value = node["value"]
    if value is None or isinstance(value, str | bool | float):
        return True
    return isinstance(value, int) and INT64_MIN <= value <= INT64_MAX


def _literal_integer(node: Node) -> int:
    """A substr start/length that the fast lane can use as a constant."""
    if node["type"] != "literal":
        raise NotCompilable("substr() with a computed start or length")
    try:
        return non_negative_integer("substr", "argument", node["value"])
    except TransformFunctionError as exc:
        raise NotCompilable(str(exc)) from exc


def compile_plan(node: Node) -> Plan:
    """A column plan for the expression, or NotCompilable."""
    parts = path_parts(node)
    if parts is not None:
        if not parts:
            raise NotCompilable("the whole document (@)")
        if parts[0] == KAFKA:
            return _compile_metadata(parts[1:])
        return PathPlan(parts)
    kind = node["type"]
    children: list[Node] = node["children"]
    if kind == "literal":
        if not _is_scalar_literal(node):
            raise NotCompilable("a literal array, object or huge integer")
        return LiteralPlan(node["value"])
    if kind == "function_expression":
        name = node["value"]
        if name == "substr" and len(children) == 3:
            return SubstrPlan(compile_plan(children[0]), _literal_integer(children[1]), _literal_integer(children[2]))
        if (name in EPOCH_FUNCTIONS or name == MILLIS_TO_MICRO) and len(children) == 1:
            return EpochPlan(name, compile_plan(children[0]))
        raise NotCompilable(f"function {name}()")
    if kind == "comparator":
        left, right = children
        if _is_scalar_literal(right) and not _is_scalar_literal(left):
            return ComparePlan(node["value"], compile_plan(left), right["value"])
        if _is_scalar_literal(left) and not _is_scalar_literal(right):
            return ComparePlan(_FLIPPED[node["value"]], compile_plan(right), left["value"])
        raise NotCompilable("a comparison that is not between an expression and a literal")
    if kind == "not_expression":
        return NotPlan(compile_plan(children[0]))
    if kind in ("and_expression", "or_expression"):
        return LogicPlan(kind, compile_plan(children[0]), compile_plan(children[1]))
    raise NotCompilable(kind)


def _compile_metadata(rest: tuple[str, ...]) -> Plan:
    if not rest:
        raise NotCompilable("the whole kafka object")
    name = rest[0]
    if name not in METADATA:
        return LiteralPlan(None)
    if name in SCALAR_METADATA and len(rest) > 1:
        return LiteralPlan(None)  # a field of a number or string is null
    if name == "headers" and len(rest) > 2:
        return LiteralPlan(None)  # header values are strings
    return MetaPlan(rest)


def plan_reads(plan: Plan, wanted: pa.DataType | None) -> list[tuple[tuple[str, ...], pa.DataType | None]]:
    """The document paths a plan reads, with the type its reader would want for each."""
    if isinstance(plan, PathPlan):
        return [(plan.parts, wanted)]
    if isinstance(plan, SubstrPlan):
        return plan_reads(plan.operand, pa.string())
    if isinstance(plan, EpochPlan):
        return plan_reads(plan.operand, pa.float64())
    if isinstance(plan, ComparePlan | NotPlan):
        return plan_reads(plan.operand, None)
    if isinstance(plan, LogicPlan):
        return plan_reads(plan.left, None) + plan_reads(plan.right, None)
    return []


def read_type(data_type: pa.DataType) -> pa.DataType:
    """How the JSON reader should read a value bound for a column of ``data_type``: temporal, decimal
    and binary values arrive as strings in JSON and are converted by the coercion stage."""
    if pa.types.is_temporal(data_type) or pa.types.is_decimal(data_type) or is_binary(data_type):
        return pa.string()
    if pa.types.is_struct(data_type):
        return pa.struct([field.with_type(read_type(field.type)) for field in data_type])
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        return pa.list_(data_type.value_field.with_type(read_type(data_type.value_type)))
    return data_type


def is_binary(data_type: pa.DataType) -> bool:
    return bool(
        pa.types.is_binary(data_type) or pa.types.is_large_binary(data_type) or pa.types.is_fixed_size_binary(data_type)
    )


def schema_type(schema: pa.Schema, parts: tuple[str, ...]) -> pa.DataType | None:
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
