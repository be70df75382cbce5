"""JSON payloads (``format.type = "json"``): one JSON object per message.

The reference lane is :func:`parse_json_object` (orjson; the standard ``json`` module when orjson is
absent, and for payloads with integers beyond 64 bits, which orjson would turn into floats). The fast
lane is Arrow's C++ JSON reader, one call per clean batch, bad messages found by bisection
(:class:`JsonDeserializer`).
"""

from __future__ import annotations

import json
import math
import re
import resource
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from kafka2delta.coercions import ExactFloat
from kafka2delta.errors import MessageError
from kafka2delta.records import PartitionMessages
from kafka2delta.serialization.base import (
    MAX_DOCUMENT_DEPTH,
    BaseDeserializer,
    Decoded,
    KeyDecoder,
    decode_error,
    document_depth,
    gunzip,
    in_position_order,
    join_compatible,
    payload_at,
    utf8_reason,
)

try:  # orjson is optional: about 3x faster than json for the reference lane, and stricter (see parse_json)
    import orjson as _orjson
except ImportError:  # pragma: no cover - exercised only where orjson is not installed
    _orjson = None  # type: ignore[assignment]

GZIP_ROUND_BYTES = 128 * 1024 * 1024
"""At most this many unwrapped (gunzipped, zlib-inflated) bytes are held at once while a batch is read (it is read
in rounds)."""
_BOM = b"\xef\xbb\xbf"
# Significant digits a double always round-trips; a longer JSON number keeps its text (ExactFloat).
_DOUBLE_DIGITS = 15
# An integer orjson may have read as a float (19+ digits: beyond the 64-bit range), or a number with
# more significant digits than a double keeps: the json module then reads them exactly.
_LONG_DIGITS = re.compile(rb"\d{19}|\d[\d.]{16}")


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
            raise decode_error(_orjson_reason(data, exc)) from exc
        if _LONG_DIGITS.search(data) is None:
            return value
    return _parse_json_stdlib(data)


def _orjson_reason(data: bytes, exc: ValueError) -> str:
    text = str(exc)
    if "UTF-8" in text:
        return utf8_reason(data)
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
        raise decode_error(utf8_reason(data)) from exc
    if not text.strip():
        raise decode_error("payload holds no JSON value")
    try:
        return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except RecursionError as exc:
        raise decode_error("invalid JSON: nested too deeply") from exc
    except ValueError as exc:  # json.JSONDecodeError and the two hooks above
        raise decode_error(f"invalid JSON: {exc}") from exc


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
        raise decode_error(f"payload is {_json_kind(value)}, not an object")
    if document_depth(value) > MAX_DOCUMENT_DEPTH:
        raise decode_error(f"the JSON value is nested deeper than {MAX_DOCUMENT_DEPTH} levels")
    return value


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


