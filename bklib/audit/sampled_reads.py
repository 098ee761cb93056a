"""The sampled check's reads: the few reads of every (ledger, bookie) pair, sent to each
bookie in request groups that span ledgers.

A sample reads two or three entries of each range a bookie must hold, so a check of a million
ledgers is millions of pairs of a few reads each. Probing each pair on its own (a task, a
chain of coroutines and a future per pair, as :class:`~bklib.audit.checker.ReplicaChecker`
probes a bookie) cost several times the reads themselves. Here the checker's thread hands
ledgers over in bulk (:meth:`SampledReads.submit`, one wake-up of the loop for all those
queued), each bookie has one queue of pairs, and its reads leave in groups of up to half its
``--reads-in-flight`` (:meth:`~bklib.client.pool.BookieClientPool.read_many`), whatever
ledgers they belong to. Each read keeps its own deadline and its own answer.

Everything below runs on the bookie client's event loop, except :meth:`SampledReads.submit`
and :meth:`LedgerReads.probes`.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import itertools
import logging
import random
from collections.abc import Callable, Collection
from typing import Any

from bklib.audit.entry_probe import (
    UNKNOWN,
    EntryTally,
    PlannedRange,
    ProbeResult,
    all_held,
    answer_kind,
    sampled_ids,
    stripe_plan,
)
from bklib.audit.model import LedgerView
from bklib.client.operations import ReadResult
from bklib.client.pool import BookieClientPool, SyncBookieClient
from bklib.client.throttle import RateLimiter, ReadGate
from bklib.digest import DigestManager
from bklib.errors import BKError

__all__ = ["LedgerReads", "SampledReads"]

log = logging.getLogger(__name__)

GROUPS_OUT = 2
"""Request groups a bookie may have outstanding from the sampled reads at once."""

LacReader = Callable[[Any, DigestManager | None], int | None]
"""A READ_LAC answer's LAC (``bklib.audit.checker._lac_of``)."""


class _PairReads:
    """One (ledger, bookie) pair's planned reads and, as their answers come, what each says."""

    __slots__ = ("bookie", "errors", "ids", "kinds", "left", "owner", "plan", "starts")

    def __init__(
        self,
        owner: LedgerReads,
        bookie: str,
        plan: list[PlannedRange],
        ids: list[int],
        starts: set[int],
    ) -> None:
        self.owner = owner
        self.bookie = bookie
        self.plan = plan
        self.ids = ids
        self.starts = starts
        self.kinds = [UNKNOWN] * len(ids)
        self.errors: dict[int, str] = {}
        self.left = len(ids)

    def settle(self, index: int, kind: int, error: BaseException | None) -> None:
        """Record the answer to read ``index``; the last one settles the pair."""
        self.kinds[index] = kind
        if kind == UNKNOWN and len(self.errors) < 3:
            self.errors[index] = str(error)
        self.left -= 1
        if self.left == 0:
            self.owner.pair_done()

    def result(self, sample: bool) -> ProbeResult:
        """What the answers say, summed up as a probe's would be."""
        if sample and not any(self.kinds):  # every read HELD (0): the usual answer
            return all_held(self.plan, len(self.ids))
        tally = EntryTally(self.starts)
        errors = self.errors
        for i, (x, kind) in enumerate(zip(self.ids, self.kinds, strict=True)):
            tally.add(x, kind, errors.get(i))
        return tally.result(self.plan, sample=sample)


class LedgerReads:
    """One ledger's sampled reads, from its LACs (a ledger not closed) to every pair's last
    answer; :attr:`future` is done when they are all in."""

    __slots__ = ("cancelled", "dm", "future", "lacs", "ledger", "left", "pairs", "seq")

    def __init__(self, ledger: LedgerView, dm: DigestManager | None) -> None:
        self.ledger = ledger
        self.dm = dm
        # Done with None: a result of ``self`` would be a cycle, which the paused collector
        # (jobs/runtime/gc_pause.py) would keep until the run's end.
        self.future: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.lacs: dict[str, int | None] = {}
        """Each asked bookie's LAC of the ledger; None where its READ_LAC gave none."""
        self.pairs: dict[str, _PairReads] = {}
        self.left = 0
        self.cancelled = False
        self.seq = -1  # its place in the order of submission (SampledReads.submit)

    def pair_done(self) -> None:
        self.left -= 1
        if self.left == 0:
            self._finish()

    def _finish(self) -> None:
        if not self.future.done():
            self.future.set_result(None)

    def fail(self, exc: BaseException) -> None:
        """End the ledger's reads with ``exc`` (an error that is not a bookie's answer)."""
        if not self.future.done():
            self.future.set_exception(exc)

    def probes(self, sample: bool) -> dict[str, ProbeResult]:
        """Each read bookie's :class:`ProbeResult` (in the checker's thread, once done). The
        pairs are let go: each points back here, and the collector may be paused."""
        pairs, self.pairs = self.pairs, {}
        return {b: pair.result(sample) for b, pair in pairs.items()}


