"""Benchmark: time to fully replicated after a bookie dies, `bkaudit watch` against Java
AutoRecovery (Auditor + ReplicationWorker), with lostBookieRecoveryDelay=0.

In two fresh clusters of four Java BookKeeper 4.17 bookies (DbLedgerStorage) on one ZooKeeper,
the Java client writes the same ledgers: E=3 WQ=2 AQ=2, 1 KiB entries, ensembles rotating over
the four bookies, a quarter left open by a writer that stays idle. One repairer runs per
cluster:

1. ``AutoRecoveryMain`` (lostBookieRecoveryDelay 0, openLedgerRereplicationGracePeriod 0,
   no rate limit);
2. ``bkaudit watch --lost-bookie-recovery-delay 0s --grace-period 0s --rate 0``.

Once it runs, a bookie is killed with SIGKILL. The clock starts when its registration expires
(polled every 0.25 s). It stops at the first 0.25 s sample where no ledger names the bookie
and no under-replication mark is left.

    .venv/bin/python bench/time_to_replicated.py [--ledgers 100] [--entries 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from kazoo.client import KazooClient

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

from bklib.meta.store import LedgerStore  # noqa: E402
from bklib.meta.underreplication import UnderReplicationManager  # noqa: E402
from bklib.testing.zkserver import ZooKeeperServer, free_port, terminate  # noqa: E402
from tests.interop import harness  # noqa: E402

JVM = ["-Xms256m", "-Xmx256m", "-XX:MaxDirectMemorySize=256m", "-Djava.net.preferIPv4Stack=true"]
PWD = b"bench"
SAMPLE = 0.25


def build(
    classpath: str, connect: str, base: Path, client: harness.JavaClient, args: argparse.Namespace
) -> tuple[KazooClient, LedgerStore, list[harness.JavaBookie]]:
    zk = KazooClient(hosts=connect)
    zk.start()
    store = LedgerStore(zk)
    store.init_cluster()
    urm = UnderReplicationManager(zk)
    urm.ensure_layout()
    urm.set_lost_bookie_recovery_delay(0)
    uri = harness.metadata_uri(connect)
    bookies = [
        harness.JavaBookie(
            classpath,
            uri,
            base / f"java{i}",
            jvm=JVM,
            extra={"dbStorage_writeCacheMaxSizeMb": 32, "dbStorage_readAheadCacheMaxSizeMb": 16},
        )
        for i in range(4)
    ]
    harness.start_bookies(bookies, zk)
    ids = [b.bookie_id for b in bookies]
    payload = b"x" * args.size
    for n in range(args.ledgers):
        ensemble = [ids[(n + k) % 4] for k in range(3)]
        client.write(
            uri,
            [payload] * args.entries,
            password=PWD,
            bookies=ensemble,
            pipelined=True,
            close=n % 4 != 3,  # a quarter open, their writer idle
        )
    return zk, store, bookies


def measure(zk: KazooClient, store: LedgerStore, victim: harness.JavaBookie) -> float:
    """Kill the victim; seconds from its registration's expiry to fully replicated."""
    bid = victim.bookie_id
    victim.kill9()
    while zk.exists(f"/ledgers/available/{bid}"):
        time.sleep(SAMPLE)
    t0 = time.monotonic()
    urm = UnderReplicationManager(zk)
    ids = list(store.list_ledger_ids())
    while True:
        named = any(bid in store.read_ledger(lid).value.bookies() for lid in ids)
        if not named and not any(True for _ in urm.list_underreplicated()):
            return time.monotonic() - t0
        if time.monotonic() - t0 > 3600:
            raise SystemExit("not replicated within an hour")
        time.sleep(SAMPLE)


def wait(cond: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.25)
    raise SystemExit(f"timed out waiting for {what}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ledgers", type=int, default=100)
    ap.add_argument("--entries", type=int, default=1000)
    ap.add_argument("--size", type=int, default=1024)
    args = ap.parse_args()
    classpath = harness.install()
    mb = args.ledgers * args.entries * args.size / 1e6
    with tempfile.TemporaryDirectory() as tmp, ZooKeeperServer(Path(tmp) / "zk") as zks:
        base = Path(tmp)
        client = harness.JavaClient(classpath, base)
        results: dict[str, float] = {}
        try:
            # 1. Java AutoRecovery.
            with zks.private_chroot("java") as connect:
                zk, store, bookies = build(classpath, connect, base / "a", client, args)
                ar = harness.AutoRecovery(
                    classpath,
                    harness.metadata_uri(connect),
                    base / "a",
                    extra={"lostBookieRecoveryDelay": 0, "openLedgerRereplicationGracePeriod": 0},
                )
                try:
                    ar.start()
                    election = "/ledgers/underreplication/auditorelection"
                    wait(lambda: zk.exists(election) and zk.get_children(election), 120, "Auditor")
                    time.sleep(3)  # the Auditor reads the bookie list once elected
                    results["java"] = measure(zk, store, bookies[0])
                finally:
                    ar.stop()
                    for b in bookies:
                        b.stop()
                    zk.stop()
            print(f"java AutoRecovery: {mb:.0f} MB, {results['java']:.2f} s to fully replicated")

            # 2. bkaudit watch.
            with zks.private_chroot("watch") as connect:
                zk, store, bookies = build(classpath, connect, base / "b", client, args)
                port = free_port()
                argv = [
                    sys.executable, "-m", "jobs.cli", "watch", "--zk", connect,
                    "--warehouse", str(base / "wh"), "--every", "off",
                    "--lost-bookie-recovery-delay", "0s", "--grace-period", "0s", "--rate", "0",
                    "--metrics-port", str(port), "--metrics-host", "127.0.0.1",
                ]  # fmt: skip
                with open(base / "watch.log", "ab") as out:
                    proc = subprocess.Popen(
                        argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                        env={**os.environ, "PYTHONPATH": str(REPO)},
                    )  # fmt: skip

                def leading() -> bool:
                    try:
                        url = f"http://127.0.0.1:{port}/readyz"
                        with urllib.request.urlopen(url, timeout=2) as r:
                            return bool(json.loads(r.read())["role"] == "leader")
                    except OSError:
                        return False

                try:
                    wait(leading, 60, "the watch leader")
                    results["watch"] = measure(zk, store, bookies[0])
                finally:
                    terminate(proc, 40)
                    for b in bookies:
                        b.stop()
                    zk.stop()
            print(f"bkaudit watch:     {mb:.0f} MB, {results['watch']:.2f} s to fully replicated")
            print(f"watch is {results['java'] / results['watch']:.1f}x faster")
        finally:
            client.close()


if __name__ == "__main__":
    main()
