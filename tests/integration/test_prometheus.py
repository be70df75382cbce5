"""The dashboard and the alert rules, checked against a real Prometheus scraping a real daemon.

Prometheus (Debian's ``prometheus`` package, installed by ``dev/tools.py`` when missing; its service never
started) runs on loopback with its own config: it scrapes a daemon that is ingesting from the real broker
every second and loads ``helm/kafka2delta/files/alerts.yaml`` as its rule file. Then every PromQL expression
of ``helm/kafka2delta/files/dashboard.json`` (Grafana panel ``targets[].expr``) and of the rule file is
evaluated through Prometheus's HTTP API: each must parse, name only metrics the daemon exposes, and the core
panels (throughput, lag, latency percentiles, commit rate and duration) must return data. ``promtool check
rules`` must pass on the rule file, and Prometheus must evaluate every rule without error.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kafka2delta.metrics import METRIC_NAMES
from tests.support.harness import BackgroundProducer, Message, Setup, wait_for
from tests.support.observability import ensure_tools, free_port, http_get, scrape, total

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "helm" / "kafka2delta" / "files" / "dashboard.json"
ALERTS = ROOT / "helm" / "kafka2delta" / "files" / "alerts.yaml"
JOB = "kafka2delta"
# A panel whose expression reads one of these must show data while the daemon ingests.
CORE_METRICS = {
    "kafka2delta_messages_consumed_total": "throughput",
    "kafka2delta_rows_written_total": "throughput",
    "kafka2delta_consumer_lag": "lag",
    "kafka2delta_end_to_end_latency_seconds_bucket": "latency percentiles",
    "kafka2delta_commits_total": "commit rate",
    "kafka2delta_commit_duration_seconds_bucket": "commit duration",
}
# Grafana's built-in interval variables, for a 1 s scrape interval.
GRAFANA_INTERVALS = {"__rate_interval": "1m", "__interval": "15s", "__range": "5m", "__interval_ms": "15000"}
_VARIABLE = re.compile(r"\$\{(\w+)(?::[\w]+)?\}|\[\[(\w+)\]\]|\$(\w+)")
_EXACT_MATCH_ON_VARIABLE = re.compile(r'(\w+)\s*=\s*"((?:\$\{\w+(?::\w+)?\}|\[\[\w+\]\]|\$\w+))"')
_METRIC = re.compile(r"\bkafka2delta_[a-z0-9_]+")


def dashboard_expressions(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) of every target of every panel, rows' nested panels included."""
    found: list[tuple[str, str]] = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            for target in panel.get("targets") or []:
                if target.get("expr"):
                    found.append((str(panel.get("title", "?")), str(target["expr"])))
            walk(panel.get("panels") or [])

    walk(dashboard.get("panels") or [])
    return found


def grafana_to_promql(expr: str, values: dict[str, str]) -> str:
    """Grafana's template variables replaced: known ones by their value, the others by a match-anything regex."""
    expr = _EXACT_MATCH_ON_VARIABLE.sub(lambda m: f'{m.group(1)}=~"{m.group(2)}"', expr)

    def replace(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2) or match.group(3)
        return GRAFANA_INTERVALS.get(name) or values.get(name, ".*")

    return _VARIABLE.sub(replace, expr)


def exposed_family(metric: str) -> str:
    """The family a sample name belongs to (histogram series end in _bucket, _sum, _count)."""
    if metric in METRIC_NAMES:
        return metric
    for suffix in ("_bucket", "_sum", "_count"):
        if metric.endswith(suffix) and metric[: -len(suffix)] in METRIC_NAMES:
            return metric[: -len(suffix)]
    return metric


