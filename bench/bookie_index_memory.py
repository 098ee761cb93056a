"""Benchmark: the memory of a :class:`bklib.audit.bookie_index.BookieIndex` over N ledgers.

It builds the index with :meth:`~bklib.audit.bookie_index.BookieIndex.from_scan` from
generated ledgers, as a scan would hand them over one at a time: ids ascending with gaps,
ensembles of 3 drawn from ``--bookies``, 1 segment (60%), 2 (30%) or 3 (10%), each new
segment replacing one bookie. ``--churn`` then applies that many random changes (a new
segment, a delete, a create), so stale posting entries count too. It prints one JSON object:

- ``tracemalloc_current_mb`` and ``tracemalloc_peak_mb``: the Python heap the index holds
  after the build, and the most it held during it (requested sizes, without the allocator's
  rounding); ``--no-tracemalloc`` skips them, as tracing slows the build and adds its own
  memory to the RSS;
- ``rss_mb`` and ``rss_growth_mb``: the process's resident set after the build, and its
  growth over the build (the interpreter and imports are the difference);
- ``memory_bytes_mb``: the index's own estimate (:meth:`memory_bytes`).

    .venv/bin/python bench/bookie_index_memory.py [--ledgers 1000000] [--bookies 100]
        [--churn 0] [--no-tracemalloc]
"""

from __future__ import annotations

import argparse
import json
import random
import time
import tracemalloc
from collections.abc import Iterator

from bklib.audit.bookie_index import BookieIndex
from bklib.meta.model import LedgerMetadata, LedgerState, Segment
from bklib.meta.scan import ScanResult

MB = 1024 * 1024


def rss_bytes() -> int:
    """The resident set now (Linux), not the high-water mark ``ru_maxrss`` gives."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def ledger(rng: random.Random, lid: int, pool: list[str]) -> LedgerMetadata:
    """A closed E3/W2/A2 ledger of 1 to 3 segments, each replacing one bookie."""
    ensemble = rng.sample(pool, 3)
    segments = [Segment(0, tuple(ensemble))]
    for first in (1000, 2000)[: rng.choices((0, 1, 2), (6, 3, 1))[0]]:
        ensemble[rng.randrange(3)] = rng.choice([b for b in pool if b not in ensemble])
        segments.append(Segment(first, tuple(ensemble)))
    return LedgerMetadata(
        lid, 3, 2, 2, tuple(segments), state=LedgerState.CLOSED, last_entry_id=2999, length=1
    )


def scan(rng: random.Random, n: int, pool: list[str]) -> Iterator[ScanResult]:
    lid = 0
    for _ in range(n):
        lid += rng.randint(1, 3)
        yield ScanResult(lid, f"/ledgers/L{lid}", metadata=ledger(rng, lid, pool))


def churn(rng: random.Random, index: BookieIndex, ops: int, pool: list[str], top: int) -> None:
    """Random changes: a new segment on a held ledger, a delete, or a create past ``top``."""
    for _ in range(ops):
        lid = rng.randint(1, top)
        r = rng.random()
        if r < 0.4:
            index.apply(top, ledger(rng, top, pool))
            top += 1
        elif r < 0.7:
            index.apply(lid, None)
        elif lid in index:
            md = ledger(rng, lid, pool)
            index.apply(lid, md.with_new_segment(5000, tuple(rng.sample(pool, 3))))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ledgers", type=int, default=1_000_000)
    p.add_argument("--bookies", type=int, default=100)
    p.add_argument("--churn", type=int, default=0, help="random changes after the build")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--no-tracemalloc", action="store_true", help="RSS figures only")
    args = p.parse_args()
    rng = random.Random(args.seed)
    pool = [f"10.0.{i // 256}.{i % 256}:3181" for i in range(args.bookies)]
    rss0 = rss_bytes()
    if not args.no_tracemalloc:
        tracemalloc.start()
    t0 = time.monotonic()
    index = BookieIndex.from_scan(scan(rng, args.ledgers, pool))
    churn(rng, index, args.churn, pool, 3 * args.ledgers + 1)
    out: dict[str, object] = {
        "ledgers": len(index),
        "bookies": index.bookie_count,
        "churn": args.churn,
        "build_s": round(time.monotonic() - t0, 1),
    }
    if not args.no_tracemalloc:
        current, peak = tracemalloc.get_traced_memory()
        out["tracemalloc_current_mb"] = round(current / MB, 1)
        out["tracemalloc_peak_mb"] = round(peak / MB, 1)
        out["tracemalloc_own_mb"] = round(tracemalloc.get_tracemalloc_memory() / MB, 1)
    rss = rss_bytes()
    out["rss_mb"] = round(rss / MB, 1)
    out["rss_growth_mb"] = round((rss - rss0) / MB, 1)
    out["memory_bytes_mb"] = round(index.memory_bytes() / MB, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
