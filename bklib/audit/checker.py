"""Asking bookies what they hold: the I/O half of BookKeeper's LedgerChecker.

For each ledger, every bookie its ensembles name (lost bookies excepted) is asked:

* ``replicas``: one GET_LIST_OF_ENTRIES_OF_LEDGER per (ledger, bookie). A bookie whose list
  request times out (Java's DbLedgerStorage never answers it) is probed with pipelined reads
  of the stripe it must hold, and is not asked to list again.
* ``deep``: every expected entry is read and its digest verified.

Ledgers that are not closed also get their LAC read from the last ensemble, which bounds the
open last segment. A bookie that answers nothing on several ledgers in a row is treated as
down for the rest of the run, so a black-holed bookie does not cost a timeout per ledger.

Fail closed: only NoSuchLedger / NoSuchEntry is "missing". A timeout, an I/O error or a digest
that cannot be checked is unknown and lands in ``unknown_entries`` or UNREACHABLE.

Blocking, on a :class:`~bklib.client.pool.SyncBookieClient`, with bounded windows of ledgers and
reads in flight: the local executor calls it in-process, the Spark executor inside each task.
Probes of many (ledger, bookie) pairs run at once as coroutines on the client's event loop,
those of closed ledgers as soon as the ledger enters the window, so a check reads at the
cluster's pace, not one bookie's, and a sampled check is not a round trip per ledger. Each
bookie has its own bounds, shared by every probe reading from it: ``reads_in_flight`` entries
and ``read_rate`` bytes/s. A probe sends its reads as v2 batch reads where the bookie serves
them, else as request groups (``read_many``: one future for many single reads, each with its
own answer), so a sample's few reads per range cost one request's overhead, not one each.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import logging
import random
import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from bklib.audit.entry_probe import EntryTally, PlannedRange, ProbeResult, answer_kind, stripe_plan
from bklib.audit.model import LedgerView, ReplicaReport
from bklib.audit.sampled_reads import LedgerReads, SampledReads
from bklib.availability import decode as decode_availability
from bklib.client.operations import ReadResult
from bklib.client.pool import (
    DEFAULT_BOOKIE_PROTOCOL,
    BookieClientPool,
    SyncBookieClient,
    WireProtocol,
)
from bklib.client.throttle import RateLimiter, ReadGate
from bklib.digest import DigestManager, digest_manager, parse_entry_header
from bklib.errors import (
    BKError,
    BKTimeoutError,
    BookieHandleNotAvailableError,
    NoSuchEntryError,
    NoSuchLedgerError,
)
from bklib.meta.model import DigestType
from bklib.quorum import contiguous_chunks, iter_stripe, sample_stripe
from bklib.states import FetchMethod, ReplicaStatus

__all__ = [
    "LEDGERS_IN_FLIGHT",
    "SAMPLED_LEDGERS_IN_FLIGHT",
    "SILENT_STRIKES",
    "CheckSettings",
    "ReplicaChecker",
]

log = logging.getLogger(__name__)

SILENT_STRIKES = 3
"""Ledgers in a row on which a bookie answered nothing before it is treated as down."""

LEDGERS_IN_FLIGHT = 64
"""Ledgers a check has requests outstanding for, by default."""

SAMPLED_LEDGERS_IN_FLIGHT = 2048
"""The same for the sample check, whose ledgers are a few reads each: handed to the client's
loop a quarter at a time, so each bookie's reads leave in groups of tens
(:mod:`bklib.audit.sampled_reads`; docs/benchmarks.md, "The sample check across ledgers")."""


# Errors meaning "cannot talk to this bookie at all": later requests would fail the same way.
_DOWN_ERRORS = (BookieHandleNotAvailableError, ConnectionError, OSError)


@dataclass(frozen=True)
class CheckSettings:
    """Timeouts and windows of the replica check (picklable: shipped to Spark executors)."""

    read_timeout: float = 5.0
    connect_timeout: float = 5.0
    ledgers_in_flight: int | None = None
    """Ledgers with requests outstanding (None: :data:`LEDGERS_IN_FLIGHT`, or
    :data:`SAMPLED_LEDGERS_IN_FLIGHT` for the sample check)."""
    reads_in_flight: int = 256
    """Entry reads outstanding per bookie when probing or verifying digests (the rest of a
    batch that stopped short, asked one by one, comes on top)."""
    read_rate: float | None = None
    """Bytes per second the check reads from any one bookie (``--read-rate``; None: no limit),
    so an audit leaves the bookie to its clients (Pulsar's own reads)."""
    verify_percentage: float = 0.0
    """The sample check: share of each fragment read besides its first and last entry
    (BookKeeper's auditorLedgerVerificationPercentage)."""
    sample_seed: int | None = None
    """Seed of the sample's picks (None: a new sample each run, as BookKeeper does)."""
    no_list: frozenset[str] = frozenset()
    """Bookies known (from this run's capability probe) not to answer list-entries: probed
    by reads from the start."""
    batch_read: frozenset[str] = frozenset()
    """Bookies known to serve v2 BATCH_READ: probes and deep reads use it."""
    batch_max_count: int = 64
    batch_max_bytes: int = 4 << 20
    """Bounds of one batch-read reply, so an audit's replies stay small next to Pulsar's."""
    bookie_protocol: WireProtocol = DEFAULT_BOOKIE_PROTOCOL
    """Wire protocol of the check's entry reads (``--bookie-protocol``). Other questions
    stay v3."""


def _digest(ledger: LedgerView) -> DigestManager | None:
    if ledger.digest_type is None:
        return None
    try:
        return digest_manager(
            ledger.ledger_id, DigestType[ledger.digest_type], ledger.password or b""
        )
    except (BKError, KeyError):
        return None


def _lac_of(result: Any, dm: DigestManager | None) -> int | None:
    """A READ_LAC answer's LAC: max of the explicit LAC and the last entry's piggybacked one.
    A body failing its digest tells nothing, so it counts as unknown."""
    values = []
    if result.lac_body is not None:
        with contextlib.suppress(BKError, struct.error):
            values.append(
                dm.verify_lac(result.lac_body)
                if dm
                else struct.unpack_from(">q", result.lac_body, 8)[0]
            )
    if result.last_entry_body is not None:
        with contextlib.suppress(BKError, struct.error):
            if dm:
                values.append(dm.verify_entry(result.last_entry_body, None).lac)
            else:
                values.append(parse_entry_header(result.last_entry_body)[2])
    return max(values) if values else None


@dataclass
class _Pending:
    ledger: LedgerView
    lac_futs: dict[str, concurrent.futures.Future[Any]] = field(default_factory=dict)
    list_futs: dict[str, concurrent.futures.Future[Any] | None] = field(default_factory=dict)
    probes: dict[str, concurrent.futures.Future[ProbeResult]] = field(default_factory=dict)
    reads: LedgerReads | None = None
    """The sampled check's reads of the ledger (:mod:`bklib.audit.sampled_reads`)."""
    sampled: dict[str, ProbeResult] = field(default_factory=dict)
    """What those reads found on each bookie, once they are all in."""


class ReplicaChecker:
    """One run's (or one Spark task's) replica check, and what it learnt about each bookie.

    ``client`` is a :class:`~bklib.client.pool.SyncBookieClient`; ``lost`` the bookies known to
    be gone (never asked: the classifier reports them as BOOKIE_LOST). Entry lists by default;
    ``deep`` reads every entry and verifies its digest, ``sample`` only a sample of them (the
    check kinds of :mod:`bklib.audit.checks` say which).
    """

    def __init__(
        self,
        client: SyncBookieClient,
        settings: CheckSettings,
        lost: frozenset[str] = frozenset(),
        *,
        sample: bool = False,
        deep: bool = False,
    ) -> None:
        self.client = client
        self.settings = settings
        self.sample = sample
        # Both read entries and verify their digests; the sample reads only some of them.
        self.deep = deep or sample
        # Per-bookie bounds, used on the client's event loop only.
        self._limiters: dict[str, RateLimiter] = {}
        self._gates: dict[str, ReadGate] = {}
        self.lost = lost
        # list-entries timed out (in this checker, or in the run's capability probe): probe
        self.no_list: set[str] = set(settings.no_list)
        self.down: dict[str, str] = {}  # silent too often: skip for the rest of the run
        self.strikes: dict[str, int] = {}  # ledgers in a row with no answer at all
        self._guard = client.guard(settings.read_timeout)
        default = SAMPLED_LEDGERS_IN_FLIGHT if self.sample else LEDGERS_IN_FLIGHT
        self.window = max(1, settings.ledgers_in_flight or default)
        # The sampled check reads each bookie's pairs across ledgers, in bulk.
        self._sampled = (
            SampledReads(
                client,
                timeout=settings.read_timeout,
                verify_percentage=settings.verify_percentage,
                batch=self.window // 4,
                skip=lambda b: b in self.lost or b in self.down,
                bounds=self._bounds,
                rng_of=self._sample_rng,
                lac_of=_lac_of,
            )
            if self.sample
            else None
        )

    # ---- bookie health -------------------------------------------------------------------------

    def _silent(self, bookie: str, error: str) -> None:
        """Count a ledger on which ``bookie`` answered nothing; after a few in a row it is
        treated as down. One ledger's fault alone never marks it down."""
        n = self.strikes.get(bookie, 0) + 1
        self.strikes[bookie] = n
        if n >= SILENT_STRIKES:
            self.down[bookie] = f"unreachable: {error}"
            log.warning("bookie %s: no answer on %d ledgers in a row; treated as down", bookie, n)

    def _answered(self, bookie: str) -> None:
        self.strikes.pop(bookie, None)

    def _wait(self, fut: concurrent.futures.Future[Any]) -> Any:
        try:
            return fut.result(self._guard)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise BKTimeoutError(f"no answer within {self._guard}s") from None

    def _ask(self, bookie: str, ledger_id: int, op: str) -> concurrent.futures.Future[Any]:
        """Send ``op`` (``read_lac`` or ``list_entries``) without waiting for the answer."""
        t = self.settings.read_timeout

        async def run(pool: BookieClientPool) -> Any:
            return await getattr(pool, op)(bookie, ledger_id, timeout=t)

        return self.client.submit(run)

    # ---- the check -----------------------------------------------------------------------------

    def check(
        self, ledgers: Iterable[LedgerView]
    ) -> Iterator[tuple[LedgerView, list[ReplicaReport]]]:
        """For each readable ledger, what each of its non-lost bookies answered; at most
        ``ledgers_in_flight`` ledgers have requests outstanding. Unreadable ledgers are
        skipped (their error is already the finding)."""
        pending: collections.deque[_Pending] = collections.deque()
        try:
            yield from self._check(ledgers, pending)
        finally:
            for item in pending:  # abandoned: stop their probes
                for probe in item.probes.values():
                    probe.cancel()
            if self._sampled is not None and pending:
                self._sampled.abandon([i.reads for i in pending if i.reads is not None])

    def _check(
        self, ledgers: Iterable[LedgerView], pending: collections.deque[_Pending]
    ) -> Iterator[tuple[LedgerView, list[ReplicaReport]]]:
        for ledger in ledgers:
            if not ledger.ok or not ledger.segments:
                continue
            pending.append(self._start(ledger))
            if len(pending) >= self.window:
                done = pending.popleft()
                yield done.ledger, self._finish(done)
        while pending:
            done = pending.popleft()
            yield done.ledger, self._finish(done)

    def _start(self, ledger: LedgerView) -> _Pending:
        """Send what ``ledger``'s check asks first: its LACs (not closed), list-entries where
        asked, and the probes that need neither; the sampled check's reads, all of them."""
        lid = ledger.ledger_id
        item = _Pending(ledger)
        if self._sampled is not None:
            # LACs and reads alike on the client's loop (bklib.audit.sampled_reads)
            item.list_futs = dict.fromkeys(b for b in ledger.bookies() if b not in self.lost)
            item.reads = LedgerReads(ledger, _digest(ledger))
            self._sampled.submit(item.reads)
            return item
        if not ledger.is_closed and ledger.segments:
            for b in dict.fromkeys(ledger.segments[-1].ensemble):
                if b not in self.lost and b not in self.down:
                    item.lac_futs[b] = self._ask(b, lid, "read_lac")
        for b in ledger.bookies():
            if b in self.lost:
                continue
            if self.deep or b in self.no_list or b in self.down:
                item.list_futs[b] = None
            else:
                item.list_futs[b] = self._ask(b, lid, "list_entries")
        if ledger.is_closed:  # no LAC to wait for: probe now
            self._start_probes(item, None)
        return item

    def _finish(self, item: _Pending) -> list[ReplicaReport]:
        """What each bookie of ``item``'s ledger answered, in the order they were asked."""
        if item.reads is not None:
            dm = item.reads.dm
            assert self._sampled is not None
            self._sampled.awaiting(item.reads)
            item.reads.future.result()  # every read's deadline bounds this wait
            lacs = item.reads.lacs
            item.sampled = item.reads.probes(self.sample)
        else:
            dm = _digest(item.ledger)
            lacs = self._lacs(item, dm)
        known = [v for v in lacs.values() if v is not None]
        lac = max(known) if known else None
        if item.reads is None:
            self._start_probes(item, lac)
        return [
            self._report(item, b, fut, lacs.get(b), lac, dm) for b, fut in item.list_futs.items()
        ]

    def _lacs(self, item: _Pending, dm: DigestManager | None) -> dict[str, int | None]:
        """Each asked bookie's LAC of the ledger; None where its READ_LAC gave none."""
        lacs: dict[str, int | None] = {}
        for b, lac_fut in item.lac_futs.items():
            try:
                lacs[b] = _lac_of(self._wait(lac_fut), dm)
            except BKError:
                lacs[b] = None  # NoSuchEntry/NoSuchLedger or unknown: no LAC from this bookie
        return lacs

    def _report(
        self,
        item: _Pending,
        b: str,
        fut: concurrent.futures.Future[Any] | None,
        own_lac: int | None,
        lac: int | None,
        dm: DigestManager | None,
    ) -> ReplicaReport:
        """What ``b`` holds of the ledger: UNREACHABLE if it is down, else its list-entries
        answer, or what reading its entries found when it is probed (``fut`` None: no
        list-entries asked)."""
        base = ReplicaReport(item.ledger.ledger_id, b, lac=own_lac)
        if b in self.down:
            for started in (fut, item.probes.get(b)):
                if started is not None:
                    started.cancel()
            return _with(base, status=ReplicaStatus.UNREACHABLE, error=self.down[b])
        if fut is None:
            report, probe = base, True
        else:
            report, probe = self._listed(b, item.ledger.ledger_id, fut, base)
        if probe:
            return self._probed(item, b, fut is not None, base, lac, dm)
        return report

    def _listed(
        self, b: str, lid: int, fut: concurrent.futures.Future[Any], base: ReplicaReport
    ) -> tuple[ReplicaReport, bool]:
        """``b``'s report from its list-entries answer, and whether to probe it by reads
        instead (the request timed out). Only NoSuchLedger / NoSuchEntry is NO_LEDGER."""
        try:
            runs = decode_availability(self._wait(fut))
            report = _with(base, entries=tuple(runs.runs()))
            self._answered(b)
        except (NoSuchLedgerError, NoSuchEntryError) as exc:
            # Only a negative answer means "does not have it".
            return _with(base, status=ReplicaStatus.NO_LEDGER, error=str(exc)), False
        except BKTimeoutError as exc:
            # Java bookies on DbLedgerStorage never answer list-entries: probe by reads.
            log.info("bookie %s: list-entries timed out (%s); probing by reads", b, exc)
            return base, True
        except _DOWN_ERRORS as exc:
            log.warning("bookie %s unreachable for ledger %d: %s", b, lid, exc)
            self._silent(b, str(exc))
            report = _with(base, status=ReplicaStatus.UNREACHABLE, error=f"unreachable: {exc}")
            return report, False
        except (BKError, ValueError) as exc:
            report = _with(
                base, status=ReplicaStatus.UNREACHABLE, error=f"list-entries failed: {exc}"
            )
            return report, False
        return report, False

    def _fetch_method(self) -> str:
        """How a probed bookie's entries were fetched: sampled, all read, or probed."""
        if self.sample:
            return FetchMethod.SAMPLE
        return FetchMethod.READ if self.deep else FetchMethod.PROBE

    def _probed(
        self,
        item: _Pending,
        b: str,
        listed: bool,
        base: ReplicaReport,
        lac: int | None,
        dm: DigestManager | None,
    ) -> ReplicaReport:
        """``b``'s report from reading its entries (the probe started with the ledger, or one
        started now), counted towards its health; ``listed``: list-entries was asked and
        timed out, so a bookie answering reads is not asked to list again."""
        got = item.sampled.get(b)
        if got is None:
            started = item.probes.get(b)
            got = (started or self._probe_soon(item.ledger, b, lac, dm)).result()
        report = ReplicaReport(
            base.ledger_id,
            b,
            got.status,
            self._fetch_method(),
            got.entries,
            got.bad,
            got.unknown,
            base.lac,
            got.error,
        )
        if got.unknown_count and not got.answered:
            self._silent(b, got.error or "no answer")
        elif got.answered:
            self._answered(b)
            if listed:
                self.no_list.add(b)  # answers reads but not list-entries
        return report

    def _start_probes(self, item: _Pending, lac: int | None) -> None:
        """Start reading the bookies that are probed from the start (no list-entries asked);
        the list-entries answers are looked at meanwhile."""
        dm = _digest(item.ledger)
        ledger = item.ledger
        wanted = [
            b
            for b, fut in item.list_futs.items()
            if fut is None and b not in self.down and b not in item.probes
        ]
        if not wanted:
            return
        # One wake-up of the loop thread for the ledger's probes on all its bookies.
        started = self.client.submit_many(
            [functools.partial(self._read_entries, ledger=ledger, bookie=b, lac=lac, dm=dm)
             for b in wanted]
        )  # fmt: skip
        item.probes.update(zip(wanted, started, strict=True))

    def _probe_soon(
        self, ledger: LedgerView, bookie: str, lac: int | None, dm: DigestManager | None
    ) -> concurrent.futures.Future[ProbeResult]:
        """Start :meth:`_read_entries` on the client's loop."""
        return self.client.submit(lambda pool: self._read_entries(pool, ledger, bookie, lac, dm))

    def _bounds(self, bookie: str) -> tuple[ReadGate, RateLimiter]:
        """This checker's bounds on ``bookie``, shared by every probe reading from it: reads
        outstanding and bytes/s (on the client's loop)."""
        gate = self._gates.get(bookie)
        if gate is None:
            gate = self._gates[bookie] = ReadGate(self.settings.reads_in_flight)
            self._limiters[bookie] = RateLimiter(self.settings.read_rate)
        return gate, self._limiters[bookie]

    async def _read_entries(
        self,
        pool: BookieClientPool,
        ledger: LedgerView,
        bookie: str,
        lac: int | None,
        dm: DigestManager | None,
    ) -> ProbeResult:
        """Read every entry ``bookie`` must hold (pipelined), verifying digests when deep; the
        sample check reads only BookKeeper's sample of each fragment (:func:`sample_stripe`)
        and takes the entries it did not read as held, so only what it read can be missing
        or unknown. Runs on the client's loop, as one of many probes."""
        probe = _EntryProbe(
            pool,
            ledger,
            bookie,
            dm,
            self.settings,
            deep=self.deep,
            sample=self.sample,
            bounds=self._bounds,
        )
        plan = stripe_plan(ledger.segments or (), bookie, lac)
        await probe.run(plan, self._sample_rng(ledger.ledger_id, bookie))
        return probe.result(plan)

    def _sample_rng(self, lid: int, bookie: str) -> random.Random | None:
        """The source of the sample's picks on (``lid``, ``bookie``): reproducible under a
        seed, whatever order the probes run in; None unless sampling with
        ``--verify-percentage``."""
        seed = self.settings.sample_seed
        # None without --verify-percentage: only the ends are read, and seeding a source per
        # (ledger, bookie) would cost more than the probe's own reads.
        if self.sample and self.settings.verify_percentage > 0:
            return random.Random(None if seed is None else f"{seed}:{lid}:{bookie}")
        return None


class _EntryProbe:
    """The state of one :meth:`ReplicaChecker._read_entries` probe of one (ledger, bookie):
    the reads outstanding, in order, and what the answers said so far.

    Runs on the client's event loop; the bookie's gate and rate limiter are shared with every
    other probe reading from it.
    """

    def __init__(
        self,
        pool: BookieClientPool,
        ledger: LedgerView,
        bookie: str,
        dm: DigestManager | None,
        settings: CheckSettings,
        *,
        deep: bool,
        sample: bool,
        bounds: Callable[[str], tuple[ReadGate, RateLimiter]],
    ) -> None:
        e, wq = ledger.ensemble_size, ledger.write_quorum
        assert e is not None and wq is not None
        self.pool = pool
        self.lid = ledger.ledger_id
        self.e, self.wq = e, wq
        self.bookie = bookie
        self.dm = dm
        self.settings = settings
        self.deep = deep
        self.sample = sample
        self.timeout = settings.read_timeout
        self.batched = bookie in settings.batch_read and not sample
        self.gate, self.limiter = bounds(bookie)  # the bookie's, shared with its other probes
        self.loop = asyncio.get_running_loop()
        self.tally = EntryTally()
        self.verify = dm if deep else None  # whose digests the answers are checked against
        self.window: collections.deque[tuple[list[int], asyncio.Task[Any]]] = collections.deque()
        self.in_flight = 0

    # ---- what an answer says -------------------------------------------------------------------

    def record(self, x: int, body: bytes | None, exc: BaseException | None) -> None:
        """Count entry ``x`` by what its answer says (:func:`answer_kind`)."""
        self.tally.add(x, answer_kind(x, body, exc, self.verify), exc)

    # ---- requests ------------------------------------------------------------------------------

    async def one(self, x: int) -> Any:
        """Read entry ``x``, paying its bytes to the bookie's rate limiter."""
        res = await self.pool.read(self.bookie, self.lid, x, timeout=self.timeout)
        await self.limiter.acquire(len(res.body))
        return res

    async def many(self, ids: list[int]) -> list[ReadResult | BKError]:
        """Read the ``ids`` one by one but as one request group (each its own answer or
        error, in order), paying their bytes."""
        lid = self.lid
        reads = [(lid, x) for x in ids]
        outs = await self.pool.read_many(self.bookie, reads, timeout=self.timeout)
        await self.limiter.acquire(sum(len(r.body) for r in outs if isinstance(r, ReadResult)))
        return outs

    async def batch(self, ids: list[int]) -> list[bytes]:
        """Batch-read the consecutive ``ids`` (the reply may stop short), paying its bytes."""
        n, size = len(ids), self.settings.batch_max_bytes
        bodies = await self.pool.batch_read(
            self.bookie, self.lid, ids[0], n, size, timeout=self.timeout
        )
        await self.limiter.acquire(sum(len(b) for b in bodies))
        return bodies

    async def answer(self, ids: list[int], task: asyncio.Task[Any]) -> Any:
        """``task``'s answer; its reads no longer count as outstanding at the gate."""
        # Each request carries its own deadline (the connection's timer): no guard here.
        try:
            return await task
        finally:
            self.gate.give(len(ids))  # answered (or given up on): no longer outstanding

    # ---- taking answers ------------------------------------------------------------------------

    async def settle(self, keep: int) -> None:
        """Take answers, oldest first, until at most ``keep`` reads are outstanding (in
        order: the run builder wants ascending ids)."""
        while self.window and self.in_flight > keep:
            ids, task = self.window.popleft()
            self.in_flight -= len(ids)
            await self._take(ids, task)

    async def _take(self, ids: list[int], task: asyncio.Task[Any]) -> None:
        """Record one request's answer: an error counts for all its ids, except that a batch
        whose first entry is missing has that one missing and the rest asked one by one."""
        try:
            res = await self.answer(ids, task)
        except NoSuchLedgerError as exc:
            for x in ids:  # the bookie has no such ledger: none of them
                self.record(x, None, exc)
            return
        except BKError as exc:
            if len(ids) == 1 or not self.batched or not isinstance(exc, NoSuchEntryError):
                for x in ids:  # unknown stays unknown, for the whole batch
                    self.record(x, None, exc)
                return
            res = []  # the batch's first entry is missing: ask the rest one by one
        if len(ids) == 1 and not isinstance(res, list):
            self.record(ids[0], res.body, None)
            return
        if not self.batched:
            self._take_many(ids, res)
            return
        await self._take_batch(ids, list(res))

    def _take_many(self, ids: list[int], outs: list[ReadResult | BKError]) -> None:
        """Record each answer of a :meth:`many` group."""
        for x, out in zip(ids, outs, strict=True):
            if isinstance(out, ReadResult):
                self.record(x, out.body, None)
            else:
                self.record(x, None, out)

    async def _take_batch(self, ids: list[int], got: list[bytes]) -> None:
        """Record a batch's bodies; the ids past where it stopped are read one by one (the
        first of them missing when the batch returned nothing)."""
        for x, body in zip(ids, got, strict=False):
            self.record(x, body, None)
        # A batch stops before the first entry the bookie lacks (or at its size
        # bound): the rest of the chunk is asked by pipelined single reads.
        rest = ids[len(got) :]
        if rest:
            if not got:
                self.record(rest[0], None, NoSuchEntryError("missing", entry_id=rest[0]))
                rest = rest[1:]
            await self._read_singles(rest)

    async def _read_singles(self, ids: list[int]) -> None:
        """Read ``ids`` by pipelined single reads and record each answer, in order."""
        try:
            outs = await self.many(ids)
        except BKError as exc:  # not one could be sent: the bookie is unavailable
            outs = [exc] * len(ids)
        self._take_many(ids, outs)

    # ---- the probe -----------------------------------------------------------------------------

    async def run(self, plan: list[tuple[int, int, int]], rng: random.Random | None) -> None:
        """Read the planned ranges, at most ``reads_in_flight`` reads outstanding; when
        cancelled, what is still outstanding is cancelled and given back to the gate."""
        limit = max(1, self.settings.reads_in_flight)
        try:
            if self.batched:
                for idx, first, last in plan:
                    await self.settle(0)
                    self.tally.cut()  # a new range: fresh runs (all before it is recorded)
                    ids = self._stripe(idx, first, last, rng)
                    for chunk in contiguous_chunks(ids, min(self.settings.batch_max_count, limit)):
                        await self._send(chunk, limit)
            else:
                # Request groups span the ranges: a sample asks two or three ids of a range,
                # and a group per range cost about as much as a request per id. Groups are half
                # the window, so that one is sent while the other is answered.
                for chunk in _groups(self._all_ranges(plan, rng), max(1, limit // 2)):
                    await self._send(chunk, limit)
            await self.settle(0)
        finally:
            for ids, task in self.window:  # cancelled: give back what is still outstanding
                task.cancel()
                self.gate.give(len(ids))

    def _stripe(self, idx: int, first: int, last: int, rng: random.Random | None) -> Iterable[int]:
        """The ids of one planned range to read: its stripe's (the sample's, when sampling)."""
        e, wq = self.e, self.wq
        if self.sample:
            return sample_stripe(idx, first, last, e, wq, self.settings.verify_percentage, rng)
        return iter_stripe(idx, first, last, e, wq)

    def _all_ranges(
        self, plan: list[tuple[int, int, int]], rng: random.Random | None
    ) -> Iterator[int]:
        """Every planned range's ids, in order, noting where each range starts (the run
        builder starts fresh runs there, see :meth:`record`)."""
        for idx, first, last in plan:
            start = True
            for x in self._stripe(idx, first, last, rng):
                if start:
                    self.tally.range_starts.add(x)
                    start = False
                yield x

    async def _send(self, chunk: list[int], limit: int) -> None:
        """Send one request once the bookie's gate lets its reads out, then take answers
        until fewer than ``limit`` reads are outstanding."""
        if not self.gate.try_take(len(chunk)):
            await self.settle(0)  # wait holding nothing (see ReadGate)
            await self.gate.take(len(chunk))
        task: asyncio.Task[Any]
        if not self.batched:
            task = self.loop.create_task(self.many(chunk))
        else:
            task = self.loop.create_task(
                self.batch(chunk) if len(chunk) > 1 else self.one(chunk[0])
            )
        self.window.append((chunk, task))
        self.in_flight += len(chunk)
        await self.settle(limit - 1)

    def result(self, plan: list[PlannedRange]) -> ProbeResult:
        """What the probe found (:meth:`EntryTally.result`)."""
        return self.tally.result(plan, sample=self.sample)


def _groups(ids: Iterable[int], size: int) -> Iterator[list[int]]:
    """``ids`` in lists of at most ``size``, in order."""
    group: list[int] = []
    for x in ids:
        group.append(x)
        if len(group) == size:
            yield group
            group = []
    if group:
        yield group


def _with(report: ReplicaReport, **changes: Any) -> ReplicaReport:
    return replace(report, **changes)
