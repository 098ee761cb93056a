"""Spark on an S3 warehouse: the s3a jars, bkaudit's log store, and the settings they need.

Spark reaches S3 through Hadoop's s3a file system: ``hadoop-aws`` of the Hadoop release
PySpark ships (3.4.1) and the AWS SDK bundle it was built against. Delta's default log store
for s3a (``S3SingleDriverLogStore``) is safe for one driver only: it checks that a commit
does not exist and then PUTs it, so beside the watch or a local audit (delta-rs, which
commits with ``If-None-Match: *``) it can overwrite their commit. bkaudit therefore commits
through its own log store, ``io.bkaudit.delta.ConditionalPutLogStore``
(``logstore/ConditionalPutLogStore.java``): the same conditional PUT, a refusal turned into
the ``FileAlreadyExistsException`` Delta retries on. It is compiled here against the pinned
jars (``javac``), once, into the cache.

A session for an S3 warehouse gets the jars, ``spark.delta.logStore.s3a.impl`` naming that
store and the ``fs.s3a.*`` settings of the AWS environment (:mod:`jobs.tables.object_store`);
a session configured with another log store for s3a is refused (:class:`UnsafeLogStore`).
docs/tables.md, "Object storage".
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from bklib.maven import Artifact, FetchError, cache_dir, fetch_artifacts
from jobs.spark.jars import DELTA_JARS
from jobs.tables.object_store import s3_endpoint, s3_region

__all__ = [
    "LOG_STORE_CLASS",
    "LOG_STORE_KEYS",
    "S3_JARS",
    "S3SetupError",
    "UnsafeLogStore",
    "check_log_store",
    "s3_jars",
    "s3a_conf",
]

log = logging.getLogger(__name__)

S3_JARS: tuple[Artifact, ...] = (
    Artifact(
        "org.apache.hadoop",
        "hadoop-aws",
        "3.4.1",
        "",
        "01334a07e179cae2b7e251f24857f11e3759108c9d6a79dcbe362a4295227da2",
    ),
    Artifact(
        "software.amazon.awssdk",
        "bundle",
        "2.24.6",
        "",
        "890bf9f2a80488f7a8aa8277d64d13a9ea3a3cdff8607ef3b63a878d8b467b41",
    ),
)
"""hadoop-aws for PySpark's Hadoop 3.4.1, and the AWS SDK v2 bundle its POM names."""

LOG_STORE_CLASS = "io.bkaudit.delta.ConditionalPutLogStore"
LOG_STORE_SOURCE = Path(__file__).parent / "logstore" / "ConditionalPutLogStore.java"
LOG_STORE_KEYS = ("spark.delta.logStore.s3a.impl", "spark.delta.logStore.s3.impl")
"""Delta's settings choosing the log store of an s3a:// (and s3://) path."""
_GLOBAL_LOG_STORE = "spark.delta.logStore.class"


class S3SetupError(RuntimeError):
    """The s3a jars could not be fetched or the log store not built (one line saying why)."""


class UnsafeLogStore(RuntimeError):
    """A Spark session would commit to an S3 warehouse through a log store that can lose
    another writer's commit (one line naming the setting)."""


def _jar_dir() -> Path:
    return cache_dir() / "spark-s3" / "-".join(a.version for a in S3_JARS)


def _log_store_jar() -> Path:
    digest = hashlib.sha256(LOG_STORE_SOURCE.read_bytes()).hexdigest()[:16]
    return cache_dir() / "spark-s3" / f"bkaudit-logstore-{digest}.jar"


def s3_jars(fetch: bool = True) -> list[str]:
    """The jars an S3 warehouse's Spark session adds: hadoop-aws, the SDK bundle, and the
    log store (built if needed). ``fetch=False`` raises :class:`S3SetupError` instead of
    downloading (about 560 MB, once)."""
    where = _jar_dir()
    try:
        from bklib.maven import is_complete

        if not is_complete(where, S3_JARS):
            if not fetch:
                raise S3SetupError(f"the s3a jars are not in {where}: run python -m jobs.spark.s3")
            log.warning("fetching hadoop-aws and the AWS SDK bundle (560 MB, once) into %s", where)
            fetch_artifacts(S3_JARS, where, timeout=300)
    except FetchError as exc:
        raise S3SetupError(str(exc)) from None
    jars = [str(where / a.filename) for a in S3_JARS]
    return [*jars, str(_build_log_store(jars))]


