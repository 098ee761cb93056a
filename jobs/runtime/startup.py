"""What a command checks before it touches the cluster: its executor's prerequisites and its
warehouse. A missing pyspark or Java, a warehouse that is a file, read-only or unreachable,
each is one line at once, not after a connection attempt or a whole scan
(docs/operations.md, "Wrong addresses").
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
from typing import TYPE_CHECKING, Any

from bklib.errors import BKError
from bklib.states import Executor

if TYPE_CHECKING:
    from bklib.meta.stores import MetadataStore

__all__ = ["StartupError", "check_before_connecting", "java_found", "open_command_store"]


class StartupError(BKError):
    """A command cannot start: one line naming what is missing (exit 2)."""


def java_found() -> str | None:
    """The ``java`` Spark would start: ``$JAVA_HOME/bin/java``, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "java"), os.X_OK):
        return os.path.join(home, "bin", "java")
    return shutil.which("java")


def _check_spark() -> None:
    from jobs.runs.executor import spark_installed
    from jobs.runtime.messages import one_line

    if not spark_installed():
        missing = ModuleNotFoundError("No module named 'pyspark'", name="pyspark")
        raise StartupError(one_line(missing))
    if java_found() is None:
        raise StartupError(
            "--executor spark needs a Java runtime (Java 17+), and there is none: no java "
            "in $JAVA_HOME/bin nor on PATH"
        )


def _check_spark_on_s3(warehouse: str, master: str | None) -> None:
    """On an S3 warehouse, Spark's log store must be bkaudit's and its jars at hand (fetched
    and built here, before the cluster is read: :mod:`jobs.spark.s3`)."""
    from jobs.tables.object_store import is_s3

    if not is_s3(warehouse):
        return
    from jobs.spark.s3 import S3SetupError, UnsafeLogStore, check_log_store
    from jobs.spark.session import spark_conf, under_spark_submit

    try:
        spark_conf(master, None, warehouse)
        if under_spark_submit():
            # spark-submit's --conf and properties file are in the JVM already: ask it.
            from pyspark import SparkConf, SparkContext

            SparkContext._ensure_initialized()
            check_log_store(dict(SparkConf().getAll()))
    except (UnsafeLogStore, S3SetupError) as exc:
        raise StartupError(str(exc)) from None


def check_before_connecting(args: argparse.Namespace, spark: Any = None) -> None:
    """Raise :class:`StartupError` if ``--executor spark`` cannot start (no pyspark, no Java;
    not asked when the caller hands in its ``spark`` session) or ``--warehouse`` cannot be
    written or reached (:func:`jobs.tables.delta.check_writable`, the warehouse only: each
    executor checks its tables' protocols itself)."""
    warehouse = getattr(args, "warehouse", None)
    if getattr(args, "executor", None) == Executor.SPARK and spark is None:
        _check_spark()
        if warehouse:
            _check_spark_on_s3(str(warehouse), getattr(args, "master", None))
    if warehouse:
        # delta.check_writable(warehouse, ()) without importing pyarrow: a failing start is
        # said in about a second.
        from jobs.tables.warehouse_probe import WarehouseUnusable, probe_warehouse

        try:
            probe_warehouse(str(warehouse))
        except WarehouseUnusable as exc:
            raise StartupError(str(exc)) from None


def open_command_store(
    command: str,
    args: argparse.Namespace,
    *,
    spark: Any = None,
    writes: bool = False,
    **store_options: Any,
) -> MetadataStore | None:
    """The command's one store session, opened where the command starts and handed down to
    all its work; None after one line on stderr saying why it could not be opened (the caller
    exits 2: nothing was read). A command that ``writes`` tables has its executor and warehouse
    checked first (:func:`check_before_connecting`); one that only reads them does not, so a
    read-only warehouse stays readable."""
    from bklib.meta.stores import open_store
    from jobs.runtime.messages import one_line

    try:
        if writes:
            check_before_connecting(args, spark)
        return open_store(args.zk, auth=args.zk_auth, **store_options)
    except Exception as exc:  # unreachable, refused, a warehouse refused: the operator's to fix
        logging.getLogger(f"jobs.commands.{command}").debug(
            "%s could not connect", command, exc_info=True
        )
        print(f"{command}: {one_line(exc)}", file=sys.stderr)
        return None
