"""Benchmark: single v3 reads vs v2 BATCH_READ from one Java DbLedgerStorage bookie, same data.

One ZooKeeper and one Java BookKeeper 4.17 bookie (``org.apache.bookkeeper.server.Main``,
DbLedgerStorage, production-like JVM as in ``bench/java_bookie_throughput.py``). The bklib client
writes ``--entries`` CRC32C entries of ``--size`` bytes over ``--ledgers`` ledgers (pipelined v3
adds), then reads all of them back, each mode ``--rounds`` times in turn:

* ``v3 single``: one READ_ENTRY per entry, ``--window`` in flight (BookieConnection);
* ``v2 single``: the same over v2 (BookieConnectionV2.read);
* ``v2 batch``: BATCH_READ_ENTRY of ``--batch`` entries each, ``--batch-window`` batches in
  flight, consecutive batches per ledger (BookieConnectionV2.batch_read).

Every mode must return the same bytes (checked by a digest over all bodies).

    .venv/bin/python bench/batch_read_throughput.py [--entries 200000] [--ledgers 8] \\
        [--size 1024] [--window 2000] [--batch 100] [--batch-window 16] [--rounds 2]

Needs the BookKeeper jars (``scripts/install_bookkeeper.sh``, run here if missing).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import hashlib
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

from kazoo.client import KazooClient

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

from bklib.client.operations import ClientConfig  # noqa: E402
from bklib.client.pool import BookieClientPool  # noqa: E402
from bklib.digest import digest_manager, master_key  # noqa: E402
from bklib.meta.model import DigestType  # noqa: E402
from bklib.meta.store import LedgerStore  # noqa: E402
from bklib.testing.zkserver import ZooKeeperServer  # noqa: E402
from tests.interop import harness  # noqa: E402

PASSWORD = b"bench"
CONFIG = ClientConfig(add_timeout=60.0, read_timeout=60.0)


async def gather_window(jobs: Iterator[Callable[[], Awaitable[None]]], window: int) -> None:
    """Run ``jobs`` with ``window`` of them in flight."""

    async def worker() -> None:
        for job in jobs:
            await job()

    await asyncio.gather(*(worker() for _ in range(window)))


async def bench(bookie: str, args: argparse.Namespace) -> None:
    key = master_key(PASSWORD)
    payload = b"x" * args.size
    per_ledger = args.entries // args.ledgers
    ledgers = [1000 + i for i in range(args.ledgers)]
    async with BookieClientPool(None, config=CONFIG) as pool:
        bodies: dict[tuple[int, int], bytes] = {}
        for lid in ledgers:
            dm = digest_manager(lid, DigestType.CRC32C, PASSWORD)
            for eid in range(per_ledger):
                bodies[lid, eid] = dm.package_entry(eid, eid - 1, (eid + 1) * args.size, payload)
        want = hashlib.sha1(b"".join(bodies[k] for k in sorted(bodies))).hexdigest()
        t = time.perf_counter()
        await gather_window(
            (functools.partial(pool.add, bookie, k[0], k[1], key, b) for k, b in bodies.items()),
            args.window,
        )
        add_s = time.perf_counter() - t
        n = len(bodies)
        print(f"wrote {n} x {args.size} B over {args.ledgers} ledgers: {n / add_s:,.0f} adds/s")

        async def singles(protocol: str) -> dict[tuple[int, int], bytes]:
            conn = pool.connection(bookie) if protocol == "v3" else pool.connection_v2(bookie)
            got: dict[tuple[int, int], bytes] = {}

            async def one(lid: int, eid: int) -> None:
                got[lid, eid] = (await conn.read(lid, eid)).body

            await gather_window((functools.partial(one, *k) for k in bodies), args.window)
            return got

        async def batches() -> dict[tuple[int, int], bytes]:
            conn = pool.connection_v2(bookie)
            got: dict[tuple[int, int], bytes] = {}

            async def one(lid: int, start: int) -> None:
                count = min(args.batch, per_ledger - start)
                entries = await conn.batch_read(lid, start, count, 0)
                # A bookie may return fewer (maxSize); fetch the rest of this slice.
                while True:
                    for i, body in enumerate(entries):
                        got[lid, start + i] = body
                    start += len(entries)
                    count -= len(entries)
                    if count <= 0:
                        return
                    entries = await conn.batch_read(lid, start, count, 0)

            slices = [(lid, s) for s in range(0, per_ledger, args.batch) for lid in ledgers]
            await gather_window((functools.partial(one, *k) for k in slices), args.batch_window)
            return got

        modes: dict[str, Callable[[], Awaitable[dict[tuple[int, int], bytes]]]] = {
            "v3 single": lambda: singles("v3"),
            "v2 single": lambda: singles("v2"),
            f"v2 batch of {args.batch}": batches,
        }
        best: dict[str, float] = {}
        for rnd in range(args.rounds):
            for name, mode in modes.items():
                t = time.perf_counter()
                got = await mode()
                secs = time.perf_counter() - t
                digest = hashlib.sha1(b"".join(got[k] for k in sorted(got))).hexdigest()
                assert len(got) == n and digest == want, f"{name}: wrong data"
                rate = n / secs
                best[name] = max(best.get(name, 0.0), rate)
                print(
                    f"round {rnd + 1} {name:>16}: {rate:>10,.0f} entries/s "
                    f"{n * args.size / secs / 1e6:>7,.1f} MB/s ({secs:.2f} s)"
                )
        base = best["v3 single"]
        print("best of rounds:")
        for name, rate in best.items():
            print(f"  {name:>16}: {rate:>10,.0f} entries/s  x{rate / base:.2f} vs v3 single")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=200_000)
    ap.add_argument("--ledgers", type=int, default=8)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--window", type=int, default=2000, help="single reads in flight")
    ap.add_argument("--batch", type=int, default=100, help="maxCount of a batch read")
    ap.add_argument("--batch-window", type=int, default=16, help="batch reads in flight")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--heap", default="1g", help="Java bookie heap and direct memory")
    args = ap.parse_args()
    classpath = harness.install()
    with tempfile.TemporaryDirectory() as tmp, ZooKeeperServer(Path(tmp) / "zk") as zks:
        connect = zks.connect_string
        zk = KazooClient(hosts=connect)
        zk.start()
        LedgerStore(zk).init_cluster()
        java = harness.JavaBookie(
            classpath,
            harness.metadata_uri(connect),
            Path(tmp) / "java-bookie",
            jvm=[
                f"-Xms{args.heap}",
                f"-Xmx{args.heap}",
                f"-XX:MaxDirectMemorySize={args.heap}",
                "-Djava.net.preferIPv4Stack=true",
                "-Dio.netty.leakDetection.level=disabled",
            ],
            extra={
                "dbStorage_writeCacheMaxSizeMb": 256,
                "dbStorage_readAheadCacheMaxSizeMb": 64,
                "numAddWorkerThreads": 1,
                "numReadWorkerThreads": 8,
                "serverNumIOThreads": 4,
                "journalPreAllocSizeMB": 16,
            },
        )
        java.spawn()
        try:
            java.wait_registered(zk)
            asyncio.run(bench(java.bookie_id, args))
        finally:
            java.stop()
            zk.stop()
            zk.close()


if __name__ == "__main__":
    main()
