"""What both coercion lanes share: the options, the limits of the values Python and Delta share
(instants in years 1..9999, epoch units, integer bounds, exact doubles), and the text grammars, in
Python's ``re`` for the reference lane and in RE2 for the Arrow lane, side by side so they stay in step."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import pyarrow as pa


@dataclass(frozen=True)
class CoercionOptions:
    epoch_unit: str = "ms"
    """Unit (``s``, ``ms``, ``us``) of numbers coerced into timestamp / timestamp_ntz / date columns."""
    epoch_units: Mapping[str, str] = field(default_factory=dict)
    """Per-column overrides, keyed by dotted column path (``user.created``)."""


EPOCH_ORDINAL = dt.date(1970, 1, 1).toordinal()
US_PER_SECOND = 1_000_000
US_PER_DAY = 86_400 * US_PER_SECOND
MIN_DAY = dt.date.min.toordinal() - EPOCH_ORDINAL
MAX_DAY = dt.date.max.toordinal() - EPOCH_ORDINAL
MIN_US = MIN_DAY * US_PER_DAY
"""0001-01-01T00:00:00 in microseconds since the epoch: the first instant Python and Delta share."""
MAX_US = (MAX_DAY + 1) * US_PER_DAY - 1
"""9999-12-31T23:59:59.999999 in microseconds since the epoch."""
US_PER_UNIT = {"s": US_PER_SECOND, "ms": 1_000, "us": 1}
EXACT_FLOAT_LIMIT = 2**53
"""Beyond this a double cannot tell neighbouring integers apart: a JSON integer read into an
inferred double column may have been rounded, so the fast lane declines such values wherever the
exact integer matters."""


def us_per_unit(schema_path: str, options: CoercionOptions) -> int:
    unit = options.epoch_units.get(schema_path, options.epoch_unit)
    try:
        return US_PER_UNIT[unit]
    except KeyError:
        # The config validates units; reaching this is a programming error, not a bad message.
        raise ValueError(f"epoch unit for column {schema_path!r} must be s, ms or us, got {unit!r}") from None


def int_bounds(dtype: pa.DataType) -> tuple[int, int]:
    bits = dtype.bit_width
    if pa.types.is_signed_integer(dtype):
        return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    return 0, 2**bits - 1


# --- text grammars: Python's re for the reference lane, RE2 for the Arrow lane ------------------------

# Python regexes use [0-9], never \d (which matches any Unicode digit that int() would accept too).
INTEGER_TEXT = re.compile(r"[+-]?[0-9]+")
NUMBER_TEXT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
DATE_TEXT = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})")
TIMESTAMP_TEXT = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt ]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,9}))?"
    r"(?:[Zz]|([+-])([0-9]{2}):([0-9]{2}))?"
)

# The same grammars in RE2 for the Arrow lane (RE2's \d is ASCII; [0-9] used anyway for symmetry). They are
# never looser than the Python ones above: a string they accept is one the reference lane accepts too,
# except impossible days (Feb 30) and year 0, which Arrow's cast and the range check then decline.
RE2_INTEGER = r"^[+-]?[0-9]{1,18}$"
"""At most 18 digits: always fits int64, so the cast cannot overflow; longer ones go value by value."""
RE2_ANY_INTEGER = r"^[+-]?[0-9]+$"
RE2_NUMBER = r"^[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$"
RE2_BOOLEAN = r"^(?:[Tt][Rr][Uu][Ee]|[Ff][Aa][Ll][Ss][Ee])$"
"""Spelled out rather than (?i): RE2 folds case by Unicode rules (``ſ`` matches ``s``)."""
RE2_DAY = r"[0-9]{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01])"
RE2_CLOCK = r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]"
RE2_OFFSET = r"[+-](?:[01][0-9]|2[0-3]):[0-5][0-9]"
RE2_DATE = rf"^{RE2_DAY}$"
RE2_TS_ZONED = rf"^{RE2_DAY}[T ]{RE2_CLOCK}(?:\.[0-9]{{1,6}})?(?:Z|{RE2_OFFSET})$"
"""What Arrow's ISO 8601 cast to timestamp[us, UTC] reads as is: the common case, one pass."""
RE2_TS_NAIVE = rf"^{RE2_DAY}[T ]{RE2_CLOCK}(?:\.[0-9]{{1,6}})?$"
"""No zone: Arrow reads it once a ``Z`` is appended (no zone means UTC)."""
RE2_TS_FULL = rf"^{RE2_DAY}[Tt ]{RE2_CLOCK}(?:\.[0-9]{{1,9}})?(?:[Zz]|{RE2_OFFSET})?$"
"""Everything the grammar allows; what the two above miss (``t``, ``z``, 7-9 digits) is rewritten."""
RE2_TS_NO_ZONE = rf"^({RE2_DAY}[T ]{RE2_CLOCK}(?:\.[0-9]+)?)$"
