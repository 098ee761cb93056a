"""A bookie's storage computed from the scale plan, for the bookie farm.

What the farm's identity holds of a planned ledger is computed from the plan on each request:
the entries its write sets gave it, minus the damage list. Bodies are computed the same way
(bklib.testing.scale.plan). What is written to it (recovery adds of a fencing recovery, the
copies of a repair, fences, explicit LACs) goes to a small overlay kept in memory and in a
journal shared by every identity of the farm, so adds are acknowledged after an fsync as a
real bookie's are. The farm does not replay that journal: a restarted farm starts from the plan.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any

from bklib.bookie.journal import Journal
from bklib.bookie.storage import LedgerState, Storage
from bklib.testing.scale.plan import MASTER_KEY, LedgerPlan, ScalePlan

# The journal location of an entry computed from the plan (real locations are >= 0).
PLANNED = -1
# Planned ledgers a farm keeps built: more than a sampled check keeps in flight
# (bklib.audit.checker.SAMPLED_LEDGERS_IN_FLIGHT), so each is built once while it is read.
PLANS_CACHED = 8192

LedgerLookup = Callable[[int], LedgerPlan | None]


def shared_plans(plan: ScalePlan) -> LedgerLookup:
    """A cache of planned ledgers for every identity of a farm: a ledger's bookies all ask
    for it, and building it (and its placement) was most of the farm's remaining cost
    (docs/benchmarks.md, "The farm's shared plans")."""
    return lru_cache(maxsize=PLANS_CACHED)(plan.by_id)


class PlannedLedgers(dict[int, LedgerState]):
    """The ledgers one identity holds: those written to (kept), then those the plan gives
    it (computed on each lookup, so a million ledgers cost nothing)."""

    def __init__(self, storage: PlannedStorage) -> None:
        super().__init__()
        self.storage = storage

    def get(self, ledger_id: int, default: Any = None) -> Any:
        state = dict.get(self, ledger_id)
        if state is None:
            state = self.storage.planned_state(ledger_id)
        return default if state is None else state


class PlannedStorage(Storage):
    """One farm identity's storage: the plan, the damage list and the overlay. ``plans`` is
    the farm's cache of planned ledgers, shared by its identities (one of its own if None)."""

    def __init__(
        self,
        plan: ScalePlan,
        bookie_id: str,
        journal: Journal,
        data_dir: Path,
        damage: Collection[tuple[int, int]] = (),
        plans: LedgerLookup | None = None,
    ) -> None:
        # Not Storage.__init__: no directory lock or journal of its own (the farm owns them).
        self.data_dir = data_dir
        self.name = bookie_id
        self.journal = journal
        self.plan = plan
        self.bookie_id = bookie_id
        self.damage: set[tuple[int, int]] = set(damage)
        self.ledgers: dict[int, LedgerState] = PlannedLedgers(self)
        self._ledger = plans if plans is not None else shared_plans(plan)
        # A sampled check asks an identity for a ledger's entries one read at a time; each
        # lookup computed its state again, the farm's largest cost (docs/benchmarks.md, "The
        # sample check across ledgers"). Damage clears it (delete_entries).
        self._state = lru_cache(maxsize=2048)(self._compute_state)
        self.entries_read = 0
        """Entries this identity has served (single and batch reads): a bench's unit of work."""

    def lock(self) -> None:
        """The farm holds its directory's lock."""

    def ledger_plan(self, ledger_id: int) -> LedgerPlan | None:
        """The planned ledger (cached: a check reads several entries of one ledger)."""
        return self._ledger(ledger_id)

    def planned_state(self, ledger_id: int) -> LedgerState | None:
        """What the plan left on this identity of ``ledger_id``; None when nothing (a real
        bookie that was never written an entry of a ledger does not know it). Cached: a state
        that is written to joins the overlay, which lookups see first."""
        return self._state(ledger_id)

    def _compute_state(self, ledger_id: int) -> LedgerState | None:
        plan = self.ledger_plan(ledger_id)
        if plan is None:
            return None
        entries = [e for e in plan.entries_on(self.bookie_id) if (ledger_id, e) not in self.damage]
        if not entries:
            return None
        state = LedgerState(ledger_id, MASTER_KEY)
        state.entries = dict.fromkeys(entries, PLANNED)
        state.max_entry = entries[-1]
        state.lac = entries[-1] - 1  # what the last entry it was written piggybacks
        return state

    def handle(self, ledger_id: int, master_key: bytes) -> LedgerState:
        """As Storage.handle; a planned ledger first joins the overlay with its planned entries."""
        if dict.get(self.ledgers, ledger_id) is None:
            state = self.planned_state(ledger_id)
            if state is not None:
                self.ledgers[ledger_id] = state
        return super().handle(ledger_id, master_key)

    def add_entry(self, state: LedgerState, entry_id: int, body: bytes) -> int:
        """As Storage.add_entry; a planned ledger's state joins the overlay on its first add
        (a lookup computes a fresh one, which would forget the entry)."""
        if dict.get(self.ledgers, state.ledger_id) is not state:
            dict.__setitem__(self.ledgers, state.ledger_id, state)
        return super().add_entry(state, entry_id, body)

    def read_from(self, state: LedgerState, entry_id: int) -> bytes:
        """As Storage.read_from; planned entries are computed."""
        self.entries_read += 1
        eid = state.max_entry if entry_id == -1 else entry_id
        if state.entries.get(eid) == PLANNED:
            plan = self.ledger_plan(state.ledger_id)
            assert plan is not None
            return plan.entry_body(eid)
        return super().read_from(state, entry_id)

    def delete_entries(self, ledger_id: int, entry_ids: Iterable[int]) -> tuple[list[int], int]:
        """Damage: forget entries of this identity (planned or copied)."""
        state = self.ledgers.get(ledger_id)
        present = [] if state is None else [e for e in entry_ids if e in state.entries]
        self.damage.update((ledger_id, e) for e in present)
        self._state.cache_clear()  # the planned states no longer hold what was damaged
        if dict.get(self.ledgers, ledger_id) is not None:
            return super().delete_entries(ledger_id, present)
        return present, self.journal.synced_seq
