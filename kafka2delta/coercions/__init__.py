"""Fit decoded documents to the table schema (stage ``coerce``).

This package's face is :func:`coerce_document`, :func:`coerce_table` and :class:`CoercionOptions`. The
reference lane is ``values`` (scalars) and ``documents`` (nested values, whole rows); the Arrow lane is
``columns``; ``common`` holds the options and limits both share.

Two lanes, one contract:

* :func:`coerce_document` — the reference lane: one document (a dict of Python values, as the
  deserializer and transforms produce it) → one row of Python values that
  ``pa.Table.from_pylist([row], schema=schema)`` accepts, or a :class:`MessageError` whose reason
  names the column (dotted path for nested fields, ``tags[3]`` for list elements, ``m["k"]`` for
  map entries) and shows the offending value.
* :func:`coerce_table` — the fast lane: whole Arrow columns converted with Arrow compute kernels.
  It may *decline* a row (put it in ``fallback``; the caller retries it with
  :func:`coerce_document`) but never gives a row a value different from what
  :func:`coerce_document` gives the same document ("fast may fail, never disagree"). A value the
  reference lane would reject is always declined, never reported as an error from here.

The Delta table's schema is the authority. A missing field or ``None`` becomes null when the column
is nullable; otherwise the message fails with ``column 'id' is required but the message has no
value for it`` (nested: ``column 'user.id' ...``). Fields that are not in the schema are dropped and
counted (non-null values only; top level and inside structs, recursively).

Coercion rules (source value → column type):

=================  ==============================================================================
column type        accepted values
=================  ==============================================================================
string             str as is; bool → ``true``/``false``; int, float, Decimal → their JSON text
                   (``42``, ``1.5``, ``1e+16``; NaN/±inf as Python's json writes them); dict/list →
                   compact JSON (``{"a":1}``; datetimes inside as below, bytes inside as base64);
                   bytes → UTF-8 text (invalid UTF-8 is an error); aware datetime →
                   ``2026-11-22T10:00:00.123456Z`` (converted to UTC, fraction only when non-zero),
                   naive datetime → the same without ``Z``; date → ``YYYY-MM-DD``; time → ISO text
byte/short/int/    int in range; float with an integral value in range (``3.0`` → 3); str matching
long               ``[+-]?[0-9]+`` in range; integral Decimal in range. bool is not a number here.
float/double       int, float, Decimal, numeric str (``[+-]?([0-9]+.?[0-9]*|.[0-9]+)([eE][+-]?[0-9]+)?``);
                   NaN is an error, a value that is not finite after conversion (``1e39`` into
                   float) is out of range. float = the float32 rounding of the double.
boolean            bool; str ``true``/``false`` in any ASCII case. Numbers are errors.
decimal(p,s)       int, float (through its shortest ``repr``), numeric str, Decimal → exact value;
                   error when it needs more than ``s`` decimal places (no rounding) or more than
                   ``p - s`` integer digits. Works up to decimal(38,0) with 38-digit values.
date               ``YYYY-MM-DD``; int/float/Decimal = epoch in the column's unit → its UTC date;
                   date as is; datetime → its UTC date (naive taken as UTC). Years 1..9999.
timestamp,         str ``YYYY-MM-DD(T|t| )HH:MM:SS[.fraction][Z|z|±HH:MM]``: fraction 1..9 digits,
timestamp_ntz      truncated to microseconds; no zone = UTC; timestamp_ntz stores the UTC wall
                   time. int = epoch in the column's unit (exact); float/Decimal = epoch rounded
                   half-to-even to the microsecond; aware datetime → UTC; naive datetime taken as
                   UTC; date → midnight. Years 1..9999. Anything else (date-only strings, leap
                   seconds, garbage) is an error.
binary             bytes as is; str → strict standard base64 (``b64decode(s, validate=True)``).
struct<...>        dict → each field coerced by name (missing → null or required error), unknown
                   keys dropped and counted.
array<T>           list → each element coerced (``tags[3]`` in errors).
map<K,V>           dict → key coerced to K (``"7"`` into an int key is fine), value to V; two keys
                   that convert to the same key are an error.
=================  ==============================================================================

Numbers coerced into date / timestamp / timestamp_ntz columns are epochs in
``CoercionOptions.epoch_unit`` (``s``, ``ms``, ``us``) unless ``epoch_units`` names the column by
its dotted path (``ts``, ``user.created``; list elements and map values use their column's path).

Fast lane, by (source Arrow type → column type):

* vectorised (Arrow kernels, no per-row Python): same type (plus range/finiteness checks); string ←
  string/integer/boolean/binary (UTF-8 checked); integers ← integer/float/numeric string (up to 18
  digits); float/double ← float/integer/numeric string; boolean ← ``true``/``false`` string;
  decimal ← decimal/integer/plain decimal string (no exponent, digits within the column's);
  date ← date32/``YYYY-MM-DD`` string/integer or integral float epoch/timestamp; timestamp(_ntz) ←
  timestamp/date32/integer or integral float epoch/RFC 3339 string (RE2-validated, then Arrow's
  ISO 8601 cast); struct ← struct (by field name, recursively); array ← list; map<string,V> ← map
  with string keys. A row whose value makes a kernel fail (Feb 30, a rescale with loss) is
  isolated by bisection; range failures by masks.
* value by value with the reference function (declined where it fails): fractional float epochs
  and decimals → date/timestamp; float → decimal; decimal → integer/double; string → binary
  (base64); maps with other key types; map → struct; integer strings over 18 digits and decimal
  strings with exponents or extra digits (only those rows); anything else without a kernel.
* declined outright: string ← float/decimal/temporal/struct/list/map (their text cannot be proven
  identical to the document's: an inferred double holds 1.0 for a JSON 1); map ← anything but a map
  (an inferred struct cannot tell an absent key from a null value); booleans into anything but
  boolean/string; floats of magnitude 2**53 or more wherever the exact integer matters (an inferred
  double column may hold a rounded JSON integer); Arrow dates/timestamps outside years 1..9999 and
  sub-microsecond nanosecond timestamps (no Python document holds them).

The fast lane trusts that the table holds the document's values. Arrow's JSON reader given a
timestamp, date, binary or decimal read type parses more leniently than these rules (it reads
``"2026-11-22"`` as a timestamp and a binary column's text as raw bytes), so such columns must be
read as strings (or numbers) for the two lanes to agree.
"""

from __future__ import annotations

from kafka2delta.coercions.columns import CoercedTable, coerce_table
from kafka2delta.coercions.common import CoercionOptions
from kafka2delta.coercions.documents import coerce_document
from kafka2delta.coercions.values import ExactFloat

__all__ = ["CoercedTable", "CoercionOptions", "ExactFloat", "coerce_document", "coerce_table"]
