"""Copying a closed fragment's entries to replacement bookies (BookKeeper's
``LedgerFragmentReplicator``).

For each entry a moved position held, the body is read from the surviving replicas of its
write set (digest verified on every entry) and the same bytes are written to the replacement
with the **recovery-add** flag, so copies into fenced ledgers succeed (BookKeeper #4163).
Unlike BookKeeper, only each position's own stripe is copied, not every entry of the fragment.

Reads (``protocol="v2"``, the default) go to the sources in **chunks**: runs of consecutive
entries that one surviving bookie holds all of, read with one v2 BATCH_READ (what
``LedgerFragmentReplicator`` does when ensembleSize == writeQuorum; with E > WQ a bookie holds
runs of at most WQ consecutive entries, so chunks are that short, and single entries are read
with a plain READ). A bookie answers a batch with the entries from the first one up to the
first it lacks or the size limit (``BatchedReadEntryProcessor``), so an entry a batch did not
return is asked for again: the rest of the chunk in another batch, and an entry the source
lacks, or whose digest is bad, with single reads over all its replicas (next replica on any
error, speculative after ``speculative_timeout``). ``protocol="v3"`` reads every entry with a
single v3 READ, as before batches existed.

Bookies before 4.17 do not serve BATCH_READ (some drop the connection on it): the first batch
for a bookie is a probe on a connection of its own, and a bookie that does not answer it is
read entry by entry for the life of the pool.

Each chunk's recovery adds are issued together (pipelined; the connection corks the frames of
one loop turn into one send) over the same protocol, and throttled by a byte-rate limiter
shared by every copy on the loop. ``window`` bounds the entries in flight.

An entry for which every surviving replica answered NoSuchEntry/NoSuchLedger has no replica
left: it is collected in :attr:`CopyResult.no_replica`, and the rest is still copied. Any
other read or write failure raises; nothing here touches metadata.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import weakref
from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from bklib.cancellation import cancel_and_wait
from bklib.client.connection import BookieConnection
from bklib.client.connection_v2 import BookieConnectionV2
from bklib.client.pool import BookieClientPool, WireProtocol
from bklib.client.reader import Reply, ask_replicas, read_verdict
from bklib.client.throttle import RateLimiter
from bklib.digest import DigestManager
from bklib.errors import (
    BKError,
    BKTimeoutError,
    BookieHandleNotAvailableError,
    DigestMatchError,
    NoSuchEntryError,
    NoSuchLedgerError,
)
from bklib.quorum import iter_stripe, write_set

log = logging.getLogger(__name__)

__all__ = ["CopyResult", "copy_fragment"]

BATCH_ENTRIES = 64
"""Entries asked per batch read (BATCH_READ's maxCount)."""
BATCH_BYTES = 4 << 20
"""Bytes asked per batch read (maxSize): under the 5 MiB frame limit both sides default to
(nettyMaxFrameSizeBytes); the bookie caps it at its own maxBatchReadSize."""
PROBE_TIMEOUT = 2.0
"""Seconds a bookie gets to answer the batch-read probe (a healthy bookie answers in ms)."""


@dataclass
class CopyResult:
    """What one fragment copy did."""

    entries: int = 0
    """Entries written (an entry sent to two replacements counts twice)."""
    bytes: int = 0
    no_replica: list[int] = field(default_factory=list)
    """Entries no surviving replica has: lost."""
    per_target: dict[str, list[int]] = field(default_factory=dict)
    """Replacement bookie -> [entries, bytes] written to it."""
    batch_reads: int = 0
    """Batch reads answered (each returned one entry or more)."""
    single_reads: int = 0
    """Entries read one by one: single-entry chunks and what batches did not return."""

    def count(self, bookie: str, nbytes: int) -> None:
        self.entries += 1
        self.bytes += nbytes
        done = self.per_target.setdefault(bookie, [0, 0])
        done[0] += 1
        done[1] += nbytes


class _NoReplica(Exception):
    pass


def _entries_to_copy(
    targets: Mapping[int, str], first: int, last: int, e: int, wq: int
) -> Iterator[tuple[int, list[str]]]:
    """``(entry, replacements it goes to)`` ascending; stripes of moved positions overlap."""

    def stream(pos: int, new: str) -> Iterator[tuple[int, str]]:
        # A function, not a nested generator expression: ``new`` must bind per stream.
        for eid in iter_stripe(pos, first, last, e, wq):
            yield eid, new

    streams = [stream(pos, new) for pos, new in sorted(targets.items())]
    current = -1
    news: list[str] = []
    for eid, new in heapq.merge(*streams):
        if eid != current and news:
            yield current, news
            news = []
        current = eid
        news.append(new)
    if news:
        yield current, news


@dataclass
class _Chunk:
    """Consecutive entries to copy and the bookies (write-set order) holding every one."""

    entries: list[tuple[int, list[str]]]
    holders: tuple[str, ...]


def _chunks(
    work: Iterator[tuple[int, list[str]]],
    holders_of: Callable[[int], tuple[str, ...]],
    max_entries: int,
) -> Iterator[_Chunk]:
    """Group ``work`` into chunks of at most ``max_entries`` consecutive entries with at least
    one common holder (greedy from each chunk's first entry). An entry without holders is a
    chunk of its own, read from the fallback sources."""
    entries: list[tuple[int, list[str]]] = []
    common: tuple[str, ...] = ()
    for eid, news in work:
        holders = holders_of(eid)
        if entries and eid == entries[-1][0] + 1 and len(entries) < max_entries:
            both = tuple(b for b in common if b in holders)
            if both:
                entries.append((eid, news))
                common = both
                continue
        if entries:
            yield _Chunk(entries, common)
        entries, common = [(eid, news)], holders
    if entries:
        yield _Chunk(entries, common)


# Bookies that serve BATCH_READ, per pool: a future per bookie, so concurrent copies share one
# probe (None: the probe was cut off, ask again). A weak map: the answers live as long as the
# pool (and its loop).
_BATCH_CAPABLE: weakref.WeakKeyDictionary[
    BookieClientPool, dict[str, asyncio.Future[bool | None]]
] = weakref.WeakKeyDictionary()


async def _serves_batch_read(
    pool: BookieClientPool, bookie: str, ledger_id: int, entry_id: int
) -> bool:
    """Whether ``bookie`` answers a v2 BATCH_READ (4.17+), asked once per pool.

    The probe runs on a connection of its own: a bookie that does not know the opcode may
    close the connection, which must not fail the reads and adds pipelined on the pool's.
    Any answer, even an error code: yes. A timeout, the connection closed on it, or no
    connection at all: no, and the copy reads that bookie entry by entry.
    """
    known = _BATCH_CAPABLE.setdefault(pool, {})
    while True:
        fut = known.get(bookie)
        if fut is not None and fut.done():
            return bool(fut.result())  # asked before: the usual case, once per chunk
        if fut is None:
            fut = known[bookie] = asyncio.get_running_loop().create_future()
            probe = pool.dedicated_connection_v2(bookie)
            try:
                await probe.batch_read(ledger_id, entry_id, 1, 0, timeout=PROBE_TIMEOUT)
                fut.set_result(True)
            except (BKTimeoutError, BookieHandleNotAvailableError) as exc:
                # No answer, the connection closed on it (ConnectionLostError), or none at all.
                log.info("bookie %s: no v2 batch reads (%s); reading entry by entry", bookie, exc)
                fut.set_result(False)
            except BKError:
                fut.set_result(True)  # an error code is an answer: it knows the opcode
            except BaseException:
                # This copy was cancelled (or failed) mid-probe: nothing was learnt. Copies of
                # other ledgers waiting on it ask again rather than fail with it.
                del known[bookie]
                fut.set_result(None)
                raise
            finally:
                await probe.close()
        answer = await asyncio.shield(fut)
        if answer is not None:
            return bool(answer)


async def _all(aws: list[Awaitable[None]]) -> None:
    """Await every awaitable, concurrently; the first failure cancels the others and raises."""
    if len(aws) == 1:
        await aws[0]
        return
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        await cancel_and_wait(tasks)
        raise


_Read = tuple[int, list[str], bytes]
"""An entry read for copying: ``(entry id, replacements it goes to, stored body)``."""


def _chunk_shape(
    protocol: WireProtocol, e: int, wq: int, window: int, batch_entries: int
) -> tuple[int, int]:
    """``(entries per chunk, lanes)`` for a copy keeping about ``window`` entries in flight."""
    window = max(1, window)
    # E == WQ: every survivor holds the whole fragment, so chunks are long and a few of them
    # fill the window. E > WQ: a survivor holds at most WQ - 1 consecutive entries of a lost
    # bookie's runs (WQ = 2: single entries), so the window is many short chunks.
    per_chunk = max(1, min(batch_entries, window // 4)) if protocol == "v2" else 1
    if e > wq:
        per_chunk = min(per_chunk, max(1, wq - 1))
    return per_chunk, max(1, window // per_chunk)


class _FragmentCopy:
    """The state of one :func:`copy_fragment` call and its steps: where each entry can be read
    from, reading (batches, single reads over the replicas), writing, and the counts.

    One instance per call, used by all of its lanes on one event loop (no locking needed).
    """

    def __init__(
        self,
        pool: BookieClientPool,
        *,
        ledger_id: int,
        ensemble: Sequence[str],
        ensemble_size: int,
        write_quorum: int,
        targets: Mapping[int, str],
        dead: Collection[str],
        digest: DigestManager,
        master_key: bytes,
        limiter: RateLimiter,
        speculative_timeout: float,
        timeout: float | None,
        protocol: WireProtocol,
        batch_bytes: int,
    ) -> None:
        self.pool = pool
        self.ledger_id = ledger_id
        self.ensemble = ensemble
        self.e, self.wq = ensemble_size, write_quorum
        self.replaced = {ensemble[i] for i in targets}
        self.dead = dead
        self.digest = digest
        self.master_key = master_key
        self.limiter = limiter
        self.speculative_timeout = speculative_timeout
        self.timeout = timeout
        self.v2 = protocol == "v2"
        self.batch_bytes = batch_bytes
        self.result = CopyResult()
        # The write set depends only on eid % E: sources are computed once per residue rather
        # than per entry (the copy is bound by the client loop's CPU).
        self._holders_by_residue: dict[int, tuple[str, ...]] = {}
        self._sources_by_residue: dict[int, tuple[str, ...]] = {}
        # Sources whose batch read failed other than NoSuch*: no more batches from them in this
        # copy (a slow or sick bookie must not cost a read timeout per chunk).
        self._no_batch: set[str] = set()
        self._turn = 0

    # ---- where an entry is ---------------------------------------------------------------------

    def holders_of(self, eid: int) -> tuple[str, ...]:
        """The surviving bookies of ``eid``'s write set: neither replaced nor dead."""
        r = eid % self.e
        got = self._holders_by_residue.get(r)
        if got is None:
            ws = [self.ensemble[i] for i in write_set(eid, self.e, self.wq)]
            alive = [b for b in ws if b not in self.dead]
            got = self._holders_by_residue[r] = tuple(b for b in alive if b not in self.replaced)
            self._sources_by_residue[r] = got + tuple(b for b in alive if b in self.replaced)
        return got

    def sources_of(self, eid: int, last: str | None) -> tuple[str, ...]:
        """Every bookie to read ``eid`` from, in order: the holders, then replaced bookies that
        are not dead (an ENTRIES_MISSING bookie still has most of its stripe); ``last``, when
        given, moves to the end."""
        self.holders_of(eid)
        sources = self._sources_by_residue[eid % self.e]
        if last is not None and last in sources:
            # The bookie that just failed this entry in a batch: asked again only if the others
            # fail too (every replica must answer for a no-replica verdict).
            sources = (*(b for b in sources if b != last), last)
        return sources

    def _connection(self, bookie: str) -> BookieConnection | BookieConnectionV2:
        """The pool's connection to ``bookie`` in the copy's protocol."""
        return self.pool.connection_v2(bookie) if self.v2 else self.pool.connection(bookie)

    # ---- single reads --------------------------------------------------------------------------

    def _verified(self, body: bytes, eid: int, bookie: str) -> bytes:
        """``body`` once its digest checks out; DigestMatchError naming the bookie if not."""
        try:
            self.digest.verify_entry(body, eid)
        except DigestMatchError as exc:
            log.warning(
                "ledger %d entry %d: bad digest from bookie %s, trying the next replica",
                self.ledger_id,
                eid,
                bookie,
            )
            raise DigestMatchError(
                exc.reason, ledger_id=self.ledger_id, entry_id=eid, bookie=bookie
            ) from None
        return body

    async def _read_from(self, bookie: str, eid: int) -> bytes:
        """One single read of ``eid`` from ``bookie``, digest verified."""
        res = await self._connection(bookie).read(self.ledger_id, eid, timeout=self.timeout)
        return self._verified(bytes(res.body), eid, bookie)

    async def _read_one(self, eid: int, last: str | None = None) -> bytes:
        """One entry by single reads over its sources (``read_verdict``'s rules); _NoReplica
        when every source answered NoSuchEntry/NoSuchLedger."""
        self.result.single_reads += 1
        sources = self.sources_of(eid, last)
        if not sources:
            # Every replica sits on a bookie that is not registered right now: unknown, not
            # lost. NO_REPLICA needs every holder to have answered NoSuchEntry; a bookie that
            # comes back may still hold it (safety rule: unknown never becomes NO_REPLICA).
            raise BookieHandleNotAvailableError(
                "no registered bookie holds a replica to read from",
                ledger_id=self.ledger_id,
                entry_id=eid,
            )
        if len(sources) == 1:
            # One replica (a WQ=2 entry with one copy lost): ask_replicas' verdict without its
            # layers, a visible share of the loop's CPU per copied entry.
            try:
                return await self._read_from(sources[0], eid)
            except (NoSuchEntryError, NoSuchLedgerError):
                raise _NoReplica() from None
        return await self._ask_replicas(sources, eid)

    async def _ask_replicas(self, sources: tuple[str, ...], eid: int) -> bytes:
        """``eid`` from the first of several ``sources`` to answer it (speculative reads)."""

        def send(bookie: str) -> Awaitable[bytes]:
            return self._read_from(bookie, eid)

        def decide(replies: list[Reply[bytes]], everyone: bool) -> bytes | BaseException | None:
            verdict = read_verdict(replies, everyone, self.ledger_id, eid)
            # Every replica said NoSuchEntry/NoSuchLedger: no replica left (terminal), which a
            # copy reports instead of failing.
            return _NoReplica() if isinstance(verdict, NoSuchEntryError) else verdict

        got: bytes | BaseException = await ask_replicas(
            sources, send, decide, self.speculative_timeout
        )
        if isinstance(got, BaseException):
            raise got
        return got

    async def _read_into(
        self, out: list[_Read], eid: int, news: list[str], last: str | None = None
    ) -> None:
        """Append ``eid`` read by single reads to ``out``, or record it as having no replica."""
        try:
            out.append((eid, news, await self._read_one(eid, last)))
        except _NoReplica:
            self.result.no_replica.append(eid)

    # ---- batch reads ---------------------------------------------------------------------------

    def _batch_source(self, holders: tuple[str, ...]) -> str | None:
        """The holder to ask for the next batch, rotating over those still batching (None: no
        batch, read entry by entry)."""
        usable = [b for b in holders if b not in self._no_batch]
        if not usable:
            return None
        self._turn += 1  # rotate over the holders: spread the reads over the survivors
        return usable[self._turn % len(usable)]

    async def _read_chunk(self, chunk: _Chunk) -> list[_Read]:
        """Every entry of ``chunk`` that has a replica, in order: by batches where a holder
        serves them, the rest (and what a batch did not return) by single reads."""
        out: list[_Read] = []
        i = 0
        while i < len(chunk.entries):
            i = await self._read_step(chunk, i, out)
        return out

    async def _read_step(self, chunk: _Chunk, i: int, out: list[_Read]) -> int:
        """Read from ``chunk.entries[i]`` on, appending to ``out``; the index to go on from (the
        same index when a source was just ruled out for batches)."""
        entries = chunk.entries
        eid, news = entries[i]
        left = len(entries) - i
        src = self._batch_source(chunk.holders) if self.v2 and left > 1 else None
        if src is None:
            await self._read_into(out, eid, news)
            return i + 1
        if not await _serves_batch_read(self.pool, src, self.ledger_id, eid):
            self._no_batch.add(src)
            return i
        return await self._read_batch(chunk, i, src, out)

    async def _read_batch(self, chunk: _Chunk, i: int, src: str, out: list[_Read]) -> int:
        """One batch read from ``src`` of ``chunk.entries[i:]``, appended to ``out``; the index
        of the first entry it did not cover."""
        entries = chunk.entries
        eid, news = entries[i]
        try:
            bodies = await self.pool.batch_read(
                src, self.ledger_id, eid, len(entries) - i, self.batch_bytes, timeout=self.timeout
            )
        except (NoSuchEntryError, NoSuchLedgerError) as exc:
            # The source lacks the chunk's next entry: that one from the other replicas, the
            # rest again in a batch (from another holder if it lacks the ledger).
            if isinstance(exc, NoSuchLedgerError):
                self._no_batch.add(src)
            await self._read_into(out, eid, news, last=src)
            return i + 1
        except BKError as exc:
            log.debug(
                "ledger %d: batch read from bookie %s failed (%s); not batching from it",
                self.ledger_id,
                src,
                exc,
            )
            self._no_batch.add(src)
            return i
        self.result.batch_reads += 1
        # The connection checked ids and counts (BookieConnectionV2); digests are ours.
        for body in bodies:
            eid, news = entries[i]
            try:
                out.append((eid, news, self._verified(body, eid, src)))
            except DigestMatchError:
                await self._read_into(out, eid, news, last=src)
            i += 1
        return i

    # ---- writing -------------------------------------------------------------------------------

    def _add(self, new: str, eid: int, body: bytes) -> Awaitable[None]:
        """The recovery add of ``eid`` to replacement ``new`` (accepted on a fenced ledger)."""
        return self._connection(new).add(
            self.ledger_id, eid, self.master_key, body, recovery=True, timeout=self.timeout
        )

    async def copy_chunk(self, chunk: _Chunk) -> None:
        """Read ``chunk`` and write each entry to its replacements, throttled."""
        if len(chunk.entries) == 1:
            await self._copy_entry(*chunk.entries[0])
            return
        got = await self._read_chunk(chunk)
        if not got:
            return
        await self.limiter.acquire(sum(len(body) * len(news) for _, news, body in got))
        await _all([self._add(new, eid, body) for eid, news, body in got for new in news])
        for _, news, body in got:
            for new in news:
                self.result.count(new, len(body))

    async def _copy_entry(self, eid: int, news: list[str]) -> None:
        """Copy a one-entry chunk (most chunks when E > WQ): no batch, no list, no task per
        add."""
        try:
            body = await self._read_one(eid)
        except _NoReplica:
            self.result.no_replica.append(eid)
            return
        await self.limiter.acquire(len(body) * len(news))
        for new in news:
            await self._add(new, eid, body)
            self.result.count(new, len(body))

    async def run(self, work: Iterator[_Chunk], lanes: int) -> None:
        """Copy every chunk of ``work`` on ``lanes`` concurrent lanes; the first failure cancels
        the others and raises."""

        # A repaired ledger's fragment is often a few chunks: no more lanes than it has (each
        # lane is a task, and 64 idle ones cost more than the copy of a short fragment).
        head = list(itertools.islice(work, lanes))
        chunks = itertools.chain(head, work)
        if len(head) <= 1:  # one lane, or a fragment of one chunk: no task at all
            for chunk in chunks:
                await self.copy_chunk(chunk)
            return

        async def lane() -> None:
            # Lanes pull from one lazy iterator: a million-entry stripe never becomes a million
            # tasks. The first failure ends its lane and, through gather, the copy.
            for chunk in chunks:
                await self.copy_chunk(chunk)

        tasks = [asyncio.ensure_future(lane()) for _ in range(len(head))]
        try:
            await asyncio.gather(*tasks)
        finally:
            await cancel_and_wait(tasks)


async def copy_fragment(
    pool: BookieClientPool,
    *,
    ledger_id: int,
    ensemble: Sequence[str],
    ensemble_size: int,
    write_quorum: int,
    first_entry_id: int,
    last_entry_id: int,
    targets: Mapping[int, str],
    dead: Collection[str],
    digest: DigestManager,
    master_key: bytes,
    limiter: RateLimiter | None = None,
    window: int = 64,
    speculative_timeout: float = 2.0,
    timeout: float | None = None,
    protocol: WireProtocol = "v2",
    batch_entries: int = BATCH_ENTRIES,
    batch_bytes: int = BATCH_BYTES,
) -> CopyResult:
    """Copy, for each ``position -> new bookie`` in ``targets``, the entries that position
    holds in ``[first_entry_id, last_entry_id]`` of a closed segment.

    Sources of an entry: its write set minus the replaced positions and minus ``dead``
    bookies; replaced bookies that are not dead are tried last (an ENTRIES_MISSING bookie
    still has most of its stripe), by single reads only. ``protocol``: v2 (batch reads, v2
    reads and adds) or v3 (single v3 reads and v3 adds). ``window``: entries in flight;
    ``batch_entries`` and ``batch_bytes``: maxCount and maxSize of each batch read. Returns
    counts and the entries with no replica.
    """
    if protocol not in ("v2", "v3"):
        raise ValueError(f"unknown bookie wire protocol {protocol!r}")
    e, wq = ensemble_size, write_quorum
    per_chunk, lanes = _chunk_shape(protocol, e, wq, window, batch_entries)
    copy = _FragmentCopy(
        pool,
        ledger_id=ledger_id,
        ensemble=ensemble,
        ensemble_size=e,
        write_quorum=wq,
        targets=targets,
        dead=dead,
        digest=digest,
        master_key=master_key,
        limiter=limiter or RateLimiter(None),
        speculative_timeout=speculative_timeout,
        timeout=timeout,
        protocol=protocol,
        batch_bytes=batch_bytes,
    )
    work = _chunks(
        _entries_to_copy(targets, first_entry_id, last_entry_id, e, wq), copy.holders_of, per_chunk
    )
    await copy.run(work, lanes)
    result = copy.result
    result.no_replica.sort()
    if result.no_replica:
        log.error(
            "ledger %d segment %d: %d entries have no surviving replica (first %s)",
            ledger_id,
            first_entry_id,
            len(result.no_replica),
            result.no_replica[:10],
        )
    return result
