"""The bkaudit and bkaudit-spark images, built here by ``scripts/build_images.sh`` (``make
image``) and run with podman: the CLI in each, a ``bkaudit watch`` container that repairs a
killed bookie by itself and stops on SIGTERM without an init process, and a Spark audit from
the Spark image. The containers and the sandbox share a network namespace that has nothing but
loopback, so neither image reaches Maven Central, PyPI or anything else at run time."""

from __future__ import annotations

import json
import socket
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bklib.states import DEFAULT_LEDGERS_ROOT, Executor, RunStatus
from bklib.testing.metrics_page import samples
from bklib.testing.oxiaserver import OxiaServer
from bklib.testing.ports import free_port
from jobs.tables.schema import ACTIONS, AUDIT_RUNS, FRAGMENTS
from tests.audit_helpers import audit_cluster
from tests.bookie_helpers import wait_for_no_znode
from tests.deploy.images import (
    ARCHIVED,
    ARCHIVES,
    IMAGES,
    VERSION,
    build_images,
    image,
    loopback_only_network,
    podman,
)
from tests.http_helpers import http_get
from tests.integration.test_watch import assert_clean, ledgers, repaired, rows, settled
from tests.jvm import TEST_JVM_OPTIONS

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

UID = 10001
"""The images' user, as the Helm chart's podSecurityContext.runAsUser says."""


@pytest.fixture(scope="module")
def images() -> None:
    """Both images, up to date with this checkout."""
    build_images()


def _revision() -> str:
    import subprocess

    from tests.deploy.images import REPO

    return subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.mark.parametrize("name", IMAGES)
def test_cli_runs_in_each_image_as_non_root_with_oci_labels(images: None, name: str) -> None:
    ref = image(name)
    out = podman("run", "--rm", "--read-only", "--network=none", ref, "--help")
    assert out.stdout.startswith("usage: bkaudit"), out.stdout
    assert "audit" in out.stdout and "watch" in out.stdout
    who = podman("run", "--rm", "--read-only", "--network=none", "--entrypoint", "id", ref)
    assert who.stdout.split()[0] == f"uid={UID}(bkaudit)", who.stdout
    labels = json.loads(podman("image", "inspect", "--format", "{{json .Labels}}", ref).stdout)
    assert labels["org.opencontainers.image.title"] == name
    assert labels["org.opencontainers.image.version"] == VERSION
    assert labels["org.opencontainers.image.revision"] == _revision()
    assert labels["org.opencontainers.image.source"].startswith("https://")
    config = json.loads(podman("image", "inspect", "--format", "{{json .Config}}", ref).stdout)
    entrypoint = {
        "bkaudit": ["bkaudit"],
        "bkaudit-spark": ["/opt/bkaudit/bin/bkaudit-spark-entrypoint"],
    }
    assert config["Entrypoint"] == entrypoint[name] and config["StopSignal"] == "SIGTERM"


@pytest.mark.parametrize("name", ARCHIVED)
def test_make_image_saves_the_image_as_an_oci_archive(images: None, name: str) -> None:
    ref = image(name)
    # make image's archive holds this very image, as an OCI layout
    archive = ARCHIVES / f"{name}-{VERSION}.oci.tar"
    image_id = podman("image", "inspect", "--format", "{{.Id}}", ref).stdout.strip()
    assert Path(f"{archive}.id").read_text().strip() == image_id
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
        assert {"oci-layout", "index.json"} <= names
        index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
    refs = [m["annotations"]["org.opencontainers.image.ref.name"] for m in index["manifests"]]
    assert refs == [f"localhost/{name}:{VERSION}"] or refs == [VERSION], refs


