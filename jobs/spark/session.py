"""The SparkSession every bkaudit job and test uses: Delta Lake configured, quiet logs.

Quiet unless ``--verbose`` (:func:`jobs.runtime.logs.is_verbose`): Spark's console progress bar is
off (the jobs draw their own, :mod:`jobs.runtime.progress`), and what the JVM prints while it starts
(Ivy's dependency-resolution report, JDK notices) is held back; it is shown only when the JVM
fails to start. After start-up the JVM's output (log4j warnings and errors) reaches stderr as
before.

Settings come, lowest precedence first, from ``conf/spark-defaults.conf`` (linked into this
package, so that an installed bkaudit has it too), then the ``overrides`` the caller passes.
The Delta jars resolve from Maven Central the first time (Ivy caches them in ``~/.ivy2``), or
come from ``$BKAUDIT_SPARK_JARS`` (:mod:`jobs.spark.jars`, the Spark image). Under
``spark-submit`` the JVM already exists and static settings (jars, SQL extensions) must come
from the command line or from ``SPARK_CONF_DIR=conf``; :func:`build_spark` then only adds what
can still be set.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import threading
from collections.abc import Mapping
from pathlib import Path

from pyspark.sql import SparkSession

from bklib.meta.stores.zookeeper.budget import RATE_ENV, request_budget
from jobs.runtime import interrupts
from jobs.runtime.cores import usable_cores
from jobs.runtime.logs import is_verbose
from jobs.spark.defaults import LOG4J_FILE, REQUIRED_CONF, read_spark_defaults
from jobs.spark.jars import DELTA_PACKAGE, bundled_jars
from jobs.spark.s3 import check_log_store, s3_jars, s3a_conf
from jobs.tables.object_store import is_s3

log = logging.getLogger(__name__)

_IVY_JARS = Path.home() / ".ivy2.5.2" / "jars"
_PACKAGE_JARS = {
    DELTA_PACKAGE: (
        "io.delta_delta-spark_2.13-4.0.1.jar",
        "io.delta_delta-storage-4.0.1.jar",
        "org.antlr_antlr4-runtime-4.13.1.jar",
    )
}


def _cached_jars(packages: list[str]) -> list[str] | None:
    """The jar files of ``packages`` if Ivy's cache (Spark 4's ``~/.ivy2.5.2``) has them all,
    for packages whose transitive jars we know; else None (let Ivy resolve)."""
    out: list[str] = []
    for pkg in packages:
        names = _PACKAGE_JARS.get(pkg)
        if names is None:
            return None
        paths = [_IVY_JARS / n for n in names]
        if not all(p.is_file() for p in paths):
            return None
        out += [str(p) for p in paths]
    return out


def spark_conf(
    master: str | None = None,
    overrides: Mapping[str, str] | None = None,
    warehouse: str | None = None,
) -> dict[str, str]:
    """The effective settings :func:`build_spark` applies (without building anything). A
    ``warehouse`` on S3 adds the s3a jars, bkaudit's log store and the s3a settings
    (:mod:`jobs.spark.s3`; fetched and built on first use), and raises
    :class:`~jobs.spark.s3.UnsafeLogStore` when another log store is configured for s3a."""
    conf = read_spark_defaults()
    conf.update(REQUIRED_CONF)
    on_s3 = warehouse is not None and is_s3(warehouse)
    if on_s3:
        for key, value in s3a_conf().items():
            conf.setdefault(key, value)
    packages = [p for p in conf.get("spark.jars.packages", "").split(",") if p]
    if not any(p.startswith("io.delta:delta-spark_") for p in packages):
        packages.append(DELTA_PACKAGE)
    conf["spark.jars.packages"] = ",".join(packages)
    cached = bundled_jars() if packages == [DELTA_PACKAGE] else None
    cached = cached or _cached_jars(packages)
    if cached and "spark.jars" not in conf:
        # Ivy already resolved these once: skip its resolution (and its console report).
        del conf["spark.jars.packages"]
        conf["spark.jars"] = ",".join(cached)
    if LOG4J_FILE.exists():
        # The driver JVM is launched by pyspark with these options; quiet logs from the start.
        opt = f"-Dlog4j2.configurationFile={LOG4J_FILE.as_uri()}"
        prev = conf.get("spark.driver.extraJavaOptions", "")
        conf["spark.driver.extraJavaOptions"] = f"{prev} {opt}".strip()
    # The Delta writes' plans have more fields than Spark prints by default, and it warns
    # about truncating them on every run: nothing an operator can act on.
    conf.setdefault("spark.sql.debug.maxToStringFields", "200")
    # bkaudit draws its own progress (jobs.runtime.progress); Spark's bar would interleave with
    # it and fill scheduler logs with carriage returns. -v brings Spark's back.
    conf["spark.ui.showConsoleProgress"] = "true" if is_verbose() else "false"
    if master:
        conf["spark.master"] = master
    conf.setdefault("spark.master", "local[2]")
    if under_spark_submit():
        # The JVM is up: spark-submit's --master, --packages and driver options stand.
        for key in (*_LAUNCH_ONLY, "spark.master"):
            if not (key == "spark.master" and master):
                conf.pop(key, None)
    conf.update(overrides or {})
    if on_s3:
        check_log_store(conf)
        if not under_spark_submit():
            extra = s3_jars()
            conf["spark.jars"] = ",".join([*conf.get("spark.jars", "").split(","), *extra]).strip(
                ","
            )
    _share_zk_budget(conf)
    return conf


def task_slots(conf: Mapping[str, str]) -> int:
    """How many tasks may run at once: ``local[N]``'s N, else ``spark.default.parallelism``,
    else executors times cores, else ``spark.cores.max``; 4 when nothing says."""
    master = conf.get("spark.master", "")
    m = re.fullmatch(r"local\[(\d+|\*)(?:,\d+)?\]", master)
    if m:
        # The JVM counts the cores its affinity allows, as usable_cores does.
        return usable_cores() if m.group(1) == "*" else max(1, int(m.group(1)))
    if master == "local":
        return 1
    if conf.get("spark.default.parallelism", "").isdigit():
        return max(1, int(conf["spark.default.parallelism"]))
    instances, cores = conf.get("spark.executor.instances"), conf.get("spark.executor.cores")
    if instances and cores and instances.isdigit() and cores.isdigit():
        return max(1, int(instances) * int(cores))
    if conf.get("spark.cores.max", "").isdigit():
        return max(1, int(conf["spark.cores.max"]))
    log.warning(
        "ZooKeeper budget: the number of Spark task slots is unknown (set "
        "spark.default.parallelism); each task gets a quarter of --zk-rate"
    )
    return 4


def _share_zk_budget(conf: dict[str, str]) -> None:
    """Give each task slot its share of this run's ZooKeeper budget
    (bklib.meta.stores.zookeeper.budget): the Python workers read it from their environment."""
    rate = request_budget().rate
    key = f"spark.executorEnv.{RATE_ENV}"
    if rate is not None and key not in conf:
        conf[key] = f"{rate / task_slots(conf):g}"


_LAUNCH_ONLY = ("spark.jars.packages", "spark.jars", "spark.driver.extraJavaOptions")


def under_spark_submit() -> bool:
    """True when this Python process was started by ``spark-submit`` (the JVM exists)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def build_spark(
    app_name: str = "bkaudit",
    master: str | None = None,
    overrides: Mapping[str, str] | None = None,
    warehouse: str | None = None,
) -> SparkSession:
    """Build (or get) the SparkSession with Delta Lake.

    ``master`` defaults to ``spark.master`` from the defaults file, else ``local[2]``. The
    Python workers run the same interpreter as the driver unless ``PYSPARK_PYTHON`` says
    otherwise, so executors see the same bklib and pyarrow.
    """
    from jobs.runtime.pandas_free import allow_pandas

    allow_pandas()  # mapInArrow asks for pandas in the driver
    # Workers default to `python3` on PATH, which may lack the venv's packages.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    conf = spark_conf(master, overrides, warehouse)
    _launch_jvm(conf)
    builder = SparkSession.builder.appName(app_name)
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if warehouse is not None and is_s3(warehouse):
        # Under spark-submit the launch settings were spark-submit's: check what Delta sees.
        check_log_store({k: v for k, v in spark.sparkContext.getConf().getAll()})
    spark.sparkContext.setLogLevel("WARN")
    # SparkContext took SIGINT; bkaudit's handler takes it back and cancels Spark's jobs.
    interrupts.take_back(spark.sparkContext.cancelAllJobs)
    log.debug("spark %s up, master %s", spark.version, spark.sparkContext.master)
    return spark


