"""Spark's settings files: ``conf/spark-defaults.conf`` read, and a ``SPARK_CONF_DIR`` written
for ``spark-submit``.

:func:`jobs.spark.session.spark_conf` starts from the defaults file; the Spark image writes
its ``SPARK_CONF_DIR`` with :func:`write_submit_conf` (``python -m jobs.spark.jars
--spark-conf-dir``), naming the Delta jars it bundles (:mod:`jobs.spark.jars`) instead of the
Maven package.
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
