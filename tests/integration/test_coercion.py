"""Coercion end to end: one table with a column of every type, valid and invalid JSON values."""

import datetime as dt
import json
from decimal import Decimal

from tests.support.harness import Message

SCHEMA = {
    "id": "string not null",
    "b": "byte",
    "s": "short",
    "i": "int",
    "l": "long",
    "f": "float",
    "d": "double",
    "flag": "boolean",
    "text": "string",
    "price": "decimal(10,2)",
    "huge": "decimal(38,0)",
    "day": "date",
    "ts": "timestamp",
    "ntz": "timestamp_ntz",
    "epoch": "timestamp",
    "blob": "binary",
    "user": "struct<id:long,tags:array<string>>",
    "scores": "map<string,long>",
}
GOOD = {
    "id": "good",
    "b": -128,
    "s": "32767",
    "i": 7.0,
    "l": 9223372036854775807,
    "f": 1.5,
    "d": "2.25",
    "flag": "TRUE",
    "text": {"nested": [1, True]},
    "price": "12345678.90",
    "huge": 12345678901234567890123456789012345678,
    "day": "2026-11-22",
    "ts": "2026-11-22T10:00:00.1234567+05:30",
    "ntz": "2026-11-22 10:00:00.5",
    "epoch": 1_763_805_600_000,
    "blob": "AAEC",
    "user": {"id": 1, "tags": ["a", 2], "extra": "dropped"},
    "scores": {"x": 1, "y": "2"},
}
BAD = {  # column → a value that does not fit it
    "b": 128,
    "i": 1.5,
    "l": 9223372036854775808,
    "flag": 1,
    "price": "1.005",
    "huge": "1e39",
    "day": "2026-02-30",
    "ts": "yesterday",
    "blob": "not base64!",
    "user": "not an object",
    "scores": ["not", "an", "object"],
}


def test_every_column_type_valid_and_invalid(setup_factory, daemon_factory) -> None:
    setup = setup_factory(1, schema=SCHEMA, metadata_columns=None)  # rows compared column for column
    messages = [Message(0, json.dumps(GOOD).encode())]
    messages += [
        Message(0, json.dumps({"id": f"bad-{column}", column: value}).encode()) for column, value in BAD.items()
    ]
    setup.topic.produce_messages(messages)
    daemon = daemon_factory(setup, "--until-caught-up")
    assert daemon.wait(120) == 0, daemon.log()[-3000:]

    [row] = setup.rows()
    assert row == {
        "id": "good",
        "b": -128,
        "s": 32767,
        "i": 7,
        "l": 9223372036854775807,
        "f": 1.5,
        "d": 2.25,
        "flag": True,
        "text": '{"nested":[1,true]}',
        "price": Decimal("12345678.90"),
        "huge": Decimal("12345678901234567890123456789012345678"),
        "day": dt.date(2026, 11, 22),
        "ts": dt.datetime(2026, 11, 22, 4, 30, 0, 123456, tzinfo=dt.UTC),
        "ntz": dt.datetime(2026, 11, 22, 10, 0, 0, 500000),
        "epoch": dt.datetime(2025, 11, 22, 10, 0, tzinfo=dt.UTC),
        "blob": b"\x00\x01\x02",
        "user": {"id": 1, "tags": ["a", "2"]},
        "scores": [("x", 1), ("y", 2)],
    }
    letters = {r["offset"]: r for r in setup.dead_letters()}
    assert sorted(letters) == list(range(1, 1 + len(BAD)))
    for offset, column in enumerate(BAD, start=1):
        letter = letters[offset]
        assert letter["stage"] == "coerce", letter
        assert f"column '{column}" in letter["error"], (column, letter["error"])