class _BookieQueue:
    """The pairs waiting to be read from one bookie, sent in groups.

    At most :data:`GROUPS_OUT` groups are outstanding per bookie: the pairs queued meanwhile
    leave together when one is answered. A group per pair would cost a task, a request group
    and a send each, for three reads or so; this way a group holds what arrived during one
    round trip, up to half the bookie's gate.
    """

    __slots__ = (
        "bookie",
        "gate",
        "group",
        "limiter",
        "outstanding",
        "owner",
        "pairs",
        "tasks",
        "waiting",
    )

    def __init__(
        self, owner: SampledReads, bookie: str, gate: ReadGate, limiter: RateLimiter
    ) -> None:
        self.owner = owner
        self.bookie = bookie
        self.gate = gate
        self.limiter = limiter
        self.group = max(1, gate.limit // 2)  # one group sent while the other is answered
        self.pairs: collections.deque[tuple[_PairReads, int]] = collections.deque()
        self.outstanding = 0
        self.waiting = False  # a group waits for the gate (another reader holds it)
        self.tasks: set[asyncio.Task[None]] = set()

    def add(self, pair: _PairReads) -> None:
        """Queue ``pair``; :meth:`kick` sends it."""
        self.pairs.append((pair, 0))

    def kick(self, pool: BookieClientPool) -> None:
        """Send groups while fewer than :data:`GROUPS_OUT` are outstanding. An error here is
        no bookie's answer: every queued pair's ledger ends with it (as in :meth:`_send`), so
        the checker never waits for pairs nobody will send."""
        forming: list[_PairReads] = []  # pairs taken from the queue, not yet in a task's hands
        try:
            self._fill(pool, forming)
        except Exception as exc:  # noqa: BLE001 - each ledger's waiter raises it
            for pair in itertools.chain(forming, (p for p, _ in self.pairs)):
                pair.owner.fail(exc)
            self.pairs.clear()

    def _fill(self, pool: BookieClientPool, forming: list[_PairReads]) -> None:
        if self.waiting:
            return  # the waiting group sends, then kicks again
        while self.pairs and self.outstanding < GROUPS_OUT:
            forming.clear()
            reads, slots = self._next_group(forming)
            if not reads:
                continue
            if not self.gate.try_take(len(reads)):
                self.waiting = True
                self._spawn(self._send_when_let(pool, reads, slots))
                forming.clear()
                return
            self._spawn(self._send(pool, reads, slots))
            self.outstanding += 1
            forming.clear()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _next_group(
        self, taken: list[_PairReads]
    ) -> tuple[list[tuple[int, int]], list[tuple[_PairReads, int]]]:
        """The next group's reads and where each answer goes, pairs of abandoned ledgers
        skipped; a pair larger than what is left of the group is split. Each pair taken from
        the queue is added to ``taken`` first (so an error midway leaves none unaccounted)."""
        reads: list[tuple[int, int]] = []
        slots: list[tuple[_PairReads, int]] = []
        room = self.group
        pairs = self.pairs
        while pairs and room:
            pair, start = pairs.popleft()
            taken.append(pair)
            if pair.owner.cancelled:
                continue
            lid = pair.owner.ledger.ledger_id
            ids = pair.ids
            end = min(len(ids), start + room)
            for i in range(start, end):
                reads.append((lid, ids[i]))
                slots.append((pair, i))
            room -= end - start
            if end < len(ids):
                pairs.appendleft((pair, end))
        return reads, slots

    async def _send_when_let(
        self,
        pool: BookieClientPool,
        reads: list[tuple[int, int]],
        slots: list[tuple[_PairReads, int]],
    ) -> None:
        """Wait for the bookie's gate (the groups outstanding give it back), then send."""
        try:
            await self.gate.take(len(reads))
        finally:
            self.waiting = False
        self.outstanding += 1
        await self._send(pool, reads, slots)

    async def _send(
        self,
        pool: BookieClientPool,
        reads: list[tuple[int, int]],
        slots: list[tuple[_PairReads, int]],
    ) -> None:
        """One group: its reads' answers, paid to the rate limiter, then recorded."""
        try:
            try:
                outs: list[ReadResult | BKError] | list[BKError] = await pool.read_many(
                    self.bookie, reads, timeout=self.owner.timeout
                )
            except BKError as exc:  # not one could be sent: the bookie is unavailable
                outs = [exc] * len(reads)
            await self.limiter.acquire(sum(len(r.body) for r in outs if type(r) is ReadResult))
        except Exception as exc:  # noqa: BLE001 - not a bookie's answer: the check fails
            # Never settled as unknown (that would be a finding), nor left unsettled (the
            # checker would wait for ever): each ledger's waiter raises it.
            for pair, _ in slots:
                pair.owner.fail(exc)
            return
        finally:
            self.gate.give(len(reads))  # answered (or given up on): no longer outstanding
            self.outstanding -= 1
        for (pair, i), out in zip(slots, outs, strict=True):
            try:
                if type(out) is ReadResult:
                    pair.settle(i, answer_kind(pair.ids[i], out.body, None, pair.owner.dm), None)
                else:
                    assert isinstance(out, BKError)
                    pair.settle(i, answer_kind(pair.ids[i], None, out, None), out)
            except Exception as exc:  # noqa: BLE001 - the ledger's waiter gets it, never lost
                pair.owner.fail(exc)
        self.kick(pool)  # what queued up meanwhile

    def cancel(self) -> None:
        for task in self.tasks:
            task.cancel()


class SampledReads:
    """The sampled reads of one checker: ledgers handed over by :meth:`submit`, their pairs
    read from per-bookie queues on the client's loop.

    ``skip(bookie)`` says a bookie is not to be read (lost, or treated as down); ``bounds``
    gives a bookie's gate and rate limiter, shared with the checker's other readers of it;
    ``rng_of(ledger_id, bookie)`` the source of a pair's random picks; ``lac_of`` reads a
    READ_LAC answer.
    """

    def __init__(
        self,
        client: SyncBookieClient,
        *,
        timeout: float,
        verify_percentage: float,
        batch: int,
        skip: Callable[[str], bool],
        bounds: Callable[[str], tuple[ReadGate, RateLimiter]],
        rng_of: Callable[[int, str], random.Random | None],
        lac_of: LacReader,
    ) -> None:
        self.client = client
        self.timeout = timeout
        self.verify_percentage = verify_percentage
        self._skip = skip
        self._bounds = bounds
        self._rng_of = rng_of
        self._lac_of = lac_of
        # Batches handed over by the checker's thread, taken by the loop.
        self._inbox: collections.deque[list[LedgerReads]] = collections.deque()
        self._woken = False
        self.batch = max(1, batch)
        self._batch: list[LedgerReads] = []  # the checker's thread's, not handed over yet
        self._submitted = 0
        self._handed = 0  # items submitted before this one are handed to the loop
        self._kick_due = False
        self._queues: dict[str, _BookieQueue] = {}
        self._touched: set[_BookieQueue] = set()  # queued to since their last kick
        self._lac_tasks: set[asyncio.Task[None]] = set()

    # ---- the checker's thread -------------------------------------------------------------------

    def submit(self, item: LedgerReads) -> None:
        """Queue ``item``; the queue is handed to the loop :attr:`batch` items at a time, so
        that each bookie's reads of a batch's ledgers leave in a few large groups."""
        item.seq = self._submitted
        self._submitted += 1
        self._batch.append(item)
        if len(self._batch) >= self.batch:
            self.hand_over()

    def awaiting(self, item: LedgerReads) -> None:
        """About to wait for ``item``: hand the queue over if ``item`` is still in it."""
        if item.seq >= self._handed:
            self.hand_over()

    def hand_over(self) -> None:
        """Hand every queued item to the loop (woken once for all of them)."""
        self._handed = self._submitted
        if self._batch:
            self._inbox.append(self._batch)
            self._batch = []
        if not self._woken:
            self._woken = True
            try:
                self.client.post(self._drain)
            except BaseException:
                self._woken = False  # not woken after all: the next hand-over tries again
                raise

    def abandon(self, items: Collection[LedgerReads]) -> None:
        """Stop reading for ``items`` (the check was given up): what is queued is skipped, and
        the groups and LAC reads in flight are cancelled."""
        for item in items:
            item.cancelled = True
            item.future.cancel()
        with contextlib.suppress(Exception):  # the client may be closed already
            self.client.post(self._cancel_all)

    # ---- the loop ------------------------------------------------------------------------------

    def _drain(self, pool: BookieClientPool) -> None:
        self._woken = False  # before taking: an item queued from now on wakes the loop again
        inbox = self._inbox
        while inbox:
            for item in inbox.popleft():
                if item.cancelled:
                    continue
                try:
                    self._begin(pool, item)
                except Exception as exc:  # noqa: BLE001 - handed to the ledger's waiter
                    item.fail(exc)
        self._kick(pool)

    def _kick(self, pool: BookieClientPool) -> None:
        """Send what was queued: everything handed over at once leaves in as few groups."""
        self._kick_due = False
        touched, self._touched = self._touched, set()
        for queue in touched:
            queue.kick(pool)

    def _begin(self, pool: BookieClientPool, item: LedgerReads) -> None:
        """Start ``item``: plan it now if closed, else once its LACs are read."""
        ledger = item.ledger
        if ledger.is_closed:
            self._plan(pool, item, None)
            return
        last = ledger.segments[-1].ensemble if ledger.segments else ()
        asked = [b for b in dict.fromkeys(last) if not self._skip(b)]
        if not asked:
            self._plan(pool, item, None)
            return
        task = asyncio.get_running_loop().create_task(self._read_lacs(pool, item, asked))
        self._lac_tasks.add(task)
        task.add_done_callback(self._lac_tasks.discard)

    async def _read_lacs(self, pool: BookieClientPool, item: LedgerReads, asked: list[str]) -> None:
        lid = item.ledger.ledger_id
        try:
            answers = await asyncio.gather(
                *(pool.read_lac(b, lid, timeout=self.timeout) for b in asked),
                return_exceptions=True,
            )
            for b, answer in zip(asked, answers, strict=True):
                if isinstance(answer, BKError):
                    # NoSuchEntry/NoSuchLedger or unknown: no LAC from this bookie
                    item.lacs[b] = None
                elif isinstance(answer, BaseException):
                    raise answer
                else:
                    item.lacs[b] = self._lac_of(answer, item.dm)
            known = [v for v in item.lacs.values() if v is not None]
            self._plan(pool, item, max(known) if known else None)
            if not self._kick_due:  # once for every ledger planned in this turn of the loop
                self._kick_due = True
                asyncio.get_running_loop().call_soon(self._kick, pool)
        except Exception as exc:  # noqa: BLE001 - handed to the ledger's waiter
            item.fail(exc)

    def _plan(self, pool: BookieClientPool, item: LedgerReads, lac: int | None) -> None:
        """Queue the reads of every pair of ``item`` on its bookie's queue."""
        ledger = item.ledger
        e, wq = ledger.ensemble_size, ledger.write_quorum
        assert e is not None and wq is not None
        lid = ledger.ledger_id
        segments = ledger.segments or ()
        queued: list[_PairReads] = []
        for b in ledger.bookies():
            if self._skip(b):
                continue
            plan = stripe_plan(segments, b, lac)
            ids, starts = sampled_ids(plan, e, wq, self.verify_percentage, self._rng_of(lid, b))
            pair = item.pairs[b] = _PairReads(item, b, plan, ids, starts)
            if ids:
                queued.append(pair)
        item.left = len(queued)
        if not queued:
            item._finish()
            return
        for pair in queued:
            queue = self._queue(pair.bookie)
            queue.add(pair)
            self._touched.add(queue)

    def _queue(self, bookie: str) -> _BookieQueue:
        queue = self._queues.get(bookie)
        if queue is None:
            gate, limiter = self._bounds(bookie)
            queue = self._queues[bookie] = _BookieQueue(self, bookie, gate, limiter)
        return queue

    def _cancel_all(self, pool: BookieClientPool) -> None:
        for queue in self._queues.values():
            queue.cancel()
        for task in list(self._lac_tasks):
            task.cancel()