class JsonDeserializer(BaseDeserializer):
    """One JSON object per message (``format.type = "json"``).

    Fast lane: the payloads joined with newlines, read by ``pyarrow.json.read_json`` in one call
    with the read schema (known columns) and ``unexpected_field_behavior="infer"`` (unknown fields
    come back with inferred types). The read is one block: with several blocks Arrow reconciles a
    field inferred as a number in one block and a string in another by reading both as strings, which
    would make a message's value depend on its neighbours; in one block it is an error, resolved below.
    A large batch is read as two parts on two threads, kept only when that is exactly what one read
    gives (:meth:`_first_read`).

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

    def __init__(
        self, keys: KeyDecoder | None, *, gzip: bool = False, unwrap: Callable[[bytes], bytes] | None = None
    ) -> None:
        """``unwrap``: the JSON text inside each payload (Glue's header taken off, inflated); ``gzip``: gunzip."""
        super().__init__(keys)
        self._unwrap = unwrap or (gunzip if gzip else None)
        self.set_read_schema(pa.schema([]))
        self.reads = 0
        """Arrow reads so far (tests check that bisection stays bounded)."""

    def set_read_schema(self, schema: pa.Schema, table_schema: pa.Schema | None = None) -> None:
        self._read_schema = json_readable(schema)
        self._parse_options = pa_json.ParseOptions(
            explicit_schema=self._read_schema, unexpected_field_behavior="infer", newlines_in_values=True
        )

    def _document(self, payload: bytes) -> dict[str, Any]:
        return parse_json_object(self._unwrap(payload) if self._unwrap else payload)

    def _decode_values(self, messages: PartitionMessages, positions: Sequence[int]) -> Decoded:
        failures: list[tuple[int, MessageError]] = []
        raw = messages.payloads
        maybe = [raw[p] for p in positions]
        if self._unwrap:
            return self._decode_in_rounds(messages, positions, self._unwrap)
        if None in maybe:
            kept: list[int] = []
            payloads: list[bytes] = []
            for position in positions:
                try:
                    payloads.append(payload_at(messages, position))
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

    def _decode_in_rounds(
        self, messages: PartitionMessages, positions: Sequence[int], unwrap: Callable[[bytes], bytes]
    ) -> Decoded:
        """Unwrap and read in rounds of at most GZIP_ROUND_BYTES unwrapped: a batch of small
        payloads that inflate enormously must not all be held inflated at once."""
        failures: list[tuple[int, MessageError]] = []
        rounds: list[Decoded] = []
        kept: list[int] = []
        payloads: list[bytes] = []
        held = 0
        for position in positions:
            try:
                payload = unwrap(payload_at(messages, position))
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
        # Set aside for the reference lane what must never reach Arrow's reader beside other payloads.
        aside: set[int] = set()
        if b"" in payloads or any(map(bytes.isspace, payloads)):
            # A payload holding no JSON value would let one holding two pass the row count of a read, each
            # row after it then landing on the wrong message.
            aside.update(i for i in indices if not payloads[i] or payloads[i].isspace())
        if payloads and max(map(len, payloads)) > MAX_ARROW_JSON_DEPTH:
            # Arrow's parser recurses on the C stack, and deep enough nesting crashes the process. Only
            # a payload longer than the limit can nest deeper; those that do never reach Arrow.
            aside.update(i for i in indices if _nests_deeper(payloads[i], MAX_ARROW_JSON_DEPTH))
        if aside:
            indices = [i for i in indices if i not in aside]
        pieces, alone, refused = self._isolate(payloads, indices)
        alone = sorted([*alone, *aside])
        documents: dict[int, dict[str, Any]] = {positions[index]: document for index, document in refused.items()}
        failures: list[tuple[int, MessageError]] = []
        for index in alone:
            # Arrow refused it on its own: the reference lane decides (document or dead letter).
            try:
                documents[positions[index]] = parse_json_object(payloads[index])
            except MessageError as exc:
                failures.append((positions[index], exc))
        pieces, conflicting = join_compatible(pieces)
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
        table, fast = in_position_order(table, fast, len(pieces))
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

        Either way a message lands where plain bisection would put it, and a message Arrow refuses
        alone never reaches the table.
        """
        good = self._first_read(payloads, indices)
        alone: list[int] = []
        refused: dict[int, dict[str, Any]] = {}
        pending: list[tuple[list[int], bool]] = [] if good else [(indices, False)]
        found = 0
        hints = _SCREEN_AFTER  # a wrong hint costs a read: a few per batch at most
        while pending:
            chunk, screened = pending.pop()
            if not chunk:
                continue
            try:
                good.append((chunk, self._read_chunk([payloads[i] for i in chunk])))
                continue
            except _REFUSALS as exc:
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
                except _REFUSALS:
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

    def _first_read(self, payloads: list[bytes], indices: list[int]) -> list[tuple[list[int], pa.Table]]:
        """The whole batch as one piece, read as parts in parallel, or nothing (read it as one).

        A batch of at least :data:`PARALLEL_READ_MIN_BYTES`, of payloads of
        :data:`PARALLEL_READ_MIN_AVERAGE_BYTES` or more on average, is read as :data:`PARALLEL_READS`
        contiguous parts at once (Arrow parses without the GIL). Their tables stand for the batch only
        when every part reads and they concatenate with no promotion but absent or all-null columns
        (struct fields included): that is the table one read gives. Otherwise (a part fails, or the parts infer
        different types: ``int64`` in one, ``double`` in the other) the batch is read as one and
        bisected as ever, so neither a value nor a lane depends on where the batch was cut.
        """
        size = sum(map(len, map(payloads.__getitem__, indices)))
        if size < max(PARALLEL_READ_MIN_BYTES, PARALLEL_READ_MIN_AVERAGE_BYTES * len(indices)):
            return []
        if len(indices) < PARALLEL_READS or not _parallel_reads_fit():
            return []
        step = -(-len(indices) // PARALLEL_READS)
        parts = [indices[start : start + step] for start in range(0, len(indices), step)]
        self.reads += len(parts)
        futures = [_readers().submit(self._try_parse, [payloads[i] for i in part]) for part in parts]
        tables = [table for table in (future.result() for future in futures) if table is not None]
        if len(tables) < len(parts):
            return []
        try:
            return [(indices, pa.concat_tables(tables, promote_options="default"))]
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            return []

    def _try_parse(self, chunk: list[bytes]) -> pa.Table | None:
        """:meth:`_parse`, None when it refuses the chunk (it runs on a reader thread)."""
        try:
            return self._parse(chunk)
        except _REFUSALS:
            return None

    def _read_chunk(self, chunk: list[bytes]) -> pa.Table:
        self.reads += 1
        return self._parse(chunk)

    def _parse(self, chunk: list[bytes]) -> pa.Table:
        """The table of ``chunk``, one row per payload, or an error among :data:`_REFUSALS`; thread-safe.

        A payload with no JSON value never comes here beside others (:meth:`_read` sets it aside)."""
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
        table = table.slice(1, len(chunk))  # the length too: pyarrow 26 keeps every row of a column-less table
        # Later stages walk documents recursively in Python: deeper messages are dead letters, decided
        # by the reference lane, which counts each message's own depth. Checked before the validation,
        # which recurses on the C stack about twice as deep per level as the parser.
        if _type_depth(table.schema) > MAX_DOCUMENT_DEPTH:
            raise ValueError(f"nested deeper than {MAX_DOCUMENT_DEPTH} levels")
        # pyarrow 26 builds invalid arrays for some inferred list<null> values ([null, null] gives a
        # child shorter than the offsets say); a full validation (~0.4 ms per 10,000 events) keeps
        # them out of the table: such a message is isolated and takes the reference lane.
        table.validate(full=True)
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
"""Payloads nesting deeper than this never reach Arrow: the reference lane decides (orjson refuses beyond
1024 levels, and anything deeper than :data:`MAX_DOCUMENT_DEPTH` is a dead letter either way). Arrow's reader
recurses on the C stack (~0.5 KB per level, measured: a 1-MiB thread stack overflows between 2,000 and 2,500
levels) and its time grows with the square of the depth (70 ms for one payload 1,000 levels deep, 2.3 s at
4,000), so the bound guards both the process and the loop's pace."""
_JSON_SIGNIFICANT = re.compile(rb'[\[\]{}"\\]')
_SCAN_BUDGET = 200_000


def _nests_deeper(payload: bytes, limit: int) -> bool:
    """True when ``payload`` may nest arrays/objects deeper than ``limit`` (never False when it does).

    Follows what a parser descends into: brackets inside strings do not count, and nothing after
    an unterminated string does either (a parser stops there). Linear in the payload's length.
    """
    if len(payload) <= limit:
        return False
    # An array level takes one byte, an object level at least four (`{"":` before its value): one count
    # settles most payloads of a few KB without the scan below.
    arrays = payload.count(b"[")
    if arrays + (len(payload) - arrays) // 4 <= limit:
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


_REFUSALS = (pa.ArrowInvalid, ValueError, UnicodeDecodeError)
"""What a read that Arrow (or a check of :meth:`JsonDeserializer._parse`) refuses raises."""
PARALLEL_READS = 2
"""Parts a large batch is cut into, read at once on as many reader threads (shared by every table)."""
PARALLEL_READ_MIN_BYTES = 1024 * 1024
"""Batches smaller than this are read in one call: the threads' hand-off would cost more than it saves."""
PARALLEL_READ_MIN_AVERAGE_BYTES = 1024
"""Batches of smaller payloads (on average) are read in one call. In process, with the daemon's allocators, parts
cost no CPU and save 42% of the read's time for 2-KB events, 30% for 250-B ones; in the daemon's catch-up on
2 cores, which the broker shares, 2-KB events gained 30-40% throughput at the same CPU per message, while
250-B events gained nothing and cost 8-11% more CPU per message (three alternating runs each)."""


@cache
def _readers() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=PARALLEL_READS, thread_name_prefix="k2d-json")


@cache
def _parallel_reads_fit() -> bool:
    """Whether reader threads have the stack for :data:`MAX_ARROW_JSON_DEPTH` levels with room to spare:
    glibc gives a thread the soft ``RLIMIT_STACK`` (8 MiB as usual; 2 MiB or more when unlimited), and a
    limit under 2 MiB keeps every read on the calling thread, as before the parts existed."""
    soft, _ = resource.getrlimit(resource.RLIMIT_STACK)
    return soft == resource.RLIM_INFINITY or soft >= 2 * 1024 * 1024


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
