"""What the deployment test needs besides the sandbox: a Spark standalone cluster from pip's
pyspark, the executor virtualenv built from ``bkaudit[executor]``, and the packaging commands
of the README's deployment section.

Everything here runs real processes: the Master and Worker JVMs (``spark-class``), ``pip``,
``zip``, ``tar`` and ``spark-submit``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyspark
import tomllib

from bklib.testing.ports import free_port
from tests.jvm import spark_jvm_options

REPO = Path(__file__).resolve().parents[2]
SPARK_HOME = Path(pyspark.__file__).resolve().parent
"""pip's pyspark is a Spark distribution: bin/, jars/, python/lib/pyspark.zip."""


# Variables of the developer's shell that would let a Spark process find the dev venv or our
# checkout, or change where Spark looks for its configuration.
_SCRUB = (
    "VIRTUAL_ENV",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYSPARK_PYTHON",
    "PYSPARK_DRIVER_PYTHON",
    "PYSPARK_SUBMIT_ARGS",
    "SPARK_CONF_DIR",
    "SPARK_HOME",
)


def spark_env(**extra: str) -> dict[str, str]:
    """The environment of a Spark process: this machine's, minus the dev venv and checkout,
    with ``SPARK_HOME`` set (pip's launch scripts otherwise ask ``python3`` on PATH) and
    everything bound to loopback."""
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    env.update(SPARK_HOME=str(SPARK_HOME), SPARK_LOCAL_IP="127.0.0.1")
    # Quick-start JVMs for the Master, the Worker and spark-submit's driver (tests/jvm.py).
    jvm = " ".join(spark_jvm_options())
    env.update(SPARK_DAEMON_JAVA_OPTS=jvm, SPARK_SUBMIT_OPTS=jvm)
    env.update(extra)
    return env


# ---- packaging, as the README says -------------------------------------------------------------


