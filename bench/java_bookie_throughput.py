"""Benchmark: a Java BookKeeper 4.17 bookie next to our Python bookie, driven the same way.

One ZooKeeper, one Python bookie (the sandbox's) and one Java bookie (``org.apache.bookkeeper.
server.Main``, DbLedgerStorage, fsync'd journal -- BookKeeper's defaults) in one cluster; the
bklib asyncio client of ``bench/bookie_throughput.py`` sends the same pipelined 1 KiB CRC32C
adds, then reads, to each in turn, and the Java/Python ratio is printed.

    .venv/bin/python bench/java_bookie_throughput.py [--entries 200000] [--ledgers 8] \\
        [--window 2000] [--heap 1g]

Needs the BookKeeper jars (``scripts/install_bookkeeper.sh``, run here if missing).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

from kazoo.client import KazooClient

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

from bookie_throughput import drive  # noqa: E402

from bklib.meta.store import LedgerStore  # noqa: E402
from bklib.testing.sandbox import BookieProcess  # noqa: E402
from bklib.testing.zkserver import ZooKeeperServer  # noqa: E402
from tests.interop import harness  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=200_000)
    ap.add_argument("--ledgers", type=int, default=8)
    ap.add_argument("--window", type=int, default=2000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--heap", default="1g", help="Java bookie heap and direct memory")
    args = ap.parse_args()
    classpath = harness.install()
    with tempfile.TemporaryDirectory() as tmp, ZooKeeperServer(Path(tmp) / "zk") as zks:
        connect = zks.connect_string
        zk = KazooClient(hosts=connect)
        zk.start()
        LedgerStore(zk).init_cluster()
        py = BookieProcess(connect, Path(tmp) / "python-bookie").start()
        # A production-like JVM (full JIT, bigger heap) with BookKeeper's storage defaults,
        # except a write cache sized for this heap.
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
                # BookKeeper's defaults on this 2-core machine (the harness runs smaller).
                "numAddWorkerThreads": 1,
                "numReadWorkerThreads": 8,
                "serverNumIOThreads": 4,
                "journalPreAllocSizeMB": 16,
            },
        )
        java.spawn()
        try:
            java.wait_registered(zk)
            rates = {}
            for name, bookie in (("python", py.bookie_id), ("java", java.bookie_id)):
                print(f"--- {name} bookie {bookie}")
                rates[name] = asyncio.run(
                    drive(bookie, connect, args.entries, args.ledgers, args.window, args.size)
                )
            (py_add, py_read), (j_add, j_read) = rates["python"], rates["java"]
            print(
                f"ratio java/python: adds {j_add / py_add:.2f}x "
                f"({j_add:,.0f} vs {py_add:,.0f} adds/s), "
                f"reads {j_read / py_read:.2f}x ({j_read:,.0f} vs {py_read:,.0f} reads/s)"
            )
        finally:
            java.stop()
            py.stop()
            zk.stop()


if __name__ == "__main__":
    main()