class _JvmOutput:
    """Forwards the driver JVM's stdout and stderr (one pipe) to this process's stderr (fd 2,
    where the JVM would have written). Until :meth:`started` is called only ``verbose`` output
    is forwarded; the rest is kept, for :meth:`replay` if the JVM failed to start."""

    def __init__(self, verbose: bool) -> None:
        self.read_fd, self.write_fd = os.pipe()
        self.verbose, self.up = verbose, False
        self.held = bytearray()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._pump, name="jvm-output", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        while True:
            try:
                chunk = os.read(self.read_fd, 65536)
            except OSError:
                return
            if not chunk:
                os.close(self.read_fd)
                return
            with self._lock:
                if self.up or self.verbose:
                    # Keep draining whatever happens to stderr: a JVM blocked on a full pipe
                    # would hang the job.
                    with contextlib.suppress(OSError, ValueError, AttributeError):
                        _write_stderr(chunk)
                elif len(self.held) < 1 << 20:
                    self.held += chunk

    def started(self) -> None:
        """The gateway is up (Ivy has resolved the packages): forward from now on."""
        os.close(self.write_fd)  # the JVM holds its own copy; EOF comes when it exits
        with self._lock:
            self.up = True
            self.held.clear()

    def replay(self) -> None:
        """The JVM did not start: show what it printed, which says why."""
        os.close(self.write_fd)
        self._thread.join(timeout=5)
        with self._lock:
            if self.held and not self.verbose:
                _write_stderr(bytes(self.held))


def _write_stderr(data: bytes) -> None:
    from jobs.runtime import progress

    if progress.bars_active():
        from tqdm import tqdm

        with tqdm.external_write_mode(file=sys.stderr):
            sys.stderr.flush()
            os.write(2, data)
    else:
        sys.stderr.flush()
        os.write(2, data)


def _launch_jvm(conf: Mapping[str, str]) -> None:
    """Start the driver JVM the way pyspark would (``spark-submit`` with ``conf``), with its
    output through :class:`_JvmOutput`. Nothing to do under ``spark-submit`` or when this
    process already has a JVM."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if under_spark_submit() or SparkContext._gateway is not None:
        return
    sconf = SparkConf(loadDefaults=False).setAll(list(conf.items()))
    # Start-up takes seconds (a minute on a busy host): say what the wait is.
    log.info("starting the Spark driver (master %s)", conf.get("spark.master", "local[2]"))
    out = _JvmOutput(is_verbose())
    try:
        gateway = launch_gateway(  # type: ignore[no-untyped-call]  # pyspark leaves it untyped
            sconf, popen_kwargs={"stdout": out.write_fd, "stderr": out.write_fd}
        )
    except BaseException:
        out.replay()
        raise
    out.started()
    SparkContext._ensure_initialized(gateway=gateway, conf=sconf)
