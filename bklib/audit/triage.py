"""Why a ledger cannot be repaired: the triage of NO_REPLICA and stuck ledgers, pure.

Classes (:class:`~bklib.states.TriageClass`), first match wins:

1. DELETED: the ledger is gone from ZooKeeper (Pulsar trimmed or deleted the topic): nothing
   to repair, the finding is stale.
2. WRITE_QUORUM_ONE: WQ = 1, one copy per entry by design; its bookie's loss is data loss.
3. ENTRIES_LOST: some entries are missing on every replica of their write set (ids given).
4. NO_REPLACEMENT: a segment needs more replacement bookies than there are writable bookies
   outside its ensemble (or racks, when racks are known), as ``ReplicationWorker`` /
   ``LedgerFragmentReplicator`` need one new bookie per missing replica.
5. OTHER: stuck for another reason; the detail is the repair's last error.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from bklib.audit.model import LedgerView
from bklib.audit.whatif import MAX_RANGES, segment_impact
from bklib.replacement import DEFAULT_MIN_RACKS, replacement_shortfall
from bklib.states import TriageClass

__all__ = ["TriageResult", "triage_ledger"]

Run = tuple[int, int]


@dataclass(frozen=True)
class TriageResult:
    """A ledger's class, a one-line detail, and the entries with no replica."""

    klass: str
    detail: str
    lost_entries: int = 0
    lost_ranges: tuple[Run, ...] = ()
    lost_ranges_truncated: bool = False


def triage_ledger(
    view: LedgerView | None,
    missing: Mapping[tuple[int, str], Sequence[Run] | None],
    *,
    writable: Collection[str],
    racks: Mapping[str, str] | None = None,
    repair_error: str | None = None,
    min_racks: int = DEFAULT_MIN_RACKS,
) -> TriageResult:
    """Classify one ledger. ``view`` is its current metadata (None: deleted); ``missing`` maps
    (segment first entry id, bookie) to the ranges that bookie lacks (None: all of it)."""
    if view is None:
        return TriageResult(TriageClass.DELETED, "the ledger no longer exists in ZooKeeper")
    if not view.ok or not view.segments:
        return TriageResult(TriageClass.OTHER, f"unreadable metadata: {view.error}")
    e, wq, aq = view.ensemble_size, view.write_quorum, view.ack_quorum
    assert e is not None and wq is not None and aq is not None
    lost = 0
    runs: list[Run] = []
    truncated = False
    shortfall = None
    for seg in view.segments:
        absent = {
            i: missing[(seg.first_entry_id, b)]
            for i, b in enumerate(seg.ensemble)
            if (seg.first_entry_id, b) in missing
        }
        if not absent:
            continue
        # AQ=1 in the arithmetic: "fewer than one replica left" is "no replica".
        res = segment_impact(
            seg.first_entry_id, seg.last_entry_id, e, wq, 1, (), absent, MAX_RANGES, existing=True
        )
        lost += res.lost_entries
        room = MAX_RANGES - len(runs)
        runs.extend(res.lost_ranges[:room])
        truncated |= res.truncated or len(res.lost_ranges) > room
        if seg.last_entry_id is None and res.lost:
            truncated = True  # an open segment's lost entries are not enumerable
        replace = [seg.ensemble[i] for i in absent]
        shortfall = shortfall or replacement_shortfall(
            seg.ensemble, replace, writable, racks, wq, min_racks
        )
    lost_any = lost > 0 or truncated
    if wq == 1 and lost_any:
        return TriageResult(
            TriageClass.WRITE_QUORUM_ONE,
            f"write quorum 1 (E={e} WQ={wq} AQ={aq}): one copy per entry",
            lost,
            tuple(runs),
            truncated,
        )
    if lost_any:
        shown = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs[:10])
        return TriageResult(
            TriageClass.ENTRIES_LOST,
            f"{lost} entries missing on every replica: {shown}"
            + (" ..." if truncated or len(runs) > 10 else ""),
            lost,
            tuple(runs),
            truncated,
        )
    if shortfall is not None:
        return TriageResult(TriageClass.NO_REPLACEMENT, shortfall)
    return TriageResult(TriageClass.OTHER, repair_error or "no repair outcome recorded")
