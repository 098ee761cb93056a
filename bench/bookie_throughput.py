"""Benchmark: one Python bookie process, driven by the bklib client over loopback.

Adds of 1 KiB entries (CRC32C bodies) spread over several ledgers, pipelined, each acknowledged
only after its journal record is fsync'd; then pipelined reads of the same entries.

    .venv/bin/python bench/bookie_throughput.py [--entries 200000] [--ledgers 8] [--window 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable

from bklib.client.pool import BookieClientPool
from bklib.digest import digest_manager, master_key
from bklib.meta.model import DigestType
from bklib.testing.sandbox import Sandbox

PASSWORD = b"bench"


async def drive(
    bookie: str, zk: str, entries: int, ledgers: int, window: int, size: int
) -> tuple[float, float]:
    """Pipelined adds then reads against one bookie; returns (adds/s, reads/s)."""
    key = master_key(PASSWORD)
    payload = b"x" * size
    bodies = []
    for n in range(entries):
        lid, eid = 1000 + n % ledgers, n // ledgers
        dm = digest_manager(lid, DigestType.CRC32C, PASSWORD)
        bodies.append((lid, eid, dm.package_entry(eid, eid - 1, (eid + 1) * size, payload)))

    async with BookieClientPool(zk) as pool:

        async def run(op: Callable[[int, int, bytes], Awaitable[object]]) -> float:
            # ``window`` workers pulling from one iterator keep exactly that many in flight.
            it = iter(bodies)

            async def worker() -> None:
                for lid, eid, body in it:
                    await op(lid, eid, body)

            t = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(window)))
            return time.perf_counter() - t

        add_s = await run(lambda lid, eid, body: pool.add(bookie, lid, eid, key, body))
        print(
            f"adds: {entries} x {size} B over {ledgers} ledgers, window {window}: "
            f"{entries / add_s:,.0f} adds/s, {entries * size / add_s / 1e6:,.1f} MB/s "
            f"(fsync'd journal)"
        )
        read_s = await run(lambda lid, eid, _body: pool.read(bookie, lid, eid))
        print(f"reads: {entries / read_s:,.0f} reads/s, {entries * size / read_s / 1e6:,.1f} MB/s")
        return entries / add_s, entries / read_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=200_000)
    ap.add_argument("--ledgers", type=int, default=8)
    ap.add_argument("--window", type=int, default=2000)
    ap.add_argument("--size", type=int, default=1024)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, Sandbox(tmp, num_bookies=1) as sb:
        asyncio.run(
            drive(
                sb.bookie_ids[0], sb.zk_connect, args.entries, args.ledgers, args.window, args.size
            )
        )


if __name__ == "__main__":
    main()
