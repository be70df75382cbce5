"""How a Protobuf payload names its message type within its schema, one scheme per wire format.

A schema (a ``.proto`` file) may declare many message types; the bytes between the registry's header and
the message say which one was written:

* Confluent (:data:`CONFLUENT_INDEXES`): a zigzag varint count, then that many zigzag varint indexes, a path
  through the file's top-level message types and their nested types (``[1, 0]``: the first type nested in
  the second top-level one). A count of 0 means ``[0]``.
* AWS Glue (:data:`GLUE_INDEXES`, AWS's serde library): one unsigned varint, the message type's place among
  *all* the file's message types, nested ones included, sorted by full name. For
  ``message B { message C {} message A { message D {} } }``: B = 0, B.A = 1, B.A.D = 2, B.C = 3.

Either way the first message type is written as one ``0`` byte (Confluent: the first top-level type; Glue:
the first name in order), which the column lane of :mod:`kafka2delta.serialization.protobuf` relies on.
Bytes that end early or a varint longer than 10 bytes are :class:`MessageError` (dead letters); an index
the schema does not have is a reason the codec turns into one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from kafka2delta.serialization.base import CONFLUENT_HEADER_BYTES, decode_error


def is_repeated(field: Any) -> bool:
    """Whether a protobuf field descriptor is repeated (shared by the Protobuf modules; this one imports none)."""
    repeated = getattr(field, "is_repeated", None)  # protobuf ≥ 6; older versions only have ``label``
    return bool(repeated) if repeated is not None else bool(field.label == field.LABEL_REPEATED)


class MessageIndexes(Protocol):
    """One wire format's way of naming a message type."""

    def read(self, data: bytes, offset: int) -> tuple[tuple[int, ...], int]:
        """The indexes written at ``offset`` of ``data``, and the offset of the message after them."""
        ...

    def find(self, top: Sequence[Any], indexes: tuple[int, ...], schema: str) -> Any:
        """The message descriptor ``indexes`` names, given the file's top-level message descriptors in declaration
        order; a ``str`` saying why when the file has no such message type (``schema`` names the file in it)."""
        ...


class ConfluentIndexes:
    """Confluent's index path (see the module docstring)."""

    def read(self, data: bytes, offset: int) -> tuple[tuple[int, ...], int]:
        return read_message_indexes(data, offset)

    def find(self, top: Sequence[Any], indexes: tuple[int, ...], schema: str) -> Any:
        candidates = list(top)
        descriptor: Any = None
        for depth, index in enumerate(indexes):
            if not 0 <= index < len(candidates):
                where = "top-level" if depth == 0 else f"nested in {descriptor.full_name}"
                count = f"{len(candidates)} {where} message types"
                return f"message index {list(indexes)} does not exist in {schema} ({count})"
            descriptor = candidates[index]
            candidates = list(descriptor.nested_types)
        return descriptor


class GlueIndexes:
    """Glue's one index into the file's message types sorted by full name (see the module docstring)."""

    def read(self, data: bytes, offset: int) -> tuple[tuple[int, ...], int]:
        index, offset = _read_varint(data, offset, "Glue", "the message index")
        return (index,), offset

    def find(self, top: Sequence[Any], indexes: tuple[int, ...], schema: str) -> Any:
        ordered = glue_message_order(top)
        (index,) = indexes
        if not 0 <= index < len(ordered):
            return f"message index {index} does not exist in {schema} ({len(ordered)} message types)"
        return ordered[index]


CONFLUENT_INDEXES = ConfluentIndexes()
GLUE_INDEXES = GlueIndexes()


def glue_message_order(top: Sequence[Any]) -> list[Any]:
    """Every message type of a file (level by level from ``top``, map entries included as protoc declares them),
    sorted by full name: the order Glue's index counts in. Names are ASCII, so Python's order is Java's."""
    found: list[Any] = []
    level = list(top)
    while level:
        found.extend(level)
        level = [nested for descriptor in level for nested in descriptor.nested_types]
    return sorted(found, key=lambda descriptor: str(descriptor.full_name))


def read_message_indexes(payload: bytes, offset: int = CONFLUENT_HEADER_BYTES) -> tuple[tuple[int, ...], int]:
    """The Confluent message-index path at ``offset`` (after the header), and the offset of the message bytes.

    A count (zigzag varint) then that many indexes; a count of 0 means ``[0]``, the first message
    type of the file.
    """
    count, offset = _read_zigzag(payload, offset)
    if count == 0:
        return (0,), offset
    if count < 0 or count > len(payload):  # every index takes at least one byte
        raise decode_error(f"not Confluent wire format: message-index count {count}")
    indexes: list[int] = []
    for _ in range(count):
        index, offset = _read_zigzag(payload, offset)
        indexes.append(index)
    return tuple(indexes), offset


def _read_zigzag(data: bytes, offset: int) -> tuple[int, int]:
    value, offset = _read_varint(data, offset, "Confluent", "the Confluent message-index array")
    return (value >> 1) ^ -(value & 1), offset


def _read_varint(data: bytes, offset: int, wire: str, what: str) -> tuple[int, int]:
    """An unsigned varint at ``offset`` of ``what`` in ``wire``'s format: (value, next offset)."""
    result = 0
    shift = 0
    while True:
        if offset >= len(data):
            raise decode_error(f"truncated: {what} ends early")
        byte = data[offset]
        offset += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, offset
        shift += 7
        if shift > 63:
            raise decode_error(f"not {wire} wire format: a message index varint is longer than 10 bytes")
