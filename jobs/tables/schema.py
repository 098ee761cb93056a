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