def build_wheel(dist: Path) -> Path:
    """``pip wheel --no-deps -w dist .`` from the checkout; returns the wheel."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), "."],
        cwd=REPO,
        check=True,
        timeout=300,
    )
    (wheel,) = dist.glob("bkaudit-*.whl")
    return wheel


def build_zip(dist: Path) -> Path:
    """``zip -r dist/bkaudit.zip bklib jobs -x '*__pycache__*'`` from the checkout."""
    out = dist / "bkaudit.zip"
    subprocess.run(
        ["zip", "-q", "-r", str(out), "bklib", "jobs", "-x", "*__pycache__*"],
        cwd=REPO,
        check=True,
        timeout=120,
    )
    return out


def executor_requirements(pyproject: Path = REPO / "pyproject.toml") -> list[str]:
    """The ``executor`` extra of pyproject.toml: what the executor venv holds."""
    with pyproject.open("rb") as f:
        project = tomllib.load(f)["project"]
    reqs: list[str] = project["optional-dependencies"]["executor"]
    return reqs


def base_python() -> str:
    """The interpreter the dev venv was made from: executors must run the driver's Python
    version (pyspark refuses a worker whose minor version differs)."""
    return getattr(sys, "_base_executable", sys.executable)


def executor_venv(cache: Path, requirements: list[str]) -> Path:
    """A virtualenv holding exactly ``requirements`` (no bkaudit, no pyspark), built with
    ``python -m venv`` + ``pip install -r``, cached under ``cache`` by the hash of the list and
    the Python version. A machine without it builds it; any failure raises."""
    key_text = "\n".join([sys.version, *requirements])
    key = hashlib.sha256(key_text.encode()).hexdigest()[:16]
    venv = cache / f"executor-venv-{key}"
    if (venv / ".complete").is_file():
        return venv
    cache.mkdir(parents=True, exist_ok=True)
    # Built at its final path (pip writes absolute paths into bin/ scripts); the .complete
    # marker, written last, is what makes it usable, so a killed build is rebuilt.
    shutil.rmtree(venv, ignore_errors=True)
    venv.with_suffix(".tar.gz").unlink(missing_ok=True)  # packed from an earlier, broken build
    subprocess.run([base_python(), "-m", "venv", str(venv)], check=True, timeout=300)
    req_file = venv / "executor-requirements.txt"
    req_file.write_text("\n".join(requirements) + "\n")
    subprocess.run(
        [str(venv / "bin/python"), "-m", "pip", "install", "-q", "-r", str(req_file)],
        check=True,
        timeout=900,
    )
    (venv / ".complete").write_text(key_text)
    return venv


def pack_venv(venv: Path) -> Path:
    """``tar -czf executor-venv.tar.gz -C venv .``: the archive for ``--archives``, cached
    next to the venv."""
    archive = venv.with_suffix(".tar.gz")
    if archive.is_file():
        return archive
    tmp = archive.with_name(f"{archive.name}.{os.getpid()}.tmp")
    subprocess.run(
        ["tar", "-czf", str(tmp), "--exclude", "__pycache__", "-C", str(venv), "."],
        check=True,
        timeout=600,
    )
    tmp.rename(archive)
    return archive


# ---- the cluster -------------------------------------------------------------------------------


@dataclass
class StandaloneCluster:
    """A Spark standalone Master and one Worker, each a ``spark-class`` JVM on loopback."""

    base: Path
    worker_cores: int = 2
    worker_memory: str = "2g"

    def __post_init__(self) -> None:
        self.port = free_port()
        self.ui_port = free_port()
        self.worker_ui_port = free_port()
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    @property
    def work_dir(self) -> Path:
        """Where the Worker runs its executors: ``app-*/<executor id>/`` with their logs."""
        return self.base / "work"

    def _spawn(self, name: str, *args: str) -> None:
        log = (self.base / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            [str(SPARK_HOME / "bin/spark-class"), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=self.base,
            # Its own session: teardown can end the JVM and the executors it started together.
            start_new_session=True,
            env=spark_env(SPARK_WORKER_DIR=str(self.work_dir)),
        )
        self.procs.append(proc)

    def start(self, timeout: float = 240.0) -> StandaloneCluster:
        """Start both JVMs (the Worker retries until the Master is up) and wait until the
        Master reports the Worker ALIVE."""
        self.base.mkdir(parents=True, exist_ok=True)
        self.work_dir.mkdir(exist_ok=True)
        # The Master's own RPC port and UI are pinned; "--port 0" lets the Worker pick one.
        self._spawn(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--webui-port",
            str(self.ui_port),
        )
        self._spawn(
            "worker",
            "org.apache.spark.deploy.worker.Worker",
            self.master_url,
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--webui-port",
            str(self.worker_ui_port),
            "--cores",
            str(self.worker_cores),
            "--memory",
            self.worker_memory,
            "--work-dir",
            str(self.work_dir),
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"a Spark daemon exited:\n{self.log_tail()}")
            with contextlib.suppress(OSError, ValueError):
                if [w for w in self.state().get("workers", []) if w["state"] == "ALIVE"]:
                    return self
            time.sleep(0.5)  # readiness polling, not an assertion
        raise RuntimeError(f"no ALIVE worker after {timeout}s:\n{self.log_tail()}")

    def state(self) -> dict[str, Any]:
        """The Master's JSON status: workers, active and completed applications."""
        url = f"http://127.0.0.1:{self.ui_port}/json/"
        with urllib.request.urlopen(url, timeout=5) as resp:
            state: dict[str, Any] = json.load(resp)
        return state

    def executor_logs(self) -> str:
        """Every executor's stderr, for failure messages."""
        parts = []
        for f in sorted(self.work_dir.glob("app-*/*/stderr")):
            parts.append(f"==> {f} <==\n{f.read_text(errors='replace')[-4000:]}")
        return "\n".join(parts)

    def log_tail(self, n: int = 30) -> str:
        out = []
        for name in ("master", "worker"):
            path = self.base / f"{name}.log"
            if path.exists():
                lines = path.read_text(errors="replace").splitlines()[-n:]
                out.append(f"==> {name} <==\n" + "\n".join(lines))
        return "\n".join(out)

    def stop(self) -> None:
        """SIGTERM each daemon's process group (the JVM and its executors), SIGKILL after a
        grace period."""
        for proc in reversed(self.procs):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


@contextlib.contextmanager
def standalone_cluster(base: Path) -> Iterator[StandaloneCluster]:
    """A started :class:`StandaloneCluster`, stopped on exit."""
    cluster = StandaloneCluster(base)
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def spark_submit(
    cwd: Path,
    args: list[str],
    env: Mapping[str, str],
    log: Path,
    timeout: float = 1200.0,
) -> subprocess.CompletedProcess[str]:
    """``$SPARK_HOME/bin/spark-submit ARGS`` in ``cwd``. stderr (Spark's log) goes to ``log``,
    stdout (the job's log and summary) to ``log`` with suffix ``.out`` as it runs, and is
    returned as the result's ``stdout``."""
    out_path = log.with_suffix(".out")
    with log.open("w") as err, out_path.open("w") as out:
        proc = subprocess.run(
            [str(SPARK_HOME / "bin/spark-submit"), *args],
            cwd=cwd,
            env=dict(env),
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            text=True,
            timeout=timeout,
        )
    proc.stdout = out_path.read_text(errors="replace")
    return proc
