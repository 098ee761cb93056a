"""The watch's container as the chart renders it, run with podman against a sandbox (a real
ZooKeeper and Python bookies): the image, arguments, environment, user, groups, read-only root,
capabilities and every mounted file (the ConfigMap's data, the Secrets, the spool and warehouse
claims) come from the rendered manifest, turned into ``podman run`` flags as the kubelet would
apply them; nothing is hand-copied. The container must start, reach the sandbox's ZooKeeper and
bookies, lead, and answer the manifest's liveness and readiness probes."""

from __future__ import annotations

import json
import os
import re
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.audit_helpers import audit_cluster
from tests.deploy.images import VERSION, build_images, image, loopback_only_network, podman
from tests.deploy.test_helm_chart import template
from tests.http_helpers import http_get

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

Manifest = dict[str, Any]
ZK_DIGEST = "bkaudit:chart-test"
"""The digest the test's Secret holds (ZooKeeper takes any digest from a client)."""


@pytest.fixture(scope="module")
def images() -> None:
    build_images()


@pytest.fixture
def loopback_only() -> Iterator[str]:
    with loopback_only_network() as name:
        # Nothing but loopback: the container reaches the sandbox and nothing else.
        assert [n for _, n in socket.if_nameindex()] == ["lo"]
        yield name


def _pod(docs: tuple[Manifest, ...]) -> tuple[Manifest, Manifest]:
    """The watch's workload and its pod template."""
    (watch,) = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]
    return watch, watch["spec"]["template"]


def _field(path: str, pod_name: str) -> str:
    # the downward API fields a kubelet fills in, for a pod on this host's loopback
    values = {
        "metadata.name": pod_name,
        "metadata.namespace": "pulsar",
        "status.podIP": "127.0.0.1",
    }
    assert path in values, f"the test does not emulate fieldRef {path}"
    return values[path]


