"""Ledger recovery: fence the ledger, find its last entry, make it durable, close it.

What BookKeeper's ``ReadOnlyLedgerHandle.recover`` + ``LedgerRecoveryOp`` do
(docs/safety-rules.md rules 1-8), step by step:

1. Read the metadata; CLOSED -> nothing to do.
2. CAS OPEN -> IN_RECOVERY. If another recoverer got there first nothing is written and this
   one proceeds anyway (recoveries may run concurrently and converge). From now on the writer
   can no longer change ensembles, so the last ensemble is frozen; it is read from the
   metadata *after* this CAS.
3. Fencing LAC read: entry -1 with the fence flag and the master key to all E bookies of the
   last ensemble; it completes only when the replies cover every write set (fewer than AQ
   unknowns in each; a digest failure is unknown). Recovery starts after
   ``max(max LAC, last segment's first entry - 1)``: earlier segments are immutable (#2615).
4. Read forward one entry at a time (``recovery_read_batch_size``), each read fenced and high
   priority, replicas in write-set order with speculative retries. An entry is found on the
   first reply with a valid digest; it is absent only once WQ - AQ + 1 replicas of its write
   set said NoSuchEntry/NoSuchLedger; anything else (timeouts, I/O errors, digest failures)
   is unknown and aborts recovery, leaving the ledger IN_RECOVERY for a later retry -- it never
   shortens the ledger.
5. Every entry found is written back (recovery-add flag + high priority, so fenced bookies
   accept it) to its write set in the current ensemble, re-packaged with the recovering LAC
   and its original length; AQ acks each. A bookie failing a write-back is replaced *in
   memory* (keyed at the recovering LAC + 1); pending write-backs are re-sent to it.
6. Close by CAS (predicate IN_RECOVERY): commit the in-memory replacements -- every key must be
   >= the stored last segment's key, else UnexpectedConditionError ("no one may add ensembles
   to a ledger in recovery") -- and set CLOSED, lastEntryId = recovered LAC, length. If the
   ledger was CLOSED meanwhile (a concurrent recoverer, or the writer's own close, which is
   allowed to override IN_RECOVERY) the stored metadata is adopted.

Failures raise typed errors and leave the ledger IN_RECOVERY: BKTimeoutError or ReadError
(fencing or entry reads not conclusive), UnauthorizedAccessError, NotEnoughBookiesError or
WriteError (write-back), UnexpectedConditionError (close).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Mapping, Sequence

from bklib.cancellation import cancel_and_wait
from bklib.client.add_pipeline import AddPipeline, PendingAdd
from bklib.client.pool import BookieClientPool, SyncBookieClient
from bklib.client.reader import (
    ClientContext,
    LacReadTracker,
    LedgerReader,
    Reply,
    ask_replicas,
    coverage_read,
    first_error,
    read_failure,
    resolve_credentials,
)
from bklib.digest import DigestManager, EntryView, digest_manager, master_key
from bklib.errors import (
    BKError,
    LedgerRecoveryError,
    NotEnoughBookiesError,
    UnexpectedConditionError,
)
from bklib.meta.model import INVALID_ENTRY_ID, DigestType, LedgerMetadata, LedgerState
from bklib.meta.store import LedgerStore, Versioned
from bklib.quorum import (
    RecoveryReadDecision,
    ReplyKind,
    recovery_read_decision,
    reply_kind,
    write_set,
)

log = logging.getLogger(__name__)

__all__ = [
    "ENTRY_ABSENT",
    "LedgerRecovery",
    "decide_recovery_read",
    "mark_in_recovery_transform",
    "open_ledger_with_recovery",
    "recover_ledger",
    "recover_ledger_blocking",
    "recovery_close_transform",
    "recovery_start_lac",
]


# ---- pure decisions ---------------------------------------------------------------------------


def mark_in_recovery_transform(md: LedgerMetadata, force: bool = False) -> LedgerMetadata | None:
    """CAS transform of step 2: OPEN -> IN_RECOVERY; None (no write) when already
    IN_RECOVERY or CLOSED. With ``force`` a CLOSED ledger is reopened for recovery too."""
    if md.state == LedgerState.OPEN or (force and md.state == LedgerState.CLOSED):
        return md.replace(
            state=LedgerState.IN_RECOVERY, last_entry_id=INVALID_ENTRY_ID, length=0, ctoken=0
        )
    return None


def recovery_start_lac(max_lac: int, last_segment_first_entry: int) -> int:
    """The LAC recovery starts from: the highest LAC the fencing read found, but never below
    the entry before the last segment (earlier segments are immutable; fix for #2615)."""
    return max(max_lac, last_segment_first_entry - 1)


def recovery_close_transform(
    md: LedgerMetadata,
    new_segments: Mapping[int, Sequence[str]],
    last_entry_id: int,
    length: int,
) -> LedgerMetadata | None:
    """CAS transform of step 6 on the freshest stored metadata.

    Not IN_RECOVERY any more -> None: someone closed it; adopt the stored value. Otherwise add
    the ensembles recovery created (a key equal to the stored last key replaces that segment, a
    greater one appends; a smaller one raises UnexpectedConditionError because someone added
    a segment after recovery started) and close at (``last_entry_id``, ``length``).
    """
    if md.state != LedgerState.IN_RECOVERY:
        return None
    stored_last_key = md.last_segment.first_entry_id
    out = md
    for key in sorted(new_segments):
        if key < stored_last_key:
            raise UnexpectedConditionError(
                f"recovery ensemble at entry {key} is below the stored last segment "
                f"{stored_last_key}: a segment was added while the ledger was in recovery",
                ledger_id=md.ledger_id,
            )
        out = out.with_new_segment(key, tuple(new_segments[key]))
    return out.closed(last_entry_id, length)


ENTRY_ABSENT = object()
"""Verdict of :func:`decide_recovery_read` for an entry that was never acknowledged."""


def decide_recovery_read(
    replies: Sequence[Reply[EntryView]], wq: int, aq: int, *, ledger_id: int, entry_id: int
) -> EntryView | BKError | object | None:
    """Verdict of one recovery read from the replies so far (positions in the write set):
    the entry's view (found), ``ENTRY_ABSENT``, the error to fail with, or None (ask/wait more)."""
    kinds: list[ReplyKind | None] = [None] * wq
    for r in replies:
        kinds[r.position] = reply_kind(r.error)
    verdict = recovery_read_decision(kinds, wq, aq)
    if verdict is RecoveryReadDecision.FOUND:
        return next(r.value for r in replies if r.error is None)
    if verdict is RecoveryReadDecision.ABSENT:
        return ENTRY_ABSENT
    if verdict is RecoveryReadDecision.UNKNOWN_FAIL:
        cause = first_error([r.error for r in replies if r.error is not None])
        return read_failure(
            cause,
            f"recovery read inconclusive ({sum(k is ReplyKind.NEGATIVE for k in kinds)} of "
            f"{wq - aq + 1} negatives needed)",
            ledger_id=ledger_id,
            entry_id=entry_id,
        )
    return None


# ---- the recovery operation ---------------------------------------------------------------------


class LedgerRecovery:
    """One recovery of one ledger; :meth:`run` once. Subclasses (tests) may override
    :meth:`before_close` to act between the write-back and the close CAS."""

    def __init__(
        self,
        ctx: ClientContext,
        ledger_id: int,
        *,
        password: bytes | None = None,
        digest_type: DigestType | None = None,
        force: bool = False,
    ) -> None:
        self.ctx = ctx
        self.ledger_id = ledger_id
        self.password = password
        self.digest_type = digest_type
        self.force = force
        self.versioned: Versioned[LedgerMetadata] | None = None
        self.start_lac = INVALID_ENTRY_ID
        self.new_segments: dict[int, tuple[str, ...]] = {}
        self.entries_written_back = 0
        self._error: BKError | None = None
        self._pipeline: AddPipeline | None = None
        self._dm: DigestManager | None = None
        self._key = b""

    # ---- hooks ------------------------------------------------------------------------------

    async def before_close(self) -> None:
        """Called after every write-back completed, right before the close CAS."""

    # ---- steps ------------------------------------------------------------------------------

    async def run(self) -> Versioned[LedgerMetadata]:
        """Recover; returns the CLOSED metadata (ours or the one adopted)."""
        ctx, lid = self.ctx, self.ledger_id
        v = await ctx.read_metadata(lid)
        if v.value.is_closed and not self.force:
            log.debug("ledger %d: already CLOSED at %d, no recovery", lid, v.value.last_entry_id)
            self.versioned = v
            return v
        # Check the password before touching the metadata: a wrong one must not leave the
        # ledger IN_RECOVERY.
        pwd, dt = resolve_credentials(v.value, self.password, self.digest_type)
        self._dm = digest_manager(lid, dt, pwd)
        self._key = master_key(pwd)
        v = await ctx.meta(
            ctx.store.update_ledger,
            lid,
            lambda md: mark_in_recovery_transform(md, self.force),
            current=v,
        )
        self.versioned = v
        md = v.value
        if md.is_closed:
            log.debug("ledger %d: CLOSED meanwhile at %d, no recovery", lid, md.last_entry_id)
            return v
        log.debug(
            "ledger %d: IN_RECOVERY (version %d); last segment %d:%s",
            lid,
            v.version,
            md.last_segment.first_entry_id,
            list(md.last_segment.ensemble),
        )
        tracker = await self._fence_and_read_lac(md)
        self.start_lac = recovery_start_lac(tracker.max_lac, md.last_segment.first_entry_id)
        log.debug(
            "ledger %d: recovery starts after entry %d (max LAC %d, last segment starts at %d)",
            lid,
            self.start_lac,
            tracker.max_lac,
            md.last_segment.first_entry_id,
        )
        pipeline = AddPipeline(
            ctx,
            lid,
            md.ensemble_size,
            md.write_quorum,
            md.ack_quorum,
            md.last_segment.ensemble,
            self._key,
            change_ensemble=self._change_ensemble,
            on_unrecoverable=self._on_unrecoverable,
            lac=self.start_lac,
            lac_length=tracker.length,
            recovery=True,
            on_delivered=self._delivered,
            name="recovery",
        )
        self._pipeline = pipeline
        try:
            await self._read_forward(md, pipeline)
        except BaseException:
            pipeline.stop()
            await pipeline.wait_stopped()
            log.warning(
                "ledger %d: recovery failed after entry %d; ledger stays IN_RECOVERY",
                lid,
                pipeline.lac,
            )
            raise
        # Every write-back reached AQ. Java's recovery closes at that point; a repair tool should
        # not leave the tail below WQ when the rest of each write set is only slower (a bookie
        # just swapped in is still connecting), so the copies in flight get one add timeout to
        # land. A copy that fails or stays late leaves its entry at AQ, as in BookKeeper, and
        # the next audit reports it.
        if not await pipeline.settle(ctx.pool.config.add_timeout):
            log.info("ledger %d: some write-backs beyond AQ did not finish; closing at AQ", lid)
        pipeline.stop()
        await pipeline.wait_stopped()
        await self.before_close()
        return await self._close(pipeline.lac, pipeline.lac_length)

    async def _fence_and_read_lac(self, md: LedgerMetadata) -> LacReadTracker:
        lid, dm, key, pool = self.ledger_id, self._dm, self._key, self.ctx.pool
        assert dm is not None

        async def send(bookie: str) -> tuple[int, int]:
            # Entry -1 = the bookie's highest stored entry; the fence flag makes it refuse
            # normal adds from now on. The LAC is the field inside that entry.
            res = await pool.read(bookie, lid, INVALID_ENTRY_ID, fence=True, master_key=key)
            view = dm.verify_entry(res.body, None)
            return view.lac, view.length

        return await coverage_read(md.last_segment.ensemble, md, send, "fencing LAC read")

    async def _recovery_read(self, md: LedgerMetadata, entry_id: int) -> EntryView | None:
        """Read ``entry_id`` for recovery: the entry, None if absent, or raise."""
        lid, dm, key, pool = self.ledger_id, self._dm, self._key, self.ctx.pool
        assert dm is not None
        ensemble = md.ensemble_for(entry_id)
        targets = [ensemble[i] for i in write_set(entry_id, md.ensemble_size, md.write_quorum)]

        async def send(bookie: str) -> EntryView:
            res = await pool.read(
                bookie, lid, entry_id, fence=True, master_key=key, high_priority=True
            )
            return dm.verify_entry(res.body, entry_id)

        def decide(replies: list[Reply[EntryView]], everyone: bool) -> object | None:
            return decide_recovery_read(
                replies, md.write_quorum, md.ack_quorum, ledger_id=lid, entry_id=entry_id
            )

        verdict = await ask_replicas(targets, send, decide, self.ctx.speculative_read_timeout)
        if verdict is ENTRY_ABSENT:
            log.debug(
                "ledger %d entry %d: absent (WQ-AQ+1=%d replicas of %s said no such entry)",
                lid,
                entry_id,
                md.write_quorum - md.ack_quorum + 1,
                targets,
            )
            return None
        if isinstance(verdict, BKError):
            log.warning("ledger %d entry %d: recovery read failed: %s", lid, entry_id, verdict)
            raise verdict
        assert isinstance(verdict, EntryView)
        log.debug("ledger %d entry %d: found, writing back", lid, entry_id)
        return verdict

    async def _read_forward(self, md: LedgerMetadata, pipeline: AddPipeline) -> None:
        dm = self._dm
        assert dm is not None
        batch = max(1, self.ctx.recovery_read_batch_size)
        limit = max(1, self.ctx.max_writebacks_in_flight)
        outstanding: deque[asyncio.Future[int]] = deque()
        try:
            await self._read_and_write_back(md, pipeline, dm, batch, limit, outstanding)
        finally:
            # On failure nobody awaits the remaining write-backs: mark their errors retrieved.
            for fut in outstanding:
                fut.add_done_callback(_consume)

    async def _read_and_write_back(
        self,
        md: LedgerMetadata,
        pipeline: AddPipeline,
        dm: DigestManager,
        batch: int,
        limit: int,
        outstanding: deque[asyncio.Future[int]],
    ) -> None:
        next_id = self.start_lac + 1
        finished = False
        while not finished:
            reads = [
                asyncio.ensure_future(self._recovery_read(md, e))
                for e in range(next_id, next_id + batch)
            ]
            try:
                for offset, task in enumerate(reads):
                    entry_id = next_id + offset
                    view = await task
                    if self._error is not None:
                        raise self._error
                    if view is None:
                        finished = True
                        break
                    if entry_id != pipeline.queue.last_pushed + 1:
                        # Never write back out of order: that could overwrite the tail.
                        raise UnexpectedConditionError(
                            f"recovered entry {entry_id} does not follow "
                            f"{pipeline.queue.last_pushed}",
                            ledger_id=self.ledger_id,
                            entry_id=entry_id,
                        )
                    # The LAC inside a write-back stays where this recovery started. Its own
                    # advance may count copies on replacements kept in memory until the close
                    # CAS (as Java's ReadOnlyLedgerHandle keeps newEnsemblesFromRecovery); if
                    # this recovery dies first, a later one would start after that LAC and skip
                    # entries short of AQ in the saved ensemble.
                    body = dm.package_entry(entry_id, self.start_lac, view.length, view.payload)
                    outstanding.append(pipeline.submit(entry_id, body, view.length))
                    while len(outstanding) >= limit:
                        await outstanding.popleft()
            finally:
                await cancel_and_wait(reads)
            next_id += batch
        # Entries after the first absent one (batch > 1) are never written back: the ledger
        # ends before the gap.
        while outstanding:
            await outstanding.popleft()
        if self._error is not None:
            raise self._error

    def _delivered(self, add: PendingAdd) -> None:
        self.entries_written_back += 1

    def _on_unrecoverable(self, exc: BKError) -> None:
        # A recovering handle never closes the ledger on add errors: the write-back just fails
        # and the ledger stays IN_RECOVERY for a later attempt.
        if self._error is None:
            self._error = exc
        if self._pipeline is not None:
            self._pipeline.stop()
            self._pipeline.fail_all(exc)

    async def _change_ensemble(self, failed: dict[int, str]) -> tuple[str, ...]:
        pipeline = self._pipeline
        assert pipeline is not None
        candidates = await self.ctx.writable_bookies()
        current = pipeline.ensemble
        placement = self.ctx.placement
        try:
            new, _ = placement.replace_bookies(
                candidates, current, failed, exclude=pipeline.failed_bookies
            )
        except NotEnoughBookiesError:
            new, _ = placement.replace_bookies(candidates, current, failed)
        key = pipeline.lac + 1
        # Kept in memory until the close CAS commits it; the same key replaces in place.
        self.new_segments[key] = new
        log.debug(
            "ledger %d: recovery replaced %s in memory: ensemble at entry %d is now %s",
            self.ledger_id,
            failed,
            key,
            list(new),
        )
        return new

    async def _close(self, last_entry_id: int, length: int) -> Versioned[LedgerMetadata]:
        ctx, lid = self.ctx, self.ledger_id
        segments = dict(self.new_segments)

        def transform(md: LedgerMetadata) -> LedgerMetadata | None:
            return recovery_close_transform(md, segments, last_entry_id, length)

        v = await ctx.meta(ctx.store.update_ledger, lid, transform, current=self.versioned)
        self.versioned = v
        md = v.value
        if not md.is_closed:
            raise LedgerRecoveryError(
                f"ledger is {md.state.name} after the recovery close", ledger_id=lid
            )
        if md.last_entry_id == last_entry_id and md.length == length:
            log.debug(
                "ledger %d: recovered and CLOSED at entry %d, length %d (%d written back)",
                lid,
                md.last_entry_id,
                md.length,
                self.entries_written_back,
            )
        else:
            log.debug(
                "ledger %d: closed by someone else meanwhile at entry %d (length %d); adopted "
                "(this recovery found %d, length %d)",
                lid,
                md.last_entry_id,
                md.length,
                last_entry_id,
                length,
            )
        return v


def _consume(fut: asyncio.Future[int]) -> None:
    if not fut.cancelled():
        fut.exception()


# ---- entry points -------------------------------------------------------------------------------


async def recover_ledger(
    ctx: ClientContext,
    ledger_id: int,
    *,
    password: bytes | None = None,
    digest_type: DigestType | None = None,
    force: bool = False,
) -> LedgerMetadata:
    """Recover ``ledger_id`` (fence, find the end, write back, close) and return its CLOSED
    metadata. Password and digest type default to the ones stored in v3 metadata."""
    op = LedgerRecovery(ctx, ledger_id, password=password, digest_type=digest_type, force=force)
    return (await op.run()).value


async def open_ledger_with_recovery(
    ctx: ClientContext,
    ledger_id: int,
    *,
    password: bytes | None = None,
    digest_type: DigestType | None = None,
) -> LedgerReader:
    """Open for reading after recovery: a ledger that is not CLOSED is fenced and closed first
    (its writer, if alive, gets LedgerFenced). Returns a reader bounded by lastEntryId."""
    op = LedgerRecovery(ctx, ledger_id, password=password, digest_type=digest_type)
    v = await op.run()
    pwd, dt = resolve_credentials(v.value, password, digest_type)
    return LedgerReader(ctx, v, pwd, dt, v.value.last_entry_id)


def recover_ledger_blocking(
    client: SyncBookieClient,
    store: LedgerStore,
    ledger_id: int,
    *,
    password: bytes | None = None,
    digest_type: DigestType | None = None,
    ctx_options: Mapping[str, object] | None = None,
) -> LedgerMetadata:
    """Sync wrapper for the repair job: :func:`recover_ledger` on ``client``'s event loop.
    ``ctx_options`` are extra :class:`ClientContext` fields (placement, timeouts...)."""

    async def run(pool: BookieClientPool) -> LedgerMetadata:
        ctx = ClientContext(store, pool, **dict(ctx_options or {}))  # type: ignore[arg-type]
        return await recover_ledger(ctx, ledger_id, password=password, digest_type=digest_type)

    return client.run(run)
