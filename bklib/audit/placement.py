"""BookKeeper's placement rules, pure: does each write set of an ensemble span enough racks (or
zones), and which single replica move brings an ensemble closer to the rule.

The rules are those of BookKeeper's placement policies, as ``isEnsembleAdheringToPlacementPolicy``
states them (the Auditor's ``placementPolicyCheck`` calls it per segment of every closed ledger):

* ``RackawareEnsemblePlacementPolicyImpl`` (the policy Pulsar configures): for every write set
  (the WQ bookies at ensemble indices ``i, i+1, ... i+WQ-1`` modulo E, for each ``i`` in
  ``0..E-1``) the racks of its bookies, counting only bookies the policy knows, must number at
  least ``min(WQ, minNumRacksPerWriteQuorum)``; with ``enforceMinNumRacksPerWriteQuorum`` a write
  set may not use the default rack at all. An empty ensemble FAILs. The answer is FAIL or
  MEETS_STRICT.
* ``ZoneawareEnsemblePlacementPolicyImpl``: E must be a multiple of WQ and WQ above
  ``minNumZonesPerWriteQuorum``; a bookie in the default fault domain (or whose location is not
  ``/zone/upgradedomain``) FAILs; each write set needs ``minNumZonesPerWriteQuorum`` zones, and
  bookies sharing a zone in a write set must use at least two upgrade domains; a write set with
  fewer than ``min(WQ, desiredNumZonesPerWriteQuorum)`` zones only MEETS_SOFT.
  ``enforceStrictZoneawarePlacement`` changes how new ensembles are chosen, not this verdict.

Racks come from :class:`bklib.meta.racks.RackDocument`; a bookie without one is in BookKeeper's
default rack ``/default-rack``, reported as the "unknown" rack. The repair side
(:func:`best_moves`) is bkaudit's: one replica at a time, the move that most reduces the failing
write sets, where BookKeeper's ``replaceToAdherePlacementPolicy`` rebuilds the ensemble at once.
Nothing here does I/O.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bklib.audit.model import Finding, LedgerView
from bklib.meta.racks import DEFAULT_RACK
from bklib.quorum import stripe_count
from bklib.states import Reason

__all__ = [
    "DEFAULT_FAULT_DOMAIN",
    "DEFAULT_RACK",
    "ENSEMBLE_PLACEMENT_POLICY_CONFIG",
    "ISOLATED_POLICY_CLASS",
    "Adherence",
    "IsolationGroups",
    "IsolationPolicyError",
    "Move",
    "PlacementPolicyName",
    "PlacementRule",
    "RackResolver",
    "SegmentPlacement",
    "best_moves",
    "check_ensemble",
    "isolation_excluded",
    "isolation_groups",
    "placement_findings",
    "rack_resolver",
    "write_set_adherence",
]

DEFAULT_FAULT_DOMAIN = "/default-zone/default-upgradedomain"
"""``NetworkTopology.DEFAULT_ZONE_AND_UPGRADEDOMAIN``: the zone-aware policy's unresolved
location."""

ENSEMBLE_PLACEMENT_POLICY_CONFIG = "EnsemblePlacementPolicyConfig"
"""The ledger custom-metadata key Pulsar writes (``EnsemblePlacementPolicyConfig`` in
pulsar-common), a JSON ``{"policyClass": ..., "properties": {...}}``."""
ISOLATED_POLICY_CLASS = (
    "org.apache.pulsar.bookie.rackawareness.IsolatedBookieEnsemblePlacementPolicy"
)
ISOLATION_BOOKIE_GROUPS = "isolationBookieGroups"
SECONDARY_ISOLATION_BOOKIE_GROUPS = "secondaryIsolationBookieGroups"
ALL_GROUPS = "*"
"""Pulsar's ``PULSAR_SYSTEM_TOPIC_ISOLATION_GROUP``: no isolation."""

RackResolver = Callable[[str], "str | None"]
"""bookie id -> its network location (rack), or None for a bookie the policy does not know
(BookKeeper skips those when counting racks)."""


