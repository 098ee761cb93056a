"""Writing ledgers: pipelined adds, in-order acks, ensemble changes by CAS, close.

The pieces, pure logic first (unit-tested without I/O):

* :class:`AckQueue` -- the pending adds of one handle in entry order (BookKeeper's
  ``PendingAddOp`` queue and ``AckSet``): an entry is *completed* once AQ bookies of its write
  set acked it, and is *delivered* (its future resolved, LAC advanced) only when every lower
  entry was delivered and no ensemble change is in progress. Replacing ensemble indices
  un-acks them in every pending entry whose write set holds them and says what to re-send.
* :func:`ensemble_change_transform` -- the CAS transform of a writer's ensemble change
  (``LedgerHandle.ensembleChangeLoop``, docs/safety-rules.md rule 9): refused with
  LedgerClosedError / LedgerFencedError once the stored metadata is CLOSED / IN_RECOVERY; a
  no-op when the failed bookies are no longer in the last ensemble; otherwise the failed
  indices are replaced and the new ensemble starts at LAC + 1 (replacing the last segment when
  it already starts there).
* :func:`writer_close_transform` -- the CAS transform of a writer's close
  (``LedgerHandle.doAsyncCloseInternal``, docs/safety-rules.md rule 8): CLOSED at (LAC,
  length); an existing CLOSED with the same values is success, different values are a
  MetadataVersionError. IN_RECOVERY is overridden on purpose: the writer knows what it wrote.

Then the I/O:

* :class:`AddPipeline` -- sends each entry to its write set in the current ensemble, tracks
  acks in an AckQueue, delivers in order, and on a bookie failure runs one ensemble change at a
  time (failures arriving meanwhile are handled in a follow-up round) through a pluggable
  ``change_ensemble`` coroutine, then re-sends the outstanding entries to the replacements.
  No ack is delivered while a change is pending. Shared by :class:`LedgerWriter` (changes go to
  ZooKeeper) and ledger recovery's write-back (changes stay in memory until its close).
* :class:`LedgerWriter` -- create a ledger, ``add``/``add_async``, ``close``, ``abort``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from bklib.cancellation import wait_unwound
from bklib.client.placement import PlacementPolicy
from bklib.client.reader import ClientContext
from bklib.digest import digest_manager, master_key
from bklib.errors import (
    BKError,
    ClientClosedError,
    IllegalOpError,
    IncorrectParameterError,
    LedgerClosedError,
    LedgerExistsError,
    LedgerFencedError,
    MetadataVersionError,
    NotEnoughBookiesError,
    UnauthorizedAccessError,
    UnexpectedConditionError,
    WriteError,
)
from bklib.meta.model import INVALID_ENTRY_ID, DigestType, LedgerMetadata, LedgerState, Segment
from bklib.meta.store import Versioned
from bklib.quorum import check_quorum, write_set

log = logging.getLogger(__name__)

__all__ = [
    "AckQueue",
    "AddPipeline",
    "LedgerWriter",
    "PendingAdd",
    "ensemble_change_transform",
    "writer_close_transform",
]

# Errors after which a bookie must not simply be replaced: the ledger was fenced, or we are not
# allowed to write to it (as BookKeeper's ``PendingAddOp.writeComplete`` decides).
_UNRECOVERABLE = (LedgerFencedError, UnauthorizedAccessError, IllegalOpError)


# ---- pure: ack tracking ---------------------------------------------------------------------


@dataclass(eq=False)
class PendingAdd:
    """One outstanding add: its packaged body, cumulative length and acks by ensemble index."""

    entry_id: int
    length: int
    body: bytes
    future: asyncio.Future[int] | None = None
    acked: set[int] = field(default_factory=set)
    completed: bool = False


class AckQueue:
    """Outstanding adds of one handle, in entry order, and the LAC they advance.

    Entry ids are pushed contiguously from ``lac + 1``. Pure: no I/O, no event loop.
    """

    def __init__(self, e: int, wq: int, aq: int, lac: int = INVALID_ENTRY_ID, length: int = 0):
        check_quorum(e, wq, aq)
        self.e, self.wq, self.aq = e, wq, aq
        self.lac = lac
        self.lac_length = length  # cumulative ledger length up to and including the LAC entry
        self.last_pushed = lac
        self._order: deque[PendingAdd] = deque()
        self._by_id: dict[int, PendingAdd] = {}

    def __len__(self) -> int:
        return len(self._order)

    def write_set(self, entry_id: int) -> tuple[int, ...]:
        return write_set(entry_id, self.e, self.wq)

    def push(
        self, entry_id: int, length: int, body: bytes, future: asyncio.Future[int] | None = None
    ) -> PendingAdd:
        """Queue the next entry (must be ``last_pushed + 1``)."""
        if entry_id != self.last_pushed + 1:
            raise UnexpectedConditionError(
                f"entry {entry_id} pushed after {self.last_pushed}", entry_id=entry_id
            )
        add = PendingAdd(entry_id, length, body, future)
        self._order.append(add)
        self._by_id[entry_id] = add
        self.last_pushed = entry_id
        return add

    def get(self, entry_id: int) -> PendingAdd | None:
        """The pending add of ``entry_id``, or None once delivered or drained."""
        return self._by_id.get(entry_id)

    def ack(self, entry_id: int, index: int) -> bool:
        """Record an ack from ensemble ``index``; True if the entry just reached AQ.

        Acks from indices outside the entry's write set, or for entries no longer pending,
        are ignored.
        """
        add = self._by_id.get(entry_id)
        if add is None or index not in self.write_set(entry_id):
            return False
        add.acked.add(index)
        if not add.completed and len(add.acked) >= self.aq:
            add.completed = True
            return True
        return False

    def pop_deliverable(self, blocked: bool = False) -> list[PendingAdd]:
        """Remove and return the completed prefix of the queue (advancing the LAC), unless
        ``blocked`` (an ensemble change is pending: nothing may be delivered)."""
        out: list[PendingAdd] = []
        if blocked:
            return out
        while self._order and self._order[0].completed:
            add = self._order.popleft()
            del self._by_id[add.entry_id]
            self.lac = add.entry_id
            self.lac_length = add.length
            out.append(add)
        return out

    def unset_replaced(self, indices: Iterable[int]) -> list[tuple[PendingAdd, int]]:
        """Ensemble ``indices`` now hold new bookies: drop their acks from every pending entry
        whose write set contains them (an entry may lose its AQ) and return the
        (entry, index) pairs to re-send."""
        idx = set(indices)
        resend: list[tuple[PendingAdd, int]] = []
        for add in self._order:
            for i in self.write_set(add.entry_id):
                if i in idx:
                    add.acked.discard(i)
                    resend.append((add, i))
            add.completed = len(add.acked) >= self.aq
        return resend

    def drain(self) -> list[PendingAdd]:
        """Remove and return every pending add (to fail them). The LAC does not move."""
        out = list(self._order)
        self._order.clear()
        self._by_id.clear()
        self.last_pushed = self.lac
        return out

    def snapshot(self) -> list[tuple[int, tuple[int, ...], bool]]:
        """(entry id, acked indices, completed) of every pending add, for tests and logs."""
        return [(a.entry_id, tuple(sorted(a.acked)), a.completed) for a in self._order]


# ---- pure: metadata transforms ------------------------------------------------------------------


def ensemble_change_transform(
    md: LedgerMetadata,
    lac: int,
    failed: Mapping[int, str],
    candidates: Sequence[str],
    placement: PlacementPolicy,
    avoid: Iterable[str] = (),
) -> LedgerMetadata | None:
    """The writer's ensemble-change CAS transform, applied to the freshest stored metadata.

    Raises LedgerClosedError (CLOSED) or LedgerFencedError (IN_RECOVERY: a recoverer froze the
    last ensemble). Returns None when none of ``failed`` (index -> bookie) is still at its index
    in the last ensemble (someone already replaced them: adopt the stored value). Otherwise
    replaces them (``avoid``: other bookies that failed earlier, skipped while possible) and
    puts the new ensemble at ``lac + 1``: a new segment, or the last segment replaced in place
    when it already starts there. Raises NotEnoughBookiesError when no index can be replaced.
    """
    if md.state == LedgerState.CLOSED:
        raise LedgerClosedError(
            f"ledger closed at {md.last_entry_id} meanwhile; ensemble change refused",
            ledger_id=md.ledger_id,
        )
    if md.state == LedgerState.IN_RECOVERY:
        raise LedgerFencedError(
            "ledger is in recovery; ensemble change refused", ledger_id=md.ledger_id
        )
    last = md.last_segment
    still = {i: b for i, b in failed.items() if last.ensemble[i] == b}
    if not still:
        return None
    key = lac + 1
    if last.first_entry_id > key:
        raise UnexpectedConditionError(
            f"last segment starts at {last.first_entry_id}, after the new segment key {key}",
            ledger_id=md.ledger_id,
        )
    try:
        new_ens, _ = placement.replace_bookies(candidates, last.ensemble, still, exclude=avoid)
    except NotEnoughBookiesError:
        # Bookies that failed before may be healthy again; better than giving up.
        new_ens, _ = placement.replace_bookies(candidates, last.ensemble, still)
    return md.with_new_segment(key, new_ens)


def writer_close_transform(
    md: LedgerMetadata, last_entry_id: int, length: int
) -> LedgerMetadata | None:
    """The writer's close CAS transform: CLOSED at (``last_entry_id``, ``length``).

    Already CLOSED with the same values -> None (success, no write); with other values ->
    MetadataVersionError (someone recovered the ledger while our adds were outstanding).
    OPEN and IN_RECOVERY are both closed: the writer's LAC covers every entry it acknowledged.
    """
    if md.state == LedgerState.CLOSED:
        if (md.last_entry_id, md.length) == (last_entry_id, length):
            return None
        raise MetadataVersionError(
            f"ledger already closed at entry {md.last_entry_id} (length {md.length}); "
            f"this writer's LAC is {last_entry_id} (length {length})",
            ledger_id=md.ledger_id,
        )
    return md.closed(last_entry_id, length)


def _per_entry(exc: BKError, ledger_id: int, entry_id: int) -> BKError:
    """A copy of ``exc`` naming one entry (each failed add gets its own exception object)."""
    err = type(exc)(exc.reason, ledger_id=ledger_id, entry_id=entry_id, bookie=exc.bookie)
    err.__cause__ = exc
    return err


# ---- I/O: the add pipeline ----------------------------------------------------------------------

ChangeEnsemble = Callable[[dict[int, str]], Awaitable[tuple[str, ...]]]


class AddPipeline:
    """Pipelined adds to the current (last) ensemble with in-order delivery.

    Every pending entry is above the LAC, and every ensemble change starts at LAC + 1, so all
    pending entries always live in the current ensemble. ``change_ensemble(failed)`` must
    return the new ensemble (or raise); ``on_unrecoverable(exc)`` decides what an unrecoverable
    error does (the writer closes the ledger, recovery just fails). ``recovery`` sends adds
    with the recovery flag and high priority (they pass a fenced bookie).
    """

    def __init__(
        self,
        ctx: ClientContext,
        ledger_id: int,
        e: int,
        wq: int,
        aq: int,
        ensemble: Sequence[str],
        master_key: bytes,
        *,
        change_ensemble: ChangeEnsemble,
        on_unrecoverable: Callable[[BKError], None],
        lac: int = INVALID_ENTRY_ID,
        lac_length: int = 0,
        recovery: bool = False,
        on_delivered: Callable[[PendingAdd], None] | None = None,
        name: str = "writer",
    ) -> None:
        self.ctx = ctx
        self.ledger_id = ledger_id
        self.queue = AckQueue(e, wq, aq, lac, lac_length)
        self.ensemble = tuple(ensemble)
        self.master_key = master_key
        self.recovery = recovery
        self.name = name
        self._change_ensemble = change_ensemble
        self._on_unrecoverable = on_unrecoverable
        self._on_delivered = on_delivered
        self._changing = False
        self._failures: dict[int, str] = {}
        self._delayed_failures: dict[int, str] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopped = False
        self.failed_bookies: set[str] = set()
        self.ensemble_changes = 0

    # ---- state ------------------------------------------------------------------------------

    @property
    def lac(self) -> int:
        return self.queue.lac

    @property
    def lac_length(self) -> int:
        return self.queue.lac_length

    @property
    def changing_ensemble(self) -> bool:
        return self._changing

    # ---- adds -------------------------------------------------------------------------------

    def submit(self, entry_id: int, body: bytes, length: int) -> asyncio.Future[int]:
        """Queue ``entry_id`` (the next id) and send it to its write set; the future resolves
        with the entry id once it and every lower entry reached AQ."""
        if self._stopped:
            raise ClientClosedError(f"{self.name} stopped", ledger_id=self.ledger_id)
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        if self._delayed_failures:
            delayed, self._delayed_failures = self._delayed_failures, {}
            for idx, bookie in delayed.items():
                if self.ensemble[idx] == bookie:
                    self.bookie_failed(idx, bookie)
        add = self.queue.push(entry_id, length, body, fut)
        for idx in self.queue.write_set(entry_id):
            self._send(add, idx)
        return fut

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _send(self, add: PendingAdd, idx: int) -> None:
        self._spawn(self._write(add, idx, self.ensemble[idx]))

    async def _write(self, add: PendingAdd, idx: int, bookie: str) -> None:
        try:
            await self.ctx.pool.add(
                bookie,
                self.ledger_id,
                add.entry_id,
                self.master_key,
                add.body,
                recovery=self.recovery,
                high_priority=self.recovery,
            )
        except BKError as exc:
            self._write_failed(add, idx, bookie, exc)
        except (OSError, ValueError) as exc:  # an unknown outcome: treat as a bookie failure
            self._write_failed(add, idx, bookie, BKError(f"{type(exc).__name__}: {exc}"))
        else:
            self._write_ok(add, idx, bookie)

    def _write_ok(self, add: PendingAdd, idx: int, bookie: str) -> None:
        if self._stopped or self.ensemble[idx] != bookie:
            return  # replaced meanwhile: this ack does not count for the new ensemble
        if self.queue.get(add.entry_id) is not add:
            return  # delivered or failed already
        if self.queue.ack(add.entry_id, idx):
            log.debug(
                "ledger %d entry %d: reached AQ (%s)", self.ledger_id, add.entry_id, self.name
            )
            self._deliver()

    def _write_failed(self, add: PendingAdd, idx: int, bookie: str, exc: BKError) -> None:
        if self._stopped or self.ensemble[idx] != bookie:
            return
        pending = self.queue.get(add.entry_id) is add
        log.debug(
            "ledger %d entry %d: %s add to bookie %s (index %d) failed: %s",
            self.ledger_id,
            add.entry_id,
            self.name,
            bookie,
            idx,
            exc.reason,
        )
        if isinstance(exc, ClientClosedError):
            self.fail_all(exc)
            return
        if not pending or add.completed:
            # The entry already has AQ: like BookKeeper, remember a *delayed* write failure and
            # replace the bookie when the next entry is sent (an EFENCED then surfaces through
            # the CAS). With no further adds nothing changes, so a finished recovery never
            # commits an empty trailing segment.
            self._delayed_failures[idx] = bookie
            return
        if isinstance(exc, _UNRECOVERABLE):
            self._on_unrecoverable(exc)
            return
        self.bookie_failed(idx, bookie)

    def _deliver(self) -> None:
        if self._stopped:
            return
        for add in self.queue.pop_deliverable(blocked=self._changing):
            if self._on_delivered is not None:
                self._on_delivered(add)
            if add.future is not None and not add.future.done():
                add.future.set_result(add.entry_id)

    # ---- failures ---------------------------------------------------------------------------

    def bookie_failed(self, idx: int, bookie: str) -> None:
        """Schedule the replacement of ``bookie`` at ensemble index ``idx``."""
        if self._stopped:
            return
        self.failed_bookies.add(bookie)
        self._failures[idx] = bookie
        if not self._changing:
            self._changing = True
            self._spawn(self._change_loop())

    async def _change_loop(self) -> None:
        try:
            while self._failures and not self._stopped:
                failed = {i: b for i, b in self._failures.items() if self.ensemble[i] == b}
                self._failures.clear()
                if not failed:
                    continue
                log.debug(
                    "ledger %d: %s changing ensemble %s at LAC %d, failed %s",
                    self.ledger_id,
                    self.name,
                    list(self.ensemble),
                    self.lac,
                    failed,
                )
                try:
                    limit = self.ctx.max_ensemble_changes
                    if limit is not None and self.ensemble_changes >= limit:
                        # BookKeeper's maxNumEnsembleChanges: stop chasing bookies that keep
                        # failing instead of changing ensembles forever.
                        raise WriteError(
                            f"{self.ensemble_changes} ensemble changes, the limit is {limit}",
                            ledger_id=self.ledger_id,
                        )
                    new = tuple(await self._change_ensemble(failed))
                except BKError as exc:
                    log.warning(
                        "ledger %d: %s ensemble change failed: %s", self.ledger_id, self.name, exc
                    )
                    self._changing = False
                    self._on_unrecoverable(exc)
                    return
                if self._stopped:
                    return
                replaced = [i for i in range(len(new)) if new[i] != self.ensemble[i]]
                self.ensemble = new
                self.ensemble_changes += 1
                # A failed index that could not be replaced goes round again: the next attempt
                # either finds a bookie or fails with NotEnoughBookies.
                for i, b in failed.items():
                    if new[i] == b:
                        self._failures[i] = b
                resend = self.queue.unset_replaced(replaced)
                log.debug(
                    "ledger %d: %s new ensemble %s (indices %s replaced), re-sending %d writes",
                    self.ledger_id,
                    self.name,
                    list(new),
                    replaced,
                    len(resend),
                )
                for add, i in resend:
                    self._send(add, i)
        finally:
            self._changing = False
        self._deliver()

    def fail_all(self, exc: BKError) -> list[PendingAdd]:
        """Fail every pending add with (a per-entry copy of) ``exc``; returns them."""
        drained = self.queue.drain()
        for add in drained:
            if add.future is not None and not add.future.done():
                add.future.set_exception(_per_entry(exc, self.ledger_id, add.entry_id))
        if drained:
            log.debug(
                "ledger %d: %s failed %d pending adds (%d..%d) with %s",
                self.ledger_id,
                self.name,
                len(drained),
                drained[0].entry_id,
                drained[-1].entry_id,
                type(exc).__name__,
            )
        return drained

    async def settle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for every write sent so far to be answered (acked or
        failed); True if all were. An entry completes at AQ; its copies to the rest of its
        write set may still be in flight, and :meth:`stop` would cancel them."""
        tasks = list(self._tasks)
        if not tasks:
            return True
        _, pending = await asyncio.wait(tasks, timeout=timeout)
        return not pending

    def stop(self) -> None:
        """Stop: cancel every outstanding write and ensemble change; completions are ignored."""
        self._stopped = True
        for task in list(self._tasks):
            task.cancel()

    async def wait_stopped(self) -> None:
        """Wait until the cancelled tasks have unwound."""
        await wait_unwound(list(self._tasks))


