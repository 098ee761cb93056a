"""Facts about Apache Pulsar's Helm chart that bkaudit's chart must match, written down here as
data (not fetched, not copied files). Source: github.com/apache/pulsar-helm-chart, chart
``charts/pulsar`` at tag ``pulsar-4.7.0`` (commit de7be31, Chart.yaml version 4.7.0, appVersion
4.0.12); the file each fact comes from is named beside it. ``FN`` is the chart's
``pulsar.fullname``, ``R`` the Helm release's name."""

from __future__ import annotations

from dataclasses import dataclass

CHART = "apache/pulsar-helm-chart charts/pulsar, tag pulsar-4.7.0 (de7be31)"
NAME = "pulsar"
"""``pulsar.name`` without nameOverride: the chart's name (templates/_helpers.tpl)."""

# templates/_helpers.tpl: pulsar.standardLabels (every object's metadata.labels),
# pulsar.template.labels (pod templates), pulsar.matchLabels (selectors); each object and pod
# then adds `component: <values>.<comp>.component`.
STANDARD_LABELS = frozenset({"app", "chart", "release", "heritage", "cluster"})
TEMPLATE_LABELS = frozenset({"app", "release", "cluster"})
MATCH_LABELS = frozenset({"app", "release"})
COMPONENT_LABEL = "component"

# values.yaml: <comp>.component, which names the objects "FN-<component>".
COMPONENTS = {
    "zookeeper": "zookeeper",
    "bookkeeper": "bookie",
    "autorecovery": "recovery",
    "broker": "broker",
    "proxy": "proxy",
    "toolset": "toolset",
}

# values.yaml <comp>.ports, exposed by zookeeper-service.yaml (clientTls only with tls.enabled
# and tls.zookeeper.enabled), bookkeeper-service.yaml, broker-service.yaml (https only with
# tls.broker.enabled).
PORTS = {
    "zookeeper": {"client": 2181, "clientTls": 2281, "http": 8000},
    "bookie": {"bookie": 3181, "http": 8000},
    "broker": {"http": 8080, "https": 8443, "pulsar": 6650, "pulsarssl": 6651},
}

# values.yaml auth.superUsers.client; scripts/pulsar/generate_token.sh and jwt-secret-init.yaml
# make Secret "R-token-<subject>" (the subject's value) holding the token under this key.
ADMIN_SUBJECT = "admin"
TOKEN_KEY = "TOKEN"

# values.yaml tls.<comp>.cert_name; _certs.tpl pulsar.cert.template names the Secret
# "R-<cert_name>" (the Certificate is FN-<cert_name>). tls-certs-internal.yaml makes the
# autorecovery and toolset certificates only with tls.zookeeper.enabled.
CERT_NAMES = {
    "proxy": "tls-proxy",
    "broker": "tls-broker",
    "bookie": "tls-bookie",
    "zookeeper": "tls-zookeeper",
    "autorecovery": "tls-recovery",
    "toolset": "tls-toolset",
}
TLS_KEYS = ("tls.crt", "tls.key")  # cert-manager's kubernetes.io/tls keys
# values.yaml tls.ca_suffix; _certs.tpl: the CA Secret is "R-<ca_suffix>", key ca.crt,
# mounted at /pulsar/certs/ca in every component (e.g. autorecovery-statefulset.yaml).
CA_SUFFIX = "ca-tls"
CA_KEY = "ca.crt"
CA_MOUNT_DIR = "/pulsar/certs/ca"

# values.yaml affinity: anti_affinity true, anti_affinity_topology_key; autorecovery's type.
ANTI_AFFINITY_TOPOLOGY_KEY = "kubernetes.io/hostname"
ANTI_AFFINITY_TYPE = "requiredDuringSchedulingIgnoredDuringExecution"

# values.yaml components.autorecovery (default true): the lasting way to turn it off.
AUTORECOVERY_SWITCH = "components.autorecovery"

# prometheus-community/helm-charts kube-prometheus-stack, templates/prometheus/prometheus.yaml:
# with *SelectorNilUsesHelmValues (true by default) Prometheus selects PodMonitors,
# ServiceMonitors and PrometheusRules by this label, valued with its own Helm release.
KUBE_PROMETHEUS_SELECTOR_LABEL = "release"


@dataclass(frozen=True)
class PulsarRelease:
    """A release of the Pulsar chart, with the values that change its names."""

    release: str = "pulsar"
    name_override: str = ""
    fullname_override: str = ""
    cluster_name: str = ""
    metadata_prefix: str = ""  # values.yaml metadataPrefix
    tls_zookeeper: bool = False  # tls.enabled and tls.zookeeper.enabled

    @property
    def fullname(self) -> str:
        """templates/_helpers.tpl pulsar.fullname."""
        if self.fullname_override:
            return self.fullname_override[:63].rstrip("-")
        name = self.name_override or NAME
        full = self.release if name in self.release else f"{self.release}-{name}"
        return full[:63].rstrip("-")

    @property
    def cluster(self) -> str:
        """pulsar.cluster.name: the `cluster` label and the brokers' clusterName."""
        return self.cluster_name or self.fullname

    def service(self, component: str) -> str:
        """The Service of a component: "FN-<component>" (e.g. pulsar-zookeeper)."""
        return f"{self.fullname}-{component}"

    @property
    def zookeeper_connect(self) -> str:
        """_zookeeper.tpl pulsar.zookeeper.connect: port 2281 with ZooKeeper TLS."""
        ports = PORTS["zookeeper"]
        port = ports["clientTls"] if self.tls_zookeeper else ports["client"]
        return f"{self.service('zookeeper')}:{port}"

    @property
    def bookies_metadata_uri(self) -> str:
        """_bookkeeper.tpl pulsar.bookkeeper.config.common metadataServiceUri (without
        usePulsarMetadataBookieDriver)."""
        return f"zk+hierarchical://{self.zookeeper_connect}{self.metadata_prefix}/ledgers"

    @property
    def token_secret(self) -> str:
        return f"{self.release}-token-{ADMIN_SUBJECT}"

    def tls_secret(self, component: str) -> str:
        return f"{self.release}-{CERT_NAMES[component]}"

    @property
    def ca_secret(self) -> str:
        return f"{self.release}-{CA_SUFFIX}"
