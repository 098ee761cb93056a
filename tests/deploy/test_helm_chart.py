"""The Helm chart (deploy/helm/bkaudit): ``helm lint --strict``; its manifests, with the default
values and with everything switched on, validate against Kubernetes 1.28 and 1.33 schemas (the
Spark executors' pod template too) and have no duplicate key; the config it renders is read by
the commands as conf/bkaudit.yaml is; secrets reach the pods, the Spark executors included, as
files only; the Spark audit's account may manage pods in its namespace and nothing more. Its
names next to a real Pulsar release: tests/deploy/test_chart_pulsar.py."""

from __future__ import annotations

import functools
import json
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from bklib.meta.uri import parse_metadata_uri
from jobs.cli.config import config_values, load_config
from jobs.cli.main import command_parser
from jobs.cli.registry import COMMANDS
from tests.cli_helpers import REPO

CHART = REPO / "deploy" / "helm" / "bkaudit"
VALUES = {name: CHART / "ci" / f"{name}-values.yaml" for name in ("default", "full", "oxia", "s3")}
KUBERNETES = ("1.28.0", "1.33.0")
# Prometheus operator kinds have no schema in kubernetes-validate; their shape is checked here.
OPERATOR_KINDS = {"PodMonitor", "ServiceMonitor", "PrometheusRule"}


@functools.cache
def helm() -> Path:
    """The Helm binary scripts/install_helm.sh built (it prints its path)."""
    out = subprocess.run(
        [str(REPO / "scripts" / "install_helm.sh")], capture_output=True, text=True, check=True
    )
    return Path(out.stdout.strip().splitlines()[-1])


def _helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(helm()), *args], capture_output=True, text=True, timeout=120)


class _NoDuplicates(yaml.SafeLoader):
    """A YAML loader that refuses a mapping with a key twice (PyYAML keeps the last silently;
    the API server refuses such a manifest)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        keys = [self.construct_object(k, deep=deep) for k, _ in node.value]
        dup = {k for k in keys if keys.count(k) > 1}
        assert not dup, f"duplicate keys {dup} at {node.start_mark}"
        return super().construct_mapping(node, deep=deep)


def load_manifests(text: str) -> tuple[dict[str, Any], ...]:
    """The documents of ``helm template`` output, refusing duplicate keys."""
    return tuple(d for d in yaml.load_all(text, Loader=_NoDuplicates) if d)


def template(
    *args: str, release: str = "bk", kube: str = KUBERNETES[-1]
) -> tuple[dict[str, Any], ...]:
    """``helm template RELEASE CHART --namespace pulsar ARGS``, its manifests loaded."""
    # A Helm built from source assumes Kubernetes 1.20 unless told (release builds stamp it).
    proc = _helm(
        "template", release, str(CHART), "--namespace", "pulsar", "--kube-version", kube, *args
    )
    assert proc.returncode == 0, proc.stderr
    return load_manifests(proc.stdout)


def refused(*args: str) -> str:
    """The error of a ``helm template`` that must fail (its stderr)."""
    proc = _helm("template", "bk", str(CHART), "--kube-version", KUBERNETES[-1], *args)
    assert proc.returncode == 1, proc.stdout[-2000:]
    return proc.stderr


@functools.cache
def render(values: str, kube: str = KUBERNETES[-1]) -> tuple[dict[str, Any], ...]:
    return template("-f", str(VALUES[values]), kube=kube)


def executor_template(docs: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    """The Spark executors' pod template the chart ships (a Pod manifest)."""
    data = _one(docs, "ConfigMap", "-spark-executor")["data"]["executor.yaml"]
    return load_manifests(data)[0]


def _one(docs: tuple[dict[str, Any], ...], kind: str, suffix: str = "") -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(suffix)]
    assert len(found) == 1, [(d["kind"], d["metadata"]["name"]) for d in docs]
    return found[0]


def _pods(docs: tuple[dict[str, Any], ...], executors: bool = False) -> list[dict[str, Any]]:
    """Every pod spec the manifests hold; with ``executors``, the Spark executors' too."""
    out = []
    if executors and any(d["metadata"]["name"].endswith("-spark-executor") for d in docs):
        out.append(executor_template(docs)["spec"])
    for d in docs:
        spec = d.get("spec", {})
        if d["kind"] == "CronJob":
            spec = spec["jobTemplate"]["spec"]
        if "template" in spec:
            out.append(spec["template"]["spec"])
    return out


