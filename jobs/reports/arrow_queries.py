"""The report's and the listing's queries over a long history, computed in Arrow.

A warehouse with a month of daily audits of a million ledgers holds millions of fragment
and action rows. Turned into Python dicts, they alone would take the report past a minute. These
functions give exactly what their plain-Python twins in :mod:`jobs.reports.queries` give, from
Arrow tables (as :func:`jobs.tables.delta.read_arrow` returns them); only the few rows the page
shows become Python values. ``tests/unit/test_report_arrow_queries.py`` holds each to its twin.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from bklib.repair.outcome import DRY_RUN, REPAIRED
from bklib.states import ActionKind, ActionStatus
from jobs.reports.queries import SEVERITIES, UNKNOWN_SEVERITY, Row, recent_runs

__all__ = [
    "finished_span_seconds",
    "latest_action_per_ledger",
    "repair_status_of",
    "repair_throughput",
    "severity_over_runs",
]

_ZERO_IF_EMPTY = pc.ScalarAggregateOptions(min_count=0)
"""A sum over nothing but nulls is 0, as ``x or 0`` summed in Python."""


def _epoch_seconds(ts: pa.ChunkedArray) -> pa.ChunkedArray:
    """Whole seconds since the epoch, rounded down (``math.floor`` of the Python twin)."""
    micros = ts.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
    return pc.floor(pc.divide(micros.cast(pa.float64()), 1e6)).cast(pa.int64())


def finished_span_seconds(actions: pa.Table) -> int:
    """:func:`jobs.reports.queries.finished_span_seconds` of these actions."""
    finished = actions.column("finished_at")
    if finished.null_count == len(finished):
        return 0
    secs = pc.min_max(_epoch_seconds(finished)).as_py()
    return int(secs["max"] - secs["min"])


def repair_throughput(actions: pa.Table, bucket_seconds: int) -> list[Row]:
    """:func:`jobs.reports.queries.repair_throughput` of these actions: finished COPY actions
    per ``bucket_seconds`` of finished_at, aggregated in Arrow."""
    done = actions.filter(
        pc.and_(
            pc.and_(
                pc.equal(actions.column("action"), ActionKind.COPY),
                pc.equal(actions.column("status"), ActionStatus.DONE),
            ),
            pc.is_valid(actions.column("finished_at")),
        )
    )
    if done.num_rows == 0:
        return []
    secs = _epoch_seconds(done.column("finished_at"))
    bucket = pc.multiply(pc.floor(pc.divide(secs.cast(pa.float64()), bucket_seconds)),
                         bucket_seconds).cast(pa.int64())  # fmt: skip
    grouped = (
        pa.table(
            {
                "bucket": bucket,
                "entries_copied": done.column("entries_copied"),
                "bytes_copied": done.column("bytes_copied"),
            }
        )
        .group_by("bucket")
        .aggregate(
            [
                ("bucket", "count"),
                ("entries_copied", "sum", _ZERO_IF_EMPTY),
                ("bytes_copied", "sum", _ZERO_IF_EMPTY),
            ]
        )
        .sort_by("bucket")
    )
    return [
        {
            "bucket_start": datetime.fromtimestamp(start, tz=timezone.utc),
            "copies": copies,
            "entries_copied": entries,
            "bytes_copied": nbytes,
            "bytes_per_second": nbytes / float(bucket_seconds),
        }
        for start, copies, entries, nbytes in zip(
            grouped.column("bucket").to_pylist(),
            grouped.column("bucket_count").to_pylist(),
            grouped.column("entries_copied_sum").to_pylist(),
            grouped.column("bytes_copied_sum").to_pylist(),
            strict=True,
        )
    ]


def latest_action_per_ledger(actions: pa.Table) -> pa.Table:
    """Each ledger's most recent action, by the rule of ``jobs.reports.queries._latest``:
    latest coalesce(finished_at, started_at), then latest started_at, and among full ties the
    first row of ``actions``. One row per ledger, in ``actions``' columns."""
    if actions.num_rows == 0:
        return actions
    order = pa.table(
        {
            "ledger_id": actions.column("ledger_id"),
            "recency": pc.coalesce(actions.column("finished_at"), actions.column("started_at")),
            "started_at": actions.column("started_at"),
            "row": pa.array(range(actions.num_rows), pa.int64()),
        }
    )
    # Arrow's sort is stable; "row" ascending makes the first of a full tie come first.
    ranked = order.sort_by(
        [("ledger_id", "ascending"), ("recency", "descending"), ("started_at", "descending"),
         ("row", "ascending")]
    )  # fmt: skip
    ids = ranked.column("ledger_id").combine_chunks()
    first = pc.not_equal(ids.slice(1), ids.slice(0, len(ids) - 1))
    keep = pa.concat_arrays([pa.array([True]), first.cast(pa.bool_())])
    return actions.take(ranked.column("row").filter(keep))


