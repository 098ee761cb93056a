"""The Spark executors' pod template the chart ships, read by Spark itself: the driver's
``KubernetesUtils.loadPodFromTemplate`` (what ``spark.kubernetes.executor.podTemplateFile``
runs, spark-kubernetes in pyspark's jars) parses it with its Kubernetes client and picks the
container ``spark.kubernetes.executor.podTemplateContainerName`` names. The executors it makes
then mount every volume of the driver at the driver's paths: the config, the Secrets and TLS
files, and the warehouse."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.audit_helpers import shared_spark
from tests.deploy.test_helm_chart import _one, render

pytestmark = pytest.mark.integration


def _confs(args: list[str]) -> dict[str, str]:
    pairs = (a.removeprefix("--conf=").split("=", 1) for a in args if a.startswith("--conf="))
    return dict(pairs)  # type: ignore[arg-type]


def _load(template: Path, container: str) -> Any:
    """Spark's SparkPod for the template file, as the driver loads it."""
    spark = shared_spark()
    jvm = spark._jvm  # type: ignore[attr-defined]
    client = jvm.io.fabric8.kubernetes.client.KubernetesClientBuilder().build()
    try:
        utils = jvm.org.apache.spark.deploy.k8s.KubernetesUtils
        return utils.loadPodFromTemplate(
            client,
            str(template),
            jvm.scala.Option.apply(container),
            spark.sparkContext._conf._jconf,
        )
    finally:
        client.close()


@pytest.mark.parametrize("values", ["full", "oxia"])
def test_spark_reads_the_executor_template_with_the_drivers_volumes(
    values: str, tmp_path: Path
) -> None:
    docs = render(values)
    job = _one(docs, "Job")["spec"]["template"]["spec"]
    driver = job["containers"][0]
    confs = _confs(driver["args"])
    template = tmp_path / "executor.yaml"
    template.write_text(_one(docs, "ConfigMap", "-spark-executor")["data"]["executor.yaml"])
    pod = _load(template, confs["spark.kubernetes.executor.podTemplateContainerName"])

    container = pod.container()
    assert container.getName() == confs["spark.kubernetes.executor.podTemplateContainerName"]
    template_file = confs["spark.kubernetes.executor.podTemplateFile"]
    own = {m["name"] for m in driver["volumeMounts"]
           if template_file.startswith(m["mountPath"] + "/")}  # fmt: skip
    expected = [(m["name"], m["mountPath"], bool(m.get("readOnly")))
                for m in driver["volumeMounts"] if m["name"] not in own]  # fmt: skip
    got = [(m.getName(), m.getMountPath(), bool(m.getReadOnly()))
           for m in container.getVolumeMounts()]  # fmt: skip
    assert got == expected

    volumes = {v.getName(): v for v in pod.pod().getSpec().getVolumes()}
    for v in job["volumes"]:
        if v["name"] in own:
            assert v["name"] not in volumes
        elif "secret" in v:
            secret = volumes[v["name"]].getSecret()
            assert secret.getSecretName() == v["secret"]["secretName"]
            mode = secret.getDefaultMode()
            assert (mode if mode is None else int(mode)) == v["secret"].get("defaultMode")
        elif "persistentVolumeClaim" in v:
            claim = volumes[v["name"]].getPersistentVolumeClaim().getClaimName()
            assert claim == v["persistentVolumeClaim"]["claimName"]
        elif "configMap" in v:
            assert volumes[v["name"]].getConfigMap().getName() == v["configMap"]["name"]
    assert set(volumes) == {v["name"] for v in job["volumes"]} - own
    security = pod.pod().getSpec().getSecurityContext()
    assert int(security.getRunAsUser()) == job["securityContext"]["runAsUser"]
    assert int(security.getFsGroup()) == job["securityContext"]["fsGroup"]
