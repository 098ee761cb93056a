"""The pure half of probing a bookie by entry reads: which entries to read, and what the
answers say about the entries it holds.

The I/O halves are :class:`bklib.audit.checker.ReplicaChecker`'s probes (one (ledger, bookie)
pair at a time, with v2 batch reads) and :mod:`bklib.audit.sampled_reads` (the sampled check's
reads of many pairs at once). Both read the stripe :func:`stripe_plan` plans (or the sample
of it :func:`sampled_ids` picks), classify each answer with :func:`answer_kind` and sum them
up in an :class:`EntryTally`.

Fail closed: only NoSuchEntry / NoSuchLedger is "missing". Any other failure, or an answer
without a body, is "unknown".
"""

from __future__ import annotations

import random
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from bklib.audit.model import SegmentSpan
from bklib.availability import EntryRuns, from_entry_ids
from bklib.digest import DigestManager
from bklib.errors import DigestMatchError, NoSuchEntryError, NoSuchLedgerError
from bklib.quorum import sample_stripe
from bklib.states import ReplicaStatus

__all__ = [
    "BAD",
    "HELD",
    "MISSING",
    "UNKNOWN",
    "EntryTally",
    "PlannedRange",
    "ProbeResult",
    "Run",
    "all_held",
    "answer_kind",
    "sampled_ids",
    "stripe_plan",
    "unread_as_held",
]

Run = tuple[int, int]
PlannedRange = tuple[int, int, int]
"""(ensemble index, first entry, last entry) of a range a bookie must hold."""

# What one read's answer says of its entry. Plain ints: one is stored per read.
HELD = 0
"""The bookie answered with the entry (its digest checked, when a digest is checked)."""
BAD = 1
"""The bookie answered with the entry, and its digest did not match: held, but damaged."""
MISSING = 2
"""The bookie said NoSuchEntry / NoSuchLedger: the only answer that means "does not hold"."""
UNKNOWN = 3
"""Any other failure (a timeout, a lost connection, an error status): neither held nor not."""


def stripe_plan(
    segments: Iterable[SegmentSpan], bookie: str, lac: int | None
) -> list[PlannedRange]:
    """(index, first, last) of every segment range where ``bookie`` must hold entries; an open
    segment ends at ``lac`` (nothing of it is planned without one)."""
    out = []
    for s in segments:
        last = s.last_entry_id if s.last_entry_id is not None else lac
        if last is None or last < s.first_entry_id:
            continue
        for i, b in enumerate(s.ensemble):
            if b == bookie:
                out.append((i, s.first_entry_id, last))
    return out


def sampled_ids(
    plan: Iterable[PlannedRange],
    e: int,
    wq: int,
    verify_percentage: float,
    rng: random.Random | None,
) -> tuple[list[int], set[int]]:
    """The ids a sample reads of every planned range (BookKeeper's sample of its stripe,
    :func:`~bklib.quorum.sample_stripe`), in order, and the first id read of each range (an
    :class:`EntryTally` starts fresh runs there)."""
    ids: list[int] = []
    starts: set[int] = set()
    for idx, first, last in plan:
        mark = len(ids)
        ids.extend(sample_stripe(idx, first, last, e, wq, verify_percentage, rng))
        if len(ids) > mark:
            starts.add(ids[mark])
    return ids, starts


def answer_kind(
    entry_id: int, body: bytes | None, exc: BaseException | None, dm: DigestManager | None
) -> int:
    """What one read's answer says of ``entry_id``: :data:`MISSING` on NoSuchEntry /
    NoSuchLedger only, :data:`UNKNOWN` on any other failure or no body, else :data:`HELD`,
    or :data:`BAD` when ``dm`` is given and the body fails its digest."""
    if exc is None and body is not None:
        if dm is not None:
            try:
                dm.verify_entry(body, entry_id)
            except DigestMatchError:
                return BAD
        return HELD
    if isinstance(exc, (NoSuchEntryError, NoSuchLedgerError)):
        return MISSING
    return UNKNOWN


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """What reading one bookie's entries of one ledger found."""

    status: str
    entries: tuple[Run, ...]
    bad: tuple[Run, ...]
    unknown: tuple[Run, ...]
    error: str | None
    answered: int
    """Reads the bookie answered (held or missing)."""
    unknown_count: int


