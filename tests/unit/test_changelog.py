"""Changelog tables (``table.mode = "changelog"``) on real local Delta tables with an in-memory source: every
change is appended as a row (deletes too, with their key), flattened, with ``_op``, the source position and
the Kafka coordinates, in the same commit as the txns; a replay appends nothing; Debezium's tombstones are
counted skips; the before image on request."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql.types import ArrayType, BinaryType, DateType, LongType, MapType, StringType, StructField, StructType

from kafka2delta.changes import UNAVAILABLE_VALUE
from kafka2delta.config import Config
from kafka2delta.errors import ConfigError
from kafka2delta.records import TopicPartition
from kafka2delta.spark.change_merge import merge_clauses, placeholders
from tests.support.debezium import SourceTable, change_batch, change_config, field
from tests.support.runner import TopicsSource, ingest_until_caught_up

P0 = TopicPartition("cdc", 0)
ITEMS = SourceTable("items", [field("id", "int64", optional=False), field("name", "string")], ["id"])


def config(tmp_path: Path, **env: str) -> Config:
    return change_config(tmp_path, "changelog", table="changelog", **{"K2D_FORMAT__ENVELOPE": "debezium", **env})


def changelog(tmp_path: Path) -> list[dict[str, Any]]:
    return DeltaTable(str(tmp_path / "changelog")).to_pyarrow_table().sort_by("kafka_offset").to_pylist()


def events() -> list[tuple[bytes, bytes | None]]:
    return [
        ITEMS.event("r", {"id": 1, "name": "a"}, lsn=10),
        ITEMS.event("u", {"id": 1, "name": "a2"}, before={"id": 1, "name": "a"}, lsn=11),
        ITEMS.event("c", {"id": 2, "name": "b"}, lsn=12),
        ITEMS.event("d", {"id": 2, "name": "b"}, lsn=13),
        (ITEMS.key_bytes({"id": 2}, True), None),  # Debezium's tombstone after the delete
        ITEMS.event("c", {"id": 3, "name": "c"}, lsn=14),
    ]


def test_every_change_is_a_row_with_its_op_position_and_kafka_coordinates(tmp_path: Path) -> None:
    cfg = config(tmp_path, K2D_TABLE__SCHEMA_EVOLUTION="merge")
    metrics = ingest_until_caught_up(cfg, TopicsSource([change_batch(P0, 0, events())], {P0: 6}))
    got = [
        {k: row[k] for k in ("id", "name", "_op", "_lsn", "kafka_partition", "kafka_offset")}
        for row in changelog(tmp_path)
    ]
    assert got == [
        {"id": 1, "name": "a", "_op": "r", "_lsn": 10, "kafka_partition": 0, "kafka_offset": 0},
        {"id": 1, "name": "a2", "_op": "u", "_lsn": 11, "kafka_partition": 0, "kafka_offset": 1},
        {"id": 2, "name": "b", "_op": "c", "_lsn": 12, "kafka_partition": 0, "kafka_offset": 2},
        {"id": 2, "name": None, "_op": "d", "_lsn": 13, "kafka_partition": 0, "kafka_offset": 3},
        {"id": 3, "name": "c", "_op": "c", "_lsn": 14, "kafka_partition": 0, "kafka_offset": 5},
    ]
    first = changelog(tmp_path)[0]
    assert first["_source_ts"] == dt.datetime.fromtimestamp(1_700_000_000.010, dt.UTC)
    skipped = metrics.registry.get_sample_value(
        "kafka2delta_messages_skipped_total", {"topic": "cdc", "partition": "0", "reason": "empty"}
    )
    assert skipped == 1.0  # the tombstone: the delete event before it carries the change
    table = DeltaTable(str(tmp_path / "changelog"))
    assert table.transaction_version("cdc-0") == 5
    last = table.history(1)[0]
    assert last["operation"] == "WRITE" and last["kafka2delta"]["offsets"] == {"0": [0, 5]}
    schema = pa.schema(table.schema().to_arrow())
    assert schema.names[0] == "id"  # keys first, from the Connect schema


def test_a_replay_appends_nothing(tmp_path: Path) -> None:
    cfg = config(tmp_path, K2D_TABLE__SCHEMA_EVOLUTION="merge")
    ingest_until_caught_up(cfg, TopicsSource([change_batch(P0, 0, events())], {P0: 6}))
    later = [ITEMS.event("u", {"id": 3, "name": "c2"}, lsn=15)]
    ingest_until_caught_up(cfg, TopicsSource([change_batch(P0, 0, events()), change_batch(P0, 6, later)], {P0: 7}))
    assert [(row["id"], row["_op"]) for row in changelog(tmp_path)] == [
        (1, "r"),
        (1, "u"),
        (2, "c"),
        (2, "d"),
        (3, "c"),
        (3, "u"),
    ]


def test_without_an_envelope_a_tombstone_is_the_delete_of_its_key(tmp_path: Path) -> None:
    cfg = config(
        tmp_path,
        K2D_FORMAT__ENVELOPE="none",
        K2D_TABLE__SCHEMA=json.dumps({"id": "long", "name": "string"}),
    )
    batch = change_batch(
        P0, 0, [(b'{"id": 1}', b'{"id": 1, "name": "a"}'), (b'{"id": 1}', None), (b'{"id": 4}', b'{"id": 4}')]
    )
    ingest_until_caught_up(cfg, TopicsSource([batch], {P0: 3}))
    got = [(row["id"], row["name"], row["_op"], row["kafka_offset"]) for row in changelog(tmp_path)]
    assert got == [(1, "a", "u", 0), (1, None, "d", 1), (4, None, "u", 2)]
    assert "_lsn" not in DeltaTable(str(tmp_path / "changelog")).schema().to_arrow().names


def test_the_before_image_is_a_struct_column_on_request(tmp_path: Path) -> None:
    cfg = config(tmp_path, K2D_TABLE__SCHEMA_EVOLUTION="merge", K2D_TABLE__BEFORE_IMAGE="true")
    ingest_until_caught_up(cfg, TopicsSource([change_batch(P0, 0, events())], {P0: 6}))
    befores = [(row["id"], row["_op"], row["_before"]) for row in changelog(tmp_path)]
    assert befores == [
        (1, "r", None),
        (1, "u", {"id": 1, "name": "a"}),
        (2, "c", None),
        (2, "d", {"id": 2, "name": "b"}),
        (3, "c", None),
    ]


def test_a_change_that_cannot_be_read_is_a_dead_letter_and_the_rest_land(tmp_path: Path) -> None:
    cfg = config(tmp_path, K2D_TABLE__SCHEMA_EVOLUTION="merge")
    truncate = json.dumps({"before": None, "after": None, "op": "t", "source": {"ts_ms": 1}}).encode()
    batch = change_batch(P0, 0, [events()[0], (None, truncate), events()[2]])
    ingest_until_caught_up(cfg, TopicsSource([batch], {P0: 3}))
    assert [row["kafka_offset"] for row in changelog(tmp_path)] == [0, 2]
    (letter,) = DeltaTable(str(tmp_path / "dlq")).to_pyarrow_table().to_pylist()
    assert letter["offset"] == 1 and "TRUNCATE" in letter["error"]


@pytest.mark.parametrize(
    ("env", "key", "says"),
    [
        ({"K2D_TABLE__KEY": ""}, "table.key", 'mode = "changelog"'),
        ({"K2D_TABLE__CHANGE_COLUMNS": "op"}, "table.change_columns", "always has _op"),
        (
            {"K2D_TABLE__MODE": "append", "K2D_TABLE__KEY": "", "K2D_TABLE__BEFORE_IMAGE": "true"},
            "table.before_image",
            "",
        ),
        ({"K2D_FORMAT__ENVELOPE": "none", "K2D_TABLE__BEFORE_IMAGE": "true"}, "table.before_image", "debezium"),
        ({"K2D_FORMAT__TYPE": "raw"}, "format.type", "changelog"),
    ],
)
def test_changelog_settings_are_checked_at_start_naming_the_key(
    tmp_path: Path, env: dict[str, str], key: str, says: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        config(tmp_path, **env)
    assert raised.value.key == key and says in raised.value.problem


def test_the_daemon_refuses_a_table_only_spark_writes(tmp_path: Path) -> None:
    from deltalake import write_deltalake

    target = tmp_path / "changelog"
    write_deltalake(str(target), pa.table({"id": pa.array([1], pa.int64())}))
    # As Spark's CREATE TABLE … TBLPROPERTIES writes it (delta-rs refuses to create a table with a property
    # it does not know, but reads one).
    first = target / "_delta_log" / "00000000000000000000.json"
    actions = [json.loads(line) for line in first.read_text().splitlines()]
    for action in actions:
        if "metaData" in action:
            action["metaData"]["configuration"]["kafka2delta.sparkOnly"] = "true"
    first.write_text("".join(json.dumps(action) + "\n" for action in actions))
    with pytest.raises(ConfigError) as raised:
        cfg = config(tmp_path, K2D_TABLE__SCHEMA_EVOLUTION="merge")
        ingest_until_caught_up(cfg, TopicsSource([change_batch(P0, 0, events())], {P0: 6}))
    assert raised.value.key == "table.uri" and "apply-changes" in raised.value.problem


def test_a_changelog_may_transform_its_key_columns(tmp_path: Path) -> None:
    """Its deletes are rows and go through the transforms like the others (only an upsert table refuses it)."""
    cfg = change_config(tmp_path, "changelog", K2D_TRANSFORMS=json.dumps({"id": "id"}))
    assert cfg.transforms == (("id", "id"),)


def test_apply_changes_knows_debeziums_placeholder_in_every_form_a_changelog_keeps() -> None:
    """Found by review (the daemon's collapse and ``jobs apply-changes`` share the forms): an int[], bigint[] or
    date[] (the placeholder's bytes as numbers), an hstore (a map, or JSON text), a uuid[] or a bytea[] took the
    placeholder as its value. The MERGE's SQL only: what it does on real tables is tests/spark/."""
    text = f"'{UNAVAILABLE_VALUE}'"
    columns = {
        "longs": ArrayType(LongType()),
        "days": ArrayType(DateType()),
        "hstore": MapType(StringType(), StringType()),
        "blobs": ArrayType(BinaryType()),
        "doc": StringType(),
    }
    holes = placeholders(StructType([StructField(name, kind) for name, kind in columns.items()]), [])
    ints = ", ".join(str(byte) for byte in UNAVAILABLE_VALUE.encode())
    assert holes["longs"] == f"CAST(array({ints}) AS array<bigint>)"
    days = ", ".join(f"DATE '{dt.date(1970, 1, 1) + dt.timedelta(days=byte)}'" for byte in UNAVAILABLE_VALUE.encode())
    assert holes["days"] == f"array({days})"  # date[]: an int[] of days
    assert holes["hstore"] == f"map({text}, {text})"
    assert holes["blobs"] == f"array(X'{UNAVAILABLE_VALUE.encode().hex().upper()}')"
    assert holes["doc"] == (text, f'\'{{"{UNAVAILABLE_VALUE}":"{UNAVAILABLE_VALUE}"}}\'')  # hstore as JSON
    update, insert = (
        c.assignments for c in merge_clauses(["id"], ["id", *columns], has_lsn=True, soft=False, placeholders=holes)[1:]
    )
    # Spark compares no maps: an hstore by its entries; a column with two forms: either.
    assert insert["hstore"] == (
        f"CASE WHEN map_entries(s.`hstore`) <=> map_entries({holes['hstore']}) THEN NULL ELSE s.`hstore` END"
    )
    doc = holes["doc"]
    assert insert["doc"] == f"CASE WHEN (s.`doc` <=> {doc[0]} OR s.`doc` <=> {doc[1]}) THEN NULL ELSE s.`doc` END"
    assert update["longs"].startswith(f"CASE WHEN s.`longs` <=> {holes['longs']} OR (")
