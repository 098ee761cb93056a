"""A loss's first ledgers, repaired while its audit reads (docs/watch.md, "The first ledgers").

The bookie index names a lost bookie's ledgers the moment the bookie is due, so the watch need
not wait for the audit's read, check and marks (8 to 10 s at a million ledgers) before it
copies anything. The cycle reads a few of those ledgers first (one pipelined read), and a
thread marks the closed ones among them (``--first-ledgers`` of them) and repairs them at once,
with the same engine as every repair (:meth:`~jobs.watch.repair.WatchRepair.first_ledgers`:
lock, copy, compare-and-set, the mark cleared). Open ledgers are left to the audit: they wait
for their grace period anyway.

The audit takes those views as its own read of them (read before any of them was repaired,
so its findings are the loss's whole). Its marks leave these ledgers out, and do not wait for
their repair; its repair waits for it (so ``--rate`` and ``--ledgers-in-flight`` bound the two
together), and then takes every ledger it left unfinished (locked elsewhere, a failed copy),
and none it resolved: nothing is marked twice or copied twice.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol

from bklib.audit.model import LedgerView
from bklib.repair.outcome import RESOLVED, repair_status
from bklib.repair.requests import LedgerRequest
from bklib.states import ActionStatus
from jobs.runtime.messages import one_line
from jobs.watch.spool import SpoolError

__all__ = [
    "CANDIDATES_PER_LEDGER",
    "FIRST_LEDGERS",
    "Changes",
    "FirstLedgers",
    "FirstOutcome",
    "first_requests",
    "resolved_ledgers",
]

log = logging.getLogger("jobs.watch")

FIRST_LEDGERS = 8
"""``--first-ledgers``'s default: enough for a first copy whatever one of them meets, few
enough that the audit sharing the process with them is hardly slowed."""

CANDIDATES_PER_LEDGER = 4
"""Ledgers read (one pipelined read) for each first ledger wanted: open ones are skipped."""


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


class Changes(Protocol):
    """Asked before each ledger starts: have the lost bookies changed
    (:class:`~jobs.watch.loss_changes.LossChanges`)?"""

    def __call__(self) -> bool: ...

    @property
    def changed(self) -> bool: ...


@dataclass
class FirstOutcome:
    """What the first ledgers' repair left for the audit's repair."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    resolved: set[int] = field(default_factory=set)
    """Left out of the audit's repair: nothing to do."""
    changed: bool = False
    """The lost bookies changed meanwhile: the cycle decides again before repairing more."""
    error: str | None = None
    unmarked: frozenset[int] = frozenset()
    """Taken, but perhaps never marked (the repair failed, maybe before its marks): the
    audit's marks, which left them out, add them."""


class FirstLedgers:
    """The thread that repairs a loss's first ledgers; :meth:`join` waits for it."""

    def __init__(
        self,
        views: Iterable[LedgerView | None],
        due: frozenset[str],
        changes: Changes,
        repair: Callable[[list[LedgerRequest], Changes], list[dict[str, Any]]],
        n: int = FIRST_LEDGERS,
    ) -> None:
        self.requests = first_requests(views, due, n)
        self.changes = changes
        self._repair = repair
        self.outcome = FirstOutcome()
        self._raised: Exception | None = None
        self._thread = threading.Thread(target=self._run, name="first-ledgers", daemon=True)

    @property
    def ledger_ids(self) -> frozenset[int]:
        """The ledgers taken: marked by their repair, so the audit's marks leave them out (a
        mark written after their repair cleared its own would outlive it)."""
        return frozenset(q.ledger_id for q in self.requests)

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
        """Wait for the repair; what it left for the audit's. A failure is logged and leaves
        every ledger to the audit's marks and repair (none resolved); a spool past its bound
        is raised here, as the cycle's own writes raise it (the watch stops)."""
        self._thread.join()
        if isinstance(self._raised, SpoolError):
            raise self._raised
        return self.outcome

    def _run(self) -> None:
        out = self.outcome
        try:
            out.rows = self._repair(self.requests, self.changes)
            out.resolved = resolved_ledgers(out.rows)
        except Exception as exc:  # noqa: BLE001 - the audit's repair covers every ledger then
            self._raised = exc
            out.error = one_line(exc)
            out.resolved = set()
            out.unmarked = self.ledger_ids
            log.error("watch: the loss's first ledgers: %s; its audit repairs them", out.error)
        finally:
            out.changed = self.changes.changed
