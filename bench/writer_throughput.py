"""Benchmark: ledger writer throughput and ledger recovery time on local Python bookies.

Starts its own ZooKeeper server and three Python bookie processes (``python -m bklib.bookie``,
journal fsync on, data in a temp dir), then measures:

1. writer throughput: one LedgerWriter, E=3 WQ=2 AQ=2, 1 KiB entries, ``--in-flight`` adds
   pipelined; entries/s and payload MB/s until the last add is acknowledged, plus the close;
2. recovery of a 100k-entry ledger whose writer vanished (``abort``): the realistic case,
   where the piggybacked LAC lets recovery start at the tail;
3. recovery of a 100k-entry ledger whose entries all carry LAC -1 (as if the writer never
   learned of an ack): the worst case, every entry is recovery-read (fenced) and written back.

    .venv/bin/python bench/writer_throughput.py [--entries 100000] [--entry-size 1024]
        [--in-flight 1000] [--recovery-entries 100000] [--recovery-batch 1]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

from kazoo.client import KazooClient

from bklib.client.operations import ClientConfig
from bklib.client.pool import BookieClientPool
from bklib.client.reader import ClientContext
from bklib.client.recovery import LedgerRecovery
from bklib.client.writer import LedgerWriter
from bklib.digest import digest_manager, master_key
from bklib.meta.model import DigestType, LedgerMetadata, Segment
from bklib.meta.store import LedgerStore
from bklib.testing.ports import free_port
from bklib.testing.zkserver import ZooKeeperServer

ROOT = "/ledgers"


def start_bookies(connect: str, base: Path, n: int) -> list[tuple[subprocess.Popen[bytes], int]]:
    procs = []
    for i in range(n):
        port = free_port()
        data = base / f"bookie{i}"
        log = open(base / f"bookie{i}.log", "wb")  # noqa: SIM115 - lives as long as the process
        cmd = [
            sys.executable,
            "-m",
            "bklib.bookie",
            "--zk",
            connect,
            "--port",
            str(port),
            "--data-dir",
            str(data),
            "--log-level",
            "WARNING",
        ]
        procs.append(
            (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=Path.cwd()), port)
        )
    for proc, port in procs:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"bookie on port {port} exited with {proc.returncode}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"bookie on port {port} did not start") from None
                time.sleep(0.05)
    return procs


def wait_registered(zk: KazooClient, n: int) -> None:
    deadline = time.monotonic() + 60
    while len([c for c in zk.get_children(f"{ROOT}/available") if c != "readonly"]) < n:
        if time.monotonic() > deadline:
            raise SystemExit("bookies did not register")
        time.sleep(0.05)


async def pipelined_adds(w: LedgerWriter, n: int, payload: bytes, in_flight: int) -> None:
    window: deque[asyncio.Future[int]] = deque()
    for _ in range(n):
        window.append(w.add_async(payload))
        if len(window) >= in_flight:
            await window.popleft()
    while window:
        await window.popleft()


async def bench(args: argparse.Namespace, store: LedgerStore, connect: str) -> None:
    config = ClientConfig(add_timeout=30.0, read_timeout=30.0)
    payload = os.urandom(args.entry_size)

    async with BookieClientPool(connect, ledgers_root=ROOT, config=config) as pool:
        ctx = ClientContext(store, pool, recovery_read_batch_size=args.recovery_batch)

        # 1. writer throughput
        w = await LedgerWriter.create(ctx, ensemble_size=3, write_quorum=2, ack_quorum=2)
        await pipelined_adds(w, min(2000, args.entries), payload, args.in_flight)  # warm-up
        n = args.entries
        t0 = time.perf_counter()
        await pipelined_adds(w, n, payload, args.in_flight)
        elapsed = time.perf_counter() - t0
        t1 = time.perf_counter()
        await w.close()
        close_ms = (time.perf_counter() - t1) * 1000
        print(
            f"writer E=3 WQ=2 AQ=2, {args.entry_size} B entries, {args.in_flight} in flight: "
            f"{n} entries in {elapsed:.2f}s = {n / elapsed:,.0f} entries/s, "
            f"{n * args.entry_size / elapsed / 1e6:.2f} MB/s payload "
            f"({2 * n * args.entry_size / elapsed / 1e6:.2f} MB/s to bookies); "
            f"close {close_ms:.1f} ms"
        )

        # 2. recovery after the writer vanished
        m = args.recovery_entries
        w = await LedgerWriter.create(ctx, ensemble_size=3, write_quorum=2, ack_quorum=2)
        await pipelined_adds(w, m, payload, args.in_flight)
        await w.abort()
        t0 = time.perf_counter()
        op = LedgerRecovery(ctx, w.ledger_id)
        md = (await op.run()).value
        elapsed = time.perf_counter() - t0
        print(
            f"recovery of a {m}-entry ledger (writer vanished, LAC piggybacked): "
            f"{elapsed * 1000:.1f} ms, started after entry {op.start_lac}, "
            f"{op.entries_written_back} written back, closed at {md.last_entry_id}"
        )

        # 3. recovery when every entry carries LAC -1: all entries read and written back
        lid = await ctx.meta(store.generate_ledger_id)
        ensemble = tuple(sorted(await ctx.writable_bookies())[:3])
        md = LedgerMetadata(
            ledger_id=lid,
            ensemble_size=3,
            write_quorum=2,
            ack_quorum=2,
            segments=(Segment(0, ensemble),),
            digest_type=DigestType.CRC32C,
            password=b"",
            ctime=int(time.time() * 1000),
            store_ctime=True,
            ctoken=lid + 1,
        )
        await ctx.meta(store.create_ledger, md)
        dm, key = digest_manager(lid, DigestType.CRC32C, b""), master_key(b"")
        sem = asyncio.Semaphore(args.in_flight)

        async def put(e: int) -> None:
            async with sem:
                body = dm.package_entry(e, -1, (e + 1) * len(payload), payload)
                await asyncio.gather(
                    *(pool.add(ensemble[(e + k) % 3], lid, e, key, body) for k in range(2))
                )

        await asyncio.gather(*(put(e) for e in range(m)))
        t0 = time.perf_counter()
        op = LedgerRecovery(ctx, lid)
        md = (await op.run()).value
        elapsed = time.perf_counter() - t0
        print(
            f"recovery of a {m}-entry ledger with LAC -1 everywhere "
            f"(read batch {args.recovery_batch}): {elapsed:.2f}s = "
            f"{op.entries_written_back / elapsed:,.0f} entries/s, "
            f"{op.entries_written_back} written back, closed at {md.last_entry_id}"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--entries", type=int, default=100_000)
    p.add_argument("--entry-size", type=int, default=1024)
    p.add_argument("--in-flight", type=int, default=1000)
    p.add_argument("--recovery-entries", type=int, default=100_000)
    p.add_argument("--recovery-batch", type=int, default=1)
    args = p.parse_args()
    print("command:", shlex.join([".venv/bin/python", "bench/writer_throughput.py", *sys.argv[1:]]))
    with tempfile.TemporaryDirectory(prefix="bench-writer-") as tmp:
        base = Path(tmp)
        zk_server = ZooKeeperServer(base / "zk")
        zk_server.start()
        procs: list[tuple[subprocess.Popen[bytes], int]] = []
        zk = KazooClient(hosts=zk_server.connect_string, timeout=15)
        try:
            zk.start(timeout=30)
            store = LedgerStore(zk, ROOT)
            store.init_cluster()
            procs = start_bookies(zk_server.connect_string, base, 3)
            wait_registered(zk, 3)
            asyncio.run(bench(args, store, zk_server.connect_string))
        finally:
            for proc, _ in procs:
                proc.terminate()
            for proc, _ in procs:
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
            zk.stop()
            zk.close()
            zk_server.stop()


if __name__ == "__main__":
    main()
