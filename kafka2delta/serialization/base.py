"""What every format shares: the deserializer protocol and its result, the decode skeleton (keys,
then values), reasons that name the bytes at fault, gzip, the Confluent wire-format header, and the
helpers that put pieces of a batch read back together in message order.
"""

from __future__ import annotations

import itertools
import re
import struct
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import pyarrow as pa

from kafka2delta.errors import MessageError
from kafka2delta.records import PartitionMessages

MAX_DOCUMENT_DEPTH = 64
"""Deepest nesting of objects/arrays (records, lists, maps) a message may have; deeper is a dead letter
(the later stages walk documents recursively, and real events nest a handful of levels)."""
MAX_DECOMPRESSED_BYTES = 64 * 1024 * 1024
"""Largest gunzipped payload accepted (a gzip bomb is a dead letter, not an out-of-memory)."""
CONFLUENT_HEADER_BYTES = 5  # magic byte + 4-byte big-endian schema id
OBJECT_ADDRESS = re.compile(r" (object )?at 0x[0-9a-fA-F]+")
"""Object addresses in library messages: removed so that a reason is the same on every replay."""


@dataclass
class Decoded:
    table: pa.Table
    """Fast lane: one row per message of ``fast``; top-level columns are the document's fields."""
    fast: list[int]
    """Positions (into the PartitionMessages) of the rows of ``table``, ascending."""
    documents: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Position → Python document: every slow-lane message, plus fast-lane ones decoded anyway (Avro)."""
    failures: list[tuple[int, MessageError]] = field(default_factory=list)
    """Positions that are dead letters, with the reason."""
    keys: list[Any] | None = None
    """Decoded key per position of the PartitionMessages (None where a message has no key);
    None altogether when ``format.key = "none"``."""
    typed: bool = False
    """True when ``table``'s column types come from a writer schema (Avro, Protobuf), so schema
    evolution can trust them; False when they were inferred from the data (JSON)."""
    deletes: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Upsert tables only: position → the key (and change) columns of a message that deletes its key."""
    declared: list[tuple[pa.Schema, Sequence[int]]] = field(default_factory=list)
    """Typed formats: the columns each writer schema (or Connect schema, or message type) declares, with the
    positions it wrote, whichever lane took them; a column one declares joins the table with the first of its
    messages that is a row, even when all its values are null."""


class Deserializer(Protocol):
    def set_read_schema(self, schema: pa.Schema, table_schema: pa.Schema | None = None) -> None:
        """The fields (and their Arrow types) the JSON fast lane should read; the rest is inferred or
        ignored by format. ``table_schema`` is the table's own (raw reads its column's type there).
        Called at start and whenever the table schema changes."""
        ...

    def decode(self, messages: PartitionMessages, positions: Sequence[int]) -> Decoded:
        """Decode the messages at ``positions`` (non-empty payloads; every message for an upsert table)."""
        ...

    def document(self, messages: PartitionMessages, position: int) -> dict[str, Any]:
        """Decode one message the reference way; raises MessageError or RetryableError."""
        ...


def decode_error(reason: str) -> MessageError:
    return MessageError("deserialize", reason)


def hex_bytes(data: bytes) -> str:
    return " ".join(f"0x{byte:02x}" for byte in data) or "nothing"


