"""Repairing one ledger at a time: what a re-replication task does per ledger.

:class:`LedgerRepairer` follows BookKeeper's ReplicationWorker and
``BookKeeperAdmin.recoverBookieData``, with ``ZkLedgerUnderreplicationManager``'s marks and locks
(docs/repair.md; docs/safety-rules.md rules 7 and 10-12), in this order:

1. honour ``underreplication/disable``; publish the ledger's ``urL`` mark (merging, as the
   Auditor does) and take its ephemeral lock, so neither a Java ReplicationWorker nor another
   copy of this job works on it meanwhile;
2. re-read the metadata; segments that no longer name the bad bookie are already repaired;
3. a fragment that is still open (last segment of a ledger not CLOSED, or a middle segment
   ending above the LAC) is fenced and closed by ledger recovery only once the grace period
   has passed and the writer made no progress; otherwise it waits (WAITING_GRACE);
4. replacements: writable, not in the segment, load spread across the task's choices;
5. the replaced positions' stripes are copied with the recovery-add flag (see
   :mod:`bklib.client.replicator`);
6. the segment is rewritten in place by compare-and-set, re-applied on conflict.

When every fragment is repaired the mark is cleared version-conditionally (a re-mark made
meanwhile survives) and the lock released; otherwise only the lock is released. Every step
becomes an :class:`Action`, the row the job writes to ``replication_actions``. Blocking API:
Spark tasks call :meth:`LedgerRepairer.repair` from a few threads.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Collection, Mapping
from datetime import datetime, timezone

from bklib.audit.checker import CheckSettings
from bklib.client.pool import BookieClientPool
from bklib.client.reader import LedgerReader
from bklib.client.recovery import recover_ledger
from bklib.errors import BKError, NoSuchLedgerError
from bklib.meta.model import LedgerMetadata
from bklib.meta.registration import BookieRegistry
from bklib.meta.store import Versioned
from bklib.repair.actions import Action, describe, recovery_swap, replace_in_segment
from bklib.repair.context import RepairContext, RepairSettings
from bklib.repair.outcome import as_planned
from bklib.repair.placement_fix import fix_placement
from bklib.repair.plan import (
    FragmentWork,
    GraceDecision,
    grace_decision,
    plan_ledger,
    stripe_entries,
)
from bklib.repair.requests import LedgerRequest, requests_from_findings
from bklib.states import ActionKind, ActionStatus, Check, Reason

log = logging.getLogger(__name__)

__all__ = ["Action", "LedgerRepairer", "LedgerRequest", "RepairSettings"]


class LedgerRepairer(RepairContext):
    """Repairs ledgers with one metadata store, one bookie client and one under-replication
    manager (all owned by the caller), with the shared services of its
    :class:`~bklib.repair.context.RepairContext`. Thread-safe."""

    def _choose(
        self, md: LedgerMetadata, frag: FragmentWork, exclude: Collection[str]
    ) -> dict[int, str]:
        candidates = set(self.registry().writable)
        if self.settings.target is not None:
            candidates &= {self.settings.target}
        weights = {pos: stripe_entries(md, frag, pos) for pos in frag.moves}
        with self.choosing() as chooser:
            return chooser.choose(
                candidates,
                frag.ensemble,
                frag.moves,
                exclude=set(exclude) | set(self.settings.exclude),
                weights=weights,
                ledger_id=md.ledger_id,
            )

    def finish(self) -> None:
        """End of a batch: prune the under-replication dirs the cleared marks left empty
        (:meth:`~bklib.meta.underreplication.UnderReplicationManager.prune_cleared`), once
        per dir instead of once per ledger."""
        pruned = self.urm.prune_cleared()
        if pruned:
            log.debug("pruned %d empty under-replication dirs", pruned)

    # ---- entry point ---------------------------------------------------------------------------

    def repair(self, req: LedgerRequest) -> list[Action]:
        """Repair one ledger; never raises for a per-ledger problem (it becomes a FAILED row)."""
        try:
            actions = self._repair(req)
        except Exception as exc:
            log.exception("ledger %d: repair failed", req.ledger_id)
            actions = [
                Action(
                    req.ledger_id, ActionKind.SKIP, ActionStatus.FAILED, error=describe(exc)
                ).finish()
            ]
        if self.settings.dry_run:  # a plan: nothing of it failed (docs/repair.md, "Dry run")
            for a in actions:
                a.status = as_planned(a.status)
        for a in actions:
            log.debug(
                "ledger %d segment %s: %s %s%s%s",
                a.ledger_id,
                a.segment_first_entry_id,
                a.action,
                a.status,
                f" {a.old_bookie} -> {a.new_bookie}" if a.old_bookie else "",
                f" ({a.error})" if a.error else "",
            )
        return actions

    def _repair(self, req: LedgerRequest) -> list[Action]:
        lid, s = req.ledger_id, self.settings
        if not s.dry_run and not self.replication_enabled():
            return [
                Action(
                    lid,
                    ActionKind.SKIP,
                    ActionStatus.DISABLED,
                    error="underreplication/disable exists",
                ).finish()
            ]
        try:
            md = self.store.read_ledger(lid).value
        except NoSuchLedgerError:
            return [
                Action(lid, ActionKind.SKIP, ActionStatus.SKIPPED, error="ledger deleted").finish()
            ]
        if req.placement_segments:
            return fix_placement(self, req, md)
        if req.verify_mark:
            verdict = self._verify_mark(md)
            if isinstance(verdict, list):
                return verdict
            req = verdict
        work = plan_ledger(md, req.bad_bookies, segments=req.segment_bookies)
        if not work.fragments:
            if not s.dry_run:
                self._clear_stale_mark(md)
            return [
                Action(
                    lid, ActionKind.SKIP, ActionStatus.SKIPPED, error="already repaired"
                ).finish()
            ]
        if s.dry_run:
            return self._plan_only(req, md)
        named = sorted(req.all_bad & md.bookies())
        _, mark_version = self.urm.mark(lid, named, likely_new=not s.marked_before)
        lock = self.urm.try_acquire_marked(lid, mark_version)
        if lock is None:
            holder = self.urm.lock_holder(lid)
            return [
                Action(
                    lid, ActionKind.SKIP, ActionStatus.LOCKED, error=f"lock held by {holder}"
                ).finish()
            ]
        complete = False
        try:
            actions, complete = self._repair_locked(req)
        finally:
            if complete:
                self.urm.mark_replicated(lock, prune=False)
            else:
                self.urm.release(lock)
        return actions

    def _verify_mark(self, md: LedgerMetadata) -> list[Action] | LedgerRequest:
        """A marked ledger no finding asked for (BookKeeper's ReplicationWorker checks a
        marked ledger before acting on it): a request to repair the mark's bookies that are
        gone, or what a replicas check of the ledger finds now; when it finds nothing, the
        mark is cleared. A bookie that does not answer keeps the mark (unknown is not
        healthy)."""
        lid = md.ledger_id
        mark = self.urm.get(lid)
        if mark is None:
            return [Action(lid, ActionKind.SKIP, ActionStatus.SKIPPED, error="no mark").finish()]
        registered = self.registry().all()
        gone = frozenset(b for b in mark.missing_replicas if b in md.bookies()) - set(registered)
        # The grace period of open ledgers runs from when the mark was made.
        since = (
            datetime.fromtimestamp(mark.ctime_ms / 1000, tz=timezone.utc)
            if mark.ctime_ms
            else datetime.now(timezone.utc)
        )
        if gone:
            return LedgerRequest(lid, bad_bookies=gone, first_detected_at=since)
        from bklib.audit.engine import check_ledgers
        from bklib.audit.model import LedgerView

        view = LedgerView.from_metadata(md)
        found = [
            f
            for _, _, fs in check_ledgers(
                [view],
                frozenset(),
                Check.REPLICAS,
                client=self.client,
                settings=CheckSettings(read_timeout=self.client.config.read_timeout),
            )
            for f in fs
        ]
        unknown = [f for f in found if f.reason == Reason.BOOKIE_UNREACHABLE]
        if unknown:
            who = ", ".join(sorted({f.bookie_id for f in unknown}))
            return [
                Action(
                    lid, ActionKind.SKIP, ActionStatus.SKIPPED, error=f"mark kept: {who} silent"
                ).finish()
            ]
        if found:
            rows = [{**f.as_row(), "first_detected_at": since} for f in found]
            (req,) = requests_from_findings(rows)
            return req
        if self.settings.dry_run:
            return [Action(lid, ActionKind.CLEAR_MARK, ActionStatus.PLANNED).finish()]
        lock = self.urm.try_acquire_marked(lid, mark.version)
        if lock is None:
            holder = self.urm.lock_holder(lid)
            return [
                Action(
                    lid, ActionKind.SKIP, ActionStatus.LOCKED, error=f"lock held by {holder}"
                ).finish()
            ]
        removed = self.urm.mark_replicated(lock, prune=False)
        log.debug("ledger %d: fully replicated now; mark %s", lid, "cleared" if removed else "kept")
        status = ActionStatus.DONE if removed else ActionStatus.SKIPPED
        return [Action(lid, ActionKind.CLEAR_MARK, status).finish()]

    def _clear_stale_mark(self, md: LedgerMetadata) -> None:
        """A mark whose bookies the metadata no longer names is done: clear it like a worker."""
        mark = self.urm.get(md.ledger_id)
        if mark is None or set(mark.missing_replicas) & md.bookies():
            return
        lock = self.urm.try_acquire_marked(md.ledger_id, mark.version)
        if lock is not None:
            self.urm.mark_replicated(lock, prune=False)

    # ---- under the lock ------------------------------------------------------------------------

    def _repair_locked(self, req: LedgerRequest) -> tuple[list[Action], bool]:
        lid = req.ledger_id
        actions: list[Action] = []
        fenced = False
        current: Versioned[LedgerMetadata] | None
        while True:
            current = self.store.read_ledger(lid)
            md = current.value
            lac = None if md.is_closed else self._read_lac(md)
            work = plan_ledger(md, req.bad_bookies, segments=req.segment_bookies, lac=lac)
            if not work.open_fragments or fenced:
                break
            decision = self._grace(req, md)
            if decision is not GraceDecision.FENCE:
                for frag in work.open_fragments:
                    actions += self._waiting(md, frag, decision)
                break
            act = Action(
                lid,
                ActionKind.FENCE_AND_CLOSE,
                ActionStatus.DONE,
                *self._bounds(work.open_fragments[-1]),
            )
            try:
                closed = self._recover(md)
                act.segment_last_entry_id = closed.last_entry_id
                # Recovery replaces an unreachable bookie of the last ensemble while it writes
                # entries back (LedgerRecoveryOp): the row says which, for the audit trail.
                swapped = recovery_swap(md, closed)
                if swapped is not None:
                    act.old_bookie, act.new_bookie = swapped
            except BKError as exc:
                act.status, act.error = ActionStatus.FAILED, describe(exc)
                actions.append(act.finish())
                break
            actions.append(act.finish())
            fenced = True
        complete = not work.open_fragments
        for frag in work.closed_fragments:
            acts, ok, current = self._repair_fragment(req, md, frag, current)
            actions += acts
            complete = complete and ok
        return actions, complete

    def _bounds(self, frag: FragmentWork) -> tuple[int, int]:
        return frag.first_entry_id, frag.last_entry_id

    def _grace(self, req: LedgerRequest, md: LedgerMetadata) -> GraceDecision:
        age = None
        if req.first_detected_at is not None:
            age = (datetime.now(timezone.utc) - req.first_detected_at).total_seconds()
        return grace_decision(md, req.detected_segments, age, self.settings.grace_period)

    def _waiting(
        self, md: LedgerMetadata, frag: FragmentWork, decision: GraceDecision
    ) -> list[Action]:
        why = (
            f"open fragment, first detected less than {self.settings.grace_period:g}s ago"
            if decision is GraceDecision.WAIT_GRACE
            else "writer added a segment since detection: it is alive"
        )
        return [
            Action(
                md.ledger_id,
                ActionKind.SKIP,
                ActionStatus.WAITING_GRACE,
                frag.first_entry_id,
                None,
                old_bookie=old,
                error=why,
            ).finish()
            for old in frag.moves.values()
        ]

    def _read_lac(self, md: LedgerMetadata) -> int | None:
        """The LAC of an open ledger, read without fencing; None if it could not be learned."""
        pwd, dt = self.credentials(md)

        async def run(pool: BookieClientPool) -> int:
            ctx = self.client_context(pool)
            return (await LedgerReader.open(ctx, md.ledger_id, password=pwd, digest_type=dt)).lac

        try:
            return self.client.run(run)
        except BKError as exc:
            log.warning("ledger %d: LAC unknown (%s); open segments wait", md.ledger_id, exc)
            return None

    def _recover(self, md: LedgerMetadata) -> LedgerMetadata:
        pwd, dt = self.credentials(md)
        log.debug("ledger %d: grace period passed, fencing and closing by recovery", md.ledger_id)

        async def run(pool: BookieClientPool) -> LedgerMetadata:
            ctx = self.client_context(pool)
            return await recover_ledger(ctx, md.ledger_id, password=pwd, digest_type=dt)

        return self.client.run(run)

    # ---- one fragment --------------------------------------------------------------------------

    def _repair_fragment(
        self,
        req: LedgerRequest,
        md: LedgerMetadata,
        frag: FragmentWork,
        current: Versioned[LedgerMetadata] | None,
    ) -> tuple[list[Action], bool, Versioned[LedgerMetadata] | None]:
        """Copy and swap one fragment; returns the actions, whether it is repaired, and the
        metadata as written (the next CAS of this ledger starts from it)."""
        lid, first, last = md.ledger_id, frag.first_entry_id, frag.last_entry_id
        known_lost = {pos: old for pos, old in frag.moves.items() if (first, old) in req.no_replica}
        if known_lost and not self.settings.retry_no_replica:
            return (
                [
                    Action(
                        lid,
                        ActionKind.COPY,
                        ActionStatus.NO_REPLICA,
                        first,
                        last,
                        old_bookie=old,
                        error="an earlier run found entries with no replica (--retry-no-replica)",
                    ).finish()
                    for old in known_lost.values()
                ],
                False,
                current,
            )
        started = datetime.now(timezone.utc)
        reg = self.registry()
        in_place, replace = self._split_moves(req, frag, reg)
        try:
            targets = self._choose(md, replace_moves(frag, replace), req.all_bad) if replace else {}
        except BKError as exc:
            return (
                [
                    Action(
                        lid,
                        ActionKind.COPY,
                        ActionStatus.FAILED,
                        first,
                        last,
                        old_bookie=old,
                        error=describe(exc),
                    )
                    for old in replace.values()
                ],
                False,
                current,
            )
        targets.update(in_place)
        dead = {b for b in frag.ensemble if not reg.is_available(b)}
        pwd, dt = self.credentials(md)
        try:
            result = self.copy_entries(md, frag, targets, dead, pwd, dt)
        except BKError as exc:
            return (
                [
                    Action(
                        lid,
                        ActionKind.COPY,
                        ActionStatus.FAILED,
                        first,
                        last,
                        frag.moves[pos],
                        new,
                        started_at=started,
                        error=describe(exc),
                    ).finish()
                    for pos, new in targets.items()
                ],
                False,
                current,
            )
        actions = []
        for pos, new in targets.items():
            n, nbytes = result.per_target.get(new, [0, 0])
            act = Action(
                lid,
                ActionKind.COPY,
                ActionStatus.DONE,
                first,
                last,
                frag.moves[pos],
                new,
                n,
                nbytes,
                started_at=started,
            )
            if result.no_replica:
                act.status, act.no_replica_entries = (
                    ActionStatus.NO_REPLICA,
                    list(result.no_replica),
                )
                act.error = f"{len(result.no_replica)} entries have no surviving replica"
            actions.append(act.finish())
        if result.no_replica:  # the metadata keeps naming the bookie: the loss stays visible
            return actions, False, current
        mapping = {frag.moves[pos]: new for pos, new in targets.items() if pos not in in_place}
        if not mapping:
            return actions, True, current
        act = Action(lid, ActionKind.METADATA_UPDATE, ActionStatus.DONE, first, last)
        act.old_bookie, act.new_bookie = ",".join(mapping), ",".join(mapping.values())
        try:
            current = self.store.update_ledger(
                lid, replace_in_segment(first, mapping), current=current
            )
        except BKError as exc:
            act.status, act.error = ActionStatus.FAILED, describe(exc)
            actions.append(act.finish())
            return actions, False, None
        actions.append(act.finish())
        return actions, True, current

    def _split_moves(
        self, req: LedgerRequest, frag: FragmentWork, reg: BookieRegistry
    ) -> tuple[dict[int, str], dict[int, str]]:
        """``(in place, to replace)``. A bookie flagged for this segment only (entries missing,
        bad digest) that is still writable is repaired in place: its stripe is written back to
        it and the metadata does not change. Lost or unreachable bookies and recover sources
        are replaced."""
        in_place = {
            pos: old
            for pos, old in frag.moves.items()
            if old not in req.bad_bookies
            and old in reg.writable
            and old not in self.settings.exclude
        }
        return in_place, {p: b for p, b in frag.moves.items() if p not in in_place}

    # ---- dry run -------------------------------------------------------------------------------

    def _plan_only(self, req: LedgerRequest, md: LedgerMetadata) -> list[Action]:
        """What would be done, with nothing written: no mark, no lock, no fence, no copy."""
        lac = None if md.is_closed else self._read_lac(md)
        work = plan_ledger(md, req.bad_bookies, segments=req.segment_bookies, lac=lac)
        actions: list[Action] = []
        for frag in work.open_fragments:
            decision = self._grace(req, md)
            if decision is GraceDecision.FENCE:
                actions.append(
                    Action(
                        md.ledger_id,
                        ActionKind.FENCE_AND_CLOSE,
                        ActionStatus.PLANNED,
                        frag.first_entry_id,
                    ).finish()
                )
            else:
                actions += self._waiting(md, frag, decision)
        per_entry = md.length / (md.last_entry_id + 1) if md.is_closed and md.length else 0.0
        reg = self.registry()
        for frag in work.closed_fragments:
            in_place, replace = self._split_moves(req, frag, reg)
            error: str | None
            try:
                targets = self._choose(md, replace_moves(frag, replace), req.all_bad)
            except BKError as exc:
                targets, error = {}, describe(exc)
            else:
                error = None
            targets.update(in_place)
            for pos, old in frag.moves.items():
                n = stripe_entries(md, frag, pos)
                act = Action(
                    md.ledger_id,
                    ActionKind.COPY,
                    ActionStatus.PLANNED if pos in targets else ActionStatus.FAILED,
                    frag.first_entry_id,
                    frag.last_entry_id,
                    old,
                    targets.get(pos),
                    n,
                    int(n * per_entry),
                    error=error,
                )
                actions.append(act.finish())
        return actions


def replace_moves(frag: FragmentWork, moves: Mapping[int, str]) -> FragmentWork:
    """``frag`` with only ``moves`` to do."""
    return dataclasses.replace(frag, moves=dict(moves))
