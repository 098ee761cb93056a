"""The Delta tables' names, schemas and partitioning: the contract both executors write and every
reader (notebooks, the report, Airflow) relies on.

Schemas are Arrow schemas, written once here. The local executor writes them through delta-rs;
the Spark executor derives its StructTypes from them (:mod:`jobs.spark.schema`).
Timestamps are UTC-zoned microseconds, which both Delta writers store as Delta's ``timestamp``
type, so neither side needs the ``timestampNtz`` table feature.
"""

from __future__ import annotations

import pyarrow as pa

__all__ = [
    "ACTIONS",
    "ACTIONS_SCHEMA",
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
    "PARTITION_BY",
    "TABLES",
]

AUDIT_RUNS = "audit_runs"
LEDGERS = "ledgers"
BOOKIES = "bookies"
FRAGMENTS = "underreplicated_fragments"
ACTIONS = "replication_actions"
TABLES = (AUDIT_RUNS, LEDGERS, BOOKIES, FRAGMENTS, ACTIONS)

PARTITION_BY: dict[str, list[str]] = {
    AUDIT_RUNS: [],
    LEDGERS: ["run_id"],
    BOOKIES: ["run_id"],
    FRAGMENTS: ["run_id"],
    ACTIONS: ["mode"],
}
"""Partition columns of each table (reading one run touches one directory)."""

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

LEDGERS_TABLE_SCHEMA = pa.schema(
    [RUN_ID, *(f for f in LEDGER_SCHEMA if f.name != "password")]  # secrets stay out
)
BOOKIES_TABLE_SCHEMA = pa.schema([RUN_ID, *BOOKIE_SCHEMA])
FRAGMENTS_TABLE_SCHEMA = pa.schema(
    [
        RUN_ID,
        _f("check", pa.string()),
        _f("detected_at", TS),
        *FRAGMENT_SCHEMA,
        _f("first_detected_at", TS),
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
    ]
)

TABLE_SCHEMAS: dict[str, pa.Schema] = {
    AUDIT_RUNS: AUDIT_RUNS_SCHEMA,
    LEDGERS: LEDGERS_TABLE_SCHEMA,
    BOOKIES: BOOKIES_TABLE_SCHEMA,
    FRAGMENTS: FRAGMENTS_TABLE_SCHEMA,
    ACTIONS: ACTIONS_SCHEMA,
}

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
"""One bookie's or rack's blast radius (:class:`bklib.audit.whatif.ScopeImpact`)."""

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
    ]
)
"""One unrecoverable ledger and why (:func:`bklib.audit.triage.triage_ledger`)."""

PARTITION_BY[BLAST_RADIUS] = []
PARTITION_BY[TRIAGE] = []
TABLE_SCHEMAS[BLAST_RADIUS] = BLAST_RADIUS_SCHEMA
TABLE_SCHEMAS[TRIAGE] = TRIAGE_SCHEMA
