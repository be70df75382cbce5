"""Debian tools the tests need, installed once: ``python -m dev.tools ensure chromium prometheus postgresql``.

Idempotent: a tool whose programs are already on PATH is left alone; otherwise ``apt-get update`` runs (once
per call) and then ``apt-get install -y --no-install-recommends`` with the missing packages. Package services
are never started: a ``policy-rc.d`` that refuses every start is in place during the install (the tests run
Prometheus themselves, on loopback, with their own configuration). Needs root (or password-less sudo).

Also importable (``ensure(["chromium"])``): the integration tests call it from a session fixture, and a
missing tool is a test failure with apt's own output, never a skip. ``make tools`` runs it for every tool.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

# tool → (Debian package, programs it must put on PATH). A program given as an absolute glob pattern is looked
# for there instead (the newest match wins): Debian keeps PostgreSQL's server programs off PATH, in
# /usr/lib/postgresql/<major>/bin (dev/postgres runs them).
TOOLS: dict[str, tuple[str, tuple[str, ...]]] = {
    "chromium": ("chromium", ("chromium",)),
    "prometheus": ("prometheus", ("prometheus", "promtool")),
    "postgresql": ("postgresql", ("psql", "/usr/lib/postgresql/*/bin/initdb", "/usr/lib/postgresql/*/bin/postgres")),
    # The container images built for real without a Docker engine (dev/image.py, `make image-test`, as root): a
    # base from Debian packages (mmdebstrap), the Dockerfile built by buildah and run by podman with runc, not
    # Debian's default crun: crun 1.8 refuses a cgroup v1/v2 hybrid host whose v2 hierarchy has a controller
    # ("cgroups in hybrid mode not supported"), even with --cgroups=disabled.
    "mmdebstrap": ("mmdebstrap", ("mmdebstrap",)),
    "buildah": ("buildah", ("buildah",)),
    "podman": ("podman", ("podman",)),
    "runc": ("runc", ("runc",)),
}
_POLICY = Path("/usr/sbin/policy-rc.d")
_LOCK = Path("/tmp/kafka2delta-dev-tools.lock")
_OUTPUT_TAIL = 4000


class ToolInstallError(RuntimeError):
    """apt-get could not install a tool; the message carries the command and the end of its output."""


def missing(tools: Sequence[str]) -> list[str]:
    """The tools among ``tools`` whose programs are not all on PATH."""
    unknown = [t for t in tools if t not in TOOLS]
    if unknown:
        raise ValueError(f"unknown tools {unknown}; known: {sorted(TOOLS)}")
    return [t for t in tools if not all(find(program) for program in TOOLS[t][1])]


def find(program: str) -> str | None:
    """``program``'s path: on PATH, or for an absolute glob pattern the newest match (by major version)."""
    if not program.startswith("/"):
        return shutil.which(program)
    pattern = Path(program)
    matches = [p for p in Path(pattern.anchor).glob(str(pattern.relative_to(pattern.anchor))) if os.access(p, os.X_OK)]
    if not matches:
        return None
    return str(max(matches, key=lambda p: [int(part) if part.isdigit() else -1 for part in p.parts]))


def ensure(tools: Sequence[str]) -> dict[str, str]:
    """Install what is missing among ``tools``; return each program's path. Raises ToolInstallError."""
    todo = missing(tools)
    if todo:
        with _locked():
            todo = missing(todo)  # another process may have installed them while we waited
            if todo:
                _install([TOOLS[t][0] for t in todo])
        still = missing(todo)
        if still:
            raise ToolInstallError(f"apt-get ran but {still} are still not on PATH")
    return {program: str(find(program)) for t in tools for program in TOOLS[t][1]}


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    with open(_LOCK, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _apt(*args: str) -> None:
    command = ["apt-get", *args]
    if os.geteuid() != 0:
        if not shutil.which("sudo"):
            raise ToolInstallError(f"installing needs root: run `sudo {' '.join(command)}` once")
        command = ["sudo", "-n", "env", "DEBIAN_FRONTEND=noninteractive", *command]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    print(f"dev/tools.py: {' '.join(command)}", file=sys.stderr, flush=True)
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    if result.returncode != 0:
        output = (result.stdout + result.stderr)[-_OUTPUT_TAIL:]
        raise ToolInstallError(f"`{' '.join(command)}` failed with exit code {result.returncode}:\n{output}")


def _install(packages: list[str]) -> None:
    # policy-rc.d exit 101 = "action forbidden": postinst scripts must not start the packages' services.
    placed = False
    if os.geteuid() == 0 and not _POLICY.exists():
        _POLICY.write_text("#!/bin/sh\nexit 101\n")
        _POLICY.chmod(0o755)
        placed = True
    try:
        _apt("update", "-q")
        _apt("install", "-y", "-q", "--no-install-recommends", *packages)
    finally:
        if placed:
            _POLICY.unlink(missing_ok=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    commands = parser.add_subparsers(dest="command", required=True)
    ensure_parser = commands.add_parser("ensure", help="install the tools that are missing")
    ensure_parser.add_argument("tools", nargs="*", help=f"default: all ({', '.join(TOOLS)})")
    args = parser.parse_args(argv)
    try:
        paths = ensure(args.tools or list(TOOLS))
    except ToolInstallError as exc:
        print(f"dev/tools.py: {exc}", file=sys.stderr)
        return 1
    for program, path in paths.items():
        print(f"{program}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
