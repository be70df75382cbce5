"""The Helm chart helm/kafka2delta, checked offline: `helm lint --strict` and `helm template` with the default
values and each ci/*-values.yaml; every rendered manifest validated against the Kubernetes JSON schemas
(PyPI kubernetes-validate, strict: unknown fields fail) for the oldest and newest Kubernetes the chart
supports, ServiceMonitor/PrometheusRule against the OpenAPI schemas of the prometheus-operator CRDs and the
KEDA ScaledObject against KEDA's; each pod's environment (ConfigMap, Secret as variables or as mounted files,
the static member's pod name) fed to the daemon's own config loader; the StatefulSet of static membership,
the Deployment without it (byte-identical to the chart before), KEDA autoscaling; pod security; the alert
rules (promtool check and promtool unit tests of each alert) and the dashboard's PromQL.

Helm is built once from the Go module proxy by dev/k8s_tools.py (about 2 minutes on 2 cores the first
time, started in the background by tests/conftest.py as soon as this module is collected; cached in
~/.cache/kafka2delta/tools after that).
"""

from __future__ import annotations

import copy
import io
import json
import math
import re
import shutil
import subprocess
import tarfile
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
    "deployment": CHART / "ci" / "deployment-values.yaml",
}
# Chart.yaml's kubeVersion is >=1.27; kubernetes-validate bundles schemas up to 1.37.
KUBERNETES_VERSIONS = ("1.27.0", "1.37.0")
APP_UID = 10001
SECRETS_DIR = "/var/run/secrets/kafka2delta"
GROUP_INSTANCE_ID = "K2D_KAFKA__SETTINGS__GROUP_INSTANCE_ID"
# The last commit of the chart before static membership, KEDA and secrets as files: with staticMembership=false
# and secret.mountAsFiles=false the chart still renders exactly what it rendered then.
BASELINE_COMMIT = "1663032e0325d0115c12147bc9597a44a7fe3de6"
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


