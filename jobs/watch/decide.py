"""The watch's decisions, with no I/O: when a lost bookie is due for repair, which scheduled
checks are due, and the metric summaries of an audit's findings. Unit-tested alone."""

from __future__ import annotations

import argparse
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bklib.audit.checks import CHECKS, replication_names
from bklib.states import Reason, Severity
from jobs.options.units import parse_duration

__all__ = [
    "LossTracker",
    "Schedule",
    "finding_counts",
    "parse_every",
]

SEVERITY_ORDER = (Severity.NO_REPLICA, Severity.BELOW_AQ, Severity.BELOW_WQ)
"""Worst first: a ledger's severity is its worst fragment's."""


@dataclass
class LossTracker:
    """Which unregistered bookies are lost, and when each is due for repair.

    The rules are the Auditor's (``Auditor.submitAuditTask`` in BookKeeper 4.17): a bookie is
    available when it is registered writable or read-only; a bookie seen available and then
    gone is lost; with ``lostBookieRecoveryDelay`` 0 it is audited at once; a single lost
    bookie waits the delay, and is forgotten if it comes back meanwhile; two or more lost at
    once are audited at once (more than one failure is not a rolling restart).

    A due bookie stays due until :meth:`resolve` (no ledger names it any more) or until it
    registers again. Times are the caller's clock (monotonic seconds).
    """

    known: set[str] = field(default_factory=set)
    """Bookies seen available."""
    pending: dict[str, float] = field(default_factory=dict)
    """Lost, waiting for the delay: bookie -> when it was first seen lost."""
    due: dict[str, float] = field(default_factory=dict)
    """Lost and past the delay (or marked by someone): bookie -> when first seen lost."""

    def seed(
        self, available: Iterable[str], lost: Iterable[str], marked: Iterable[str], now: float
    ) -> None:
        """A new leader's starting point: ``lost`` are named in some ensemble but not
        registered. Those already in someone's under-replication mark (a previous leader, a
        Java Auditor) were decided lost before us: due at once; the others wait the delay from
        now, since we do not know when they left."""
        self.known = set(available)
        marked = set(marked)
        self.pending, self.due = {}, {}
        for b in set(lost) - self.known:
            (self.due if b in marked else self.pending)[b] = now

    def observe(self, available: Iterable[str], now: float, delay: float) -> list[str]:
        """Feed the current available set; returns the bookies that became due now."""
        avail = set(available)
        self.known |= avail
        for b in [b for b in self.pending if b in avail]:
            del self.pending[b]  # back within the delay: nothing to do
        for b in [b for b in self.due if b in avail]:
            del self.due[b]  # back before the repair finished: its data is readable again
        for b in self.known - avail:
            if b not in self.pending and b not in self.due:
                self.pending[b] = now
        self.known -= set(self.pending) | set(self.due)
        if delay <= 0 or len(self.pending) > 1:
            ready = list(self.pending)
        else:
            ready = [b for b, t in self.pending.items() if now - t >= delay]
        for b in ready:
            self.due[b] = self.pending.pop(b)
        return sorted(ready)

    def add_lost(self, bookies: Iterable[str], now: float) -> None:
        """Bookies an audit found named but unregistered that we never saw available: they
        wait the delay like any loss."""
        for b in bookies:
            if b not in self.known and b not in self.pending and b not in self.due:
                self.pending[b] = now

    def next_deadline(self, delay: float) -> float | None:
        """When the earliest pending bookie becomes due (None: nothing pending)."""
        if not self.pending:
            return None
        return min(self.pending.values()) + max(delay, 0.0)

    def resolve(self, bookie: str) -> float | None:
        """No ledger names ``bookie`` any more; returns when it was first seen lost."""
        return self.due.pop(bookie, None)


# ---- the schedule of periodic audits ------------------------------------------------------------

_EVERY_RE = re.compile(r"\s*([a-z]+)\s*=\s*([0-9.]+\s*[a-zA-Z]*)\s*")


def parse_every(text: str) -> dict[str, float]:
    """``lost=1h,sample=24h`` -> {check: seconds}; ``off``/``none``/empty: no periodic audit."""
    if text.strip().lower() in ("", "off", "none"):
        return {}
    out: dict[str, float] = {}
    for part in text.split(","):
        m = _EVERY_RE.fullmatch(part)
        if not m or m.group(1) not in replication_names():
            raise ValueError(
                f"--every: {part.strip()!r} is not CHECK=DURATION with CHECK one of "
                f"{', '.join(replication_names())}"
            )
        try:
            seconds = parse_duration(m.group(2))
        except (ValueError, argparse.ArgumentTypeError) as exc:  # one message for the flag
            raise ValueError(f"--every: {part.strip()!r}: {exc}") from None
        if seconds <= 0:
            raise ValueError(f"--every: {part.strip()!r}: the interval must be positive")
        out[m.group(1)] = seconds
    return out


@dataclass
class Schedule:
    """Periodic audits: each check runs when its interval has passed since its last run
    (from ``audit_runs``, so a restart does not re-run everything)."""

    every: Mapping[str, float]
    last: dict[str, float] = field(default_factory=dict)
    """check -> wall-clock time of its last run (finished or attempted)."""

    def due(self, now: float) -> list[str]:
        """Checks due now, cheapest first: those that read metadata only (``lost``), then the
        registry's order."""
        order = {c: i for i, c in enumerate(replication_names())}

        def cost(c: str) -> tuple[bool, int]:
            kind = CHECKS.get(c)
            return kind is None or kind.reads_entries, order.get(c, 99)

        return sorted(
            (c for c, every in self.every.items() if now - self.last.get(c, -1e18) >= every),
            key=cost,
        )

    def ran(self, check: str, when: float) -> None:
        self.last[check] = max(when, self.last.get(check, float("-inf")))

    def next_due(self) -> float | None:
        """The wall-clock time the next check is due (None: no schedule)."""
        if not self.every:
            return None
        return min(self.last.get(c, float("-inf")) + every for c, every in self.every.items())


# ---- metric summaries ---------------------------------------------------------------------------


def finding_counts(
    findings: Iterable[Mapping[str, Any]],
) -> tuple[dict[str, int], dict[str, int]]:
    """(fragments per severity, ledgers per worst severity) of under-replication findings
    (rows or :meth:`Finding.as_row` dicts); placement violations are not under-replication."""
    fragments: Counter[str] = Counter()
    worst: dict[int, int] = {}
    rank = {s: i for i, s in enumerate(SEVERITY_ORDER)}
    for f in findings:
        if f.get("reason") == Reason.PLACEMENT_VIOLATION or f.get("severity") is None:
            continue
        sev = f["severity"]
        fragments[sev] += 1
        lid = int(f["ledger_id"])
        worst[lid] = min(worst.get(lid, len(rank)), rank.get(sev, len(rank)))
    ledgers: Counter[str] = Counter()
    for r in worst.values():
        if r < len(SEVERITY_ORDER):
            ledgers[SEVERITY_ORDER[r]] += 1
    return (
        {s: fragments.get(s, 0) for s in SEVERITY_ORDER},
        {s: ledgers.get(s, 0) for s in SEVERITY_ORDER},
    )
