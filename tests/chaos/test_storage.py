"""Storage faults while the daemon commits: the local table made read-only for a while; on S3 (moto's
server on loopback, behind a fault-injecting proxy) the server stopped and restarted mid-commit, and
every request answered with an error for a while. The daemon retries with backoff and holds its
offsets; afterwards nothing is lost or duplicated."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.conftest import (
    FAST_GROUP,
    ROOT,
    ChaosProducer,
    ChaosResult,
    chaos_setup,
    check,
    drain,
    scale,
    stop,
    wait_committed,
    wait_for,
)


@contextlib.contextmanager
def read_only(*directories: Path) -> Iterator[None]:
    """No entry can be created or removed in ``directories`` (chmod a-w; root ignores modes, so as
    root the directories are also made immutable with chattr +i)."""
    modes = {d: d.stat().st_mode for d in directories}
    immutable: list[Path] = []
    try:
        for directory in directories:
            directory.chmod(0o555)
            if os.geteuid() == 0:
                subprocess.run(["chattr", "+i", str(directory)], check=True)
                immutable.append(directory)
        yield
    finally:
        for directory in immutable:
            subprocess.run(["chattr", "-i", str(directory)], check=True)
        for directory, mode in modes.items():
            directory.chmod(mode)


def test_local_table_read_only_for_a_while(setup_factory, daemon_factory, chaos_result: ChaosResult) -> None:
    setup = chaos_setup(setup_factory, 3, max_messages_per_file=scale(500, 5_000), allowed_latency_s=0.5)
    chaos_result.scenario = "local table directory read-only for a while"
    producer = ChaosProducer(setup.topic, scale(4_000, 40_000), chunk=scale(200, 1_000), pause_s=scale(3, 5) / 10)
    daemon = daemon_factory(setup, env=FAST_GROUP)
    wait_committed(setup)
    table = Path(setup.table_uri)
    wait_for(lambda: Path(setup.dead_letter_uri, "_delta_log").is_dir(), 60, "the dead-letter table")
    directories = [table, table / "_delta_log", Path(setup.dead_letter_uri), Path(setup.dead_letter_uri, "_delta_log")]
    for _ in range(scale(1, 3)):
        seconds = scale(8, 20)
        versions = setup.txn_versions()
        with read_only(*directories):
            chaos_result.fault(f"read-only {seconds} s")
            time.sleep(seconds)
            assert setup.txn_versions() == versions, "nothing can be committed while read-only"
            assert daemon.process.poll() is None, daemon.log()[-3000:]
        target = producer.produced
        wait_for(lambda t=target: len(setup.ids()) + len(setup.dead_letters()) >= t, 180, "commits after the fault")
    producer.join()
    stop(daemon)
    retries = daemon.log().count("retrying in")
    assert retries > 0, "the daemon should have retried while the table was read-only"
    chaos_result.notes = f"{retries} retried operations logged"
    drain(daemon_factory, setup)
    chaos_result.verdict = check(setup)


# --- S3 ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def s3_module() -> Any:
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("k2d_dev_s3", ROOT / "dev" / "s3.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def s3(s3_module: Any) -> Iterator[tuple[Any, Any]]:
    """A local S3 server and a fault proxy in front of it; the bucket ``k2d-chaos``."""
    server = s3_module.LocalS3()
    server.start()
    proxy = s3_module.FaultProxy(server.port)
    try:
        server.create_bucket("k2d-chaos")
        yield server, proxy
    finally:
        proxy.close()
        server.stop()


def _s3_env(options: dict[str, str]) -> dict[str, str]:
    return {**FAST_GROUP, **{f"K2D_TABLE__STORAGE_OPTIONS__{k}": v for k, v in options.items()}}


@pytest.mark.parametrize("fault", ["server_restart", "errors"])
def test_s3_faults_mid_commit(
    setup_factory, daemon_factory, s3: tuple[Any, Any], chaos_result: ChaosResult, fault: str
) -> None:
    server, proxy = s3
    uri = f"s3://k2d-chaos/{uuid.uuid4().hex[:8]}"
    setup = chaos_setup(
        setup_factory, 3, table={"uri": uri}, max_messages_per_file=scale(500, 5_000), allowed_latency_s=0.5
    )
    chaos_result.scenario = {
        "server_restart": "S3 server stopped and restarted mid-commit",
        "errors": "S3 answering 503 to every request for a while",
    }[fault]
    env = _s3_env(server.storage_options(endpoint=proxy.endpoint))
    direct = server.storage_options()
    producer = ChaosProducer(setup.topic, scale(4_000, 40_000), chunk=scale(200, 1_000), pause_s=scale(3, 5) / 10)
    daemon = daemon_factory(setup, env=env)

    def committed() -> int:
        with contextlib.suppress(Exception):
            return check_count(setup, uri, direct)
        return 0

    wait_for(lambda: committed() > 0, 180, "a first commit on S3")
    for _ in range(scale(2, 5)):
        time.sleep(scale(2, 4))  # commits every ~0.5 s: the fault lands in one
        seconds = scale(5, 10)
        if fault == "server_restart":
            server.stop()
            chaos_result.fault(f"S3 server stopped {seconds} s")
            time.sleep(seconds)
            server.start()
        else:
            proxy.fail(503)
            chaos_result.fault(f"S3 503s for {seconds} s")
            time.sleep(seconds)
            proxy.heal()
        assert daemon.process.poll() is None, daemon.log()[-3000:]
        target = producer.produced
        wait_for(lambda t=target: committed() >= t, 300, "commits after the fault")
    producer.join()
    stop(daemon, 300)
    chaos_result.notes = f"proxy answered {proxy.faults} requests with a fault; "
    drain(daemon_factory, setup, env=env)
    chaos_result.verdict = check(setup, direct, table_uri=uri)


def check_count(setup: Any, uri: str, options: dict[str, str]) -> int:
    """Rows plus dead letters committed on S3."""
    from deltalake import DeltaTable

    rows = DeltaTable(uri, storage_options=options).to_pyarrow_dataset().count_rows()
    try:
        letters = DeltaTable(f"{uri}_dead_letters", storage_options=options).to_pyarrow_dataset().count_rows()
    except Exception:
        letters = 0
    return int(rows + letters)
