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

The per-run tables (ledgers, bookies, underreplicated_fragments, replication_actions) are
partitioned by ``run_date``, the UTC day the run started, and carry ``run_id`` as a column:
readers filter by run_id and Delta's per-file statistics skip the other runs' files. Every
table is created with the retention properties and the schema version of
:mod:`jobs.tables.schema`, exactly as delta-rs creates it (docs/tables.md); a table whose
schema version is newer than this code's is refused with
:class:`jobs.tables.delta.SchemaVersionError`.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import date
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from bklib.states import RunStatus
from jobs.spark.schema import ACTIONS_SCHEMA, ACTIONS_TABLE_SCHEMA, AUDIT_RUNS_SCHEMA, spark_schema
from jobs.spark.transform import carry_first_detected
from jobs.tables import delta as delta_rs
from jobs.tables.delta import check_schema_version
from jobs.tables.object_store import is_s3, spark_uri
from jobs.tables.runs import RunRecord
from jobs.tables.schema import (
    ACTIONS,
    AUDIT_RUNS,
    BOOKIES,
    FRAGMENTS,
    LEDGERS,
    PARTITION_BY,
    RUN_DATE,
    SCHEMA_VERSION,
    SCHEMA_VERSION_KEY,
    TABLE_PROPERTIES,
    TABLE_SCHEMAS,
    run_day,
    run_day_from_id,
    storage_schema,
    utc_today,
)

log = logging.getLogger(__name__)

COMMIT_RETRIES = 6

# Delta's errors when another writer committed first (they arrive as Py4J errors): appends
# never conflict on data, so each is retried against the new snapshot.
_RETRYABLE = (
    "Concurrent",
    "DELTA_PROTOCOL_CHANGED",
    "DELTA_METADATA_CHANGED",
    "MetadataChanged",
)


def table_path(warehouse: str, name: str) -> str:
    """Where table ``name`` lives under the warehouse directory or URI, as Spark names it
    (``s3a://`` for S3)."""
    return spark_uri(f"{warehouse.rstrip('/')}/{name}")


def _delta_rs_reaches(path: str) -> bool:
    """True where delta-rs reads and creates tables with the settings Spark has: a local
    directory, or S3 (both configured from the AWS environment, :mod:`jobs.tables.object_store`)."""
    return delta_rs.is_local(path) or is_s3(path)


def table_exists(spark: SparkSession, warehouse: str, name: str) -> bool:
    """True if a Delta table is at ``warehouse/name``."""
    path = table_path(warehouse, name)
    if _delta_rs_reaches(path):
        from jobs.tables import delta

        return delta.table_exists(warehouse, name)
    from delta.tables import DeltaTable

    return bool(DeltaTable.isDeltaTable(spark, path))


def table_layout(
    spark: SparkSession, warehouse: str, name: str
) -> tuple[dict[str, str], list[str]]:
    """A table's properties and partition columns, from its Delta log. Refuses a schema
    version newer than this code's (:class:`~jobs.tables.delta.SchemaVersionError`).

    A local table's log is read through delta-rs (milliseconds; Spark's DESCRIBE DETAIL
    costs a job, and its first call in a JVM seconds); a URI through Spark, whose file
    system configuration (s3a credentials, ...) delta-rs does not share."""
    path = table_path(warehouse, name)
    if _delta_rs_reaches(path):
        from jobs.tables import delta

        info = delta.table_info(warehouse, name)
        if info is not None:
            return info.properties, info.partition_columns
    from delta.tables import DeltaTable

    detail = DeltaTable.forPath(spark, path).detail().select("properties", "partitionColumns")
    row = detail.first()
    properties = dict(row["properties"] or {}) if row is not None else {}
    partitions = list(row["partitionColumns"] or []) if row is not None else []
    check_schema_version(properties, path)
    return properties, partitions


def read_table(spark: SparkSession, warehouse: str, name: str) -> DataFrame:
    """The Delta table ``name`` (raises if it does not exist, or if a newer bkaudit wrote it:
    :class:`~jobs.tables.delta.SchemaVersionError`)."""
    table_layout(spark, warehouse, name)
    return spark.read.format("delta").load(table_path(warehouse, name))


def check_writable(spark: SparkSession, warehouse: str, names: Iterable[str]) -> None:
    """Raise :class:`~jobs.tables.delta.SchemaVersionError` before any work if an existing
    table among ``names`` was written by a newer bkaudit."""
    for name in names:
        if table_exists(spark, warehouse, name):
            table_layout(spark, warehouse, name)


_warned_legacy: set[str] = set()
_warned_lock = threading.Lock()


def ensure_table(spark: SparkSession, warehouse: str, name: str) -> list[str]:
    """Create table ``name`` if it does not exist, as delta-rs does (schema, ``run_date``
    partitioning, retention properties; the schema version in the same commit here), and
    return its partition columns. A version-1 table (partitioned by run_id) is appended to in
    its own layout until ``bkaudit maintain --migrate``, with a warning once per process."""
    from delta.tables import DeltaTable

    from jobs.tables import delta

    path = table_path(warehouse, name)
    if _delta_rs_reaches(path):
        # A local table is created through delta-rs: the same commit either writer makes, in
        # milliseconds, and safe against a creation race or a creator killed halfway.
        if not delta.table_exists(warehouse, name):
            delta.create_table(warehouse, name)
    elif not table_exists(spark, warehouse, name):
        builder = (
            DeltaTable.createIfNotExists(spark)
            .location(path)
            .addColumns(spark_schema(storage_schema(TABLE_SCHEMAS[name])))
        )
        if PARTITION_BY[name]:
            builder = builder.partitionedBy(*PARTITION_BY[name])
        for key, value in {**TABLE_PROPERTIES, SCHEMA_VERSION_KEY: str(SCHEMA_VERSION)}.items():
            builder = builder.property(key, value)
        try:
            builder.execute()
        except Exception:  # a writer of either kind created it meanwhile: use theirs
            if not table_exists(spark, warehouse, name):
                raise
    _, partitions = table_layout(spark, warehouse, name)
    if partitions != PARTITION_BY[name]:
        with _warned_lock:
            first = path not in _warned_legacy
            _warned_legacy.add(path)
        if first:
            log.warning(
                "Delta table %s is partitioned by %s (schema version 1); appending in that "
                "layout. Relay it out by run_date with `bkaudit maintain --warehouse %s "
                "--migrate`",
                path,
                ", ".join(partitions) or "nothing",
                warehouse,
            )
    return partitions


