"""The fast lane the schema-typed formats (Avro, Protobuf) share: records decoded with their writer
schema, grouped by schema, turned into one Arrow table typed by the schemas; and the per-deserializer
cache of compiled schemas.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pyarrow as pa

from kafka2delta.bisection import isolate_failures
from kafka2delta.errors import MessageError
from kafka2delta.records import PartitionMessages
from kafka2delta.serialization.base import Decoded, in_position_order, join_compatible, payload_at

Convert = Callable[[Any], Any]


@dataclass
class Shape:
    """What a writer (or reader) schema gives the fast lane."""

    arrow: pa.DataType
    """The Arrow type of a decoded value (a struct for a record/message)."""
    fix: Convert | None
    """Turns the decoder's Python value into the document's (time → microseconds, UUID → text …);
    None when the decoder's values are already right."""
    slow: bool
    """The type has no faithful Arrow type (a union of several types, a recursive type): every
    message goes to the reference lane; ``arrow`` then types those fields as string."""


@dataclass
class _Group:
    shape: Shape
    positions: list[int] = field(default_factory=list)
    values: list[dict[str, Any]] = field(default_factory=list)


def grouped_decode(
    messages: PartitionMessages,
    positions: Sequence[int],
    read: Callable[[bytes], tuple[Hashable, Shape, dict[str, Any]]],
) -> Decoded:
    """Decode each message with ``read`` (→ writer-schema key, its shape, the record), grouped by writer."""
    groups: dict[Hashable, _Group] = {}
    failures: list[tuple[int, MessageError]] = []
    for position in positions:
        try:
            key, shape, value = read(payload_at(messages, position))
        except MessageError as exc:
            failures.append((position, exc))
            continue
        group = groups.get(key)
        if group is None:
            group = groups[key] = _Group(shape)
        group.positions.append(position)
        group.values.append(value)
    return _typed_decode(groups.values(), failures)


def _typed_decode(groups: Iterable[_Group], failures: list[tuple[int, MessageError]]) -> Decoded:
    """Groups of decoded records (one group per writer schema) → one table, typed by the schemas.

    Every decoded dict is also a document. A record ``pa.array`` refuses on its own (a decimal wider
    than its declared precision, a timestamp out of range …) is left to the reference lane; groups
    whose types cannot be promoted into one table (a field that changed type between versions) go
    to the reference lane as a whole, except the largest.
    """
    documents: dict[int, dict[str, Any]] = {}
    pieces: list[tuple[list[int], pa.Table]] = []
    for group in groups:
        documents.update(zip(group.positions, group.values, strict=True))
        struct_type = group.shape.arrow
        if group.shape.slow:
            # Typed but empty: schema evolution still sees the fields, the values take the slow lane.
            pieces.append(([], pa.Table.from_batches([], pa.schema(list(struct_type)))))
            continue

        def attempt(chunk: list[int], group: _Group = group) -> pa.Table:
            array = pa.array([group.values[i] for i in chunk], type=group.shape.arrow)
            return pa.Table.from_struct_array(array)

        good, _ = isolate_failures(
            list(range(len(group.positions))),
            attempt,
            (pa.ArrowInvalid, pa.ArrowTypeError, ValueError, TypeError, OverflowError),
        )
        if not good:
            pieces.append(([], pa.Table.from_batches([], pa.schema(list(struct_type)))))
        for chunk, table in good:
            pieces.append(([group.positions[i] for i in chunk], table))
    joined, _ = join_compatible(pieces)
    if not joined:
        return Decoded(table=pa.table({}), fast=[], documents=documents, failures=failures, typed=True)
    tables = [table for _, table in joined]
    table = tables[0] if len(tables) == 1 else pa.concat_tables(tables, promote_options="permissive")
    fast = [position for chunk, _ in joined for position in chunk]
    table, fast = in_position_order(table, fast, len(joined))
    return Decoded(table=table, fast=fast, documents=documents, failures=failures, typed=True)


@dataclass
class BrokenSchema:
    """A schema id that can never decode (not Avro, not parseable): every message is a dead letter."""

    reason: str


_MAX_SCHEMAS = 1000
"""Compiled schemas kept per deserializer (oldest dropped first; a topic rarely has more ids)."""
_V = TypeVar("_V")


def remember_schema(cache: dict[int, _V], key: int, value: _V) -> _V:
    cache[key] = value
    while len(cache) > _MAX_SCHEMAS:
        del cache[next(iter(cache))]
    return value
