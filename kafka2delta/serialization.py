"""Deserializers: payload bytes (and keys) of many messages → documents (stage ``deserialize``).

Two lanes, one contract:

* :meth:`Deserializer.decode` — the fast lane: one Arrow table for the batch (JSON through Arrow's
  C++ reader, Avro/Protobuf records converted with their writer schema's Arrow type). Messages it
  cannot put in the table go to ``documents`` (decoded the slow way) or ``failures`` (dead letters).
* :meth:`Deserializer.document` — the reference lane: one message → one dict of Python values.

A message's outcome (dead letter or not, and its values) depends only on the message itself, never
on its neighbours in the batch, so a replay after a crash gives the same result. The *lane* a valid
message takes may depend on its neighbours in one case: two messages whose values give one field
incompatible Arrow types (JSON: an unknown field that is a string here and a number there; Avro/
Protobuf: two schema versions that changed a field's type) cannot share a table, so one side is sent
to the reference lane. Its values are the same either way (the coercion stage fits both lanes to the
table identically).

A registry outage is a :class:`RetryableError` (raised, never a dead letter); an unknown schema id,
a wrong magic byte, truncated bytes, invalid UTF-8, invalid JSON or a non-object JSON value are
:class:`MessageError` (stage ``deserialize``).

Formats:

* ``json``: one JSON object per message; Arrow's JSON reader in one call per clean batch, bad
  messages found by bisection; the reference lane is orjson (the standard ``json`` module when orjson
  is absent, and for payloads with integers beyond 64 bits, which orjson would turn into floats).
* ``avro``: Confluent wire format through the registry (writer schema by id, optional reader schema
  file), or bare datums written with ``format.avro_schema_file``; :func:`avro_to_arrow` gives the types.
* ``protobuf``: Confluent wire format through the registry; the ``.proto`` text is compiled by protoc
  (bundled in ``grpcio-tools``) once per schema id; :func:`protobuf_to_arrow` gives the types.
* ``raw``: the payload as one column (UTF-8 text or bytes).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import datetime as dt
import decimal
import functools
import importlib
import io
import itertools
import json
import math
import os
import re
import struct
import tempfile
import uuid
import zlib
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

import fastavro
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json
from fastavro._read_common import SchemaResolutionError
from fastavro._read_py import schemaless_reader as _py_schemaless_reader
from fastavro.schema import SchemaParseException
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # type: ignore[import-untyped]
from google.protobuf.descriptor import FieldDescriptor as F  # type: ignore[import-untyped]
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]

from kafka2delta.batches import PartitionMessages, isolate_failures
from kafka2delta.coercions import ExactFloat
from kafka2delta.config import FormatConfig
from kafka2delta.errors import ConfigError, MessageError
from kafka2delta.registry import RegisteredSchema, SchemaRegistry

try:  # orjson is optional: about 3x faster than json for the reference lane, and stricter (see parse_json)
    import orjson as _orjson
except ImportError:  # pragma: no cover - exercised only where orjson is not installed
    _orjson = None  # type: ignore[assignment]

STAGE = "deserialize"
# fastavro reports a malformed schema ({"type": "array"} without items, null …) as KeyError/TypeError too.
_AVRO_SCHEMA_ERRORS = (ValueError, KeyError, TypeError, AttributeError, SchemaParseException)
MAX_DOCUMENT_DEPTH = 64
"""Deepest nesting of objects/arrays (records, lists, maps) a message may have; deeper is a dead letter
(the later stages walk documents recursively, and real events nest a handful of levels)."""
MAX_DECOMPRESSED_BYTES = 64 * 1024 * 1024
GZIP_ROUND_BYTES = 128 * 1024 * 1024
"""At most this many gunzipped bytes are held at once while a batch is read (it is read in rounds)."""
"""Largest gunzipped payload accepted (a gzip bomb is a dead letter, not an out-of-memory)."""
_HEADER = 5  # magic byte + 4-byte big-endian schema id
_BOM = b"\xef\xbb\xbf"
# Significant digits a double always round-trips; a longer JSON number keeps its text (ExactFloat).
_DOUBLE_DIGITS = 15
# An integer orjson may have read as a float (19+ digits: beyond the 64-bit range), or a number with
# more significant digits than a double keeps: the json module then reads them exactly.
_LONG_DIGITS = re.compile(rb"\d{19}|\d[\d.]{16}")
_ADDRESS = re.compile(r" (object )?at 0x[0-9a-fA-F]+")


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


class Deserializer(Protocol):
    def set_read_schema(self, schema: pa.Schema, table_schema: pa.Schema | None = None) -> None:
        """The fields (and their Arrow types) the JSON fast lane should read; the rest is inferred or
        ignored by format. ``table_schema`` is the table's own (raw reads its column's type there).
        Called at start and whenever the table schema changes."""
        ...

    def decode(self, messages: PartitionMessages, positions: Sequence[int]) -> Decoded:
        """Decode the messages at ``positions`` (non-empty payloads)."""
        ...

    def document(self, messages: PartitionMessages, position: int) -> dict[str, Any]:
        """Decode one message the reference way; raises MessageError or RetryableError."""
        ...


def build_deserializer(format: FormatConfig, registry: SchemaRegistry | None, topic: str) -> Deserializer:
    """The deserializer for ``[format]``; ConfigError when the configuration cannot work
    (an unreadable ``avro_schema_file``, protobuf or Avro keys without a registry)."""
    keys = _build_key_decoder(format, registry)
    if format.type == "json":
        return JsonDeserializer(keys, gzip=format.gzip)
    if format.type == "raw":
        return RawDeserializer(keys, column=format.raw_column, gzip=format.gzip)
    if format.type == "avro":
        reader = load_avro_schema_file(format.avro_schema_file) if format.avro_schema_file else None
        if registry is None and reader is None:
            raise ConfigError("format.type", "avro needs schema_registry.url or format.avro_schema_file")
        return AvroDeserializer(keys, _AvroCodec(registry, reader), topic=topic)
    if format.type == "protobuf":
        if registry is None:
            raise ConfigError("format.type", "protobuf needs schema_registry.url (Confluent wire format)")
        return ProtobufDeserializer(keys, _ProtoCodec(registry), topic=topic)
    raise ConfigError("format.type", f"unknown format {format.type!r}")


# --- shared pieces -------------------------------------------------------------------------------


def _error(reason: str) -> MessageError:
    return MessageError(STAGE, reason)


def _hex(data: bytes) -> str:
    return " ".join(f"0x{byte:02x}" for byte in data) or "nothing"


def _utf8_reason(data: bytes, what: str = "payload") -> str:
    """'invalid UTF-8 at byte N' for the first bad byte of ``data`` (which must hold one)."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"{what} is not valid UTF-8: {exc.reason} at byte {exc.start}"
    return f"{what} is not valid UTF-8"  # pragma: no cover - callers only ask about invalid data


def gunzip(payload: bytes) -> bytes:
    """The decompressed payload; MessageError when it is not gzip or inflates beyond 64 MiB."""
    if payload[:2] != b"\x1f\x8b":
        raise _error(f"payload is not gzip: it starts with {_hex(payload[:2])}, expected 0x1f 0x8b")
    pieces: list[bytes] = []
    total = 0
    rest = payload
    while rest:  # a gzip stream may hold several members (concatenated files)
        inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        try:
            # max_length caps the output, so a bomb never allocates more than the cap.
            piece = inflater.decompress(rest, MAX_DECOMPRESSED_BYTES + 1 - total)
        except zlib.error as exc:
            raise _error(f"payload is not gzip: {exc}") from exc
        total += len(piece)
        if total > MAX_DECOMPRESSED_BYTES or inflater.unconsumed_tail:
            raise _error(f"gzip payload inflates beyond {MAX_DECOMPRESSED_BYTES // (1024 * 1024)} MiB")
        if not inflater.eof:
            raise _error("payload is not gzip: the gzip stream is truncated")
        pieces.append(piece)
        rest = inflater.unused_data
        if rest and rest[:2] != b"\x1f\x8b":
            raise _error(f"payload is not gzip: {len(rest)} bytes of garbage after the gzip stream")
    return b"".join(pieces)


def parse_json(data: bytes) -> Any:
    """One JSON value (any kind) from ``data``, the reference way; MessageError when it is not one.

    orjson decides validity when installed (strict UTF-8, no NaN/Infinity, no lone surrogates, depth
    1024); it reads integers beyond 64 bits as floats, so a payload holding a run of 19+ digits is
    re-read with the ``json`` module for exact integers (decimal(38,0) columns need them). Without
    orjson the ``json`` module does everything, with NaN/Infinity and overflowing numbers rejected.
    A leading UTF-8 byte-order mark is skipped (RFC 8259 lets a parser ignore it).
    """
    if data.startswith(_BOM):
        data = data[len(_BOM) :]
    if _orjson is not None:
        try:
            value = _orjson.loads(data)
        except _orjson.JSONDecodeError as exc:
            raise _error(_orjson_reason(data, exc)) from exc
        if _LONG_DIGITS.search(data) is None:
            return value
    return _parse_json_stdlib(data)