class Adherence:
    """``EnsemblePlacementPolicy.PlacementPolicyAdherence``."""

    FAIL = "FAIL"
    MEETS_SOFT = "MEETS_SOFT"
    MEETS_STRICT = "MEETS_STRICT"
    RANK = {FAIL: 0, MEETS_SOFT: 1, MEETS_STRICT: 2}
    """Worst first."""


class PlacementPolicyName:
    """``--placement-policy``."""

    RACKAWARE = "rackaware"
    ZONEAWARE = "zoneaware"
    ALL = (RACKAWARE, ZONEAWARE)


@dataclass(frozen=True)
class PlacementRule:
    """The policy and its settings, with BookKeeper's ``ClientConfiguration`` defaults."""

    policy: str = PlacementPolicyName.RACKAWARE
    min_racks_per_write_quorum: int = 2
    """``minNumRacksPerWriteQuorum``."""
    enforce_min_racks_per_write_quorum: bool = False
    """``enforceMinNumRacksPerWriteQuorum``: the default rack never counts as a rack."""
    min_zones_per_write_quorum: int = 2
    """``minNumZonesPerWriteQuorum`` (zone-aware)."""
    desired_zones_per_write_quorum: int = 3
    """``desiredNumZonesPerWriteQuorum`` (zone-aware)."""

    def __post_init__(self) -> None:
        if self.policy not in PlacementPolicyName.ALL:
            raise ValueError(f"placement policy {self.policy!r}: use {PlacementPolicyName.ALL}")

    @property
    def default_location(self) -> str:
        """Where a bookie without a rack is."""
        return (
            DEFAULT_FAULT_DOMAIN if self.policy == PlacementPolicyName.ZONEAWARE else DEFAULT_RACK
        )

    def describe(self) -> str:
        if self.policy == PlacementPolicyName.ZONEAWARE:
            return (
                f"zoneaware: minNumZonesPerWriteQuorum={self.min_zones_per_write_quorum}, "
                f"desiredNumZonesPerWriteQuorum={self.desired_zones_per_write_quorum}"
            )
        return (
            f"rackaware: minNumRacksPerWriteQuorum={self.min_racks_per_write_quorum}, "
            f"enforceMinNumRacksPerWriteQuorum={str(self.enforce_min_racks_per_write_quorum).lower()}"
        )


def rack_resolver(
    racks: Mapping[str, str], default: str = DEFAULT_RACK, known: Collection[str] | None = None
) -> RackResolver:
    """A resolver: the bookie's rack from ``racks``, else ``default``. With ``known``, bookies
    outside it resolve to None, as BookKeeper's ``knownBookies`` (its writable bookies) works;
    the audit passes None: every bookie the metadata names counts, lost or not (a lost bookie
    is reported as BOOKIE_LOST, and its rack is where its replicas were placed)."""
    known_set = None if known is None else frozenset(known)

    def resolve(bookie: str) -> str | None:
        if known_set is not None and bookie not in known_set:
            return None
        return racks.get(bookie, default)

    return resolve


# ---- the verdict ---------------------------------------------------------------------------------


def _write_set(ensemble: Sequence[str], start: int, wq: int) -> list[str]:
    """BookKeeper's loop ``ensembleList.get((i + j) % ensembleSize)`` for ``j < WQ``: it wraps
    even when WQ exceeds E (a bookie may then count twice, as a set it is one rack)."""
    n = len(ensemble)
    return [ensemble[(start + j) % n] for j in range(wq)]


def _zone_location(location: str | None, rule: PlacementRule) -> tuple[str, str] | None:
    """``/zone/upgradedomain`` -> (zone, ud); None when unresolved (default fault domain, not
    two parts, or unknown), as ``ZoneawareEnsemblePlacementPolicyImpl.getZoneAwareNodeLocation``."""
    if location is None or location == DEFAULT_FAULT_DOMAIN:
        return None
    parts = [p for p in location.split("/") if p]
    if len(parts) != 2:
        return None
    return "/" + parts[0], "/" + parts[1]


