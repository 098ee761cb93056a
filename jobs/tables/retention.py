"""What ``bkaudit maintain`` keeps and deletes: pure, rows in and decisions out, so every
rule is unit-tested without a warehouse (docs/tables.md). :mod:`jobs.tables.maintenance`
reads the rows and carries the decisions out.

Audit runs are kept when recent, when the latest (or latest finished) run of their check, or
when they hold the last report of an open finding; repair runs when recent, the latest of
their mode, or part of a kept audit run's repair history; blast_radius, triage and Pulsar
check runs when recent or the latest.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from typing import Any

from bklib.states import RunStatus
from jobs.tables.schema import (
    ACTIONS,
    AUDIT_RUNS,
    BLAST_RADIUS,
    BOOKIES,
    FRAGMENTS,
    LEDGERS,
    PULSAR_CHECKS,
    PULSAR_REFERENCES,
    TRIAGE,
)

__all__ = [
    "AuditRun",
    "Deletion",
    "RepairRun",
    "RetentionPlan",
    "deletions",
    "latest_per_check",
    "open_finding_candidates",
    "open_finding_runs",
    "plan_retention",
    "repair_runs",
]

DELETE_CHUNK = 500
"""Run ids per delete commit (keeps each predicate a reasonable size)."""


@dataclass(frozen=True)
class AuditRun:
    """One row of ``audit_runs``, as retention needs it."""

    run_id: str
    check: str
    status: str
    started_at: datetime
    finished_at: datetime | None = None

    @property
    def finished(self) -> bool:
        return self.status in RunStatus.FINISHED

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> AuditRun:
        return cls(
            str(row["run_id"]),
            str(row["check"]),
            str(row["status"]),
            row["started_at"],
            row.get("finished_at"),
        )


def _order(run: AuditRun) -> tuple[Any, ...]:
    return (run.started_at, run.run_id)


def latest_per_check(runs: Iterable[AuditRun]) -> dict[str, str]:
    """run_id -> why it is kept, for the latest run of each check and the latest finished one
    (the one ``listunderreplicated`` and ``rereplicate`` read when it is the newest)."""
    keep: dict[str, str] = {}
    by_check: dict[str, list[AuditRun]] = defaultdict(list)
    for r in runs:
        by_check[r.check].append(r)
    for check, mine in by_check.items():
        keep.setdefault(max(mine, key=_order).run_id, f"latest {check} run")
        finished = [r for r in mine if r.finished]
        if finished:
            keep.setdefault(max(finished, key=_order).run_id, f"latest finished {check} run")
    return keep


def open_finding_candidates(runs: Iterable[AuditRun]) -> list[AuditRun]:
    """The runs that may hold the last report of an open finding: per check, the finished
    runs from the latest COMPLETED one on (every finished run when none completed). A
    finding last reported before that run is not open: a later complete audit of the same
    check did not find it."""
    out: list[AuditRun] = []
    by_check: dict[str, list[AuditRun]] = defaultdict(list)
    for r in runs:
        if r.finished:
            by_check[r.check].append(r)
    for mine in by_check.values():
        complete = [r for r in mine if r.status == RunStatus.COMPLETED]
        since = max(complete, key=_order) if complete else None
        out.extend(r for r in mine if since is None or _order(r) >= _order(since))
    return out


FindingKey = tuple[str, int, int, str]
"""(check, ledger_id, segment_first_entry_id, bookie_id): one finding, whichever run saw it."""


def open_finding_runs(
    runs: Iterable[AuditRun],
    fragments: Iterable[Mapping[str, Any]],
    actions: Sequence[Mapping[str, Any]],
) -> dict[str, str]:
    """run_id -> why, for each run that holds the last report of an open finding.

    A finding is a (check, ledger, segment, bookie) in ``underreplicated_fragments``. It is
    **open** when (1) no COMPLETED audit of the same check started after its last report
    (a complete audit that does not list it shows it gone; COMPLETED_WITH_ERRORS may have
    missed it), and (2) no repair run that started after its last report left the ledger
    REPAIRED or SKIPPED (``listunderreplicated``'s rule, :func:`repair_status`). The run of
    that last report is kept; earlier reports of it are not needed (its first detection
    travels on in ``first_detected_at``).

    ``fragments``: rows with run_id, ledger_id, segment_first_entry_id and bookie_id of the
    :func:`open_finding_candidates` runs (other rows are ignored).
    """
    from bklib.repair.outcome import RESOLVED, repair_status

    candidates = {r.run_id: r for r in open_finding_candidates(runs)}
    last: dict[FindingKey, AuditRun] = {}
    for f in fragments:
        run = candidates.get(f["run_id"])
        if run is None:
            continue
        key = (run.check, f["ledger_id"], f["segment_first_entry_id"], f["bookie_id"])
        if key not in last or _order(run) > _order(last[key]):
            last[key] = run
    keep: dict[str, str] = {}
    status_since: dict[str, dict[int, tuple[str, dict[str, Any]]]] = {}
    open_count: dict[str, int] = defaultdict(int)
    for (_, ledger_id, _, _), run in last.items():
        if run.run_id not in status_since:
            status_since[run.run_id] = repair_status([dict(a) for a in actions], run.started_at)
        outcome = status_since[run.run_id].get(ledger_id, ("",))[0]
        if outcome not in RESOLVED:
            open_count[run.run_id] += 1
    for run_id, n in open_count.items():
        keep[run_id] = f"last report of {n} open finding{'s' if n != 1 else ''}"
    return keep


@dataclass(frozen=True)
class RepairRun:
    """One repair run, from its ``replication_actions`` rows."""

    run_id: str
    mode: str
    started_at: datetime
    audit_run_ids: frozenset[str]
    ledgers: frozenset[int]


def repair_runs(actions: Iterable[Mapping[str, Any]]) -> list[RepairRun]:
    """The repair runs in ``actions`` rows (run_id, mode, audit_run_id, ledger_id,
    started_at)."""
    rows: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for a in actions:
        rows[a["run_id"]].append(a)
    out = []
    for run_id, mine in rows.items():
        starts = [a["started_at"] for a in mine if a["started_at"] is not None]
        out.append(
            RepairRun(
                run_id,
                str(mine[0]["mode"]),
                min(starts) if starts else datetime.min.replace(tzinfo=timezone.utc),
                frozenset(a["audit_run_id"] for a in mine if a.get("audit_run_id")),
                frozenset(int(a["ledger_id"]) for a in mine),
            )
        )
    return out


@dataclass
class Deletion:
    """The rows of one table to delete: the runs ``run_ids``, plus (with ``before``) every
    row in a partition older than that day whose run is not in ``keep_ids``: runs dropped
    here and rows of runs that never finished writing (no ``audit_runs`` row)."""

    table: str
    run_ids: set[str] = field(default_factory=set)
    before: date | None = None
    keep_ids: set[str] = field(default_factory=set)

    def empty(self) -> bool:
        return not self.run_ids and self.before is None

    def predicates(self) -> list[str]:
        """SQL predicates for delta-rs's delete, one commit each."""
        out = []
        if self.before is not None:
            pred = f"run_date < '{self.before.isoformat()}'"
            if self.keep_ids:
                pred += f" AND run_id NOT IN ({_sql_list(self.keep_ids)})"
            out.append(pred)
        ids = sorted(self.run_ids)
        for i in range(0, len(ids), DELETE_CHUNK):
            out.append(f"run_id IN ({_sql_list(ids[i : i + DELETE_CHUNK])})")
        return out

    def expression(self) -> Any:
        """The same rows as a pyarrow dataset filter (the dry run counts them)."""
        import pyarrow as pa
        import pyarrow.dataset as ds

        expr = ds.field("run_id").isin(sorted(self.run_ids)) if self.run_ids else None
        if self.before is not None:
            old = ds.field("run_date") < pa.scalar(self.before, pa.date32())
            if self.keep_ids:
                old = old & ~ds.field("run_id").isin(sorted(self.keep_ids))
            expr = old if expr is None else expr | old
        return expr


def _sql_list(ids: Iterable[str]) -> str:
    return ", ".join("'" + i.replace("'", "''") + "'" for i in sorted(ids))


@dataclass
class RetentionPlan:
    """Which runs stay and which go, with why."""

    cutoff: datetime
    kept_audit: dict[str, str]
    deleted_audit: set[str]
    kept_repair: dict[str, str]
    deleted_repair: set[str]
    kept_other: dict[str, dict[str, str]] = field(default_factory=dict)
    deleted_other: dict[str, set[str]] = field(default_factory=dict)

    @property
    def cutoff_day(self) -> date:
        return self.cutoff.date()


def plan_retention(
    runs: Sequence[AuditRun],
    *,
    cutoff: datetime,
    open_runs: Mapping[str, str],
    actions: Iterable[Mapping[str, Any]],
    kept_run_ledgers: Mapping[str, set[int]],
    other_runs: Mapping[str, Mapping[str, datetime]] | None = None,
) -> RetentionPlan:
    """Decide retention.

    Audit runs: kept when started at or after ``cutoff``, when the latest (or latest
    finished) run of their check, or when in ``open_runs`` (:func:`open_finding_runs`).
    Repair runs: kept when started at or after ``cutoff``, when the latest of their mode,
    when they worked from a kept audit run, or when they started after an older kept audit
    run and touched one of its ledgers (``kept_run_ledgers``): that run's report shows what
    repairs did since, and must keep showing it. ``other_runs`` (blast_radius, triage: run
    id -> time): kept when recent, or the latest.
    """
    kept = _kept_audit(runs, cutoff, open_runs)
    deleted = {r.run_id for r in runs} - set(kept)
    by_id = {r.run_id: r for r in runs}
    old_kept = [by_id[i] for i in kept if i in by_id and by_id[i].started_at < cutoff]
    repairs = repair_runs(actions)
    kept_repair = _kept_repair(repairs, cutoff, set(kept), old_kept, kept_run_ledgers)
    deleted_repair = {p.run_id for p in repairs} - set(kept_repair)
    kept_other: dict[str, dict[str, str]] = {}
    deleted_other: dict[str, set[str]] = {}
    for table, times in (other_runs or {}).items():
        kept_other[table] = _kept_other(times, cutoff)
        deleted_other[table] = set(times) - set(kept_other[table])
    return RetentionPlan(
        cutoff, kept, deleted, kept_repair, deleted_repair, kept_other, deleted_other
    )


def _kept_audit(
    runs: Sequence[AuditRun], cutoff: datetime, open_runs: Mapping[str, str]
) -> dict[str, str]:
    """The audit runs kept, with why: recent ones, the latest of each check, open ones."""
    kept: dict[str, str] = {}
    for r in runs:
        if r.started_at >= cutoff:
            kept[r.run_id] = "recent"
    for run_id, why in {**latest_per_check(runs), **open_runs}.items():
        kept.setdefault(run_id, why)
    return kept


def _latest_per_mode(repairs: Iterable[RepairRun]) -> dict[str, RepairRun]:
    latest: dict[str, RepairRun] = {}
    for p in repairs:
        cur = latest.get(p.mode)
        if cur is None or (p.started_at, p.run_id) > (cur.started_at, cur.run_id):
            latest[p.mode] = p
    return latest


def _kept_repair(
    repairs: Sequence[RepairRun],
    cutoff: datetime,
    kept_audit: set[str],
    old_kept: Sequence[AuditRun],
    kept_run_ledgers: Mapping[str, set[int]],
) -> dict[str, str]:
    """The repair runs kept, with why (see :func:`plan_retention`)."""
    latest_mode = _latest_per_mode(repairs)
    kept: dict[str, str] = {}
    for p in repairs:
        if p.started_at >= cutoff:
            kept[p.run_id] = "recent"
        elif latest_mode[p.mode].run_id == p.run_id:
            kept[p.run_id] = f"latest {p.mode} run"
        elif p.audit_run_ids & kept_audit:
            kept[p.run_id] = "repairs a kept audit run"
        elif any(
            p.started_at >= r.started_at and p.ledgers & kept_run_ledgers.get(r.run_id, set())
            for r in old_kept
        ):
            kept[p.run_id] = "repair history of a kept audit run"
    return kept


def _kept_other(times: Mapping[str, datetime], cutoff: datetime) -> dict[str, str]:
    """The runs of a table without findings (blast_radius, triage) kept: recent, or latest."""
    mine: dict[str, str] = {i: "recent" for i, t in times.items() if t >= cutoff}
    if times:
        mine.setdefault(max(times, key=lambda i: (times[i], i)), "latest run")
    return mine


def deletions(plan: RetentionPlan, runs_day: Mapping[str, date]) -> list[Deletion]:
    """The deletes that carry a plan out, ``audit_runs`` first (a run disappears for readers
    before its rows do; a delete cut short leaves rows the next run's orphan rule removes).
    ``runs_day``: each audit and repair run's day."""
    day = plan.cutoff_day

    def old_kept(kept: Iterable[str]) -> set[str]:
        # A run's rows are never in a partition before its day: only kept runs of days before
        # the cutoff's need naming to be spared by the partition rule.
        return {i for i in kept if runs_day.get(i, day) < day}

    def named(deleted: Iterable[str]) -> set[str]:
        # Runs the partition rule misses: those of the cutoff's own day.
        return {i for i in deleted if runs_day.get(i, day) >= day}

    out = [Deletion(AUDIT_RUNS, set(plan.deleted_audit))]
    for table in (FRAGMENTS, LEDGERS, BOOKIES):
        out.append(Deletion(table, named(plan.deleted_audit), day, old_kept(plan.kept_audit)))
    out.append(Deletion(ACTIONS, named(plan.deleted_repair), day, old_kept(plan.kept_repair)))
    for table in (BLAST_RADIUS, TRIAGE, PULSAR_CHECKS, PULSAR_REFERENCES):
        out.append(Deletion(table, set(plan.deleted_other.get(table, set()))))
    return out
