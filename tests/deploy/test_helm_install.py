"""``helm install`` of the chart, everything switched on, into a real kube-apiserver and etcd:
the API server accepts and stores every object, and the Spark audit's service account may
manage pods in the release's namespace and nothing else (what ``kubectl auth can-i --as``
asks, as a SubjectAccessReview)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from tests.deploy.kube import KubeApi, kube_apiserver
from tests.deploy.test_helm_chart import CHART, VALUES, helm, render

NAMESPACE = "pulsar"
KUBE_VERSION = "1.30.0"  # scripts/install_kube.sh builds this release
_PLURALS = {"NetworkPolicy": "networkpolicies"}
# The Prometheus operator's kinds, as the operator's CRDs define them (schema left open).
_OPERATOR_CRDS = (("PodMonitor", "podmonitors"), ("ServiceMonitor", "servicemonitors"),
                  ("PrometheusRule", "prometheusrules"))  # fmt: skip


def _path(doc: dict[str, object]) -> str:
    kind, api = str(doc["kind"]), str(doc["apiVersion"])
    plural = _PLURALS.get(kind, kind.lower() + "s")
    base = "/api/v1" if api == "v1" else f"/apis/{api}"
    name = doc["metadata"]["name"]  # type: ignore[index]
    return f"{base}/namespaces/{NAMESPACE}/{plural}/{name}"


def _operator_crds(kube: KubeApi) -> None:
    for kind, plural in _OPERATOR_CRDS:
        status, body = kube.request(
            "POST",
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            {
                "apiVersion": "apiextensions.k8s.io/v1",
                "kind": "CustomResourceDefinition",
                "metadata": {"name": f"{plural}.monitoring.coreos.com"},
                "spec": {
                    "group": "monitoring.coreos.com",
                    "scope": "Namespaced",
                    "names": {"kind": kind, "plural": plural, "listKind": kind + "List"},
                    "versions": [
                        {
                            "name": "v1",
                            "served": True,
                            "storage": True,
                            "schema": {
                                "openAPIV3Schema": {
                                    "type": "object",
                                    "x-kubernetes-preserve-unknown-fields": True,
                                }
                            },
                        }
                    ],
                },
            },
        )
        assert status == 201, body
    deadline = time.monotonic() + 60
    while True:
        status, found = kube.request("GET", "/apis/monitoring.coreos.com/v1")
        if status == 200 and len(found["resources"]) >= len(_OPERATOR_CRDS):
            return
        assert time.monotonic() < deadline, found
        time.sleep(0.5)


def _install(kube: KubeApi, values: str) -> None:
    """``helm install bk`` of the chart with ci/VALUES-values.yaml into ``kube``."""
    proc = subprocess.run(
        [str(helm()), "install", "bk", str(CHART), "--namespace", NAMESPACE,
         "--create-namespace", "-f", str(VALUES[values]), "--kubeconfig",
         str(kube.kubeconfig), "--timeout", "2m"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_helm_install_creates_every_object_and_the_spark_account_is_namespaced(
    tmp_path: Path,
) -> None:
    docs = render("full", KUBE_VERSION)
    with kube_apiserver(tmp_path / "kube") as kube:
        _operator_crds(kube)
        _install(kube, "full")
        for doc in docs:
            stored = kube.get(_path(doc))
            # the chart's labels (Helm adds its own app.kubernetes.io/managed-by)
            assert doc["metadata"]["labels"].items() <= stored["metadata"]["labels"].items()
        watch = next(d for d in docs if d["kind"] in ("Deployment", "StatefulSet"))
        deployment = kube.get(_path(watch))
        assert deployment["spec"]["replicas"] == 2

        spark = next(d for d in docs if d["kind"] == "ServiceAccount")["metadata"]["name"]
        user = f"system:serviceaccount:{NAMESPACE}:{spark}"
        groups = ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}",
                  "system:authenticated"]  # fmt: skip
        for verb in ("create", "watch", "delete"):
            assert kube.can(user, groups, namespace=NAMESPACE, verb=verb, resource="pods")
        assert kube.can(user, groups, namespace=NAMESPACE, verb="create", resource="services")
        # Nothing outside its namespace, nothing cluster-wide, no secrets.
        assert not kube.can(user, groups, namespace="default", verb="create", resource="pods")
        assert not kube.can(user, groups, verb="list", resource="nodes")
        assert not kube.can(user, groups, verb="create", resource="clusterroles",
                            group="rbac.authorization.k8s.io")  # fmt: skip
        assert not kube.can(user, groups, namespace=NAMESPACE, verb="get", resource="secrets")
        # The watch runs as the namespace's default account: no pods for it.
        default = f"system:serviceaccount:{NAMESPACE}:default"
        assert not kube.can(default, groups, namespace=NAMESPACE, verb="create", resource="pods")


def test_helm_install_with_an_s3_warehouse_and_workload_identity(tmp_path: Path) -> None:
    """docs/kubernetes.md's S3 install: the API server takes every object, the watch's
    ServiceAccount carries the role annotation and may do nothing in the cluster."""
    docs = render("s3", KUBE_VERSION)
    with kube_apiserver(tmp_path / "kube") as kube:
        _install(kube, "s3")
        for doc in docs:
            assert kube.get(_path(doc))["metadata"]["name"] == doc["metadata"]["name"]
        account = kube.get(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/bk-bkaudit")
        assert account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].endswith(
            ":role/bkaudit"
        )
        assert account["automountServiceAccountToken"] is False
        user = f"system:serviceaccount:{NAMESPACE}:bk-bkaudit"
        groups = ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}",
                  "system:authenticated"]  # fmt: skip
        assert not kube.can(user, groups, namespace=NAMESPACE, verb="get", resource="secrets")
        assert not kube.can(user, groups, namespace=NAMESPACE, verb="create", resource="pods")