class Prometheus:
    def __init__(self, binary: str, work: Path, target: str, rule_file: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = work / "prometheus.yml"
        config.write_text(
            json.dumps(  # JSON is YAML
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "900ms"},
                    "rule_files": [str(rule_file)],
                    "scrape_configs": [
                        {
                            "job_name": JOB,
                            "static_configs": [{"targets": [target], "labels": {"namespace": "k2d-test"}}],
                        }
                    ],
                }
            )
        )
        self.log_path = work / "prometheus.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={work / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def api(self, path: str, **params: str) -> dict[str, Any]:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return dict(json.load(response))
        except urllib.error.HTTPError as error:  # a bad query: 400 with a JSON error body
            return dict(json.loads(error.read()))

    def query(self, expr: str) -> dict[str, Any]:
        return self.api("query", query=expr, time=f"{time.time():.3f}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


@pytest.fixture
def prometheus_factory(tmp_path: Path) -> Iterator[Callable[[str], Prometheus]]:
    started: list[Prometheus] = []
    binary = ensure_tools("prometheus")["prometheus"]

    def start(target: str) -> Prometheus:
        work = tmp_path / f"prometheus-{len(started)}"
        work.mkdir()
        server = Prometheus(binary, work, target, ALERTS)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def values_of(result: dict[str, Any]) -> list[float]:
    data = result["data"]
    if data["resultType"] == "scalar":
        return [float(data["result"][1])]
    return [float(series["value"][1]) for series in data["result"]]


def test_promtool_accepts_the_alert_rules() -> None:
    assert ALERTS.exists(), f"{ALERTS.relative_to(ROOT)} is missing (the Helm chart's alert rules)"
    promtool = ensure_tools("prometheus")["promtool"]
    result = subprocess.run([promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr


def test_dashboard_and_alert_expressions_on_a_real_prometheus(
    setup_factory: Callable[..., Setup],
    daemon_factory: Callable[..., Any],
    prometheus_factory: Callable[[str], Prometheus],
) -> None:
    assert DASHBOARD.exists(), f"{DASHBOARD.relative_to(ROOT)} is missing (the Helm chart's Grafana dashboard)"
    assert ALERTS.exists(), f"{ALERTS.relative_to(ROOT)} is missing (the Helm chart's alert rules)"
    panels = dashboard_expressions(json.loads(DASHBOARD.read_text()))
    assert panels, "the dashboard has no panel with a PromQL expression"

    port = free_port()
    setup = setup_factory(
        2,
        sections={"metrics": {"port": port, "host": "127.0.0.1"}},
        allowed_latency_s=0.5,
        progress_interval_s=1.0,
    )
    # A few dead letters too, so the dead-letter panels have series; then live traffic for the whole test.
    setup.topic.produce_messages([Message(p, b"{not json") for p in range(2) for _ in range(3)])
    producer = BackgroundProducer(setup.topic, per_partition=2000, chunk=40, pause_s=0.4)
    daemon = daemon_factory(setup)
    target = f"127.0.0.1:{port}"
    try:
        wait_for(
            lambda: (
                daemon.process.poll() is not None or total(scrape(f"http://{target}"), "kafka2delta_commits_total") > 0
            ),
            60,
            "the daemon's first commit",
        )
        assert daemon.process.poll() is None, daemon.log()[-3000:]
        prometheus = prometheus_factory(target)
        wait_for(
            lambda: prometheus.process.poll() is not None or http_get(f"{prometheus.url}/-/ready")[0] == 200,
            60,
            "Prometheus ready",
        )
        assert prometheus.process.poll() is None, prometheus.log()

        def scraped_enough() -> bool:
            result = prometheus.query(f'count_over_time(up{{job="{JOB}"}}[1m])')
            ups = prometheus.query(f'up{{job="{JOB}"}}')
            return (
                result.get("status") == "success"
                and values_of(result) != []
                and values_of(result)[0] >= 8
                and values_of(ups) == [1.0]
            )

        wait_for(scraped_enough, 60, "8 successful scrapes of the daemon")

        variables = {"job": JOB, "instance": target, "topic": setup.topic.name, "namespace": "k2d-test"}
        failures: list[str] = []
        checked: dict[str, int] = {}
        for title, expr in panels:
            promql = grafana_to_promql(expr, variables)
            unknown = {m for m in _METRIC.findall(promql) if exposed_family(m) not in METRIC_NAMES}
            if unknown:
                failures.append(f"panel {title!r}: metrics the daemon does not expose: {sorted(unknown)} in {expr}")
            result = prometheus.query(promql)
            if result.get("status") != "success":
                failures.append(f"panel {title!r}: {result.get('errorType')}: {result.get('error')} in {promql}")
                continue
            core = {CORE_METRICS[m] for m in _METRIC.findall(promql) if m in CORE_METRICS}
            for kind in core:
                checked[kind] = checked.get(kind, 0) + 1
            numbers = values_of(result)
            if core and not any(math.isfinite(v) for v in numbers):
                failures.append(f"panel {title!r} ({', '.join(sorted(core))}): no data: {promql} → {numbers}")
        assert set(checked) == set(CORE_METRICS.values()), f"the dashboard lacks core panels: {checked}"

        # The rule file as Prometheus loaded it: every rule evaluated without error, every expr parses.
        def rules_evaluated() -> bool:
            groups = prometheus.api("rules").get("data", {}).get("groups", [])
            rules = [rule for group in groups for rule in group["rules"]]
            return bool(rules) and all(rule.get("lastEvaluation", "").startswith("20") for rule in rules)

        wait_for(rules_evaluated, 30, "Prometheus to evaluate every rule")
        rules = [rule for group in prometheus.api("rules")["data"]["groups"] for rule in group["rules"]]
        alert_names = {rule["name"] for rule in rules}
        for rule in rules:
            if rule.get("health") != "ok":
                failures.append(f"rule {rule['name']}: {rule.get('health')}: {rule.get('lastError')}")
            unknown = {m for m in _METRIC.findall(rule["query"]) if exposed_family(m) not in METRIC_NAMES}
            if unknown:
                failures.append(f"rule {rule['name']}: metrics the daemon does not expose: {sorted(unknown)}")
            result = prometheus.query(rule["query"])
            if result.get("status") != "success":
                failures.append(f"rule {rule['name']}: {result.get('errorType')}: {result.get('error')}")
        firing = [rule["name"] for rule in rules if rule.get("state") == "firing"]
        assert not failures, "\n".join(failures)
        assert not firing, f"alerts firing on a healthy daemon: {firing}"
        assert len(alert_names) >= 4, alert_names

        # Prometheus saw what the daemon counted: rows per second while the producer runs.
        rate = values_of(prometheus.query(f'sum(rate(kafka2delta_rows_written_total{{job="{JOB}"}}[1m]))'))
        assert rate and rate[0] > 0
        print(
            f"\n{len(panels)} dashboard expressions and {len(rules)} alert rules evaluated; core panels: {checked}; "
            f"rows/s seen by Prometheus: {rate[0]:.0f}"
        )
    finally:
        producer.join()
        daemon.stop()