def _env(container: Manifest, pod_name: str) -> dict[str, str]:
    env = {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        else:
            ref = e["valueFrom"]
            assert set(ref) == {"fieldRef"}, f"the test does not emulate {ref}"
            env[e["name"]] = _field(ref["fieldRef"]["fieldPath"], pod_name)
    return env


def _expand(arg: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion of command and args."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), arg)


def _own(path: Path, gid: int | None, mode: int) -> None:
    if gid is not None:
        os.chown(path, 0, gid)
    path.chmod(mode)


def _volume_dirs(
    pod: Manifest,
    watch: Manifest,
    docs: tuple[Manifest, ...],
    secrets: dict[str, dict[str, str]],
    base: Path,
) -> dict[str, tuple[Path, bool]]:
    """Volume name -> (host directory, read-only), filled as the kubelet would: ConfigMaps
    from the rendered manifests, Secrets from ``secrets``, emptyDirs and claims empty. With
    fsGroup, files are group-owned by it and group-readable (the kubelet's
    SetVolumeOwnership: mode | 0440 read-only, | 0660 writable; directories setgid)."""
    fs_group = pod["spec"].get("securityContext", {}).get("fsGroup")
    config_maps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    claims = [c["metadata"]["name"] for c in watch["spec"].get("volumeClaimTemplates", [])]
    out: dict[str, tuple[Path, bool]] = {}
    for volume in [*pod["spec"]["volumes"], *({"name": c, "claim": {}} for c in claims)]:
        name = volume["name"]
        where = base / name
        where.mkdir(parents=True)
        if "configMap" in volume or "secret" in volume:
            if "configMap" in volume:
                source = volume["configMap"]
                data = config_maps[source["name"]]["data"]
            else:
                source = volume["secret"]
                data = secrets[source["secretName"]]
            mode = source.get("defaultMode", 0o644) | (0o440 if fs_group is not None else 0)
            for key, text in data.items():
                (where / key).write_text(text)
                _own(where / key, fs_group, mode)
            _own(where, fs_group, 0o2755)
            out[name] = (where, True)
        elif {"emptyDir", "persistentVolumeClaim", "claim"} & set(volume):
            _own(where, fs_group, 0o2777 if "emptyDir" in volume else 0o2770)
            out[name] = (where, False)
        else:
            raise AssertionError(f"the test does not emulate volume {volume}")
    return out


def podman_run_args(
    docs: tuple[Manifest, ...], secrets: dict[str, dict[str, str]], base: Path, name: str
) -> tuple[list[str], Manifest]:
    """``podman run`` flags for the watch's container as the rendered manifests give it, and
    the container's manifest."""
    watch, pod = _pod(docs)
    (container,) = pod["spec"]["containers"]
    spec, sc = pod["spec"], container.get("securityContext", {})
    psc = spec.get("securityContext", {})
    env = _env(container, name)
    flags = ["run", "-d", "--name", name, "--hostname", name, "--network=host", "--pull=never"]
    flags += ["--stop-timeout", str(spec.get("terminationGracePeriodSeconds", 30))]
    user = sc.get("runAsUser", psc.get("runAsUser"))
    group = sc.get("runAsGroup", psc.get("runAsGroup"))
    if user is not None:
        flags += ["--user", f"{user}:{group}" if group is not None else str(user)]
    if "fsGroup" in psc:
        flags += ["--group-add", str(psc["fsGroup"])]
    if sc.get("readOnlyRootFilesystem"):
        # Kubernetes mounts no tmpfs of its own: only the pod's volumes are writable.
        flags += ["--read-only", "--read-only-tmpfs=false"]
    for cap in sc.get("capabilities", {}).get("drop", []):
        flags += ["--cap-drop", cap.lower()]
    if sc.get("allowPrivilegeEscalation") is False:
        flags += ["--security-opt", "no-new-privileges"]
    for key, value in env.items():
        flags += ["-e", f"{key}={value}"]
    dirs = _volume_dirs(pod, watch, docs, secrets, base)
    for mount in container["volumeMounts"]:
        host, read_only = dirs[mount["name"]]
        ro = read_only or mount.get("readOnly", False)
        flags += ["-v", f"{host}:{mount['mountPath']}:{'ro' if ro else 'rw'}"]
    if "command" in container:
        flags += ["--entrypoint", json.dumps([_expand(c, env) for c in container["command"]])]
    flags += [container["image"], *(_expand(a, env) for a in container.get("args", []))]
    return flags, container


def _probe(container: Manifest, which: str) -> tuple[int, str]:
    """(port, path) of a probe's httpGet, its named port resolved."""
    get = container[which]["httpGet"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    port = get["port"] if isinstance(get["port"], int) else ports[get["port"]]
    return port, get["path"]


def _metric(port: int, name: str) -> float | None:
    for line in http_get(port, "/metrics")[1].splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def _wait(cond: Callable[[], bool], timeout: float, what: str, name: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        state = podman("inspect", "--format", "{{.State.Status}}", name, check=False)
        assert state.stdout.strip() == "running", podman("logs", name, check=False).stderr
        time.sleep(0.5)
    logs = podman("logs", name, check=False).stderr
    raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{logs[-6000:]}")


def test_the_rendered_watch_container_starts_and_reaches_a_sandbox(
    images: None, loopback_only: str, tmp_path: Path
) -> None:
    with audit_cluster(tmp_path / "sb", None, bookies=3) as c:
        values = {
            "image": {"repository": "localhost/bkaudit", "tag": VERSION},
            "metadata": {"zk": c.zk},
            "warehouse": "/data/bkaudit",
            "warehouseVolume": {"persistentVolumeClaim": {"claimName": "bkaudit-warehouse"}},
            "auth": {"zkAuth": {"secretName": "bkaudit-zk-auth"}},
            "watch": {"spool": {"persistence": {"enabled": True}}},
        }
        (tmp_path / "values.yaml").write_text(yaml.safe_dump(values))
        docs = template("-f", str(tmp_path / "values.yaml"))
        secrets = {"bkaudit-zk-auth": {"zk-auth": ZK_DIGEST}}
        name = f"bk-bkaudit-watch-0-{os.getpid()}"
        flags, container = podman_run_args(docs, secrets, tmp_path / "volumes", name)
        assert container["image"] == image("bkaudit")
        # the config the container reads names the sandbox and the digest's file
        config = yaml.safe_load(
            next(d for d in docs if d["kind"] == "ConfigMap")["data"]["bkaudit.yaml"]
        )
        assert config["global"]["zk"] == c.zk and config["global"]["zk-auth-file"]
        podman(*flags)
        try:
            live, ready = _probe(container, "livenessProbe"), _probe(container, "readinessProbe")
            _wait(lambda: http_get(*ready)[0] == 200, 180, "the readiness probe", name)
            status, body = http_get(*ready)
            assert status == 200 and json.loads(body)["role"] == "leader", body
            assert http_get(*live)[0] == 200
            # it read the sandbox: its bookies, as the leader's cycle counts them
            writable = 'bkaudit_bookies{state="writable"}'
            _wait(lambda: _metric(ready[0], writable) == 3, 120, "the bookies' count", name)
            assert _metric(ready[0], "bkaudit_watch_leader") == 1
            state = json.loads(podman("inspect", "--format", "{{json .State}}", name).stdout)
            assert state["Running"] is True, state
        finally:
            logs = podman("logs", name, check=False).stderr
            podman("rm", "-f", name, check=False)
        assert "Traceback" not in logs, logs[-4000:]