def test_spark_image_starts_a_kubernetes_executor_and_submits_with_the_bundled_jars(
    images: None,
) -> None:
    ref = image("bkaudit-spark")
    # An executor pod: Spark passes `executor` and the environment below (Spark's
    # BasicExecutorFeatureStep). No driver listens on port 9: the executor JVM must start
    # Spark's KubernetesExecutorBackend and fail to reach exactly that driver.
    env = {
        "SPARK_EXECUTOR_MEMORY": "512m",
        "SPARK_DRIVER_URL": "spark://CoarseGrainedScheduler@127.0.0.1:9",
        "SPARK_EXECUTOR_ID": "7",
        "SPARK_EXECUTOR_CORES": "1",
        "SPARK_APPLICATION_ID": "spark-bkaudit-test",
        "SPARK_EXECUTOR_POD_IP": "127.0.0.1",
        "SPARK_JAVA_OPT_0": "-Dbkaudit.image.test=1",
    }
    flags = [x for k, v in env.items() for x in ("-e", f"{k}={v}")]
    out = podman("run", "--rm", "--read-only", "--network=none", *flags, ref, "executor",
                 check=False, timeout=300)  # fmt: skip
    assert out.returncode != 0
    assert "KubernetesExecutorBackend.main" in out.stderr, out.stderr[-3000:]
    assert "127.0.0.1:9" in out.stderr, out.stderr[-3000:]
    # spark-submit (the chart's driver container) reads SPARK_CONF_DIR: Delta's settings, with
    # the jars in the image rather than a package to resolve from Maven.
    conf = podman("run", "--rm", "--network=none", "--entrypoint", "sh", ref, "-c",
                  'cat "$SPARK_CONF_DIR/spark-defaults.conf"').stdout  # fmt: skip
    settings = dict(line.split(" ", 1) for line in conf.splitlines() if line[:1] not in "#")
    assert "spark.jars.packages" not in settings
    assert settings["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"
    jars = settings["spark.jars"].split(",")
    assert jars and all(j.startswith("/opt/bkaudit/") for j in jars), jars
    # The s3a jars and bkaudit's Delta log store for S3 (jobs/spark/s3.py), named for s3a.
    names = [j.rsplit("/", 1)[1] for j in jars]
    assert {"hadoop-aws-3.4.1.jar", "bundle-2.24.6.jar"} <= set(names), names
    assert any(n.startswith("bkaudit-logstore-") for n in names), names
    assert settings["spark.delta.logStore.s3a.impl"] == "io.bkaudit.delta.ConditionalPutLogStore"
    listed = podman("run", "--rm", "--network=none", "--entrypoint", "ls", ref,
                    *jars, "/opt/bkaudit/jobs/audit.py").stdout  # fmt: skip
    assert all(j in listed for j in jars), listed


def _metrics(port: int) -> dict[str, float]:
    return samples(http_get(port, "/metrics")[1])


def _wait(cond: object, timeout: float, what: str, container: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return
        state = podman("inspect", "--format", "{{.State.Status}}", container, check=False)
        assert state.stdout.strip() == "running", podman("logs", container, check=False).stderr
        time.sleep(0.5)
    logs = podman("logs", container, check=False)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{logs.stderr[-6000:]}")


def _writable(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o777)  # the containers run as uid 10001
    return path


@pytest.fixture
def loopback_only() -> Iterator[str]:
    with loopback_only_network() as name:
        # Nothing but loopback: a container here reaches no registry, index or repository.
        assert [n for _, n in socket.if_nameindex()] == ["lo"]
        yield name


def test_spark_audit_then_watch_repair_from_the_images_on_loopback_only(
    images: None, loopback_only: str, tmp_path: Path
) -> None:
    wh = _writable(tmp_path / "warehouse")
    with audit_cluster(tmp_path / "sb", None, bookies=4) as c:
        victim = c.bookie_ids[3]
        ids = [md.ledger_id for md in ledgers(c, victim)]
        naming = sorted(lid for lid in ids if victim in c.store.read_ledger(lid).value.bookies())
        c.sandbox.kill_bookie(victim)
        # Lost once its ZooKeeper session has expired and its registration is gone.
        wait_for_no_znode(c.store.zk, f"{DEFAULT_LEDGERS_ROOT}/available/{victim}")

        # bkaudit-spark: the lost check on Spark (local[2] inside the container), its Delta
        # jars from the image, no Maven at run time.
        spark = podman(
            "run", "--rm", "--read-only", "--network=host", "-v", f"{wh}:/warehouse",
            "-e", f"SPARK_SUBMIT_OPTS={' '.join(TEST_JVM_OPTIONS)}",  # tests/jvm.py
            image("bkaudit-spark"), "audit", "--executor", "spark", "--check", "lost",
            "--zk", c.zk, "--warehouse", "/warehouse", "--master", "local[2]",
            check=False, timeout=900,
        )  # fmt: skip
        assert spark.returncode == 0, spark.stderr[-6000:]
        runs = rows(str(wh), AUDIT_RUNS)
        assert [(r["check"], r["executor"], r["status"]) for r in runs] == [
            ("lost", Executor.SPARK, RunStatus.COMPLETED)
        ], runs
        found = rows(str(wh), FRAGMENTS)
        assert sorted({f["ledger_id"] for f in found}) == naming
        assert all(f["bookie_id"] == victim for f in found), found

        # bkaudit: the watch, which sees the lost bookie and repairs it with nothing typed.
        port = free_port()
        name = f"bkaudit-watch-{port}"
        podman(
            "run", "-d", "--name", name, "--read-only", "--network=host", "--stop-timeout", "30",
            "-v", f"{wh}:/warehouse", image("bkaudit"), "watch", "--zk", c.zk,
            "--warehouse", "/warehouse", "--spool-dir", "/tmp/spool", "--every", "off",
            "--grace-period", "0s", "--lost-bookie-recovery-delay", "0s",
            "--zk-session-timeout", "3s", "--retry-interval", "1s", "--poll-interval", "0.5s",
            "--metrics-host", "127.0.0.1", "--metrics-port", str(port), "--instance-id", name,
        )  # fmt: skip
        try:
            _wait(lambda: repaired(c, ids, victim), 120, "the watch's repair", name)
            _wait(lambda: settled(_metrics(port)), 60, "the watch's clean re-audit", name)
            assert http_get(port, "/healthz")[0] == 200
            status, ready = http_get(port, "/readyz")
            assert status == 200 and json.loads(ready)["role"] == "leader", (
                ready,
                podman("logs", name, check=False).stderr[-6000:],
            )
            t0 = time.monotonic()
            podman("stop", "--time", "30", name, timeout=60)
            stopped_in = time.monotonic() - t0
            state = json.loads(podman("inspect", "--format", "{{json .State}}", name).stdout)
        finally:
            logs = podman("logs", name, check=False).stderr
            podman("rm", "-f", name, check=False)
        # SIGTERM, handled by bkaudit as PID 1: exit 0 well before podman's SIGKILL at 30 s.
        assert state["ExitCode"] == 0 and stopped_in < 30, (state, logs[-4000:])
        assert_clean(c, ids, victim)
    copies = [a for a in rows(str(wh), ACTIONS) if a["action"] == "COPY"]
    assert {a["ledger_id"] for a in copies if a["status"] == "DONE"} == set(naming)


def test_the_bkaudit_image_audits_a_cluster_on_oxia_on_loopback_only(
    images: None, loopback_only: str, tmp_path: Path
) -> None:
    # The image carries the oxia extra: the lost check through Pulsar's metadata-store:oxia://
    # URI, against an Oxia server and bookies in the same loopback-only namespace.
    wh = _writable(tmp_path / "warehouse")
    with (
        OxiaServer(tmp_path / "oxia", shards=3) as server,
        audit_cluster(tmp_path / "sb", server.locator(), bookies=4) as c,
    ):
        victim = c.bookie_ids[3]
        ids = [md.ledger_id for md in ledgers(c, victim)]
        naming = sorted(lid for lid in ids if victim in c.store.read_ledger(lid).value.bookies())
        c.sandbox.kill_bookie(victim)
        c.sandbox.wait_unregistered(victim)
        proc = podman(
            "run", "--rm", "--read-only", "--network=host", "-v", f"{wh}:/warehouse",
            image("bkaudit"), "audit", "--executor", "local", "--check", "lost",
            "--metadata-uri", server.uri(), "--warehouse", "/warehouse",
            check=False, timeout=300,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-6000:]
        runs = rows(str(wh), AUDIT_RUNS)
        assert [(r["check"], r["status"]) for r in runs] == [("lost", RunStatus.COMPLETED)], runs
        found = rows(str(wh), FRAGMENTS)
        assert sorted({f["ledger_id"] for f in found}) == naming
        assert all(f["bookie_id"] == victim for f in found), found
