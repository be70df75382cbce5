"""The CLI process: bad config exits 2 with one line naming the key; secrets never printed."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kafka2delta", *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=60
    )


def test_version() -> None:
    result = run("--version")
    assert result.returncode == 0 and result.stdout.startswith("kafka2delta ")


def test_bad_config_exits_2_naming_the_key(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(
        '[kafka]\nbootstrap_servers = "x:1"\ntopic = "t"\n[table]\nuri = "/tmp/x"\n[ingest]\nmax_messages_per_file = -3\n'
    )
    result = run("ingest", "-c", str(config))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "ingest.max_messages_per_file" in lines[0] and "positive integer" in lines[0]


def test_env_error_names_the_variable_and_masks_secrets(tmp_path: Path) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "K2D_KAFKA__BOOTSTRAP_SERVERS": "x:1",
        "K2D_KAFKA__TOPIC": "t",
        "K2D_TABLE__URI": str(tmp_path / "t"),
        "K2D_INGEST__ALLOWED_LATENCY_S": "soon",
        "K2D_KAFKA__SETTINGS__SASL_PASSWORD": "hunter2-secret",
    }
    result = run("ingest", env=env)
    assert result.returncode == 2
    assert "K2D_INGEST__ALLOWED_LATENCY_S" in result.stderr and "hunter2-secret" not in result.stderr


def test_missing_required_key(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('[kafka]\nbootstrap_servers = "x:1"\n[table]\nuri = "/tmp/x"\n')
    result = run("ingest", "-c", str(config))
    assert result.returncode == 2 and "kafka.topic: required key missing" in result.stderr


def test_maintain_refuses_contradicting_arguments_before_spark_starts(tmp_path: Path) -> None:
    """Exit 2 with one line naming the argument, before the tables are listed and the JVM starts: the table does
    not even exist, and no Spark line is logged."""
    config = tmp_path / "c.toml"
    config.write_text(f'[kafka]\nbootstrap_servers = "x:1"\ntopic = "t"\n[table]\nuri = "{tmp_path / "absent"}"\n')
    refusals = {
        "--retain-hours": ("vacuum", "--retain-hours", "0.5"),
        "--purge-deletion-vectors": ("optimize", "--zorder-by", "id", "--purge-deletion-vectors"),
        "--target-file-size": ("optimize", "--target-file-size", "0"),
    }
    for argument, args in refusals.items():
        result = run("maintain", *args, "-c", str(config))
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and argument in lines[0], result.stderr
