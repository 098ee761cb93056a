"""JVM options for the suite's short-lived Spark JVMs (drivers, executors, standalone daemons).

They run many small jobs on a 2-core machine: C2's compilations and G1's threads cost more CPU
than they save there, and so does loading and verifying Spark's and Scala's classes afresh in
every JVM (docs/benchmarks.md, "The suite's CPU"). Java bookies and Pulsar get the quick-start
options in their own harnesses; production JVMs keep the defaults.

- :data:`TEST_JVM_OPTIONS`: no C2, the serial collector, and C2's code cache size. Without C2
  the JVM reserves 48 MB for compiled code; a driver running audits for minutes fills it, and
  the code cache sweeper then spends a core evicting and recompiling.
- :func:`spark_jvm_options`: those, plus a class-data-sharing archive of the classes a Spark
  driver with Delta Lake loads (JDK's AppCDS, ``-XX:SharedArchiveFile``). The archive is made
  once per Java, pyspark and option set, under ``$BKAUDIT_CACHE/jvm``. A JVM whose class path
  does not match it (a standalone daemon started elsewhere) ignores it, quietly.

tests/conftest.py hands them to every Spark driver through ``SPARK_SUBMIT_OPTS``; the standalone
cluster's daemons and executors take them too (tests/deploy/standalone.py).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

from bklib.maven import cache_dir

TEST_JVM_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-XX:ReservedCodeCacheSize=240m")

REPO = Path(__file__).resolve().parents[1]

# What the archive is made from: a session with Delta Lake, a Delta write and a read, so that
# the classes of Spark SQL's planner and of a Delta commit are in it.
_WARM_UP = """
import sys, tempfile
from jobs.spark.session import build_spark
spark = build_spark("bkaudit-cds-archive", master="local[2]")
path = tempfile.mkdtemp()
spark.range(100).write.format("delta").save(path)
assert spark.read.format("delta").load(path).count() == 100
spark.stop()
"""

# A JVM that cannot use the archive (another class path) says so on stdout: keep it quiet.
_QUIET = ("-Xlog:cds=off", "-Xlog:cds+dynamic=off")


def _archive_path() -> Path:
    """Where the archive for this Java, this pyspark and these options lives."""
    import pyspark

    java = subprocess.run(
        ["java", "-version"], capture_output=True, text=True, timeout=60, check=False
    ).stderr
    # The JVM checks the class path's jars by size and time: a reinstalled pyspark needs
    # an archive of its own.
    jars = sorted((Path(pyspark.__file__).parent / "jars").glob("spark-core_*.jar"))
    stamps = [f"{j.name} {j.stat().st_size} {j.stat().st_mtime_ns}" for j in jars]
    key = "\n".join([java, pyspark.__version__, pyspark.__file__, *stamps, *TEST_JVM_OPTIONS])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_dir() / "jvm" / f"spark-{digest}.jsa"


def _dumping(tmp: Path) -> bool:
    """Whether a JVM told to write its archive to ``tmp`` is still running (the driver JVM
    outlives pyspark's Python by a moment, and writes the archive as it exits)."""
    needle = f"ArchiveClassesAtExit={tmp}".encode()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if needle in (proc / "cmdline").read_bytes():
                    return True
            except OSError:
                continue
    return False


def _make_archive(path: Path) -> None:
    """Run :data:`_WARM_UP` in a driver JVM that dumps the classes it loaded into ``path``."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    opts = " ".join([*TEST_JVM_OPTIONS, f"-XX:ArchiveClassesAtExit={tmp}", *_QUIET])
    env = {**os.environ, "SPARK_SUBMIT_OPTS": opts, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", _WARM_UP], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=600, check=False,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while _dumping(tmp) and time.monotonic() < deadline:
        time.sleep(0.2)
    if out.returncode == 0 and tmp.is_file() and not _dumping(tmp):
        os.replace(tmp, path)
        _prune(path)
        return
    tmp.unlink(missing_ok=True)
    print(
        f"tests/jvm.py: no class-data-sharing archive for Spark (exit {out.returncode}); the "
        f"suite's Spark JVMs start without it\n{out.stderr[-2000:]}",
        file=sys.stderr,
    )


def _prune(keep: Path, days: float = 2.0) -> None:
    """Remove the archives of other venvs not made in the last ``days`` (170 MB each)."""
    cutoff = time.time() - days * 86400
    for old in keep.parent.glob("spark-*.jsa"):
        if old != keep and old.stat().st_mtime < cutoff:
            old.unlink(missing_ok=True)
            old.with_suffix(".lock").unlink(missing_ok=True)


def spark_jvm_options() -> tuple[str, ...]:
    """:data:`TEST_JVM_OPTIONS`, plus the Spark class-data-sharing archive, made here under a
    file lock if no worker has made it yet (about 40 s, once per cache)."""
    path = _archive_path()
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not path.is_file():
                _make_archive(path)
    if not path.is_file():
        return TEST_JVM_OPTIONS
    return (*TEST_JVM_OPTIONS, f"-XX:SharedArchiveFile={path}", *_QUIET)
