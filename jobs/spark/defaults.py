"""Spark's settings files: ``conf/spark-defaults.conf`` read, and a ``SPARK_CONF_DIR`` written
for ``spark-submit``.

:func:`jobs.spark.session.spark_conf` starts from the defaults file; the Spark image writes
its ``SPARK_CONF_DIR`` with :func:`write_bundled_submit_conf` (``python -m
jobs.spark.defaults DEST``), naming the Delta jars it bundles (:mod:`jobs.spark.jars`) instead
of the Maven package, and the s3a ones (:mod:`jobs.spark.s3`).
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = [
    "CONF_DIR",
    "DEFAULTS_FILE",
    "LOG4J_FILE",
    "REQUIRED_CONF",
    "read_spark_defaults",
    "write_submit_conf",
]

# conf/spark-defaults.conf and conf/log4j2.properties, through the package's links to them.
CONF_DIR = Path(__file__).parent
DEFAULTS_FILE = CONF_DIR / "spark-defaults.conf"
LOG4J_FILE = CONF_DIR / "log4j2.properties"


REQUIRED_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}
"""Settings every session has, whatever the defaults file says: Delta Lake's catalog."""


def read_spark_defaults(path: Path = DEFAULTS_FILE) -> dict[str, str]:
    """Parse a ``spark-defaults.conf`` file: ``key value`` per line, ``#`` comments."""
    conf: dict[str, str] = {}
    if not path.exists():
        return conf
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition(" ")
        if not value:
            key, _, value = line.partition("\t")
        conf[key.strip()] = value.strip()
    return conf


def write_submit_conf(
    dest: Path, jars: Sequence[str], extra: Mapping[str, str] | None = None
) -> Path:
    """Write a ``SPARK_CONF_DIR`` for ``spark-submit`` without Maven access (the Spark image;
    the chart's Spark audit Job): ``conf/spark-defaults.conf`` with ``jars`` (the bundled
    Delta jars, :func:`jobs.spark.jars.bundled_jars`, and the s3a ones when bundled) in place
    of the package to resolve, ``extra`` settings (the S3 log store), and
    ``conf/log4j2.properties``. Returns ``dest``."""
    conf = read_spark_defaults()
    conf.pop("spark.jars.packages", None)
    conf.update(REQUIRED_CONF)
    conf["spark.jars"] = ",".join(jars)
    conf.update(extra or {})
    dest.mkdir(parents=True, exist_ok=True)
    lines = [f"{key} {value}\n" for key, value in conf.items()]
    text = "# Written by jobs.spark.defaults.write_submit_conf: conf/spark-defaults.conf, with\n"
    text += "# the Delta jars bundled in the image instead of resolved from Maven.\n"
    (dest / "spark-defaults.conf").write_text(text + "".join(lines))
    shutil.copyfile(LOG4J_FILE, dest / "log4j2.properties")
    return dest


def write_bundled_submit_conf(dest: Path) -> Path:
    """A ``SPARK_CONF_DIR`` at ``dest`` naming the jars of ``$BKAUDIT_SPARK_JARS``, and the
    s3a jars with bkaudit's S3 log store when they were built (:mod:`jobs.spark.s3`); raises
    :class:`~jobs.spark.jars.NoBundledJars`."""
    from jobs.spark.jars import NoBundledJars, bundled_jars
    from jobs.spark.s3 import LOG_STORE_CLASS, LOG_STORE_KEYS, S3SetupError, s3_jars

    jars = bundled_jars()
    if jars is None:
        raise NoBundledJars(
            "set $BKAUDIT_SPARK_JARS to a directory `python -m jobs.spark.jars` filled"
        )
    extra: dict[str, str] = {}
    try:
        jars = [*jars, *s3_jars(fetch=False)]
        extra = {key: LOG_STORE_CLASS for key in LOG_STORE_KEYS}
    except S3SetupError:
        pass
    return write_submit_conf(dest, jars, extra)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m jobs.spark.defaults DEST``: write the image's ``SPARK_CONF_DIR`` into DEST
    (:func:`write_bundled_submit_conf`)."""
    import argparse
    import sys

    from jobs.spark.jars import NoBundledJars

    parser = argparse.ArgumentParser(description="Write a SPARK_CONF_DIR for spark-submit.")
    parser.add_argument("dest", type=Path)
    args = parser.parse_args(argv)
    try:
        write_bundled_submit_conf(args.dest)
    except NoBundledJars as exc:
        print(f"defaults: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
