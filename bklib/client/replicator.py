"""Copying a closed fragment's entries to replacement bookies (BookKeeper's
``LedgerFragmentReplicator``).

For each entry a moved position held, the body is read from the surviving replicas of its
write set (digest verified, next replica on any error), and the same bytes are written to
the replacement with the **recovery-add** flag, so copies into fenced ledgers succeed
(BookKeeper #4163). Unlike BookKeeper, only each position's own stripe is copied, not every
entry of the fragment. Reads and writes are pipelined (``window`` entries in flight) and
throttled by a byte-rate limiter shared by every copy on the loop.

An entry for which every surviving replica answered NoSuchEntry/NoSuchLedger has no replica
left: it is collected in :attr:`CopyResult.no_replica`, and the rest is still copied. Any
other read or write failure raises; nothing here touches metadata.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from bklib.client.pool import BookieClientPool
from bklib.client.reader import Reply, ask_replicas, read_verdict, read_verified
from bklib.digest import DigestManager
from bklib.errors import NoSuchEntryError
from bklib.quorum import iter_stripe, write_set

log = logging.getLogger(__name__)

__all__ = ["CopyResult", "RateLimiter", "copy_fragment"]


class RateLimiter:
    """A token bucket in bytes per second for one event loop (None or <= 0: unlimited).

    The bucket holds at most one second of budget, so an idle spell cannot be followed by an
    unbounded burst.
    """

    def __init__(self, rate: float | None) -> None:
        self.rate = rate if rate and rate > 0 else None
        self._tokens = self.rate or 0.0
        self._stamp = time.monotonic()

    async def acquire(self, nbytes: int) -> None:
        """Wait until ``nbytes`` may be sent."""
        if self.rate is None:
            return
        now = time.monotonic()
        self._tokens = min(self.rate, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now
        self._tokens -= nbytes
        if self._tokens < 0:
            await asyncio.sleep(-self._tokens / self.rate)


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


async def _read_body(
    pool: BookieClientPool,
    ledger_id: int,
    entry_id: int,
    sources: Sequence[str],
    dm: DigestManager,
    speculative_timeout: float,
) -> bytes:
    async def send(bookie: str) -> bytes:
        return bytes((await read_verified(pool, bookie, ledger_id, entry_id, dm))[0])

    def decide(replies: list[Reply[bytes]], everyone: bool) -> bytes | BaseException | None:
        verdict = read_verdict(replies, everyone, ledger_id, entry_id)
        # Every replica said NoSuchEntry/NoSuchLedger: no replica left (terminal), which a
        # copy reports instead of failing.
        return _NoReplica() if isinstance(verdict, NoSuchEntryError) else verdict

    if not sources:
        raise _NoReplica()
    verdict: bytes | BaseException = await ask_replicas(sources, send, decide, speculative_timeout)
    if isinstance(verdict, BaseException):
        raise verdict
    return verdict


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
) -> CopyResult:
    """Copy, for each ``position -> new bookie`` in ``targets``, the entries that position
    holds in ``[first_entry_id, last_entry_id]`` of a closed segment.

    Sources of an entry: its write set minus the replaced positions and minus ``dead``
    bookies; replaced bookies that are not dead are tried last (an ENTRIES_MISSING bookie
    still has most of its stripe). Returns counts and the entries with no replica.
    """
    result = CopyResult()
    replaced = {ensemble[i] for i in targets}
    limiter = limiter or RateLimiter(None)
    work = _entries_to_copy(targets, first_entry_id, last_entry_id, ensemble_size, write_quorum)

    by_residue: dict[int, list[str]] = {}

    def sources_of(eid: int) -> list[str]:
        ws = [ensemble[i] for i in write_set(eid, ensemble_size, write_quorum)]
        sources = [b for b in ws if b not in replaced and b not in dead]
        sources += [b for b in ws if b in replaced and b not in dead]
        return sources

    async def one(eid: int, news: list[str]) -> None:
        # The write set depends only on eid % E, so the source order is computed once per
        # residue rather than per entry (the copy is bound by the client loop's CPU).
        sources = by_residue.get(eid % ensemble_size)
        if sources is None:
            sources = by_residue[eid % ensemble_size] = sources_of(eid)
        try:
            body = await _read_body(pool, ledger_id, eid, sources, digest, speculative_timeout)
        except _NoReplica:
            result.no_replica.append(eid)
            return
        for new in news:
            await limiter.acquire(len(body))
            await pool.add(new, ledger_id, eid, master_key, body, recovery=True, timeout=timeout)
            result.count(new, len(body))

    async def lane() -> None:
        # ``window`` lanes pull from one lazy iterator: a million-entry stripe never becomes a
        # million tasks. The first failure ends its lane and, through gather, the copy.
        for eid, news in work:
            await one(eid, news)

    lanes = [asyncio.ensure_future(lane()) for _ in range(max(1, window))]
    try:
        await asyncio.gather(*lanes)
    finally:
        for t in lanes:
            t.cancel()
        await asyncio.gather(*lanes, return_exceptions=True)
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
