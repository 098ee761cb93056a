"""bkaudit's chart next to a release of Apache Pulsar's chart (issue 47): rendered with the
values a Pulsar release gives, every Secret name and key, label, service name and port it
uses is the one Pulsar's chart makes (tests/deploy/pulsar_chart_defaults.py, written from
pulsar-4.7.0). Also its monitors (labels a kube-prometheus-stack selects, jobLabel,
scrapeTimeout), the watch's anti-affinity and persistent spool, and the Spark executors'
volumes."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from tests.deploy import pulsar_chart_defaults as pulsar
from tests.deploy.pulsar_chart_defaults import PulsarRelease
from tests.deploy.test_helm_chart import (
    VALUES,
    _one,
    _pods,
    executor_template,
    refused,
    render,
    template,
)

Docs = tuple[dict[str, Any], ...]

# A Pulsar release whose name does not contain "pulsar" (fullname prod-pulsar), with JWT
# authentication, TLS everywhere and cert-manager, as its values.yaml names them.
PROD = PulsarRelease(release="prod", tls_zookeeper=True)
PROD_SETS = (
    "--set", f"pulsar.release={PROD.release}",
    "--set", f"metadata.metadataUri={PROD.bookies_metadata_uri}",
    "--set", "warehouse=/data/bkaudit",
    "--set", "auth.pulsarToken.enabled=true",
    "--set", f"pulsarAdmin.url=https://{PROD.service('broker')}:{pulsar.PORTS['broker']['https']}",
    "--set", "tls.zookeeper.enabled=true",
    "--set", "tls.bookie.enabled=true",
)  # fmt: skip


def _config(docs: Docs) -> dict[str, Any]:
    text = _one(docs, "ConfigMap", "bkaudit")["data"]["bkaudit.yaml"]
    return yaml.safe_load(text)["global"]  # type: ignore[no-any-return]


def _watch(docs: Docs) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]
    assert len(found) == 1, [d["kind"] for d in docs]
    return found[0]


def _secret_volumes(pod: dict[str, Any]) -> dict[str, str]:
    """Mount path -> Secret name, for one pod's first container."""
    names = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    mounts = pod["containers"][0]["volumeMounts"]
    return {m["mountPath"]: names[m["name"]] for m in mounts if m["name"] in names}


def _file_secret(pod: dict[str, Any], path: str) -> tuple[str, str]:
    """The (Secret, key) a file path of the config reads, through the pod's mounts."""
    for mount, secret in _secret_volumes(pod).items():
        if path.startswith(mount + "/"):
            return secret, path[len(mount) + 1 :]
    raise AssertionError(f"{path} is on no Secret volume: {_secret_volumes(pod)}")


def test_secret_names_and_keys_are_the_ones_pulsars_chart_makes() -> None:
    docs = template(*PROD_SETS)
    config = _config(docs)
    for pod in _pods(docs, executors=False):
        # the admin API's token: R-token-admin, key TOKEN (jwt-secret-init.yaml)
        token = (PROD.token_secret, pulsar.TOKEN_KEY)
        assert _file_secret(pod, config["pulsar-token-file"]) == token
        # ZooKeeper's client certificate: the autorecovery one, R-tls-recovery, tls.crt/tls.key
        recovery = PROD.tls_secret("autorecovery")
        assert _file_secret(pod, config["zk-tls-cert"]) == (recovery, pulsar.TLS_KEYS[0])
        assert _file_secret(pod, config["zk-tls-key"]) == (recovery, pulsar.TLS_KEYS[1])
        # one CA, R-ca-tls ca.crt, at Pulsar's own path, for ZooKeeper, bookies and admin API
        for key in ("zk-tls-ca", "tls-trust-store", "pulsar-tls-ca"):
            assert config[key] == f"{pulsar.CA_MOUNT_DIR}/{pulsar.CA_KEY}", key
            assert _file_secret(pod, config[key]) == (PROD.ca_secret, pulsar.CA_KEY)
    # The check can fail: the chart's old key for the token is not the one Pulsar writes.
    old = template(*PROD_SETS, "--set", "auth.pulsarToken.key=token")
    assert _file_secret(_pods(old)[0], _config(old)["pulsar-token-file"])[1] != pulsar.TOKEN_KEY


