"""Benchmark: time to fully replicated after a bookie dies, `bkaudit watch` against Java
AutoRecovery (Auditor + ReplicationWorker), with lostBookieRecoveryDelay=0.

In two fresh clusters of four Java BookKeeper 4.17 bookies (DbLedgerStorage) on one ZooKeeper,
the Java client writes the same ledgers: E=3 WQ=2 AQ=2, 1 KiB entries, ensembles rotating over
the four bookies, a quarter left open by a writer that stays idle. The repairers:

1. Java: one ``AutoRecoveryMain`` per surviving bookie (``--workers``, default 3: an Auditor
   elected among them and a ReplicationWorker each, as autorecovery on every bookie host),
   lostBookieRecoveryDelay 0, openLedgerRereplicationGracePeriod ``--grace``, Pulsar's
   rereplicationEntryBatchSize 100 and the v2 protocol, no rate limit. The Auditor's periodic
   checkAllLedgers is off: run at election, it can find the killed bookie by failed reads
   before its registration expires, which is not the reaction being measured. Its JVMs get
   the bookies' options (256 MB heap, full JIT), not the tests' quick-start ones;
2. ``bkaudit watch --lost-bookie-recovery-delay 0s --grace-period GRACE --rate 0``.

Once it runs, a bookie is killed with SIGKILL. Times are taken from its registration's expiry
(the first moment either tool can know; polled every 0.25 s) and from the kill, to

- the first sample where no closed ledger names the bookie (closed ledgers: bandwidth and
  reaction, not the grace period), and
- the first sample where no ledger names it and no under-replication mark is left.

ZooKeeper data watches on the ledgers still naming the bookie tell which changed; each sample
(every 0.25 s) re-reads only those, so sampling 2,000 ledgers costs ZooKeeper next to
nothing.

``--metadata oxia`` runs both clusters on Oxia instead, as Pulsar does (PIP-335): a fresh
3-shard ``oxia standalone`` per cluster, Java bookies, client and AutoRecovery on Pulsar's jars
(the BookKeeper Pulsar pins) with Pulsar's metadata driver (``metadata-store:oxia://``), and
the watch given the same server. Oxia has no per-key watches there, so each sample re-reads
the ledgers still naming the bookie in one bulk read.

    .venv/bin/python bench/time_to_replicated.py [--ledgers 100] [--entries 1000] [--grace 0]
        [--only java|watch] [--watch-log FILE] [--metadata zookeeper|oxia]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

from bklib.meta.cluster import MetadataDriver  # noqa: E402
from bklib.meta.serde import decode_metadata  # noqa: E402
from bklib.meta.store import LedgerStore  # noqa: E402
from bklib.meta.stores import open_store  # noqa: E402
from bklib.meta.stores.base import MetadataStore  # noqa: E402
from bklib.meta.underreplication import UnderReplicationManager  # noqa: E402
from bklib.testing.oxiaserver import OxiaServer  # noqa: E402
from bklib.testing.ports import free_port  # noqa: E402
from bklib.testing.zkserver import ZooKeeperServer, terminate  # noqa: E402
from tests.cli_helpers import byte_compile  # noqa: E402
from tests.interop import harness  # noqa: E402
from tests.pulsar import harness as pulsar  # noqa: E402

JVM = ["-Xms256m", "-Xmx256m", "-XX:MaxDirectMemorySize=256m", "-Djava.net.preferIPv4Stack=true"]
PWD = b"bench"
SAMPLE = 0.25


class Cluster:
    """Where one side's cluster keeps its metadata: a ZooKeeper chroot (BookKeeper's driver)
    or a fresh Oxia server (Pulsar's driver), with the JVM options and URI that go with it."""

    def __init__(
        self, classpath: str, locator: str, uri: str, oxia: bool, server_pid: int | None
    ) -> None:
        self.classpath, self.locator, self.uri, self.oxia = classpath, locator, uri, oxia
        self.server_pids = [server_pid] if server_pid is not None else []
        self.jvm = [*JVM, *pulsar.DRIVER_PROPS] if oxia else JVM
        self.election = (
            "/ledgers/underreplication/leader"  # Pulsar's Auditor key
            if oxia
            else "/ledgers/underreplication/auditorelection"
        )

    def connect(self) -> KazooClient | MetadataStore:
        if self.oxia:
            return open_store(self.locator, timeout=15)
        zk = KazooClient(hosts=self.locator)
        zk.start()
        return zk

    def auditor_elected(self, zk: KazooClient | MetadataStore) -> bool:
        if isinstance(zk, KazooClient):
            return bool(zk.exists(self.election) and zk.get_children(self.election))
        return zk.exists(self.election) is not None


def build(
    cl: Cluster, base: Path, client: harness.JavaClient, args: argparse.Namespace
) -> tuple[KazooClient | MetadataStore, LedgerStore, list[harness.JavaBookie]]:
    zk = cl.connect()
    store = LedgerStore(zk)
    store.init_cluster(driver=MetadataDriver.PULSAR if cl.oxia else MetadataDriver.BOOKKEEPER)
    urm = UnderReplicationManager(zk)
    urm.ensure_layout()
    urm.set_lost_bookie_recovery_delay(0)
    uri = cl.uri
    bookies = [
        harness.JavaBookie(
            cl.classpath,
            uri,
            base / f"java{i}",
            jvm=cl.jvm,
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


class Times(dict[str, float]):
    """Seconds from the expiry (and from the kill) to closed-ledgers-clean and to clean, and
    the CPU seconds each party used from the expiry to clean: the repairer's processes, the
    surviving bookies and the metadata server (they all share this machine's cores)."""


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds the live processes ``pids`` have used so far (/proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


class Parties:
    """The processes whose CPU a run reports: repairer, bookies, metadata server."""

    def __init__(self, repairer: list[int], bookies: list[int], store: list[int]) -> None:
        self.groups = {"repairer_cpu": repairer, "bookies_cpu": bookies, "store_cpu": store}

    def sample(self) -> dict[str, float]:
        return {k: cpu_seconds(pids) for k, pids in self.groups.items()}


class _Named:
    """Which ledgers still name a bookie, kept by ZooKeeper data watches: a sample re-reads
    only the ledgers changed since the last one (polling every pending ledger 4 times a second
    loaded ZooKeeper, and so both tools, as much as the repair itself at 2,000 ledgers)."""

    def __init__(
        self, zk: KazooClient | MetadataStore, store: LedgerStore, ids: set[int], bid: str
    ) -> None:
        self.zk, self.store, self.bid = zk, store, bid
        self.pending = set(ids)
        self._changed = set(ids)
        self._lock = threading.Lock()

    def _watch(self, lid: int) -> Callable[[Any], None]:
        def changed(_event: Any) -> None:
            with self._lock:
                self._changed.add(lid)

        return changed

    def sample(self) -> set[int]:
        """Re-read the changed ledgers (arming their watches again); the ledgers still naming
        the bookie."""
        if not isinstance(self.zk, KazooClient):
            return self._sample_all(self.zk)
        with self._lock:
            todo, self._changed = self._changed & self.pending, set()
        futures = {
            lid: self.zk.get_async(self.store.path_for(lid), watch=self._watch(lid)) for lid in todo
        }
        for lid, f in futures.items():
            data, stat = f.get()
            if self.bid not in decode_metadata(data, lid, znode_ctime_ms=stat.ctime).bookies():
                self.pending.discard(lid)
        return self.pending

    def _sample_all(self, meta: MetadataStore) -> set[int]:
        """Oxia: one bulk read of every ledger still naming the bookie."""
        todo = sorted(self.pending)
        for lid, read in zip(
            todo, meta.get_many(self.store.path_for(x) for x in todo), strict=True
        ):
            if read.data is None or read.stat is None:
                raise SystemExit(f"ledger {lid}: unreadable while sampling ({read.error})")
            md = decode_metadata(read.data, lid, znode_ctime_ms=read.stat.ctime_ms)
            if self.bid not in md.bookies():
                self.pending.discard(lid)
        return self.pending


def measure(
    zk: KazooClient | MetadataStore,
    store: LedgerStore,
    victim: harness.JavaBookie,
    parties: Parties,
) -> Times:
    """Kill the victim; the times from its registration's expiry and from the kill."""
    bid = victim.bookie_id
    ids = set(store.list_ledger_ids())
    closed = {lid for lid in ids if store.read_ledger(lid).value.is_closed}
    named = _Named(zk, store, ids, bid)
    named.sample()  # arms every watch before the kill
    t_kill = time.monotonic()
    victim.kill9()
    while zk.exists(f"/ledgers/available/{bid}"):
        time.sleep(SAMPLE)
    t0 = time.monotonic()
    cpu0 = parties.sample()
    urm = UnderReplicationManager(zk)
    out = Times(expiry_after_kill=t0 - t_kill)
    while True:
        t = time.monotonic()
        pending = named.sample()
        if "closed" not in out and not (pending & closed):
            out["closed"], out["closed_from_kill"] = t - t0, t - t_kill
        if not pending and not any(True for _ in urm.list_underreplicated()):
            out["clean"], out["clean_from_kill"] = t - t0, t - t_kill
            out.update({k: v - cpu0[k] for k, v in parties.sample().items()})
            return out
        if t - t0 > 3600:
            raise SystemExit("not replicated within an hour")
        time.sleep(max(0.0, SAMPLE - (time.monotonic() - t)))


def wait(cond: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.25)
    raise SystemExit(f"timed out waiting for {what}")


@contextmanager
def fresh_cluster(
    args: Any, zks: ZooKeeperServer | None, classpath: str, base: Path, name: str
) -> Iterator[Cluster]:
    """A new, empty metadata store for one side: a ZooKeeper chroot or an Oxia server."""
    if args.metadata == "oxia":
        with OxiaServer(base / f"oxia-{name}", shards=3) as server:
            pid = server.proc.pid if server.proc is not None else None
            yield Cluster(classpath, server.locator(), server.uri(), oxia=True, server_pid=pid)
    else:
        assert zks is not None
        pid = zks.proc.pid if zks.proc is not None else None
        with zks.private_chroot(name) as connect:
            uri = harness.metadata_uri(connect)
            yield Cluster(classpath, connect, uri, oxia=False, server_pid=pid)


def _close(zk: KazooClient | MetadataStore) -> None:
    if isinstance(zk, KazooClient):
        zk.stop()
    else:
        zk.close()


def run_java(
    zks: ZooKeeperServer | None, classpath: str, base: Path, client: harness.JavaClient, args: Any
) -> Times:
    """Java AutoRecovery, one per surviving bookie, on a fresh cluster."""
    with fresh_cluster(args, zks, classpath, base, "java") as cl:
        zk, store, bookies = build(cl, base / "a", client, args)
        conf = {
            "lostBookieRecoveryDelay": 0,
            "openLedgerRereplicationGracePeriod": int(args.grace * 1000),
            "rereplicationEntryBatchSize": 100,
            "useV2WireProtocol": "true",
            "auditorPeriodicCheckInterval": 0,
        }
        workers = [
            # The bookies' JVM options (full JIT), not the tests' quick-start ones.
            harness.AutoRecovery(cl.classpath, cl.uri, base / "a" / f"ar{i}", conf, cl.jvm)
            for i in range(args.workers)
        ]
        try:
            for w in workers:
                w.start()
            wait(lambda: cl.auditor_elected(zk), 120, "Auditor")
            time.sleep(3)  # the Auditor reads the bookie list once elected
            parties = Parties(
                [w.proc.pid for w in workers if w.proc is not None],
                [b.proc.pid for b in bookies[1:] if b.proc is not None],
                cl.server_pids,
            )
            return measure(zk, store, bookies[0], parties)
        finally:
            for w in workers:
                w.stop()
            for b in bookies:
                b.stop()
            _close(zk)


def run_watch(
    zks: ZooKeeperServer | None, classpath: str, base: Path, client: harness.JavaClient, args: Any
) -> Times:
    """``bkaudit watch`` on a fresh cluster; its log is kept in ``--watch-log``."""
    with fresh_cluster(args, zks, classpath, base, "watch") as cl:
        zk, store, bookies = build(cl, base / "b", client, args)
        port = free_port()
        argv = [
            sys.executable, "-m", "jobs.cli", "watch", "--zk", cl.locator,
            "--warehouse", str(base / "wh"), "--every", "off",
            "--lost-bookie-recovery-delay", "0s", "--grace-period", f"{args.grace:g}s",
            "--rate", "0", "--ledgers-in-flight", str(args.ledgers_in_flight),
            "--metrics-port", str(port), "--metrics-host", "127.0.0.1",
        ]  # fmt: skip
        log_path = Path(args.watch_log) if args.watch_log else base / "watch.log"
        with open(log_path, "ab") as out:
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
            parties = Parties(
                [proc.pid],
                [b.proc.pid for b in bookies[1:] if b.proc is not None],
                cl.server_pids,
            )
            return measure(zk, store, bookies[0], parties)
        finally:
            terminate(proc, 40)
            for b in bookies:
                b.stop()
            _close(zk)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ledgers", type=int, default=100)
    ap.add_argument("--entries", type=int, default=1000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--grace", type=float, default=0.0, help="open-ledger grace period (s)")
    ap.add_argument("--workers", type=int, default=3, help="Java AutoRecovery processes")
    ap.add_argument("--ledgers-in-flight", type=int, default=8, help="the watch's (its default)")
    ap.add_argument("--watch-log", help="keep the watch's log here")
    ap.add_argument(
        "--only",
        choices=("java", "watch"),
        help="one side only, to iterate on it (a ratio is only taken from both in one run)",
    )
    ap.add_argument(
        "--metadata",
        choices=("zookeeper", "oxia"),
        default="zookeeper",
        help="both clusters on ZooKeeper (BookKeeper's driver) or on Oxia (Pulsar's driver)",
    )
    args = ap.parse_args()
    byte_compile()  # as an installed package is
    mb = args.ledgers * args.entries * args.size / 1e6
    with contextlib.ExitStack() as stack:
        base = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        if args.metadata == "oxia":
            # Pulsar's jars (the BookKeeper it pins, its driver, its Oxia client), and our
            # Java client's classes on them.
            classpath = pulsar.install()
            driver_cp = harness.install().split(":", 1)[0] + ":" + classpath
            client = harness.JavaClient(driver_cp, base, jvm=pulsar.TOOL_JVM)
            zks = None
        else:
            classpath = harness.install()
            zks = stack.enter_context(ZooKeeperServer(base / "zk"))
            client = harness.JavaClient(classpath, base)
        try:
            if args.only != "watch":
                java = run_java(zks, classpath, base, client, args)
                print(
                    f"java AutoRecovery x{args.workers} on {args.metadata}: {mb:.0f} MB, "
                    f"{_show(java)}"
                )
            if args.only != "java":
                watch = run_watch(zks, classpath, base, client, args)
                print(f"bkaudit watch on {args.metadata}: {mb:.0f} MB, {_show(watch)}")
            if args.only is None:
                print(
                    f"ratio (Java / watch), grace {args.grace:g}s: closed ledgers "
                    f"{java['closed'] / watch['closed']:.1f}x, fully replicated "
                    f"{java['clean'] / watch['clean']:.1f}x (from expiry); from the kill "
                    f"{java['closed_from_kill'] / watch['closed_from_kill']:.1f}x and "
                    f"{java['clean_from_kill'] / watch['clean_from_kill']:.1f}x"
                )
        finally:
            client.close()


def _show(t: Times) -> str:
    cpu = t["repairer_cpu"] + t["bookies_cpu"] + t["store_cpu"]
    return (
        f"closed ledgers clean {t['closed']:.2f} s, fully replicated {t['clean']:.2f} s after "
        f"the expiry ({t['closed_from_kill']:.2f} s / {t['clean_from_kill']:.2f} s after the "
        f"kill; the registration expired {t['expiry_after_kill']:.1f} s after it); CPU from "
        f"the expiry to clean: repairer {t['repairer_cpu']:.1f} s, bookies "
        f"{t['bookies_cpu']:.1f} s, metadata server {t['store_cpu']:.1f} s; on 2 cores that "
        f"work needs at least {cpu / 2:.1f} s of wall time"
    )


if __name__ == "__main__":
    main()
