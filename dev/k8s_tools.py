"""Tools the Helm chart's checks need, built or fetched once into a cache outside the repo.

    python -m dev.k8s_tools helm      # build the pinned Helm with `go install` (Go module proxy); print its path
    python -m dev.k8s_tools crds      # the pinned ServiceMonitor, PrometheusRule and ScaledObject CRDs; print their dir
    python -m dev.k8s_tools alerts    # regenerate helm/kafka2delta/files/alerts.yaml from the chart's defaults

Helm is a Go program and no package carries it here, so it is built from source with the Go toolchain
(``go install helm.sh/helm/v3/cmd/helm@HELM_VERSION``, with the ldflags of Helm's own Makefile) into
``$K2D_TOOLS_DIR`` (default ``~/.cache/kafka2delta/tools``)/helm-<version>/helm. The CRDs whose OpenAPI
schemas validate the chart's custom resources offline come from Go modules too, downloaded with
``go mod download`` from the module proxy and copied next to Helm: ServiceMonitor and PrometheusRule from
``example/prometheus-operator-crd/`` of the prometheus-operator module, KEDA's ScaledObject from
``config/crd/bases/`` of github.com/kedacore/keda/v2 (the module's zip holds the operator's kustomize base).
Both steps are idempotent (a tool already there at the pinned version is left alone) and hold a file lock,
so parallel callers build once. The first Helm build takes about 2 minutes on 2 cores (module downloads
included); later calls return at once.

Imported by tests/integration/test_helm.py (``ensure_helm()``, ``ensure_crds()``) and by tests/conftest.py,
which starts both in the background on a new machine.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

HELM_VERSION = "v3.22.0"
# Helm v3.22.0 is built against k8s.io/client-go v0.37.0: the Kubernetes version it assumes by default
# (`.Capabilities.KubeVersion`), as its Makefile sets with these ldflags.
HELM_K8S_VERSION = ("1", "37")
PROMETHEUS_OPERATOR_MODULE = "github.com/prometheus-operator/prometheus-operator"
PROMETHEUS_OPERATOR_VERSION = "v0.85.0"
KEDA_MODULE = "github.com/kedacore/keda/v2"
# KEDA v2.21.0 (2026-09-23, the newest on proxy.golang.org when pinned): keda.sh/v1alpha1 ScaledObject.
KEDA_VERSION = "v2.21.0"
# (Go module, version, directory in the module, CRD files): the chart's custom resources' schemas.
CRD_SOURCES = (
    (
        PROMETHEUS_OPERATOR_MODULE,
        PROMETHEUS_OPERATOR_VERSION,
        "example/prometheus-operator-crd",
        ("monitoring.coreos.com_servicemonitors.yaml", "monitoring.coreos.com_prometheusrules.yaml"),
    ),
    (KEDA_MODULE, KEDA_VERSION, "config/crd/bases", ("keda.sh_scaledobjects.yaml",)),
)
CRD_FILES = tuple(name for *_, names in CRD_SOURCES for name in names)

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "kafka2delta"
ALERTS_FILE = CHART / "files" / "alerts.yaml"
ALERTS_HEADER = """\
# Prometheus alerting rules for kafka2delta, in Prometheus's rule-file format (`promtool check rules` reads it).
# GENERATED from the chart's defaults (helm/kafka2delta/templates/_alerts.tpl, values `alerts:`) by
#   python -m dev.k8s_tools alerts
# The chart's PrometheusRule (prometheusRule.enabled) embeds the same groups, with thresholds from values.
# tests/integration/test_helm.py fails when this file and the chart disagree.
"""


class ToolError(RuntimeError):
    """A tool could not be built or fetched; the message carries the command and the end of its output."""


def tools_dir() -> Path:
    env = os.environ.get("K2D_TOOLS_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "kafka2delta" / "tools"


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    path = tools_dir() / f".{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _go_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    # The local toolchain (no toolchain download), no cgo: a static binary.
    env.update({"GOTOOLCHAIN": "local", "CGO_ENABLED": "0", "GOFLAGS": "-buildvcs=false -mod=mod"}, **extra)
    return env


def _run(command: list[str], env: dict[str, str], cwd: Path) -> str:
    # Go's own tarball layout when /usr/local/go/bin is not on PATH (e.g. a CI shell with a minimal PATH).
    fallback = (g for g in ("/usr/local/go/bin/go", "/usr/lib/go/bin/go") if Path(g).is_file())
    go = shutil.which("go") or next(fallback, None)
    if go is None:
        raise ToolError("`go` is not on PATH: the Go toolchain is needed to build Helm from the Go module proxy")
    result = subprocess.run([go, *command[1:]], env=env, cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        output = (result.stdout + result.stderr)[-4000:]
        raise ToolError(f"{' '.join(command)} failed (exit {result.returncode}):\n{output}")
    return result.stdout


def helm_path() -> Path:
    return tools_dir() / f"helm-{HELM_VERSION}" / "helm"


def _helm_version(binary: Path) -> str | None:
    if not binary.is_file():
        return None
    result = subprocess.run(
        [str(binary), "version", "--template", "{{.Version}}"], capture_output=True, text=True, check=False
    )
    return result.stdout.strip() if result.returncode == 0 else None


def ensure_helm(verbose: bool = False) -> Path:
    """The pinned Helm binary, built with ``go install`` if it is not in the cache yet."""
    target = helm_path()
    if _helm_version(target) == HELM_VERSION:
        return target
    with _locked("helm"):
        if _helm_version(target) == HELM_VERSION:  # built by another process while we waited
            return target
        major, minor = HELM_K8S_VERSION
        ldflags = " ".join(
            [
                "-s -w",
                f"-X helm.sh/helm/v3/internal/version.version={HELM_VERSION}",
                "-X helm.sh/helm/v3/internal/version.gitTreeState=clean",
                f"-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor={major}",
                f"-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor={minor}",
                f"-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor={major}",
                f"-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor={minor}",
            ]
        )
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as gobin:
            started = time.monotonic()
            if verbose:
                print(f"building helm {HELM_VERSION} with go install (first time: a few minutes) …", file=sys.stderr)
            _run(
                # Compiler optimisations off (-N -l): the build takes a third less CPU (90 s against 139 s on 2
                # cores, modules already downloaded), which a fresh CI run waits for, and a chart render stays
                # well under a second.
                [
                    "go",
                    "install",
                    "-trimpath",
                    "-gcflags=all=-N -l",
                    "-ldflags",
                    ldflags,
                    f"helm.sh/helm/v3/cmd/helm@{HELM_VERSION}",
                ],
                _go_env(GOBIN=gobin),
                cwd=Path(gobin),
            )
            os.replace(Path(gobin) / "helm", target)
            if verbose:
                print(f"built {target} in {time.monotonic() - started:.0f} s", file=sys.stderr)
    version = _helm_version(target)
    if version != HELM_VERSION:
        raise ToolError(f"{target} reports version {version!r}, expected {HELM_VERSION}")
    return target


def crds_dir() -> Path:
    return tools_dir() / f"crds-prometheus-operator-{PROMETHEUS_OPERATOR_VERSION}-keda-{KEDA_VERSION}"


def ensure_crds(verbose: bool = False) -> Path:
    """A directory holding the pinned ServiceMonitor, PrometheusRule and ScaledObject CRDs (YAML)."""
    target = crds_dir()
    if all((target / name).is_file() for name in CRD_FILES):
        return target
    with _locked("crds"):
        if all((target / name).is_file() for name in CRD_FILES):
            return target
        with tempfile.TemporaryDirectory(dir=tools_dir()) as work:
            staging = Path(work) / "crds"
            staging.mkdir()
            for module_path, version, directory, names in CRD_SOURCES:
                module = f"{module_path}@{version}"
                if verbose:
                    print(f"go mod download {module} …", file=sys.stderr)
                info = json.loads(_run(["go", "mod", "download", "-json", module], _go_env(), cwd=Path(work)))
                if "Error" in info:
                    raise ToolError(f"go mod download {module}: {info['Error']}")
                for name in names:
                    source = Path(info["Dir"]) / directory / name
                    if not source.is_file():
                        raise ToolError(f"{module} has no {directory}/{name}")
                    shutil.copyfile(source, staging / name)
            if target.exists():
                shutil.rmtree(target)
            os.replace(staging, target)
    return target


def render_alerts(helm: Path) -> str:
    """files/alerts.yaml as the chart's default values make it: the PrometheusRule's groups, as a rule file."""
    import yaml  # a dev dependency; imported here so that `helm` and `crds` need nothing but the stdlib

    result = subprocess.run(
        [
            str(helm),
            "template",
            "k2d",
            str(CHART),
            "--show-only",
            "templates/prometheusrule.yaml",
            "--set",
            "prometheusRule.enabled=true",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise ToolError(f"helm template failed:\n{result.stderr[-4000:]}")
    rule = yaml.safe_load(result.stdout)
    body: str = yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False, width=1000, allow_unicode=True)
    return ALERTS_HEADER + body


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("helm", "crds", "alerts", "all"))
    args = parser.parse_args(argv)
    try:
        if args.what in ("helm", "all"):
            print(ensure_helm(verbose=True))
        if args.what in ("crds", "all"):
            print(ensure_crds(verbose=True))
        if args.what == "alerts":
            ALERTS_FILE.write_text(render_alerts(ensure_helm(verbose=True)))
            print(ALERTS_FILE)
    except ToolError as exc:
        print(f"k8s_tools: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
