"""Benchmark: Java ``bookkeeper shell recover`` against ``bkaudit recover`` and ``bkaudit
rereplicate`` on the same data, in one run.

In fresh clusters of four Java BookKeeper 4.17 bookies (DbLedgerStorage, fsync'd journals) on one
ZooKeeper, the Java client writes the same ledgers (E=3 WQ=2 AQ=2 by default, 1 KiB entries,
ensembles rotating over the four bookies, closed), then one bookie is killed. Each cluster is
repaired by one tool:

1. ``BookieShell recover -f <bookie>`` (BookKeeperAdmin, one JVM);
2. ``bkaudit recover <bookie> --grace-period 0s --rate 0``;
3. ``bkaudit audit --check lost`` (timed separately), then ``bkaudit rereplicate
   --grace-period 0s --rate 0``.

The bkaudit commands run with ``--executor`` (default ``auto``, which picks ``local`` at this
size). Every run is checked: no ledger keeps the dead bookie. Wall times include process, JVM
or Spark start-up; each ratio is Java's wall time over the repair command's.

    .venv/bin/python bench/java_recover_vs_rereplicate.py [--ledgers 24] [--entries 2000]
        [--entry-size 1024] [--ensemble 3 --write-quorum 2] [--bookie-protocol v2|v3]
        [--executor auto|local|spark]

1 GiB on the dead bookie: ``--ledgers 64 --entries 512 --entry-size 65536`` (each cluster's
directories are removed once it is repaired, so three clusters never hold 12 GiB at once).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kazoo.client import KazooClient

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

from bklib.meta.store import LedgerStore  # noqa: E402
from bklib.quorum import write_set  # noqa: E402
from bklib.testing.zkserver import ZooKeeperServer  # noqa: E402
from tests.cli_helpers import byte_compile  # noqa: E402
from tests.interop import harness  # noqa: E402
from tests.interop.harness import bookies_cpu, children_cpu  # noqa: E402

JVM = ["-Xms512m", "-Xmx512m", "-XX:MaxDirectMemorySize=512m", "-Djava.net.preferIPv4Stack=true"]
PWD = b"bench"


def build(
    classpath: str, connect: str, base: Path, client: harness.JavaClient, args: argparse.Namespace
) -> tuple[KazooClient, LedgerStore, list[harness.JavaBookie], int]:
    """A cluster of 4 Java bookies with the benchmark ledgers; returns the bytes on bookie 0."""
    zk = KazooClient(hosts=connect)
    zk.start()
    store = LedgerStore(zk)
    store.init_cluster()
    uri = harness.metadata_uri(connect)
    bookies = [
        harness.JavaBookie(
            classpath,
            uri,
            base / f"java{i}",
            jvm=JVM,
            extra={"dbStorage_writeCacheMaxSizeMb": 64, "dbStorage_readAheadCacheMaxSizeMb": 32},
        )
        for i in range(4)
    ]
    harness.start_bookies(bookies, zk)
    ids = [b.bookie_id for b in bookies]
    payload = b"x" * args.size
    e, wq = args.ensemble, args.write_quorum
    # The Java driver takes payloads as one JSON line: big ledgers go in pieces of <= 16 MiB.
    piece = max(1, (16 << 20) // args.size)
    on_victim = 0
    for n in range(args.ledgers):
        ensemble = [ids[(n + k) % 4] for k in range(e)]
        first = min(piece, args.entries)
        lid = client.write(
            uri,
            [payload] * first,
            ensemble=e,
            write_quorum=wq,
            ack_quorum=min(2, wq),
            password=PWD,
            bookies=ensemble,
            pipelined=True,
            close=first == args.entries,
        )
        if first < args.entries:
            for start in range(first, args.entries, piece):
                count = min(piece, args.entries - start)
                client.add(lid, [payload] * count)
            client.call("close", ledgerId=lid)
        if ids[0] in ensemble:
            idx = ensemble.index(ids[0])
            on_victim += sum(idx in write_set(x, e, wq) for x in range(args.entries)) * args.size
    return zk, store, bookies, on_victim


def kill_victim(zk: KazooClient, bookies: list[harness.JavaBookie]) -> str:
    victim = bookies[0]
    victim.kill9()
    while zk.exists(f"/ledgers/available/{victim.bookie_id}"):
        time.sleep(0.2)  # its ZooKeeper session must expire before it counts as lost
    return victim.bookie_id


def check_repaired(store: LedgerStore, victim: str) -> None:
    for lid in store.list_ledger_ids():
        md = store.read_ledger(lid).value
        assert all(victim not in s.ensemble for s in md.segments), (lid, md)


def cli(*args: str, log: Path) -> tuple[float, str]:
    t = time.perf_counter()
    res = subprocess.run(
        [sys.executable, "-m", "jobs.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    elapsed = time.perf_counter() - t
    log.write_text(res.stdout + res.stderr)
    if res.returncode != 0:
        raise SystemExit(f"bkaudit {args[0]} failed ({res.returncode}), see {log}")
    return elapsed, res.stdout + res.stderr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ledgers", type=int, default=24)
    ap.add_argument("--entries", type=int, default=2000)
    ap.add_argument("--entry-size", "--size", dest="size", type=int, default=1024)
    ap.add_argument("--ensemble", type=int, default=3, choices=(2, 3))
    ap.add_argument("--write-quorum", type=int, default=2)
    ap.add_argument(
        "--bookie-protocol",
        default=None,
        choices=("v2", "v3"),
        help="bkaudit's --bookie-protocol (default: the commands' own default)",
    )
    ap.add_argument("--executor", default="auto", choices=("auto", "local", "spark"))
    ap.add_argument("--audit-check", default="lost", choices=("lost", "replicas", "deep"))
    args = ap.parse_args()
    byte_compile()  # as an installed package is
    classpath = harness.install()
    with tempfile.TemporaryDirectory() as tmp, ZooKeeperServer(Path(tmp) / "zk") as zks:
        base = Path(tmp)
        client = harness.JavaClient(classpath, base)
        cpu: dict[str, tuple[float, float]] = {}
        try:
            # 1. Java: shell recover.
            with zks.private_chroot("java") as connect:
                zk, store, bookies, nbytes = build(classpath, connect, base / "a", client, args)
                try:
                    victim = kill_victim(zk, bookies)
                    shell = harness.JavaShell(
                        classpath, harness.metadata_uri(connect), base / "a", jvm=JVM
                    )
                    t, c_bk, c_tool = time.perf_counter(), bookies_cpu(bookies), children_cpu()
                    shell.run("recover", "-f", victim, timeout=3600)
                    java_s = time.perf_counter() - t
                    cpu["java"] = (bookies_cpu(bookies) - c_bk, children_cpu() - c_tool)
                    check_repaired(store, victim)
                finally:
                    for b in bookies:
                        b.stop()
                    zk.stop()
                    shutil.rmtree(base / "a", ignore_errors=True)
            mb = nbytes / 1e6
            print(
                f"java shell recover: {mb:.1f} MB of entries in {java_s:.1f} s wall "
                f"(CPU: bookies {cpu['java'][0]:.1f} s, shell {cpu['java'][1]:.1f} s)"
            )

            # 2. bkaudit recover, and 3. bkaudit audit + rereplicate, on the same data.
            ex = ["--executor", args.executor]
            fast = ["--grace-period", "0s", "--rate", "0", *ex]
            if args.bookie_protocol:
                fast += ["--bookie-protocol", args.bookie_protocol]
            results: dict[str, float] = {}
            for name in ("recover", "rereplicate"):
                with zks.private_chroot(name) as connect:
                    zk, store, bookies, nbytes2 = build(
                        classpath, connect, base / name, client, args
                    )
                    assert nbytes2 == nbytes
                    try:
                        victim = kill_victim(zk, bookies)
                        wh = str(base / f"warehouse-{name}")
                        c_bk = bookies_cpu(bookies)
                        common = ["--zk", connect, "--warehouse", wh]
                        c_tool = children_cpu()
                        if name == "recover":
                            results[name], out = cli(
                                "recover", victim, *common, *fast, log=base / f"{name}.log"
                            )
                        else:
                            results["audit"], _ = cli(
                                "audit", *common, "--check", args.audit_check, *ex,
                                log=base / "audit.log",
                            )  # fmt: skip
                            c_bk, c_tool = bookies_cpu(bookies), children_cpu()
                            results[name], out = cli(
                                "rereplicate", *common, *fast, log=base / f"{name}.log"
                            )
                        cpu[name] = (bookies_cpu(bookies) - c_bk, children_cpu() - c_tool)
                        check_repaired(store, victim)
                    finally:
                        for b in bookies:
                            b.stop()
                        zk.stop()
                        shutil.rmtree(base / name, ignore_errors=True)
                m = re.search(r"in ([\d.]+)s \(([\d.]+) MB copied", out)
                work = f", {m.group(1)} s copying ({m.group(2)} MB)" if m else ""
                chosen = re.search(r"executor (\w+)", out)
                print(
                    f"bkaudit {name} [{chosen.group(1) if chosen else '?'}]: {mb:.1f} MB of "
                    f"entries in {results[name]:.1f} s wall{work}; "
                    f"{java_s / results[name]:.2f}x Java's speed "
                    f"(CPU: bookies {cpu[name][0]:.1f} s, bkaudit {cpu[name][1]:.1f} s)"
                )
            print(
                f"bkaudit audit --check {args.audit_check} before rereplicate: "
                f"{results['audit']:.1f} s wall; audit + rereplicate "
                f"{java_s / (results['audit'] + results['rereplicate']):.2f}x Java's speed"
            )
        finally:
            client.close()


if __name__ == "__main__":
    main()