class _RunBuilder:
    """Accumulates ids, given in ascending stripe order, into runs per outcome.

    Consecutive stripe entries with the same outcome share one run, which then also spans the
    ids between them that are not on the stripe (never asked; the classifier ignores them), so
    a healthy bookie's stripe stays one run instead of one per entry.
    """

    __slots__ = ("_last", "held", "missing", "unknown")

    def __init__(self) -> None:
        self.held: list[list[int]] = []
        self.unknown: list[list[int]] = []
        self.missing: list[int] = []
        self._last: list[list[int]] | None = None

    def add(self, entry_id: int, runs: list[list[int]] | None) -> None:
        """Add ``entry_id`` to ``runs`` (``held`` or ``unknown``; None: to no run)."""
        if runs is not None:
            if self._last is runs and runs:
                runs[-1][1] = entry_id
            else:
                runs.append([entry_id, entry_id])
        self._last = runs

    def cut(self) -> None:
        """Start fresh runs (a new range)."""
        self._last = None


def _runs(runs: list[list[int]]) -> tuple[Run, ...]:
    return tuple((a, b) for a, b in runs)


class EntryTally:
    """The answers of one (ledger, bookie) probe, added in ascending id order, summed up
    into the bookie's :class:`ProbeResult`."""

    __slots__ = ("_runs", "bad", "errors", "held", "missing", "range_starts", "unknown")

    def __init__(self, range_starts: Collection[int] = ()) -> None:
        self._runs = _RunBuilder()
        self.range_starts = set(range_starts)
        """The first id of each range: consecutive ranges never share a run."""
        self.bad: list[int] = []
        self.errors: list[str] = []
        self.held = self.unknown = self.missing = 0

    def add(self, entry_id: int, kind: int, error: BaseException | str | None = None) -> None:
        """Count ``entry_id`` as ``kind``; an unknown one's ``error`` is kept (three at most)."""
        runs = self._runs
        if entry_id in self.range_starts:
            runs.cut()
        if kind <= BAD:  # HELD or BAD
            runs.add(entry_id, runs.held)
            self.held += 1
            if kind == BAD:
                self.bad.append(entry_id)
        elif kind == MISSING:
            runs.add(entry_id, None)
            runs.missing.append(entry_id)
            self.missing += 1
        else:
            runs.add(entry_id, runs.unknown)
            self.unknown += 1
            if len(self.errors) < 3:
                self.errors.append(str(error))

    def cut(self) -> None:
        """Start fresh runs: the next id added begins a new range."""
        self._runs.cut()

    def result(self, plan: Iterable[PlannedRange], *, sample: bool) -> ProbeResult:
        """What the probe found; UNREACHABLE when not one read was answered. A sample takes
        the planned entries it did not read as held (:func:`unread_as_held`)."""
        runs = self._runs
        unknown = _runs(runs.unknown)
        held = unread_as_held(plan, runs.missing, unknown) if sample else _runs(runs.held)
        status = (
            ReplicaStatus.UNREACHABLE
            if self.unknown and not self.held and not self.missing
            else ReplicaStatus.OK
        )
        return ProbeResult(
            status=status,
            entries=held,
            bad=tuple(from_entry_ids(self.bad).runs()),
            unknown=unknown,
            error="; ".join(self.errors) or None,
            answered=self.held + self.missing,
            unknown_count=self.unknown,
        )


def all_held(plan: Iterable[PlannedRange], reads: int) -> ProbeResult:
    """A sample's result when each of its ``reads`` was answered with a sound entry: what
    :meth:`EntryTally.result` gives then, without counting them one by one."""
    return ProbeResult(
        status=ReplicaStatus.OK,
        entries=unread_as_held(plan, (), ()),
        bad=(),
        unknown=(),
        error=None,
        answered=reads,
        unknown_count=0,
    )


def unread_as_held(
    plan: Iterable[PlannedRange], missing: Collection[int], unknown: Collection[Run]
) -> tuple[Run, ...]:
    """The sample check's held runs: every id of the planned ranges except those read as
    missing or unknown (ids off the stripe are ignored by the classifier)."""
    if not missing and not unknown:  # the usual answer: every planned id held
        return tuple(EntryRuns((first, last) for _, first, last in plan).runs())
    absent = EntryRuns([*from_entry_ids(sorted(missing)).runs(), *unknown])
    out: list[Run] = []
    for _, first, last in plan:
        out.extend(absent.gaps(first, last))
    return tuple(EntryRuns(out).runs())