def _delta_storage_jar() -> Path:
    storage = next(a for a in DELTA_JARS if a.artifact == "delta-storage")
    where = cache_dir() / "spark-s3" / f"delta-storage-{storage.version}"
    try:
        fetch_artifacts([storage], where)
    except FetchError as exc:
        raise S3SetupError(str(exc)) from None
    return where / storage.filename


def _hadoop_api_jar() -> Path:
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    found = sorted(jars.glob("hadoop-client-api-*.jar"))
    if not found:
        raise S3SetupError(f"no hadoop-client-api jar in {jars}: is pyspark installed whole?")
    return found[-1]


def _build_log_store(s3_jars: Sequence[str]) -> Path:
    """Compile the log store into its cached jar, named by its source's digest."""
    out = _log_store_jar()
    if out.is_file():
        return out
    javac = shutil.which("javac")
    if javac is None:
        raise S3SetupError(
            "javac not found: bkaudit's Delta log store for S3 is compiled once on first use "
            "(install a JDK, or use the bkaudit-spark image, which has it built)"
        )
    classpath = os.pathsep.join([str(_hadoop_api_jar()), str(_delta_storage_jar()), *s3_jars])
    with tempfile.TemporaryDirectory(prefix="bkaudit-logstore-") as tmp:
        done = subprocess.run(
            [
                javac,
                "--release",
                "17",
                "-nowarn",
                "-cp",
                classpath,
                "-d",
                tmp,
                str(LOG_STORE_SOURCE),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise S3SetupError(f"javac failed on {LOG_STORE_SOURCE}: {done.stderr.strip()}")
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = out.with_suffix(f".{os.getpid()}.tmp")
        with zipfile.ZipFile(staging, "w") as jar:
            jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
            for cls in sorted(Path(tmp).rglob("*.class")):
                jar.write(cls, cls.relative_to(tmp).as_posix())
        staging.replace(out)
    log.info("built %s", out)
    return out


def s3a_conf(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The Spark settings of an S3 warehouse: bkaudit's log store, and s3a told what the AWS
    environment says (endpoint with path-style addressing, region), with the AWS SDK's own
    credential chain (environment, profile, web identity, container and instance roles):
    never a key."""
    conf = {key: LOG_STORE_CLASS for key in LOG_STORE_KEYS}
    conf["spark.hadoop.fs.s3a.aws.credentials.provider"] = (
        "software.amazon.awssdk.auth.credentials.DefaultCredentialsProvider"
    )
    endpoint = s3_endpoint(environ)
    if endpoint:
        conf["spark.hadoop.fs.s3a.endpoint"] = endpoint
        conf["spark.hadoop.fs.s3a.path.style.access"] = "true"
        conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(
            endpoint.lower().startswith("https://")
        ).lower()
    region = s3_region(environ)
    if region:
        conf["spark.hadoop.fs.s3a.endpoint.region"] = region
    return conf


def check_log_store(conf: Mapping[str, str]) -> None:
    """Raise :class:`UnsafeLogStore` unless ``conf`` commits s3a:// paths through
    :data:`LOG_STORE_CLASS`."""
    for key in (*LOG_STORE_KEYS, _GLOBAL_LOG_STORE):
        value = conf.get(key)
        if value is not None and value != LOG_STORE_CLASS:
            raise UnsafeLogStore(
                f"Spark's {key} is {value}: on an S3 warehouse that log store can lose another "
                f"writer's commit; bkaudit commits through {LOG_STORE_CLASS} (remove the "
                "setting; docs/tables.md, Object storage)"
            )
    if conf.get(LOG_STORE_KEYS[0]) != LOG_STORE_CLASS:
        raise UnsafeLogStore(
            f"Spark's {LOG_STORE_KEYS[0]} is not set to {LOG_STORE_CLASS}: Delta's default "
            "S3 log store can lose another writer's commit (give the setting and the jars "
            "of python -m jobs.spark.s3 to spark-submit; docs/tables.md, Object storage)"
        )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m jobs.spark.s3``: fetch the s3a jars and build the log store; prints the
    jars, comma-separated (for ``spark-submit --jars``)."""
    argparse.ArgumentParser(
        description="Fetch the s3a jars, build bkaudit's log store."
    ).parse_args(argv)
    try:
        jars = s3_jars()
    except S3SetupError as exc:
        print(f"bkaudit: {exc}", file=sys.stderr)
        return 1
    print(",".join(jars))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