# ---- the writer ---------------------------------------------------------------------------------


class LedgerWriter:
    """The single writer of a ledger it created.

    ``await add(payload)`` returns the entry id once the entry and all lower ones reached AQ;
    ``add_async`` returns that future at once so adds can be pipelined. ``close()`` records
    lastEntryId = LAC in the metadata. After an unrecoverable error (fenced, closed, no bookies
    left) pending adds fail and the ledger is closed at the LAC -- unless the metadata the
    writer last saw is IN_RECOVERY, in which case only the adds fail and the recoverer closes.
    """

    def __init__(
        self, ctx: ClientContext, versioned: Versioned[LedgerMetadata], password: bytes
    ) -> None:
        md = versioned.value
        assert md.digest_type is not None
        self.ctx = ctx
        self._versioned = versioned
        self.digest = digest_manager(md.ledger_id, md.digest_type, password)
        self.master_key = master_key(password)
        self._length = 0
        self._closed = False
        self._refused: BKError | None = None
        self._close_task: asyncio.Future[LedgerMetadata] | None = None
        self.pipeline = AddPipeline(
            ctx,
            md.ledger_id,
            md.ensemble_size,
            md.write_quorum,
            md.ack_quorum,
            md.last_segment.ensemble,
            self.master_key,
            change_ensemble=self._change_ensemble,
            on_unrecoverable=self._on_unrecoverable,
            name="writer",
        )

    # ---- creation ---------------------------------------------------------------------------

    @classmethod
    async def create(
        cls,
        ctx: ClientContext,
        *,
        ensemble_size: int = 3,
        write_quorum: int = 2,
        ack_quorum: int = 2,
        digest_type: DigestType = DigestType.CRC32C,
        password: bytes = b"",
        custom_metadata: Mapping[str, bytes] | None = None,
        ledger_id: int | None = None,
    ) -> LedgerWriter:
        """Create a ledger (v3 metadata, ZooKeeper ``create``) on ``ensemble_size`` writable
        bookies and return its writer. The id comes from the shared id generator unless
        given; a generated id that already exists is retried with a new one."""
        check_quorum(ensemble_size, write_quorum, ack_quorum)
        if digest_type is None:
            raise IncorrectParameterError("a digest type is required")
        candidates = await ctx.writable_bookies()
        ensemble = ctx.placement.new_ensemble(candidates, ensemble_size)
        for attempt in range(10):
            lid = (
                ledger_id if ledger_id is not None else await ctx.meta(ctx.store.generate_ledger_id)
            )
            md = LedgerMetadata(
                ledger_id=lid,
                ensemble_size=ensemble_size,
                write_quorum=write_quorum,
                ack_quorum=ack_quorum,
                segments=(Segment(0, ensemble),),
                state=LedgerState.OPEN,
                digest_type=DigestType(digest_type),
                password=bytes(password),
                ctime=int(time.time() * 1000),
                store_ctime=True,
                custom_metadata=dict(custom_metadata or {}),
                ctoken=random.getrandbits(63) or 1,
                format_version=3,
            ).validate()
            try:
                versioned = await ctx.meta(ctx.store.create_ledger, md)
            except LedgerExistsError:
                if ledger_id is not None or attempt == 9:
                    raise
                log.warning("ledger %d exists already; generating another id", lid)
                continue
            log.debug(
                "ledger %d created: E=%d WQ=%d AQ=%d %s ensemble %s",
                lid,
                ensemble_size,
                write_quorum,
                ack_quorum,
                DigestType(digest_type).name,
                list(ensemble),
            )
            return cls(ctx, versioned, bytes(password))
        raise AssertionError("unreachable")

    # ---- state ------------------------------------------------------------------------------

    @property
    def ledger_id(self) -> int:
        return self._versioned.value.ledger_id

    @property
    def metadata(self) -> LedgerMetadata:
        """The metadata this writer last wrote or read."""
        return self._versioned.value

    @property
    def lac(self) -> int:
        """Last add confirmed: the highest entry delivered to the application."""
        return self.pipeline.lac

    @property
    def length(self) -> int:
        """Ledger length up to and including the LAC entry."""
        return self.pipeline.lac_length

    @property
    def last_add_pushed(self) -> int:
        return self.pipeline.queue.last_pushed

    @property
    def ensemble(self) -> tuple[str, ...]:
        """The current (last) ensemble."""
        return self.pipeline.ensemble

    @property
    def closed(self) -> bool:
        return self._closed

    def pending_entries(self) -> list[tuple[int, tuple[int, ...], bool]]:
        """(entry id, acked ensemble indices, reached AQ) of every pending add."""
        return self.pipeline.queue.snapshot()

    # ---- adds -------------------------------------------------------------------------------

    def add_async(self, payload: bytes) -> asyncio.Future[int]:
        """Start adding ``payload``; the future gives its entry id once acknowledged.

        Raises LedgerClosedError once the writer is closed, and the fencing error once adds
        were refused because the ledger is being recovered.
        """
        if self._closed or self.metadata.is_closed:
            raise LedgerClosedError("ledger is closed", ledger_id=self.ledger_id)
        if self._refused is not None:
            raise _per_entry(self._refused, self.ledger_id, self.last_add_pushed + 1)
        entry_id = self.last_add_pushed + 1
        self._length += len(payload)
        # The LAC at send time is piggybacked: recovery starts from the highest one it finds.
        body = self.digest.package_entry(entry_id, self.lac, self._length, payload)
        return self.pipeline.submit(entry_id, body, self._length)

    async def add(self, payload: bytes) -> int:
        """Add ``payload`` and wait for it to be acknowledged; returns its entry id."""
        return await self.add_async(payload)

    # ---- ensemble change --------------------------------------------------------------------

    async def _change_ensemble(self, failed: dict[int, str]) -> tuple[str, ...]:
        ctx = self.ctx
        candidates = await ctx.writable_bookies()
        lac = self.lac  # stable: nothing is delivered while the change is pending
        avoid = set(self.pipeline.failed_bookies)

        def transform(md: LedgerMetadata) -> LedgerMetadata | None:
            return ensemble_change_transform(md, lac, failed, candidates, ctx.placement, avoid)

        try:
            versioned = await ctx.meta(
                ctx.store.update_ledger, self.ledger_id, transform, current=self._versioned
            )
        except (LedgerClosedError, LedgerFencedError):
            # Adopt what the store says: IN_RECOVERY makes us leave the close to the recoverer.
            with contextlib.suppress(BKError):
                self._versioned = await ctx.read_metadata(self.ledger_id)
            raise
        self._versioned = versioned
        md = versioned.value
        log.debug(
            "ledger %d: writer ensemble change committed at LAC %d: segments %s",
            self.ledger_id,
            lac,
            [(s.first_entry_id, list(s.ensemble)) for s in md.segments],
        )
        return md.last_segment.ensemble

    def _on_unrecoverable(self, exc: BKError) -> None:
        state = self.metadata.state
        if self._closed:
            self.pipeline.fail_all(exc)
        elif state == LedgerState.IN_RECOVERY:
            # A recoverer owns the ledger now: fail what is pending, refuse new adds, and do not
            # close -- the recoverer will (our own close() would still be honoured).
            log.warning(
                "ledger %d: writer got %s while the ledger is IN_RECOVERY; failing adds only",
                self.ledger_id,
                type(exc).__name__,
            )
            self._refused = exc
            self.pipeline.stop()
            self.pipeline.fail_all(exc)
        else:
            log.warning(
                "ledger %d: writer got unrecoverable %s; closing at LAC %d",
                self.ledger_id,
                type(exc).__name__,
                self.lac,
            )
            task = self._start_close(exc)
            task.add_done_callback(_log_close_outcome)

    # ---- close ------------------------------------------------------------------------------

    def _start_close(self, fail_with: BKError) -> asyncio.Future[LedgerMetadata]:
        if self._close_task is None:
            self._closed = True
            # Nothing pending can be delivered any more: abandon outstanding writes and any
            # ensemble change (a CAS already in flight may still land; ours then re-reads).
            self.pipeline.stop()
            self.pipeline.fail_all(fail_with)
            self._close_task = asyncio.ensure_future(self._close_metadata(self.lac, self.length))
        return self._close_task

    async def _close_metadata(self, last_entry_id: int, length: int) -> LedgerMetadata:
        ctx = self.ctx

        def transform(md: LedgerMetadata) -> LedgerMetadata | None:
            return writer_close_transform(md, last_entry_id, length)

        try:
            versioned = await ctx.meta(
                ctx.store.update_ledger, self.ledger_id, transform, current=self._versioned
            )
        except MetadataVersionError:
            with contextlib.suppress(BKError):
                self._versioned = await ctx.read_metadata(self.ledger_id)
            log.warning(
                "ledger %d: writer close at %d conflicts with stored %s",
                self.ledger_id,
                last_entry_id,
                self.metadata.state.name,
            )
            raise
        finally:
            await self.pipeline.wait_stopped()
        self._versioned = versioned
        log.debug(
            "ledger %d: writer closed it at entry %d, length %d",
            self.ledger_id,
            versioned.value.last_entry_id,
            versioned.value.length,
        )
        return versioned.value

    async def close(self) -> LedgerMetadata:
        """Close the ledger at the LAC (adds still pending fail with LedgerClosedError).

        Returns the closed metadata. Idempotent. Raises MetadataVersionError when someone else
        closed the ledger at a different (lastEntryId, length); the handle is closed anyway.
        """
        task = self._start_close(
            LedgerClosedError("ledger closed with the add outstanding", ledger_id=self.ledger_id)
        )
        return await asyncio.shield(task)

    async def abort(self) -> None:
        """Stop without touching the metadata, as if the writer process died: outstanding
        writes are abandoned and pending adds fail with ClientClosedError."""
        self._closed = True
        self.pipeline.stop()
        self.pipeline.fail_all(
            ClientClosedError("writer aborted with the add outstanding", ledger_id=self.ledger_id)
        )
        await self.pipeline.wait_stopped()


def _log_close_outcome(task: asyncio.Future[LedgerMetadata]) -> None:
    # A background close after an unrecoverable error has nobody awaiting it: log the outcome
    # (and mark the exception retrieved).
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        log.warning("background close after unrecoverable add error failed: %s", exc)
