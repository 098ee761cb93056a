"""Reading ledgers: the shared client context, LAC reads under quorum coverage, entry reads.

* :class:`ClientContext` bundles what every ledger operation needs: the metadata store (kazoo,
  blocking, so it runs in the loop's default executor), the asyncio bookie pool, a placement
  policy and a few client settings.
* :class:`LacReadTracker` is the pure decision logic of a LAC read (BookKeeper's
  ``ReadLastConfirmedOp`` / ``PendingReadLacOp``; docs/safety-rules.md rules 1 and 2):
  replies from the E bookies of the last ensemble are tracked in an
  :class:`~bklib.quorum.RRQuorumCoverageSet`; the read completes once every possible write set
  has fewer than AQ unknown replies. Only OK with a *valid digest* and NoSuchEntry/NoSuchLedger
  are known: a digest failure counts as unknown (the Java client counts it as known, a hazard
  we do not copy, see docs/safety-rules.md rule 1).
* :func:`ask_replicas` is the replica-by-replica request engine shared by normal reads and
  recovery reads: ask the first replica of the write set, move to the next one on an error or
  when the current one has not answered within the speculative timeout, and stop as soon as a
  caller-supplied rule decides.
* :class:`LedgerReader` opens a ledger *without* recovery (no fencing; an open ledger's LAC is
  learned from the bookies) and reads entries, verifying every digest and trying the next
  replica on any error or digest mismatch. Reads are bounded by the LAC, or by lastEntryId once
  the ledger is CLOSED, so stray entries beyond it are never returned.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from bklib.cancellation import cancel_and_wait
from bklib.client.placement import PlacementPolicy, writable_bookies
from bklib.client.pool import BookieClientPool, SyncBookieClient
from bklib.digest import DigestManager, EntryView, digest_manager, master_key
from bklib.errors import (
    BKError,
    BKTimeoutError,
    BookieHandleNotAvailableError,
    DigestMatchError,
    IncorrectParameterError,
    NoSuchEntryError,
    NoSuchLedgerError,
    ReadError,
    UnauthorizedAccessError,
)
from bklib.meta.model import INVALID_ENTRY_ID, DigestType, LedgerMetadata
from bklib.meta.store import LedgerStore, Versioned
from bklib.quorum import ReplyKind, RRQuorumCoverageSet, reply_kind, write_set

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

__all__ = [
    "ClientContext",
    "LacReadTracker",
    "LedgerEntry",
    "LedgerReader",
    "ask_replicas",
    "first_error",
    "read_entries_blocking",
    "read_verdict",
    "read_verified",
    "resolve_credentials",
]


# ---- context --------------------------------------------------------------------------------


@dataclass
class ClientContext:
    """Everything a ledger operation needs, on one event loop.

    ``speculative_read_timeout`` (s, BookKeeper's default 2 s): how long a read waits for one
    replica before also asking the next one. ``read_window``: entries a range read keeps in
    flight. ``recovery_read_batch_size``: entries recovery reads ahead (BookKeeper default 1).
    ``max_writebacks_in_flight``: recovery write-backs outstanding before reading pauses.
    ``max_ensemble_changes``: ensemble changes one writer or recovery may make before it gives
    up with WriteError (BookKeeper's ``maxNumEnsembleChanges``; None = unlimited, its default).
    ``writable_source``: a blocking call that returns the writable bookies, where the caller
    already keeps the registry (a repair task's cache); by default every ensemble change reads
    it from ZooKeeper, one read per registered bookie.
    """

    store: LedgerStore
    pool: BookieClientPool
    placement: PlacementPolicy = field(default_factory=PlacementPolicy)
    speculative_read_timeout: float = 2.0
    read_window: int = 64
    recovery_read_batch_size: int = 1
    max_writebacks_in_flight: int = 1000
    max_ensemble_changes: int | None = None
    writable_source: Callable[[], Sequence[str]] | None = None

    async def meta(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a blocking metadata call (kazoo) in the loop's executor."""
        call = functools.partial(fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(None, call)

    async def read_metadata(self, ledger_id: int) -> Versioned[LedgerMetadata]:
        """The ledger's metadata and znode version."""
        return await self.meta(self.store.read_ledger, ledger_id)

    async def writable_bookies(self) -> list[str]:
        """Bookies currently registered as writable: the placement candidates."""
        if self.writable_source is not None:
            return list(await self.meta(self.writable_source))
        return await self.meta(writable_bookies, self.store.zk, self.store.root)


def resolve_credentials(
    md: LedgerMetadata, password: bytes | None, digest_type: DigestType | None
) -> tuple[bytes, DigestType]:
    """The password and digest type to use for ``md``.

    Metadata v3 stores both, and they win when the caller gives none; a caller-given password
    that differs from the stored one is refused (UnauthorizedAccessError) as BookKeeper does
    without digest auto-detection. Older metadata without them needs the caller's values.
    """
    if password is not None and md.password is not None and bytes(password) != md.password:
        raise UnauthorizedAccessError(
            "password does not match the ledger's", ledger_id=md.ledger_id
        )
    pwd = password if password is not None else md.password
    if pwd is None:
        raise IncorrectParameterError(
            "metadata stores no password: pass the ledger's password", ledger_id=md.ledger_id
        )
    dt = md.digest_type if md.digest_type is not None else digest_type
    if dt is None:
        raise IncorrectParameterError(
            "metadata stores no digest type: pass it", ledger_id=md.ledger_id
        )
    return bytes(pwd), DigestType(dt)


# ---- errors ---------------------------------------------------------------------------------


def first_error(errors: Sequence[BaseException]) -> BaseException | None:
    """The error BookKeeper's ``PendingReadOp`` reports after every replica failed.

    It starts as "none"; a NoSuchEntry/NoSuchLedger is overwritten by any later error, and a
    BookieHandleNotAvailable by any later error that is not NoSuch*. So a mix such as
    {NoSuchEntry, Timeout, NoSuchEntry} reports the timeout, never "no such entry".
    """
    negative = (NoSuchEntryError, NoSuchLedgerError)
    first: BaseException | None = None
    for exc in errors:
        replaceable = first is None or isinstance(first, negative)
        if not replaceable and isinstance(first, BookieHandleNotAvailableError):
            replaceable = not isinstance(exc, negative)
        if replaceable:
            first = exc
    return first


def read_failure(
    cause: BaseException | None, message: str, *, ledger_id: int, entry_id: int | None = None
) -> BKError:
    """Map a failed read phase to the error recovery reports (as ``LedgerRecoveryOp`` does): a
    timeout stays a timeout, unauthorized stays unauthorized, anything else is a ReadError
    naming the cause."""
    if isinstance(cause, BKTimeoutError):
        err: BKError = BKTimeoutError(f"{message}: {cause}", ledger_id=ledger_id, entry_id=entry_id)
    elif isinstance(cause, UnauthorizedAccessError):
        err = UnauthorizedAccessError(f"{message}: {cause}", ledger_id=ledger_id, entry_id=entry_id)
    else:
        err = ReadError(f"{message}: {cause}", ledger_id=ledger_id, entry_id=entry_id)
    err.__cause__ = cause
    return err


# ---- LAC reads --------------------------------------------------------------------------------


class LacReadTracker:
    """Pure state of one LAC read over the E bookies of an ensemble.

    Feed it one reply per index with :meth:`record`: ``lac``/``length`` for an OK reply whose
    digest verified, or the ``error``. A DigestMatchError is unknown, NoSuch* are known and
    carry no LAC. :attr:`covered` says the read may complete; :attr:`finished` that it cannot
    get better (covered, or everyone answered, or an unauthorized reply).
    """

    def __init__(self, e: int, wq: int, aq: int) -> None:
        self.e = e
        self._coverage = RRQuorumCoverageSet(e, wq, aq)
        self._answered: set[int] = set()
        self.max_lac = INVALID_ENTRY_ID
        self.length = 0
        self.errors: list[tuple[int, BaseException]] = []
        self.unauthorized: UnauthorizedAccessError | None = None

    def record(
        self,
        index: int,
        *,
        lac: int | None = None,
        length: int | None = None,
        error: BaseException | None = None,
    ) -> ReplyKind:
        """Record the reply of ``index``; returns how it counted."""
        kind = reply_kind(error)
        self._coverage.add(index, kind)
        self._answered.add(index)
        if error is not None:
            self.errors.append((index, error))
            if isinstance(error, UnauthorizedAccessError):
                self.unauthorized = error
        elif lac is not None and lac > self.max_lac:
            # Keep the (LAC, length) pair of the reply with the highest LAC, as Java does.
            self.max_lac = lac
            self.length = length or 0
        return kind

    @property
    def covered(self) -> bool:
        """Every write set has fewer than AQ unknown replies."""
        return self._coverage.is_covered()

    @property
    def all_answered(self) -> bool:
        return len(self._answered) == self.e

    @property
    def finished(self) -> bool:
        return self.unauthorized is not None or self.covered or self.all_answered

    def failure(self, ledger_id: int) -> BKError:
        """The error for a read that finished without coverage: the last non-valid reply
        decides (timeout -> BKTimeoutError, unauthorized -> UnauthorizedAccessError, else
        ReadError)."""
        if self.unauthorized is not None:
            return self.unauthorized
        last = next(
            (e for _, e in reversed(self.errors) if reply_kind(e) is ReplyKind.UNKNOWN), None
        )
        return read_failure(last, f"LAC read not covered ({self._coverage!r})", ledger_id=ledger_id)


async def coverage_read(
    ensemble: Sequence[str],
    md: LedgerMetadata,
    send: Callable[[str], Awaitable[tuple[int, int]]],
    what: str,
) -> LacReadTracker:
    """Send ``send(bookie)`` to every bookie of ``ensemble`` at once and return the tracker as
    soon as the replies cover the ensemble. ``send`` returns ``(lac, length)`` or raises.
    Raises the tracker's failure when everyone answered without coverage."""
    tracker = LacReadTracker(md.ensemble_size, md.write_quorum, md.ack_quorum)

    async def one(bookie: str) -> tuple[tuple[int, int] | None, BaseException | None]:
        try:
            return await send(bookie), None
        except BKError as exc:
            return None, exc
        except (OSError, ValueError) as exc:  # never let a surprise count as an answer
            return None, ReadError(f"{type(exc).__name__}: {exc}", bookie=bookie)

    tasks = {asyncio.ensure_future(one(b)): i for i, b in enumerate(ensemble)}
    try:
        pending = set(tasks)
        while pending and not tracker.finished:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                idx = tasks[t]
                value, exc = t.result()
                if exc is not None:
                    kind = tracker.record(idx, error=exc)
                    log.debug(
                        "ledger %d: %s from bookie %s (index %d): %s (%s)",
                        md.ledger_id,
                        what,
                        ensemble[idx],
                        idx,
                        kind.value,
                        exc.reason if isinstance(exc, BKError) else exc,
                    )
                else:
                    assert value is not None
                    tracker.record(idx, lac=value[0], length=value[1])
                    log.debug(
                        "ledger %d: %s from bookie %s (index %d): LAC %d",
                        md.ledger_id,
                        what,
                        ensemble[idx],
                        idx,
                        value[0],
                    )
    finally:
        for t in tasks:
            t.cancel()
    if tracker.unauthorized is not None or not tracker.covered:
        err = tracker.failure(md.ledger_id)
        log.warning("ledger %d: %s failed: %s", md.ledger_id, what, err)
        raise err
    log.debug(
        "ledger %d: %s covered ensemble %s: max LAC %d",
        md.ledger_id,
        what,
        list(ensemble),
        tracker.max_lac,
    )
    return tracker


# ---- replica-by-replica requests -------------------------------------------------------------


@dataclass
class Reply(Generic[T]):
    """One replica's answer: ``position`` in the write set, the bookie, value or error."""

    position: int
    bookie: str
    value: T | None = None
    error: BaseException | None = None


async def ask_replicas(
    targets: Sequence[str],
    send: Callable[[str], Awaitable[T]],
    decide: Callable[[list[Reply[T]], bool], R | None],
    speculative_timeout: float,
) -> R:
    """Ask ``targets`` in order until ``decide`` returns a verdict.

    The next replica is asked when the previous one answered with an error, or when nobody has
    answered within ``speculative_timeout`` (so a zombie bookie cannot stall a read); replies
    keep being collected from every replica asked. ``decide(replies, everyone_answered)`` is
    called after every reply; with ``everyone_answered`` True it must return a verdict.
    Requests still outstanding when the verdict is reached are abandoned.
    """

    if len(targets) == 1:
        # Nobody to ask speculatively (the usual copy of a WQ=2 entry with one replica lost):
        # the same verdict as below without a task and an asyncio.wait per read, which were a
        # large share of the client loop's CPU on bulk copies.
        verdict = decide([await _ask_one(targets, send, 0)], True)
        if verdict is None:
            raise AssertionError("decide() gave no verdict with every replica answered")
        return verdict
    return await _ask_in_turn(targets, send, decide, speculative_timeout)


async def _ask_one(
    targets: Sequence[str], send: Callable[[str], Awaitable[T]], pos: int
) -> Reply[T]:
    """The reply of ``targets[pos]``: its value, or the error it failed with."""
    bookie = targets[pos]
    try:
        return Reply(pos, bookie, value=await send(bookie))
    except BKError as exc:
        return Reply(pos, bookie, error=exc)
    except (OSError, ValueError) as exc:
        return Reply(pos, bookie, error=ReadError(f"{type(exc).__name__}: {exc}"))


async def _ask_in_turn(
    targets: Sequence[str],
    send: Callable[[str], Awaitable[T]],
    decide: Callable[[list[Reply[T]], bool], R | None],
    speculative_timeout: float,
) -> R:
    """:func:`ask_replicas` with more than one target: the speculative loop."""
    tasks: set[asyncio.Task[Reply[T]]] = set()
    replies: list[Reply[T]] = []
    asked = 0

    def launch() -> None:
        nonlocal asked
        tasks.add(asyncio.ensure_future(_ask_one(targets, send, asked)))
        asked += 1

    launch()
    try:
        while True:
            timeout = speculative_timeout if asked < len(targets) else None
            done, _ = await asyncio.wait(
                tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if not done:
                launch()  # speculative: the asked replicas are slow, try one more
                continue
            for t in done:
                tasks.discard(t)
                replies.append(t.result())
            everyone = asked == len(targets) and not tasks
            verdict = decide(replies, everyone)
            if verdict is not None:
                return verdict
            if everyone:
                raise AssertionError("decide() gave no verdict with every replica answered")
            if asked < len(targets):
                launch()  # the replies so far were errors: ask the next replica now
    finally:
        for t in tasks:
            t.cancel()


# ---- entries -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LedgerEntry:
    """A verified entry: its payload and the LAC/length fields it carried."""

    ledger_id: int
    entry_id: int
    payload: bytes
    lac: int
    length: int


def _entry_from_view(view: EntryView) -> LedgerEntry:
    return LedgerEntry(view.ledger_id, view.entry_id, bytes(view.payload), view.lac, view.length)


class LedgerReader:
    """A read handle on a ledger, opened without recovery (no fencing: a live writer is not
    disturbed). For an OPEN ledger :attr:`lac` is what the bookies reported under coverage and
    may lag the writer; :meth:`read_lac` refreshes it. For a CLOSED ledger it is lastEntryId."""

    def __init__(
        self,
        ctx: ClientContext,
        md: Versioned[LedgerMetadata],
        password: bytes,
        digest_type: DigestType,
        lac: int,
    ) -> None:
        self.ctx = ctx
        self.versioned = md
        self.password = password
        self.digest_type = digest_type
        self.digest: DigestManager = digest_manager(md.value.ledger_id, digest_type, password)
        self.master_key = master_key(password)
        self.lac = lac

    @property
    def metadata(self) -> LedgerMetadata:
        return self.versioned.value

    @property
    def ledger_id(self) -> int:
        return self.versioned.value.ledger_id

    @classmethod
    async def open(
        cls,
        ctx: ClientContext,
        ledger_id: int,
        *,
        password: bytes | None = None,
        digest_type: DigestType | None = None,
    ) -> LedgerReader:
        """Open without recovery: read metadata; for a ledger that is not CLOSED learn the LAC
        from the last ensemble (READ_LAC to all E bookies, complete under coverage)."""
        md = await ctx.read_metadata(ledger_id)
        pwd, dt = resolve_credentials(md.value, password, digest_type)
        reader = cls(ctx, md, pwd, dt, INVALID_ENTRY_ID)
        if md.value.is_closed:
            reader.lac = md.value.last_entry_id
        else:
            await reader.read_lac()
        log.debug(
            "ledger %d: opened without recovery, state %s, LAC %d",
            ledger_id,
            md.value.state.name,
            reader.lac,
        )
        return reader

    async def read_lac(self) -> int:
        """Refresh metadata and, unless CLOSED, the LAC from the bookies; returns the LAC.

        Value per bookie = max(explicit LAC body, LAC field of its last entry) (READ_LAC,
        as BookKeeper's ``PendingReadLacOp``); the result is the max over a covering set of
        replies.
        """
        self.versioned = await self.ctx.read_metadata(self.ledger_id)
        md = self.metadata
        if md.is_closed:
            self.lac = md.last_entry_id
            return self.lac
        dm, lid = self.digest, self.ledger_id

        async def send(bookie: str) -> tuple[int, int]:
            res = await self.ctx.pool.read_lac(bookie, lid)
            lac, length = INVALID_ENTRY_ID, 0
            if res.lac_body is not None:
                lac = dm.verify_lac(res.lac_body)
            if res.last_entry_body is not None:
                view = dm.verify_entry(res.last_entry_body, None)
                if view.lac >= lac:
                    lac, length = view.lac, view.length
            return lac, length

        tracker = await coverage_read(md.last_segment.ensemble, md, send, "LAC read")
        self.lac = max(self.lac, tracker.max_lac)
        return self.lac

    def _check_range(self, first: int, last: int) -> None:
        if first < 0 or last < first:
            raise IncorrectParameterError(
                f"bad entry range [{first}, {last}]", ledger_id=self.ledger_id
            )
        if last > self.lac:
            bound = "lastEntryId" if self.metadata.is_closed else "LAC"
            raise ReadError(
                f"entry {last} is beyond the ledger's {bound} {self.lac}",
                ledger_id=self.ledger_id,
                entry_id=last,
            )

    async def read_entry(self, entry_id: int) -> LedgerEntry:
        """Read and verify one entry (must be <= LAC / lastEntryId)."""
        self._check_range(entry_id, entry_id)
        return _entry_from_view(await self._read_one(entry_id))

    async def _read_one(self, entry_id: int) -> EntryView:
        md = self.metadata
        ensemble = md.ensemble_for(entry_id)
        targets = [ensemble[i] for i in write_set(entry_id, md.ensemble_size, md.write_quorum)]
        return await read_entry_from(self.ctx, self.ledger_id, entry_id, targets, self.digest)

    async def iter_entries(self, first: int, last: int) -> AsyncIterator[LedgerEntry]:
        """Yield entries ``first..last`` in order, keeping ``ctx.read_window`` reads in flight."""
        self._check_range(first, last)
        window = max(1, self.ctx.read_window)
        inflight: list[asyncio.Task[EntryView]] = []
        next_id = first
        try:
            while next_id <= last or inflight:
                while next_id <= last and len(inflight) < window:
                    inflight.append(asyncio.ensure_future(self._read_one(next_id)))
                    next_id += 1
                yield _entry_from_view(await inflight.pop(0))
        finally:
            await cancel_and_wait(inflight)

    async def read_entries(self, first: int, last: int) -> list[LedgerEntry]:
        """Entries ``first..last`` (inclusive), verified, in order."""
        return [e async for e in self.iter_entries(first, last)]


async def read_verified(
    pool: BookieClientPool, bookie: str, ledger_id: int, entry_id: int, dm: DigestManager
) -> tuple[bytes, EntryView]:
    """Read one entry from one bookie and verify its digest: ``(body, view)``. A bad digest
    raises DigestMatchError naming the bookie, so the caller moves on to the next replica."""
    res = await pool.read(bookie, ledger_id, entry_id)
    try:
        return res.body, dm.verify_entry(res.body, entry_id)
    except DigestMatchError as exc:
        log.warning(
            "ledger %d entry %d: bad digest from bookie %s, trying the next replica",
            ledger_id,
            entry_id,
            bookie,
        )
        raise DigestMatchError(
            exc.reason, ledger_id=ledger_id, entry_id=entry_id, bookie=bookie
        ) from None


def read_verdict(
    replies: Sequence[Reply[T]], everyone: bool, ledger_id: int, entry_id: int
) -> T | BKError | None:
    """The rule of a normal entry read (``decide`` for :func:`ask_replicas`): the first good
    reply wins; once every replica answered, NoSuchEntryError only if all of them said
    NoSuchEntry/NoSuchLedger, else the error BookKeeper's firstError rule picks; None while
    replicas are still to be heard."""
    for r in replies:
        if r.error is None:
            return r.value
    if not everyone:
        return None
    errors = [r.error for r in replies if r.error is not None]
    if all(reply_kind(e) is ReplyKind.NEGATIVE for e in errors):
        return NoSuchEntryError("no replica has the entry", ledger_id=ledger_id, entry_id=entry_id)
    err = first_error(errors)
    if isinstance(err, BKError):
        return err
    return ReadError(f"read failed: {err}", ledger_id=ledger_id, entry_id=entry_id)


async def read_entry_from(
    ctx: ClientContext,
    ledger_id: int,
    entry_id: int,
    targets: Sequence[str],
    dm: DigestManager,
) -> EntryView:
    """Normal (non-fencing) read of one entry from its write set, in order: the first reply
    with a valid digest wins; an error or digest mismatch moves on to the next replica. When
    every replica failed: NoSuchEntryError if all said NoSuchEntry/NoSuchLedger, otherwise the
    error BookKeeper's firstError rule picks."""

    async def send(bookie: str) -> EntryView:
        return (await read_verified(ctx.pool, bookie, ledger_id, entry_id, dm))[1]

    def decide(replies: list[Reply[EntryView]], everyone: bool) -> EntryView | BKError | None:
        return read_verdict(replies, everyone, ledger_id, entry_id)

    verdict: EntryView | BKError = await ask_replicas(
        targets, send, decide, ctx.speculative_read_timeout
    )
    if isinstance(verdict, BKError):
        log.warning(
            "ledger %d entry %d: read failed on %s: %s", ledger_id, entry_id, targets, verdict
        )
        raise verdict
    return verdict


def read_entries_blocking(
    client: SyncBookieClient,
    store: LedgerStore,
    ledger_id: int,
    first: int,
    last: int,
    *,
    password: bytes | None = None,
    placement: PlacementPolicy | None = None,
) -> list[LedgerEntry]:
    """Sync wrapper for threads/Spark tasks: open without recovery and read ``first..last`` on
    ``client``'s event loop."""

    async def run(pool: BookieClientPool) -> list[LedgerEntry]:
        ctx = ClientContext(store, pool, placement or PlacementPolicy())
        reader = await LedgerReader.open(ctx, ledger_id, password=password)
        return await reader.read_entries(first, last)

    return client.run(run)
