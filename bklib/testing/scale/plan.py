"""The scale harness's cluster as a pure function of a seed and a ledger's index.

Which ledgers exist, their ensembles, quorums, segments, state, entries and Pulsar metadata
are computed, not stored: the seeder writes this plan to the metadata store, and the bookie
farm serves each ledger's entries from the same plan, so a million ledgers cost neither of
them memory. Shapes follow what Pulsar writes (docs/scale.md):

- E3/W2/A2 for most ledgers, some E2/W2/A2 and E5/W3/A2;
- one to four segments; 80% closed, the rest open (a broker that died mid-ledger);
- Pulsar's custom metadata for ``topics`` topics over several tenants and namespaces;
- ids below 2^31 (hierarchical layout) and a tenth above (long hierarchical).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property

from bklib.digest import DigestManager, digest_manager, master_key
from bklib.meta.model import DigestType, LedgerMetadata, LedgerState, Segment
from bklib.meta.paths import SHORT_ID_LIMIT
from bklib.quorum import has_entry, write_set

__all__ = ["PASSWORD", "PAYLOAD_SIZE", "LedgerPlan", "ScalePlan"]

PASSWORD = b"bkaudit-scale"
MASTER_KEY = master_key(PASSWORD)
PAYLOAD_SIZE = 64
# (E, WQ, AQ) and its weight out of 100.
SHAPES: tuple[tuple[tuple[int, int, int], int], ...] = (
    ((3, 2, 2), 80),
    ((2, 2, 2), 15),
    ((5, 3, 2), 5),
)
CLOSED_PERCENT = 80
LONG_ID_PERCENT = 10
FIRST_SHORT_ID = 1
FIRST_LONG_ID = SHORT_ID_LIMIT + 7
TENANTS = 5
NAMESPACES_PER_TENANT = 4
_MASK = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64's finaliser: a well-spread 64-bit hash of ``x``."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


class _Draws:
    """Deterministic draws for one ledger."""

    def __init__(self, seed: int, index: int) -> None:
        self.state = _mix(seed * 0x100000001B3 ^ index)

    def below(self, n: int) -> int:
        self.state = _mix(self.state)
        return self.state % n


@dataclass(frozen=True)
class LedgerPlan:
    """One planned ledger: its metadata as written, and how many entries each segment holds
    (an open ledger's last segment included: its writer wrote them before it died)."""

    index: int
    metadata: LedgerMetadata
    entries: int  # entries 0..entries-1 were written

    @property
    def ledger_id(self) -> int:
        return self.metadata.ledger_id

    def holds(self, bookie: str, entry_id: int) -> bool:
        """Whether ``bookie`` was written ``entry_id`` (before any damage)."""
        if not 0 <= entry_id < self.entries:
            return False
        md = self.metadata
        ensemble = md.ensemble_for(entry_id)
        if bookie not in ensemble:
            return False
        return has_entry(entry_id, ensemble.index(bookie), md.ensemble_size, md.write_quorum)

    def entries_on(self, bookie: str) -> list[int]:
        """The entries ``bookie`` was written, in order."""
        return list(self.placement.get(bookie, ()))  # a copy: the placement is shared

    @cached_property
    def placement(self) -> dict[str, list[int]]:
        """Each bookie's entries, in order, from one pass over the write sets (the farm asks
        for every bookie of a ledger, so one pass beats one :meth:`holds` per entry and bookie).
        """
        md = self.metadata
        out: dict[str, list[int]] = {}
        for entry_id in range(self.entries):
            ensemble = md.ensemble_for(entry_id)
            for idx in write_set(entry_id, md.ensemble_size, md.write_quorum):
                out.setdefault(ensemble[idx], []).append(entry_id)
        return out

    @cached_property
    def digest(self) -> DigestManager:
        """The writer's digest manager (one per ledger: it carries the ledger's key)."""
        md = self.metadata
        assert md.digest_type is not None
        return digest_manager(md.ledger_id, md.digest_type, PASSWORD)

    def entry_body(self, entry_id: int) -> bytes:
        """The entry as its writer sent it: header, digest and a payload derived from the id
        (the LAC it carries is the entry before it, as a pipelined writer's)."""
        return self.digest.package_entry(
            entry_id,
            entry_id - 1,
            (entry_id + 1) * PAYLOAD_SIZE,
            payload(self.metadata.ledger_id, entry_id),
        )


def payload(ledger_id: int, entry_id: int) -> bytes:
    """A PAYLOAD_SIZE payload that names its entry, so a misplaced copy is visible."""
    head = f"{ledger_id}:{entry_id}:".encode()
    return (head * (PAYLOAD_SIZE // len(head) + 1))[:PAYLOAD_SIZE]


@dataclass(frozen=True)
class ScalePlan:
    """``ledgers`` Pulsar-like ledgers over ``bookies``, from ``seed``."""

    ledgers: int
    bookies: tuple[str, ...]
    seed: int = 1
    topics: int = 2000
    max_entries_per_segment: int = 12

    def __post_init__(self) -> None:
        # A segment after the first replaces one bookie of the widest ensemble with one
        # outside it, so there must be one more bookie than that ensemble holds.
        need = max(e for (e, _, _), _ in SHAPES) + 1
        if len(self.bookies) < need:
            raise ValueError(f"a scale plan needs at least {need} bookies, not {len(self.bookies)}")

    @property
    def short_ledgers(self) -> int:
        return self.ledgers - self.ledgers * LONG_ID_PERCENT // 100

    def ledger_id(self, index: int) -> int:
        """The id of the ``index``-th ledger: short ids first, then long ones."""
        if index < self.short_ledgers:
            return FIRST_SHORT_ID + index
        return FIRST_LONG_ID + index - self.short_ledgers

    def index_of(self, ledger_id: int) -> int | None:
        """The index of a planned ledger id; None when the plan has no such ledger."""
        if FIRST_SHORT_ID <= ledger_id < FIRST_SHORT_ID + self.short_ledgers:
            return ledger_id - FIRST_SHORT_ID
        index = ledger_id - FIRST_LONG_ID + self.short_ledgers
        if ledger_id >= FIRST_LONG_ID and index < self.ledgers:
            return index
        return None

    def ledger(self, index: int) -> LedgerPlan:
        """The ``index``-th ledger (0 <= index < ledgers)."""
        d = _Draws(self.seed, index)
        e, wq, aq = _shape(d.below(100))
        ensemble = self._ensemble(d, e)
        segments = [Segment(0, tuple(ensemble))]
        first = 0
        for _ in range(d.below(4)):  # up to three ensemble changes
            first += 1 + d.below(self.max_entries_per_segment)
            ensemble = self._replace_one(d, ensemble)
            segments.append(Segment(first, tuple(ensemble)))
        entries = first + 1 + d.below(self.max_entries_per_segment)
        closed = d.below(100) < CLOSED_PERCENT
        lid = self.ledger_id(index)
        md = LedgerMetadata(
            ledger_id=lid,
            ensemble_size=e,
            write_quorum=wq,
            ack_quorum=aq,
            segments=tuple(segments),
            state=LedgerState.CLOSED if closed else LedgerState.OPEN,
            last_entry_id=entries - 1 if closed else -1,
            length=entries * PAYLOAD_SIZE if closed else 0,
            digest_type=DigestType.CRC32C,
            password=PASSWORD,
            ctime=1_700_000_000_000 + index,
            store_ctime=True,
            custom_metadata=self._pulsar_metadata(d),
        )
        return LedgerPlan(index, md, entries)

    def by_id(self, ledger_id: int) -> LedgerPlan | None:
        """The planned ledger with this id, or None."""
        index = self.index_of(ledger_id)
        return None if index is None else self.ledger(index)

    def __iter__(self) -> Iterator[LedgerPlan]:
        return (self.ledger(i) for i in range(self.ledgers))

    def segments_naming(self, bookie: str) -> set[tuple[int, int]]:
        """``(ledger id, first entry)`` of every segment whose ensemble names ``bookie``:
        what the lost check must report once ``bookie`` is gone."""
        return {
            (lp.ledger_id, s.first_entry_id)
            for lp in self
            for s in lp.metadata.segments
            if bookie in s.ensemble
        }

    def _ensemble(self, d: _Draws, size: int) -> list[str]:
        chosen: list[str] = []
        while len(chosen) < size:
            b = self.bookies[d.below(len(self.bookies))]
            if b not in chosen:
                chosen.append(b)
        return chosen

    def _replace_one(self, d: _Draws, ensemble: Sequence[str]) -> list[str]:
        out = list(ensemble)
        slot = d.below(len(out))
        while True:
            b = self.bookies[d.below(len(self.bookies))]
            if b not in out:
                out[slot] = b
                return out

    def _pulsar_metadata(self, d: _Draws) -> dict[str, bytes]:
        topic = d.below(self.topics)
        tenant = f"tenant-{topic % TENANTS}"
        namespace = f"ns-{(topic // TENANTS) % NAMESPACES_PER_TENANT}"
        name = f"{tenant}/{namespace}/persistent/topic-{topic}"
        custom = {
            "application": b"pulsar",
            "component": b"managed-ledger",
            "pulsar/managed-ledger": name.encode(),
        }
        if d.below(10) == 0:  # a cursor's ledger
            custom["pulsar/cursor"] = f"sub-{d.below(3)}".encode()
        return custom


def _shape(percentile: int) -> tuple[int, int, int]:
    for shape, weight in SHAPES:
        if percentile < weight:
            return shape
        percentile -= weight
    raise AssertionError("SHAPES weights must add up to 100")
