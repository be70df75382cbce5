"""The container images built for real, without a Docker engine and without a registry.

    python -m dev.image base                      # a bookworm base from Debian packages → localhost/k2d-base:bookworm
    python -m dev.image build [--target T] [--s3-jars]   # the Dockerfile's targets on that base (buildah)
    python -m dev.image images                    # what the store holds, with sizes
    python -m dev.image clean                     # remove the store (images, containers, layers)
    make image-test                               # base + build + tests/image/test_image.py (the images, run)

No base image can be pulled here (no Docker Hub), so ``base`` makes one from Debian packages: ``mmdebstrap``
(variant minbase, plus python3, python3-venv and ca-certificates) into a tarball, ``podman import``ed as
``localhost/k2d-base:bookworm``. Its apt sources are this machine's Debian ones and it trusts the CA
certificates this machine added under /usr/local/share/ca-certificates, because the Dockerfile's RUN steps
reach Debian, PyPI and Maven Central through the same network as the host. ``build`` then runs
``buildah bud --isolation chroot --format docker --pull=never --build-arg PYTHON_IMAGE=<that base>``
(``--format docker``: OCI images have no HEALTHCHECK), and the tests run the images with ``podman run``.

No layer cache (no ``--layers``): buildah 1.28 reuses a cached ``RUN --mount=type=bind`` layer when what is
mounted changed (containers/buildah#4522, #5400, #6609: mounts are not in its cache key), and every RUN of
the Dockerfile bind-mounts docker/ and the builder's wheels, so a cached build would keep the old kafka2delta.
Each build starts from the base (about 2 min for the daemon, 6 for the maintenance image with overlay).

Everything lives in one store outside the repository, ``$K2D_IMAGE_DIR`` (default /var/tmp/kafka2delta-images):
``--root``/``--runroot`` are given to every buildah and podman call, so the machine's own container storage is
never touched and ``clean`` removes it all. The storage driver is ``$K2D_IMAGE_STORAGE_DRIVER``: ``auto``
(default) takes ``overlay`` when this process can mount an overlayfs (root, native overlay), else ``vfs``
(a full copy of every layer: several GB and minutes more per build and per container start).

What this sandbox needed (and a normal root shell on Debian 12 may too), given to every ``podman run``:
``--runtime runc`` (Debian's default crun 1.8 refuses a cgroup v1/v2 hybrid host whose v2 hierarchy has a
controller, even with --cgroups=disabled) with ``--cgroup-manager cgroupfs`` (no systemd), and explicit
``--ulimit nofile=N:N --ulimit nproc=M:M`` within this process's hard limits (podman's defaults, 1048576,
are above them, and raising a hard limit needs CAP_SYS_RESOURCE). Needs root: mmdebstrap in root mode,
buildah/podman with a root store (no user namespace, so no uidmap). Tools come from Debian through
dev/tools.py (mmdebstrap, buildah, podman, runc).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dev.tools import ensure as ensure_tools

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"
DEFAULT_DIR = Path("/var/tmp/kafka2delta-images")
BASE_IMAGE = "localhost/k2d-base:bookworm"
SUITE = "bookworm"
# What the Dockerfile's scripts need from a base that python.org's image would have given: python3 with venv
# (ensurepip), and CA certificates for pip, apt over https and Maven. install-build-deps.sh adds pip and the
# headers in the builder stages when the base's python3 has no pip.
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
# The Dockerfile's final targets and the local tags they are built as.
TARGETS: dict[str, str] = {
    "daemon": "localhost/kafka2delta:dev",
    "maintenance": "localhost/kafka2delta-maintenance:dev",
}
TOOLS = ("mmdebstrap", "buildah", "podman", "runc")
APP_UID = 10001
_EXTRA_CAS = Path("/usr/local/share/ca-certificates")
_ULIMIT_CAP = {"nofile": 1048576, "nproc": 32768}
_OUTPUT_TAIL = 6000


class ImageError(RuntimeError):
    """A step failed; the message carries the command and the end of its output."""


@dataclass(frozen=True)
class Store:
    """One container store (``--root``/``--runroot``) and its storage driver, shared by buildah and podman."""

    dir: Path
    driver: str

    @classmethod
    def from_env(cls, directory: Path | None = None, driver: str | None = None) -> Store:
        directory = directory or Path(os.environ.get("K2D_IMAGE_DIR") or DEFAULT_DIR)
        driver = driver or os.environ.get("K2D_IMAGE_STORAGE_DRIVER") or "auto"
        if driver == "auto":
            driver = "overlay" if overlay_mounts(directory) else "vfs"
        return cls(directory, driver)

    def options(self) -> list[str]:
        storage, run = str(self.dir / "storage"), str(self.dir / "run")
        return ["--root", storage, "--runroot", run, "--storage-driver", self.driver]

    def buildah(self, *args: str) -> list[str]:
        return ["buildah", *self.options(), *args]

    def podman(self, *args: str) -> list[str]:
        return ["podman", *self.options(), "--runtime", "runc", "--cgroup-manager", "cgroupfs", *args]


def overlay_mounts(directory: Path) -> bool:
    """Whether an overlayfs can be mounted under ``directory`` (the overlay driver's need as root)."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory, prefix="overlay-probe-") as tmp:
        parts = {name: Path(tmp, name) for name in ("lower", "upper", "work", "merged")}
        for path in parts.values():
            path.mkdir()
        options = f"lowerdir={parts['lower']},upperdir={parts['upper']},workdir={parts['work']}"
        mounted = subprocess.run(
            ["mount", "-t", "overlay", "overlay", "-o", options, str(parts["merged"])], capture_output=True, check=False
        )
        if mounted.returncode != 0:
            return False
        subprocess.run(["umount", str(parts["merged"])], capture_output=True, check=False)
        return True


def run_options() -> list[str]:
    """``podman run`` options every container of this module gets: ulimits within this process's hard limits."""
    options = []
    for name, limit in (("nofile", resource.RLIMIT_NOFILE), ("nproc", resource.RLIMIT_NPROC)):
        hard = resource.getrlimit(limit)[1]
        value = _ULIMIT_CAP[name] if hard == resource.RLIM_INFINITY else min(hard, _ULIMIT_CAP[name])
        options += ["--ulimit", f"{name}={value}:{value}"]
    return options


def _run(command: Sequence[str], *, log: Path | None = None, timeout: float = 3600) -> str:
    """Run ``command``; its output goes to ``log`` (appended) and is returned. Raises ImageError on failure."""
    print(f"dev/image.py: {' '.join(command)}", file=sys.stderr, flush=True)
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    output = result.stdout + result.stderr
    if log is not None:
        with log.open("a") as handle:
            handle.write(f"$ {' '.join(command)}\n{output}\n")
    if result.returncode != 0:
        where = f" (full output: {log})" if log else ""
        raise ImageError(f"`{' '.join(command)}` exited {result.returncode}{where}:\n{output[-_OUTPUT_TAIL:]}")
    return result.stdout


@contextlib.contextmanager
def _locked(store: Store) -> Iterator[None]:
    """One builder at a time per store (make image-build and a test run may overlap)."""
    store.dir.mkdir(parents=True, exist_ok=True)
    with open(store.dir / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def exists(store: Store, image: str) -> bool:
    return subprocess.run(store.podman("image", "exists", image), capture_output=True, check=False).returncode == 0


def size(store: Store, image: str) -> int:
    """The image's size in bytes (all its layers, uncompressed)."""
    return int(_run(store.podman("image", "inspect", "--format", "{{.Size}}", image)).strip())


def host_apt_sources() -> list[Path]:
    """This machine's enabled Debian apt sources (one-line or deb822 files): what the base's apt will use.
    Third-party sources are left out (their keyrings are not in the base)."""
    candidates = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    sources = []
    for path in candidates:
        if path.suffix not in (".list", ".sources") or not path.is_file():
            continue
        lines = [line.strip() for line in path.read_text().splitlines()]
        active = [line for line in lines if line and not line.startswith("#")]
        if any(re.search(r"\bdebian(-security)?\b", line) for line in active if "://" in line):
            sources.append(path)
    return sources


def build_base(store: Store, *, force: bool = False) -> float:
    """mmdebstrap a minimal bookworm into a tarball and import it as BASE_IMAGE; return the seconds taken
    (0 when it already exists and ``force`` is false)."""
    ensure_tools(list(TOOLS))
    with _locked(store):
        if exists(store, BASE_IMAGE) and not force:
            return 0.0
        started = time.monotonic()
        tarball = store.dir / f"base-{SUITE}.tar"
        log = store.dir / "base.log"
        log.write_text("")
        sources = host_apt_sources()
        # The CAs this machine added (a proxy's, a company's): the image builds reach the network as it does.
        hook = (
            f'mkdir -p "$1{_EXTRA_CAS}" && for c in {_EXTRA_CAS}/*.crt; do [ -e "$c" ] && cp "$c" "$1{_EXTRA_CAS}/"; '
            'done; chroot "$1" update-ca-certificates'
        )
        command = [
            "mmdebstrap",
            "--variant=minbase",
            f"--include={','.join(BASE_PACKAGES)}",
            f"--customize-hook={hook}",
            SUITE,
            str(tarball),
            *(str(path) for path in sources),  # none: mmdebstrap's default, http://deb.debian.org/debian
        ]
        _run(command, log=log)
        with contextlib.suppress(ImageError):
            _run(store.podman("rmi", "--force", BASE_IMAGE), log=log)
        _run(
            store.podman(
                "import",
                "--change",
                "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "--change",
                'CMD ["/bin/bash"]',
                str(tarball),
                BASE_IMAGE,
            ),
            log=log,
        )
        tarball.unlink()
        return time.monotonic() - started


@dataclass(frozen=True)
class Built:
    target: str
    image: str
    seconds: float
    bytes: int


def build(store: Store, target: str, *, s3_jars: bool = False, base: str = BASE_IMAGE) -> Built:
    """``buildah bud`` of the Dockerfile's ``target`` on ``base``, from scratch (no layer cache, see the module's
    doc). S3_JARS is false unless ``s3_jars`` (530 MB of jars no test needs). The image the tag named before is
    removed once no tag names it."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; known: {sorted(TARGETS)}")
    ensure_tools(list(TOOLS))
    with _locked(store):
        started = time.monotonic()
        log = store.dir / f"build-{target}.log"
        log.write_text("")
        _run(
            store.buildah(
                "bud",
                "--isolation",
                "chroot",
                "--format",
                "docker",
                "--pull=never",
                "--build-arg",
                f"PYTHON_IMAGE={base}",
                "--build-arg",
                f"S3_JARS={'true' if s3_jars else 'false'}",
                "--target",
                target,
                "--tag",
                TARGETS[target],
                "--file",
                str(DOCKERFILE),
                str(ROOT),
            ),
            log=log,
            timeout=7200,
        )
        _run(store.buildah("rmi", "--prune"), log=log)  # the previous build's image, now untagged
        return Built(target, TARGETS[target], time.monotonic() - started, size(store, TARGETS[target]))


def run(
    store: Store,
    image: str,
    args: Sequence[str] = (),
    *,
    env: Mapping[str, str] | None = None,
    volumes: Mapping[Path, str] | None = None,
    options: Sequence[str] = (),
    remove: bool = True,
    timeout: float = 600,
) -> subprocess.CompletedProcess[str]:
    """``podman run`` of ``image`` the way a hardened pod runs it: host network (the test broker listens on
    127.0.0.1), read-only root filesystem, a tmpfs on /tmp, no capabilities, the image's user (10001);
    ``--rm`` unless ``remove`` is false."""
    command = store.podman(
        "run",
        *(["--rm"] if remove else []),
        "--network",
        "host",
        "--read-only",
        "--tmpfs",
        "/tmp:rw,size=2g,mode=1777",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        *run_options(),
        *(f"--volume={host}:{inside}" for host, inside in (volumes or {}).items()),
        *(f"--env={key}={value}" for key, value in (env or {}).items()),
        *options,
        image,
        *args,
    )
    print(f"dev/image.py: {' '.join(command)}", file=sys.stderr, flush=True)
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)


def images(store: Store) -> list[tuple[str, str, int]]:
    """(names, id, size in bytes) of every image in the store, intermediate build layers included."""
    listed = json.loads(_run(store.podman("images", "--all", "--format", "json")) or "[]")
    return [(", ".join(entry.get("Names") or ["<none>"]), entry["Id"][:12], int(entry["Size"])) for entry in listed]


def clean(store: Store) -> None:
    """Remove every container, image and layer of the store, then the store itself."""
    if not store.dir.exists():
        return
    with _locked(store):
        for command in (store.buildah("rm", "--all"), store.podman("rm", "--all", "--force")):
            subprocess.run(command, capture_output=True, check=False)
        subprocess.run(store.podman("rmi", "--all", "--force"), capture_output=True, check=False)
        # Leftover overlay/shm mounts under the store would make rmtree fail half-way.
        mounts = subprocess.run(["findmnt", "-rn", "-o", "TARGET"], capture_output=True, text=True, check=False)
        for target in sorted(mounts.stdout.split(), key=len, reverse=True):
            if target.startswith(str(store.dir) + "/"):
                subprocess.run(["umount", "-l", target], capture_output=True, check=False)
    shutil.rmtree(store.dir, ignore_errors=True)


def _mb(value: int) -> str:
    return f"{value / 1e6:,.0f} MB"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--dir", type=Path, help=f"the store (default $K2D_IMAGE_DIR or {DEFAULT_DIR})")
    parser.add_argument(
        "--storage-driver", choices=("auto", "overlay", "vfs"), help="default $K2D_IMAGE_STORAGE_DRIVER, else auto"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    base_parser = commands.add_parser("base", help=f"mmdebstrap a {SUITE} base and import it as {BASE_IMAGE}")
    base_parser.add_argument("--force", action="store_true", help="rebuild it even when the store has it")
    build_parser = commands.add_parser("build", help="buildah bud the Dockerfile's targets on the base")
    build_parser.add_argument("--target", choices=(*TARGETS, "all"), default="all")
    build_parser.add_argument("--s3-jars", action="store_true", help="S3_JARS=true (hadoop-aws, AWS SDK: +530 MB)")
    build_parser.add_argument("--base", default=BASE_IMAGE, help=f"PYTHON_IMAGE (default {BASE_IMAGE}, built first)")
    commands.add_parser("images", help="the images in the store, with sizes")
    commands.add_parser("clean", help="remove the store")
    args = parser.parse_args(argv)
    store = Store.from_env(args.dir, args.storage_driver)
    print(f"dev/image.py: store {store.dir} (storage driver {store.driver})", file=sys.stderr)
    try:
        if args.command == "base":
            seconds = build_base(store, force=args.force)
            print(f"{BASE_IMAGE}: {_mb(size(store, BASE_IMAGE))}" + (f", built in {seconds:.0f} s" if seconds else ""))
        elif args.command == "build":
            if args.base == BASE_IMAGE:
                build_base(store)
            for target in TARGETS if args.target == "all" else (args.target,):
                built = build(store, target, s3_jars=args.s3_jars, base=args.base)
                print(f"{built.image} ({built.target}): {_mb(built.bytes)}, built in {built.seconds:.0f} s")
        elif args.command == "images":
            for names, image_id, image_bytes in images(store):
                print(f"{image_id}  {_mb(image_bytes):>10}  {names}")
        elif args.command == "clean":
            clean(store)
            print(f"removed {store.dir}")
    except ImageError as exc:
        print(f"dev/image.py: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