def test_the_admin_ca_is_mounted_only_for_an_https_admin_api() -> None:
    plain = f"http://{PROD.service('broker')}:{pulsar.PORTS['broker']['http']}"
    docs = template(*PROD_SETS, "--set", f"pulsarAdmin.url={plain}", "--set",
                    "tls.zookeeper.enabled=false", "--set", "tls.bookie.enabled=false")  # fmt: skip
    config = _config(docs)
    assert config["pulsar-admin-url"] == plain and "pulsar-tls-ca" not in config
    assert pulsar.CA_MOUNT_DIR not in _secret_volumes(_pods(docs)[0])


def test_labels_are_pulsars_label_set_with_its_cluster() -> None:
    docs = template(*PROD_SETS, "--set", "scheduledAudit.enabled=true",
                    "--set", "sparkAudit.enabled=true")  # fmt: skip
    component = pulsar.COMPONENT_LABEL
    for doc in docs:
        labels = doc["metadata"]["labels"]
        assert set(labels) >= pulsar.STANDARD_LABELS, (doc["kind"], labels)
        assert labels["app"] == "bkaudit" and labels["release"] == "bk"
        # the Pulsar cluster bkaudit audits (pulsar.cluster.name), not bkaudit's release
        assert labels["cluster"] == PROD.cluster == "prod-pulsar"
        spec = doc.get("spec", {})
        if doc["kind"] == "CronJob":
            spec = spec["jobTemplate"]["spec"]
        if "template" in spec:
            pod_labels = spec["template"]["metadata"]["labels"]
            assert set(pod_labels) == pulsar.TEMPLATE_LABELS | {component}, pod_labels
            if "selector" in spec:  # Deployments and StatefulSets
                selector = spec["selector"]["matchLabels"]
                assert set(selector) == pulsar.MATCH_LABELS | {component}, selector
                assert selector.items() <= pod_labels.items()
    service = _one(docs, "Service")
    assert set(service["spec"]["selector"]) == pulsar.MATCH_LABELS | {component}
    assert service["spec"]["selector"].items() <= (
        _watch(docs)["spec"]["template"]["metadata"]["labels"].items()
    )
    executor = executor_template(docs)["metadata"]["labels"]
    assert set(executor) == pulsar.TEMPLATE_LABELS | {component}
    assert executor["cluster"] == PROD.cluster


def test_extra_labels_mark_objects_and_pods_but_not_selectors() -> None:
    docs = template("-f", str(VALUES["full"]), "--set", "labels.environment=dev")
    watch = _watch(docs)
    assert watch["metadata"]["labels"]["environment"] == "dev"
    assert watch["spec"]["template"]["metadata"]["labels"]["environment"] == "dev"
    assert "environment" not in watch["spec"]["selector"]["matchLabels"]
    assert executor_template(docs)["metadata"]["labels"]["environment"] == "dev"
    # a label the chart sets itself keeps the chart's value
    docs = template("-f", str(VALUES["default"]), "--set", "labels.app=x")
    assert _watch(docs)["spec"]["template"]["metadata"]["labels"]["app"] == "bkaudit"


@pytest.mark.parametrize(
    ("release", "sets", "fullname"),
    [
        ("bk", (), "bk-bkaudit"),
        ("bkaudit", (), "bkaudit"),
        ("ops-bkaudit-1", (), "ops-bkaudit-1"),
        ("bk", ("nameOverride=audit",), "bk-audit"),
        ("bk", ("fullnameOverride=pulsar-bkaudit",), "pulsar-bkaudit"),
    ],
)
def test_names_follow_pulsars_fullname_rule(
    release: str, sets: tuple[str, ...], fullname: str
) -> None:
    args = [x for s in sets for x in ("--set", s)]
    docs = template("-f", str(VALUES["default"]), *args, release=release)
    assert _watch(docs)["metadata"]["name"] == f"{fullname}-watch"
    app = "audit" if "nameOverride=audit" in sets else "bkaudit"
    assert _watch(docs)["spec"]["selector"]["matchLabels"]["app"] == app


@pytest.mark.parametrize(
    "release",
    [
        PulsarRelease(),
        PulsarRelease(release="prod"),
        PulsarRelease(release="prod", fullname_override="pulsar-prod", cluster_name="east"),
        PulsarRelease(release="my-pulsar", metadata_prefix="/pulsar-a", tls_zookeeper=True),
    ],
    ids=lambda r: r.release + (r.fullname_override and "-fullnameOverride"),
)
def test_the_pulsar_release_names_its_services_as_pulsars_chart_does(
    release: PulsarRelease,
) -> None:
    strings = {
        "pulsar.release": release.release,
        "pulsar.fullnameOverride": release.fullname_override,
        "pulsar.clusterName": release.cluster_name,
        "pulsar.metadataPrefix": release.metadata_prefix,
    }
    args = [x for k, v in strings.items() for x in ("--set-string", f"{k}={v}")]
    args += ["--set", f"tls.zookeeper.enabled={str(release.tls_zookeeper).lower()}"]
    # with no metadata given, the chart names what the Pulsar release's bookies read
    err = refused("--set", "warehouse=/w", *args)
    assert f"read {release.bookies_metadata_uri})" in err, err
    docs = template("--set", "warehouse=/w", "--set", "metadata.zk=z:2181", *args)
    assert _watch(docs)["metadata"]["labels"]["cluster"] == release.cluster