def write_set_adherence(bookies: Sequence[str], rule: PlacementRule, resolve: RackResolver) -> str:
    """The verdict on one write set (the ensemble-wide zone-aware conditions aside)."""
    if rule.policy == PlacementPolicyName.RACKAWARE:
        racks = {r for r in map(resolve, bookies) if r is not None}
        needed = min(len(bookies), rule.min_racks_per_write_quorum)
        if len(racks) < needed or (
            rule.enforce_min_racks_per_write_quorum and DEFAULT_RACK in racks
        ):
            return Adherence.FAIL
        return Adherence.MEETS_STRICT
    uds: dict[str, set[str]] = {}
    count: Counter[str] = Counter()
    for b in bookies:
        loc = _zone_location(resolve(b), rule)
        if loc is None:
            return Adherence.FAIL
        uds.setdefault(loc[0], set()).add(loc[1])
        count[loc[0]] += 1
    if len(count) < rule.min_zones_per_write_quorum:
        return Adherence.FAIL
    # validateMinUDsAreMaintained: bookies sharing a zone must use two upgrade domains.
    if any(n > 1 and len(uds[z]) < 2 for z, n in count.items()):
        return Adherence.FAIL
    desired = min(len(bookies), rule.desired_zones_per_write_quorum)
    return Adherence.MEETS_STRICT if len(count) >= desired else Adherence.MEETS_SOFT


@dataclass(frozen=True)
class SegmentPlacement:
    """The verdict on one ensemble: ``adherence`` (the worst write set's), the start indices of
    the write sets that FAIL, the racks each write set uses, and ``suspect``: the index a fix
    would move first (None when nothing fails)."""

    adherence: str
    failing: tuple[int, ...]
    set_racks: tuple[tuple[str, ...], ...]
    suspect: int | None
    detail: str

    @property
    def fails(self) -> bool:
        return self.adherence == Adherence.FAIL

    @property
    def score(self) -> tuple[int, int]:
        """Higher is better: (adherence rank, -failing write sets)."""
        return Adherence.RANK[self.adherence], -len(self.failing)


def check_ensemble(
    ensemble: Sequence[str], wq: int, rule: PlacementRule, resolve: RackResolver
) -> SegmentPlacement:
    """``isEnsembleAdheringToPlacementPolicy(ensemble, WQ, AQ)`` for ``rule``, with every failing
    write set listed (BookKeeper stops at the first)."""
    if not ensemble:
        return SegmentPlacement(Adherence.FAIL, (), (), None, "empty ensemble")
    n = len(ensemble)
    sets = [_write_set(ensemble, i, wq) for i in range(n)]
    set_racks = tuple(
        tuple(sorted({r if r is not None else "?" for r in map(resolve, s)})) for s in sets
    )
    whole: str | None = None
    if rule.policy == PlacementPolicyName.ZONEAWARE:
        if n % wq != 0:
            whole = f"ensemble size {n} is not a multiple of write quorum {wq}"
        elif wq <= rule.min_zones_per_write_quorum:
            whole = (
                f"write quorum {wq} is not above minNumZonesPerWriteQuorum "
                f"{rule.min_zones_per_write_quorum}"
            )
    if whole is not None:
        return SegmentPlacement(Adherence.FAIL, tuple(range(n)), set_racks, None, whole)
    verdicts = [write_set_adherence(s, rule, resolve) for s in sets]
    failing = tuple(i for i, v in enumerate(verdicts) if v == Adherence.FAIL)
    adherence = min(verdicts, key=lambda v: Adherence.RANK[v])
    if not failing:
        return SegmentPlacement(adherence, (), set_racks, None, "")
    suspect = _suspect(ensemble, wq, failing, resolve)
    shown = ", ".join(f"{list(sets[i])} on {list(set_racks[i])}" for i in failing[:3]) + (
        f" and {len(failing) - 3} more" if len(failing) > 3 else ""
    )
    detail = f"{len(failing)} of {n} write sets break {rule.describe()}: {shown}"
    return SegmentPlacement(adherence, failing, set_racks, suspect, detail)