def _with_retries(name: str, write: Callable[[], None]) -> None:
    """Run ``write``, again when another writer won the Delta commit race."""
    for attempt in range(COMMIT_RETRIES):
        try:
            write()
            return
        except Exception as exc:  # Delta's concurrent-commit errors arrive as Py4J errors
            if attempt + 1 == COMMIT_RETRIES or not any(k in str(exc) for k in _RETRYABLE):
                raise
            log.warning("%s: commit race (%s), retrying", name, type(exc).__name__)
            time.sleep(0.5 * (attempt + 1))


def _append(df: DataFrame, warehouse: str, name: str) -> None:
    """Append ``df`` to table ``name`` in the table's own partitioning (created first if
    needed), merging new columns into the schema."""

    def write() -> None:
        ensure_table(df.sparkSession, warehouse, name)
        # No partitionBy: Delta appends in the table's partitioning, whichever it is.
        df.write.format("delta").mode("append").option("mergeSchema", "true").save(
            table_path(warehouse, name)
        )

    _with_retries(name, write)


def action_run_dates(rows: Iterable[Mapping[str, Any]]) -> dict[str, date]:
    """Each repair run's day: the UTC day of its earliest action among ``rows`` (the rule
    :func:`jobs.tables.delta.with_run_date` applies on delta-rs's side)."""
    first: dict[str, Any] = {}
    for r in rows:
        rid, t = r["run_id"], r["started_at"]
        if t is not None and (rid not in first or t < first[rid]):
            first[rid] = t
    return {rid: run_day(t) for rid, t in first.items()}


def append_actions(spark: SparkSession, warehouse: str, rows: list[tuple[Any, ...]]) -> None:
    """Append rows (in :data:`ACTIONS_SCHEMA` order) to ``replication_actions``, each with
    its run's ``run_date``.

    Two repair jobs may finish at once: the table is created ahead of the append, and an
    append that loses a Delta commit race is retried (appends never conflict on data).
    """
    names = ACTIONS_SCHEMA.fieldNames()
    dicts = [dict(zip(names, r, strict=True)) for r in rows]
    days = action_run_dates(dicts)
    full = [
        (*r, days.get(d["run_id"]) or run_day_from_id(d["run_id"]) or utc_today())
        for r, d in zip(rows, dicts, strict=True)
    ]
    df = spark.createDataFrame(full, ACTIONS_TABLE_SCHEMA)
    _append(df, warehouse, ACTIONS)


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
    """The fragments of the latest completed run, for carrying ``first_detected_at`` over.

    A local warehouse is read through delta-rs (two Spark jobs cost seconds; the previous
    run's first detections are one small row per finding)."""
    path = table_path(warehouse, FRAGMENTS)
    if _delta_rs_reaches(path):
        from jobs.tables import delta

        first = delta.first_detections(warehouse)
        if not first:
            return None
        rows = [(lid, seg, bookie, t) for (lid, seg, bookie), t in first.items()]
        return spark.createDataFrame(rows, _FIRST_DETECTED_SCHEMA)
    prev = latest_run(spark, warehouse)
    if prev is None or not table_exists(spark, warehouse, FRAGMENTS):
        return None
    return read_table(spark, warehouse, FRAGMENTS).filter(F.col("run_id") == prev["run_id"])


_FIRST_DETECTED_SCHEMA = (
    "ledger_id long, segment_first_entry_id long, bookie_id string, first_detected_at timestamp"
)


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
    day = F.lit(run_day(run.started_at)).alias(RUN_DATE)  # the run's day: its partition
    detected = F.lit(run.started_at).cast("timestamp")
    final = carry_first_detected(
        fragments, previous_fragments(spark, warehouse), run.started_at
    ).select(
        run_col.alias("run_id"),
        F.lit(run.check).alias("check"),
        detected.alias("detected_at"),
        "*",
        day,
    )
    tables = (
        (FRAGMENTS, final),
        (LEDGERS, ledgers.drop("password").select(run_col.alias("run_id"), "*", day)),
        (BOOKIES, bookies.select(run_col.alias("run_id"), "*", day)),
    )
    # Three independent tables: their Delta commits run side by side (a small run's load is
    # mostly driver-side commit latency), and audit_runs, which makes the run visible, only
    # once all three are in.
    with concurrent.futures.ThreadPoolExecutor(3, thread_name_prefix="delta") as pool:
        writes = [pool.submit(_append, df, warehouse, name) for name, df in tables]
        for w in writes:
            w.result()
    write_run_record(spark, warehouse, run)
    return read_table(spark, warehouse, FRAGMENTS).filter(F.col("run_id") == run.run_id)


def write_run_record(spark: SparkSession, warehouse: str, run: RunRecord) -> None:
    """Append the ``audit_runs`` row (also used to record a failed run)."""
    r = run.as_row()
    row = tuple(r[f.name] for f in AUDIT_RUNS_SCHEMA.fields)
    _append(spark.createDataFrame([row], AUDIT_RUNS_SCHEMA), warehouse, AUDIT_RUNS)


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
