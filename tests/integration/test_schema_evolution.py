"""Schema evolution: new JSON fields become nullable columns (merge) or are dropped and counted (none);
a schema change made by someone else while the daemon runs is picked up before its next commit."""

import json
import time

import pyarrow as pa
from deltalake import DeltaTable, Field
from deltalake.schema import PrimitiveType

from tests.support.harness import Message, wait_for

SCHEMA = {"id": "string not null", "n": "long", "user": "struct<id:long>"}


def produce(setup, docs: list[dict], partition: int = 0) -> None:
    setup.topic.produce_messages([Message(partition, json.dumps(doc).encode()) for doc in docs])


def test_merge_adds_new_fields_as_nullable_columns(setup_factory, daemon_factory) -> None:
    setup = setup_factory(1, schema=SCHEMA, table={"schema_evolution": "merge"}, metadata_columns=None)
    produce(setup, [{"id": f"a{i}", "n": i, "user": {"id": i}} for i in range(50)])
    first = daemon_factory(setup, "--until-caught-up")
    assert first.wait(120) == 0, first.log()[-3000:]
    assert setup.table().schema().to_arrow().names == ["id", "n", "user"]

    produce(
        setup,
        [
            {"id": f"b{i}", "n": i, "color": "red", "seen": "2026-11-22T10:00:00Z", "user": {"id": i, "country": "FR"}}
            for i in range(50)
        ]
        + [{"id": "bad", "n": "not a number"}],
    )
    second = daemon_factory(setup, "--until-caught-up")
    assert second.wait(120) == 0, second.log()[-3000:]

    schema = pa.schema(setup.table().schema().to_arrow())
    assert schema.names == ["id", "n", "user", "color", "seen"]
    assert schema.field("color").type == pa.string() and schema.field("color").nullable
    assert schema.field("seen").type == pa.string()  # JSON has no timestamps: it stays the text it was
    assert schema.field("user").type == pa.struct([("id", pa.int64()), ("country", pa.string())])
    rows = {r["id"]: r for r in setup.rows()}
    assert len(rows) == 100
    assert rows["a3"]["color"] is None and rows["a3"]["user"] == {"id": 3, "country": None}  # old rows read as null
    assert rows["b3"]["color"] == "red" and rows["b3"]["seen"] == "2026-11-22T10:00:00Z"
    assert rows["b3"]["user"] == {"id": 3, "country": "FR"}
    # The columns arrived in the same commit as the first rows carrying them.
    history = [h for h in setup.table().history() if h.get("kafka2delta", {}).get("added_columns")]
    assert len(history) == 1 and history[0]["kafka2delta"]["added_columns"] == ["user.country", "color", "seen"]
    # A value that cannot fit its column is still a dead letter.
    [letter] = setup.dead_letters()
    assert letter["stage"] == "coerce" and "'n'" in letter["error"] and "not a number" in letter["error"]
    assert setup.txn_versions() == {0: 100}


def test_none_drops_unknown_fields_and_counts_them(setup_factory, daemon_factory) -> None:
    setup = setup_factory(1, schema=SCHEMA, metadata_columns=None)
    produce(setup, [{"id": f"a{i}", "n": i, "color": "red", "user": {"id": i, "country": "FR"}} for i in range(20)])
    daemon = daemon_factory(setup, "--until-caught-up")
    assert daemon.wait(120) == 0, daemon.log()[-3000:]
    assert setup.table().schema().to_arrow().names == ["id", "n", "user"]
    assert len(setup.rows()) == 20
    assert "40 unknown field values dropped" in daemon.log()


def test_a_schema_change_by_someone_else_is_picked_up_before_the_next_commit(setup_factory, daemon_factory) -> None:
    setup = setup_factory(1, schema=SCHEMA, allowed_latency_s=2.0, metadata_columns=None)
    produce(setup, [{"id": f"a{i}", "n": i, "x": f"x{i}"} for i in range(20)])
    daemon = daemon_factory(setup)
    wait_for(lambda: len(setup.ids()) == 20, 60, "the first rows")
    assert setup.table().schema().to_arrow().names == ["id", "n", "user"]

    DeltaTable(setup.table_uri).alter.add_columns([Field("x", PrimitiveType("string"), nullable=True)])
    produce(setup, [{"id": f"b{i}", "n": i, "x": f"x{i}"} for i in range(20)])
    wait_for(lambda: len(setup.ids()) == 40, 60, "rows after the schema change")
    time.sleep(0.5)
    assert daemon.stop() == 0, daemon.log()[-3000:]

    rows = {r["id"]: r for r in setup.rows()}
    assert len(rows) == 40 and all(rows[f"b{i}"]["x"] == f"x{i}" for i in range(20))
    assert all(rows[f"a{i}"]["x"] is None for i in range(20))
    assert setup.txn_versions() == {0: 39}
