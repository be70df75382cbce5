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
class TypedGroup:
    """The messages of one writer schema: records decoded to dicts, and rows already decoded to columns."""

    shape: Shape
    positions: list[int] = field(default_factory=list)
    values: list[dict[str, Any]] = field(default_factory=list)
    columns: tuple[list[int], pa.Table] | None = None
    """Positions and their rows, typed ``shape.arrow``, read by a column lane (Avro's): no documents."""


def first_position(group: TypedGroup) -> int:
    """The first message of a group (groups in this order are in the order a per-message pass meets them)."""
    return min(group.positions[:1] + (group.columns[0][:1] if group.columns is not None else []))


def grouped_decode(
    messages: PartitionMessages,
    positions: Sequence[int],
    read: Callable[[bytes], tuple[Hashable, Shape, dict[str, Any]]],
    column_groups: dict[Hashable, TypedGroup] | None = None,
) -> Decoded:
    """Decode each message with ``read`` (→ writer-schema key, its shape, the record), grouped by writer.

    ``column_groups`` are the groups a column lane already read, by the same keys; ``positions`` are then the
    messages it left, which join their writer's group here (or, undecodable, become failures)."""
    groups = dict(column_groups) if column_groups else {}
    failures: list[tuple[int, MessageError]] = []
    for position in sorted(positions):
        try:
            key, shape, value = read(payload_at(messages, position))
        except MessageError as exc:
            failures.append((position, exc))
            continue
        group = groups.get(key)
        if group is None:
            group = groups[key] = TypedGroup(shape)
        group.positions.append(position)
        group.values.append(value)
    # Groups in the order a per-message pass meets them: conflicts between writer schemas break ties by it.
    return typed_decode(
        sorted(groups.values(), key=first_position),
        failures,
        lambda position: read(payload_at(messages, position))[2],
    )


def typed_decode(
    groups: Iterable[TypedGroup],
    failures: list[tuple[int, MessageError]],
    document: Callable[[int], dict[str, Any]] | None = None,
) -> Decoded:
    """Groups of decoded records (one group per writer schema) → one table, typed by the schemas.

    Every decoded dict is also a document; the rows a column lane read (``TypedGroup.columns``) are one more
    piece of their group's table. A record ``pa.array`` refuses on its own (a decimal wider than its declared
    precision, a timestamp out of range …) is left to the reference lane; groups whose types cannot be
    promoted into one table (a field that changed type between versions) go to the reference lane as a
    whole, except the largest: ``document`` (position → document, or MessageError) then decodes the rows of
    theirs a column lane read, which have no document yet.
    """
    documents: dict[int, dict[str, Any]] = {}
    pieces: list[tuple[list[int], pa.Table]] = []
    declared: list[tuple[pa.Schema, Sequence[int]]] = []
    for group in groups:
        documents.update(zip(group.positions, group.values, strict=True))
        if isinstance(group.shape.arrow, pa.StructType):
            read = group.columns[0] if group.columns is not None else []
            written = [*group.positions, *read] if read and group.positions else read or group.positions
            declared.append((pa.schema(list(group.shape.arrow)), written))
        if group.shape.slow:
            # Typed but empty: schema evolution still sees the fields, the values take the slow lane.
            pieces.append(_empty_piece(group.shape))
            continue
        group_pieces = [group.columns] if group.columns is not None and group.columns[0] else []
        if group.values:

            def attempt(chunk: list[int], group: TypedGroup = group) -> pa.Table:
                array = pa.array([group.values[i] for i in chunk], type=group.shape.arrow)
                return pa.Table.from_struct_array(array)

            good, _ = isolate_failures(
                list(range(len(group.positions))),
                attempt,
                (pa.ArrowInvalid, pa.ArrowTypeError, ValueError, TypeError, OverflowError),
            )
            group_pieces.extend(([group.positions[i] for i in chunk], table) for chunk, table in good)
        pieces.append(_one_piece(group_pieces) if group_pieces else _empty_piece(group.shape))
    joined, rejected = join_compatible(pieces)
    undocumented = [position for chunk in rejected for position in chunk if position not in documents]
    if undocumented:
        assert document is not None, "rows read as columns need a document reader"
        for position in undocumented:
            try:
                documents[position] = document(position)
            except MessageError as exc:
                failures.append((position, exc))
        failures.sort(key=lambda failure: failure[0])
    if not joined:
        return Decoded(
            table=pa.table({}), fast=[], documents=documents, failures=failures, typed=True, declared=declared
        )
    tables = [table for _, table in joined]
    table = tables[0] if len(tables) == 1 else pa.concat_tables(tables, promote_options="permissive")
    fast = [position for chunk, _ in joined for position in chunk]
    table, fast = in_position_order(table, fast, len(joined))
    return Decoded(table=table, fast=fast, documents=documents, failures=failures, typed=True, declared=declared)


def _empty_piece(shape: Shape) -> tuple[list[int], pa.Table]:
    """No rows, but the group's columns (schema evolution still sees its fields)."""
    return [], pa.Table.from_batches([], pa.schema(list(shape.arrow)))


def _one_piece(pieces: list[tuple[list[int], pa.Table]]) -> tuple[list[int], pa.Table]:
    """A group's pieces (rows read as columns, chunks of dicts ``pa.array`` took) as one, in position order.

    A group is one piece whichever lane read its rows, so a conflict between writer schemas is settled by group
    (the largest keeps its rows) and both lanes settle it alike."""
    if len(pieces) == 1:
        return pieces[0]
    positions = [position for chunk, _ in pieces for position in chunk]
    table, positions = in_position_order(pa.concat_tables([table for _, table in pieces]), positions, len(pieces))
    return positions, table


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