def _orjson_reason(data: bytes, exc: ValueError) -> str:
    text = str(exc)
    if "UTF-8" in text:
        return _utf8_reason(data)
    if text.startswith("input data is empty") or not data.strip():
        return "payload holds no JSON value"
    return f"invalid JSON: {text}"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    number = float(text)
    if math.isinf(number):
        raise ValueError(f"number {text} is too large for a double")
    mantissa = text.lower().partition("e")[0].lstrip("-").replace(".", "").lstrip("0")
    if len(mantissa) > _DOUBLE_DIGITS:
        return ExactFloat(text)  # a decimal column takes the text, as Arrow's reader does
    return number


def _parse_json_stdlib(data: bytes) -> Any:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _error(_utf8_reason(data)) from exc
    if not text.strip():
        raise _error("payload holds no JSON value")
    try:
        return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except RecursionError as exc:
        raise _error("invalid JSON: nested too deeply") from exc
    except ValueError as exc:  # json.JSONDecodeError and the two hooks above
        raise _error(f"invalid JSON: {exc}") from exc


def _json_kind(value: Any) -> str:
    if isinstance(value, list):
        return "a JSON array"
    if isinstance(value, str):
        return "a JSON string"
    if isinstance(value, bool):
        return "a JSON boolean"
    if value is None:
        return "JSON null"
    return "a JSON number"


def parse_json_object(data: bytes) -> dict[str, Any]:
    value = parse_json(data)
    if not isinstance(value, dict):
        raise _error(f"payload is {_json_kind(value)}, not an object")
    if _depth(value) > MAX_DOCUMENT_DEPTH:
        raise _error(f"the JSON value is nested deeper than {MAX_DOCUMENT_DEPTH} levels")
    return value


def split_confluent(payload: bytes) -> int:
    """The schema id of a Confluent wire-format payload (the datum starts at byte 5)."""
    if payload[:1] != b"\x00":
        raise _error(f"not Confluent wire format: magic byte {_hex(payload[:1])}, expected 0x00")
    if len(payload) < _HEADER:
        raise _error(f"truncated: {len(payload)} bytes, the Confluent header needs {_HEADER}")
    return cast(int, struct.unpack_from(">I", payload, 1)[0])


def _payload(messages: PartitionMessages, position: int) -> bytes:
    payload = messages.payloads[position]
    if payload is None:  # the pipeline skips tombstones before us; a None here is a caller bug
        raise _error("payload is empty (a tombstone)")
    return payload


# --- keys ----------------------------------------------------------------------------------------


_KeyDecoder = Callable[[bytes], Any]


def _build_key_decoder(format: FormatConfig, registry: SchemaRegistry | None) -> _KeyDecoder | None:
    if format.key == "none":
        return None
    if format.key == "string":
        return _string_key
    if format.key == "json":
        return parse_json
    if format.key == "avro":
        if registry is None:
            raise ConfigError("format.key", "avro keys need schema_registry.url")
        codec = _AvroCodec(registry, None)
        return codec.read_any
    raise ConfigError("format.key", f"unknown key format {format.key!r}")


