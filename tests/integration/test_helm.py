"""The Helm chart helm/kafka2delta, checked offline: `helm lint --strict` and `helm template` with the default
values and each ci/*-values.yaml; every rendered manifest validated against the Kubernetes JSON schemas
(PyPI kubernetes-validate, strict: unknown fields fail) for the oldest and newest Kubernetes the chart
supports, and ServiceMonitor/PrometheusRule against the OpenAPI schemas of the prometheus-operator CRDs;
the ConfigMap + Secret fed to the daemon's own config loader; pod security; the alert rules (promtool check
and promtool unit tests of each alert) and the dashboard's PromQL.

Helm is built once from the Go module proxy by dev/k8s_tools.py (about 4 minutes on 2 cores the first
time, cached in ~/.cache/kafka2delta/tools after that).
"""

from __future__ import annotations

import copy
import json
import math
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from dev import k8s_tools as dev_k8s_tools
from dev import tools as dev_tools
from kafka2delta import __version__
from kafka2delta import config as k2d_config
from kafka2delta.metrics import METRIC_NAMES

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "kafka2delta"
VALUES_FILES = {
    "default": None,
    "full": CHART / "ci" / "full-values.yaml",
    "existing-secret": CHART / "ci" / "existing-secret-values.yaml",
}
# Chart.yaml's kubeVersion is >=1.27; kubernetes-validate bundles schemas up to 1.37.
KUBERNETES_VERSIONS = ("1.27.0", "1.37.0")
APP_UID = 10001
HISTOGRAMS = {
    "kafka2delta_flush_duration_seconds",
    "kafka2delta_commit_duration_seconds",
    "kafka2delta_rows_per_commit",
    "kafka2delta_file_size_bytes",
    "kafka2delta_end_to_end_latency_seconds",
}


@pytest.fixture(scope="module")
def k8s_tools() -> ModuleType:
    return dev_k8s_tools


@pytest.fixture(scope="module")
def helm(k8s_tools: ModuleType) -> Path:
    return Path(k8s_tools.ensure_helm(verbose=True))


@pytest.fixture(scope="module")
def run_helm(helm: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(helm), *args], capture_output=True, text=True, check=False, cwd=ROOT)

    return run


def _values_args(values: Path | None, sets: tuple[str, ...] = ()) -> list[str]:
    args = ["-f", str(values)] if values else []
    for item in sets:
        args += ["--set", item]
    return args


@pytest.fixture(scope="module")
def render(run_helm: Callable[..., subprocess.CompletedProcess[str]]) -> Callable[..., list[dict[str, Any]]]:
    cache: dict[tuple[Any, ...], list[dict[str, Any]]] = {}

    def rendered(values: Path | None = None, *sets: str) -> list[dict[str, Any]]:
        key = (values, sets)
        if key not in cache:
            result = run_helm("template", "k2d", str(CHART), "--namespace", "ingest", *_values_args(values, sets))
            assert result.returncode == 0, result.stderr
            cache[key] = [d for d in yaml.safe_load_all(result.stdout) if d]
        return copy.deepcopy(cache[key])

    return rendered


def _by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def _one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in _by_kind(docs, kind) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {[d['metadata']['name'] for d in found]}"
    return found[0]


# ------------------------------------------------------------------ lint and schemas


@pytest.mark.parametrize("case", VALUES_FILES)
def test_helm_lint_strict(run_helm: Callable[..., subprocess.CompletedProcess[str]], case: str) -> None:
    result = run_helm("lint", "--strict", str(CHART), *_values_args(VALUES_FILES[case]))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