def _workload(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The daemon's StatefulSet (staticMembership) or Deployment: exactly one of them."""
    found = [d for d in docs if d["kind"] in ("StatefulSet", "Deployment")]
    assert len(found) == 1, [f"{d['kind']}/{d['metadata']['name']}" for d in found]
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
    assert ("keda.sh/v1alpha1", "ScaledObject") in validators
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
        group = doc["apiVersion"].rpartition("/")[0]
        if "." in group and not group.endswith(".k8s.io"):
            # A custom resource (monitoring.coreos.com, keda.sh): its CRD's schema, which must be known here.
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
    workload = _workload(docs)
    workload["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(workload, KUBERNETES_VERSIONS[-1], strict=True)
    monitor = _one(docs, "ServiceMonitor")
    monitor["spec"]["endpoints"][0]["intervall"] = "30s"
    assert list(crd_validators[("monitoring.coreos.com/v1", "ServiceMonitor")].iter_errors(monitor))
    scaler = crd_validators[("keda.sh/v1alpha1", "ScaledObject")]
    scaled = _one(docs, "ScaledObject")
    assert not list(scaler.iter_errors(scaled))
    for mistake in (
        lambda s: s["spec"].update(maxReplicas=4),  # not a ScaledObject field
        lambda s: s["spec"]["triggers"][0]["metadata"].update(lagThreshold=100),  # metadata values are strings
        lambda s: s["spec"].update(maxReplicaCount=0),  # minimum 1
        lambda s: s["spec"].pop("scaleTargetRef"),  # required
    ):
        wrong = copy.deepcopy(scaled)
        mistake(wrong)
        assert list(scaler.iter_errors(wrong)), wrong["spec"]


def test_values_schema_and_template_guards(run_helm: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    """values.schema.json and the templates refuse what would deploy wrongly."""
    cases = {
        "replicas=2": "additional properties 'replicas' not allowed",
        "alerts.lagGrowing.window=10": "want string",
        "config.kafka.settings.sasl\\.password=x": "holds a secret",
        "config.table.storage_options.AWS_SECRET_ACCESS_KEY=x": "holds a secret",
        # The daemon's rule for options (is_secret_key), not only the words: a part named key, pem, sas or jaas.
        "config.table.storage_options.AZURE_STORAGE_ACCOUNT_KEY=x": "holds a secret",
        "config.kafka.settings.ssl\\.key\\.pem=x": "holds a secret",
        "config.kafka.settings.sasl\\.jaas\\.config=x": "holds a secret",
        "config.kafka.settings.sasl\\.oauthbearer\\.config=x": "holds a secret",
        "config.spark.conf.spark\\.hadoop\\.fs\\.azure\\.sas\\.lake\\.acct=x": "holds a secret",
        "config.metrics.port=9999": "metrics",
        "config.transforms.day=x": "transforms",
        "config.ingset.allowed_latency_s=1": "ingset",
        "secret.existingSecret=creds,secret.kafkaSaslPassword=x": "existingSecret",
        # A target given twice would be one JSON key: one transform silently lost.
        "transforms[0].target=a,transforms[0].expression=x,transforms[1].target=a,transforms[1].expression=y": (
            'transforms: target "a" is given twice'
        ),
        "routes[0].uri=s3://l/r,routes[0].transforms[0].target=a,routes[0].transforms[0].expression=x,"
        "routes[0].transforms[1].target=a,routes[0].transforms[1].expression=y": (
            'routes[].transforms: target "a" is given twice'
        ),
    }
    for setting, message in cases.items():
        result = run_helm("template", "k2d", str(CHART), "--set", setting)
        assert result.returncode != 0, f"--set {setting} was accepted"
        assert message in result.stderr, f"--set {setting}: {result.stderr}"


def test_file_paths_stay_in_the_configmap_and_the_grace_period_rounds_up(
    render: Callable[..., list[dict[str, Any]]],
) -> None:
    # A file's path is no secret (the file is mounted from one): the option rule must not refuse it.
    docs = render(
        None,
        "config.kafka.settings.ssl\\.key\\.location=/etc/kafka/client.pem",
        "config.ingest.allowed_latency_s=50.5",
    )
    data = next(d["data"] for d in _by_kind(docs, "ConfigMap") if d["metadata"]["name"] == "k2d-kafka2delta")
    assert data["K2D_KAFKA__SETTINGS__SSL_KEY_LOCATION"] == "/etc/kafka/client.pem"
    assert _workload(docs)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 51 + 60


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
        "PodDisruptionBudget",
        "Service",
        "ServiceAccount",
        "StatefulSet",
    ], kinds
    jobs = {d["metadata"]["name"]: d for d in _by_kind(docs, "CronJob")}
    assert set(jobs) == {"k2d-kafka2delta-optimize", "k2d-kafka2delta-vacuum"}
    optimize = jobs["k2d-kafka2delta-optimize"]["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert optimize["containers"][0]["args"] == ["maintain", "optimize"]
    assert optimize["containers"][0]["image"] == f"kafka2delta-maintenance:{__version__}"
    vacuum = jobs["k2d-kafka2delta-vacuum"]["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert vacuum["containers"][0]["args"] == ["maintain", "vacuum", "--retain-hours", "168"]
    statefulset = _one(docs, "StatefulSet")
    pod = statefulset["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == f"kafka2delta:{__version__}"
    assert pod["containers"][0]["envFrom"] == [{"configMapRef": {"name": "k2d-kafka2delta"}}]
    # No Secret by default: nothing to mount, no K2D_SECRETS_DIR; the pod's name as group.instance.id.
    assert pod["containers"][0]["env"] == [
        {"name": GROUP_INSTANCE_ID, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    ]
    assert [v["name"] for v in pod["volumes"]] == ["tmp"]
    assert pod["terminationGracePeriodSeconds"] == 45 + 60  # retry_after_stop_s's default, the larger
    assert _one(docs, "PodDisruptionBudget")["spec"] == {
        "maxUnavailable": 1,
        "selector": statefulset["spec"]["selector"],
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
    statefulset = _one(docs, "StatefulSet")
    pod = statefulset["spec"]["template"]["spec"]
    assert "replicas" not in statefulset["spec"]  # KEDA owns it
    assert pod["terminationGracePeriodSeconds"] == 120
    assert pod["nodeSelector"]["node-role/ingest"] == "true" and pod["tolerations"][0]["value"] == "ingest"
    assert "podAntiAffinity" in pod["affinity"] and pod["topologySpreadConstraints"]
    container = pod["containers"][0]
    # The Secret is mounted as files (secret.mountAsFiles, the default): envFrom has the ConfigMap and extraEnvFrom.
    assert container["envFrom"] == [
        {"configMapRef": {"name": "k2d-kafka2delta"}},
        {"configMapRef": {"name": "orders-extra-settings", "optional": True}},
    ]
    assert [e["name"] for e in container["env"]] == [GROUP_INSTANCE_ID, "K2D_SECRETS_DIR", "TZ", "POD_NAME"]
    assert {"name": "kafka-ca", "mountPath": "/etc/kafka-ca", "readOnly": True} in container["volumeMounts"]
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
        f"{table}.name=orders-2": "ends in -<number>",
        f"{table}.source=null": "applyChanges/tables/1/source",
        f"{table}.deleteMode=purge": "value must be one of",
        f"{table}.target=s3://lake/bronze/orders/": "a table the daemon writes",
        f"{table}.target=s3://lake/bronze/orders_dead_letters": "a table the daemon writes",
        f"routes[0].uri=s3://lake/r,routes[0].dead_letter_table_uri=s3://lake/r_dlq,{table}.target=s3://lake/r_dlq": (
            "a table the daemon writes"
        ),
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
    """A Secret managed outside the chart is read like the chart's own: mounted as files by default, with
    envFrom when secret.mountAsFiles is false; in the daemon and every CronJob."""
    docs = render(VALUES_FILES["existing-secret"])
    assert not _by_kind(docs, "Secret")
    pods = _pods(docs)
    assert len(pods) == 3  # the daemon, optimize, vacuum
    for name, pod in pods:
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["kafka2delta-secrets"]["secret"]["secretName"] == "orders-ingest-credentials", name
        assert all("secretRef" not in ref for ref in pod["containers"][0]["envFrom"]), name
    for name, pod in _pods(render(VALUES_FILES["existing-secret"], "secret.mountAsFiles=false")):
        container = pod["containers"][0]
        assert {"secretRef": {"name": "orders-ingest-credentials"}} in container["envFrom"], name
        assert "kafka2delta-secrets" not in {v["name"] for v in pod["volumes"]}, name
        assert "K2D_SECRETS_DIR" not in {e["name"] for e in container.get("env", [])}, name


def _pods(docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    pods = [
        (d["metadata"]["name"], d["spec"]["template"]["spec"])
        for d in docs
        if d["kind"] in ("StatefulSet", "Deployment")
    ]
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
    workload = _workload(docs)
    pod = workload["spec"]["template"]["spec"]
    container = pod["containers"][0]
    port = values.get("metrics", {}).get("port", 9102)
    assert container["ports"] == [{"name": "metrics", "containerPort": port, "protocol": "TCP"}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    service = _one(docs, "Service")
    assert service["spec"]["ports"][0]["name"] == "metrics" and service["spec"]["ports"][0]["targetPort"] == "metrics"
    assert service["spec"]["selector"] == workload["spec"]["selector"]["matchLabels"]
    latency = values.get("config", {}).get("ingest", {}).get("allowed_latency_s", 5)
    retry = values.get("config", {}).get("ingest", {}).get("retry_after_stop_s", 45.0)
    expected = values.get("terminationGracePeriodSeconds") or math.ceil(max(latency, retry)) + 60
    assert pod["terminationGracePeriodSeconds"] == expected
    assert pod["terminationGracePeriodSeconds"] > latency


# The Secret of ci/existing-secret-values.yaml, managed outside the chart.
EXISTING_SECRETS = {"orders-ingest-credentials": {"K2D_KAFKA__SETTINGS__SASL_PASSWORD": "from-an-existing-secret"}}


def _write_secret_volume(directory: Path, data: dict[str, str]) -> None:
    """A Secret volume as the kubelet writes one: the files in a timestamped directory, ..data a symlink to it,
    and one symlink per key to ..data/<key>."""
    stamp = directory / "..2026_11_26_03_00_00.000000001"
    stamp.mkdir(parents=True)
    for key, value in data.items():
        (stamp / key).write_text(value)
    (directory / "..data").symlink_to(stamp.name)
    for key in data:
        (directory / key).symlink_to(f"..data/{key}")


def _container_environment(
    docs: list[dict[str, Any]], pod: dict[str, Any], pod_name: str, tmp_path: Path
) -> dict[str, str]:
    """The first container's environment as the kubelet builds it: envFrom (the ConfigMap, the Secret; a missing
    optional source is skipped), then env (a fieldRef to metadata.name is the pod's name); a Secret volume mounted
    at K2D_SECRETS_DIR is written under tmp_path and the variable pointed there."""
    configmaps = {d["metadata"]["name"]: d["data"] for d in _by_kind(docs, "ConfigMap")}
    secrets = {**EXISTING_SECRETS, **{d["metadata"]["name"]: d["stringData"] for d in _by_kind(docs, "Secret")}}
    container = pod["containers"][0]
    environ: dict[str, str] = {}
    for source in container.get("envFrom", []):
        kind, ref = next(iter(source.items()))
        data = (configmaps if kind == "configMapRef" else secrets).get(ref["name"])
        assert data is not None or ref.get("optional"), source
        environ.update(data or {})
    for variable in container.get("env", []):
        if "value" in variable:
            environ[variable["name"]] = variable["value"]
        elif variable["valueFrom"].get("fieldRef", {}).get("fieldPath") == "metadata.name":
            environ[variable["name"]] = pod_name
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    for volume in pod["volumes"]:
        if "secret" in volume and mounts.get(volume["name"]) == environ.get("K2D_SECRETS_DIR"):
            directory = tmp_path / pod_name / volume["name"]
            _write_secret_volume(directory, secrets[volume["secret"]["secretName"]])
            environ["K2D_SECRETS_DIR"] = str(directory)
    if "K2D_SECRETS_DIR" in environ:
        assert Path(environ["K2D_SECRETS_DIR"]).is_relative_to(tmp_path), "K2D_SECRETS_DIR names no mounted Secret"
    return environ


@pytest.mark.parametrize("case", VALUES_FILES)
def test_environment_is_a_valid_daemon_config(
    render: Callable[..., list[dict[str, Any]]], case: str, tmp_path: Path
) -> None:
    """Each pod's environment (ConfigMap, Secret as variables or as files under K2D_SECRETS_DIR, the pod's name
    as group.instance.id) through the daemon's own config loader: the daemon's and every CronJob's."""
    docs = render(VALUES_FILES[case])
    configmap = _one(docs, "ConfigMap", "k2d-kafka2delta")["data"]
    assert all(name.startswith("K2D_") for name in configmap)
    for secret in _by_kind(docs, "Secret"):
        assert all(name.startswith("K2D_") for name in secret["stringData"])
    workload = _workload(docs)
    static = workload["kind"] == "StatefulSet"
    pod_name = f"{workload['metadata']['name']}-{'0' if static else '7c9f5d8b4-x2x7q'}"
    environ = _container_environment(docs, workload["spec"]["template"]["spec"], pod_name, tmp_path)
    files = "K2D_SECRETS_DIR" in environ
    assert files == (case in ("full", "existing-secret")), environ.get("K2D_SECRETS_DIR")
    if files:  # the credentials are never in the environment
        assert not {name for name in environ if re.search("PASSWORD|SECRET_ACCESS|TOKEN", name)}
    config = k2d_config.load_config(None, environ)
    assert config.metrics.host == "0.0.0.0"
    assert config.logging.format == "json"
    if static:
        assert config.kafka.settings["group.instance.id"] == "k2d-kafka2delta-0"
    else:
        assert "group.instance.id" not in config.kafka.settings
    if case == "existing-secret":
        assert config.kafka.settings["sasl.password"] == "from-an-existing-secret"
    if case == "deployment":
        assert config.kafka.settings["sasl.password"] == "sasl-password"
        assert config.kafka.topics == ("orders", "payments") and not config.kafka.topic
        payments, orders = config.routes
        assert payments.transforms == (("tenant", "'acme'"), ("amount_cents", "amount"))  # the list's order
        assert (orders.transforms, orders.filter) == ((), None)  # transforms: [] is none; no filter: the daemon's
        assert payments.format is not None and (payments.format.type, payments.format.key) == ("json", "string")
        assert (payments.filter, config.routes[0].uri) == ("amount > `0`", "s3://lake/silver/payments")
    if case == "full":
        assert config.metrics.port == 9300
        assert config.kafka.settings["sasl.password"] == "sasl-password"
        assert config.kafka.settings["security.protocol"] == "SASL_SSL"
        assert config.kafka.settings["session.timeout.ms"] == "45000"
        assert config.table.storage_options["AWS_SECRET_ACCESS_KEY"] == "aws-secret"
        assert config.table.storage_options["AWS_SESSION_TOKEN"] == "session-token"
        assert config.table.partition_by == ("date",)
        assert config.table.schema["customer"] == "struct<id:long,country:string>"
        assert [target for target, _ in config.transforms] == ["date", "meta.offset", "tenant"]
        assert config.ingest.min_bytes_per_file == 134_217_728 and config.ingest.max_buffered_bytes == 536_870_912
        assert config.ingest.allowed_latency_s == 30.0 and config.kafka.consume_timeout_s == 0.5
        assert config.coercions.epoch_units == {"created": "s"}
        assert config.schema_registry.password == "registry-password"
        for secret in _by_kind(docs, "Secret"):
            assert not set(secret["stringData"]) & set(configmap)
    # The maintenance jobs read the same credentials the same way (no group membership: not consumers).
    for job in _by_kind(docs, "CronJob"):
        name = job["metadata"]["name"]
        pod = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        job_environ = _container_environment(docs, pod, f"{name}-29123456-abcde", tmp_path)
        assert ("K2D_SECRETS_DIR" in job_environ) == files, name
        job_config = k2d_config.load_config(None, job_environ)
        assert "group.instance.id" not in job_config.kafka.settings, name
        assert job_config.kafka.settings.get("sasl.password") == config.kafka.settings.get("sasl.password"), name
        assert job_config.table.storage_options == config.table.storage_options, name


# ------------------------------------------------------------------ static membership, KEDA, secrets as files


def test_static_membership_statefulset(render: Callable[..., list[dict[str, Any]]]) -> None:
    """By default the daemon is a StatefulSet (stable pod names across restarts and rollouts) whose pods are
    static group members named after themselves; the Deployment's strategy does not apply to it."""
    docs = render()
    assert not _by_kind(docs, "Deployment")
    statefulset = _one(docs, "StatefulSet")
    spec = statefulset["spec"]
    assert statefulset["metadata"]["name"] == "k2d-kafka2delta"
    assert spec["replicas"] == 1
    assert spec["serviceName"] == _one(docs, "Service")["metadata"]["name"] == "k2d-kafka2delta"
    assert spec["podManagementPolicy"] == "Parallel"
    assert spec["updateStrategy"] == {"type": "RollingUpdate"}
    assert "volumeClaimTemplates" not in spec and "strategy" not in spec
    assert spec["selector"]["matchLabels"] == spec["template"]["metadata"]["labels"]
    env = spec["template"]["spec"]["containers"][0]["env"]
    assert {"name": GROUP_INSTANCE_ID, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in env
    # The same pod template as the Deployment's, but for that variable.
    deployment = _one(render(None, "staticMembership=false"), "Deployment")
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert "env" not in deployment["spec"]["template"]["spec"]["containers"][0]
    del spec["template"]["spec"]["containers"][0]["env"]
    assert spec["template"] == deployment["spec"]["template"]
    # A StatefulSet's name stays within 52 characters (its pods' controller-revision-hash label adds 11).
    long = render(
        None,
        f"fullnameOverride={'k2d-' + 'x' * 60}",
        "autoscaling.keda.enabled=true",
        "autoscaling.keda.maxReplicaCount=2",
    )
    name = _one(long, "StatefulSet")["metadata"]["name"]
    assert name == ("k2d-" + "x" * 60)[:52] and _one(long, "Service")["metadata"]["name"] == ("k2d-" + "x" * 60)[:63]
    assert _one(long, "ScaledObject")["spec"]["scaleTargetRef"]["name"] == name
    # replicaCount goes to the StatefulSet; the CronJobs are no static members.
    assert _one(render(None, "replicaCount=3"), "StatefulSet")["spec"]["replicas"] == 3
    for job in _by_kind(docs, "CronJob"):
        container = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
        assert GROUP_INSTANCE_ID not in {e["name"] for e in container.get("env", [])}


def test_deployment_is_unchanged_without_static_membership(
    run_helm: Callable[..., subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    """staticMembership=false with secret.mountAsFiles=false renders byte for byte what the chart rendered at
    BASELINE_COMMIT (before static membership, KEDA and secret files), with that commit's default values and
    each of its ci/*-values.yaml: an upgrade that keeps the old behaviour changes nothing."""
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("no git checkout: the baseline chart is read from git history")
    archive = subprocess.run(
        [git, "archive", "--format=tar", BASELINE_COMMIT, "helm/kafka2delta"],
        cwd=ROOT,
        capture_output=True,
        check=False,
    )
    if archive.returncode != 0:
        pytest.skip(f"commit {BASELINE_COMMIT} is not in this clone: {archive.stderr.decode()[-300:]}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(tmp_path, filter="data")
    baseline = tmp_path / "helm" / "kafka2delta"
    cases = [None, *sorted((baseline / "ci").glob("*values.yaml"))]
    assert len(cases) == 3, cases
    for values in cases:
        args = ["template", "k2d", "--namespace", "ingest", *(["-f", str(values)] if values else [])]
        before = run_helm(*args[:2], str(baseline), *args[2:])
        assert before.returncode == 0, before.stderr
        # One change since is meant: the default grace period also covers ingest.retry_after_stop_s. Set to the
        # baseline's default (allowed latency + 60), everything else must render as it did.
        given = yaml.safe_load(values.read_text()) if values else {}
        latency = (given.get("config") or {}).get("ingest", {}).get("allowed_latency_s", 5)
        grace = given.get("terminationGracePeriodSeconds") or math.ceil(latency) + 60
        after = run_helm(
            *args[:2],
            str(CHART),
            *args[2:],
            "--set",
            "staticMembership=false",
            "--set",
            "secret.mountAsFiles=false",
            "--set",
            f"terminationGracePeriodSeconds={grace}",
        )
        assert after.returncode == 0, after.stderr
        assert "kind: Deployment" in after.stdout and "kind: StatefulSet" not in after.stdout
        # Only the chart's own version (the helm.sh/chart label) may differ.
        version = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
        expected = before.stdout.replace("helm.sh/chart: kafka2delta-0.1.0", f"helm.sh/chart: kafka2delta-{version}")
        assert after.stdout == expected, f"{values}: the rendering changed"


def _trigger(scaled: dict[str, Any]) -> dict[str, Any]:
    triggers: list[dict[str, Any]] = scaled["spec"]["triggers"]
    assert len(triggers) == 1 and triggers[0]["type"] == "kafka", triggers
    return triggers[0]


def test_keda_scaled_object(
    render: Callable[..., list[dict[str, Any]]],
    crd_validators: dict[tuple[str, str], jsonschema.protocols.Validator],
) -> None:
    """autoscaling.keda: a ScaledObject on the group's lag, targeting the StatefulSet (or the Deployment), with
    the Kafka connection, group and topic of the daemon's config; the workload then has no replicas."""
    validator = crd_validators[("keda.sh/v1alpha1", "ScaledObject")]
    assert not _by_kind(render(), "ScaledObject")  # off by default
    docs = render(VALUES_FILES["full"])
    scaled = _one(docs, "ScaledObject")
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    assert scaled["metadata"]["name"] == "k2d-kafka2delta" and scaled["metadata"]["namespace"] == "ingest"
    statefulset = _one(docs, "StatefulSet")
    assert "replicas" not in statefulset["spec"]
    spec = scaled["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "k2d-kafka2delta"}
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (3, 12)
    assert (spec["pollingInterval"], spec["cooldownPeriod"]) == (15, 600)
    trigger = _trigger(scaled)
    assert trigger["metadata"] == {
        "bootstrapServers": "b-1.kafka.internal:9096,b-2.kafka.internal:9096",
        "consumerGroup": "orders-to-delta",
        "topic": "orders",
        "lagThreshold": "200000",
        "offsetResetPolicy": "earliest",
        "allowIdleConsumers": "false",
        "sasl": "scram_sha512",
        "tls": "enable",
        "activationLagThreshold": "1000",
    }
    assert trigger["authenticationRef"] == {"name": "orders-kafka-trigger-auth"}
    assert not list(validator.iter_errors(scaled))

    # A Deployment, several topics: no topic in the trigger (KEDA sums the group's lag over its topics).
    docs = render(VALUES_FILES["deployment"])
    scaled = _one(docs, "ScaledObject")
    assert "replicas" not in _one(docs, "Deployment")["spec"]
    assert scaled["spec"]["scaleTargetRef"]["kind"] == "Deployment"
    assert (scaled["spec"]["minReplicaCount"], scaled["spec"]["maxReplicaCount"]) == (0, 6)
    trigger = _trigger(scaled)
    assert "topic" not in trigger["metadata"] and "authenticationRef" not in trigger
    assert trigger["metadata"]["consumerGroup"] == "orders-payments"
    assert trigger["metadata"]["offsetResetPolicy"] == "latest"
    assert not list(validator.iter_errors(scaled))

    # The defaults with maxReplicaCount only; a topic pattern.
    docs = render(None, "autoscaling.keda.enabled=true", "autoscaling.keda.maxReplicaCount=3")
    scaled = _one(docs, "ScaledObject")
    assert "replicas" not in _one(docs, "StatefulSet")["spec"]
    assert (scaled["spec"]["minReplicaCount"], scaled["spec"]["maxReplicaCount"]) == (1, 3)
    assert (scaled["spec"]["pollingInterval"], scaled["spec"]["cooldownPeriod"]) == (30, 300)
    assert _trigger(scaled)["metadata"] == {
        "bootstrapServers": "kafka-bootstrap:9092",
        "consumerGroup": "kafka2delta",
        "topic": "events",
        "lagThreshold": "100000",
        "offsetResetPolicy": "earliest",
        "allowIdleConsumers": "false",
    }
    assert not list(validator.iter_errors(scaled))
    pattern = render(
        None,
        "autoscaling.keda.enabled=true",
        "autoscaling.keda.maxReplicaCount=3",
        "config.kafka.topic=null",
        "config.kafka.topic_pattern=^cdc\\.",
    )
    assert "topic" not in _trigger(_one(pattern, "ScaledObject"))["metadata"]


def test_keda_guards(run_helm: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    """maxReplicaCount is required with KEDA, at least 1 and not below minReplicaCount; the trigger's
    metadata are strings; no group.instance.id of one's own with static membership."""
    keda = "autoscaling.keda"
    cases = {
        (f"{keda}.enabled=true",): "/autoscaling/keda/maxReplicaCount': got null, want integer",
        (f"{keda}.enabled=true", f"{keda}.maxReplicaCount=0"): "/autoscaling/keda/maxReplicaCount': minimum",
        (f"{keda}.enabled=true", f"{keda}.maxReplicaCount=2", f"{keda}.minReplicaCount=3"): "is above maxReplicaCount",
        (f"{keda}.enabled=true", f"{keda}.maxReplicaCount=2", f"{keda}.extraMetadata.x[0]=a"): "extraMetadata/x'",
        (f"{keda}.authenticationRef=Not_A_Name",): "/autoscaling/keda/authenticationRef': 'Not_A_Name' does not match",
        (f"{keda}.maxReplicas=2",): "additional properties 'maxReplicas' not allowed",
        ("staticMembership=yes",): "/staticMembership': got string, want boolean",
        ("secret.mountAsFiles=yes",): "/secret/mountAsFiles': got string, want boolean",
        ("config.kafka.settings.group\\.instance\\.id=x",): "staticMembership sets it",
        ("config.kafka.topic=null",): "missing property 'topic_pattern'",
    }
    for settings, message in cases.items():
        result = run_helm("template", "k2d", str(CHART), *_values_args(None, settings))
        assert result.returncode != 0, f"--set {settings} was accepted"
        assert message in result.stderr, f"--set {settings}: {result.stderr}"
    # Without static membership a group.instance.id of one's own is the user's business.
    result = run_helm(
        "template",
        "k2d",
        str(CHART),
        "--set",
        "staticMembership=false",
        "--set",
        "config.kafka.settings.group\\.instance\\.id=x",
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("case", ["full", "existing-secret"])
def test_secrets_mounted_as_files(render: Callable[..., list[dict[str, Any]]], case: str) -> None:
    """secret.mountAsFiles (the default): the Secret is a read-only volume at /var/run/secrets/kafka2delta and
    K2D_SECRETS_DIR points there, in the daemon and in every CronJob; no secretRef; extraEnvFrom kept."""
    docs = render(VALUES_FILES[case])
    secret = "k2d-kafka2delta" if case == "full" else "orders-ingest-credentials"
    pods = _pods(docs)
    assert len(pods) == (1 + 7 if case == "full" else 1 + 2)
    for name, pod in pods:
        volumes = [v for v in pod["volumes"] if "secret" in v and v["secret"]["secretName"] == secret]
        assert volumes == [{"name": "kafka2delta-secrets", "secret": {"secretName": secret, "defaultMode": 0o440}}], (
            name
        )
        container = pod["containers"][0]
        mounts = [m for m in container["volumeMounts"] if m["name"] == "kafka2delta-secrets"]
        assert mounts == [{"name": "kafka2delta-secrets", "mountPath": SECRETS_DIR, "readOnly": True}], name
        env = container["env"]
        assert [e for e in env if e["name"] == "K2D_SECRETS_DIR"] == [{"name": "K2D_SECRETS_DIR", "value": SECRETS_DIR}]
        assert all("secretRef" not in ref for ref in container["envFrom"]), name
        assert container["envFrom"][0] == {"configMapRef": {"name": "k2d-kafka2delta"}}, name
        if case == "full":
            assert container["envFrom"][1:] == [{"configMapRef": {"name": "orders-extra-settings", "optional": True}}]
            names = [e["name"] for e in env]  # extraEnv after the chart's variables: it may override them
            assert names[names.index("K2D_SECRETS_DIR") + 1 :][:2] == ["TZ", "POD_NAME"], name
    # The checksum of the chart's Secret still rolls the pods when it changes.
    annotations = _workload(docs)["spec"]["template"]["metadata"]["annotations"]
    assert re.fullmatch("[0-9a-f]{64}", annotations["checksum/secret"])
    # Without an fsGroup the files' group is not the container's: world-readable in the pod instead.
    pod = _workload(render(VALUES_FILES[case], "podSecurityContext.fsGroup=null"))["spec"]["template"]["spec"]
    assert next(v for v in pod["volumes"] if v["name"] == "kafka2delta-secrets")["secret"]["defaultMode"] == 0o444


def test_secrets_from_env_without_mount_as_files(render: Callable[..., list[dict[str, Any]]]) -> None:
    """secret.mountAsFiles=false: the Secret through envFrom (then extraEnvFrom), no volume, no K2D_SECRETS_DIR."""
    for docs in (render(VALUES_FILES["deployment"]), render(VALUES_FILES["full"], "secret.mountAsFiles=false")):
        for name, pod in _pods(docs):
            container = pod["containers"][0]
            assert container["envFrom"] == [
                {"configMapRef": {"name": "k2d-kafka2delta"}},
                {"secretRef": {"name": "k2d-kafka2delta"}},
                {"configMapRef": {"name": "orders-extra-settings", "optional": True}},
            ], name
            assert "kafka2delta-secrets" not in {v["name"] for v in pod["volumes"]}, name
            assert "K2D_SECRETS_DIR" not in {e["name"] for e in container.get("env", [])}, name


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
