"""The ledger metadata model, with the validation BookKeeper applies on every build and parse."""

from __future__ import annotations

import bisect
import dataclasses
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum

from bklib.errors import CorruptMetadataError

INVALID_ENTRY_ID = -1

# Java's regex is [a-zA-Z0-9:-_.\-]+ where ":-_" is the range 0x3A..0x5F, so ;<=>?@[\]^ pass too.
# Java's String.matches is a whole-string match: fullmatch, so "id\n" does not pass.
_BOOKIE_ID_RE = re.compile(r"[a-zA-Z0-9\x3a-\x5f.\-]+")


@functools.lru_cache(maxsize=16384)  # a cluster has few bookies, named in every ledger
def is_valid_bookie_id(bookie_id: str) -> bool:
    """True if BookKeeper's ``BookieId.validateBookieId`` would accept ``bookie_id``."""
    return bool(_BOOKIE_ID_RE.fullmatch(bookie_id)) and bookie_id.lower() != "readonly"


class LedgerState(IntEnum):
    """``LedgerMetadataFormat.State`` numbers."""

    OPEN = 1
    IN_RECOVERY = 2
    CLOSED = 3


class DigestType(IntEnum):
    """``LedgerMetadataFormat.DigestType`` numbers (the metadata numbering, not the API's)."""

    CRC32 = 1
    HMAC = 2
    CRC32C = 3
    DUMMY = 4


@dataclass(frozen=True, slots=True)
class Segment:
    """One ensemble: the bookies holding entries from ``first_entry_id`` until the next segment."""

    first_entry_id: int
    ensemble: tuple[str, ...]


def _is_plain_segment(s: object) -> bool:
    return type(s) is Segment and type(s.ensemble) is tuple