def _suspect(
    ensemble: Sequence[str], wq: int, failing: Iterable[int], resolve: RackResolver
) -> int:
    """The index in the most failing write sets; ties: the one whose rack is most crowded in
    the ensemble, then the highest index (deterministic, so a finding keeps its bookie across
    runs)."""
    n = len(ensemble)
    hits: Counter[int] = Counter()
    for start in failing:
        for j in range(wq):
            hits[(start + j) % n] += 1
    crowd = Counter(resolve(b) for b in ensemble)
    return max(hits, key=lambda i: (hits[i], crowd[resolve(ensemble[i])], i))


# ---- the audit -----------------------------------------------------------------------------------


def placement_findings(
    view: LedgerView, rule: PlacementRule, resolve: RackResolver
) -> tuple[int, list[Finding]]:
    """(segments checked, one PLACEMENT_VIOLATION finding per FAILing segment) of a closed,
    readable ledger, as the Auditor's ``placementPolicyCheck`` checks only closed ledgers (an
    open ledger's writer may still change its last ensemble). The finding names the suspect
    bookie, its stripe size as ``expected_entries`` (what moving it would copy) and the failing
    write sets in ``error``."""
    if not view.ok or not view.is_closed or not view.segments or view.write_quorum is None:
        return 0, []
    e, wq = view.ensemble_size or 0, view.write_quorum
    out = []
    for si, seg in enumerate(view.segments):
        verdict = check_ensemble(seg.ensemble, wq, rule, resolve)
        if not verdict.fails:
            continue
        idx = verdict.suspect if verdict.suspect is not None else len(seg.ensemble) - 1
        last = seg.last_entry_id if seg.last_entry_id is not None else seg.first_entry_id - 1
        expected = (
            stripe_count(idx, seg.first_entry_id, last, e, wq) if last >= seg.first_entry_id else 0
        )
        out.append(
            Finding(
                ledger_id=view.ledger_id,
                segment_index=si,
                segment_first_entry_id=seg.first_entry_id,
                segment_last_entry_id=seg.last_entry_id,
                bookie_index=idx,
                bookie_id=seg.ensemble[idx],
                reason=Reason.PLACEMENT_VIOLATION,
                expected_entries=expected,
                ledger_state=view.state,
                ensemble_size=view.ensemble_size,
                write_quorum=view.write_quorum,
                ack_quorum=view.ack_quorum,
                error=verdict.detail,
            )
        )
    return len(view.segments), out


# ---- the repair ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Move:
    """Replace ``old`` at ``index`` by ``new``; ``before`` and ``after`` are the verdicts."""

    index: int
    old: str
    new: str
    before: SegmentPlacement
    after: SegmentPlacement


def best_moves(
    ensemble: Sequence[str],
    wq: int,
    rule: PlacementRule,
    resolve: RackResolver,
    candidates: Iterable[str],
) -> list[Move]:
    """Every single-replica move with the best resulting verdict, when that is strictly better
    than the current one (higher adherence, else fewer failing write sets); [] when the
    ensemble adheres or no move helps (e.g. E=3, WQ=2 over two racks can never adhere).
    ``candidates`` are the bookies allowed to receive a replica (writable, in the ledger's
    isolation groups); bookies of the ensemble are never candidates."""
    before = check_ensemble(ensemble, wq, rule, resolve)
    if not before.failing and before.adherence == Adherence.MEETS_STRICT:
        return []
    members = set(ensemble)
    pool = sorted({c for c in candidates if c not in members})
    best: list[Move] = []
    best_score = before.score
    for index, old in enumerate(ensemble):
        for new in pool:
            trial = list(ensemble)
            trial[index] = new
            after = check_ensemble(trial, wq, rule, resolve)
            if after.score > best_score:
                best_score, best = after.score, []
            if after.score == best_score and after.score > before.score:
                best.append(Move(index, old, new, before, after))
    return best


# ---- Pulsar's bookie isolation -------------------------------------------------------------------


