"""The container images, built and run for real (``make image-test``; opt-in: K2D_IMAGE_TEST=1, never part of
``make test``). No Docker engine and no registry: dev/image.py makes a bookworm base from Debian packages
(mmdebstrap), builds the Dockerfile's ``daemon`` and ``maintenance`` targets on it with buildah, and the tests
run them with podman, hardened as a pod would (read-only root, tmpfs /tmp, no capabilities, uid 10001), on the
host network against the suite's real broker, with the table on a host directory mounted at /data:

- the images' metadata: user 10001, ``ENTRYPOINT ["kafka2delta"]``, the daemon's HEALTHCHECK, the jars' env;
- the daemon image ingests a 2-partition topic with ``ingest --until-caught-up``, twice (the second run
  resumes from the offsets in the table): every row exactly once, table files owned by 10001;
- the daemon image as a long-running container: /healthz from the host, ``podman healthcheck run`` (the
  image's own HEALTHCHECK command), SIGTERM through ``podman stop`` exits 0;
- the maintenance image's ``kafka2delta maintain optimize`` on that table: a new OPTIMIZE commit, the files
  compacted into one, the rows unchanged.

About 10 minutes on 2 cores: the base once (~1 min, kept in the store), then both images from scratch every run
(~2 and ~6 min: no buildah layer cache, which would keep a stale kafka2delta, see dev/image.py), then the runs.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dev import image
from dev.kafka.broker import create_topic
from tests.support.harness import SCHEMA, Topic, wait_for

if not os.environ.get("K2D_IMAGE_TEST"):
    pytest.skip("opt-in: `make image-test` (K2D_IMAGE_TEST=1) builds and runs the images", allow_module_level=True)

APP_UID = image.APP_UID
TABLE = "/data/events"
PARTITIONS = 2
PER_ROUND = 250  # messages per partition and per daemon run


@dataclass
class Images:
    store: image.Store
    built: dict[str, image.Built]


@pytest.fixture(scope="module")
def images() -> Iterator[Images]:
    store = image.Store.from_env()
    base_seconds = image.build_base(store)
    built = {target: image.build(store, target) for target in image.TARGETS}
    lines = [f"store {store.dir} ({store.driver})"]
    if base_seconds:
        lines.append(f"{image.BASE_IMAGE}: built in {base_seconds:.0f} s")
    lines += [f"{b.image}: {b.bytes / 1e6:,.0f} MB, built in {b.seconds:.0f} s" for b in built.values()]
    print("\n" + "\n".join(lines))
    yield Images(store, built)


@pytest.fixture(scope="module")
def data_dir() -> Iterator[Path]:
    """The host directory mounted at /data, owned by the images' user."""
    path = Path(tempfile.mkdtemp(prefix="k2d-image-data-", dir="/var/tmp"))
    os.chown(path, APP_UID, APP_UID)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _env(topic: Topic) -> dict[str, str]:
    """Environment-only configuration, as the Helm chart gives it."""
    return {
        "K2D_KAFKA__BOOTSTRAP_SERVERS": topic.bootstrap,
        "K2D_KAFKA__TOPIC": topic.name,
        "K2D_KAFKA__GROUP_ID": f"g-{topic.name}",
        "K2D_TABLE__URI": TABLE,
        "K2D_TABLE__SCHEMA": json.dumps(SCHEMA),
        "K2D_INGEST__ALLOWED_LATENCY_S": "1",
        "K2D_METRICS__PORT": "0",
    }


def _ids(table: Path) -> list[str]:
    from deltalake import DeltaTable

    if not DeltaTable.is_deltatable(str(table)):
        return []
    ids: list[str] = DeltaTable(str(table)).to_pyarrow_table(columns=["id"]).column("id").to_pylist()
    return ids


