"""Benchmark: metadata scan and parse throughput, on ZooKeeper and on Oxia.

Starts its own server (ZooKeeper, or ``oxia standalone`` with 3 shards), seeds N ledgers in
BookKeeper's hierarchical layout (v3 metadata, 3-bookie ensembles, a mix of open, closed and
multi-segment ledgers), then measures what an audit does: list the leaf directories, then
read and parse every ledger (``bklib.meta.scan.scan_directories``: on ZooKeeper the
pipelined bulk reader with ``--in-flight`` reads outstanding, on Oxia one range scan per
directory). Parse alone is measured once.

On ZooKeeper the scan runs once per ``--zk-reads`` mode: ``multi`` (the reader's default: fifty
getData to a multiRead request, ZooKeeper 3.6+) and ``each`` (one getData request per znode,
as against an older server), each with the CPU this process and the ZooKeeper server spent.

    .venv/bin/python bench/metadata_scan.py [--store zookeeper|oxia|both] [--ledgers 100000]
        [--in-flight 500] [--zk-reads multi,each]
"""

from __future__ import annotations

import argparse
import os
import queue
import random
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

from bklib.meta.cluster import MetadataDriver
from bklib.meta.model import LedgerMetadata, Segment
from bklib.meta.scan import scan_directories
from bklib.meta.serde import decode_metadata, encode_metadata
from bklib.meta.store import LedgerStore
from bklib.meta.stores import MetadataStore, open_store
from bklib.meta.stores.zookeeper import ZooKeeperStore
from bklib.testing.oxiaserver import OxiaServer
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
    # Parents first, so creates never miss one.
    for lid in range(0, n, 10_000):
        store.meta.ensure_path(store.path_for(lid).rsplit("/", 1)[0])
    blobs = ((store.path_for(lid), encode_metadata(synthetic(lid, rng))) for lid in range(n))
    meta = store.meta
    if isinstance(meta, ZooKeeperStore):  # kazoo's async creates, in_flight outstanding
        done: queue.SimpleQueue[object] = queue.SimpleQueue()
        pending = 0
        for path, data in blobs:
            meta.client.create_async(path, data).rawlink(done.put)
            pending += 1
            while pending >= in_flight:
                done.get().get()  # type: ignore[attr-defined]
                pending -= 1
        while pending:
            done.get().get()  # type: ignore[attr-defined]
            pending -= 1
        return
    with ThreadPoolExecutor(16) as pool:  # the Oxia client is synchronous
        for f in [pool.submit(meta.create, path, data) for path, data in blobs]:
            f.result()


def _cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return float(t.user + t.system)


def measure(
    kind: str,
    meta: MetadataStore,
    ledgers: int,
    in_flight: int,
    server: psutil.Process | None = None,
    seeded: bool = False,
) -> float:
    """Seed (unless ``seeded``), then list + scan; returns the list+scan rate (ledgers/s).
    With ``server``, also the CPU per ledger of this process and of the server."""
    store = LedgerStore(meta)
    if not seeded:
        store.init_cluster(driver=MetadataDriver.PULSAR)
        t = time.perf_counter()
        seed(store, ledgers, in_flight)
        seed_s = time.perf_counter() - t
        print(f"[{kind}] seeded {ledgers} ledgers in {seed_s:.1f}s ({ledgers / seed_s:,.0f}/s)")
    me = psutil.Process(os.getpid())
    cpu0 = (_cpu(me), _cpu(server) if server else 0.0)

    t = time.perf_counter()
    dirs = store.leaf_dirs()
    list_s = time.perf_counter() - t
    assert sum(d.count for d in dirs) == ledgers
    print(f"[{kind}] list: {len(dirs)} directories, {ledgers} ledgers in {list_s:.2f}s")

    t = time.perf_counter()
    ok = sum(1 for r in scan_directories(meta, dirs, in_flight) if r.ok)
    scan_s = time.perf_counter() - t
    assert ok == ledgers, ok
    print(f"[{kind}] scan (read+parse): {ok} in {scan_s:.2f}s ({ok / scan_s:,.0f} ledgers/s)")
    rate = ledgers / (list_s + scan_s)
    print(f"[{kind}] list+scan: {rate:,.0f} ledgers/s")
    if server is not None:
        ours, theirs = _cpu(me) - cpu0[0], _cpu(server) - cpu0[1]
        print(f"[{kind}] CPU per ledger (list+scan): this process {ours / ledgers * 1e6:.0f} µs, "
              f"the server {theirs / ledgers * 1e6:.0f} µs")  # fmt: skip
    return rate


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--store", choices=["zookeeper", "oxia", "both"], default="both")
    ap.add_argument("--ledgers", type=int, default=100_000)
    ap.add_argument("--in-flight", type=int, default=500)
    ap.add_argument("--zk-reads", default="multi,each", help="ZooKeeper read modes, in order")
    args = ap.parse_args()
    kinds = ["zookeeper", "oxia"] if args.store == "both" else [args.store]
    with tempfile.TemporaryDirectory() as tmp:
        for kind in kinds:
            base = Path(tmp) / kind
            if kind == "zookeeper":
                with ZooKeeperServer(base) as zk:
                    assert zk.proc is not None
                    server = psutil.Process(zk.proc.pid)
                    for n, mode in enumerate(args.zk_reads.split(",")):
                        with open_store(zk.connect_string) as meta:
                            assert isinstance(meta, ZooKeeperStore)
                            list(meta.get_many(["/ledgers/LAYOUT"]))  # opens the bulk reader
                            assert meta._bulk is not None
                            meta._bulk.multi_read = mode == "multi"
                            name = f"{kind}, {'multiRead' if mode == 'multi' else 'getData each'}"
                            measure(name, meta, args.ledgers, args.in_flight, server, n > 0)
                    with open_store(zk.connect_string) as meta:
                        blobs = [
                            meta.get(LedgerStore(meta).path_for(i))[0]
                            for i in range(min(20_000, args.ledgers))
                        ]
            else:
                with OxiaServer(base, shards=3) as ox, open_store(ox.locator()) as meta:
                    measure(kind, meta, args.ledgers, args.in_flight)
    if "zookeeper" in kinds:
        t = time.perf_counter()
        for i, b in enumerate(blobs):
            decode_metadata(b, i)
        parse_s = time.perf_counter() - t
        print(f"parse only: {len(blobs) / parse_s:,.0f} ledgers/s")


if __name__ == "__main__":
    main()
