"""Benchmark: the CPU of one kazoo request, with kazoo's own threading handler and with bklib's
:class:`~bklib.meta.stores.zookeeper.handler.PollingHandler`.

Starts its own ZooKeeper, then for each handler and each thread count sends ``--requests``
requests of the kinds the repair sends (a ``get`` of a ledger's metadata, a versioned
``set``, an ephemeral ``create`` and its ``delete``, as a lock is taken and dropped) from
that many threads through one session. It prints the requests per second and the CPU of
this process per request (the callers' threads and kazoo's connection thread together).
Rounds alternate the handlers, so the machine's drift falls on both.

    .venv/bin/python bench/kazoo_requests.py [--requests 20000] [--threads 1,16] [--rounds 2]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import psutil
from kazoo.client import KazooClient
from kazoo.handlers.threading import SequentialThreadingHandler

from bklib.meta.stores.zookeeper.handler import PollingHandler
from bklib.testing.zkserver import ZooKeeperServer

HANDLERS: dict[str, Callable[[], SequentialThreadingHandler]] = {
    "kazoo": SequentialThreadingHandler,
    "bklib": PollingHandler,
}


def _requests(zk: KazooClient, kind: str, worker: int, n: int) -> None:
    path = f"/bench/w{worker}"
    for i in range(n):
        if kind == "get":
            zk.get("/bench/ledger")
        elif kind == "set":
            zk.set(path, b"%d" % i, version=i)
        else:
            zk.create(f"{path}-lock", b"worker", ephemeral=True)
            zk.delete(f"{path}-lock")


def measure(hosts: str, handler: str, kind: str, threads: int, total: int) -> dict[str, float]:
    """Requests per second and CPU µs per request for one handler, kind and thread count."""
    zk = KazooClient(hosts=hosts, handler=HANDLERS[handler]())
    zk.start(timeout=30)
    try:
        zk.ensure_path("/bench")
        if not zk.exists("/bench/ledger"):
            zk.create("/bench/ledger", b"m" * 200)
        for w in range(threads):
            if zk.exists(f"/bench/w{w}"):
                zk.delete(f"/bench/w{w}")
            zk.create(f"/bench/w{w}", b"")
        per = total // threads
        sent = per * threads * (2 if kind == "lock" else 1)
        me = psutil.Process()
        c0, t0 = me.cpu_times(), time.monotonic()
        with ThreadPoolExecutor(threads) as ex:
            list(ex.map(lambda w: _requests(zk, kind, w, per), range(threads)))
        wall = time.monotonic() - t0
        c1 = me.cpu_times()
        cpu = (c1.user - c0.user) + (c1.system - c0.system)
        return {"per_s": sent / wall, "cpu_us": cpu / sent * 1e6}
    finally:
        zk.stop()
        zk.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--threads", default="1,16")
    ap.add_argument("--kinds", default="get,set,lock")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    kinds = args.kinds.split(",")
    with tempfile.TemporaryDirectory(prefix="kazoo-bench-") as tmp:
        server = ZooKeeperServer(tmp).start()
        try:
            print("round handler kind threads requests/s CPU-µs/request")
            for r in range(args.rounds):
                order = list(HANDLERS) if r % 2 == 0 else list(reversed(HANDLERS))
                for handler in order:
                    for kind in kinds:
                        for t in threads:
                            m = measure(server.connect_string, handler, kind, t, args.requests)
                            print(
                                f"{r} {handler} {kind} {t} {m['per_s']:.0f} {m['cpu_us']:.0f}",
                                flush=True,
                            )
        finally:
            server.stop()


if __name__ == "__main__":
    main()