def test_the_ci_values_name_the_pulsar_releases_services_and_ports() -> None:
    release = PulsarRelease()  # the ci values sit next to Pulsar release `pulsar`
    default = yaml.safe_load(VALUES["default"].read_text())
    assert default["metadata"]["zk"] == release.zookeeper_connect
    full = yaml.safe_load(VALUES["full"].read_text())
    assert full["pulsar"]["release"] == release.release
    admin = urlsplit(full["pulsarAdmin"]["url"])
    assert admin.hostname == release.service("broker")
    assert admin.port == pulsar.PORTS["broker"][admin.scheme]
    # the network policy lets the pods reach every port of ZooKeeper, bookies and broker used
    docs = render("full")
    egress = {p["port"] for rule in _one(docs, "NetworkPolicy")["spec"]["egress"]
              for p in rule["ports"]}  # fmt: skip
    needed = {pulsar.PORTS["zookeeper"]["client"], pulsar.PORTS["zookeeper"]["clientTls"],
              pulsar.PORTS["bookie"]["bookie"], pulsar.PORTS["broker"]["http"],
              pulsar.PORTS["broker"]["https"]}  # fmt: skip
    assert needed <= egress, needed - egress
    # the full values' Secrets are the Pulsar release's
    secrets = set(_secret_volumes(_pods(docs)[0]).values())
    expected = {release.token_secret, release.tls_secret("autorecovery"), release.ca_secret}
    assert expected <= secrets, secrets


