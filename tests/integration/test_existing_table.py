"""A table created beforehand with txn offsets: the daemon starts right after them."""

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from kafka2delta.schema import parse_schema
from tests.support.harness import SCHEMA, assert_exactly_once


def test_daemon_starts_after_the_tables_txn_offsets(setup_factory, daemon_factory) -> None:
    setup = setup_factory(2)
    produced = setup.topic.produce(per_partition=300)
    schema = parse_schema(SCHEMA)
    DeltaTable.create(setup.table_uri, schema)
    # Offsets 0..99 of partition 0 and offset 0 of partition 1 are done already (say, a backfill).
    write_deltalake(
        setup.table_uri,
        pa.Table.from_pylist([{"id": "seed"}], schema=schema),
        mode="append",
        commit_properties=CommitProperties(
            app_transactions=[Transaction(f"{setup.app_id}-0", 99), Transaction(f"{setup.app_id}-1", 0)]
        ),
    )
    daemon = daemon_factory(setup, "--until-caught-up")
    assert daemon.wait(120) == 0, daemon.log()[-3000:]
    expected = [i for i in produced if not (i.startswith("p0-") and int(i[3:]) < 100) and i != "p1-0"]
    assert_exactly_once(setup, [*expected, "seed"])
    assert "starting at 100 (table txn version 99)" in daemon.log()
    assert "starting at 1 (table txn version 0)" in daemon.log()
