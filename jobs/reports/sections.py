"""The report's incident sections, pure HTML from :class:`~jobs.reports.data.ReportData`: the
audit runs shown (and the checks not run), bookie states with each one's last answer, losses
with their age and time to repair, repair runs (a dry run marked), repair failures with their
reasons as text, and the steps left to an operator (docs/operations.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bklib.states import ActionStatus, BookieState, RunStatus
from jobs.reports.charts import esc
from jobs.reports.data import ReportData
from jobs.reports.text import duration_cell, fmt_ts, not_run

DRY_RUN_BADGE = '<span class="badge dry-run">dry run</span>'
MANUAL_BADGE = '<span class="badge manual">manual step</span>'
STATE_COLORS = {
    BookieState.WRITABLE: "#15803d",
    BookieState.READONLY: "#ca8a04",
    BookieState.UNREACHABLE: "#7c3aed",
    BookieState.LOST: "#b91c1c",
}

CSS = """
.not-run{color:#4b5563;background:#f3f4f6;border:1px dashed #9ca3af;border-radius:6px;
padding:6px 10px;font-style:italic}
.badge{font-weight:600;padding:1px 6px;border-radius:4px;font-size:12px;color:#fff}
.dry-run{background:#0e7490}.manual{background:#1d4ed8}
.state{font-weight:600;padding:1px 6px;border-radius:4px;font-size:12px;color:#fff}
td.reason{white-space:normal;min-width:260px;color:#b91c1c}
td.answer{white-space:normal;min-width:320px}
.grid{margin-top:20px}
"""


def _head(*cells: str) -> str:
    return "<thead><tr>" + "".join(f"<th>{esc(c)}</th>" for c in cells) + "</tr></thead>"


def _ago(seconds: float | None, missing: str = "never in these runs") -> str:
    return duration_cell(seconds, " ago", missing)


def _since(data: ReportData, ts: Any) -> float | None:
    return None if ts is None else data.generated_at.timestamp() - ts.timestamp()


def render_runs_section(data: ReportData) -> str:
    """``table#audit-runs``: each check's latest run, and a not-run row for each check
    without one (``data-check`` on every row, ``data-status`` ``not-run`` for those)."""
    rows = []
    for r in sorted(data.runs_shown, key=lambda r: r["started_at"], reverse=True):
        status = r["status"]
        note = "" if status == RunStatus.COMPLETED else " (incomplete: did not read everything)"
        rows.append(
            f'<tr data-check="{esc(r["check"])}" data-status="{esc(status)}">'
            f"<td>{esc(r['check'])}</td><td><code>{esc(r['run_id'])}</code></td>"
            f'<td class="{"" if not note else "bad"}">{esc(status)}{esc(note)}</td>'
            f"<td>{esc(fmt_ts(r['started_at']))}</td>"
            f"{_ago(_since(data, r['started_at']), '')}</tr>"
        )
    for r in data.runs_unfinished:
        rows.append(
            f'<tr data-check="{esc(r["check"])}" data-status="{esc(r["status"])}" class="bad">'
            f"<td>{esc(r['check'])}</td><td><code>{esc(r['run_id'])}</code></td>"
            f"<td>{esc(r['status'])}: did not finish, not shown; what it would have found is "
            f"unknown</td><td>{esc(fmt_ts(r['started_at']))}</td>"
            f"{_ago(_since(data, r['started_at']), '')}</tr>"
        )
    for check in data.checks_not_run:
        rows.append(
            f'<tr data-check="{esc(check)}" data-status="not-run" class="not-run">'
            f'<td>{esc(check)}</td><td colspan="4">not run: no finished {esc(check)} audit '
            "in this warehouse</td></tr>"
        )
    head = _head("check", "latest run", "status", "started (UTC)", "age")
    return (
        "<h2>Audit runs shown (the latest of each check)</h2>"
        f'<table id="audit-runs">{head}<tbody>{"".join(rows)}</tbody></table>'
    )


def _state_badge(state: str) -> str:
    color = STATE_COLORS.get(state, "#6b7280")
    return f'<span class="state" style="background:{color}">{esc(state)}</span>'


def _last_answer(b: dict[str, Any]) -> str:
    """What the bookie last did, in words."""
    state = b["state"]
    if state == BookieState.LOST:
        seen = fmt_ts(b["registered_at"]) or "never in these runs"
        return f"not registered since {fmt_ts(b['lost_since'])}; last seen registered: {seen}"
    if state == BookieState.UNREACHABLE:
        answered = fmt_ts(b["answered_at"]) or "never in these runs"
        return (
            f"did not answer the {b['check']} audit of {fmt_ts(b['unanswered_at'])}; "
            f"last answered reads: {answered}; still registered at {fmt_ts(b['registered_at'])}"
        )
    if b["answered_at"] is not None:
        return f"answered the reads of {fmt_ts(b['answered_at'])}"
    return f"registered at {fmt_ts(b['registered_at'])}; no audit read it"


def render_bookies_section(data: ReportData) -> str:
    """``table#bookies``: each bookie's state (writable, readonly, unreachable, lost) and its
    last answer; ``data-bookie-id`` and ``data-state`` on each row."""
    if not data.bookies:
        return "<h2>Bookies</h2>" + not_run("bookies", "no audit recorded the bookies")
    rows = []
    for b in data.bookies:
        rows.append(
            f'<tr data-bookie-id="{esc(b["bookie_id"])}" data-state="{esc(b["state"])}">'
            f"<td>{esc(b['bookie_id'])}</td><td>{_state_badge(b['state'])}</td>"
            f'<td class="answer">{esc(_last_answer(b))}</td>'
            f"{_ago(_since(data, b['registered_at']))}"
            f"{_ago(_since(data, b['answered_at']))}"
            f"<td>{esc(b['check'])} <code>{esc(b['run_id'])}</code></td></tr>"
        )
    head = _head("bookie", "state", "last answer", "last seen registered", "last answered reads",
                 "state from")  # fmt: skip
    return (
        "<h2>Bookies</h2>"
        '<p class="meta">A lost audit reads only the registry: a bookie that did not answer '
        "the latest audit that read it stays unreachable until one hears from it.</p>"
        f'<table id="bookies">{head}<tbody>{"".join(rows)}</tbody></table>'
    )


def render_losses_section(data: ReportData) -> str:
    """``table#losses``: per lost bookie, how long ago it was first found lost and its time
    to repair (``data-seconds`` on both cells)."""
    if not data.losses:
        return (
            "<h2>Lost bookies</h2>"
            '<p class="empty ok" id="losses-empty">No audit has found a lost bookie.</p>'
        )
    rows = []
    for loss in data.losses:
        repaired = f"{loss['repaired_fragments']} of {loss['fragments']} fragments repaired"
        rows.append(
            f'<tr data-bookie-id="{esc(loss["bookie_id"])}" data-status="{esc(loss["status"])}">'
            f"<td>{esc(loss['bookie_id'])}</td><td>{esc(loss['status'])}</td>"
            f"<td>{esc(fmt_ts(loss['lost_at']))}</td>"
            f"{duration_cell(loss['seconds_since_loss'], ' ago')}"
            f"{duration_cell(loss['seconds_to_repair'], '', 'not repaired yet')}"
            f"<td>{esc(repaired)}</td></tr>"
        )
    head = _head("bookie", "status", "first found lost (UTC)", "lost since", "time to repair",
                 "fragments")  # fmt: skip
    return (
        "<h2>Lost bookies: time since each loss and time to repair</h2>"
        f'<table id="losses">{head}<tbody>{"".join(rows)}</tbody></table>'
    )


def render_repair_runs_section(data: ReportData) -> str:
    """``table#repair-runs``: each repair run, newest first, a dry run marked as one."""
    if not data.repair_runs:
        return "<h2>Repair runs</h2>" + not_run("repair-runs", "no repair run recorded")
    rows = []
    for r in data.repair_runs:
        counts = ", ".join(f"{n} {s}" for s, n in sorted(r["statuses"].items()))
        badge = DRY_RUN_BADGE if r["dry_run"] else ""
        rows.append(
            f'<tr data-run-id="{esc(r["run_id"])}" data-dry-run="{str(r["dry_run"]).lower()}">'
            f"<td><code>{esc(r['run_id'])}</code> {badge}</td><td>{esc(r['mode'])}</td>"
            f"<td>{esc(fmt_ts(r['started_at']))}</td><td>{esc(counts)}</td></tr>"
        )
    head = _head("repair run", "mode", "started (UTC)", "actions by status")
    return (
        "<h2>Repair runs</h2>"
        '<p class="meta">A dry run changes nothing: its PLANNED rows are its plan (a step it '
        "could not plan says why in its error).</p>"
        f'<table id="repair-runs">{head}<tbody>{"".join(rows)}</tbody></table>'
    )


def render_failures_section(data: ReportData) -> str:
    """``table#repair-failures``: the failing actions of each ledger's latest repair run,
    with the reason as page text (``td.reason``)."""
    title = "<h2>Repair failures (each ledger's latest real repair run)</h2>"
    if not data.has_actions:
        return title + not_run("repair-failures", "no repair run recorded")
    if not data.failures:
        return title + '<p class="empty ok" id="repair-failures-empty">No repair failed.</p>'
    rows = []
    for f in data.failures:
        badge = f" {DRY_RUN_BADGE}" if f["dry_run"] else ""
        move = f"{f['old_bookie'] or ''} → {f['new_bookie'] or '?'}" if f["old_bookie"] else ""
        rows.append(
            f'<tr data-ledger-id="{esc(f["ledger_id"])}" data-status="{esc(f["status"])}" '
            f'data-dry-run="{str(f["dry_run"]).lower()}">'
            f'<td class="num">{esc(f["ledger_id"])}</td><td>{esc(f["segment_first_entry_id"])}</td>'
            f"<td>{esc(f['action'])}</td><td>{esc(f['status'])}{badge}</td><td>{esc(move)}</td>"
            f'<td class="reason">{esc(f["error"] or "no reason recorded")}</td>'
            f"<td><code>{esc(f['run_id'])}</code></td></tr>"
        )
    head = _head("ledger", "segment", "action", "status", "move", "reason", "repair run")
    return title + f'<table id="repair-failures">{head}<tbody>{"".join(rows)}</tbody></table>'


def render_manual_section(data: ReportData) -> str:
    """``table#manual-steps``: MANUAL rows (a topic unload without ``--pulsar-admin-url``),
    shown as steps for an operator, not as failures."""
    if not data.manual:
        return ""
    rows = []
    for m in data.manual:
        rows.append(
            f'<tr data-status="{esc(ActionStatus.MANUAL)}"><td>{MANUAL_BADGE}</td>'
            f"<td>{esc(m['action'])}</td><td>{esc(m['topic'] or m['ledger_id'])}</td>"
            f"<td>{esc(m['error'])}</td><td><code>{esc(m['run_id'])}</code></td></tr>"
        )
    head = _head("", "action", "topic or ledger", "what to do", "repair run")
    return (
        "<h2>Manual steps left to an operator</h2>"
        f'<table id="manual-steps">{head}<tbody>{"".join(rows)}</tbody></table>'
    )


def render_incident_sections(data: ReportData) -> str:
    """Every section of this module, in page order."""
    parts: Sequence[str] = (
        render_runs_section(data),
        render_losses_section(data),
        render_bookies_section(data),
        render_repair_runs_section(data),
        render_failures_section(data),
        render_manual_section(data),
    )
    return "\n".join(parts)
