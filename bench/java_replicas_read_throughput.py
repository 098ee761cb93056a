"""Benchmark: ``bkaudit audit --check replicas`` against the Java bookies' own read throughput.

On a healthy cluster of four Java BookKeeper 4.17 DbLedgerStorage bookies (built as in
``bench/java_recover_vs_rereplicate.py``: the Java client writes ``--ledgers`` closed ledgers of
``--entries`` entries of ``--entry-size`` bytes, E=3 WQ=2 AQ=2, ensembles rotating; 1 GiB of
entries by default, 2 GiB stored), in one run:

``--rounds`` rounds (default 2, so the bookies' JIT warm-up favours neither side) of:

1. a plain read loop: every bookie's whole stripe of every ledger it holds, read as v2
   BATCH_READs of runs of consecutive entries (``--batch`` at most, ``--window`` batches in
   flight per bookie, all bookies at once): what the bookies can serve, with no checking;
2. ``bkaudit audit --check replicas --executor local --read-rate 0`` (a new process,
   start-up included; the per-bookie read budget off, as the loop has none), which reads the
   same entries, by the same kind of request, to prove each replica whole.

The best of each is compared: the audit's rate is the loop's bytes over the audit's wall
time, and the ratio is that rate over the loop's.

    .venv/bin/python bench/java_replicas_read_throughput.py [--ledgers 32] [--entries 512]
        [--entry-size 65536] [--batch 64] [--window 8] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

import java_recover_vs_rereplicate as jr  # noqa: E402

from bklib.client.operations import ClientConfig  # noqa: E402
from bklib.client.pool import BookieClientPool  # noqa: E402
from bklib.meta.store import LedgerStore  # noqa: E402
from bklib.quorum import contiguous_chunks, iter_stripe  # noqa: E402
from bklib.testing.zkserver import ZooKeeperServer  # noqa: E402
from tests.interop import harness  # noqa: E402


def work(store: LedgerStore, batch: int) -> dict[str, list[tuple[int, int, int]]]:
    """Per bookie: (ledger, first, count) of every batch its stripes need."""
    per: dict[str, list[tuple[int, int, int]]] = {}
    for lid in store.list_ledger_ids():
        md = store.read_ledger(lid).value
        e, wq = md.ensemble_size, md.write_quorum
        for i, seg in enumerate(md.segments):
            last = md.segment_last_entry_id(i)
            for idx, bookie in enumerate(seg.ensemble):
                stripe = iter_stripe(idx, seg.first_entry_id, last, e, wq)
                per.setdefault(bookie, []).extend(
                    (lid, c[0], len(c)) for c in contiguous_chunks(stripe, batch)
                )
    return per


async def plain_loop(per: dict[str, list[tuple[int, int, int]]], window: int) -> tuple[int, float]:
    """Read every batch; returns (bytes read, seconds)."""
    total = 0
    async with BookieClientPool(None, config=ClientConfig(read_timeout=60.0)) as pool:

        async def lane(bookie: str, todo: list[tuple[int, int, int]]) -> None:
            nonlocal total
            conn = pool.connection_v2(bookie)
            while todo:
                lid, first, count = todo.pop()
                while count > 0:  # a reply may stop short at the bookie's size limit
                    bodies = await conn.batch_read(lid, first, count, 0)
                    assert bodies, (bookie, lid, first)
                    total += sum(len(b) for b in bodies)
                    first, count = first + len(bodies), count - len(bodies)

        t = time.perf_counter()
        await asyncio.gather(
            *(lane(b, todo) for b, batches in per.items() for todo in _split(batches, window))
        )
        return total, time.perf_counter() - t


def _split(batches: list[tuple[int, int, int]], n: int) -> list[list[tuple[int, int, int]]]:
    return [batches[i::n] for i in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ledgers", type=int, default=32)
    ap.add_argument("--entries", type=int, default=512)
    ap.add_argument("--entry-size", "--size", dest="size", type=int, default=65536)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--window", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    args.ensemble, args.write_quorum = 3, 2
    classpath = harness.install()
    with tempfile.TemporaryDirectory() as tmp, ZooKeeperServer(Path(tmp) / "zk") as zks:
        base = Path(tmp)
        client = harness.JavaClient(classpath, base)
        try:
            with zks.private_chroot("read") as connect:
                zk, store, bookies, _ = jr.build(classpath, connect, base / "c", client, args)
                try:
                    loops: list[float] = []
                    audits: list[float] = []
                    n0 = 0
                    for rnd in range(1, args.rounds + 1):
                        n, secs = asyncio.run(plain_loop(work(store, args.batch), args.window))
                        assert n0 in (0, n), (n0, n)
                        n0 = n
                        loops.append(secs)
                        print(
                            f"round {rnd}: plain batch-read loop {n / 1e6:.1f} MB in {secs:.1f} s"
                        )
                        wh = str(base / f"warehouse{rnd}")
                        audit_s, out = jr.cli(
                            "audit", "--zk", connect, "--warehouse", wh, "--check", "replicas",
                            "--executor", "local", "--read-rate", "0", log=base / "audit.log",
                        )  # fmt: skip
                        audits.append(audit_s)
                        last = out.strip().splitlines()[-1]
                        print(f"round {rnd}: audit {audit_s:.1f} s wall: {last}")
                finally:
                    for b in bookies:
                        b.stop()
                    zk.stop()
            best = n0 / min(loops)
            audit_s = min(audits)
            audit = n0 / audit_s
            print(
                f"bookies' aggregate batch-read throughput (best loop): {best / 1e6:.1f} MB/s; "
                f"bkaudit audit --check replicas (best): {audit_s:.1f} s wall, "
                f"{audit / 1e6:.1f} MB/s, "
                f"{audit / best:.0%} of it"
            )
        finally:
            client.close()


if __name__ == "__main__":
    main()