def _strict(schema: Any) -> Any:
    """An OpenAPI v3 schema of a CRD as a strict JSON schema: objects with declared properties refuse others
    (as kubeconform -strict does), unless the schema preserves unknown fields."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@pytest.fixture(scope="module")
def crd_validators(k8s_tools: ModuleType) -> dict[tuple[str, str], jsonschema.protocols.Validator]:
    validators = {}
    for path in sorted(Path(k8s_tools.ensure_crds(verbose=True)).glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            schema = _strict(version["schema"]["openAPIV3Schema"])
            schema["properties"]["metadata"] = {"type": "object"}  # ObjectMeta: checked by the core schemas' rules
            validators[(f"{group}/{version['name']}", kind)] = jsonschema.Draft7Validator(schema)
    assert ("monitoring.coreos.com/v1", "ServiceMonitor") in validators
    assert ("monitoring.coreos.com/v1", "PrometheusRule") in validators
    return validators


@pytest.mark.parametrize("case", VALUES_FILES)
def test_manifests_match_kubernetes_schemas(
    render: Callable[..., list[dict[str, Any]]],
    crd_validators: dict[tuple[str, str], jsonschema.protocols.Validator],
    case: str,
) -> None:
    docs = render(VALUES_FILES[case])
    assert docs
    problems = []
    for doc in docs:
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            validator = crd_validators[(doc["apiVersion"], doc["kind"])]
            problems += [f"{where}: {'/'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(doc)]
            continue
        for version in KUBERNETES_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                problems.append(f"{where} (k8s {version}): {'/'.join(map(str, exc.path))}: {exc.message}")
    assert not problems, "\n".join(problems)


def test_schema_validation_catches_mistakes(
    crd_validators: dict[tuple[str, str], jsonschema.protocols.Validator],
    render: Callable[..., list[dict[str, Any]]],
) -> None:
    """The validators are not vacuous: a misspelt field fails both the core and the CRD schemas."""
    docs = render(VALUES_FILES["full"])
    deployment = _one(docs, "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[-1], strict=True)
    monitor = _one(docs, "ServiceMonitor")
    monitor["spec"]["endpoints"][0]["intervall"] = "30s"
    assert list(crd_validators[("monitoring.coreos.com/v1", "ServiceMonitor")].iter_errors(monitor))


def test_values_schema_and_template_guards(run_helm: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    """values.schema.json and the templates refuse what would deploy wrongly."""
    cases = {
        "replicas=2": "additional properties 'replicas' not allowed",
        "alerts.lagGrowing.window=10": "want string",
        "config.kafka.settings.sasl\\.password=x": "holds a secret",
        "config.table.storage_options.AWS_SECRET_ACCESS_KEY=x": "holds a secret",
        "config.metrics.port=9999": "metrics",
        "config.transforms.day=x": "transforms",
        "config.ingset.allowed_latency_s=1": "ingset",
        "secret.existingSecret=creds,secret.kafkaSaslPassword=x": "existingSecret",
    }
    for setting, message in cases.items():
        result = run_helm("template", "k2d", str(CHART), "--set", setting)
        assert result.returncode != 0, f"--set {setting} was accepted"
        assert message in result.stderr, f"--set {setting}: {result.stderr}"


def test_config_sections_match_the_daemon() -> None:
    """values.schema.json knows exactly the daemon's config sections, so a misspelt section fails `helm
    install` instead of being ignored by the daemon (which skips K2D_ variables of unknown sections)."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    sections = set(schema["properties"]["config"]["propertyNames"]["enum"])
    daemon = set(k2d_config.SECTIONS)
    assert sections == daemon, f"chart knows {sorted(sections)}, the daemon {sorted(daemon)}: update values.schema.json"


def test_app_version_is_the_package_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    assert chart["appVersion"] == __version__


# ------------------------------------------------------------------ what is rendered


def test_default_objects(render: Callable[..., list[dict[str, Any]]]) -> None:
    docs = render()
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == [
        "ConfigMap",
        "ConfigMap",
        "CronJob",
        "CronJob",
        "Deployment",
        "PodDisruptionBudget",
        "Service",
        "ServiceAccount",
    ], kinds
    jobs = {d["metadata"]["name"]: d for d in _by_kind(docs, "CronJob")}
    assert set(jobs) == {"k2d-kafka2delta-optimize", "k2d-kafka2delta-vacuum"}
    optimize = jobs["k2d-kafka2delta-optimize"]["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert optimize["containers"][0]["args"] == ["maintain", "optimize"]
    assert optimize["containers"][0]["image"] == f"kafka2delta-maintenance:{__version__}"
    vacuum = jobs["k2d-kafka2delta-vacuum"]["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert vacuum["containers"][0]["args"] == ["maintain", "vacuum", "--retain-hours", "168"]
    deployment = _one(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == f"kafka2delta:{__version__}"
    assert pod["containers"][0]["envFrom"] == [{"configMapRef": {"name": "k2d-kafka2delta"}}]
    assert pod["terminationGracePeriodSeconds"] == 5 + 60
    assert _one(docs, "PodDisruptionBudget")["spec"] == {
        "maxUnavailable": 1,
        "selector": deployment["spec"]["selector"],
    }


def test_full_objects(render: Callable[..., list[dict[str, Any]]]) -> None:
    docs = render(VALUES_FILES["full"])
    assert {d["kind"] for d in docs} >= {"ServiceMonitor", "PrometheusRule", "Secret"}
    jobs = {d["metadata"]["name"]: d["spec"] for d in _by_kind(docs, "CronJob")}
    args = {
        name.removeprefix("k2d-kafka2delta-"): spec["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["args"]
        for name, spec in jobs.items()
    }
    assert args == {
        "optimize": ["maintain", "optimize", "--zorder-by", "customer.id,ts"],
        "vacuum": ["maintain", "vacuum", "--retain-hours", "336"],
        "mutate": ["jobs", "mutate", "--available-now"],
        "ttl": ["jobs", "ttl", "--available-now", "--job-name", "gdpr"],
        "apply-customers": [
            *("jobs", "apply-changes", "--available-now"),
            *("--source", "s3://lake/bronze/cdc_customers", "--target", "s3://lake/silver/customers"),
            *("--job-name", "apply-customers", "--key", "tenant,id", "--delete-mode", "soft"),
            *("--max-files-per-trigger", "200", "--conf", "spark.sql.shuffle.partitions=64"),
        ],
        "purge-customers": [
            *("maintain", "optimize", "--table", "s3://lake/silver/customers", "--purge-deletion-vectors"),
        ],
        "apply-products": [
            *("jobs", "apply-changes", "--available-now"),
            *("--source", "s3://lake/bronze/cdc_products", "--target", "s3://lake/silver/products"),
            *("--job-name", "apply-products", "--conf", "spark.sql.shuffle.partitions=64"),
        ],
    }
    for spec in jobs.values():
        assert spec["concurrencyPolicy"] == "Forbid" and spec["timeZone"] == "Europe/Paris"
        pod = spec["jobTemplate"]["spec"]["template"]["spec"]
        assert pod["containers"][0]["image"].startswith("registry.example.com/data/kafka2delta-maintenance@sha256:")
        assert pod["nodeSelector"] == {"node-role/batch": "true"}
    deployment = _one(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] == 4
    assert pod["terminationGracePeriodSeconds"] == 120
    assert pod["nodeSelector"]["node-role/ingest"] == "true" and pod["tolerations"][0]["value"] == "ingest"
    assert "podAntiAffinity" in pod["affinity"] and pod["topologySpreadConstraints"]
    container = pod["containers"][0]
    assert container["envFrom"][:2] == [
        {"configMapRef": {"name": "k2d-kafka2delta"}},
        {"secretRef": {"name": "k2d-kafka2delta"}},
    ]
    assert {e["name"] for e in container["env"]} == {"TZ", "POD_NAME"}
    monitor = _one(docs, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    rule = _one(docs, "PrometheusRule")
    expressions = [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert all('namespace="ingest"' in e for e in expressions), expressions
    assert any("> 50000" in e for e in expressions) and any("histogram_quantile(0.99," in e for e in expressions)
    assert _one(docs, "ConfigMap", "k2d-kafka2delta-dashboard")["metadata"]["namespace"] == "monitoring"
    assert _one(docs, "PodDisruptionBudget")["spec"]["minAvailable"] == 3


def _cronjobs(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in _by_kind(docs, "CronJob")}


def test_apply_changes_cronjobs(render: Callable[..., list[dict[str, Any]]]) -> None:
    """One CronJob per maintenance.jobs.applyChanges table, with its own --job-name (its own checkpoint and
    coordinator turns), and a purge CronJob for a table with a purgeSchedule; built like the other jobs."""
    docs = render(VALUES_FILES["full"])
    jobs = _cronjobs(docs)
    apply, purge = jobs["k2d-kafka2delta-apply-customers"], jobs["k2d-kafka2delta-purge-customers"]
    assert "k2d-kafka2delta-apply-products" in jobs and "k2d-kafka2delta-purge-products" not in jobs
    assert apply["spec"]["schedule"] == "*/10 * * * *" and purge["spec"]["schedule"] == "40 4 * * 0"
    for job, component in ((apply, "maintenance-apply-customers"), (purge, "maintenance-purge-customers")):
        assert job["metadata"]["labels"]["app.kubernetes.io/component"] == component
        assert job["spec"]["jobTemplate"]["metadata"]["labels"]["app.kubernetes.io/component"] == component
        pod = job["spec"]["jobTemplate"]["spec"]["template"]
        assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == component
        assert pod["metadata"]["labels"]["team"] == "data-platform"
        assert pod["spec"]["containers"][0]["name"] == job["metadata"]["name"].removeprefix("k2d-kafka2delta-")
    # Everything but the schedule, the container's name and arguments and the component is the optimize job's.
    for job in (apply, purge):
        component = job["metadata"]["labels"]["app.kubernetes.io/component"]
        optimize = json.loads(json.dumps(jobs["k2d-kafka2delta-optimize"]).replace("maintenance-optimize", component))
        for spec in (job["spec"], optimize["spec"]):
            del spec["schedule"]
            container = spec["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
            del container["name"], container["args"]
        assert job["spec"] == optimize["spec"]
        assert job["metadata"]["labels"] == optimize["metadata"]["labels"]
    # The apply job reads its table's entry, then the common args.
    rendered = _cronjobs(
        render(
            None,
            "maintenance.jobs.applyChanges.enabled=true",
            "maintenance.jobs.applyChanges.tables[0].name=t",
            "maintenance.jobs.applyChanges.tables[0].source=s3://b/changes",
            "maintenance.jobs.applyChanges.tables[0].target=s3://b/current",
            "maintenance.jobs.applyChanges.tables[0].deleteMode=hard",
            "maintenance.jobs.applyChanges.args={--json}",
        )
    )
    assert set(rendered) == {f"k2d-kafka2delta-{j}" for j in ("optimize", "vacuum", "apply-t")}
    container = rendered["k2d-kafka2delta-apply-t"]["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == [
        *("jobs", "apply-changes", "--available-now", "--source", "s3://b/changes", "--target", "s3://b/current"),
        *("--job-name", "apply-t", "--delete-mode", "hard", "--json"),
    ]


def test_cronjob_names_fit_kubernetes(render: Callable[..., list[dict[str, Any]]]) -> None:
    """CronJob names stay within 52 characters (their Jobs add 11) with a long release name and the longest
    table name the schema allows; the full name keeps its first 43 characters where the job leaves room."""
    release = "k2d-" + "x" * 60
    long_name = "t" * 20
    docs = render(
        VALUES_FILES["full"],
        f"fullnameOverride={release}",
        f"maintenance.jobs.applyChanges.tables[1].name={long_name}",
        "maintenance.jobs.applyChanges.tables[1].purgeSchedule=0 5 * * *",
    )
    names = set(_cronjobs(docs))
    assert all(len(name) <= 52 for name in names), sorted(names)
    assert {f"{release[:43]}-{job}" for job in ("optimize", "vacuum", "mutate", "ttl")} < names
    assert {f"{release[:36]}-apply-customers", f"{release[:36]}-purge-customers"} < names
    assert {f"{release[:25]}-apply-{long_name}", f"{release[:25]}-purge-{long_name}"} < names


def test_apply_changes_guards(run_helm: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    """The schema and the template refuse apply-changes tables that would deploy wrongly: a name that is not
    a short DNS label or is used twice, a missing source, an unknown delete mode, a target the daemon writes
    or that another table already has, no tables at all."""
    table = "maintenance.jobs.applyChanges.tables[1]"
    cases = {
        f"{table}.name=Products": "does not match pattern",
        f"{table}.name={'p' * 21}": "maxLength",
        f"{table}.name=customers": "already the name of another table",
        f"{table}.source=null": "applyChanges/tables/1/source",
        f"{table}.deleteMode=purge": "value must be one of",
        f"{table}.target=s3://lake/bronze/orders/": "a table the daemon writes",
        f"{table}.target=s3://lake/bronze/orders_dead_letters": "a table the daemon writes",
        f"{table}.target=s3://lake/silver/customers": "already another table's target",
        f"{table}.target=s3://lake/bronze/cdc_products": "source and target are the same table",
        "maintenance.jobs.applyChanges.tables=null": "enabled without tables",
    }
    for setting, message in cases.items():
        result = run_helm("template", "k2d", str(CHART), *_values_args(VALUES_FILES["full"], (setting,)))
        assert result.returncode != 0, f"--set {setting} was accepted"
        assert message in result.stderr, f"--set {setting}: {result.stderr}"


def test_container_args_parse_with_the_cli(render: Callable[..., list[dict[str, Any]]]) -> None:
    """The Deployment's and every CronJob's arguments are a command line kafka2delta's own parser accepts."""
    from kafka2delta import cli

    for name, pod in _pods(render(VALUES_FILES["full"])):
        args = pod["containers"][0]["args"]
        try:
            parsed = cli._parser().parse_args(args)
        except SystemExit as exc:
            raise AssertionError(f"{name}: kafka2delta {' '.join(args)} is refused") from exc
        assert parsed.command == args[0], name


def test_existing_secret(render: Callable[..., list[dict[str, Any]]]) -> None:
    docs = render(VALUES_FILES["existing-secret"])
    assert not _by_kind(docs, "Secret")
    refs = [_one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["envFrom"]]
    refs += [
        j["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["envFrom"]
        for j in _by_kind(docs, "CronJob")
    ]
    for envfrom in refs:
        assert {"secretRef": {"name": "orders-ingest-credentials"}} in envfrom, envfrom


def _pods(docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    pods = [(d["metadata"]["name"], d["spec"]["template"]["spec"]) for d in _by_kind(docs, "Deployment")]
    pods += [
        (d["metadata"]["name"], d["spec"]["jobTemplate"]["spec"]["template"]["spec"]) for d in _by_kind(docs, "CronJob")
    ]
    return pods


@pytest.mark.parametrize("case", VALUES_FILES)
def test_pods_are_locked_down(render: Callable[..., list[dict[str, Any]]], case: str) -> None:
    docs = render(VALUES_FILES[case])
    for name, pod in _pods(docs):
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["runAsUser"] == APP_UID, name
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert pod["automountServiceAccountToken"] is False, name
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert "emptyDir" in volumes["tmp"], name
        for container in pod["containers"]:
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True, name
            assert context["allowPrivilegeEscalation"] is False, name
            assert context["capabilities"] == {"drop": ["ALL"]}, name
            assert context["runAsNonRoot"] is True and context["runAsUser"] == APP_UID, name
            assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"], name
            assert container["resources"].get("limits", {}).get("memory"), f"{name}: no memory limit"


@pytest.mark.parametrize("case", VALUES_FILES)
def test_probes_service_and_grace_period(render: Callable[..., list[dict[str, Any]]], case: str) -> None:
    path = VALUES_FILES[case]
    values = yaml.safe_load(path.read_text()) if path else {}
    docs = render(VALUES_FILES[case])
    deployment = _one(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    port = values.get("metrics", {}).get("port", 9102)
    assert container["ports"] == [{"name": "metrics", "containerPort": port, "protocol": "TCP"}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    service = _one(docs, "Service")
    assert service["spec"]["ports"][0]["name"] == "metrics" and service["spec"]["ports"][0]["targetPort"] == "metrics"
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    latency = values.get("config", {}).get("ingest", {}).get("allowed_latency_s", 5)
    expected = values.get("terminationGracePeriodSeconds") or math.ceil(latency) + 60
    assert pod["terminationGracePeriodSeconds"] == expected
    assert pod["terminationGracePeriodSeconds"] > latency


@pytest.mark.parametrize("case", VALUES_FILES)
def test_environment_is_a_valid_daemon_config(render: Callable[..., list[dict[str, Any]]], case: str) -> None:
    """The ConfigMap and Secret, as the pod's environment, through the daemon's own config loader."""
    docs = render(VALUES_FILES[case])
    environ = dict(_one(docs, "ConfigMap", "k2d-kafka2delta")["data"])
    for secret in _by_kind(docs, "Secret"):
        environ.update(secret["stringData"])
    assert all(name.startswith("K2D_") for name in environ)
    config = k2d_config.load_config(None, environ)
    assert config.metrics.host == "0.0.0.0"
    assert config.logging.format == "json"
    if case == "full":
        assert config.metrics.port == 9300
        assert config.kafka.settings["sasl.password"] == "sasl-password"
        assert config.kafka.settings["security.protocol"] == "SASL_SSL"
        assert config.table.storage_options["AWS_SECRET_ACCESS_KEY"] == "aws-secret"
        assert config.table.storage_options["AWS_SESSION_TOKEN"] == "session-token"
        assert config.table.partition_by == ("date",)
        assert config.table.schema["customer"] == "struct<id:long,country:string>"
        assert [target for target, _ in config.transforms] == ["date", "meta.offset", "tenant"]
        assert config.ingest.min_bytes_per_file == 134_217_728 and config.ingest.max_buffered_bytes == 536_870_912
        assert config.ingest.allowed_latency_s == 30.0 and config.kafka.consume_timeout_s == 0.5
        assert config.coercions.epoch_units == {"created": "s"}
        assert config.schema_registry.password == "registry-password"
        for name, value in environ.items():
            if any(word in name for word in ("PASSWORD", "SECRET", "TOKEN")):
                assert name not in _one(docs, "ConfigMap", "k2d-kafka2delta")["data"], name
                assert value


# ------------------------------------------------------------------ alerts and dashboard


def test_alerts_file_is_the_charts_rules(render: Callable[..., list[dict[str, Any]]]) -> None:
    """files/alerts.yaml (a plain rule file) holds exactly the PrometheusRule's groups with the default values:
    regenerate it with `python -m dev.k8s_tools alerts` after changing the rules."""
    rule = _one(render(None, "prometheusRule.enabled=true"), "PrometheusRule")
    on_disk = yaml.safe_load((CHART / "files" / "alerts.yaml").read_text())
    assert on_disk == {"groups": rule["spec"]["groups"]}


def _metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\bkafka2delta_[a-z0-9_]+", expr))


def _known_metrics() -> set[str]:
    names = set(METRIC_NAMES)
    return names | {f"{h}_{suffix}" for h in HISTOGRAMS & names for suffix in ("bucket", "sum", "count")}


def _dashboard() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads((CHART / "files" / "dashboard.json").read_text())
    return dashboard


def _dashboard_exprs() -> list[str]:
    return [t["expr"] for p in _dashboard()["panels"] for t in p.get("targets", [])]


def test_dashboard_and_alerts_use_known_metrics() -> None:
    alerts = yaml.safe_load((CHART / "files" / "alerts.yaml").read_text())
    exprs = _dashboard_exprs() + [r["expr"] for g in alerts["groups"] for r in g["rules"]]
    unknown = {name for expr in exprs for name in _metric_names(expr)} - _known_metrics()
    assert not unknown, f"not exported by the daemon: {sorted(unknown)}"


def test_dashboard_structure(render: Callable[..., list[dict[str, Any]]]) -> None:
    dashboard = _dashboard()
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert {"job", "instance", "topic"} <= set(variables)
    ids, titles = set(), []
    cells: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        assert panel["id"] not in ids, f"duplicate panel id {panel['id']}"
        ids.add(panel["id"])
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        mine = {
            (x, y) for x in range(grid["x"], grid["x"] + grid["w"]) for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not mine & cells, f"panel {panel['title']!r} overlaps another"
        cells |= mine
        if panel["type"] == "row":
            continue
        titles.append(panel["title"].lower())
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"
            assert 'job=~"$job"' in target["expr"] and 'instance=~"$instance"' in target["expr"], target["expr"]
    for wanted in (
        "throughput",
        "lag per partition",
        "latency",
        "commits /s",
        "commit and flush duration",
        "dead letters by stage",
        "conflicts and retries",
        "buffered messages",
        "since last commit",
    ):
        assert any(wanted in t for t in titles), f"no panel about {wanted}: {titles}"
    exprs = " ".join(_dashboard_exprs())
    for quantile in ("0.5", "0.95", "0.99"):
        assert (
            f"histogram_quantile({quantile}, sum by (le) (rate(kafka2delta_end_to_end_latency_seconds_bucket" in exprs
        )
    configmap = _one(render(), "ConfigMap", "k2d-kafka2delta-dashboard")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(configmap["data"]["kafka2delta.json"]) == dashboard


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if not found:
        found = dev_tools.ensure(["prometheus"]).get("promtool")  # Debian's prometheus package
    if not found:
        pytest.skip("promtool (Debian package prometheus) is not installed")
    return str(found)


def _promtool(promtool: str, *args: str) -> None:
    result = subprocess.run([promtool, *args], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_checks_alerts_and_dashboard_queries(promtool: str, tmp_path: Path) -> None:
    """`promtool check rules` on files/alerts.yaml, and on every dashboard query as a recording rule (with the
    dashboard's variables as Grafana's "All" would set them), so that each one is parsed by Prometheus."""
    _promtool(promtool, "check", "rules", str(CHART / "files" / "alerts.yaml"))
    rules = []
    for number, expr in enumerate(_dashboard_exprs()):
        rules.append(
            {
                "record": f"dashboard:query_{number}",
                "expr": expr.replace("$job", ".*").replace("$instance", ".*").replace("$topic", ".*"),
            }
        )
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    _promtool(promtool, "check", "rules", str(path))


# Each alert fires on a series that should trip it, and stays quiet on its look-alike; the annotations are
# checked as Prometheus renders them (promtool compares them too).
_LABELS = 'job="k2d", instance="pod-a:9102"'
_POD = {"job": "k2d", "instance": "pod-a:9102"}


def _fires(alert: str, at: str, labels: dict[str, str], summary: str, description: str) -> dict[str, Any]:
    expected = {"exp_labels": labels, "exp_annotations": {"summary": summary, "description": description}}
    return {"eval_time": at, "alertname": alert, "exp_alerts": [expected]}


def _quiet(alert: str, at: str) -> dict[str, Any]:
    return {"eval_time": at, "alertname": alert, "exp_alerts": []}


def _series(name: str, values: str, **labels: str) -> dict[str, str]:
    extra = "".join(f', {k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{_LABELS}{extra}}}", "values": values}


_ALERT_TESTS = [
    {
        "interval": "1m",
        "input_series": [
            _series("kafka2delta_consumer_lag", "20000+1000x40", topic="t", partition="0"),  # growing
            _series("kafka2delta_consumer_lag", "50000x40", topic="t", partition="1"),  # high, flat
            _series("kafka2delta_consumer_lag", "0+10x40", topic="t", partition="2"),  # growing, small
        ],
        "alert_rule_test": [
            _fires(
                "Kafka2DeltaConsumerLagGrowing",
                "35m",
                {**_POD, "severity": "warning", "topic": "t", "partition": "0"},
                "kafka2delta lag on t[0] keeps growing",
                "Lag 55k messages on pod-a:9102, rising for 15m: the daemon consumes slower than producers write, "
                "or is stuck.",
            ),
            _quiet("Kafka2DeltaConsumerLagGrowing", "10m"),
        ],
    },
    {
        "interval": "1m",
        "input_series": [
            _series("kafka2delta_seconds_since_last_commit", "0+60x40"),
            _series("kafka2delta_consumer_lag", "500x40", topic="t", partition="0"),
            # An idle topic: nothing to commit, no alert.
            {"series": 'kafka2delta_seconds_since_last_commit{job="k2d", instance="idle:9102"}', "values": "0+60x40"},
            {
                "series": 'kafka2delta_consumer_lag{job="k2d", instance="idle:9102", topic="u", partition="0"}',
                "values": "0x40",
            },
        ],
        "alert_rule_test": [
            _fires(
                "Kafka2DeltaNoCommit",
                "30m",
                {**_POD, "severity": "critical"},
                "kafka2delta on pod-a:9102 has not committed for 15 minutes",
                "No Delta commit for 30m 0s while its partitions have lag: check the logs for storage errors, "
                "conflicts or a stuck consumer.",
            ),
            _fires(
                "Kafka2DeltaAbsent",
                "30m",
                {"severity": "critical"},
                "No kafka2delta daemon is being scraped",
                "Prometheus has seen no kafka2delta_build_info series for 10m: every daemon is down, or the scrape "
                "is broken.",
            ),
        ],
    },
    {
        "interval": "1m",
        "input_series": [
            _series("kafka2delta_build_info", "1x40", version=__version__),
            _series("kafka2delta_messages_dead_lettered_total", "0+120x40", topic="t", stage="coerce"),
            _series("kafka2delta_messages_dead_lettered_total", "0+1x40", topic="t", stage="deserialize"),
            _series("kafka2delta_commit_conflicts_total", "0x10 1x30", topic="t", partition="0"),
            _series("kafka2delta_storage_retries_total", "0+1x40"),
            _series("kafka2delta_end_to_end_latency_seconds_bucket", "0+1x40", topic="t", le="60"),
            _series("kafka2delta_end_to_end_latency_seconds_bucket", "0+10x40", topic="t", le="600"),
            _series("kafka2delta_end_to_end_latency_seconds_bucket", "0+10x40", topic="t", le="+Inf"),
        ],
        "alert_rule_test": [
            _quiet("Kafka2DeltaAbsent", "30m"),
            _fires(
                "Kafka2DeltaDeadLetters",
                "30m",
                {**_POD, "severity": "warning", "topic": "t", "stage": "coerce"},
                "kafka2delta dead-letters t messages at stage coerce",
                "2 dead letters per second on pod-a:9102 (threshold 0.1/s): see the error column of the dead-letter "
                "table.",
            ),
            _fires(
                "Kafka2DeltaCommitConflicts",
                "20m",
                {**_POD, "severity": "warning", "topic": "t"},
                "Commit conflicts on t",
                "1 commit conflicts in 15m on pod-a:9102: another writer moved the offsets of this table (two "
                "deployments with the same table and app id?).",
            ),
            _quiet("Kafka2DeltaCommitConflicts", "40m"),
            _fires(
                "Kafka2DeltaStorageRetries",
                "30m",
                {**_POD, "severity": "warning"},
                "kafka2delta on pod-a:9102 keeps retrying storage operations",
                "Storage writes or commits have been failing and retried for 15m; offsets are held until they succeed.",
            ),
            _fires(
                "Kafka2DeltaEndToEndLatencyHigh",
                "30m",
                {**_POD, "severity": "warning", "topic": "t"},
                "End-to-end latency of t is high",
                "The 0.95 quantile of the latency from Kafka timestamp to Delta commit is 9m 30s on pod-a:9102 "
                "(threshold 300 s).",
            ),
        ],
    },
]


def test_alerts_fire_as_documented(promtool: str, tmp_path: Path) -> None:
    """`promtool test rules`: lag growing (not merely high), no commit while there is lag (not on an idle
    topic), no daemon at all, dead letters above the rate (per stage), a conflict, storage retries, latency."""
    tests = tmp_path / "alerts-test.yaml"
    tests.write_text(
        yaml.safe_dump(
            {"rule_files": [str(CHART / "files" / "alerts.yaml")], "evaluation_interval": "1m", "tests": _ALERT_TESTS},
            sort_keys=False,
        )
    )
    _promtool(promtool, "test", "rules", str(tests))
