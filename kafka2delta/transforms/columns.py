"""Fast-lane evaluation: the documents of one batch as Arrow columns, and each plan run as column
operations. Rows where the reference lane would raise, or where Arrow cannot tell what it would do
(an empty object vs an object of nulls, a type change at a target…), are declined, never guessed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from kafka2delta.records import PartitionMessages
from kafka2delta.transforms.expressions import headers_object, walk_path
from kafka2delta.transforms.functions import EPOCH_FUNCTIONS, INT64_MAX, INT64_MIN, MILLIS_TO_MICRO
from kafka2delta.transforms.plans import (
    ComparePlan,
    EpochPlan,
    LiteralPlan,
    LogicPlan,
    MetaPlan,
    NotPlan,
    PathPlan,
    Plan,
    Scalar,
    SubstrPlan,
    is_binary,
)

# Doubles are exact integers only below 2**53: a larger epoch read as a double may not be the number
# the message holds, so the fast lane leaves those to the reference lane.
_EXACT_DOUBLE = 2**53

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
        or is_binary(data_type)
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
        fits = pc.fill_null(pc.less_equal(column, INT64_MAX), True)
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
        elif value_type not in (str, bool, int, float) or (value_type is int and not INT64_MIN <= value <= INT64_MAX):
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


class FastBatch:
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
        if isinstance(plan, PathPlan):
            return self.path(plan.parts)
        if isinstance(plan, MetaPlan):
            if plan.parts not in self._metadata:
                self._metadata[plan.parts] = self.metadata(plan.parts)
            return self._metadata[plan.parts]
        if isinstance(plan, LiteralPlan):
            if plan.value is None:
                return self.nulls()
            return pa.repeat(pa.scalar(plan.value), self.size), None
        if isinstance(plan, SubstrPlan):
            return self.substr(plan)
        if isinstance(plan, EpochPlan):
            return self.epoch(plan)
        if isinstance(plan, ComparePlan):
            column, declined = self.evaluate(plan.operand)
            result, compare_declined = self.compare(column, plan.op, plan.literal)
            return result, _union(declined, compare_declined)
        if isinstance(plan, NotPlan):
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
            return _python_column([walk_path(keys[position], parts[1:]) for position in positions])
        # headers
        headers = [headers_object(messages, position) for position in positions]
        if len(parts) == 2:
            return pa.array([found.get(parts[1]) for found in headers], pa.string()), None
        names = list(dict.fromkeys(name for found in headers for name in found))
        return pa.array(headers, pa.struct([(name, pa.string()) for name in names])), None

    def substr(self, plan: SubstrPlan) -> Column:
        column, declined = self.evaluate(plan.operand)
        if _kind(column.type) != "string":
            # substr() raises for every value that is not a string, null included
            return pa.nulls(self.size, pa.string()), self.constant(True)
        if column.type != pa.string():
            column = column.cast(pa.string())
        result = pc.utf8_slice_codeunits(column, plan.start, plan.start + plan.length)  # code points
        return result, _union(declined, column.is_null())

    def epoch(self, plan: EpochPlan) -> Column:
        column, declined = self.evaluate(plan.operand)
        nanos_per_unit = 1_000 if plan.function == MILLIS_TO_MICRO else EPOCH_FUNCTIONS[plan.function]
        bound = INT64_MAX // nanos_per_unit
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
            result_type = pa.int64() if plan.function == MILLIS_TO_MICRO else pa.string()
            return pa.nulls(self.size, result_type), self.constant(True)
        integers = pc.if_else(ok, integers, 0)  # rows out of range must not overflow below
        declined = _union(declined, pc.invert(ok))
        if plan.function == MILLIS_TO_MICRO:
            return pc.if_else(ok, pc.multiply(integers, 1_000), None), declined
        nanos = pc.multiply(integers, nanos_per_unit).cast(pa.timestamp("ns"))
        return pc.if_else(ok, _format_timestamps(nanos), None), declined

    def logic(self, plan: LogicPlan) -> Column:
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
        if isinstance(plan, ComparePlan):
            result, declined = self.evaluate(plan)
            return pc.fill_null(result, False), declined
        if isinstance(plan, NotPlan):
            truth, declined = self.truthy(plan.operand)
            return pc.invert(truth), declined
        if isinstance(plan, LogicPlan):
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
            if not INT64_MIN <= target <= INT64_MAX:
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
            if not INT64_MIN <= literal <= INT64_MAX:
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
