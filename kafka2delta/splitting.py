"""The route stage (pure): with ``[routing] expression``, which table each message of a piece goes to.

The router is a pipeline of its own whose table has one column, the expression's value: it decodes and
transforms the messages as every table's pipeline does (and filters them), then evaluates the expression
on the transformed message. A message the router fails (decode, transform) is a dead letter of its stage;
one whose value is empty or names no route of its topic is a dead letter of stage ``route``, with the
value in the reason. The other messages go, per route, to that table's own pipeline.

Every table a partition can reach gets an outcome for every piece (an empty one when no message went
there), so each table's txn for the partition moves on with the partition even when the table gets no row.
After a crash between two tables' commits, the tables hold different versions: the partition is read
again from the lowest, and :func:`after` drops, per table, what that table already holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import pyarrow as pa
import pyarrow.compute as pc

from kafka2delta.pipeline import Pipeline
from kafka2delta.records import DeadLetter, PartitionMessages, ProcessedPartition, payload_json

ROUTE_COLUMN = "__kafka2delta_route"
"""The router's one column: where the expression's value is put (a name no table column uses)."""
ROUTE_SCHEMA = pa.schema([pa.field(ROUTE_COLUMN, pa.string())])

_REASON_VALUE_CHARS = 200  # of an unknown route value, in the dead letter's reason


@dataclass(kw_only=True)
class Split:
    """A piece, split by route: the messages of each table, and what the router itself made of the rest."""

    messages: dict[str, PartitionMessages] = field(default_factory=dict)
    """By table URI, the messages the expression chose that table for."""
    routed: ProcessedPartition
    """No rows: the router's dead letters (decode, transform, route) and skips (empty, filtered)."""


def split(piece: PartitionMessages, router: Pipeline, tables: Mapping[str, str]) -> Split:
    """Route ``piece``'s messages: ``tables`` maps a route name to its table's URI."""
    processed = router.process(piece)
    values = processed.rows.column(ROUTE_COLUMN).to_pylist() if processed.rows.num_rows else []
    index_of = {offset: index for index, offset in enumerate(piece.offsets)}
    chosen: dict[str, list[int]] = {}
    letters = list(processed.dead_letters)
    for offset, value in zip(processed.row_offsets, values, strict=True):
        index = index_of[offset]
        uri = tables.get(value) if value else None
        if uri is not None:
            chosen.setdefault(uri, []).append(index)
            continue
        payload = piece.payloads[index] or b""
        reason = (
            "the route expression gave no value"
            if not value
            else f"no route named {value[:_REASON_VALUE_CHARS]!r} takes topic {piece.topic!r} "
            f"(routes: {', '.join(sorted(tables))})"
        )
        letters.append(
            DeadLetter(
                topic=piece.topic,
                partition=piece.partition,
                offset=offset,
                stage="route",
                reason=reason,
                payload=payload,
                key=piece.key(index),
                timestamp_ms=piece.timestamps_ms[index],
                payload_json=payload_json(payload),
            )
        )
    letters.sort(key=lambda letter: letter.offset)
    routed = replace(
        processed,
        rows=pa.table({}),
        row_offsets=[],
        row_timestamps_ms=None,
        dead_letters=letters,
        unknown_fields=0,  # every field but the route is unknown to the router's one-column table
        added_columns=[],
    )
    return Split(messages={uri: piece.select(indices) for uri, indices in chosen.items()}, routed=routed)


def empty_outcome(piece: PartitionMessages, schema: pa.Schema) -> ProcessedPartition:
    """A table's outcome for a piece that sent it nothing: no row, but the piece's offsets."""
    return ProcessedPartition(
        topic=piece.topic,
        partition=piece.partition,
        rows=schema.empty_table(),
        first_offset=piece.offsets[0],
        last_offset=piece.offsets[-1],
        max_timestamp_ms=max(piece.timestamps_ms),
    )


def merged(outcome: ProcessedPartition, routed: ProcessedPartition) -> ProcessedPartition:
    """The home table's outcome with the router's dead letters and skips added (they ride with its lane)."""
    return replace(
        outcome,
        dead_letters=sorted([*routed.dead_letters, *outcome.dead_letters], key=lambda letter: letter.offset),
        skipped_empty=outcome.skipped_empty + routed.skipped_empty,
        skipped_filtered=outcome.skipped_filtered + routed.skipped_filtered,
    )


def after(processed: ProcessedPartition, committed: int | None) -> ProcessedPartition:
    """``processed`` without the rows and dead letters at offsets ≤ ``committed``: what its table already holds
    (non-empty only when the partition was read again from a lower table's version after a crash)."""
    if committed is None or committed < processed.first_offset:
        return processed
    keep = [i for i, offset in enumerate(processed.row_offsets) if offset > committed]
    rows = processed.rows.take(pa.array(keep, pa.int64())) if processed.rows.num_columns else processed.rows
    stamps = processed.row_timestamps_ms
    deletes = processed.row_deletes
    return replace(
        processed,
        rows=rows,
        row_offsets=[processed.row_offsets[i] for i in keep],
        row_timestamps_ms=pc.take(stamps, pa.array(keep, pa.int64())) if stamps is not None else None,
        row_deletes=pc.take(deletes, pa.array(keep, pa.int64())) if deletes is not None else None,
        dead_letters=[letter for letter in processed.dead_letters if letter.offset > committed],
    )
