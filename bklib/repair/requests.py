"""What to ask the repairer, per ledger: findings grouped into :class:`LedgerRequest`.

Pure, and shared by both executors: the local executor feeds it the findings it read through
delta-rs, the Spark executor the rows it collected from the same table.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from bklib.states import Reason

__all__ = [
    "LedgerRequest",
    "mark_requests",
    "placement_requests",
    "request_for_bookies",
    "requests_from_findings",
]


@dataclass(frozen=True)
class LedgerRequest:
    """One ledger to repair.

    ``bad_bookies`` must leave every segment naming them (lost, unreachable, or the sources
    of a manual recover). ``segment_bookies`` are bad in one segment only (keyed by its first
    entry id: entries missing, digest mismatch). ``detected_segments`` and
    ``first_detected_at`` come from the audit (None for a manual recover, which fences open
    ledgers at once). ``no_replica`` holds ``(segment first entry id, bookie)`` pairs an
    earlier run found unrecoverable: they are reported again, not copied again.
    """

    ledger_id: int
    bad_bookies: frozenset[str] = frozenset()
    segment_bookies: Mapping[int, frozenset[str]] = field(default_factory=dict)
    detected_segments: frozenset[int] | None = None
    first_detected_at: datetime | None = None
    no_replica: frozenset[tuple[int, str]] = frozenset()
    verify_mark: bool = False
    """The ledger carries an under-replication mark but the audit did not flag it: check it
    now, repair a mark bookie that is gone, and clear the mark when the ledger is healthy."""
    placement_segments: frozenset[int] = frozenset()
    """``--fix-placement``: first entry ids of segments that break the placement rule; such a
    request moves replicas between racks (:mod:`bklib.repair.placement_fix`) and nothing else."""

    @property
    def all_bad(self) -> set[str]:
        return set(self.bad_bookies).union(*self.segment_bookies.values())


def requests_from_findings(
    findings: Iterable[Mapping[str, Any]],
    previous_no_replica: Iterable[Mapping[str, Any]] = (),
    *,
    fix_placement: bool = False,
) -> list[LedgerRequest]:
    """One request per ledger with findings, ordered by ledger id.

    PLACEMENT_VIOLATION findings are not under-replication and are skipped, unless
    ``fix_placement``: then only they are used, one placement request per ledger.

    ``findings`` are rows of ``underreplicated_fragments`` (ledger_id, segment_first_entry_id,
    bookie_id, reason, first_detected_at). A bookie-level reason (:attr:`Reason.WHOLE_BOOKIE`)
    moves the bookie out of every segment; other reasons only out of their segment.
    ``previous_no_replica`` are ``replication_actions`` rows with status NO_REPLICA
    (ledger_id, segment_first_entry_id, old_bookie) from earlier runs.
    """
    whole: dict[int, set[str]] = {}
    per_segment: dict[int, dict[int, set[str]]] = {}
    detected: dict[int, set[int]] = {}
    first_seen: dict[int, datetime | None] = {}
    if fix_placement:
        return placement_requests(findings)
    for f in findings:
        if f["reason"] == Reason.PLACEMENT_VIOLATION:
            continue
        lid = int(f["ledger_id"])
        seg = int(f["segment_first_entry_id"])
        whole.setdefault(lid, set())
        per_segment.setdefault(lid, {})
        if f["reason"] in Reason.WHOLE_BOOKIE:
            whole[lid].add(f["bookie_id"])
        else:
            per_segment[lid].setdefault(seg, set()).add(f["bookie_id"])
        detected.setdefault(lid, set()).add(seg)
        t = f.get("first_detected_at")
        prev = first_seen.get(lid)
        if lid not in first_seen or (t is not None and (prev is None or t < prev)):
            first_seen[lid] = t
    no_replica: dict[int, set[tuple[int, str]]] = {}
    for a in previous_no_replica:
        if a.get("old_bookie") is None or a.get("segment_first_entry_id") is None:
            continue
        no_replica.setdefault(int(a["ledger_id"]), set()).add(
            (int(a["segment_first_entry_id"]), a["old_bookie"])
        )
    return [
        LedgerRequest(
            ledger_id=lid,
            bad_bookies=frozenset(whole[lid]),
            segment_bookies={s: frozenset(b) for s, b in sorted(per_segment[lid].items())},
            detected_segments=frozenset(detected[lid]),
            first_detected_at=first_seen[lid],
            no_replica=frozenset(no_replica.get(lid, ())),
        )
        for lid in sorted(whole)
    ]


def placement_requests(findings: Iterable[Mapping[str, Any]]) -> list[LedgerRequest]:
    """One ``--fix-placement`` request per ledger with PLACEMENT_VIOLATION findings."""
    segments: dict[int, set[int]] = {}
    for f in findings:
        if f["reason"] == Reason.PLACEMENT_VIOLATION:
            segments.setdefault(int(f["ledger_id"]), set()).add(int(f["segment_first_entry_id"]))
    return [
        LedgerRequest(ledger_id=lid, placement_segments=frozenset(segs))
        for lid, segs in sorted(segments.items())
    ]


def request_for_bookies(
    ledger_id: int, named: Sequence[str], bookies: Iterable[str]
) -> LedgerRequest | None:
    """Manual recover: the request for a ledger whose ensembles name ``named``, if any of them
    is among ``bookies``. No detection time, so an open ledger is fenced at once, as
    BookKeeper's ``BookKeeperAdmin.recoverBookieData`` does."""
    bad = frozenset(named) & frozenset(bookies)
    return LedgerRequest(ledger_id=ledger_id, bad_bookies=bad) if bad else None


def mark_requests(marked: Iterable[int], requested: Iterable[int]) -> list[LedgerRequest]:
    """Requests to verify the marked ledgers no request covers, so a mark left behind (its
    bookie came back, its copy was cut off) never stays forever."""
    have = set(requested)
    return [LedgerRequest(lid, verify_mark=True) for lid in sorted(set(marked) - have)]