def test_monitors_carry_the_labels_a_kube_prometheus_stack_selects() -> None:
    docs = render("full")  # monitoring.labels: {release: kube-prometheus-stack}
    selector = pulsar.KUBE_PROMETHEUS_SELECTOR_LABEL
    for kind in ("PodMonitor", "ServiceMonitor", "PrometheusRule"):
        obj = _one(docs, kind)
        # the monitor's `release` is Prometheus's; no duplicate key (the loader refuses one)
        assert obj["metadata"]["labels"][selector] == "kube-prometheus-stack", kind
        assert obj["metadata"]["labels"]["app"] == "bkaudit"
    pod_monitor = _one(docs, "PodMonitor")["spec"]
    service_monitor = _one(docs, "ServiceMonitor")["spec"]
    for spec, endpoints in ((pod_monitor, "podMetricsEndpoints"), (service_monitor, "endpoints")):
        assert spec["jobLabel"] == "app"  # job="bkaudit", a label the pods and Service carry
        endpoint = spec[endpoints][0]
        assert endpoint["scrapeTimeout"] == "10s" and endpoint["interval"] == "30s"
    pod_labels = _watch(docs)["spec"]["template"]["metadata"]["labels"]
    for spec, endpoints in ((pod_monitor, "podMetricsEndpoints"), (service_monitor, "endpoints")):
        # the rules' and the dashboard's cluster label: the Pulsar cluster's name
        cluster = [{"targetLabel": "cluster", "replacement": pod_labels["cluster"]}]
        assert spec[endpoints][0]["relabelings"] == cluster
    assert pod_monitor["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pod_monitor["jobLabel"] in pod_labels
    # An object's own labels add to the shared ones and win.
    docs = template(
        "-f", str(VALUES["full"]), "--set", "monitoring.prometheusRule.labels.release=p"
    )
    assert _one(docs, "PrometheusRule")["metadata"]["labels"][selector] == "p"
    assert _one(docs, "PodMonitor")["metadata"]["labels"][selector] == "kube-prometheus-stack"


@pytest.mark.parametrize("kind", ["podMonitor", "serviceMonitor", "prometheusRule"])
def test_a_monitor_no_prometheus_would_select_is_refused_in_one_line(kind: str) -> None:
    err = refused("-f", str(VALUES["default"]), "--set", f"monitoring.{kind}.enabled=true")
    assert "monitoring.labels is empty" in err and "release=" in err, err


def test_watch_pods_avoid_each_others_node_and_roll_one_at_a_time() -> None:
    watch = _watch(render("default"))
    pod = watch["spec"]["template"]
    anti = pod["spec"]["affinity"]["podAntiAffinity"]
    (term,) = anti[pulsar.ANTI_AFFINITY_TYPE]
    assert term["topologyKey"] == pulsar.ANTI_AFFINITY_TOPOLOGY_KEY
    # its selector matches the watch's own pods, in the Pulsar chart's keys
    expressions = {e["key"]: e for e in term["labelSelector"]["matchExpressions"]}
    assert set(expressions) == pulsar.MATCH_LABELS | {pulsar.COMPONENT_LABEL}
    for key, e in expressions.items():
        assert e["operator"] == "In" and pod["metadata"]["labels"][key] in e["values"]
    # a required anti-affinity leaves a surge pod no node: the rollout replaces in place
    assert watch["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    preferred_type = "preferredDuringSchedulingIgnoredDuringExecution"
    sets = ("--set", f"watch.antiAffinity.type={preferred_type}")
    preferred = _watch(template("-f", str(VALUES["default"]), *sets))
    (weighted,) = preferred["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        preferred_type
    ]
    assert weighted["podAffinityTerm"] == term and "strategy" not in preferred["spec"]
    off = _watch(
        template("-f", str(VALUES["default"]), "--set", "watch.antiAffinity.enabled=false")
    )
    assert "affinity" not in off["spec"]["template"]["spec"]
    err = refused("-f", str(VALUES["default"]), "--set", "watch.antiAffinity.type=sometimes")
    assert "watch.antiAffinity.type" in err


def test_the_spool_persists_on_a_claim_per_pod_when_asked() -> None:
    docs = render("full")
    spool_dir = yaml.safe_load(_one(docs, "ConfigMap", "bkaudit")["data"]["bkaudit.yaml"])["watch"][
        "spool-dir"
    ]
    watch = _watch(docs)
    assert watch["kind"] == "StatefulSet"
    assert watch["spec"]["serviceName"] == _one(docs, "Service")["metadata"]["name"]
    (claim,) = watch["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "1Gi"
    pod = watch["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert mounts[claim["metadata"]["name"]] == spool_dir
    assert claim["metadata"]["name"] not in {v["name"] for v in pod["volumes"]}
    # by default: an emptyDir in a Deployment
    default = _watch(render("default"))
    assert default["kind"] == "Deployment"
    volumes = {v["name"]: v for v in default["spec"]["template"]["spec"]["volumes"]}
    assert volumes["spool"]["emptyDir"] == {}


@pytest.mark.parametrize("values", ["full", "oxia"])
def test_spark_executors_get_the_drivers_volumes_secrets_and_tls_files(values: str) -> None:
    docs = render(values)
    job = _one(docs, "Job")["spec"]["template"]["spec"]
    driver = job["containers"][0]
    executor = executor_template(docs)["spec"]
    confs = dict(
        a[len("--conf=") :].split("=", 1) for a in driver["args"] if a.startswith("--conf=")
    )
    template_file = confs["spark.kubernetes.executor.podTemplateFile"]
    name = confs["spark.kubernetes.executor.podTemplateContainerName"]
    assert [c["name"] for c in executor["containers"]] == [name]
    # the driver reads the template from the ConfigMap it mounts
    mounted = {m["name"]: m["mountPath"] for m in driver["volumeMounts"]}
    volumes = {v["name"]: v for v in job["volumes"]}
    source = volumes[next(n for n, p in mounted.items() if template_file.startswith(p + "/"))]
    assert source["configMap"]["name"].endswith("-spark-executor")
    # executors: every volume and mount of the driver but the template itself
    own = {n for n, v in volumes.items() if v is source}
    assert executor["volumes"] == [v for v in job["volumes"] if v["name"] not in own]
    assert executor["containers"][0]["volumeMounts"] == [
        m for m in driver["volumeMounts"] if m["name"] not in own
    ]
    names = {v["name"] for v in executor["volumes"]}
    if values == "full":
        assert {"warehouse", "zk-tls", "bookie-tls", "pulsar-token", "zk-auth"} <= names
    assert executor["securityContext"] == job["securityContext"]


def test_two_secrets_at_one_path_are_refused_in_one_line() -> None:
    sets = ("tls.zookeeper.enabled=true", "tls.bookie.enabled=true", "tls.bookie.caSecretName=o")
    err = refused("-f", str(VALUES["default"]), *[x for s in sets for x in ("--set", s)])
    assert "both mounted at /pulsar/certs/ca" in err, err
