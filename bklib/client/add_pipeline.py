"""The add pipeline of a ledger's writer: pipelined adds, in-order acks, ensemble changes.

* :class:`AckQueue` -- the pending adds of one handle in entry order (BookKeeper's
  ``PendingAddOp`` queue and ``AckSet``): an entry is *completed* once AQ bookies of its write
  set acked it, and is *delivered* (its future resolved, LAC advanced) only when every lower
  entry was delivered and no ensemble change is in progress. Replacing ensemble indices
  un-acks them in every pending entry whose write set holds them and says what to re-send.
  Pure logic, unit-tested without I/O.
* :class:`AddPipeline` -- sends each entry to its write set in the current ensemble, tracks
  acks in an AckQueue, delivers in order, and on a bookie failure runs one ensemble change at a
  time (failures arriving meanwhile are handled in a follow-up round) through a pluggable
  ``change_ensemble`` coroutine, then re-sends the outstanding entries to the replacements.
  No ack is delivered while a change is pending. Shared by
  :class:`~bklib.client.writer.LedgerWriter` (changes go to ZooKeeper) and ledger recovery's
  write-back (changes stay in memory until its close).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field

from bklib.cancellation import wait_unwound
from bklib.client.reader import ClientContext
from bklib.errors import (
    BKError,
    ClientClosedError,
    IllegalOpError,
    LedgerFencedError,
    UnauthorizedAccessError,
    UnexpectedConditionError,
    WriteError,
)
from bklib.meta.model import INVALID_ENTRY_ID
from bklib.quorum import check_quorum, write_set

log = logging.getLogger(__name__)

__all__ = ["AckQueue", "AddPipeline", "ChangeEnsemble", "PendingAdd", "per_entry_error"]

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


def per_entry_error(exc: BKError, ledger_id: int, entry_id: int) -> BKError:
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
                add.future.set_exception(per_entry_error(exc, self.ledger_id, add.entry_id))
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
