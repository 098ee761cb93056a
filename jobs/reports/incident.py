"""The report's incident data: bookie states, losses and repair runs, read from the Delta
tables through delta-rs and reduced in Arrow before the plain-Python queries of
:mod:`jobs.reports.bookies` and :mod:`jobs.reports.repairs` run on the few rows left (a month
of daily audits and repairs at a million ledgers is millions of rows)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from bklib.audit.checks.registry import CHECKS
from bklib.repair.outcome import DRY_RUN
from bklib.states import ActionKind, ActionStatus, BookieState, Reason
from jobs.reports import arrow_queries
from jobs.reports.bookies import bookie_losses, bookie_states
from jobs.reports.queries import Row, time_to_repair
from jobs.reports.repairs import (
    FAILURE_STATUSES,
    failed_repairs,
    manual_steps,
    repair_runs,
)
from jobs.tables import delta
from jobs.tables.schema import BOOKIES, FRAGMENTS

_KEY = ["ledger_id", "segment_first_entry_id"]


def reading_checks() -> set[str]:
    """The checks that read the bookies (a lost audit reads only the registry)."""
    return {name for name, kind in CHECKS.items() if kind.reads_entries}


def read_bookie_states(
    warehouse: str, history: Sequence[Mapping[str, Any]], shown: Collection[str]
) -> list[Row]:
    """:func:`~jobs.reports.bookies.bookie_states` of the bookies the ``shown`` runs list."""
    if not delta.table_exists(warehouse, BOOKIES):
        return []
    bookies = delta.read_rows(warehouse, BOOKIES, columns=["run_id", "bookie_id", "state"])
    silent: list[tuple[str, str]] = []
    if delta.table_exists(warehouse, FRAGMENTS):
        t = delta.read_arrow(
            warehouse,
            FRAGMENTS,
            columns=["run_id", "bookie_id"],
            filters=[("reason", "=", Reason.BOOKIE_UNREACHABLE)],
        )
        pairs = t.group_by(["run_id", "bookie_id"]).aggregate([])
        silent = list(zip(pairs["run_id"].to_pylist(), pairs["bookie_id"].to_pylist(), strict=True))
    return bookie_states(bookies, history, silent, reading_checks(), shown)


def read_losses(
    warehouse: str, repairs: pa.Table | None, lost_now: Collection[str], now: datetime
) -> list[Row]:
    """:func:`~jobs.reports.bookies.bookie_losses` of every bookie ever found lost: its
    BOOKIE_LOST fragments (first detection of each) against the DONE repairs of them."""
    if not delta.table_exists(warehouse, FRAGMENTS):
        return []
    lost = delta.read_arrow(
        warehouse,
        FRAGMENTS,
        columns=[*_KEY, "bookie_id", "first_detected_at"],
        filters=[("reason", "=", Reason.BOOKIE_LOST)],
    )
    firsts = lost.group_by([*_KEY, "bookie_id"]).aggregate([("first_detected_at", "min")])
    fragments = delta.arrow_rows(firsts.rename_columns([*_KEY, "bookie_id", "first_detected_at"]))
    done: list[Row] = []
    if repairs is not None and repairs.num_rows:
        kinds = pa.array([ActionKind.COPY, ActionKind.METADATA_UPDATE], pa.string())
        ok = repairs.filter(
            pc.and_(
                pc.and_(
                    pc.equal(repairs["status"], ActionStatus.DONE),
                    pc.is_in(repairs["action"], kinds),
                ),
                pc.and_(pc.is_valid(repairs["old_bookie"]), pc.is_valid(repairs["finished_at"])),
            )
        )
        # time_to_repair wants each key's first and last DONE time: two rows per group.
        ends = ok.group_by([*_KEY, "old_bookie", "action"]).aggregate(
            [("finished_at", "min"), ("finished_at", "max")]
        )
        for r in delta.arrow_rows(ends):
            for end in ("finished_at_min", "finished_at_max"):
                done.append({**r, "status": ActionStatus.DONE, "finished_at": r[end]})
    return bookie_losses(time_to_repair(fragments, done), lost_now, now)


def lost_bookies(
    states: Sequence[Mapping[str, Any]], findings: Sequence[Mapping[str, Any]]
) -> set[str]:
    """Bookies lost now: so in their latest ``bookies`` row or a shown BOOKIE_LOST finding."""
    return {b["bookie_id"] for b in states if b["state"] == BookieState.LOST} | {
        f["bookie_id"] for f in findings if f["reason"] == Reason.BOOKIE_LOST
    }


def read_repair_runs(repairs: pa.Table) -> list[Row]:
    """:func:`~jobs.reports.repairs.repair_runs` from the actions counted per run and status."""
    if repairs.num_rows == 0:
        return []
    grouped = repairs.group_by(["run_id", "mode", "status"]).aggregate(
        [("run_id", "count"), ("started_at", "min"), ("finished_at", "max")]
    )
    names = ["run_id", "mode", "status", "actions", "started_at", "finished_at"]
    return repair_runs(delta.arrow_rows(grouped.select([*names[:3], "run_id_count",
                       "started_at_min", "finished_at_max"]).rename_columns(names)))  # fmt: skip


def read_failures(repairs: pa.Table, dry_runs: Collection[str]) -> list[Row]:
    """:func:`~jobs.reports.repairs.failed_repairs`: only the failing rows and their ledgers'
    latest runs (of all, and not dry) become Python values."""
    failing = repairs.filter(pc.is_in(repairs["status"], pa.array(FAILURE_STATUSES, pa.string())))
    if failing.num_rows == 0:
        return []
    mine = repairs.filter(pc.is_in(repairs["ledger_id"], failing["ledger_id"].unique()))
    dry = pc.is_in(mine["run_id"], pa.array(sorted(dry_runs), pa.string()))
    # A ledger's latest run is the run of its latest action.
    latest = _run_of_latest(mine)
    latest_real = _run_of_latest(mine.filter(pc.invert(dry)))
    return failed_repairs(delta.arrow_rows(failing), latest, latest_real, dry_runs)


def _run_of_latest(actions: pa.Table) -> dict[int, str]:
    latest = arrow_queries.latest_action_per_ledger(actions)
    return dict(zip(latest["ledger_id"].to_pylist(), latest["run_id"].to_pylist(), strict=True))


def read_manual_steps(actions: pa.Table) -> list[Row]:
    """:func:`~jobs.reports.repairs.manual_steps`: only the topic unloads become Python
    values, and only when some is MANUAL."""
    unloads = actions.filter(pc.equal(actions["action"], ActionKind.UNLOAD_TOPIC))
    if not pc.any(pc.equal(unloads["status"], ActionStatus.MANUAL)).as_py():
        return []
    return manual_steps(delta.arrow_rows(unloads))


def dry_runs_of(actions: pa.Table) -> set[str]:
    """The dry runs among ``actions``' runs (:data:`bklib.repair.outcome.DRY_RUN`)."""
    planned = actions.filter(pc.equal(actions["status"], DRY_RUN))
    return {str(r) for r in planned["run_id"].unique().to_pylist()}
