"""JMESPath transforms and the filter (stage ``transform``).

This package's face is :class:`Transformer`. ``functions`` holds the custom functions, ``expressions``
the parsing and the reference lane (the interpreter), ``plans`` what the fast lane compiles an
expression to, and ``columns`` how it runs a plan on Arrow columns.

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

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jmespath  # type: ignore[import-untyped]
import pyarrow as pa
import pyarrow.compute as pc
from jmespath.visitor import TreeInterpreter  # type: ignore[import-untyped]

from kafka2delta.errors import ConfigError, MessageError
from kafka2delta.records import PartitionMessages
from kafka2delta.transforms.columns import FastBatch
from kafka2delta.transforms.expressions import (
    KAFKA,
    Evaluate,
    MessageContext,
    Node,
    is_truthy,
    parse_expression,
    reference_evaluator,
    set_path,
)
from kafka2delta.transforms.functions import TransformFunctionError, TransformFunctions, format_epoch_nanos
from kafka2delta.transforms.plans import NotCompilable, PathPlan, Plan, compile_plan, plan_reads, read_type, schema_type

__all__ = ["FILTER_KEY", "TransformFunctionError", "TransformedTable", "Transformer", "format_epoch_nanos"]

FILTER_KEY = "filter.expression"

# Evaluation errors of the interpreter: its own (JMESPathError is a ValueError), TypeError from an
# ordering comparison of a number with a string, ArithmeticError from ceil/floor of infinities.
_EVALUATION_ERRORS = (ValueError, TypeError, ArithmeticError)


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


def _target_parts(target: str, config_key: str) -> tuple[str, ...]:
    parts = tuple(target.split("."))
    if not target or any(not part for part in parts):
        raise ConfigError(config_key, f"invalid target {target!r}: expected dot-separated field names")
    if parts[0] == KAFKA:
        raise ConfigError(config_key, "targets under 'kafka' are reserved for the Kafka metadata")
    return parts


class Transformer:
    def __init__(
        self,
        transforms: Sequence[tuple[str, str]],
        filter_expression: str = "",
        *,
        key: str = "transforms",
        filter_key: str = FILTER_KEY,
    ) -> None:
        """Compile everything; a bad expression raises ConfigError naming ``<key>.<target>`` or ``filter_key``
        (a route's: ``routes[2].transforms``, ``routes[2].filter``), as a failing one's dead letters do."""
        self._interpreter = TreeInterpreter(jmespath.Options(custom_functions=TransformFunctions()))
        self._transforms: list[_Transform] = []
        interpreted: list[str] = []
        for target, expression in transforms:
            config_key = f"{key}.{target}"
            parts = _target_parts(target, config_key)
            parsed = parse_expression(config_key, expression)
            plan = self._try_compile(parsed, config_key, interpreted)
            self._transforms.append(_Transform(parts, config_key, reference_evaluator(parsed, self._interpreter), plan))
        self._filter: _Transform | None = None
        if filter_expression.strip():
            parsed = parse_expression(filter_key, filter_expression)
            plan = self._try_compile(parsed, filter_key, interpreted)
            self._filter = _Transform((), filter_key, reference_evaluator(parsed, self._interpreter), plan)
        self.interpreted: tuple[str, ...] = tuple(interpreted)
        """Config keys of the expressions the fast lane cannot run, with why (for a log line)."""

    @staticmethod
    def _try_compile(parsed: Node, config_key: str, interpreted: list[str]) -> Plan | None:
        try:
            return compile_plan(parsed)
        except NotCompilable as exc:
            interpreted.append(f"{config_key} ({exc})")
            return None

    @property
    def target_columns(self) -> frozenset[str]:
        """The top-level columns the transforms write whole (a dotted target writes one member of a struct)."""
        return frozenset(transform.target[0] for transform in self._transforms if len(transform.target) == 1)

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
            if isinstance(step.plan, PathPlan) and step.target:
                column_type = schema_type(table_schema, step.target)
                plain_type = None if column_type is None else read_type(column_type)
            for parts, data_type in plan_reads(step.plan, plain_type):
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
        batch = FastBatch(table, messages, positions, keys)
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
        context = MessageContext(messages, position, key)
        step: _Transform | None = None
        try:
            for step in self._transforms:
                set_path(document, step.target, step.evaluate(document, context))
            step = self._filter
            if step is not None and not is_truthy(step.evaluate(document, context)):
                return None
        except _EVALUATION_ERRORS as exc:
            assert step is not None
            raise MessageError("transform", f"{step.config_key}: {_describe(exc)}") from exc
        return document


def _describe(exc: Exception) -> str:
    text = str(exc)
    if isinstance(exc, TypeError) and "not supported between" in text:
        return f"cannot compare: {text}"  # the interpreter orders a number against a string with Python's <
    return text