def severity_over_runs(
    runs: Iterable[Mapping[str, Any]], fragments: pa.Table, limit: int
) -> list[Row]:
    """:func:`jobs.reports.queries.severity_over_runs` from an Arrow table of fragments
    (run_id, ledger_id, severity), counted in Arrow."""
    recent = recent_runs(runs, limit)
    wanted = [r["run_id"] for r in recent]
    frags = fragments.filter(pc.is_in(fragments.column("run_id"), pa.array(wanted, pa.string())))
    per_sev: dict[str, dict[str, int]] = {rid: dict.fromkeys(SEVERITIES, 0) for rid in wanted}
    total = dict.fromkeys(wanted, 0)
    ledgers = dict.fromkeys(wanted, 0)
    if frags.num_rows:
        by_sev = frags.group_by(["run_id", "severity"]).aggregate(
            [("run_id", "count", pc.CountOptions(mode="all"))]
        )
        for rid, sev, n in zip(
            by_sev.column("run_id").to_pylist(),
            by_sev.column("severity").to_pylist(),
            by_sev.column("run_id_count").to_pylist(),
            strict=True,
        ):
            if sev in per_sev[rid]:
                per_sev[rid][sev] += n
            total[rid] += n
        distinct = frags.group_by("run_id").aggregate([("ledger_id", "count_distinct")])
        for rid, n in zip(
            distinct.column("run_id").to_pylist(),
            distinct.column("ledger_id_count_distinct").to_pylist(),
            strict=True,
        ):
            ledgers[rid] = n
    return [
        {
            **r,
            **per_sev[r["run_id"]],
            UNKNOWN_SEVERITY: total[r["run_id"]] - sum(per_sev[r["run_id"]].values()),
            "fragments": total[r["run_id"]],
            "underreplicated_ledgers": ledgers[r["run_id"]],
        }
        for r in reversed(recent)
    ]


def repair_status_of(actions: pa.Table, since: datetime | None) -> pa.Table:
    """:func:`bklib.repair.outcome.repair_status` of these actions (ledger_id, run_id, action,
    status, started_at and whatever else the caller wants of the deciding rows), in Arrow: one
    row per ledger, its "outcome" and the deciding run's last action. A month of daily repairs
    of a lost bookie is 150,000 rows since an audit; only the result becomes Python values."""
    keep = pc.invert(pc.is_in(actions["action"], pa.array(sorted(ActionKind.NOT_LEDGER_REPAIRS))))
    if since is not None:
        started_type = actions.schema.field("started_at").type
        keep = pc.and_(
            keep, pc.greater_equal(actions["started_at"], pa.scalar(since, started_type))
        )
    kept = actions.filter(keep)
    # The twin walks the rows by start time, ties in row order: Arrow's sort is stable.
    ordered = kept.take(pc.sort_indices(kept["started_at"]))
    status = ordered["status"]
    final = pa.array(sorted(ActionStatus.FINAL))
    rows = pa.table(
        {
            "ledger_id": ordered["ledger_id"],
            "run_id": ordered["run_id"],
            "pos": pa.array(range(ordered.num_rows), pa.int64()),
            "unfinished": pc.if_else(pc.is_in(status, final), pa.scalar(None, pa.string()), status),
            "done": pc.equal(status, ActionStatus.DONE),
            "status": status,
        }
    )
    # Each run's outcome: its first unfinished status, else REPAIRED when it did work, else
    # its last row's status (DONE aside, all final: SKIPPED or PLANNED).
    runs = rows.group_by(["ledger_id", "run_id"], use_threads=False).aggregate(
        [("pos", "min"), ("pos", "max"), ("unfinished", "first"), ("done", "any"),
         ("status", "last")]
    )  # fmt: skip
    runs = runs.append_column(
        "outcome",
        pc.coalesce(
            runs["unfinished_first"],
            pc.if_else(runs["done_any"], REPAIRED, runs["status_last"]),
        ),
    )
    # A dry run undoes no real run's outcome: it decides only a ledger no real run touched.
    runs = runs.append_column("real", pc.not_equal(runs["outcome"], DRY_RUN))
    touched = runs.group_by("ledger_id", use_threads=False).aggregate([("real", "any")])
    runs = runs.join(touched, "ledger_id")
    runs = runs.filter(pc.or_(runs["real"], pc.invert(runs["real_any"])))
    outcome = runs["outcome"]
    skipped = pc.equal(outcome, ActionStatus.SKIPPED)
    # Per ledger, its runs in the order they started: the last run decides, except that a
    # SKIPPED run does not undo the REPAIRED run before it (nor the SKIPPED ones after that).
    per_run = pa.table(
        {
            "ledger_id": runs["ledger_id"],
            "first": runs["pos_min"],
            "outcome": outcome,
            "pos": runs["pos_max"],
            "worked": pc.if_else(skipped, pa.scalar(None, pa.string()), outcome),
            "worked_pos": pc.if_else(skipped, pa.scalar(None, pa.int64()), runs["pos_max"]),
        }
    ).sort_by([("ledger_id", "ascending"), ("first", "ascending")])
    ledgers = per_run.group_by("ledger_id", use_threads=False).aggregate(
        [("outcome", "last"), ("pos", "last"), ("worked", "last"), ("worked_pos", "last")]
    )
    kept_repair = pc.fill_null(
        pc.and_(
            pc.equal(ledgers["outcome_last"], ActionStatus.SKIPPED),
            pc.equal(ledgers["worked_last"], REPAIRED),
        ),
        False,
    )
    decided = ordered.take(pc.if_else(kept_repair, ledgers["worked_pos_last"], ledgers["pos_last"]))
    return decided.append_column(
        "outcome", pc.if_else(kept_repair, REPAIRED, ledgers["outcome_last"])
    )