def _string_key(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _error(_utf8_reason(raw, "key")) from exc


def _decode_key(decoder: _KeyDecoder, raw: bytes | None) -> Any:
    if raw is None:
        return None
    try:
        return decoder(raw)
    except MessageError as exc:
        raise _error(f"key: {exc.reason}") from exc


class _Base:
    """Keys and the decode skeleton shared by every format."""

    typed = False

    def __init__(self, keys: _KeyDecoder | None) -> None:
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
        return self._document(_payload(messages, position))

    def _decode_values(self, messages: PartitionMessages, positions: Sequence[int]) -> Decoded:
        raise NotImplementedError

    def _document(self, payload: bytes) -> dict[str, Any]:
        raise NotImplementedError


# --- JSON ----------------------------------------------------------------------------------------


class _RowCountMismatch(ValueError):
    """The reader returned more or fewer rows than messages: two objects in one payload, or an
    unterminated object swallowing its neighbour. Bisection then finds the payload at fault."""


def json_readable(schema: pa.Schema) -> pa.Schema:
    """``schema`` without the fields Arrow's JSON reader cannot read (maps, at any depth)."""
    fields = [readable for f in schema if (readable := _json_readable_field(f)) is not None]
    return pa.schema(fields)


def _json_readable_field(f: pa.Field) -> pa.Field | None:
    data_type = f.type
    if pa.types.is_map(data_type):
        return None
    if pa.types.is_struct(data_type):
        children = [child for c in data_type if (child := _json_readable_field(c)) is not None]
        return f.with_type(pa.struct(children))
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        item = _json_readable_field(data_type.value_field)
        return None if item is None else f.with_type(pa.list_(item))
    return f


def _has_nonfinite(data: pa.ChunkedArray | pa.Array) -> bool:
    """True when a floating-point value (at any depth) is NaN or ±Infinity. Iterative: a deeply
    nested message must not exhaust the Python stack."""
    pending: list[pa.ChunkedArray | pa.Array] = [data]
    while pending:
        item = pending.pop()
        data_type = item.type
        chunks = item.chunks if isinstance(item, pa.ChunkedArray) else [item]
        if pa.types.is_floating(data_type):
            if pc.any(pc.invert(pc.is_finite(item))).as_py():
                return True
        elif pa.types.is_struct(data_type):
            pending.extend(child for chunk in chunks for child in chunk.flatten())
        elif pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
            pending.extend(chunk.flatten() for chunk in chunks)
    return False


def _type_depth(schema: pa.Schema) -> int:
    """How deeply the columns of ``schema`` nest (1 for flat columns)."""
    deepest = 0
    pending = [(f.type, 1) for f in schema]
    while pending:
        data_type, depth = pending.pop()
        deepest = max(deepest, depth)
        if pa.types.is_struct(data_type):
            pending.extend((f.type, depth + 1) for f in data_type)
        elif pa.types.is_list(data_type) or pa.types.is_large_list(data_type) or pa.types.is_map(data_type):
            pending.append((data_type.value_type if not pa.types.is_map(data_type) else data_type.item_type, depth + 1))
    return deepest


class JsonDeserializer(_Base):
    """One JSON object per message (``format.type = "json"``).

    Fast lane: the payloads joined with newlines, read by ``pyarrow.json.read_json`` in one call
    with the read schema (known columns) and ``unexpected_field_behavior="infer"`` (unknown fields
    come back with inferred types). The read is one block on one thread: with several blocks Arrow
    reconciles a field inferred as a number in one block and a string in another by reading both as
    strings, which would make a message's value depend on its neighbours; in one block it is an
    error, resolved below.

    When a read fails, the batch is bisected (``k`` bad messages cost about ``k·log2(n)`` reads;
    see :meth:`_isolate` for two shortcuts). A message that fails *alone* goes to the reference
    lane: a document when :func:`parse_json_object` accepts it (``{"amount": "12"}`` for a double
    column, an epoch number in a timestamp column read as a string, a duplicated key, a UTF-8 BOM),
    a dead letter with the reference lane's reason when it does not. So a message's outcome is
    decided by whether it parses alone, whatever its neighbours.

    Pieces that parse alone but whose inferred types conflict (``{"x": "a"}`` then ``{"x": 1}``,
    ``x`` unknown) are concatenated with permissive promotion (int64 + double → double, null + T →
    T); pieces that cannot join the largest compatible set go to the reference lane.

    Where Arrow is more lenient than JSON or than itself, :meth:`_read_chunk` refuses the read so
    the message is isolated: invalid UTF-8 (Arrow copies string bytes unchecked), NaN/Infinity, a
    top-level ``null`` (read as a row of nulls), arrays Arrow builds invalid (``[null, null]`` in an
    unknown field). Unknown fields keep Arrow's inference (``typed = False``): ISO-8601 strings
    without fractional seconds become timestamp[s], integers beyond 64 bits become doubles.
    """

    def __init__(self, keys: _KeyDecoder | None, *, gzip: bool = False) -> None:
        super().__init__(keys)
        self._gzip = gzip
        self.set_read_schema(pa.schema([]))
        self.reads = 0
        """Arrow reads so far (tests check that bisection stays bounded)."""

    def set_read_schema(self, schema: pa.Schema, table_schema: pa.Schema | None = None) -> None:
        self._read_schema = json_readable(schema)
        self._parse_options = pa_json.ParseOptions(
            explicit_schema=self._read_schema, unexpected_field_behavior="infer", newlines_in_values=True
        )

    def _document(self, payload: bytes) -> dict[str, Any]:
        return parse_json_object(gunzip(payload) if self._gzip else payload)

    def _decode_values(self, messages: PartitionMessages, positions: Sequence[int]) -> Decoded:
        failures: list[tuple[int, MessageError]] = []
        raw = messages.payloads
        maybe = [raw[p] for p in positions]
        if self._gzip:
            return self._decode_gzipped(messages, positions)
        if None in maybe:
            kept: list[int] = []
            payloads: list[bytes] = []
            for position in positions:
                try:
                    payloads.append(_payload(messages, position))
                except MessageError as exc:
                    failures.append((position, exc))
                    continue
                kept.append(position)
            positions = kept
        else:
            payloads = cast(list[bytes], maybe)
        decoded = self._read(payloads, positions)
        if failures:
            decoded.failures = sorted(failures + decoded.failures, key=lambda failure: failure[0])
        return decoded

    def _decode_gzipped(self, messages: PartitionMessages, positions: Sequence[int]) -> Decoded:
        """Gunzip and read in rounds of at most GZIP_ROUND_BYTES decompressed: a batch of small
        payloads that inflate enormously must not all be held inflated at once."""
        failures: list[tuple[int, MessageError]] = []
        rounds: list[Decoded] = []
        kept: list[int] = []
        payloads: list[bytes] = []
        held = 0
        for position in positions:
            try:
                payload = gunzip(_payload(messages, position))
            except MessageError as exc:
                failures.append((position, exc))
                continue
            if payloads and held + len(payload) > GZIP_ROUND_BYTES:
                rounds.append(self._read(payloads, kept))
                kept, payloads, held = [], [], 0
            kept.append(position)
            payloads.append(payload)
            held += len(payload)
        rounds.append(self._read(payloads, kept))
        decoded = rounds[0] if len(rounds) == 1 else self._merge_rounds(messages, rounds)
        decoded.failures = sorted(failures + decoded.failures, key=lambda failure: failure[0])
        return decoded

    def _merge_rounds(self, messages: PartitionMessages, rounds: list[Decoded]) -> Decoded:
        """One Decoded from several reads; rows whose inferred types do not join the first round's
        take the reference lane (a lane, not an outcome, so nothing changes for the message)."""
        merged = Decoded(table=rounds[0].table, fast=list(rounds[0].fast), typed=False)
        for decoded in rounds:
            merged.documents.update(decoded.documents)
            merged.failures.extend(decoded.failures)
        for decoded in rounds[1:]:
            try:
                merged.table = pa.concat_tables([merged.table, decoded.table], promote_options="permissive")
                merged.fast.extend(decoded.fast)
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                for position in decoded.fast:
                    try:
                        merged.documents[position] = self.document(messages, position)
                    except MessageError as exc:  # pragma: no cover - the fast lane read it already
                        merged.failures.append((position, exc))
        return merged

    def _read(self, payloads: list[bytes], positions: Sequence[int]) -> Decoded:
        indices = list(range(len(payloads)))
        deep: list[int] = []
        if payloads and max(map(len, payloads)) > MAX_ARROW_JSON_DEPTH:
            # Arrow's parser recurses on the C stack: ~10,000 levels crash the process. Only a
            # payload longer than the limit can nest deeper; those that do never reach Arrow.
            deep = [i for i in indices if _nests_deeper(payloads[i], MAX_ARROW_JSON_DEPTH)]
            if deep:
                indices = [i for i in indices if i not in set(deep)]
        pieces, alone, refused = self._isolate(payloads, indices)
        alone = sorted(alone + deep)
        documents: dict[int, dict[str, Any]] = {positions[index]: document for index, document in refused.items()}
        failures: list[tuple[int, MessageError]] = []
        for index in alone:
            # Arrow refused it on its own: the reference lane decides (document or dead letter).
            try:
                documents[positions[index]] = parse_json_object(payloads[index])
            except MessageError as exc:
                failures.append((positions[index], exc))
        pieces, conflicting = _join_compatible(pieces)
        for chunk in conflicting:
            for index in chunk:
                try:
                    documents[positions[index]] = parse_json_object(payloads[index])
                except MessageError as exc:  # Arrow read it, but the reference lane has the last word
                    failures.append((positions[index], exc))
        failures.sort(key=lambda failure: failure[0])
        if pieces:
            tables = [table for _, table in pieces]
            table = tables[0] if len(tables) == 1 else pa.concat_tables(tables, promote_options="permissive")
        else:
            table = self._read_schema.empty_table()
        fast = [positions[index] for chunk, _ in pieces for index in chunk]
        table, fast = _in_position_order(table, fast, len(pieces))
        return Decoded(table=table, fast=fast, documents=documents, failures=failures, typed=False)

    def _isolate(
        self, payloads: list[bytes], indices: list[int]
    ) -> tuple[list[tuple[list[int], pa.Table]], list[int], dict[int, dict[str, Any]]]:
        """Bisection (as :func:`isolate_failures`) with two shortcuts that reach the same outcome.

        Returns the pieces Arrow read (in order), the indices Arrow refuses alone, and the documents
        of indices known to be refused alone without reading them alone.

        1. Arrow's error names a row ("Column(/ts) changed from string to number in row 17",
           "Invalid value. in row 3"): while a batch has shown fewer than :data:`_SCREEN_AFTER`
           failures, that message is tried alone and the rest re-read, so one bad message costs
           three reads instead of ~2·log2(n).
        2. A message whose document gives a *known* column a value of the wrong JSON kind (a number
           for a string column, a string for a double column …) is refused by Arrow alone whatever
           its neighbours (:meth:`_refused_alone`), so it needs no alone read. Once a batch has shown
           :data:`_SCREEN_AFTER` failures, a failing chunk is screened for those once, message by
           message: 10,000 epoch-number timestamps then cost a few reads and one orjson parse each
           instead of ~20,000 reads.

        Either way a message is in the table exactly when Arrow reads it alone (and its piece
        concatenates), so the outcome does not depend on the neighbours or on these shortcuts.
        """
        good: list[tuple[list[int], pa.Table]] = []
        alone: list[int] = []
        refused: dict[int, dict[str, Any]] = {}
        pending: list[tuple[list[int], bool]] = [(indices, False)]
        found = 0
        hints = _SCREEN_AFTER  # a wrong hint costs a read: a few per batch at most
        while pending:
            chunk, screened = pending.pop()
            if not chunk:
                continue
            try:
                good.append((chunk, self._read_chunk([payloads[i] for i in chunk])))
                continue
            except (pa.ArrowInvalid, ValueError, UnicodeDecodeError) as exc:
                error = exc
            if len(chunk) == 1:
                alone.append(chunk[0])
                found += 1
                continue
            hint = _ROW_HINT.search(str(error))
            # Row 0 of every read is the leading empty object (see _read_chunk).
            row = int(hint.group(1)) - 1 if hint else -1
            if hints > 0 and found < _SCREEN_AFTER and 0 <= row < len(chunk):
                # Few failures so far: try the message the error names, then re-read the others.
                hints -= 1
                suspect = chunk[row]
                document = self._refused_alone(payloads[suspect])
                if document is not None:
                    refused[suspect] = document
                    found += 1
                    pending.append((chunk[:row] + chunk[row + 1 :], screened))
                    continue
                try:
                    piece = self._read_chunk([payloads[suspect]])
                except (pa.ArrowInvalid, ValueError, UnicodeDecodeError):
                    alone.append(suspect)
                    found += 1
                    pending.append((chunk[:row] + chunk[row + 1 :], screened))
                    continue
                # A wrong hint (the row was not the culprit alone): keep the piece, bisect the rest.
                good.append(([suspect], piece))
                chunk = chunk[:row] + chunk[row + 1 :]
                if len(chunk) == 1:
                    pending.append((chunk, screened))
                    continue
            if found >= _SCREEN_AFTER and not screened:
                # Many failures: set aside every certain mismatch of the chunk at once.
                rest: list[int] = []
                for index in chunk:
                    document = self._refused_alone(payloads[index])
                    if document is None:
                        rest.append(index)
                    else:
                        refused[index] = document
                        found += 1
                pending.append((rest, True))
                continue
            middle = len(chunk) // 2
            # Push the second half first so the first half is handled first: order is kept.
            pending.append((chunk[middle:], screened))
            pending.append((chunk[:middle], screened))
        good.sort(key=lambda piece: piece[0][0])
        alone.sort()
        return good, alone, refused

    def _refused_alone(self, payload: bytes) -> dict[str, Any] | None:
        """The document of a message Arrow certainly refuses alone (a known column's value has the
        wrong JSON kind for its read type), else None (not valid JSON, or no such mismatch)."""
        try:
            document = parse_json_object(payload)
        except MessageError:
            return None
        for name, value in document.items():
            index = self._read_schema.get_field_index(name)
            if index >= 0 and _kind_mismatch(value, self._read_schema.field(index).type):
                return document
        return None

    def _read_chunk(self, chunk: list[bytes]) -> pa.Table:
        self.reads += 1
        # The first value is an empty object: pyarrow 26's JSON reader crashes the process (SIGSEGV)
        # when the first value of its input is ``null``, and a lone ``null`` payload must not do that.
        data = b"\n".join([b"{}", *chunk])
        if not data.isascii():
            # Arrow's reader copies string bytes without checking them; invalid UTF-8 must not reach
            # the table. UnicodeDecodeError makes bisection find the message.
            data.decode("utf-8")
        # One block: the whole chunk is parsed as one sequence of JSON values, so pretty-printed
        # payloads need no newline scan (newlines_in_values only matters between blocks; True keeps
        # that safe should a reader ever split the block).
        table = pa_json.read_json(
            pa.BufferReader(data),
            read_options=pa_json.ReadOptions(block_size=len(data) + 1, use_threads=False),
            parse_options=self._parse_options,
        )
        if table.num_rows != len(chunk) + 1:
            raise _RowCountMismatch(f"payloads held {table.num_rows - 1} JSON values for {len(chunk)} messages")
        table = table.slice(1)
        # pyarrow 26 builds invalid arrays for some inferred list<null> values ([null, null] gives a
        # child shorter than the offsets say); a full validation (~0.4 ms per 10,000 events) keeps
        # them out of the table: such a message is isolated and takes the reference lane.
        table.validate(full=True)
        # Later stages walk documents recursively in Python: deeper messages are dead letters, decided
        # by the reference lane, which counts each message's own depth.
        if _type_depth(table.schema) > MAX_DOCUMENT_DEPTH:
            raise ValueError(f"nested deeper than {MAX_DOCUMENT_DEPTH} levels")
        # Arrow reads NaN and Infinity, which are not JSON (the reference lane refuses them). A float
        # can only be non-finite through those literals; checking the float columns is cheaper than
        # searching the bytes.
        if any(_has_nonfinite(column) for column in table.columns):
            raise ValueError("NaN or Infinity is not a JSON number")
        # Arrow also reads a top-level ``null`` as a row of nulls; the reference lane refuses it.
        for row in _all_null_rows(table):
            if chunk[row].lstrip(b" \t\r\n").startswith(b"null"):
                raise ValueError("payload is JSON null, not an object")
        return table


def _all_null_rows(table: pa.Table) -> list[int]:
    """Rows whose every top-level column is null (``{}``, ``{"a": null}`` … and ``null``)."""
    if table.num_columns == 0:
        return list(range(table.num_rows))
    mask: Any = None
    for column in table.columns:
        if column.null_count == 0:
            return []
        nulls = pc.is_null(column)
        mask = nulls if mask is None else pc.and_(mask, nulls)
    return cast(list[int], pc.indices_nonzero(mask).to_pylist())


MAX_ARROW_JSON_DEPTH = 1000
"""Payloads nesting deeper than this take the reference lane (orjson refuses beyond 1024)."""
_JSON_SIGNIFICANT = re.compile(rb'[\[\]{}"\\]')
_SCAN_BUDGET = 200_000


def _nests_deeper(payload: bytes, limit: int) -> bool:
    """True when ``payload`` may nest arrays/objects deeper than ``limit`` (never False when it does).

    Follows what a parser descends into: brackets inside strings do not count, and nothing after
    an unterminated string does either (a parser stops there). Linear in the payload's length.
    """
    if len(payload) <= limit or payload.count(b"[") + payload.count(b"{") <= limit:
        return False
    depth = 0
    in_string = False
    escaped = -1
    for seen, match in enumerate(_JSON_SIGNIFICANT.finditer(payload)):
        if seen > _SCAN_BUDGET:
            return True  # too long to scan in Python: erring on the safe side costs only the slow lane
        at = match.start()
        if at == escaped:
            continue
        char = payload[at]
        if in_string:
            if char == 0x5C:  # backslash: the next byte is escaped
                escaped = at + 1
            elif char == 0x22:
                in_string = False
        elif char == 0x22:
            in_string = True
        elif char in b"[{":
            depth += 1
            if depth > limit:
                return True
        elif char in b"]}":
            depth = max(depth - 1, 0)
    return False


_ROW_HINT = re.compile(r" in row (\d+)$")
_SCREEN_AFTER = 8
"""Failures found in one batch after which failing chunks are screened message by message."""


def _kind_mismatch(value: Any, data_type: pa.DataType) -> bool:
    """True when Arrow's JSON reader certainly refuses ``value`` (as orjson decoded it) for a column
    read as ``data_type``. Only JSON-kind conflicts count; False means "maybe fine"."""
    if value is None:
        return False
    if pa.types.is_string(data_type) or pa.types.is_large_string(data_type):
        return not isinstance(value, str)
    if pa.types.is_boolean(data_type):
        return not isinstance(value, bool)
    if pa.types.is_integer(data_type):
        # Arrow refuses 1.0 and 1e3 for an integer column as well as other kinds.
        return isinstance(value, (bool, float, str, dict, list))
    if pa.types.is_floating(data_type):
        return isinstance(value, (bool, str, dict, list))
    if pa.types.is_struct(data_type):
        if not isinstance(value, dict):
            return True
        for name, item in value.items():
            index = data_type.get_field_index(name)
            if index >= 0 and _kind_mismatch(item, data_type.field(index).type):
                return True
        return False
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        if not isinstance(value, list):
            return True
        return any(_kind_mismatch(item, data_type.value_type) for item in value)
    return False


def _in_position_order(table: pa.Table, fast: list[int], pieces: int) -> tuple[pa.Table, list[int]]:
    """Rows sorted by message position (pieces of several groups or reads may interleave; one piece
    is in order by construction)."""
    if pieces < 2 or all(earlier < later for earlier, later in itertools.pairwise(fast)):
        return table, fast
    order = sorted(range(len(fast)), key=fast.__getitem__)
    return table.take(pa.array(order, pa.int64())), [fast[i] for i in order]


def _join_compatible(
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


# --- raw -----------------------------------------------------------------------------------------


class RawDeserializer(_Base):
    """The payload as one column: UTF-8 text for a string column, the bytes for a binary column."""

    typed = True

    def __init__(self, keys: _KeyDecoder | None, *, column: str = "value", gzip: bool = False) -> None:
        super().__init__(keys)
        self._column = column
        self._gzip = gzip
        self._type: pa.DataType = pa.string()

    def set_read_schema(self, schema: pa.Schema, table_schema: pa.Schema | None = None) -> None:
        # The JSON read schema maps binary columns to base64 text: the table says what the column is.
        schema = table_schema if table_schema is not None else schema
        index = schema.get_field_index(self._column)
        found = schema.field(index).type if index >= 0 else pa.string()
        binary = pa.types.is_binary(found) or pa.types.is_large_binary(found) or pa.types.is_fixed_size_binary(found)
        self._type = pa.binary() if binary else pa.string()

    def _document(self, payload: bytes) -> dict[str, Any]:
        data = gunzip(payload) if self._gzip else payload
        if self._type == pa.binary():
            return {self._column: data}
        try:
            return {self._column: data.decode("utf-8")}
        except UnicodeDecodeError as exc:
            raise _error(_utf8_reason(data)) from exc

    def _decode_values(self, messages: PartitionMessages, positions: Sequence[int]) -> Decoded:
        failures: list[tuple[int, MessageError]] = []
        fast: list[int] = []
        values: list[bytes] = []
        for position in positions:
            try:
                payload = _payload(messages, position)
                values.append(gunzip(payload) if self._gzip else payload)
            except MessageError as exc:
                failures.append((position, exc))
                continue
            fast.append(position)
        column = pa.array(values, pa.binary())
        if self._type == pa.string():
            try:
                column = column.cast(pa.string())  # Arrow validates all the UTF-8 at once
            except pa.ArrowInvalid:
                # Some payload is not UTF-8: find which, one by one, and name the byte.
                kept_positions: list[int] = []
                texts: list[str] = []
                for position, value in zip(fast, values, strict=True):
                    try:
                        texts.append(value.decode("utf-8"))
                    except UnicodeDecodeError:
                        failures.append((position, _error(_utf8_reason(value))))
                        continue
                    kept_positions.append(position)
                fast, column = kept_positions, pa.array(texts, pa.string())
                failures.sort(key=lambda failure: failure[0])
        table = pa.table({self._column: column})
        return Decoded(table=table, fast=fast, failures=failures, typed=True)


# --- typed formats: shared fast lane -------------------------------------------------------------


_Convert = Callable[[Any], Any]


@dataclass
class _Shape:
    """What a writer (or reader) schema gives the fast lane."""

    arrow: pa.DataType
    """The Arrow type of a decoded value (a struct for a record/message)."""
    fix: _Convert | None
    """Turns the decoder's Python value into the document's (time → microseconds, UUID → text …);
    None when the decoder's values are already right."""
    slow: bool
    """The type has no faithful Arrow type (a union of several types, a recursive type): every
    message goes to the reference lane; ``arrow`` then types those fields as string."""


@dataclass
class _Group:
    shape: _Shape
    positions: list[int] = field(default_factory=list)
    values: list[dict[str, Any]] = field(default_factory=list)


def _grouped_decode(
    messages: PartitionMessages,
    positions: Sequence[int],
    read: Callable[[bytes], tuple[Hashable, _Shape, dict[str, Any]]],
) -> Decoded:
    """Decode each message with ``read`` (→ writer-schema key, its shape, the record), grouped by writer."""
    groups: dict[Hashable, _Group] = {}
    failures: list[tuple[int, MessageError]] = []
    for position in positions:
        try:
            key, shape, value = read(_payload(messages, position))
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
    joined, _ = _join_compatible(pieces)
    if not joined:
        return Decoded(table=pa.table({}), fast=[], documents=documents, failures=failures, typed=True)
    tables = [table for _, table in joined]
    table = tables[0] if len(tables) == 1 else pa.concat_tables(tables, promote_options="permissive")
    fast = [position for chunk, _ in joined for position in chunk]
    table, fast = _in_position_order(table, fast, len(joined))
    return Decoded(table=table, fast=fast, documents=documents, failures=failures, typed=True)


def _time_micros(value: Any) -> Any:
    if isinstance(value, dt.time):
        return ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + value.microsecond
    return value


def _uuid_text(value: Any) -> Any:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, bytes) and len(value) == 16:
        return str(uuid.UUID(bytes=value))
    return value


def _decimal_text(value: Any) -> Any:
    return format(value, "f") if isinstance(value, decimal.Decimal) else value


def _generic_fix(value: Any) -> Any:
    """The fixes of :func:`avro_to_arrow` applied by Python type, for values of no fixed shape."""
    if isinstance(value, dict):
        return {key: _generic_fix(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_generic_fix(item) for item in value]
    if isinstance(value, dt.time):
        return _time_micros(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    return value


def _fix_list(item_fix: _Convert) -> _Convert:
    def fix(values: list[Any]) -> list[Any]:
        return [None if item is None else item_fix(item) for item in values]

    return fix


def _fix_map(value_fix: _Convert) -> _Convert:
    def fix(values: dict[str, Any]) -> dict[str, Any]:
        return {key: None if item is None else value_fix(item) for key, item in values.items()}

    return fix


def _fix_record(field_fixes: list[tuple[str, _Convert]]) -> _Convert:
    def fix(record: dict[str, Any]) -> dict[str, Any]:
        for name, field_fix in field_fixes:
            item = record.get(name)
            if item is not None:
                record[name] = field_fix(item)
        return record

    return fix


# --- Avro ----------------------------------------------------------------------------------------

_AVRO_PRIMITIVES: dict[str, pa.DataType] = {
    "null": pa.null(),
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "bytes": pa.binary(),
    "string": pa.string(),
}
# What fastavro may raise on bytes that are not a datum of the schema (truncated, garbage, a
# writer/reader pair that does not resolve, a date out of Python's range …).
_AVRO_ERRORS: tuple[type[Exception], ...] = (
    EOFError,
    ValueError,
    IndexError,
    KeyError,
    TypeError,
    OverflowError,
    UnicodeDecodeError,
    SchemaResolutionError,
)


def avro_to_arrow(schema: Any) -> pa.DataType:
    """The Arrow type of values of an Avro schema (JSON text, a dict/list, or a type name).

    record → struct (fields in schema order); ``["null", T]`` (either order) → T (every Arrow field
    is nullable); enum, string, uuid → string; bytes, fixed → binary; int → int32; long → int64;
    float → float32; double → float64; boolean → bool; array → list; map → map<string, V>;
    date → date32; timestamp-millis/micros → timestamp(us, UTC); local-timestamp-millis/micros →
    timestamp(us); decimal (precision ≤ 38) → decimal128(p, s), wider → string; time-millis/micros →
    int64 microseconds since midnight. A union of several non-null types and a recursive reference
    have no faithful Arrow type: string (their messages take the reference lane).
    """
    if isinstance(schema, str):
        with contextlib.suppress(ValueError):  # else a bare type name such as "string"
            schema = json.loads(schema)
    return AvroSchema.parse(schema).shape().arrow


class _AvroShapes:
    def __init__(self, named: Mapping[str, Any]) -> None:
        self._named = named
        self.recursive = False
        """Set when the schema contains itself (see :data:`MAX_AVRO_DEPTH`)."""

    def shape(self, schema: Any, stack: tuple[str, ...] = ()) -> _Shape:
        if isinstance(schema, str):
            if schema in _AVRO_PRIMITIVES:
                return _Shape(_AVRO_PRIMITIVES[schema], None, False)
            if schema in stack:  # a record that contains itself
                self.recursive = True
                return _Shape(pa.string(), _generic_fix, True)
            return self.shape(self._named[schema], stack)
        if isinstance(schema, list):
            branches = [branch for branch in schema if branch != "null"]
            if not branches:
                return _Shape(pa.null(), None, False)
            if len(branches) == 1:
                return self.shape(branches[0], stack)
            return _Shape(pa.string(), _generic_fix, True)
        kind = schema["type"]
        logical = self._logical(schema, kind)
        if logical is not None:
            return logical
        if kind in ("record", "error"):
            name = schema["name"]
            inner = (*stack, name)
            fields: list[pa.Field] = []
            fixes: list[tuple[str, _Convert]] = []
            slow = False
            for item in schema["fields"]:
                child = self.shape(item["type"], inner)
                fields.append(pa.field(item["name"], child.arrow))
                slow = slow or child.slow
                if child.fix is not None:
                    fixes.append((item["name"], child.fix))
            return _Shape(pa.struct(fields), _fix_record(fixes) if fixes else None, slow)
        if kind == "enum":
            return _Shape(pa.string(), None, False)
        if kind == "fixed":
            return _Shape(pa.binary(), None, False)
        if kind == "array":
            item_shape = self.shape(schema["items"], stack)
            fix = _fix_list(item_shape.fix) if item_shape.fix else None
            return _Shape(pa.list_(item_shape.arrow), fix, item_shape.slow)
        if kind == "map":
            value_shape = self.shape(schema["values"], stack)
            fix = _fix_map(value_shape.fix) if value_shape.fix else None
            return _Shape(pa.map_(pa.string(), value_shape.arrow), fix, value_shape.slow)
        return self.shape(kind, stack)  # {"type": "string"} and {"type": "<named type>"}

    @staticmethod
    def _logical(schema: Mapping[str, Any], kind: Any) -> _Shape | None:
        logical = schema.get("logicalType")
        if logical is None:
            return None
        # A logical type on the wrong base type is ignored, as the Avro specification says.
        if logical == "date" and kind == "int":
            return _Shape(pa.date32(), None, False)
        if logical in ("timestamp-millis", "timestamp-micros") and kind == "long":
            return _Shape(pa.timestamp("us", "UTC"), None, False)
        if logical in ("local-timestamp-millis", "local-timestamp-micros") and kind == "long":
            return _Shape(pa.timestamp("us"), None, False)
        if (logical, kind) in (("time-millis", "int"), ("time-micros", "long")):
            # Delta has no time type: microseconds since midnight.
            return _Shape(pa.int64(), _time_micros, False)
        if logical == "uuid" and kind in ("string", "fixed"):
            return _Shape(pa.string(), _uuid_text, False)
        if logical == "decimal" and kind in ("bytes", "fixed"):
            precision = int(schema.get("precision", 0))
            scale = int(schema.get("scale", 0))
            if 0 < precision <= 38 and 0 <= scale <= precision:
                return _Shape(pa.decimal128(precision, scale), None, False)
            return _Shape(pa.string(), _decimal_text, False)
        return None


@dataclass(frozen=True)
class AvroSchema:
    """A parsed Avro schema and the named types it can refer to."""

    parsed: Any
    named: Mapping[str, Any]

    @staticmethod
    def parse(schema: Any, named: dict[str, Any] | None = None) -> AvroSchema:
        """Parse JSON-decoded ``schema``; ``named`` holds types defined by referenced schemas."""
        named = {} if named is None else named
        return AvroSchema(fastavro.parse_schema(schema, named_schemas=named), named)

    def shape(self) -> _Shape:
        return _AvroShapes(self.named).shape(self.parsed)

    @property
    def recursive(self) -> bool:
        shapes = _AvroShapes(self.named)
        shapes.shape(self.parsed)
        return shapes.recursive


def load_avro_schema_file(path: str) -> AvroSchema:
    """The parsed ``format.avro_schema_file``; ConfigError naming the key when it cannot be used."""
    key = "format.avro_schema_file"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(key, f"cannot read {path}: {exc}") from exc
    try:
        return AvroSchema.parse(json.loads(text))
    except _AVRO_SCHEMA_ERRORS as exc:
        raise ConfigError(key, f"{path} is not an Avro schema: {exc!r}") from exc


@dataclass
class _AvroWriter:
    """A writer schema (by registry id, or the schema file for bare datums) and how to read with it."""

    parsed: Any
    reader: Any
    """The reader schema to resolve to (None: read with the writer schema as it is)."""
    shape: _Shape
    is_record: bool
    kind: str
    recursive: bool = False
    """The writer schema contains itself: read with fastavro's pure-Python reader, depth-limited."""


@dataclass
class _Broken:
    """A schema id that can never decode (not Avro, not parseable): every message is a dead letter."""

    reason: str


MAX_AVRO_DEPTH = MAX_DOCUMENT_DEPTH
"""Deepest nesting (records, arrays, maps) accepted for values of a recursive Avro schema."""
_MAX_SCHEMAS = 1000
"""Compiled schemas kept per deserializer (oldest dropped first; a topic rarely has more ids)."""
_V = TypeVar("_V")


def _remember(cache: dict[int, _V], key: int, value: _V) -> _V:
    cache[key] = value
    while len(cache) > _MAX_SCHEMAS:
        del cache[next(iter(cache))]
    return value


class _AvroCodec:
    """Reads Avro datums: Confluent-framed through the registry, or bare with the schema file."""

    def __init__(self, registry: SchemaRegistry | None, reader: AvroSchema | None) -> None:
        self._registry = registry
        self._reader = reader
        self._reader_shape = reader.shape() if reader is not None else None
        self._bare: _AvroWriter | None = None
        if registry is None:
            if reader is None or self._reader_shape is None:
                raise ConfigError("format.avro_schema_file", "bare Avro datums need the schema file")
            self._bare = _AvroWriter(
                reader.parsed,
                None,
                self._reader_shape,
                _is_record(reader.parsed),
                _kind(reader.parsed),
                reader.recursive,
            )
        self._writers: dict[int, _AvroWriter | _Broken] = {}

    def writer(self, payload: bytes) -> tuple[int, int, _AvroWriter]:
        """(schema id, offset of the datum, writer) of a payload."""
        if self._registry is None:
            assert self._bare is not None
            return 0, 0, self._bare
        schema_id = split_confluent(payload)
        writer = self._writers.get(schema_id)
        if writer is None:
            # A registry outage (RetryableError) or an unknown id (MessageError, remembered by the
            # registry client for a minute only) propagates and is not cached here.
            writer = _remember(self._writers, schema_id, self._load(self._registry, schema_id))
        if isinstance(writer, _Broken):
            raise _error(writer.reason)
        return schema_id, _HEADER, writer

    def _load(self, registry: SchemaRegistry, schema_id: int) -> _AvroWriter | _Broken:
        registered = registry.schema(schema_id)
        if registered.schema_type != "AVRO":
            return _Broken(f"schema id {schema_id} is a {registered.schema_type} schema, not AVRO")
        named: dict[str, Any] = {}
        try:
            self._load_references(registry, registered, named, set())
            writer = AvroSchema.parse(json.loads(registered.schema), named)
        except _AVRO_SCHEMA_ERRORS as exc:
            return _Broken(f"schema id {schema_id} is not a valid Avro schema: {exc!r}")
        if self._reader is None or self._reader_shape is None:
            parsed = writer.parsed
            return _AvroWriter(parsed, None, writer.shape(), _is_record(parsed), _kind(parsed), writer.recursive)
        reader = self._reader.parsed
        # Resolving a schema to itself only costs time.
        resolve_to = None if _same_schema(writer.parsed, reader) else reader
        recursive = writer.recursive or self._reader.recursive
        return _AvroWriter(writer.parsed, resolve_to, self._reader_shape, _is_record(reader), _kind(reader), recursive)

    def _load_references(
        self, registry: SchemaRegistry, schema: RegisteredSchema, named: dict[str, Any], seen: set[tuple[str, int]]
    ) -> None:
        """Named types defined in referenced subjects, parsed before the schema that uses them."""
        for reference in schema.references:
            key = (reference.subject, reference.version)
            if key in seen:
                continue
            seen.add(key)
            referenced = registry.referenced(reference.subject, reference.version)
            self._load_references(registry, referenced, named, seen)
            AvroSchema.parse(json.loads(referenced.schema), named)

    def read(self, payload: bytes) -> tuple[int, _AvroWriter, Any]:
        """(schema id, writer, decoded value with fixes applied)."""
        schema_id, offset, writer = self.writer(payload)
        stream = io.BytesIO(payload)
        stream.seek(offset)
        try:
            if writer.recursive:
                # fastavro's compiled reader recurses on the C stack and crashes the process a few
                # thousand levels down; the pure-Python one raises RecursionError (~200 levels), and
                # the depth check below makes the limit the same whatever the caller's stack.
                value = _py_schemaless_reader(stream, writer.parsed, writer.reader)
                if _depth(value) > MAX_AVRO_DEPTH:
                    raise RecursionError
            else:
                value = fastavro.schemaless_reader(stream, writer.parsed, writer.reader)
        except RecursionError as exc:
            raise _error(f"the Avro value is nested deeper than {MAX_AVRO_DEPTH} levels") from exc
        except _AVRO_ERRORS as exc:
            raise _error(_avro_reason(exc, len(payload) - offset)) from exc
        if stream.tell() != len(payload):
            raise _error(f"{len(payload) - stream.tell()} trailing bytes after the Avro datum")
        if writer.shape.fix is not None:
            value = writer.shape.fix(value)
        return schema_id, writer, value

    def read_any(self, payload: bytes) -> Any:
        return self.read(payload)[2]

    def read_record(self, payload: bytes) -> tuple[int, _AvroWriter, dict[str, Any]]:
        schema_id, writer, value = self.read(payload)
        if not writer.is_record:
            raise _error(f"the Avro value is a {writer.kind}, not a record")
        return schema_id, writer, value


def _depth(value: Any) -> int:
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


def _avro_reason(exc: Exception, size: int) -> str:
    """A reason that names the problem and is the same on every replay (no object addresses)."""
    if isinstance(exc, EOFError):
        return f"truncated Avro datum: the schema needs more than its {size} bytes"
    if isinstance(exc, UnicodeDecodeError):
        return f"an Avro string is not valid UTF-8: {exc.reason} at byte {exc.start} of the string"
    text = _ADDRESS.sub("", str(exc))
    if isinstance(exc, SchemaResolutionError):
        return f"the writer schema does not resolve to the reader schema: {text}"
    return f"not a valid Avro datum: {type(exc).__name__}: {text}"


def _kind(schema: Any) -> str:
    if isinstance(schema, dict):
        return str(schema.get("type"))
    if isinstance(schema, list):
        return "union"
    return str(schema)


def _is_record(schema: Any) -> bool:
    return isinstance(schema, dict) and schema.get("type") in ("record", "error")


def _same_schema(left: Any, right: Any) -> bool:
    try:
        return bool(fastavro.schema.to_parsing_canonical_form(left) == fastavro.schema.to_parsing_canonical_form(right))
    except (ValueError, KeyError, TypeError, SchemaParseException):
        return False


class AvroDeserializer(_Base):
    """Avro records: Confluent wire format through the registry, or bare datums of the schema file.

    Fast lane: messages grouped by writer schema id, each decoded to a dict with fastavro, then one
    ``pa.array(dicts, type=struct)`` per group (the type from :func:`avro_to_arrow` of the reader
    schema, or of the writer schema without one); groups are concatenated with promotion, so a v1
    row lacks v2's new field (null). Every dict is also a document.
    """

    typed = True

    def __init__(self, keys: _KeyDecoder | None, codec: _AvroCodec, *, topic: str = "") -> None:
        super().__init__(keys)
        self._codec = codec
        self.topic = topic

    def _document(self, payload: bytes) -> dict[str, Any]:
        return self._codec.read_record(payload)[2]

    def _decode_values(self, messages: PartitionMessages, positions: Sequence[int]) -> Decoded:
        def read(payload: bytes) -> tuple[Hashable, _Shape, dict[str, Any]]:
            schema_id, writer, value = self._codec.read_record(payload)
            return schema_id, writer.shape, value

        return _grouped_decode(messages, positions, read)


# --- Protobuf ------------------------------------------------------------------------------------


def _read_varint(data: bytes, offset: int) -> tuple[int, int]:
    """A zigzag varint at ``offset``: (value, next offset)."""
    result = 0
    shift = 0
    while True:
        if offset >= len(data):
            raise _error("truncated: the Confluent message-index array ends early")
        byte = data[offset]
        offset += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            break
        shift += 7
        if shift > 63:
            raise _error("not Confluent wire format: a message index varint is longer than 10 bytes")
    return (result >> 1) ^ -(result & 1), offset


def read_message_indexes(payload: bytes, offset: int = _HEADER) -> tuple[tuple[int, ...], int]:
    """The Confluent message-index path after the header, and the offset of the message bytes.

    A count (zigzag varint) then that many indexes; a count of 0 means ``[0]``, the first message
    type of the file.
    """
    count, offset = _read_varint(payload, offset)
    if count == 0:
        return (0,), offset
    if count < 0 or count > len(payload):  # every index takes at least one byte
        raise _error(f"not Confluent wire format: message-index count {count}")
    indexes: list[int] = []
    for _ in range(count):
        index, offset = _read_varint(payload, offset)
        indexes.append(index)
    return tuple(indexes), offset


_WRAPPERS = {
    "google.protobuf.DoubleValue": pa.float64(),
    "google.protobuf.FloatValue": pa.float32(),
    "google.protobuf.Int64Value": pa.int64(),
    "google.protobuf.UInt64Value": pa.decimal128(20, 0),
    "google.protobuf.Int32Value": pa.int32(),
    "google.protobuf.UInt32Value": pa.int64(),
    "google.protobuf.BoolValue": pa.bool_(),
    "google.protobuf.StringValue": pa.string(),
    "google.protobuf.BytesValue": pa.binary(),
}
_TIMESTAMP = "google.protobuf.Timestamp"
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _proto_scalar_types() -> dict[int, pa.DataType]:
    return {
        F.TYPE_DOUBLE: pa.float64(),
        F.TYPE_FLOAT: pa.float32(),
        F.TYPE_INT64: pa.int64(),
        F.TYPE_SINT64: pa.int64(),
        F.TYPE_SFIXED64: pa.int64(),
        F.TYPE_UINT64: pa.decimal128(20, 0),
        F.TYPE_FIXED64: pa.decimal128(20, 0),
        F.TYPE_INT32: pa.int32(),
        F.TYPE_SINT32: pa.int32(),
        F.TYPE_SFIXED32: pa.int32(),
        F.TYPE_UINT32: pa.int64(),
        F.TYPE_FIXED32: pa.int64(),
        F.TYPE_BOOL: pa.bool_(),
        F.TYPE_STRING: pa.string(),
        F.TYPE_BYTES: pa.binary(),
        F.TYPE_ENUM: pa.string(),
    }


def _is_repeated(f: Any) -> bool:
    repeated = getattr(f, "is_repeated", None)  # protobuf ≥ 6; older versions only have ``label``
    if repeated is not None:
        return bool(repeated)
    return bool(f.label == f.LABEL_REPEATED)


def _is_map(f: Any) -> bool:
    return bool(f.message_type is not None and f.message_type.GetOptions().map_entry and _is_repeated(f))


def protobuf_to_arrow(descriptor: Any) -> pa.DataType:
    """The Arrow type of messages of a protobuf ``Descriptor``.

    message → struct (proto field names, declaration order); double → float64; float → float32;
    int32/sint32/sfixed32 → int32; int64/sint64/sfixed64 → int64; uint32/fixed32 → int64;
    uint64/fixed64 → decimal128(20, 0); bool → bool; string → string; bytes → binary; enum →
    string (the value's name); repeated → list; map → map<K, V>; google.protobuf.Timestamp →
    timestamp(us, UTC); the wrapper types (Int64Value …) → their scalar type, null when unset.
    A recursive message has no faithful Arrow type: string (its messages take the reference lane).
    """
    return _ProtoShapes().record(descriptor).arrow


class _ProtoShapes:
    """Arrow types and dict converters per message descriptor, built once per message type."""

    def __init__(self) -> None:
        self._scalars = _proto_scalar_types()

    def shape(self, descriptor: Any, stack: tuple[str, ...] = ()) -> _Shape:
        """The shape of a message-typed field's value (``fix`` converts the message object)."""
        name = descriptor.full_name
        if name in stack:
            return _Shape(pa.string(), None, True)
        if name == _TIMESTAMP:
            return _Shape(pa.timestamp("us", "UTC"), _timestamp, False)
        return self.record(descriptor, stack)

    def record(self, descriptor: Any, stack: tuple[str, ...] = ()) -> _Shape:
        """The struct of a message (also for a top-level Timestamp); ``fix`` converts it to a dict."""
        inner = (*stack, descriptor.full_name)
        fields: list[pa.Field] = []
        getters: list[tuple[str, _Convert]] = []
        slow = False
        for f in descriptor.fields:
            arrow, getter, field_slow = self._field(f, inner)
            fields.append(pa.field(f.name, arrow))
            getters.append((f.name, getter))
            slow = slow or field_slow

        def convert(message: Any) -> dict[str, Any]:
            return {name: getter(message) for name, getter in getters}

        return _Shape(pa.struct(fields), convert, slow)

    def _value(self, f: Any, stack: tuple[str, ...]) -> tuple[pa.DataType, _Convert | None, bool]:
        """The type of one value of ``f`` (an element, for a repeated field) and its converter."""
        if f.type in (F.TYPE_MESSAGE, F.TYPE_GROUP):
            message_type = f.message_type
            wrapped = _WRAPPERS.get(message_type.full_name)
            if wrapped is not None:
                return wrapped, _unwrap, False
            shape = self.shape(message_type, stack)
            if shape.slow and shape.fix is None:  # recursive: no converter of a fixed shape
                return shape.arrow, _proto_generic, True
            return shape.arrow, shape.fix, shape.slow
        if f.type == F.TYPE_ENUM:
            names = {value.number: value.name for value in f.enum_type.values}

            def enum_name(number: int) -> str:
                # An open enum may carry a number this schema does not name: keep the number.
                return names.get(number) or str(number)

            return pa.string(), enum_name, False
        return self._scalars[f.type], None, False

    def _field(self, f: Any, stack: tuple[str, ...]) -> tuple[pa.DataType, _Convert, bool]:
        name = f.name
        if _is_map(f):
            key_field = f.message_type.fields_by_name["key"]
            value_field = f.message_type.fields_by_name["value"]
            key_type, _, _ = self._value(key_field, stack)
            value_type, value_convert, slow = self._value(value_field, stack)
            if value_convert is None:
                return pa.map_(key_type, value_type), lambda m: dict(getattr(m, name)), slow
            convert_value = value_convert
            return (
                pa.map_(key_type, value_type),
                lambda m: {k: convert_value(v) for k, v in getattr(m, name).items()},
                slow,
            )
        value_type, value_convert, slow = self._value(f, stack)
        if _is_repeated(f):
            if value_convert is None:
                return pa.list_(value_type), lambda m: list(getattr(m, name)), slow
            convert_item = value_convert
            return pa.list_(value_type), lambda m: [convert_item(v) for v in getattr(m, name)], slow
        if f.has_presence:
            # Messages, proto3 ``optional``, oneof members and proto2 fields: unset is null.
            convert_set = value_convert or (lambda v: v)
            return value_type, lambda m: convert_set(getattr(m, name)) if m.HasField(name) else None, slow
        if value_convert is None:
            return value_type, lambda m: getattr(m, name), slow
        convert_plain = value_convert
        return value_type, lambda m: convert_plain(getattr(m, name)), slow


def _timestamp(message: Any) -> dt.datetime:
    try:
        return _EPOCH + dt.timedelta(seconds=message.seconds, microseconds=message.nanos // 1000)
    except OverflowError as exc:
        raise _error(f"google.protobuf.Timestamp out of range: {message.seconds} s") from exc


def _unwrap(message: Any) -> Any:
    return message.value


def _proto_generic(message: Any) -> dict[str, Any]:
    """A recursive message → dict, walking the fields at run time (the reference lane only)."""
    converted: dict[str, Any] = {}
    for f in message.DESCRIPTOR.fields:
        converted[f.name] = _proto_generic_field(message, f)
    return converted


def _proto_generic_value(f: Any, value: Any) -> Any:
    if f.type in (F.TYPE_MESSAGE, F.TYPE_GROUP):
        name = f.message_type.full_name
        if name == _TIMESTAMP:
            return _timestamp(value)
        if name in _WRAPPERS:
            return value.value
        return _proto_generic(value)
    if f.type == F.TYPE_ENUM:
        found = f.enum_type.values_by_number.get(value)
        return found.name if found is not None else str(value)
    return value


def _proto_generic_field(message: Any, f: Any) -> Any:
    value = getattr(message, f.name)
    if _is_map(f):
        value_field = f.message_type.fields_by_name["value"]
        return {k: _proto_generic_value(value_field, v) for k, v in value.items()}
    if _is_repeated(f):
        return [_proto_generic_value(f, v) for v in value]
    if f.has_presence and not message.HasField(f.name):
        return None
    return _proto_generic_value(f, value)


@dataclass
class _ProtoMessage:
    cls: Any
    shape: _Shape
    convert: _Convert


@dataclass
class _ProtoFile:
    schema_id: int
    pool: Any
    top: list[Any]
    """Top-level message descriptors, in declaration order (message index 0, 1, …)."""
    messages: dict[tuple[int, ...], _ProtoMessage | _Broken] = field(default_factory=dict)


class _ProtoCodec:
    def __init__(self, registry: SchemaRegistry) -> None:
        self._registry = registry
        self._files: dict[int, _ProtoFile | _Broken] = {}

    def read(self, payload: bytes) -> tuple[tuple[int, tuple[int, ...]], _ProtoMessage, dict[str, Any]]:
        schema_id = split_confluent(payload)
        indexes, offset = read_message_indexes(payload)
        message = self._message(schema_id, indexes)
        try:
            parsed = message.cls.FromString(payload[offset:])
        except (DecodeError, RuntimeError, ValueError) as exc:  # RuntimeError: upb's recursion limit
            raise _error(f"not a valid protobuf message {message.cls.DESCRIPTOR.full_name}: {exc}") from exc
        return (schema_id, indexes), message, message.convert(parsed)

    def _message(self, schema_id: int, indexes: tuple[int, ...]) -> _ProtoMessage:
        loaded = self._files.get(schema_id)
        if loaded is None:
            loaded = _remember(self._files, schema_id, self._load(schema_id))  # RetryableError: not cached
        if isinstance(loaded, _Broken):
            raise _error(loaded.reason)
        found = loaded.messages.get(indexes)
        if found is None:
            found = loaded.messages[indexes] = _resolve_message(loaded, indexes)
        if isinstance(found, _Broken):
            raise _error(found.reason)
        return found

    def _load(self, schema_id: int) -> _ProtoFile | _Broken:
        registered = self._registry.schema(schema_id)
        if registered.schema_type != "PROTOBUF":
            return _Broken(f"schema id {schema_id} is a {registered.schema_type} schema, not PROTOBUF")
        files: dict[str, str] = {}
        main = f"kafka2delta_schema_{schema_id}.proto"
        files[main] = registered.schema
        reason = self._collect_references(registered, files, set())
        if reason is not None:
            return _Broken(f"schema id {schema_id}: {reason}")
        compiled = compile_proto(files, main)
        if isinstance(compiled, str):
            return _Broken(f"schema id {schema_id} does not compile: {compiled}")
        pool, top = compiled
        return _ProtoFile(schema_id, pool, top)

    def _collect_references(
        self, schema: RegisteredSchema, files: dict[str, str], seen: set[tuple[str, int]]
    ) -> str | None:
        for reference in schema.references:
            key = (reference.subject, reference.version)
            if key in seen:
                continue
            seen.add(key)
            path = Path(reference.name)
            if path.is_absolute() or ".." in path.parts:
                return f"reference name {reference.name!r} is not a relative path"
            referenced = self._registry.referenced(reference.subject, reference.version)
            files[reference.name] = referenced.schema
            reason = self._collect_references(referenced, files, seen)
            if reason is not None:
                return reason
        return None


def _resolve_message(loaded: _ProtoFile, indexes: tuple[int, ...]) -> _ProtoMessage | _Broken:
    candidates = loaded.top
    descriptor: Any = None
    for depth, index in enumerate(indexes):
        if not 0 <= index < len(candidates):
            where = "top-level" if depth == 0 else f"nested in {descriptor.full_name}"
            return _Broken(
                f"message index {list(indexes)} does not exist in schema id {loaded.schema_id} "
                f"({len(candidates)} {where} message types)"
            )
        descriptor = candidates[index]
        candidates = list(descriptor.nested_types)
    shape = _ProtoShapes().record(descriptor)
    convert = shape.fix if shape.fix is not None else _proto_generic
    return _ProtoMessage(message_factory.GetMessageClass(descriptor), shape, convert)


def compile_proto(files: Mapping[str, str], main: str) -> tuple[Any, list[Any]] | str:
    """Compile registry protobuf schemas with protoc (in-process, from grpcio-tools) into a new pool.

    ``files`` maps import paths to schemas as the registry holds them: ``.proto`` text (what
    Confluent's registry answers by default), or a base64 ``FileDescriptorProto`` (what the Confluent
    Python serializer registers, and what Apicurio then answers). Descriptors reach protoc through
    ``--descriptor_set_in``; the well-known types (google/protobuf/*.proto) come with grpcio-tools and
    Confluent's built-in imports (confluent/meta.proto …) with confluent-kafka. Returns (pool, the
    top-level message descriptors of ``main`` in declaration order, which the Confluent message
    indexes count), or protoc's error message.
    """
    from grpc_tools import _protoc_compiler  # type: ignore[import-untyped]
    from grpc_tools import protoc as grpc_protoc

    include = str(Path(grpc_protoc.__file__).parent / "_proto")
    texts: dict[str, str] = {}
    compiled = descriptor_pb2.FileDescriptorSet()
    for name, schema in files.items():
        file_proto = _serialized_descriptor(schema)
        if file_proto is None:
            texts[name] = schema
        else:
            file_proto.name = name  # imports name it as the reference does (so does Confluent's client)
            compiled.file.append(file_proto)
    given = set(files)
    compiled.file.extend(proto for proto in _builtin_protos() if proto.name not in given)
    with tempfile.TemporaryDirectory(prefix="k2d-proto-") as directory:
        for name, text in texts.items():
            target = Path(directory, name)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        known = os.path.join(directory, "known-descriptors.pb")
        Path(known).write_bytes(compiled.SerializeToString())
        out = os.path.join(directory, "descriptor-set.pb")
        arguments = [
            b"protoc",
            f"--descriptor_set_in={known}".encode(),
            f"-I{directory}".encode(),
            f"-I{include}".encode(),
            f"--descriptor_set_out={out}".encode(),
            b"--include_imports",
            main.encode(),
        ]
        if _protoc_compiler.run_main(arguments) != 0:
            # run_main only prints its errors; get_protos returns them (file:line:column: message)
            # but knows no descriptor inputs, so it explains errors in sources only.
            try:
                _protoc_compiler.get_protos(main.encode(), [directory.encode(), include.encode()])
            except _protoc_compiler.ProtocErrors as exc:
                return "; ".join(
                    # ProtocError positions are 0-based; editors and protoc's CLI count from 1.
                    f"{_text(e.filename)}:{e.line + 1}:{e.column + 1}: {_text(e.message)}"
                    for e in exc.errors()
                ).replace(directory + os.sep, "")
            return "protoc failed (its message is on standard error)"
        descriptor_set = descriptor_pb2.FileDescriptorSet.FromString(Path(out).read_bytes())
    # A pool per schema id: two versions of one .proto define the same names differently.
    pool = descriptor_pool.DescriptorPool()
    main_proto = None
    for file_proto in descriptor_set.file:  # dependencies first, as protoc writes them
        pool.Add(file_proto)
        if file_proto.name == main:
            main_proto = file_proto
    if main_proto is None:  # pragma: no cover - protoc always includes the file it compiled
        return f"protoc did not describe {main}"
    package = f"{main_proto.package}." if main_proto.package else ""
    top = [pool.FindMessageTypeByName(package + message.name) for message in main_proto.message_type]
    return pool, top


_BASE64 = re.compile(r"[A-Za-z0-9+/=\s]+")


def _serialized_descriptor(schema: str) -> Any:
    """The FileDescriptorProto of a base64-serialized schema, or None for ``.proto`` text."""
    # .proto text always holds a ';' or a '{' (a syntax line, a field); base64 never does.
    if not schema.strip() or not _BASE64.fullmatch(schema):
        return None
    try:
        return descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(schema, validate=False))
    except (binascii.Error, DecodeError, ValueError):
        return None


@functools.cache
def _builtin_protos() -> tuple[Any, ...]:
    """Files Confluent treats as built in (never sent as references): its own confluent/*.proto."""
    found = []
    for module in ("meta_pb2", "type.decimal_pb2", "type.variant_pb2", "types.decimal_pb2"):
        try:
            loaded = importlib.import_module(f"confluent_kafka.schema_registry.confluent.{module}")
        except ImportError:  # an older confluent-kafka: such imports then fail to compile, by name
            continue
        found.append(descriptor_pb2.FileDescriptorProto.FromString(loaded.DESCRIPTOR.serialized_pb))
    return tuple(found)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class ProtobufDeserializer(_Base):
    """Protobuf messages in the Confluent wire format (magic, schema id, message indexes, message)."""

    typed = True

    def __init__(self, keys: _KeyDecoder | None, codec: _ProtoCodec, *, topic: str = "") -> None:
        super().__init__(keys)
        self._codec = codec
        self.topic = topic

    def _document(self, payload: bytes) -> dict[str, Any]:
        return self._codec.read(payload)[2]

    def _decode_values(self, messages: PartitionMessages, positions: Sequence[int]) -> Decoded:
        def read(payload: bytes) -> tuple[Hashable, _Shape, dict[str, Any]]:
            key, message, value = self._codec.read(payload)
            return key, message.shape, value

        return _grouped_decode(messages, positions, read)
