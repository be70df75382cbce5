"""The two emulators, installed once into ``$K2D_TOOLS_DIR`` (default ``~/.cache/kafka2delta/tools``).

    python -m dev.object_stores.tools        # install both if missing; print their paths

- Azurite (``AZURITE_VERSION``) from the npm registry: ``npm install azurite@<version>`` into
  ``azurite-<version>/``; run with the ``node`` on PATH (the blob service only).
- fake-gcs-server (``FAKE_GCS_VERSION``) from the Go module proxy: ``go install
  github.com/fsouza/fake-gcs-server@<version>`` into ``fake-gcs-server-<version>/``, like Helm in
  :mod:`dev.k8s_tools`. The first build takes a few minutes on 2 cores (about a minute of compiling once the modules
  are downloaded); tests/conftest.py starts it in the background as soon as a test needing it is collected.

Each step is idempotent (an install already there is left alone), lands in place atomically (a staging
directory renamed) and holds a file lock, so parallel test sessions install once.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dev.k8s_tools import ToolError, tools_dir
from dev.local_server import file_lock

AZURITE_VERSION = "3.37.0"
FAKE_GCS_VERSION = "v1.56.1"
FAKE_GCS_MODULE = "github.com/fsouza/fake-gcs-server"
_OUTPUT_TAIL = 4000


def azurite_dir() -> Path:
    return tools_dir() / f"azurite-{AZURITE_VERSION}"


def azurite_blob_main() -> Path:
    return azurite_dir() / "node_modules" / "azurite" / "dist" / "src" / "blob" / "main.js"


def _azurite_version() -> str | None:
    try:
        package = json.loads((azurite_dir() / "node_modules" / "azurite" / "package.json").read_text())
    except (OSError, ValueError):
        return None
    return str(package.get("version")) if azurite_blob_main().is_file() else None


def node() -> str:
    found = shutil.which("node")
    if found is None:
        raise ToolError("`node` is not on PATH: Azurite (the Azure storage emulator) is a Node.js program")
    return found


def ensure_azurite(verbose: bool = False) -> Path:
    """Azurite's blob-service entry point (``…/dist/src/blob/main.js``), installed with npm if missing."""
    if _azurite_version() == AZURITE_VERSION:
        return azurite_blob_main()
    npm = shutil.which("npm")
    if npm is None:
        raise ToolError("`npm` is not on PATH: Azurite is installed from the npm registry")
    target = azurite_dir()
    with file_lock(tools_dir() / ".azurite.lock"):
        if _azurite_version() == AZURITE_VERSION:
            return azurite_blob_main()
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as work:
            staging = Path(work) / "azurite"
            staging.mkdir()
            _say(verbose, f"npm install azurite@{AZURITE_VERSION} …")
            _run([npm, "install", "--no-audit", "--no-fund", "--prefix", str(staging), f"azurite@{AZURITE_VERSION}"])
            if target.exists():
                shutil.rmtree(target)
            os.replace(staging, target)
    if _azurite_version() != AZURITE_VERSION:
        raise ToolError(f"{target} does not hold azurite {AZURITE_VERSION} after npm install")
    return azurite_blob_main()


def fake_gcs_path() -> Path:
    return tools_dir() / f"fake-gcs-server-{FAKE_GCS_VERSION}" / "fake-gcs-server"


def ensure_fake_gcs(verbose: bool = False) -> Path:
    """The fake-gcs-server binary, built with ``go install`` if missing."""
    target = fake_gcs_path()
    if target.is_file():
        return target
    go = shutil.which("go") or next(
        (g for g in ("/usr/local/go/bin/go", "/usr/lib/go/bin/go") if Path(g).is_file()), None
    )
    if go is None:
        raise ToolError("`go` is not on PATH: fake-gcs-server is built from the Go module proxy")
    with file_lock(tools_dir() / ".fake-gcs-server.lock"):
        if target.is_file():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as gobin:
            started = time.monotonic()
            _say(verbose, f"go install {FAKE_GCS_MODULE}@{FAKE_GCS_VERSION} (first time: a few minutes) …")
            env = dict(os.environ)
            # The local toolchain (no toolchain download), no cgo: a static binary.
            env.update(GOTOOLCHAIN="local", CGO_ENABLED="0", GOFLAGS="-buildvcs=false -mod=mod", GOBIN=gobin)
            # Compiler optimisations off, no symbols (as Helm in dev.k8s_tools): 97 CPU s of compiling against 142;
            # the emulator still answers each of a test's few hundred requests in milliseconds.
            flags = ["-trimpath", "-gcflags=all=-N -l", "-ldflags=-s -w"]
            _run([go, "install", *flags, f"{FAKE_GCS_MODULE}@{FAKE_GCS_VERSION}"], env=env, cwd=Path(gobin))
            os.replace(Path(gobin) / "fake-gcs-server", target)
            _say(verbose, f"built {target} in {time.monotonic() - started:.0f} s")
    return target


def _run(command: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
    result = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        output = (result.stdout + result.stderr)[-_OUTPUT_TAIL:]
        raise ToolError(f"{' '.join(command)} failed (exit {result.returncode}):\n{output}")


def _say(verbose: bool, text: str) -> None:
    if verbose:
        print(text, file=sys.stderr)


def main() -> int:
    print(ensure_azurite(verbose=True))
    print(ensure_fake_gcs(verbose=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
