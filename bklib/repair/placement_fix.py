"""Moving replicas to satisfy the placement rule (``rereplicate --fix-placement``).

A placement violation loses no data: every replica may be present, but some write set sits in
too few racks (:mod:`bklib.audit.placement`). The fix takes the safe path of every repair
(docs/repair.md): for one replica at a time, the move that most reduces the failing write sets
(:func:`~bklib.audit.placement.best_moves`) is made by copying that position's stripe to the
new bookie with the recovery-add flag (docs/safety-rules.md rule 7), then rewriting the segment
in place by compare-and-set (rule 10). The old bookie keeps its copy; once the metadata points
elsewhere it is garbage its GC reclaims, as after any BookKeeper re-replication. Then the
metadata is re-read and the next move chosen, until the segment adheres or no move helps.

Only CLOSED ledgers are touched (the audit flags only those): a closed ledger's ensembles never
change except by repairs, and those take the same ledger lock (``underreplication/locks``),
which this takes too, without publishing an under-replication mark (the ledger is not
under-replicated, and a Java ReplicationWorker must not be sent to it).

Replacement candidates are writable bookies outside the ensemble, not excluded, and allowed by
the ledger's Pulsar isolation policy when its custom metadata names one
(``EnsemblePlacementPolicyConfig``, see :func:`~bklib.audit.placement.isolation_excluded`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from bklib.audit.placement import (
    IsolationGroups,
    IsolationPolicyError,
    Move,
    PlacementRule,
    best_moves,
    check_ensemble,
    isolation_excluded,
    isolation_groups,
    rack_resolver,
)
from bklib.errors import BKError
from bklib.meta.model import LedgerMetadata
from bklib.meta.racks import RackDocument
from bklib.meta.store import Versioned
from bklib.repair.actions import Action, describe, replace_in_segment
from bklib.repair.context import RepairContext
from bklib.repair.plan import FragmentWork, stripe_entries
from bklib.repair.requests import LedgerRequest
from bklib.states import ActionKind, ActionStatus

__all__ = ["fix_placement"]

log = logging.getLogger(__name__)


def _action(lid: int, kind: str, status: str, first: int | None = None, **kw: Any) -> Action:
    return Action(lid, kind, status, first, **kw)


def fix_placement(r: RepairContext, req: LedgerRequest, md: LedgerMetadata) -> list[Action]:
    """Fix the placement of ``req.placement_segments`` (segment first entry ids) of one ledger
    whose metadata ``md`` the repairer has just read (after its disable-flag check); never
    raises for a per-ledger problem (it becomes a row)."""
    lid, s = req.ledger_id, r.settings
    rule = s.placement_rule or PlacementRule()
    if r.rack_document is None:
        return [
            _action(
                lid, ActionKind.SKIP, ActionStatus.FAILED, error="no racks known: nothing to fix"
            ).finish()
        ]
    if not md.is_closed:
        return [
            _action(
                lid,
                ActionKind.SKIP,
                ActionStatus.SKIPPED,
                error=f"ledger is {md.state.name}: placement is fixed on closed ledgers only",
            ).finish()
        ]
    try:
        groups = isolation_groups(md.custom_metadata)
    except IsolationPolicyError as exc:
        return [_action(lid, ActionKind.SKIP, ActionStatus.FAILED, error=str(exc)).finish()]
    if s.dry_run:
        return _plan(r, req, md, rule, r.rack_document, groups)
    lock = r.urm.try_acquire(lid)
    if lock is None:
        holder = r.urm.lock_holder(lid)
        return [
            _action(
                lid, ActionKind.SKIP, ActionStatus.LOCKED, error=f"lock held by {holder}"
            ).finish()
        ]
    try:
        return _fix_locked(r, req, rule, r.rack_document, groups)
    finally:
        r.urm.release(lock)


def _candidates(
    r: RepairContext, md: LedgerMetadata, doc: RackDocument, groups: IsolationGroups | None
) -> set[str]:
    reg = r.registry()
    allowed = set(reg.writable) - set(r.settings.exclude)
    allowed -= isolation_excluded(groups, doc.groups, reg.writable, md.ensemble_size)
    if r.settings.target is not None:
        allowed &= {r.settings.target}
    return allowed


def _pick(r: RepairContext, moves: Sequence[Move]) -> Move:
    """The least loaded new bookie (as replacements spread), then the suspect-most index."""
    with r.choosing() as chooser:
        # preference_key's rack term is for choose(); here best_moves already weighed racks.
        move = min(moves, key=lambda m: (chooser.preference_key(m.new)[1:], -m.index))
    return move


def _segment(md: LedgerMetadata, first: int) -> tuple[int, tuple[str, ...]] | None:
    for si, seg in enumerate(md.segments):
        if seg.first_entry_id == first:
            return si, tuple(seg.ensemble)
    return None


def _no_move(lid: int, first: int, last: int, why: str) -> Action:
    return _action(
        lid, ActionKind.COPY, ActionStatus.FAILED, first, segment_last_entry_id=last, error=why
    ).finish()


def _stuck(before: str, candidates: set[str]) -> str:
    return (
        f"no single move to a writable bookie in another rack improves the placement "
        f"({before}; {len(candidates)} candidate bookies)"
    )


def _plan(
    r: RepairContext,
    req: LedgerRequest,
    md: LedgerMetadata,
    rule: PlacementRule,
    doc: RackDocument,
    groups: IsolationGroups | None,
) -> list[Action]:
    """``--dry-run``: the moves that would be made, simulated on a copy of each ensemble."""
    resolve = rack_resolver(doc.racks, rule.default_location)
    candidates = _candidates(r, md, doc, groups)
    per_entry = md.length / (md.last_entry_id + 1) if md.length and md.last_entry_id >= 0 else 0.0
    out: list[Action] = []
    for first in sorted(req.placement_segments):
        found = _segment(md, first)
        if found is None:
            continue
        si, ensemble = found
        last = md.segment_last_entry_id(si)
        current = list(ensemble)
        for _ in range(len(ensemble)):
            if not check_ensemble(current, md.write_quorum, rule, resolve).fails:
                break
            moves = best_moves(current, md.write_quorum, rule, resolve, candidates)
            if not moves:
                before = check_ensemble(current, md.write_quorum, rule, resolve).detail
                out.append(_no_move(md.ledger_id, first, last, _stuck(before, candidates)))
                break
            m = _pick(r, moves)
            frag = FragmentWork(si, first, last, tuple(current), {m.index: m.old}, True)
            n = stripe_entries(md, frag, m.index)
            out.append(
                _action(
                    md.ledger_id,
                    ActionKind.COPY,
                    ActionStatus.PLANNED,
                    first,
                    segment_last_entry_id=last,
                    old_bookie=m.old,
                    new_bookie=m.new,
                    entries_copied=n,
                    bytes_copied=int(n * per_entry),
                ).finish()
            )
            current[m.index] = m.new
    return out


def _fix_locked(
    r: RepairContext,
    req: LedgerRequest,
    rule: PlacementRule,
    doc: RackDocument,
    groups: IsolationGroups | None,
) -> list[Action]:
    lid = req.ledger_id
    resolve = rack_resolver(doc.racks, rule.default_location)
    out: list[Action] = []
    current: Versioned[LedgerMetadata] = r.store.read_ledger(lid)
    for first in sorted(req.placement_segments):
        for step in range(current.value.ensemble_size + 1):
            md = current.value
            found = _segment(md, first)
            if found is None:
                out.append(
                    _action(
                        lid, ActionKind.SKIP, ActionStatus.SKIPPED, first, error="segment gone"
                    ).finish()
                )
                break
            si, ensemble = found
            last = md.segment_last_entry_id(si)
            verdict = check_ensemble(ensemble, md.write_quorum, rule, resolve)
            if not verdict.fails:
                if step == 0:
                    out.append(
                        _action(
                            lid,
                            ActionKind.SKIP,
                            ActionStatus.SKIPPED,
                            first,
                            segment_last_entry_id=last,
                            error="segment already adheres to the placement rule",
                        ).finish()
                    )
                break
            candidates = _candidates(r, md, doc, groups)
            moves = best_moves(ensemble, md.write_quorum, rule, resolve, candidates)
            if not moves:
                out.append(_no_move(lid, first, last, _stuck(verdict.detail, candidates)))
                break
            m = _pick(r, moves)
            acts, current_or_none = _move(r, md, current, si, first, last, ensemble, m)
            out += acts
            if current_or_none is None:
                break
            current = current_or_none
    return out


def _move(
    r: RepairContext,
    md: LedgerMetadata,
    current: Versioned[LedgerMetadata],
    si: int,
    first: int,
    last: int,
    ensemble: tuple[str, ...],
    m: Move,
) -> tuple[list[Action], Versioned[LedgerMetadata] | None]:
    """Copy position ``m.index``'s stripe to ``m.new``, then swap it in by CAS. Returns the
    actions and the metadata as written (None: stop this segment)."""
    lid = md.ledger_id
    started = datetime.now(timezone.utc)
    frag = FragmentWork(si, first, last, ensemble, {m.index: m.old}, True)
    reg = r.registry()
    dead = {b for b in ensemble if not reg.is_available(b)}
    pwd, dt = r.credentials(md)
    with r.choosing() as chooser:
        chooser.assigned[m.new] = chooser.assigned.get(m.new, 0) + max(
            stripe_entries(md, frag, m.index), 1
        )
    copy = _action(
        lid,
        ActionKind.COPY,
        ActionStatus.DONE,
        first,
        segment_last_entry_id=last,
        old_bookie=m.old,
        new_bookie=m.new,
        started_at=started,
    )
    try:
        result = r.copy_entries(md, frag, {m.index: m.new}, dead, pwd, dt)
    except BKError as exc:
        copy.status, copy.error = ActionStatus.FAILED, describe(exc)
        return [copy.finish()], None
    n, nbytes = result.per_target.get(m.new, [0, 0])
    copy.entries_copied, copy.bytes_copied = n, nbytes
    if result.no_replica:  # never swap away from the only bookie that may hold them
        copy.status, copy.no_replica_entries = ActionStatus.NO_REPLICA, list(result.no_replica)
        copy.error = f"{len(result.no_replica)} entries have no surviving replica"
        return [copy.finish()], None
    update = _action(
        lid,
        ActionKind.METADATA_UPDATE,
        ActionStatus.DONE,
        first,
        segment_last_entry_id=last,
        old_bookie=m.old,
        new_bookie=m.new,
    )
    try:
        written = r.store.update_ledger(
            lid, replace_in_segment(first, {m.old: m.new}), current=current
        )
    except BKError as exc:
        update.status, update.error = ActionStatus.FAILED, describe(exc)
        return [copy.finish(), update.finish()], None
    log.info(
        "ledger %d segment %d: placement move %s -> %s at index %d (%s -> %s)",
        lid,
        first,
        m.old,
        m.new,
        m.index,
        m.before.adherence,
        m.after.adherence,
    )
    return [copy.finish(), update.finish()], written
