"""Commit conflicts: another writer commits to the same table while the daemon runs — appends of its
own rows, compactions that rewrite the daemon's files, and a schema change (a new column) that makes
the daemon drop and replay what it had fitted to the old schema."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from tests.support.chaos import (
    FAST_GROUP,
    ChaosProducer,
    ChaosResult,
    chaos_setup,
    check,
    drain,
    scale,
    stop,
    wait_committed,
)
from tests.support.harness import wait_for


class ConcurrentWriter:
    """Appends foreign rows (no Kafka metadata) and compacts the table in a loop; adds a column once."""

    def __init__(self, uri: str, add_column_after: int) -> None:
        self.appends = 0
        self.compactions = 0
        self.schema_changes = 0
        self.failures: list[str] = []
        self._uri = uri
        self._add_column_after = add_column_after
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="concurrent-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        turn = 0
        while not self._stop.wait(0.3):
            turn += 1
            try:
                table = DeltaTable(self._uri)
                if turn == self._add_column_after:
                    from deltalake.schema import Field, PrimitiveType

                    table.alter.add_columns([Field("added_by_other_writer", PrimitiveType("string"), nullable=True)])
                    self.schema_changes += 1
                elif turn % 4 == 0:
                    table.optimize.compact()
                    self.compactions += 1
                else:
                    schema = pa.schema(table.schema().to_arrow())
                    rows = pa.Table.from_pylist([{"id": f"foreign-{turn}"}], schema=schema)
                    write_deltalake(table, rows, mode="append")
                    self.appends += 1
            except Exception as exc:  # a conflict on the other writer's side: it just tries again
                self.failures.append(f"{type(exc).__name__}: {exc}"[:200])

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)


def test_concurrent_writer_on_the_same_table(setup_factory, daemon_factory, chaos_result: ChaosResult) -> None:
    setup = chaos_setup(setup_factory, 3, max_messages_per_file=scale(500, 5_000), allowed_latency_s=0.3)
    chaos_result.scenario = "concurrent writer: appends, compactions, a schema change"
    # Messages arrive until the other writer is done (the cap only bounds a runaway test).
    producer = ChaosProducer(setup.topic, scale(40_000, 600_000), chunk=scale(200, 1_000), pause_s=scale(4, 3) / 10)
    daemon = daemon_factory(setup, env=FAST_GROUP)
    wait_committed(setup)
    writer = ConcurrentWriter(setup.table_uri, add_column_after=scale(5, 60))
    wait_for(lambda: writer.schema_changes == 1, 120, "the schema change")
    time.sleep(scale(3, 10))  # more commits of both writers after it
    producer.stop()
    time.sleep(2)
    writer.stop()
    stop(daemon)
    drain(daemon_factory, setup)
    log = daemon.log()
    chaos_result.fault("foreign appends", writer.appends)
    chaos_result.fault("compactions", writer.compactions)
    chaos_result.fault("schema changes", writer.schema_changes)
    chaos_result.notes = (
        f"the other writer's own failed attempts: {len(writer.failures)}; daemon saw "
        f"{log.count('changed under us')} schema change(s), {log.count('another writer committed')} txn conflicts, "
        f"{log.count('retrying in')} retries"
    )
    assert writer.schema_changes == 1 and writer.compactions > 0 and writer.appends > 0, writer.failures[-5:]
    assert "changed under us" in log
    chaos_result.verdict = check(setup)
    foreign = [i for i in setup.ids() if i.startswith("foreign-")]
    assert len(foreign) == writer.appends  # the other writer's rows are untouched