def _output(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit {result.returncode}\n{(result.stdout + result.stderr)[-6000:]}"


@dataclass
class Ingested:
    topic: Topic
    produced: list[str]
    runs: list[subprocess.CompletedProcess[str]]
    table: Path


@pytest.fixture(scope="module")
def ingested(images: Images, data_dir: Path, kafka_bootstrap: str) -> Ingested:
    """Two rounds of PER_ROUND messages per partition, each ingested by a fresh daemon container with
    ``ingest --until-caught-up``."""
    topic = Topic(f"img-{uuid.uuid4().hex[:10]}", PARTITIONS, kafka_bootstrap)
    create_topic(kafka_bootstrap, topic.name, PARTITIONS)
    produced: list[str] = []
    runs = []
    for round_ in range(2):
        produced += topic.produce(PER_ROUND, start=round_ * PER_ROUND)
        runs.append(
            image.run(
                images.store,
                image.TARGETS["daemon"],
                ["ingest", "--until-caught-up"],
                env=_env(topic),
                volumes={data_dir: "/data"},
                timeout=300,
            )
        )
    return Ingested(topic, produced, runs, data_dir / "events")


def _inspect(store: image.Store, name: str) -> dict[str, Any]:
    """``podman image inspect``: the config under "Config", the HEALTHCHECK (docker format only) beside it."""
    out = subprocess.run(
        store.podman("image", "inspect", name), capture_output=True, text=True, check=True, timeout=60
    ).stdout
    inspected: dict[str, Any] = json.loads(out)[0]
    return inspected


def test_images_metadata(images: Images) -> None:
    for target, built in images.built.items():
        inspected = _inspect(images.store, built.image)
        config = inspected["Config"]
        assert config["User"] == f"{APP_UID}:{APP_UID}", (target, config)
        assert config["Entrypoint"] == ["kafka2delta"], (target, config)
        env = dict(item.split("=", 1) for item in config["Env"])
        assert env["HOME"] == "/tmp" and env["PATH"].startswith("/opt/kafka2delta/bin:"), env
        if target == "daemon":
            assert config["Cmd"] == ["ingest"]
            healthcheck = inspected.get("Healthcheck") or {}
            assert healthcheck.get("Test") == [
                "CMD",
                "/opt/kafka2delta/bin/kafka2delta-healthcheck",
                "/healthz",
            ], inspected
            assert config["StopSignal"] == "SIGTERM" and "9102/tcp" in config["ExposedPorts"], config
        else:
            assert env["K2D_SPARK__JARS"] == "/opt/kafka2delta/jars/*", env
        version = image.run(images.store, built.image, ["--version"], timeout=120)
        assert version.returncode == 0 and version.stdout.startswith("kafka2delta "), _output(version)


def test_daemon_image_ingests_until_caught_up(ingested: Ingested) -> None:
    for run in ingested.runs:
        assert run.returncode == 0, _output(run)
        assert "caught up with the high watermarks" in run.stderr, _output(run)
    ids = _ids(ingested.table)
    assert len(ids) == len(ingested.produced) == 2 * PARTITIONS * PER_ROUND
    assert sorted(ids) == sorted(ingested.produced), "rows missing, duplicated or unexpected"
    # The second container started where the first one's commits left off, from the offsets in the table.
    assert f"{ingested.topic.name}[0]@{PER_ROUND}..{2 * PER_ROUND - 1}" in ingested.runs[1].stderr, _output(
        ingested.runs[1]
    )
    owners = {path.stat().st_uid for path in ingested.table.rglob("*")}
    assert owners == {APP_UID}, f"table files owned by {owners}: the container did not run as {APP_UID}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def test_daemon_image_health_check_and_sigterm(images: Images, data_dir: Path, kafka_bootstrap: str) -> None:
    """A long-running daemon container: probes on the host network, the image's HEALTHCHECK, SIGTERM → exit 0."""
    store = images.store
    topic = Topic(f"img-{uuid.uuid4().hex[:10]}", 1, kafka_bootstrap)
    create_topic(kafka_bootstrap, topic.name, 1)
    produced = topic.produce(100)
    port = _free_port()
    name = f"k2d-{topic.name}"
    env = {**_env(topic), "K2D_TABLE__URI": "/data/health", "K2D_METRICS__PORT": str(port)}
    detached = image.run(
        store,
        image.TARGETS["daemon"],
        env=env,
        volumes={data_dir: "/data"},
        options=["--detach", "--name", name],
        remove=False,  # kept after it stops, for its exit code
        timeout=300,
    )
    assert detached.returncode == 0, _output(detached)
    try:
        wait_for(lambda: _status(f"http://127.0.0.1:{port}/readyz") == 200, 120, "/readyz 200")
        wait_for(lambda: len(_ids(data_dir / "health")) >= len(produced), 120, "the rows")
        assert _status(f"http://127.0.0.1:{port}/healthz") == 200
        health = subprocess.run(
            store.podman("healthcheck", "run", name), capture_output=True, text=True, timeout=60, check=False
        )
        assert health.returncode == 0, _output(health)
        stop = subprocess.run(
            store.podman("stop", "--time", "60", name), capture_output=True, text=True, timeout=120, check=False
        )
        assert stop.returncode == 0, _output(stop)
        state = subprocess.run(
            store.podman("inspect", "--format", "{{.State.ExitCode}} {{.State.Status}}", name),
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.split()
        logs = subprocess.run(store.podman("logs", name), capture_output=True, text=True, timeout=60, check=False)
        assert state == ["0", "exited"], f"the daemon ended {state} on SIGTERM:\n{_output(logs)}"
    finally:
        subprocess.run(store.podman("rm", "--force", name), capture_output=True, timeout=120, check=False)
    assert sorted(_ids(data_dir / "health")) == sorted(produced)


def test_maintenance_image_optimizes_the_table(images: Images, ingested: Ingested) -> None:
    from deltalake import DeltaTable

    before = DeltaTable(str(ingested.table))
    files_before = len(before.file_uris())
    assert files_before >= 2 * PARTITIONS, "nothing to compact"
    result = image.run(
        images.store,
        image.TARGETS["maintenance"],
        ["maintain", "optimize", "--table", TABLE, "--json"],
        env=_env(ingested.topic),
        volumes={ingested.table.parent: "/data"},
        timeout=900,
    )
    assert result.returncode == 0, _output(result)
    report = json.loads(result.stdout.strip().splitlines()[-1])
    print(f"\nmaintain optimize: {report}")
    after = DeltaTable(str(ingested.table))
    assert after.version() > before.version()
    assert after.history(1)[0]["operation"] == "OPTIMIZE", after.history(1)
    assert len(after.file_uris()) == 1, after.file_uris()
    assert sorted(_ids(ingested.table)) == sorted(ingested.produced)
    owners = {path.stat().st_uid for path in ingested.table.rglob("*")}
    assert owners == {APP_UID}, f"files owned by {owners}"
