"""The Delta Lake jars a Spark session needs, pinned, for machines without Maven access.

A checkout resolves ``io.delta:delta-spark`` through Ivy the first time (Spark's
``spark.jars.packages``). An image cannot: Kubernetes nodes often have no route to Maven
Central. The ``bkaudit-spark`` image therefore fetches these jars at build time
(``python -m jobs.spark.jars DIR``, checked against their SHA-256) and names the directory in
``$BKAUDIT_SPARK_JARS``; :func:`jobs.spark.session.spark_conf` then passes them as
``spark.jars`` and Ivy is never asked.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from bklib.maven import Artifact, FetchError, fetch_artifacts, is_complete

DELTA_PACKAGE = "io.delta:delta-spark_2.13:4.0.1"
"""Delta Lake release matching pyspark 4.0 (Scala 2.13)."""

JARS_ENV = "BKAUDIT_SPARK_JARS"
"""A directory :func:`fetch_delta_jars` filled: its jars are used instead of resolving
:data:`DELTA_PACKAGE`."""

# delta-spark's runtime classpath beyond Spark's own jars (what Ivy resolves for the package).
DELTA_JARS: tuple[Artifact, ...] = (
    Artifact(
        "io.delta",
        "delta-spark_2.13",
        "4.0.1",
        "",
        "a1e76860b19fe1e6b205a4ea7a9099a2f9575d39bb71d49b3e679b299d0efb91",
    ),
    Artifact(
        "io.delta",
        "delta-storage",
        "4.0.1",
        "",
        "ecc42c5aaa51c423312d9e4e48aa4a12b34740bf2c37de0e8f279277ec3d12e4",
    ),
    Artifact(
        "org.antlr",
        "antlr4-runtime",
        "4.13.1",
        "",
        "54665d2838cc66458343468efc539e454fc95b46a8a04b13c6ac43fc9be63505",
    ),
)


class NoBundledJars(RuntimeError):
    """``$BKAUDIT_SPARK_JARS`` is not set or does not hold the pinned Delta jars."""


def bundled_jars() -> list[str] | None:
    """The Delta jars of ``$BKAUDIT_SPARK_JARS`` when it is set and complete, else None."""
    where = os.environ.get(JARS_ENV)
    if not where or not is_complete(Path(where), DELTA_JARS):
        return None
    return [str(Path(where) / a.filename) for a in DELTA_JARS]


def fetch_delta_jars(dest: Path) -> Path:
    """Fill ``dest`` with :data:`DELTA_JARS` (:func:`bklib.maven.fetch_artifacts`)."""
    return fetch_artifacts(DELTA_JARS, dest)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m jobs.spark.jars DIR``: fetch the pinned Delta jars into DIR (the image's
    ``SPARK_CONF_DIR`` is written by ``python -m jobs.spark.defaults``)."""
    parser = argparse.ArgumentParser(description="Fetch the pinned Delta Lake jars.")
    parser.add_argument("dest", type=Path)
    args = parser.parse_args(argv)
    try:
        fetch_delta_jars(args.dest)
    except FetchError as exc:
        print(f"jars: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
