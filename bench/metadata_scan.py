"""Benchmark: metadata scan and parse throughput.

Starts its own ZooKeeper server, seeds N ledgers in BookKeeper's hierarchical layout
(v3 metadata, 3-bookie ensembles, a mix of open, closed and multi-segment ledgers), then
measures listing, the bounded-in-flight async scan (read + parse), and parse alone.

    .venv/bin/python bench/metadata_scan.py [--ledgers 100000] [--in-flight 500]
"""

from __future__ import annotations

import argparse
import queue
import random
import tempfile
import time

from bklib.meta.model import LedgerMetadata, Segment
from bklib.meta.scan import scan_ledgers
from bklib.meta.serde import decode_metadata, encode_metadata
from bklib.meta.store import LedgerStore, connect
from bklib.testing.zkserver import ZooKeeperServer


def synthetic(ledger_id: int, rng: random.Random) -> LedgerMetadata:
    bookies = [f"10.0.{i // 250}.{i % 250}:3181" for i in range(12)]
    segs = [Segment(0, tuple(rng.sample(bookies, 3)))]
    if rng.random() < 0.2:
        segs.append(Segment(rng.randint(1, 10_000), tuple(rng.sample(bookies, 3))))
    md = LedgerMetadata(
        ledger_id=ledger_id,
        ensemble_size=3,
        write_quorum=rng.choice([2, 3]),
        ack_quorum=2,
        segments=tuple(segs),
        ctoken=rng.randrange(1 << 62),
        custom_metadata={"application": b"pulsar", "component": b"managed-ledger"},
    )
    if rng.random() < 0.8:
        md = md.closed(segs[-1].first_entry_id + rng.randint(0, 50_000), rng.randint(0, 1 << 30))
    return md


def seed(store: LedgerStore, n: int, in_flight: int) -> None:
    rng = random.Random(42)
    done: queue.SimpleQueue[object] = queue.SimpleQueue()
    pending = 0
    # Parents first, synchronously, so async creates never hit NONODE.
    for lid in range(0, n, 10_000):
        store.zk.ensure_path(store.path_for(lid).rsplit("/", 1)[0])
    for lid in range(n):
        data = encode_metadata(synthetic(lid, rng))
        store.zk.create_async(store.path_for(lid), data).rawlink(done.put)
        pending += 1
        while pending >= in_flight:
            done.get().get()
            pending -= 1
    while pending:
        done.get().get()
        pending -= 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ledgers", type=int, default=100_000)
    ap.add_argument("--in-flight", type=int, default=500)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp, ZooKeeperServer(tmp) as server:
        zk = connect(server.connect_string)
        store = LedgerStore(zk)
        store.init_cluster()
        t = time.perf_counter()
        seed(store, args.ledgers, args.in_flight)
        seed_s = time.perf_counter() - t
        print(f"seeded {args.ledgers} ledgers in {seed_s:.1f}s ({args.ledgers / seed_s:,.0f}/s)")

        t = time.perf_counter()
        ids = list(store.list_ledger_ids())
        list_s = time.perf_counter() - t
        assert len(ids) == args.ledgers
        print(f"list: {len(ids)} ids in {list_s:.2f}s ({len(ids) / list_s:,.0f} ledgers/s)")

        t = time.perf_counter()
        ok = sum(
            1
            for r in scan_ledgers(server.connect_string, ids, max_in_flight=args.in_flight)
            if r.ok
        )
        scan_s = time.perf_counter() - t
        assert ok == args.ledgers
        print(
            f"scan (read+parse, {args.in_flight} in flight): {ok} in {scan_s:.2f}s "
            f"({ok / scan_s:,.0f} ledgers/s)"
        )
        total = list_s + scan_s
        print(f"list+scan: {args.ledgers / total:,.0f} ledgers/s")

        blobs = [zk.get(store.path_for(i))[0] for i in range(min(20_000, args.ledgers))]
        t = time.perf_counter()
        for i, b in enumerate(blobs):
            decode_metadata(b, i)
        parse_s = time.perf_counter() - t
        print(f"parse only: {len(blobs) / parse_s:,.0f} ledgers/s")
        zk.stop()
        zk.close()


if __name__ == "__main__":
    main()