def utf8_reason(data: bytes, what: str = "payload") -> str:
    """'invalid UTF-8 at byte N' for the first bad byte of ``data`` (which must hold one)."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"{what} is not valid UTF-8: {exc.reason} at byte {exc.start}"
    return f"{what} is not valid UTF-8"  # pragma: no cover - callers only ask about invalid data


def gunzip(payload: bytes) -> bytes:
    """The decompressed payload; MessageError when it is not gzip or inflates beyond 64 MiB."""
    if payload[:2] != b"\x1f\x8b":
        raise decode_error(f"payload is not gzip: it starts with {hex_bytes(payload[:2])}, expected 0x1f 0x8b")
    pieces: list[bytes] = []
    total = 0
    rest = payload
    while rest:  # a gzip stream may hold several members (concatenated files)
        inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        try:
            # max_length caps the output, so a bomb never allocates more than the cap.
            piece = inflater.decompress(rest, MAX_DECOMPRESSED_BYTES + 1 - total)
        except zlib.error as exc:
            raise decode_error(f"payload is not gzip: {exc}") from exc
        total += len(piece)
        if total > MAX_DECOMPRESSED_BYTES or inflater.unconsumed_tail:
            raise decode_error(f"gzip payload inflates beyond {MAX_DECOMPRESSED_BYTES // (1024 * 1024)} MiB")
        if not inflater.eof:
            raise decode_error("payload is not gzip: the gzip stream is truncated")
        pieces.append(piece)
        rest = inflater.unused_data
        if rest and rest[:2] != b"\x1f\x8b":
            raise decode_error(f"payload is not gzip: {len(rest)} bytes of garbage after the gzip stream")
    return b"".join(pieces)


def split_confluent(payload: bytes) -> int:
    """The schema id of a Confluent wire-format payload (the datum starts at byte 5)."""
    if payload[:1] != b"\x00":
        raise decode_error(f"not Confluent wire format: magic byte {hex_bytes(payload[:1])}, expected 0x00")
    if len(payload) < CONFLUENT_HEADER_BYTES:
        raise decode_error(f"truncated: {len(payload)} bytes, the Confluent header needs {CONFLUENT_HEADER_BYTES}")
    return cast(int, struct.unpack_from(">I", payload, 1)[0])


def payload_at(messages: PartitionMessages, position: int) -> bytes:
    payload = messages.payloads[position]
    if payload is None:  # the pipeline skips tombstones before us; a None here is a caller bug
        raise decode_error("payload is empty (a tombstone)")
    return payload


KeyDecoder = Callable[[bytes], Any]


def _decode_key(decoder: KeyDecoder, raw: bytes | None) -> Any:
    if raw is None:
        return None
    try:
        return decoder(raw)
    except MessageError as exc:
        raise decode_error(f"key: {exc.reason}") from exc


class BaseDeserializer:
    """Keys and the decode skeleton shared by every format."""

    typed = False

    def __init__(self, keys: KeyDecoder | None) -> None:
        self._keys = keys

    def set_read_schema(self, schema: pa.Schema, table_schema: pa.Schema | None = None) -> None:
        """Avro and Protobuf read what their schema says; JSON and raw override this."""

    def decode(self, messages: PartitionMessages, positions: Sequence[int]) -> Decoded:
        keys: list[Any] | None = None
        failures: list[tuple[int, MessageError]] = []
        todo: Sequence[int] = sorted(positions)  # ``fast`` comes out ascending whatever the order given
        if self._keys is not None:
            keys = [None] * len(messages)
            ordered, todo = todo, []
            for position in ordered:
                try:
                    keys[position] = _decode_key(self._keys, messages.key(position))
                except MessageError as exc:
                    failures.append((position, exc))
                    continue
                todo.append(position)
        decoded = self._decode_values(messages, todo)
        decoded.keys = keys
        decoded.typed = self.typed
        if failures:
            decoded.failures = sorted(failures + decoded.failures, key=lambda failure: failure[0])
        return decoded

    def document(self, messages: PartitionMessages, position: int) -> dict[str, Any]:
        if self._keys is not None:
            # Same outcome as decode: a message whose key cannot be decoded is a dead letter.
            _decode_key(self._keys, messages.key(position))
        return self._document(payload_at(messages, position))

    def _decode_values(self, messages: PartitionMessages, positions: Sequence[int]) -> Decoded:
        raise NotImplementedError

    def _document(self, payload: bytes) -> dict[str, Any]:
        raise NotImplementedError


def document_depth(value: Any) -> int:
    """Nesting depth of dicts and lists (1 for a flat record)."""
    deepest = 0
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict):
            children: Iterable[Any] = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        pending.extend((child, depth + 1) for child in children)
    return deepest


def in_position_order(table: pa.Table, fast: list[int], pieces: int) -> tuple[pa.Table, list[int]]:
    """Rows sorted by message position (pieces of several groups or reads may interleave; one piece
    is in order by construction)."""
    if pieces < 2 or all(earlier < later for earlier, later in itertools.pairwise(fast)):
        return table, fast
    order = sorted(range(len(fast)), key=fast.__getitem__)
    return table.take(pa.array(order, pa.int64())), [fast[i] for i in order]


def join_compatible(
    pieces: list[tuple[list[int], pa.Table]],
) -> tuple[list[tuple[list[int], pa.Table]], list[list[int]]]:
    """Pieces whose schemas unify (permissive promotion), in input order, and the chunks of the rest.

    The largest piece goes first, so a conflict costs the fewest rows; ties go to the earlier piece.
    """
    if len(pieces) < 2:
        return pieces, []
    order = sorted(range(len(pieces)), key=lambda i: (-len(pieces[i][0]), i))
    schema = pieces[order[0]][1].schema
    kept = {order[0]}
    rejected: list[list[int]] = []
    for i in order[1:]:
        try:
            schema = pa.unify_schemas([schema, pieces[i][1].schema], promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            rejected.append(pieces[i][0])
            continue
        kept.add(i)
    joined = [pieces[i] for i in sorted(kept)]
    try:
        pa.concat_tables([table for _, table in joined], promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        # Schemas unify but a value does not cast: keep only the largest piece.
        largest = order[0]
        return [pieces[largest]], [pieces[i][0] for i in sorted(kept) if i != largest] + rejected
    return joined, rejected
