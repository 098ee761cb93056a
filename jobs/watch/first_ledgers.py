"""A loss's first ledgers, repaired while its audit reads (docs/watch.md, "The first ledgers").

The bookie index names a lost bookie's ledgers the moment the bookie is due, so the watch need
not wait for the audit's read, check and marks (8 to 10 s at a million ledgers) before it
copies anything. The cycle reads a few of those ledgers first (:data:`CANDIDATES`, one
pipelined read), and a thread repairs the closed ones among them at once, with the same engine
as every repair (:meth:`~jobs.watch.repair.WatchRepair.first_ledgers`: the repairer marks each
ledger itself, locks it, copies and writes by compare-and-set). Open ledgers are left to the
audit: they wait for their grace period anyway.

The audit takes those views as its own read of them (read before any of them was repaired,
so its findings are the loss's whole), and its marks and repair leave out what this repair
resolved: nothing is marked again or copied twice. A ledger it left unfinished (locked
elsewhere, a failed copy) is the audit's like any other, its mark already standing
(:attr:`FirstOutcome.marks`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from bklib.audit.model import LedgerView
from bklib.repair.outcome import RESOLVED, repair_status
from bklib.repair.requests import LedgerRequest
from bklib.states import ActionStatus
from jobs.runtime.messages import one_line
from jobs.watch.spool import SpoolError

__all__ = [
    "CANDIDATES",
    "FIRST_LEDGERS",
    "FirstLedgers",
    "FirstOutcome",
    "first_requests",
    "resolved_ledgers",
]

log = logging.getLogger("jobs.watch")

FIRST_LEDGERS = 8
"""Ledgers repaired before the audit's marks: enough for a first copy whatever one of them
meets, few enough that the audit sharing the process with them is hardly slowed."""

CANDIDATES = 32
"""Ledgers read to find :data:`FIRST_LEDGERS` closed ones (one pipelined read)."""


def first_requests(
    views: Iterable[LedgerView | None], due: frozenset[str], n: int = FIRST_LEDGERS
) -> list[LedgerRequest]:
    """Up to ``n`` requests, in the order given, for the closed ledgers among ``views`` that
    name a ``due`` bookie. A deleted (None), unreadable or open ledger is left to the audit."""
    now = datetime.now(timezone.utc)
    out: list[LedgerRequest] = []
    for v in views:
        if v is None or not v.ok or not v.is_closed:
            continue
        bad = frozenset(v.bookies()) & due
        if bad:
            out.append(LedgerRequest(v.ledger_id, bad_bookies=bad, first_detected_at=now))
            if len(out) == n:
                break
    return out


def resolved_ledgers(rows: Sequence[dict[str, Any]]) -> set[int]:
    """The ledgers a repair's stamped action rows leave with nothing to do (repaired, or found
    repaired already): :func:`~bklib.repair.outcome.repair_status`'s rule."""
    return {
        lid for lid, (outcome, _) in repair_status(list(rows), None).items() if outcome in RESOLVED
    }


@dataclass
class FirstOutcome:
    """What the first ledgers' repair left for the audit's marks and repair."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    resolved: set[int] = field(default_factory=set)
    """Left out of the audit's marks and repair: nothing to do."""
    marks: dict[int, tuple[str, ...]] = field(default_factory=dict)
    """The marks the repairer left on the ledgers it did not finish: the audit's marks merge
    with them instead of failing a whole request on them."""
    error: str | None = None


class FirstLedgers:
    """The thread that repairs a loss's first ledgers; :meth:`join` waits for it."""

    def __init__(
        self,
        views: Iterable[LedgerView | None],
        due: frozenset[str],
        *,
        repair: Callable[[list[LedgerRequest]], list[dict[str, Any]]],
        read_mark: Callable[[int], tuple[str, ...] | None],
    ) -> None:
        self.requests = first_requests(views, due)
        self._repair = repair
        self._read_mark = read_mark
        self.outcome = FirstOutcome()
        self._raised: Exception | None = None
        self._thread = threading.Thread(target=self._run, name="first-ledgers", daemon=True)

    def start(self) -> FirstLedgers | None:
        """Start the repair; None (nothing started) when no view was a closed ledger naming a
        due bookie."""
        if not self.requests:
            return None
        self._thread.start()
        return self

    def bookies_of(self, rows: Sequence[dict[str, Any]]) -> set[str]:
        """The due bookies a ledger's finished rows copied away from (for the reaction's
        timing): those its request named."""
        ids = {r["ledger_id"] for r in rows if r["status"] == ActionStatus.DONE}
        return {b for q in self.requests if q.ledger_id in ids for b in q.bad_bookies}

    def join(self) -> FirstOutcome:
        """Wait for the repair; what it left for the audit. A failure is logged and leaves
        every ledger to the audit (none resolved); a spool past its bound is raised here, as
        the cycle's own writes raise it (the watch stops)."""
        self._thread.join()
        if isinstance(self._raised, SpoolError):
            raise self._raised
        return self.outcome

    def _run(self) -> None:
        out = self.outcome
        try:
            out.rows = self._repair(self.requests)
            out.resolved = resolved_ledgers(out.rows)
            for q in self.requests:
                if q.ledger_id not in out.resolved:
                    mark = self._read_mark(q.ledger_id)
                    if mark is not None:
                        out.marks[q.ledger_id] = mark
        except Exception as exc:  # noqa: BLE001 - the audit's repair covers every ledger then
            self._raised = exc
            out.error = one_line(exc)
            out.resolved = set()
            log.error("watch: the loss's first ledgers: %s; its audit repairs them", out.error)
