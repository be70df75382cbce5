"""Storage outages on Azure (Azurite) and GCS (fake-gcs-server) while the daemon commits every 0.5 s: the
emulator stopped and restarted on its data mid-commit (short form, and every other round of the full form), and
the proxy in front of it answering 503 to every request for a while (the other rounds of the full form). The
daemon retries with backoff and holds its offsets; afterwards nothing is lost or duplicated."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import pytest
from deltalake import DeltaTable

from tests.support.chaos import FAST_GROUP, FULL, ChaosProducer, ChaosResult, chaos_setup, check, drain, scale, stop
from tests.support.harness import wait_for
from tests.support.object_stores import STORES, Store, StoreName, start_store

LABELS = {"azure": "Azure (Azurite)", "gcs": "GCS (fake-gcs-server)"}


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    name: StoreName = request.param
    started = start_store(name, bucket="k2d-chaos")
    try:
        yield started
    finally:
        started.emulator.close()


def test_object_store_outage_mid_commit(setup_factory, daemon_factory, store: Store, chaos_result: ChaosResult) -> None:
    uri = store.uri("events")
    options = store.options()
    # Few retries inside delta-rs (object_store), so the outages reach the daemon's own retry loop.
    setup = chaos_setup(
        setup_factory,
        3,
        table={"uri": uri},
        sections={"table.storage_options": {**options, "max_retries": "1", "retry_timeout": "3s"}},
        max_messages_per_file=scale(500, 5_000),
        allowed_latency_s=0.5,
    )
    label = LABELS[store.name]
    chaos_result.scenario = f"{label} emulator stopped and restarted mid-commit" + (
        ", and answering 503 to every request, in turns" if FULL else ""
    )
    # Messages arrive until the faults are over (the cap only bounds a runaway test).
    # A pace the daemon keeps up with on the emulators (a commit takes 0.5-3 s on Azurite on 2 busy cores).
    producer = ChaosProducer(setup.topic, scale(20_000, 200_000), chunk=scale(40, 300), pause_s=scale(6, 10) / 10)
    daemon = daemon_factory(setup, env=FAST_GROUP)

    def committed() -> int:
        with contextlib.suppress(Exception):
            return _count(uri, options)
        return 0

    wait_for(lambda: committed() > 0, 180, f"a first commit on {label}")
    for turn in range(scale(1, 4)):
        time.sleep(scale(1, 4))  # commits every ~0.5 s: the fault lands in one
        assert producer.running(), "the fault must come while messages still arrive"
        seconds = scale(4, 10)
        if turn % 2 == 0:
            store.emulator.stop()
            chaos_result.fault(f"{store.name} emulator stopped {seconds} s")
            time.sleep(seconds)
            store.emulator.start()
        else:
            store.emulator.fail()
            chaos_result.fault(f"{store.name} 503s for {seconds} s")
            time.sleep(seconds)
            store.emulator.heal()
        assert daemon.process.poll() is None, daemon.log()[-3000:]
        target = producer.produced
        wait_for(lambda t=target: committed() >= t, 300, "commits after the fault")
    producer.stop()
    stop(daemon, 300)
    retries = daemon.log().count("retrying in")
    assert retries > 0, "the daemon should have retried while the store was away"
    chaos_result.notes = (
        f"proxy answered {store.emulator.fault_count()} requests with a fault or refused them; "
        f"{retries} retries logged by the daemon"
    )
    drain(daemon_factory, setup)
    chaos_result.verdict = check(setup, options, table_uri=uri)


def _count(uri: str, options: dict[str, str]) -> int:
    """Rows plus dead letters committed."""
    rows = DeltaTable(uri, storage_options=options).to_pyarrow_dataset().count_rows()
    try:
        letters = DeltaTable(f"{uri}_dead_letters", storage_options=options).to_pyarrow_dataset().count_rows()
    except Exception:
        letters = 0
    return int(rows + letters)