@pytest.mark.parametrize("values", sorted(VALUES))
def test_helm_lint_strict(values: str) -> None:
    proc = _helm(
        "lint", "--strict", str(CHART), "-f", str(VALUES[values]), "--kube-version", KUBERNETES[0]
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_release_without_its_cluster_is_refused_in_one_line() -> None:
    assert "warehouse is required" in refused()
    # without the metadata, the error names the URI the Pulsar release's bookies read
    err = refused("--set", "warehouse=/w", "--set", "pulsar.release=prod")
    assert "metadata.zk or metadata.metadataUri is required" in err
    assert "zk+hierarchical://prod-pulsar-zookeeper:2181/ledgers" in err, err


@pytest.mark.parametrize("version", KUBERNETES)
@pytest.mark.parametrize("values", sorted(VALUES))
def test_manifests_validate_strictly(values: str, version: str) -> None:
    kinds = set()
    docs = render(values, version)
    for doc in docs:
        kinds.add(doc["kind"])
        if doc["kind"] in OPERATOR_KINDS:
            assert doc["apiVersion"] == "monitoring.coreos.com/v1"
            continue
        kubernetes_validate.validate(doc, version, strict=True)
    expected = {"ConfigMap", "Deployment", "PodDisruptionBudget", "Service"}
    if values != "default":  # the Spark executors' pod template is a Pod manifest
        kubernetes_validate.validate(executor_template(docs), version, strict=True)
    if values == "s3":
        expected |= {"CronJob", "Job", "ServiceAccount", "Role", "RoleBinding"}
    if values == "full":  # its spool persists: a StatefulSet
        expected ^= {"Deployment", "StatefulSet"}
        expected |= OPERATOR_KINDS | {"CronJob", "Job", "ServiceAccount", "Role", "RoleBinding"}
        expected |= {"NetworkPolicy"}
    assert expected <= kinds, kinds


def test_a_wrong_type_fails_validation() -> None:
    # The check can fail: a port as a string is refused in strict mode.
    service = json.loads(json.dumps(_one(render("default"), "Service")))
    service["spec"]["ports"][0]["port"] = "9464"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(service, KUBERNETES[-1], strict=True)


@pytest.mark.parametrize("values", sorted(VALUES))
def test_the_config_map_is_a_config_file_every_command_accepts(values: str, tmp_path: Path) -> None:
    rendered = tmp_path / "bkaudit.yaml"
    rendered.write_text(_one(render(values), "ConfigMap", "bkaudit")["data"]["bkaudit.yaml"])
    config = load_config(rendered)  # as the pods' --config reads it
    assert config["global"]["warehouse"]
    for section in config:
        if section in ("global", "logging"):
            continue
        cmd = COMMANDS[section]  # a section is a command's name...
        config_values(command_parser(cmd), section, config, env={})  # ...with its own flags
    # Global keys a command lacks are ignored, so each must be one the watch really takes.
    watch_flags = {a.dest for a in command_parser(COMMANDS["watch"])._actions}
    assert set(config["global"]) <= watch_flags, set(config["global"]) - watch_flags
    watch = config["watch"]
    assert watch["metrics_port"] == 9464 and watch["spool_dir"] == "/var/lib/bkaudit/spool"
    if values == "oxia":  # the bookies' URI reaches every command as an Oxia store
        target = parse_metadata_uri(config["global"]["metadata_uri"])
        assert (target.connect, target.ledgers_root, target.pulsar_driver) == (
            "oxia://pulsar-oxia:6648/bookkeeper",
            "/ledgers",
            True,
        )


def test_secrets_are_files_named_in_the_config_never_args_or_env() -> None:
    docs = render("full")
    config = yaml.safe_load(_one(docs, "ConfigMap", "bkaudit")["data"]["bkaudit.yaml"])["global"]
    files = {k: v for k, v in config.items() if k.endswith("-file") or k.startswith("tls-")}
    files |= {k: v for k, v in config.items() if k.startswith("zk-tls-")}
    paths = [v for v in files.values() if isinstance(v, str) and v.startswith("/")]
    assert len(paths) >= 8, files
    for pod in _pods(docs, executors=True):
        for container in pod["containers"]:
            mounts = [m["mountPath"] for m in container["volumeMounts"]]
            for path in paths:
                assert any(path.startswith(m + "/") for m in mounts), (path, mounts)
            args = " ".join(container.get("args", []))
            assert "zk-auth=" not in args and "password=" not in args and "token=" not in args
            for env in container.get("env", []):
                assert "secretKeyRef" not in env.get("valueFrom", {}), env
    volumes = {v["name"]: v for pod in _pods(docs, executors=True) for v in pod["volumes"]}
    assert volumes["zk-auth"]["secret"]["defaultMode"] == 0o400
    assert volumes["pulsar-token"]["secret"]["defaultMode"] == 0o400


def test_watch_runs_two_replicas_behind_a_pdb_with_an_http_port() -> None:
    docs = render("default")
    watch = _one(docs, "Deployment", "-watch")
    assert watch["spec"]["replicas"] == 2
    assert _one(docs, "PodDisruptionBudget")["spec"]["minAvailable"] == 1
    assert [p["name"] for p in _one(docs, "Service")["spec"]["ports"]] == ["http"]
    pod = watch["spec"]["template"]
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == "9464"
    container = pod["spec"]["containers"][0]
    assert container["args"][0] == "watch"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_monitoring_objects_carry_the_shipped_rules_and_dashboard() -> None:
    docs = render("full")
    rules = yaml.safe_load((REPO / "deploy" / "monitoring" / "bkaudit-alerts.yaml").read_text())
    assert _one(docs, "PrometheusRule")["spec"] == rules
    dashboard = _one(docs, "ConfigMap", "-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads((REPO / "deploy" / "monitoring" / "bkaudit-dashboard.json").read_text())
    assert json.loads(dashboard["data"]["bkaudit-dashboard.json"]) == shipped
    for kind in ("PodMonitor", "ServiceMonitor"):
        monitor = _one(docs, kind)
        endpoints = monitor["spec"].get("podMetricsEndpoints") or monitor["spec"]["endpoints"]
        assert endpoints[0]["port"] == "http"


def test_spark_account_may_manage_pods_in_its_namespace_only() -> None:
    docs = render("full")
    assert not [d for d in docs if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    role = _one(docs, "Role")
    assert role["metadata"].get("namespace") in (None, "pulsar")
    resources = {r for rule in role["rules"] for r in rule["resources"]}
    assert resources == {"pods", "services", "configmaps", "persistentvolumeclaims"}
    binding = _one(docs, "RoleBinding")
    assert binding["subjects"][0]["namespace"] == "pulsar"
    job = _one(docs, "Job")["spec"]["template"]["spec"]
    assert job["serviceAccountName"] == binding["subjects"][0]["name"]
    args = job["containers"][0]["args"]
    assert "--master=k8s://https://kubernetes.default.svc" in args
    # every other pod runs without an API token
    assert all(p.get("automountServiceAccountToken") is False for p in _pods(docs) if p is not job)


def test_oxia_tls_and_token_are_files_in_every_pod_and_the_executors() -> None:
    docs = render("oxia")
    config = yaml.safe_load(_one(docs, "ConfigMap", "bkaudit")["data"]["bkaudit.yaml"])["global"]
    assert config["oxia-tls"] is True
    ca, token = config["oxia-tls-ca"], config["oxia-token-file"]
    assert (ca, token) == ("/pulsar/certs/oxia-ca/ca.crt", "/etc/bkaudit/secrets/oxia-token/token")
    assert "oxia-tls-cert" not in config and "zk-tls" not in config
    pods = _pods(docs)
    assert len(pods) == 3  # the watch, the scheduled audit and the Spark audit's driver
    for pod in pods:
        volumes = {v["name"]: v["secret"] for v in pod["volumes"] if "secret" in v}
        assert volumes["oxia-token"] == {"secretName": "bkaudit-oxia-token", "defaultMode": 0o400}
        assert volumes["oxia-tls-ca"]["secretName"] == "pulsar-ca-tls"
        for container in pod["containers"]:
            mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
            assert token.startswith(mounts["oxia-token"] + "/")
            assert ca.startswith(mounts["oxia-tls-ca"] + "/")
            # the token is a file named in the config: an argument names at most its directory
            for arg in container.get("args", []):
                assert "token" not in arg or arg.endswith("=/etc/bkaudit/secrets/oxia-token"), arg
    # Spark's executor pods get the same Secrets at the same paths (their pod template).
    executor = executor_template(docs)["spec"]
    volumes = {v["name"]: v["secret"] for v in executor["volumes"] if "secret" in v}
    assert volumes["oxia-token"] == {"secretName": "bkaudit-oxia-token", "defaultMode": 0o400}
    mounts = {m["name"]: m["mountPath"] for m in executor["containers"][0]["volumeMounts"]}
    assert token.startswith(mounts["oxia-token"] + "/") and ca.startswith(mounts["oxia-tls-ca"])


def test_an_oxia_token_without_oxia_tls_is_refused_in_one_line(tmp_path: Path) -> None:
    values = tmp_path / "v.yaml"
    values.write_text(
        "metadata: {metadataUri: 'metadata-store:oxia://pulsar-oxia:6648/bookkeeper'}\n"
        "warehouse: /data/bkaudit\n"
        "auth: {oxiaToken: {secretName: t}}\n"
    )
    assert "auth.oxiaToken needs tls.oxia.enabled" in refused("-f", str(values))


def test_an_s3_warehouse_reaches_every_pod_as_the_aws_environment() -> None:
    """Each pod (watch, scheduled audit, Spark driver, executors) gets the store from the
    standard AWS variables and the credentials from a mounted file or the ServiceAccount's
    workload identity, never a key; the Spark Job's s3a settings are what jobs/spark/s3.py
    gives a session it builds itself from the same environment."""
    from jobs.spark.s3 import s3a_conf

    docs = render("s3")
    config = yaml.safe_load(_one(docs, "ConfigMap", "bkaudit")["data"]["bkaudit.yaml"])
    assert config["global"]["warehouse"] == "s3://bkaudit/tables"
    pods = _pods(docs, executors=True)
    assert len(pods) == 4  # watch, CronJob, Spark driver, executors' template
    envs = []
    for pod in pods:
        for container in pod["containers"]:
            env = {e["name"]: e.get("value") for e in container.get("env", [])}
            envs.append(env)
            assert env["AWS_ENDPOINT_URL"] == "http://minio.minio:9000", container["name"]
            assert env["AWS_REGION"] == "eu-west-1"
            creds = env["AWS_SHARED_CREDENTIALS_FILE"]
            mounts = [m["mountPath"] for m in container["volumeMounts"]]
            assert any(creds.startswith(m + "/") for m in mounts), (creds, mounts)
            assert not {k for k in env if "SECRET" in k or "ACCESS_KEY" in k}, env
    volumes = {v["name"]: v for pod in pods for v in pod["volumes"]}
    assert volumes["aws-credentials"]["secret"] == {
        "secretName": "bkaudit-s3",
        "defaultMode": 0o400,
    }
    accounts = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ServiceAccount"}
    assert set(accounts) == {"bk-bkaudit", "bk-bkaudit-spark"}
    for account in accounts.values():
        assert account["metadata"]["annotations"] == {
            "eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/bkaudit"
        }
    job = _one(docs, "Job")
    driver = job["spec"]["template"]["spec"]["containers"][0]
    conf = dict(
        a.removeprefix("--conf=").split("=", 1) for a in driver["args"] if a.startswith("--conf=")
    )
    wanted = s3a_conf({k: v for k, v in envs[0].items() if k.startswith("AWS_") and v})
    assert {k: conf.get(k) for k in wanted} == wanted
    assert conf["spark.kubernetes.authenticate.executor.serviceAccountName"] == "bk-bkaudit-spark"
    for d in docs:
        spec = d.get("spec", {})
        if d["kind"] == "CronJob":
            spec = spec["jobTemplate"]["spec"]
        if "template" in spec and d["kind"] != "Job":
            assert spec["template"]["spec"]["serviceAccountName"] == "bk-bkaudit", d["kind"]
