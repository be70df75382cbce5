"""Reading what the daemon shows over HTTP (``/metrics``, the status page), and the Debian tools the
observability tests drive (Chromium, Prometheus)."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dev import tools as dev_tools


def ensure_tools(*tools: str) -> dict[str, str]:
    """The programs of ``tools``, installed from Debian when missing; a failed install fails the test."""
    try:
        paths: dict[str, str] = dev_tools.ensure(list(tools))
    except dev_tools.ToolInstallError as exc:
        pytest.fail(f"cannot install {tools} (python -m dev.tools ensure {' '.join(tools)}): {exc}", pytrace=False)
    return paths


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_get(url: str, accept: str | None = None) -> tuple[int, str, str]:
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], error.read().decode()
    except OSError as error:
        return 0, "", str(error)


def scrape(base: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``/metrics`` by (name, sorted labels)."""
    code, _, text = http_get(f"{base}/metrics")
    if code != 200:
        return {}
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def total(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= set(ls))
