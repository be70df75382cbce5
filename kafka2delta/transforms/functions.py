"""The custom functions (kafka-delta-ingest's): ``substr`` and the epoch conversions, registered with
JMESPath for the interpreter, called directly by the reference lane, and mirrored column by column
by the fast lane (``transforms.columns``). Their argument checks make a bad value a dead letter.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from jmespath import functions as jmespath_functions  # type: ignore[import-untyped]

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
_NANOS_PER_SECOND = 1_000_000_000
# Nanoseconds per unit of each epoch function's argument: chrono formats a DateTime built from i64
# nanoseconds, so the representable range is exactly the epochs whose nanoseconds fit in an i64.
EPOCH_FUNCTIONS = {
    "epoch_seconds_to_iso8601": 1_000_000_000,
    "epoch_millis_to_iso8601": 1_000_000,
    "epoch_micros_to_iso8601": 1_000,
}
MILLIS_TO_MICRO = "epoch_millis_to_micro"
_UNIX_EPOCH = datetime(1970, 1, 1)


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


def non_negative_integer(function: str, what: str, value: Any) -> int:
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
    first = non_negative_integer("substr", "start", start)
    count = non_negative_integer("substr", "length", length)
    return text[first : first + count]


def _truncated_epoch(function: str, value: Any, nanos_per_unit: int) -> int:
    """The number truncated to an integer of its unit, checked to fit in i64 nanoseconds."""
    if type(value) is not int and type(value) is not float:
        raise TransformFunctionError(f"{function}() expects a number, got {_json_type(value)}")
    if type(value) is float and not math.isfinite(value):
        raise TransformFunctionError(f"{function}() argument {value!r} is out of range")
    whole = int(value)  # truncates toward zero, like Rust's `as i64`
    if not -(INT64_MAX // nanos_per_unit) <= whole <= INT64_MAX // nanos_per_unit:
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
    nanos_per_unit = EPOCH_FUNCTIONS[function]
    return format_epoch_nanos(_truncated_epoch(function, value, nanos_per_unit) * nanos_per_unit)


def epoch_millis_to_micro(value: Any) -> int:
    return _truncated_epoch(MILLIS_TO_MICRO, value, 1_000) * 1_000


_ANY: dict[str, list[str]] = {"types": []}  # the functions check their arguments themselves, for readable reasons


class TransformFunctions(jmespath_functions.Functions):  # type: ignore[misc]
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


CUSTOM_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "substr": substr,
    "epoch_seconds_to_iso8601": lambda value: epoch_to_iso8601("epoch_seconds_to_iso8601", value),
    "epoch_millis_to_iso8601": lambda value: epoch_to_iso8601("epoch_millis_to_iso8601", value),
    "epoch_micros_to_iso8601": lambda value: epoch_to_iso8601("epoch_micros_to_iso8601", value),
    MILLIS_TO_MICRO: epoch_millis_to_micro,
}
