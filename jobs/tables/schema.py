"""The Delta tables' names, schemas, partitioning and table properties: the contract both
executors write and every reader (notebooks, the report, Airflow) relies on (docs/tables.md).

Schemas are Arrow schemas, written once here. The local executor writes them through delta-rs;
the Spark executor derives its StructTypes from them (:mod:`jobs.spark.schema`).
Timestamps are UTC-zoned microseconds, which both Delta writers store as Delta's ``timestamp``
type, so neither side needs the ``timestampNtz`` table feature.
"""

from __future__ import annotations

import re
from datetime import date, datetime, timezone

import pyarrow as pa

__all__ = [
    "ACTIONS",
    "ACTIONS_SCHEMA",
    "ACTIONS_TABLE_SCHEMA",
    "ALL_TABLES",
    "AUDIT_RUNS",
    "AUDIT_RUNS_SCHEMA",
    "BOOKIES",
    "BOOKIES_TABLE_SCHEMA",
    "BOOKIE_ENTRIES_SCHEMA",
    "BOOKIE_SCHEMA",
    "FRAGMENTS",
    "FRAGMENTS_TABLE_SCHEMA",
    "FRAGMENT_SCHEMA",
    "LEDGERS",
    "LEDGERS_TABLE_SCHEMA",
    "LEDGER_SCHEMA",
    "LEGACY_PARTITION_BY",
    "PARTITION_BY",
    "RUN_DATE",
    "SCHEMA_VERSION",
    "SCHEMA_VERSION_KEY",
    "TABLES",
    "TABLE_PROPERTIES",
    "run_day",
    "run_day_from_id",
    "storage_schema",
    "utc_today",
]

AUDIT_RUNS = "audit_runs"
LEDGERS = "ledgers"
BOOKIES = "bookies"
FRAGMENTS = "underreplicated_fragments"
ACTIONS = "replication_actions"
TABLES = (AUDIT_RUNS, LEDGERS, BOOKIES, FRAGMENTS, ACTIONS)

RUN_DATE = "run_date"
"""The partition column of the per-run tables: the UTC day the run started (docs/tables.md)."""

PARTITION_BY: dict[str, list[str]] = {
    AUDIT_RUNS: [],
    LEDGERS: [RUN_DATE],
    BOOKIES: [RUN_DATE],
    FRAGMENTS: [RUN_DATE],
    ACTIONS: [RUN_DATE],
}
"""Partition columns of each table. By day, not by run: an hourly audit makes 24 runs a day but
one partition, which ``bkaudit maintain`` compacts to a few files and drops whole once it is
older than ``--keep``. Readers filter by ``run_id``; each file's min/max statistics of
``run_id`` (always the first column) let both Delta readers skip the other runs' files."""

LEGACY_PARTITION_BY: dict[str, list[str]] = {
    LEDGERS: ["run_id"],
    BOOKIES: ["run_id"],
    FRAGMENTS: ["run_id"],
    ACTIONS: ["mode"],
}
"""Schema version 1's partitioning (before this layout); ``bkaudit maintain --migrate`` relays
such tables out by :data:`RUN_DATE`."""

SCHEMA_VERSION = 2
"""The version of the table layout this code writes. 1: partitioned by run_id (no property);
2: partitioned by run_date, retention properties set. A table with a higher version was
written by a newer bkaudit and is refused (:class:`jobs.tables.delta.SchemaVersionError`)."""

SCHEMA_VERSION_KEY = "bkaudit.schemaVersion"
"""The table property holding :data:`SCHEMA_VERSION`."""

TABLE_PROPERTIES: dict[str, str] = {
    # Commits older than this may be cleaned from _delta_log once a checkpoint covers them:
    # time travel reaches back this far.
    "delta.logRetentionDuration": "interval 30 days",
    # Files a commit removed stay this long before VACUUM may delete them, so a reader or a
    # writer still working from an older snapshot never loses a file under it.
    "delta.deletedFileRetentionDuration": "interval 7 days",
}
"""Retention properties every table gets when created (both writers) or migrated. The
schema version is set too, but apart: delta-rs refuses non-``delta.`` keys at creation."""

_RUN_ID_STAMP = re.compile(r"^(\d{8})T\d{6}Z-[0-9a-f]{8}$")


def _relaxed(t: pa.DataType, nested: bool) -> pa.DataType:
    if pa.types.is_list(t):
        return pa.list_(pa.field(t.value_field.name, _relaxed(t.value_type, True), True))
    if pa.types.is_map(t):
        return pa.map_(t.key_type, pa.field("value", _relaxed(t.item_type, True), True))
    if pa.types.is_struct(t):
        return pa.struct(
            [pa.field(f.name, _relaxed(f.type, nested), f.nullable or nested) for f in t]
        )
    return t