@dataclass(frozen=True)
class LedgerMetadata:
    """Ledger metadata as BookKeeper 4.17 stores it in ZooKeeper.

    ``last_entry_id`` and ``length`` are meaningful only when CLOSED; for OPEN and IN_RECOVERY
    they are -1 and 0, as BookKeeper keeps them in memory and writes them.
    ``ctime`` is the creation time in ms; ``store_ctime`` says whether it is written back
    (it is when the znode carried it, otherwise it came from the znode's Stat).
    ``format_version`` (1, 2 or 3) is the znode's format, kept across rewrites as BookKeeper
    keeps ``metadataFormatVersion``; v1 stores no ack quorum (it reads as the write quorum),
    password, digest type, ctime, custom metadata or cToken.
    """

    ledger_id: int
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    segments: tuple[Segment, ...]
    state: LedgerState = LedgerState.OPEN
    last_entry_id: int = INVALID_ENTRY_ID
    length: int = 0
    digest_type: DigestType | None = DigestType.CRC32C
    password: bytes | None = b""
    ctime: int | None = None
    store_ctime: bool = False
    custom_metadata: Mapping[str, bytes] = field(default_factory=dict)
    ctoken: int = 0
    format_version: int = 3

    def __post_init__(self) -> None:
        # Accept lists for convenience; keep the stored value immutable. The decoder already
        # hands over tuples of Segments of tuples: those are kept as they are (a scan makes
        # a million of these).
        if type(self.segments) is not tuple or not all(map(_is_plain_segment, self.segments)):
            segs = tuple(
                s if isinstance(s, Segment) else Segment(int(s[0]), tuple(s[1]))
                for s in self.segments
            )
            segs = tuple(Segment(s.first_entry_id, tuple(s.ensemble)) for s in segs)
            object.__setattr__(self, "segments", segs)
        if type(self.state) is not LedgerState:
            object.__setattr__(self, "state", LedgerState(self.state))
        if self.digest_type is not None and type(self.digest_type) is not DigestType:
            object.__setattr__(self, "digest_type", DigestType(self.digest_type))
        object.__setattr__(self, "custom_metadata", dict(self.custom_metadata))

    # ---- validation -------------------------------------------------------------------------

    def _corrupt(self, msg: str) -> CorruptMetadataError:
        return CorruptMetadataError(msg, ledger_id=self.ledger_id)

    def validate(self) -> LedgerMetadata:
        """Raise CorruptMetadataError if BookKeeper would reject this metadata; return self."""
        bad = self._corrupt
        if self.ledger_id < 0:
            raise bad(f"negative ledger id {self.ledger_id}")
        e, wq, aq = self.ensemble_size, self.write_quorum, self.ack_quorum
        if not (e >= wq >= aq >= 1):
            raise bad(
                f"need ensemble >= write quorum >= ack quorum >= 1, got E={e} WQ={wq} AQ={aq}"
            )
        self._validate_segments()
        if (self.password is None) != (self.digest_type is None):
            raise bad("password and digest type must be both present or both absent")
        if self.state != LedgerState.CLOSED and (
            self.last_entry_id != INVALID_ENTRY_ID or self.length != 0
        ):
            raise bad(f"{self.state.name} ledger must have lastEntryId -1 and length 0")
        if self.state == LedgerState.CLOSED and self.last_entry_id < INVALID_ENTRY_ID:
            raise bad(f"closed ledger with lastEntryId {self.last_entry_id}")
        if self.format_version not in (1, 2, 3):
            raise bad(f"unknown metadata format version {self.format_version}")
        return self

    def _validate_segments(self) -> None:
        """Ensembles: at least one, keys strictly increasing, each of ensemble size, every
        bookie id valid."""
        bad, e = self._corrupt, self.ensemble_size
        if not self.segments:
            raise bad("no ensembles")
        prev = None
        for seg in self.segments:
            if prev is not None and seg.first_entry_id <= prev:
                raise bad(
                    f"segment keys not strictly increasing: {seg.first_entry_id} after {prev}"
                )
            prev = seg.first_entry_id
            if len(seg.ensemble) != e:
                raise bad(
                    f"segment at entry {seg.first_entry_id} has {len(seg.ensemble)} bookies, "
                    f"ensemble size is {e}"
                )
            for b in seg.ensemble:
                if not is_valid_bookie_id(b):
                    raise bad(f"invalid bookie id {b!r} in segment at entry {seg.first_entry_id}")

    # ---- queries ----------------------------------------------------------------------------

    @property
    def is_closed(self) -> bool:
        return self.state == LedgerState.CLOSED

    @property
    def last_segment(self) -> Segment:
        return self.segments[-1]

    def segment_index_for(self, entry_id: int) -> int:
        """Index of the segment holding ``entry_id`` (the floor entry of the ensembles map)."""
        keys = [s.first_entry_id for s in self.segments]
        i = bisect.bisect_right(keys, entry_id) - 1
        return max(i, 0)

    def ensemble_for(self, entry_id: int) -> tuple[str, ...]:
        return self.segments[self.segment_index_for(entry_id)].ensemble

    def segment_last_entry_id(self, index: int, lac: int | None = None) -> int:
        """Last entry id covered by segment ``index``: :meth:`segment_ends`' rule."""
        return self.segment_ends(lac)[index]

    def segment_ends(self, lac: int | None = None) -> list[int]:
        """The last entry id each segment covers, in order.

        This is the one rule for segment ends; the audit and the repair both use it. A middle
        segment ends before the next one starts, and never past ``last_entry_id`` of a CLOSED
        ledger (nothing beyond it belongs to the ledger, even where an ensemble change was
        recorded above it). The last segment ends at ``last_entry_id`` when CLOSED, otherwise
        at ``lac`` (the caller's view of the LAC; -1 if unknown). An end may be below its
        segment's first entry id: an empty segment. No segments, no ends.
        """
        segs = self.segments
        if not segs:
            return []
        closed = self.state == LedgerState.CLOSED
        last = self.last_entry_id
        ends = []
        for following in segs[1:]:
            end = following.first_entry_id - 1
            ends.append(min(end, last) if closed else end)
        ends.append(last if closed else INVALID_ENTRY_ID if lac is None else lac)
        return ends

    def bookies(self) -> set[str]:
        """Every bookie named in any segment."""
        return {b for s in self.segments for b in s.ensemble}

    # ---- transforms (pure; callers CAS the result) --------------------------------------------

    def replace(self, **changes: object) -> LedgerMetadata:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def with_bookies_replaced(
        self, first_entry_id: int, mapping: Mapping[str, str]
    ) -> LedgerMetadata:
        """Re-replication's in-place rewrite: in the segment keyed ``first_entry_id`` map old
        bookies to new ones, keeping positions; cToken becomes 0 as in BookKeeper."""
        segs = []
        found = False
        for s in self.segments:
            if s.first_entry_id == first_entry_id:
                found = True
                s = Segment(s.first_entry_id, tuple(mapping.get(b, b) for b in s.ensemble))
            segs.append(s)
        if not found:
            raise CorruptMetadataError(
                f"no segment starts at entry {first_entry_id}", ledger_id=self.ledger_id
            )
        return self.replace(segments=tuple(segs), ctoken=0)

    def with_new_segment(self, first_entry_id: int, ensemble: tuple[str, ...]) -> LedgerMetadata:
        """Writer/recovery ensemble change: append a segment, or replace the last one when it
        already starts at ``first_entry_id``."""
        segs = list(self.segments)
        if first_entry_id < segs[-1].first_entry_id:
            raise CorruptMetadataError(
                f"new segment at {first_entry_id} below last segment {segs[-1].first_entry_id}",
                ledger_id=self.ledger_id,
            )
        if first_entry_id == segs[-1].first_entry_id:
            segs[-1] = Segment(first_entry_id, tuple(ensemble))
        else:
            segs.append(Segment(first_entry_id, tuple(ensemble)))
        return self.replace(segments=tuple(segs), ctoken=0)

    def closed(self, last_entry_id: int, length: int) -> LedgerMetadata:
        return self.replace(
            state=LedgerState.CLOSED, last_entry_id=last_entry_id, length=length, ctoken=0
        )
