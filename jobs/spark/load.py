"""Load: append one audit run to the Delta tables under ``--warehouse`` and read them back.

Tables (each keeps ``run_id``; new columns merge into the schema):

* ``audit_runs``: run_id, started_at, finished_at, zk, check, status, counts (map), error.
  Written last, so a run is visible to readers only once all its rows are in.
* ``ledgers``: one row per ledger znode, metadata errors included (``error`` names it).
* ``bookies``: bookie_id, state (writable / readonly / lost), host, port.
* ``underreplicated_fragments``: see :data:`jobs.tables.schema.FRAGMENT_SCHEMA`, plus
  run_id, check, detected_at and first_detected_at.

* ``replication_actions``: see :data:`ACTIONS_SCHEMA`; one row per action of a
  ``rereplicate`` / ``recover`` / ``decommission`` run.

The per-run tables are partitioned by run_id, so reading one run touches one directory.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from bklib.states import RunStatus
from jobs.spark.schema import ACTIONS_SCHEMA, AUDIT_RUNS_SCHEMA
from jobs.spark.transform import carry_first_detected
from jobs.tables.runs import RunRecord
from jobs.tables.schema import ACTIONS, AUDIT_RUNS, BOOKIES, FRAGMENTS, LEDGERS

log = logging.getLogger(__name__)


def table_path(warehouse: str, name: str) -> str:
    """Where table ``name`` lives under the warehouse directory or URI."""
    return f"{warehouse.rstrip('/')}/{name}"


def table_exists(spark: SparkSession, warehouse: str, name: str) -> bool:
    """True if a Delta table is at ``warehouse/name``."""
    path = table_path(warehouse, name)
    if "://" not in path:
        return os.path.isdir(os.path.join(path, "_delta_log"))
    from delta.tables import DeltaTable

    return bool(DeltaTable.isDeltaTable(spark, path))


def read_table(spark: SparkSession, warehouse: str, name: str) -> DataFrame:
    """The Delta table ``name`` (raises if it does not exist)."""
    return spark.read.format("delta").load(table_path(warehouse, name))


def _append(df: DataFrame, warehouse: str, name: str, partition: bool = True) -> None:
    writer = df.write.format("delta").mode("append").option("mergeSchema", "true")
    if partition:
        writer = writer.partitionBy("run_id")
    writer.save(table_path(warehouse, name))


def append_actions(spark: SparkSession, warehouse: str, rows: list[tuple[Any, ...]]) -> None:
    """Append rows (in :data:`ACTIONS_SCHEMA` order) to ``replication_actions``.

    Two repair jobs may finish at once: the table is created ahead of the append, and an
    append that loses a Delta commit race is retried (appends never conflict on data).
    """
    path = table_path(warehouse, ACTIONS)
    df = spark.createDataFrame(rows, ACTIONS_SCHEMA)
    for attempt in range(5):
        try:
            if not table_exists(spark, warehouse, ACTIONS):
                from delta.tables import DeltaTable

                (
                    DeltaTable.createIfNotExists(spark)
                    .location(path)
                    .addColumns(ACTIONS_SCHEMA)
                    .partitionedBy("mode")
                    .execute()
                )
            df.write.format("delta").mode("append").option("mergeSchema", "true").save(path)
            return
        except Exception as exc:  # Delta's concurrent-commit errors arrive as Py4J errors
            if "Concurrent" not in str(exc) and "DELTA_PROTOCOL_CHANGED" not in str(exc):
                raise
            log.warning("replication_actions: commit race (%s), retrying", type(exc).__name__)
            time.sleep(0.5 * (attempt + 1))
    df.write.format("delta").mode("append").option("mergeSchema", "true").save(path)


def latest_run(
    spark: SparkSession, warehouse: str, run_id: str | None = None
) -> dict[str, Any] | None:
    """The latest completed run (or run ``run_id``) from ``audit_runs`` as a dict, or None."""
    if not table_exists(spark, warehouse, AUDIT_RUNS):
        return None
    runs = read_table(spark, warehouse, AUDIT_RUNS)
    if run_id is not None:
        runs = runs.filter(F.col("run_id") == run_id)
    else:
        runs = runs.filter(F.col("status").isin(*RunStatus.FINISHED))
    row = runs.orderBy(F.col("finished_at").desc_nulls_last(), F.col("started_at").desc()).first()
    return row.asDict(recursive=True) if row is not None else None


def previous_fragments(spark: SparkSession, warehouse: str) -> DataFrame | None:
    """The fragments of the latest completed run, for carrying ``first_detected_at`` over."""
    prev = latest_run(spark, warehouse)
    if prev is None or not table_exists(spark, warehouse, FRAGMENTS):
        return None
    return read_table(spark, warehouse, FRAGMENTS).filter(F.col("run_id") == prev["run_id"])


def write_run(
    spark: SparkSession,
    warehouse: str,
    run: RunRecord,
    *,
    ledgers: DataFrame,
    bookies: DataFrame,
    fragments: DataFrame,
) -> DataFrame:
    """Append one run: ledgers, bookies and fragments (with first_detected_at carried over
    from the previous completed run), then the ``audit_runs`` row. Returns the fragments
    as written."""
    run_col = F.lit(run.run_id)
    detected = F.lit(run.started_at).cast("timestamp")
    final = carry_first_detected(
        fragments, previous_fragments(spark, warehouse), run.started_at
    ).select(
        run_col.alias("run_id"),
        F.lit(run.check).alias("check"),
        detected.alias("detected_at"),
        "*",
    )
    _append(final, warehouse, FRAGMENTS)
    _append(
        ledgers.drop("password").select(run_col.alias("run_id"), "*"),  # secrets stay out
        warehouse,
        LEDGERS,
    )
    _append(bookies.select(run_col.alias("run_id"), "*"), warehouse, BOOKIES)
    write_run_record(spark, warehouse, run)
    return read_table(spark, warehouse, FRAGMENTS).filter(F.col("run_id") == run.run_id)


def write_run_record(spark: SparkSession, warehouse: str, run: RunRecord) -> None:
    """Append the ``audit_runs`` row (also used to record a failed run)."""
    r = run.as_row()
    row = tuple(r[f.name] for f in AUDIT_RUNS_SCHEMA.fields)
    _append(spark.createDataFrame([row], AUDIT_RUNS_SCHEMA), warehouse, AUDIT_RUNS, False)


def run_fragments(
    spark: SparkSession, warehouse: str, run_id: str, filters: Mapping[str, str] | None = None
) -> DataFrame:
    """The fragments of one run, optionally filtered by column equality."""
    df = read_table(spark, warehouse, FRAGMENTS).filter(F.col("run_id") == run_id)
    for col, value in (filters or {}).items():
        df = df.filter(F.col(col) == value)
    return df


def run_metadata_errors(spark: SparkSession, warehouse: str, run_id: str) -> DataFrame:
    """Ledger znodes that could not be read in one run: ledger_id, znode_path, error."""
    return (
        read_table(spark, warehouse, LEDGERS)
        .filter((F.col("run_id") == run_id) & F.col("error").isNotNull())
        .select("ledger_id", "znode_path", "error")
    )