def storage_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` as both writers create the table: every field inside a list or a map
    nullable (delta-spark refuses NOT NULL constraints nested in arrays and maps), top-level
    NOT NULL kept. Rows are still built with ``schema``; appending them loses nothing."""
    return pa.schema([pa.field(f.name, _relaxed(f.type, False), f.nullable) for f in schema])


def run_day(ts: datetime) -> date:
    """The UTC day of ``ts`` (naive timestamps are taken as UTC, as the jobs write them)."""
    if ts.tzinfo is not None:
        ts = ts.astimezone(timezone.utc)
    return ts.date()


def utc_today() -> date:
    """Today's run day: the UTC day, as :func:`run_day` takes every run's (never the machine's
    local day)."""
    return datetime.now(timezone.utc).date()


def run_day_from_id(run_id: str) -> date | None:
    """The day in a run id made by :func:`jobs.tables.runs.new_run_id`
    (``20261123T101500Z-1a2b3c4d``); None for any other id (``--run-id``, Airflow's)."""
    m = _RUN_ID_STAMP.match(run_id)
    if m is None:
        return None
    try:
        return datetime.strptime(m.group(1), "%Y%m%d").date()
    except ValueError:
        return None


TS = pa.timestamp("us", tz="UTC")


def _f(name: str, type_: pa.DataType, nullable: bool = True) -> pa.Field:
    return pa.field(name, type_, nullable=nullable)


RUN = pa.struct([_f("first_entry_id", pa.int64(), False), _f("last_entry_id", pa.int64(), False)])
RUNS = pa.list_(pa.field("element", RUN, nullable=False))

SEGMENT = pa.struct(
    [
        _f("first_entry_id", pa.int64(), False),
        # None for the last segment of a ledger that is not closed: it ends at the LAC.
        _f("last_entry_id", pa.int64()),
        _f("ensemble", pa.list_(pa.field("element", pa.string(), nullable=False)), False),
    ]
)

LEDGER_SCHEMA = pa.schema(
    [
        _f("ledger_id", pa.int64(), False),
        _f("znode_path", pa.string()),
        _f("znode_version", pa.int32()),
        _f("state", pa.string()),
        _f("ensemble_size", pa.int32()),
        _f("write_quorum", pa.int32()),
        _f("ack_quorum", pa.int32()),
        _f("last_entry_id", pa.int64()),
        _f("length", pa.int64()),
        _f("digest_type", pa.string()),
        # Needed to verify HMAC digests in the deep check; never written to a table.
        _f("password", pa.binary()),
        _f("ctime", pa.int64()),
        _f("segments", pa.list_(pa.field("element", SEGMENT, nullable=False))),
        # A znode that could not be read or parsed: the error, naming the znode.
        _f("error", pa.string()),
        # Pulsar's custom metadata (bklib.meta.pulsar): the topic and the component tag.
        _f("topic", pa.string()),
        _f("component", pa.string()),
    ]
)
"""One row per ledger znode (:meth:`bklib.audit.model.LedgerView.as_row`)."""

BOOKIE_SCHEMA = pa.schema(
    [
        _f("bookie_id", pa.string(), False),
        _f("state", pa.string(), False),
        _f("host", pa.string()),
        _f("port", pa.int32()),
        _f("error", pa.string()),
        # The run's capability probe (None: not asked, or no answer): see docs/executors.md.
        _f("list_entries", pa.bool_()),
        _f("batch_read", pa.bool_()),
    ]
)

BOOKIE_ENTRIES_SCHEMA = pa.schema(
    [
        _f("ledger_id", pa.int64(), False),
        _f("bookie_id", pa.string(), False),
        _f("status", pa.string(), False),
        _f("method", pa.string()),
        _f("entries", RUNS),
        _f("bad_entries", RUNS),
        _f("unknown_entries", RUNS),
        _f("lac", pa.int64()),
        _f("error", pa.string()),
    ]
)
"""What one bookie holds of one ledger (:meth:`bklib.audit.model.ReplicaReport.as_row`)."""

FRAGMENT_SCHEMA = pa.schema(
    [
        _f("ledger_id", pa.int64(), False),
        _f("segment_index", pa.int32(), False),
        _f("segment_first_entry_id", pa.int64(), False),
        # None when unknown: the open last segment in a metadata-only check.
        _f("segment_last_entry_id", pa.int64()),
        _f("bookie_index", pa.int32(), False),
        _f("bookie_id", pa.string(), False),
        _f("reason", pa.string(), False),
        _f("expected_entries", pa.int64()),
        _f("missing_entries", pa.int64()),
        _f("missing_ranges", RUNS),
        _f("missing_ranges_truncated", pa.bool_()),
        _f("unknown_entries", pa.int64()),
        _f("min_replicas", pa.int32()),
        _f("severity", pa.string()),
        _f("ledger_state", pa.string()),
        _f("ensemble_size", pa.int32()),
        _f("write_quorum", pa.int32()),
        _f("ack_quorum", pa.int32()),
        _f("error", pa.string()),
        _f("topic", pa.string()),
        _f("component", pa.string()),
    ]
)
"""One under-replicated fragment (:meth:`bklib.audit.model.Finding.as_row`)."""

RUN_ID = _f("run_id", pa.string(), False)
# Last, where Hive puts partition columns; also where schema merging puts it in a table written
# before it existed. Nullable so that merge can add it to such a table; writers always set it.
RUN_DATE_FIELD = _f(RUN_DATE, pa.date32())

LEDGERS_TABLE_SCHEMA = pa.schema(
    [RUN_ID, *(f for f in LEDGER_SCHEMA if f.name != "password"), RUN_DATE_FIELD]  # no secrets
)
BOOKIES_TABLE_SCHEMA = pa.schema([RUN_ID, *BOOKIE_SCHEMA, RUN_DATE_FIELD])
FRAGMENTS_TABLE_SCHEMA = pa.schema(
    [
        RUN_ID,
        _f("check", pa.string()),
        _f("detected_at", TS),
        *FRAGMENT_SCHEMA,
        _f("first_detected_at", TS),
        RUN_DATE_FIELD,
    ]
)

AUDIT_RUNS_SCHEMA = pa.schema(
    [
        RUN_ID,
        _f("started_at", TS, False),
        _f("finished_at", TS),
        _f("zk", pa.string()),
        _f("check", pa.string()),
        _f("status", pa.string(), False),
        _f("counts", pa.map_(pa.string(), pa.int64())),
        _f("error", pa.string()),
        # spark or local: where the engine ran.
        _f("executor", pa.string()),
    ]
)

ACTIONS_SCHEMA = pa.schema(
    [
        RUN_ID,
        _f("mode", pa.string(), False),  # rereplicate / recover / decommission
        _f("audit_run_id", pa.string()),
        _f("ledger_id", pa.int64(), False),
        _f("segment_first_entry_id", pa.int64()),
        _f("segment_last_entry_id", pa.int64()),
        _f("old_bookie", pa.string()),
        _f("new_bookie", pa.string()),
        _f("action", pa.string(), False),
        _f("entries_copied", pa.int64(), False),
        _f("bytes_copied", pa.int64(), False),
        _f("no_replica_entries", pa.list_(pa.int64())),
        _f("status", pa.string(), False),
        _f("error", pa.string()),
        _f("started_at", TS, False),
        _f("finished_at", TS),
        _f("executor", pa.string()),
        # UNLOAD_TOPIC: the Pulsar topic unloaded (None for every other action).
        _f("topic", pa.string()),
    ]
)
"""One repair action as the repair jobs build it (run_id, mode, audit_run_id stamped on)."""

ACTIONS_TABLE_SCHEMA = pa.schema([*ACTIONS_SCHEMA, RUN_DATE_FIELD])
"""``replication_actions`` as stored: the writers add :data:`RUN_DATE` (the day of the run's
first action in the append)."""

TABLE_SCHEMAS: dict[str, pa.Schema] = {
    AUDIT_RUNS: AUDIT_RUNS_SCHEMA,
    LEDGERS: LEDGERS_TABLE_SCHEMA,
    BOOKIES: BOOKIES_TABLE_SCHEMA,
    FRAGMENTS: FRAGMENTS_TABLE_SCHEMA,
    ACTIONS: ACTIONS_TABLE_SCHEMA,
}

RUN_TIME_COLUMN: dict[str, str] = {FRAGMENTS: "detected_at", ACTIONS: "started_at"}
"""A per-run table's column whose day is the run's day when a row does not say (detected_at is
the audit run's start)."""

# ---- what-if and triage tables (not part of an audit run: TABLES stays the audit's) -----------

BLAST_RADIUS = "blast_radius"
TRIAGE = "triage"

BLAST_RADIUS_SCHEMA = pa.schema(
    [
        RUN_ID,
        _f("computed_at", TS, False),
        # The audit whose missing replicas counted as gone (None: metadata only).
        _f("audit_run_id", pa.string()),
        _f("scope", pa.string(), False),  # bookie / rack
        _f("name", pa.string(), False),
        _f("bookies", pa.int32()),
        _f("ledgers", pa.int64()),
        _f("ledgers_below_aq", pa.int64()),
        _f("ledgers_lost", pa.int64()),
        _f("entries_below_aq", pa.int64()),
        _f("entries_lost", pa.int64()),
        # Open ledgers below AQ whose last segment's entry count only the bookies know.
        _f("ledgers_entries_unknown", pa.int64()),
        _f("writers_blocked", pa.int64()),
        _f("topics", pa.list_(pa.field("element", pa.string(), nullable=False))),
        _f("topics_lost", pa.list_(pa.field("element", pa.string(), nullable=False))),
        _f("executor", pa.string()),
    ]
)
"""One bookie's or rack's blast radius (:class:`bklib.audit.blast_radius.ScopeImpact`)."""

TRIAGE_SCHEMA = pa.schema(
    [
        RUN_ID,
        _f("triaged_at", TS, False),
        _f("audit_run_id", pa.string()),
        _f("ledger_id", pa.int64(), False),
        _f("class", pa.string(), False),  # bklib.states.TriageClass
        _f("detail", pa.string()),
        _f("topic", pa.string()),
        _f("component", pa.string()),
        _f("ledger_state", pa.string()),
        _f("ensemble_size", pa.int32()),
        _f("write_quorum", pa.int32()),
        _f("ack_quorum", pa.int32()),
        _f("lost_entries", pa.int64()),
        _f("lost_ranges", RUNS),
        _f("lost_ranges_truncated", pa.bool_()),
        _f("ctime", TS),
        _f("age_seconds", pa.int64()),
        _f("first_detected_at", TS),
        _f("repair_status", pa.string()),
        # A Pulsar data ledger: its lost messages as ids (L:E, L:A..L:B), and the publish
        # times of the surviving entries just before and after them (None: unknown).
        _f("lost_message_ids", pa.string()),
        _f("lost_published_after", TS),
        _f("lost_published_before", TS),
    ]
)
"""One unrecoverable ledger and why (:func:`bklib.audit.triage.triage_ledger`)."""

# ---- the Pulsar cross-check (audit --check pulsar; docs/pulsar.md) ----------------------------

PULSAR_CHECKS = "pulsar_checks"
PULSAR_REFERENCES = "pulsar_references"

PULSAR_CHECKS_SCHEMA = pa.schema(
    [
        RUN_ID,
        _f("started_at", TS, False),
        _f("finished_at", TS),
        _f("zk", pa.string()),
        _f("pulsar_root", pa.string()),
        _f("status", pa.string(), False),  # bklib.states.RunStatus
        _f("counts", pa.map_(pa.string(), pa.int64())),
        _f("error", pa.string()),
    ]
)
"""One cross-check of Pulsar's metadata against BookKeeper's: what it read and found."""

PULSAR_REFERENCES_SCHEMA = pa.schema(
    [
        RUN_ID,
        _f("detected_at", TS, False),
        _f("kind", pa.string(), False),  # bklib.states.PulsarFinding
        _f("severity", pa.string()),
        # None for an ERROR row about a key that names no single ledger.
        _f("ledger_id", pa.int64()),
        _f("topic", pa.string()),
        _f("namespace", pa.string()),
        # managed-ledger, cursor, schema, compacted-ledger: what names (or should name) it.
        _f("component", pa.string()),
        # The Pulsar key that references the ledger (DANGLING), should list it (ORPHAN) or
        # could not be decoded (ERROR).
        _f("key", pa.string()),
        _f("bytes", pa.int64()),
        _f("ledger_ctime", TS),
        _f("error", pa.string()),
    ]
)
"""A dangling reference, an orphan ledger, or an undecodable Pulsar key."""

PARTITION_BY[BLAST_RADIUS] = []
PARTITION_BY[TRIAGE] = []
PARTITION_BY[PULSAR_CHECKS] = []
PARTITION_BY[PULSAR_REFERENCES] = []
TABLE_SCHEMAS[BLAST_RADIUS] = BLAST_RADIUS_SCHEMA
TABLE_SCHEMAS[TRIAGE] = TRIAGE_SCHEMA
TABLE_SCHEMAS[PULSAR_CHECKS] = PULSAR_CHECKS_SCHEMA
TABLE_SCHEMAS[PULSAR_REFERENCES] = PULSAR_REFERENCES_SCHEMA

ALL_TABLES = (*TABLES, BLAST_RADIUS, TRIAGE, PULSAR_CHECKS, PULSAR_REFERENCES)
"""Every table bkaudit writes under a warehouse (what ``bkaudit maintain`` looks after)."""