class IsolationPolicyError(ValueError):
    """A ledger's ``EnsemblePlacementPolicyConfig`` that bkaudit cannot honour (unparseable, or a
    policy class other than Pulsar's isolation policy): its replicas are not moved."""


@dataclass(frozen=True)
class IsolationGroups:
    """The isolation groups a ledger's custom metadata names (Pulsar's
    ``IsolatedBookieEnsemblePlacementPolicy``)."""

    primary: frozenset[str]
    secondary: frozenset[str] = frozenset()


def isolation_groups(custom_metadata: Mapping[str, bytes]) -> IsolationGroups | None:
    """The groups of the ledger's ``EnsemblePlacementPolicyConfig``; None when it names none.

    Raises IsolationPolicyError for a value that is not the JSON Pulsar writes, or that names
    another policy class (fail closed: its constraints are unknown here)."""
    raw = custom_metadata.get(ENSEMBLE_PLACEMENT_POLICY_CONFIG)
    if raw is None:
        return None
    try:
        doc: Any = json.loads(bytes(raw).decode())
    except (ValueError, UnicodeDecodeError) as exc:
        raise IsolationPolicyError(
            f"custom metadata {ENSEMBLE_PLACEMENT_POLICY_CONFIG} is not JSON: {exc}"
        ) from exc
    if not isinstance(doc, dict):
        raise IsolationPolicyError(
            f"custom metadata {ENSEMBLE_PLACEMENT_POLICY_CONFIG} is not an object"
        )
    cls = doc.get("policyClass")
    if cls != ISOLATED_POLICY_CLASS:
        raise IsolationPolicyError(
            f"custom metadata {ENSEMBLE_PLACEMENT_POLICY_CONFIG} names policy {cls!r}, "
            "which bkaudit does not implement"
        )
    props = doc.get("properties") or {}
    if not isinstance(props, dict):
        raise IsolationPolicyError(
            f"{ENSEMBLE_PLACEMENT_POLICY_CONFIG}.properties is not an object"
        )

    def groups(key: str) -> frozenset[str]:
        value = props.get(key) or ""
        # Pulsar's castToString: a list joins with ",", anything else is its string form.
        text = ",".join(map(str, value)) if isinstance(value, list) else str(value)
        return frozenset(g for g in text.split(",") if g)

    return IsolationGroups(
        groups(ISOLATION_BOOKIE_GROUPS), groups(SECONDARY_ISOLATION_BOOKIE_GROUPS)
    )


def isolation_excluded(
    groups: IsolationGroups | None,
    document: Mapping[str, frozenset[str]],
    writable: Collection[str],
    ensemble_size: int,
) -> frozenset[str]:
    """Bookies the ledger's isolation policy forbids, as Pulsar's
    ``IsolatedBookieEnsemblePlacementPolicy.getBlacklistedBookiesWithIsolationGroups``:
    everything outside the primary groups (grouped elsewhere or ungrouped writable bookies);
    the secondary groups too when the primary groups have fewer than E writable bookies; and
    the ungrouped bookies too when primary and secondary together have fewer than E.
    ``document`` is the rack document's group -> bookies (empty: no isolation possible)."""
    if groups is None or not document or ALL_GROUPS in groups.primary:
        return frozenset()
    writable_set = set(writable)
    excluded: set[str] = set()
    primary_bookies: set[str] = set()
    for group, bookies in document.items():
        if group in groups.primary:
            primary_bookies |= bookies
        else:
            excluded |= bookies
    other_group_bookies = set(excluded)
    non_region = writable_set - primary_bookies
    excluded |= non_region
    excluded -= primary_bookies  # a bookie listed in a primary group and elsewhere stays allowed
    available = len(primary_bookies & writable_set)
    if available < ensemble_size:
        for group in groups.secondary:
            members = document.get(group, frozenset())
            excluded -= members
            available += len(members)  # Pulsar counts the secondary's listed bookies
    if available < ensemble_size:
        excluded -= non_region - other_group_bookies
    return frozenset(excluded)
