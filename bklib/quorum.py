"""Round-robin distribution schedule arithmetic, quorum coverage and recovery-read decisions.

Facts from BookKeeper's ``RoundRobinDistributionSchedule`` and ``PendingReadOp``
(docs/safety-rules.md rules 1-3):

* Replica ``w`` (0 <= w < WQ) of entry ``x`` lives at ensemble index ``(x + w) % E``, so index
  ``idx`` stores exactly the entries whose residue ``x % E`` lies in the cyclic window
  ``{idx - WQ + 1, ..., idx} (mod E)`` -- its *stripe*. Every stripe question below is answered
  per residue with floor-division arithmetic, in O(WQ) time whatever the size of the range.
* Coverage: a set of replies "covers" the ensemble when every possible write set (every window
  of WQ consecutive indices mod E) holds fewer than AQ unknown replies; only then can no entry
  we have not heard about have been acknowledged.
* A recovery read declares an entry absent only after WQ - AQ + 1 replicas said NoSuchEntry or
  NoSuchLedger; timeouts and other errors are unknown and can never shorten a ledger.

All functions are pure and validate their arguments with IncorrectParameterError.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from functools import lru_cache

from bklib.errors import IncorrectParameterError, NoSuchEntryError, NoSuchLedgerError
from bklib.states import Severity

__all__ = [
    "BELOW_AQ",
    "BELOW_WQ",
    "NO_REPLICA",
    "RRQuorumCoverageSet",
    "RecoveryReadDecision",
    "ReplyKind",
    "check_index",
    "check_quorum",
    "check_range",
    "classify_replicas",
    "count_in_residues",
    "first_last_in_residues",
    "has_entry",
    "is_covered",
    "iter_residues",
    "iter_stripe",
    "recovery_read_decision",
    "reply_kind",
    "sample_stripe",
    "stripe_contains",
    "stripe_count",
    "stripe_first_last",
    "stripe_residue_tuple",
    "stripe_residues",
    "write_set",
]


# ---- validation -----------------------------------------------------------------------------


def check_quorum(e: int, wq: int, aq: int | None = None) -> None:
    """Raise IncorrectParameterError unless ``E >= WQ >= AQ >= 1`` (AQ optional)."""
    if e < 1 or wq < 1 or wq > e:
        raise IncorrectParameterError(f"need ensemble >= write quorum >= 1, got E={e} WQ={wq}")
    if aq is not None and not 1 <= aq <= wq:
        raise IncorrectParameterError(f"need write quorum >= ack quorum >= 1, got WQ={wq} AQ={aq}")


def check_index(idx: int, e: int) -> None:
    """Raise IncorrectParameterError unless ``idx`` is an index of an ensemble of ``e``."""
    if not 0 <= idx < e:
        raise IncorrectParameterError(f"bookie index {idx} outside ensemble of size {e}")


def check_range(first: int, last: int) -> None:
    """Raise IncorrectParameterError for a negative ``first`` (``last < first`` is empty)."""
    # last < first is an empty range (e.g. an empty last segment); only negative starts are bad.
    if first < 0:
        raise IncorrectParameterError(f"negative first entry id {first}")


# ---- write sets -----------------------------------------------------------------------------


@lru_cache(maxsize=4096)
def _write_set_of_residue(residue: int, e: int, wq: int) -> tuple[int, ...]:
    return tuple((residue + w) % e for w in range(wq))


def write_set(entry_id: int, e: int, wq: int) -> tuple[int, ...]:
    """Ensemble indices storing ``entry_id`` in replica order: ``(entry_id + w) % E`` for w < WQ."""
    check_quorum(e, wq)
    if entry_id < 0:
        raise IncorrectParameterError(f"negative entry id {entry_id}", entry_id=entry_id)
    return _write_set_of_residue(entry_id % e, e, wq)


def has_entry(entry_id: int, idx: int, e: int, wq: int) -> bool:
    """True if ensemble index ``idx`` is in the write set of ``entry_id``."""
    check_quorum(e, wq)
    check_index(idx, e)
    if entry_id < 0:
        raise IncorrectParameterError(f"negative entry id {entry_id}", entry_id=entry_id)
    # idx = (entry + w) % E for some w < WQ  <=>  (idx - entry) % E < WQ.
    return (idx - entry_id) % e < wq


# ---- stripes --------------------------------------------------------------------------------


@lru_cache(maxsize=4096)
def stripe_residue_tuple(idx: int, e: int, wq: int) -> tuple[int, ...]:
    """Sorted residues of the stripe of ``idx`` (unchecked, cached: used on hot paths, such as
    :mod:`bklib.availability`'s, after :func:`check_quorum` and :func:`check_index`)."""
    return tuple(sorted({(idx - k) % e for k in range(wq)}))


def stripe_residues(idx: int, e: int, wq: int) -> frozenset[int]:
    """Residues ``x % E`` of the entries index ``idx`` stores: ``{idx - WQ + 1 .. idx} mod E``."""
    check_quorum(e, wq)
    check_index(idx, e)
    return frozenset(stripe_residue_tuple(idx, e, wq))


def _count_residue(first: int, last: int, r: int, e: int) -> int:
    # Number of x in [first, last] with x % e == r; floor division keeps it right for any bounds
    # and yields 0 for empty ranges.
    n = (last - r) // e - (first - 1 - r) // e
    return n if n > 0 else 0


def count_in_residues(residues: tuple[int, ...], first: int, last: int, e: int) -> int:
    """:func:`stripe_count` for the stripe of ``residues`` (:func:`stripe_residue_tuple`),
    unchecked."""
    if last < first:
        return 0
    if len(residues) == e:
        return last - first + 1
    return sum(_count_residue(first, last, r, e) for r in residues)


def first_last_in_residues(
    residues: tuple[int, ...], first: int, last: int, e: int
) -> tuple[int, int] | None:
    """:func:`stripe_first_last` for the stripe of ``residues``
    (:func:`stripe_residue_tuple`), unchecked."""
    if last < first:
        return None
    lo = min(first + (r - first) % e for r in residues)
    if lo > last:
        return None
    hi = max(last - (last - r) % e for r in residues)
    return lo, hi


def stripe_count(idx: int, first: int, last: int, e: int, wq: int) -> int:
    """How many entries in ``[first, last]`` index ``idx`` stores (0 when ``last < first``)."""
    check_quorum(e, wq)
    check_index(idx, e)
    check_range(first, last)
    return count_in_residues(stripe_residue_tuple(idx, e, wq), first, last, e)


def stripe_contains(idx: int, entry_id: int, first: int, last: int, e: int, wq: int) -> bool:
    """True if ``entry_id`` lies in ``[first, last]`` and index ``idx`` stores it."""
    check_quorum(e, wq)
    check_index(idx, e)
    check_range(first, last)
    return first <= entry_id <= last and (idx - entry_id) % e < wq


def stripe_first_last(idx: int, first: int, last: int, e: int, wq: int) -> tuple[int, int] | None:
    """First and last entry of ``[first, last]`` stored by index ``idx``, or None if it stores none.

    This is LedgerChecker's firstStored/lastStored for one bookie of a fragment.
    """
    check_quorum(e, wq)
    check_index(idx, e)
    check_range(first, last)
    return first_last_in_residues(stripe_residue_tuple(idx, e, wq), first, last, e)


def sample_stripe(
    idx: int,
    first: int,
    last: int,
    e: int,
    wq: int,
    percentage: float,
    rng: random.Random | None,
) -> list[int]:
    """The entries of ``[first, last]`` that index ``idx`` stores and that BookKeeper's
    ``LedgerChecker.verifyLedgerFragment`` would read: the first and last stored entry, plus
    ``percentage`` of the fragment's length picked at random, one per bucket, keeping those
    the index stores (all of them when the percentage covers the fragment). Ascending.
    ``rng`` may be None when the percentage picks nothing (0: only the ends are read)."""
    ends = stripe_first_last(idx, first, last, e, wq)
    if ends is None:
        return []
    lo, hi = ends
    length = hi - lo + 1
    wanted = int(length * (percentage / 100.0))
    if wanted >= length:
        return list(iter_stripe(idx, lo, hi, e, wq))
    picked = {lo, hi}
    if wanted > 0:
        if rng is None:
            raise ValueError("sampling a percentage of a fragment needs a random source")
        bucket = length // wanted
        for start in range(lo, hi - bucket - 1, bucket):
            x = start + rng.randrange(bucket)
            if (idx - x) % e < wq:
                picked.add(x)
    return sorted(picked)


def iter_stripe(idx: int, first: int, last: int, e: int, wq: int) -> Iterator[int]:
    """Yield, ascending, the entries of ``[first, last]`` that index ``idx`` stores.

    Lazy: meant for copying entries one by one, never to build a list of a whole ledger.
    """
    check_quorum(e, wq)
    check_index(idx, e)
    check_range(first, last)
    return iter_residues(stripe_residue_tuple(idx, e, wq), first, last, e)


def iter_residues(residues: tuple[int, ...], first: int, last: int, e: int) -> Iterator[int]:
    """:func:`iter_stripe` for the stripe of ``residues`` (:func:`stripe_residue_tuple`),
    unchecked."""
    if last < first:
        return
    if len(residues) == e:
        yield from range(first, last + 1)
        return
    base = first - first % e
    while base <= last:
        for r in residues:
            x = base + r
            if x > last:
                break
            if x >= first:
                yield x
        base += e


def contiguous_chunks(ids: Iterable[int], limit: int) -> Iterator[list[int]]:
    """Ascending ``ids`` cut into runs of consecutive ids, at most ``limit`` long: what one
    batch read can return (BookKeeper's BatchedReadEntryProcessor stops at the first entry a
    bookie lacks, and a bookie's stripe is runs of WQ consecutive entries, or all of them when
    E == WQ)."""
    chunk: list[int] = []
    for x in ids:
        if chunk and (x != chunk[-1] + 1 or len(chunk) >= limit):
            yield chunk
            chunk = []
        chunk.append(x)
    if chunk:
        yield chunk


# ---- replies, coverage and recovery reads ---------------------------------------------------


class ReplyKind(enum.Enum):
    """What a bookie's reply says about an entry or ledger."""

    POSITIVE = "positive"
    """OK with a valid digest: the bookie has it."""
    NEGATIVE = "negative"
    """NoSuchEntry or NoSuchLedger: the bookie's index has no record of it."""
    UNKNOWN = "unknown"
    """Timeout, I/O error, bad digest, unauthorized, DataUnknown, no answer: no information."""


def reply_kind(error: BaseException | None) -> ReplyKind:
    """Classify a reply: None (success) is POSITIVE; only NoSuchEntry/NoSuchLedger are NEGATIVE.

    Everything else -- including DigestMatchError, UnauthorizedAccessError, DataUnknownError and
    any non-BookKeeper exception -- is UNKNOWN, because it must never shorten a ledger.
    """
    if error is None:
        return ReplyKind.POSITIVE
    if isinstance(error, (NoSuchEntryError, NoSuchLedgerError)):
        return ReplyKind.NEGATIVE
    return ReplyKind.UNKNOWN


def _unknown_flags(known: Iterable[int] | Mapping[int, ReplyKind | None], e: int) -> list[bool]:
    unknown = [True] * e
    if isinstance(known, Mapping):
        items: Iterable[tuple[int, ReplyKind | None]] = known.items()
    else:
        items = ((i, ReplyKind.POSITIVE) for i in known)
    for i, kind in items:
        check_index(i, e)
        if kind is ReplyKind.POSITIVE or kind is ReplyKind.NEGATIVE:
            unknown[i] = False
    return unknown


def _covered(unknown: list[bool], e: int, wq: int, aq: int) -> bool:
    # Slide a window of WQ consecutive indices round the ring; O(E) in total.
    count = sum(unknown[:wq])
    if count >= aq:
        return False
    for start in range(1, e):
        count += unknown[(start + wq - 1) % e] - unknown[start - 1]
        if count >= aq:
            return False
    return True


def is_covered(
    known: Iterable[int] | Mapping[int, ReplyKind | None], e: int, wq: int, aq: int
) -> bool:
    """True if every write set (window of WQ consecutive indices mod E) has fewer than AQ unknowns.

    ``known`` is either the indices whose reply is known (OK or NoSuchEntry/NoSuchLedger), or a
    mapping index -> ReplyKind where UNKNOWN or None counts as unknown. Indices absent from it
    have not answered and are unknown. Never a plain count: with E=5, WQ=2, AQ=2 the known set
    {0, 2, 4} is covered while {0, 1, 2} is not.
    """
    check_quorum(e, wq, aq)
    return _covered(_unknown_flags(known, e), e, wq, aq)


class RRQuorumCoverageSet:
    """Mutable tracker of replies from the E bookies of an ensemble (readLAC / fencing).

    A later reply for the same index replaces the earlier one, as Java keeps the last rc.
    """

    __slots__ = ("_aq", "_e", "_unknown", "_wq")

    def __init__(self, e: int, wq: int, aq: int) -> None:
        check_quorum(e, wq, aq)
        self._e, self._wq, self._aq = e, wq, aq
        self._unknown = [True] * e

    def add(self, idx: int, kind: ReplyKind | None) -> None:
        """Record the reply of index ``idx`` (None = not answered)."""
        check_index(idx, self._e)
        self._unknown[idx] = kind is not ReplyKind.POSITIVE and kind is not ReplyKind.NEGATIVE

    def is_covered(self) -> bool:
        """True if no write set holds AQ or more unknown replies."""
        return _covered(self._unknown, self._e, self._wq, self._aq)

    def __repr__(self) -> str:
        known = [i for i, u in enumerate(self._unknown) if not u]
        return f"RRQuorumCoverageSet(E={self._e}, WQ={self._wq}, AQ={self._aq}, known={known})"


class RecoveryReadDecision(enum.Enum):
    """Outcome of one recovery read of one entry so far."""

    FOUND = "found"
    """A replica returned the entry: write it back."""
    ABSENT = "absent"
    """WQ - AQ + 1 replicas said NoSuchEntry/NoSuchLedger: the entry was never acknowledged."""
    UNKNOWN_FAIL = "unknown_fail"
    """All replicas answered without either: recovery must fail and the ledger stay IN_RECOVERY."""
    PENDING = "pending"
    """Not decided yet: wait for (or ask) the remaining replicas."""


def recovery_read_decision(
    replies: Sequence[ReplyKind | None], wq: int, aq: int
) -> RecoveryReadDecision:
    """Decide a recovery read from the replies of the entry's write set (None = not answered yet).

    FOUND on any positive reply; ABSENT as soon as negatives reach WQ - AQ + 1 (no waiting for the
    rest, so a zombie bookie cannot block recovery); UNKNOWN_FAIL when every member answered and
    neither holds; otherwise PENDING. Act on the first decision that is not PENDING.
    """
    check_quorum(wq, wq, aq)
    if len(replies) != wq:
        raise IncorrectParameterError(
            f"expected {wq} replies (one per write-set member), got {len(replies)}"
        )
    negatives = 0
    answered = 0
    for reply in replies:
        if reply is None:
            continue
        answered += 1
        if reply is ReplyKind.POSITIVE:
            return RecoveryReadDecision.FOUND
        if reply is ReplyKind.NEGATIVE:
            negatives += 1
    if negatives >= wq - aq + 1:
        return RecoveryReadDecision.ABSENT
    if answered == wq:
        return RecoveryReadDecision.UNKNOWN_FAIL
    return RecoveryReadDecision.PENDING


NO_REPLICA = Severity.NO_REPLICA
BELOW_AQ = Severity.BELOW_AQ
BELOW_WQ = Severity.BELOW_WQ


def classify_replicas(min_replicas: int, wq: int, aq: int) -> str | None:
    """Classify a ledger by the fewest replicas any of its entries has, as the replicas check does.

    0 -> "NO_REPLICA", fewer than AQ -> "BELOW_AQ", fewer than WQ -> "BELOW_WQ", else None.
    ``min_replicas`` is WQ minus the largest number of bookies missing one entry.
    """
    check_quorum(wq, wq, aq)
    if not 0 <= min_replicas <= wq:
        raise IncorrectParameterError(f"replica count {min_replicas} outside [0, WQ={wq}]")
    if min_replicas == 0:
        return NO_REPLICA
    if min_replicas < aq:
        return BELOW_AQ
    if min_replicas < wq:
        return BELOW_WQ
    return None
