"""The report's bookie queries: each bookie's state and last answer, and each loss with its
age and time to repair. Plain Python over rows of ``audit_runs``, ``bookies`` and the
fragments (rows in, rows out, as :mod:`jobs.reports.queries`); the warehouse is read and
reduced by :mod:`jobs.reports.data`.

A ``lost`` audit reads only the registry, so it cannot say a registered bookie answers: a
bookie that did not answer the latest audit that read it stays ``unreachable`` until a
reading audit hears from it again (:class:`bklib.states.BookieState`, docs/checks.md).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from datetime import datetime
from typing import Any

from bklib.states import BookieState, RunStatus
from jobs.reports.queries import Row, run_recency

_REGISTERED = (BookieState.WRITABLE, BookieState.READONLY)


def bookie_states(
    bookies: Iterable[Mapping[str, Any]],
    runs: Iterable[Mapping[str, Any]],
    unreachable: Iterable[tuple[str, str]],
    reading_checks: Collection[str],
    shown: Collection[str],
) -> list[Row]:
    """Each bookie of the ``shown`` runs' ``bookies`` rows: its state and last answer.

    ``bookies`` are rows (run_id, bookie_id, state) of any runs; ``runs`` the ``audit_runs``
    rows (only finished ones count); ``unreachable`` the (run_id, bookie_id) pairs with a
    BOOKIE_UNREACHABLE finding; ``reading_checks`` the checks that read the bookies.

    Keys: bookie_id, state (a :class:`~bklib.states.BookieState` word), registered_at (the
    start of the newest run that found it registered), answered_at (of the newest reading run
    in which it answered every read), unanswered_at (of the newest reading run in which it did
    not), lost_since (the start of the first run of its current loss), and run_id, check of
    the run that decided the state. Sorted by bookie_id.
    """
    finished = {r["run_id"]: r for r in runs if r["status"] in RunStatus.FINISHED}
    silent = {pair for pair in unreachable if pair[0] in finished}
    seen: dict[str, list[tuple[Mapping[str, Any], str]]] = {}
    for b in bookies:
        run = finished.get(b["run_id"])
        if run is not None:
            seen.setdefault(b["bookie_id"], []).append((run, b["state"]))
    wanted = {b for b, rows in seen.items() if any(r["run_id"] in shown for r, _ in rows)}
    out = []
    for bookie in sorted(wanted):
        history = sorted(seen[bookie], key=lambda rs: run_recency(rs[0]))
        registered = [r for r, s in history if s in _REGISTERED]
        read = [r for r, s in history if s in _REGISTERED and r["check"] in reading_checks]
        answered = [r for r in read if (r["run_id"], bookie) not in silent]
        unanswered = [r for r in read if (r["run_id"], bookie) in silent]
        decided_by, state = history[-1]
        if state == BookieState.LOST:
            # The first lost run after it was last seen registered: this loss, not an older.
            last_seen = run_recency(registered[-1]) if registered else None
            streak = [
                r
                for r, s in history
                if s == BookieState.LOST and (last_seen is None or run_recency(r) > last_seen)
            ]
            lost_since = streak[0]["started_at"]
        else:
            lost_since = None
            if read and read[-1] in unanswered:
                state, decided_by = BookieState.UNREACHABLE, read[-1]
        out.append(
            {
                "bookie_id": bookie,
                "state": state,
                "registered_at": registered[-1]["started_at"] if registered else None,
                "answered_at": answered[-1]["started_at"] if answered else None,
                "unanswered_at": unanswered[-1]["started_at"] if unanswered else None,
                "lost_since": lost_since,
                "run_id": decided_by["run_id"],
                "check": decided_by["check"],
            }
        )
    return out


def bookie_losses(
    repairs: Iterable[Mapping[str, Any]], lost_now: Collection[str], now: datetime
) -> list[Row]:
    """Each bookie ever found lost, from :func:`jobs.reports.queries.time_to_repair`'s rows of
    its BOOKIE_LOST fragments: how long ago it was first found lost and how long its repair
    took. Most recent loss first.

    Keys: bookie_id, status (``lost`` while in ``lost_now``; else ``repaired`` when every
    fragment was repaired, or ``no longer found``: it came back or its ledgers went), lost_at
    (first detection), seconds_since_loss (to ``now``), fragments, repaired_fragments,
    repaired_at (when the last fragment was repaired, None while any is not), seconds_to_repair.
    """
    per: dict[str, list[Mapping[str, Any]]] = {}
    for r in repairs:
        per.setdefault(r["bookie_id"], []).append(r)
    out = []
    for bookie, rows in per.items():
        firsts = [r["first_detected_at"] for r in rows if r["first_detected_at"] is not None]
        lost_at = min(firsts) if firsts else None
        done = [r["repaired_at"] for r in rows if r["repaired_at"] is not None]
        repaired_at = max(done) if done and len(done) == len(rows) else None
        if bookie in lost_now:
            status = BookieState.LOST
        else:
            status = "repaired" if repaired_at is not None else "no longer found"
        out.append(
            {
                "bookie_id": bookie,
                "status": status,
                "lost_at": lost_at,
                "seconds_since_loss": _seconds(lost_at, now),
                "fragments": len(rows),
                "repaired_fragments": len(done),
                "repaired_at": repaired_at,
                "seconds_to_repair": _seconds(lost_at, repaired_at),
            }
        )
    return sorted(out, key=lambda r: (r["lost_at"] is None, _neg(r["lost_at"]), r["bookie_id"]))


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return end.timestamp() - start.timestamp()


def _neg(ts: datetime | None) -> float:
    return -ts.timestamp() if ts is not None else 0.0
