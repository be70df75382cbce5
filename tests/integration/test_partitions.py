"""Partitioned tables: partition columns of several types, filled by transforms, with null values."""

import datetime as dt
import json
from typing import Any

import pyarrow as pa

from tests.support.harness import Message

SCHEMA = {
    "id": "string not null",
    "ts": "timestamp",
    "day": "date",
    "hour": "timestamp",
    "country": "string",
    "bucket": "int",
}
TRANSFORMS = {
    "day": "substr(ts, `0`, `10`)",
    # A timestamp truncated to the hour by a transform (join is a JMESPath built-in: the interpreter runs it).
    "hour": "join('', [substr(ts, `0`, `13`), ':00:00Z'])",
}


def test_partition_columns_of_several_types_with_nulls(setup_factory, daemon_factory) -> None:
    setup = setup_factory(
        1,
        schema=SCHEMA,
        sections={"transforms": TRANSFORMS},
        table={"partition_by": ["day", "hour", "country", "bucket"]},
    )
    docs: list[dict[str, Any]] = []
    for i in range(60):
        doc: dict[str, Any] = {"id": f"e{i}", "ts": f"2026-11-{20 + i % 3}T{i % 24:02d}:30:00Z"}
        if i % 4:
            doc["country"] = ["FR", "a b/c", "DE"][i % 3]
        if i % 5:
            doc["bucket"] = i % 2
        docs.append(doc)
    setup.topic.produce_messages([Message(0, json.dumps(d).encode()) for d in docs])
    daemon = daemon_factory(setup, "--until-caught-up")
    assert daemon.wait(120) == 0, daemon.log()[-3000:]

    table = setup.table()
    assert table.metadata().partition_columns == ["day", "hour", "country", "bucket"]
    rows = {r["id"]: r for r in setup.rows()}
    assert len(rows) == 60 and setup.dead_letters() == []
    for i, doc in enumerate(docs):
        row = rows[f"e{i}"]
        ts = dt.datetime.fromisoformat(doc["ts"])
        assert row["day"] == ts.date()
        assert row["hour"] == ts.replace(minute=0)
        assert row["country"] == doc.get("country")
        assert row["bucket"] == doc.get("bucket")
    values = pa.table(table.get_add_actions(flatten=True)).to_pydict()
    assert None in values["partition.country"] and None in values["partition.bucket"]
    # Readers prune by partition: a filter on the partition columns finds exactly its rows.
    france = table.to_pyarrow_table(filters=[("country", "=", "FR"), ("bucket", "=", 1)])
    assert sorted(france.column("id").to_pylist()) == sorted(
        f"e{i}" for i, d in enumerate(docs) if d.get("country") == "FR" and d.get("bucket") == 1
    )
