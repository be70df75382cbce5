"""Checks that a decoder's column lane gives every message the outcome of the per-message lane it stands in for
(Avro's and Protobuf's lanes): the same row values, or the same dead letter with the same reason."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
from hypothesis import event
from hypothesis import strategies as st

from kafka2delta.serialization import Decoded
from tests.support.serialization import check_partition, confluent

CORRUPTIONS = st.one_of(
    *[st.just(("keep", 0))] * 8,
    st.tuples(st.just("truncate"), st.integers(1, 12)),
    st.tuples(st.just("trail"), st.integers(1, 255)),
    st.tuples(st.just("flip"), st.integers(0, 2**16)),
    st.tuples(st.just("schema"), st.sampled_from([2, 99])),  # the other registered schema, an unknown one
    st.tuples(st.just("magic"), st.integers(1, 255)),
    st.tuples(st.just("varint"), st.integers(0, 3)),  # an over-long varint in front of the datum
)


def corrupt(payload: bytes, corruption: tuple[str, int]) -> bytes:
    how, n = corruption
    header, datum = payload[:5], payload[5:]
    if how == "truncate":
        return payload[: max(len(payload) - n, 0)]
    if how == "trail":
        return payload + bytes([n]) * (1 + n % 3)
    if how == "flip" and datum:
        i = n % len(datum)
        return header + datum[:i] + bytes([datum[i] ^ (1 + n % 255)]) + datum[i + 1 :]
    if how == "schema":
        return confluent(n, datum)
    if how == "magic":
        return bytes([n]) + payload[1:]
    if how == "varint":
        return header + b"\xff" * (10 + n) + b"\x01" + datum
    return payload


def outcomes(decoded: Decoded, count: int) -> Iterator[tuple[int, str, Any]]:
    rows = dict(zip(decoded.fast, decoded.table.to_pylist(), strict=True))
    dead = {position: error.reason for position, error in decoded.failures}
    for position in range(count):
        if position in dead:
            yield position, "dead", dead[position]
        elif position in rows:
            yield position, "row", rows[position]
        else:
            yield position, "row", decoded.documents[position]


def same(left: Any, right: Any) -> bool:
    """Equality where NaN equals NaN."""
    if isinstance(left, float) and isinstance(right, float) and math.isnan(left) and math.isnan(right):
        return True
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(same(left[k], right[k]) for k in left)
    if isinstance(left, list | tuple) and isinstance(right, list | tuple):
        return len(left) == len(right) and all(same(a, b) for a, b in zip(left, right, strict=True))
    return bool(left == right)


def assert_agree(batch: Decoded, reference: Decoded, payloads: list[bytes]) -> None:
    """Each message has the same outcome in both, and the tables are identical."""
    check_partition(batch, len(payloads))
    for got, expected in zip(outcomes(batch, len(payloads)), outcomes(reference, len(payloads)), strict=True):
        assert got[:2] == expected[:2], (payloads[got[0]], got, expected)
        assert same(got[2], expected[2]), (payloads[got[0]], got, expected)
    assert batch.fast == reference.fast
    assert identical(batch.table, reference.table)


def note_lane(decoded: Decoded) -> None:
    event(f"column lane used: {any(position not in decoded.documents for position in decoded.fast)}")


def identical(left: pa.Table, right: pa.Table) -> bool:
    """Same schema and values, floats compared bit for bit (NaN payloads included)."""
    if left.schema != right.schema:
        return False
    while any(pa.types.is_struct(f.type) for f in left.schema):
        left, right = left.flatten(), right.flatten()
    for a, b in zip(left.columns, right.columns, strict=True):
        if pa.types.is_floating(a.type):
            a, b = a.combine_chunks(), b.combine_chunks()
            width = "<u4" if a.type == pa.float32() else "<u8"
            valid = np.asarray(a.is_valid())
            if not (valid == np.asarray(b.is_valid())).all():
                return False
            if not (
                a.to_numpy(zero_copy_only=False).view(width)[valid]
                == b.to_numpy(zero_copy_only=False).view(width)[valid]
            ).all():
                return False
        elif not a.equals(b):
            return False
    return True
