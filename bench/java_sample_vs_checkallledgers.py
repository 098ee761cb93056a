"""Benchmark: Java's Auditor ``checkAllLedgers`` against ``bkaudit audit --check sample``, on
the same all-Java DbLedgerStorage cluster, in one run; then ``--check replicas`` on it.

One ZooKeeper, three Java BookKeeper 4.17 bookies. The Java client writes ``--ledgers``
closed ledgers (E=3 WQ=2 AQ=2, ``--entries`` x 1 KiB each). Then ``--damaged`` more ledgers
are written with some replicas on bookie 2 never stored (what a disk that lost entries
leaves): a third lack bookie 2's first stored entry, a third its last, a third one in the
middle. Their bodies go straight to the Java bookies through bklib's client.

1. ``AutoRecoveryMain`` starts with no ``checkallledgersctime`` znode, so its Auditor runs
   ``checkAllLedgers`` at once (``auditorLedgerVerificationPercentage`` 0, BookKeeper's
   default). Its time is the Auditor's own "Completed checkAllLedgers in N milliSeconds"
   (JVM start-up not included); its findings are the under-replication marks it publishes.
   With three bookies and E=3 the ReplicationWorker has no replacement bookie, so the marks
   stay for comparison. Each round deletes the ``checkallledgersctime`` znode and the marks
   first, so every round's check starts from the same state.
2. ``bkaudit audit --check sample --executor local`` on the same cluster: the wall time of
   the whole command (Python start-up included), and the span Java's figure covers, from the
   metadata scan (which opens the ZooKeeper session) to the last Delta commit, from its log.
   The first round creates the warehouse's tables; later rounds append to them.
   Steps 1 and 2 alternate ``--rounds`` times; medians are reported, and for each round the
   CPU seconds the bookies and each tool's process used.
3. ``bkaudit audit --check replicas --executor local`` (every entry, through the once-per-run
   capability probe and v2 batch reads, since DbLedgerStorage does not list).

Both must flag the same ledgers: the first- and last-entry damage, and not the middle one
(which neither samples at 0%); ``replicas`` must flag all three kinds.

    .venv/bin/python bench/java_sample_vs_checkallledgers.py [--ledgers 200] [--entries 200] \
        [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from kazoo.client import KazooClient

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

from bklib.client.pool import SyncBookieClient  # noqa: E402
from bklib.meta.store import LedgerStore  # noqa: E402
from bklib.quorum import stripe_first_last  # noqa: E402
from bklib.states import Reason  # noqa: E402
from bklib.testing.zkserver import ZooKeeperServer  # noqa: E402
from jobs.tables import delta  # noqa: E402
from jobs.tables.schema import FRAGMENTS  # noqa: E402
from tests.audit_helpers import metadata, write_ledger  # noqa: E402
from tests.cli_helpers import byte_compile  # noqa: E402
from tests.interop import harness  # noqa: E402
from tests.interop.harness import bookies_cpu, children_cpu  # noqa: E402

JVM = ["-Xms256m", "-Xmx256m", "-XX:MaxDirectMemorySize=256m", "-Djava.net.preferIPv4Stack=true"]
MARKS = "/ledgers/underreplication/ledgers"
CTIME = "/ledgers/underreplication/checkallledgersctime"


@dataclass
class Timing:
    """One side of one round: the span comparable across tools, the process's wall time, and
    the CPU the bookies and the tool's process used meanwhile."""

    span: float
    wall: float
    bookies_cpu: float
    tool_cpu: float
    phases: str = ""


def java_round(
    zk: KazooClient, recovery: harness.AutoRecovery, bookies: list[harness.JavaBookie]
) -> Timing:
    """Start AutoRecoveryMain with no ``checkallledgersctime`` znode and no marks, so that its
    Auditor runs ``checkAllLedgers`` at once from a clean slate; stop it once it logs the
    check's time."""
    if zk.exists(CTIME):
        zk.delete(CTIME)
    if zk.exists(MARKS):
        zk.delete(MARKS, recursive=True)
    zk.ensure_path(MARKS)
    offset = recovery.log_path.stat().st_size if recovery.log_path.exists() else 0
    t, c_bk, c_tool = time.perf_counter(), bookies_cpu(bookies), children_cpu()
    recovery.start()
    done = None
    try:
        while done is None and time.perf_counter() - t < 1800:
            time.sleep(0.1)
            with open(recovery.log_path, "rb") as f:
                f.seek(offset)
                text = f.read().decode(errors="replace")
            done = re.search(r"Completed checkAllLedgers in (\d+) milliSeconds", text)
        if done is None:
            raise SystemExit(f"checkAllLedgers did not finish:\n{recovery.log_tail()}")
        wall, bk = time.perf_counter() - t, bookies_cpu(bookies) - c_bk
    finally:
        recovery.stop()
    return Timing(int(done.group(1)) / 1000, wall, bk, children_cpu() - c_tool)


def sample_round(connect: str, wh: Path, log: Path, bookies: list[harness.JavaBookie]) -> Timing:
    """``bkaudit audit --check sample`` once, with its phases from its log."""
    c_bk, c_tool = bookies_cpu(bookies), children_cpu()
    wall = audit(connect, wh, "sample", log)
    phases = re.findall(r"INFO jobs\.audit: (\w+): .*?; ([\d.]+)s$", log.read_text(), re.M)
    return Timing(
        engine_seconds(log),
        wall,
        bookies_cpu(bookies) - c_bk,
        children_cpu() - c_tool,
        ", ".join(f"{name} {secs} s" for name, secs in phases),
    )


def marked_ledgers(zk: KazooClient) -> set[int]:
    """Ledger ids under BookKeeper's under-replication marks (urL<id> leaves, 4 levels)."""
    out: set[int] = set()

    def walk(path: str) -> None:
        for child in zk.get_children(path):
            if child.startswith("urL"):
                out.add(int(child[3:]))
            else:
                walk(f"{path}/{child}")

    if zk.exists(MARKS):
        walk(MARKS)
    return out


def engine_seconds(log: Path) -> float:
    """The audit's own span, scan to last commit (its log line), start-up excluded."""
    m = re.search(r"audit \w+ \w+: ([\d.]+)s from the metadata scan", log.read_text())
    if m is None:
        raise SystemExit(f"no engine timing in {log}")
    return float(m.group(1))


def audit(connect: str, wh: Path, check: str, log: Path) -> float:
    t = time.perf_counter()
    res = subprocess.run(
        [sys.executable, "-m", "jobs.cli", "audit", "--zk", connect, "--warehouse", str(wh),
         "--check", check, "--executor", "local"],
        capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    elapsed = time.perf_counter() - t
    log.write_text(res.stdout + res.stderr)
    if res.returncode != 0:
        raise SystemExit(f"bkaudit audit --check {check} failed, see {log}")
    return elapsed


def flagged(wh: Path) -> set[int]:
    run = delta.latest_run(str(wh))
    assert run is not None
    return {
        int(r["ledger_id"])
        for r in delta.read_rows(str(wh), FRAGMENTS)
        if r["run_id"] == run["run_id"] and r["reason"] == Reason.ENTRIES_MISSING
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ledgers", type=int, default=200)
    ap.add_argument("--entries", type=int, default=200)
    ap.add_argument("--damaged", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=3, help="alternating Java/bkaudit rounds")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    byte_compile()  # as an installed package is
    classpath = harness.install()
    with tempfile.TemporaryDirectory() as tmp, ZooKeeperServer(Path(tmp) / "zk") as zks:
        base = Path(tmp)
        client = harness.JavaClient(classpath, base)
        with zks.private_chroot("bench") as connect:
            zk = KazooClient(hosts=connect)
            zk.start()
            store = LedgerStore(zk)
            store.init_cluster()
            uri = harness.metadata_uri(connect)
            bookies = [
                harness.JavaBookie(classpath, uri, base / f"java{i}", jvm=JVM) for i in range(3)
            ]
            recovery: harness.AutoRecovery | None = None
            rounds: list[tuple[Timing, Timing]] = []
            mismatched: list[int] = []
            try:
                harness.start_bookies(bookies, zk)
                ids = [b.bookie_id for b in bookies]
                t = time.perf_counter()
                for _ in range(args.ledgers):
                    client.write(uri, [b"x" * 1024] * args.entries, bookies=ids, pipelined=True)
                print(f"wrote {args.ledgers} ledgers with the Java client in "
                      f"{time.perf_counter() - t:.1f} s")  # fmt: skip
                # Damaged ledgers: bookie 2 (index 2) never stored one of its entries.
                expected: dict[str, set[int]] = {"first": set(), "last": set(), "middle": set()}
                with SyncBookieClient(connect) as bk:
                    for n in range(args.damaged):
                        kind = ("first", "last", "middle")[n % 3]
                        last = args.entries - 1
                        lo, hi = stripe_first_last(2, 0, last, 3, 2) or (0, 0)
                        gone = {"first": lo, "last": hi, "middle": lo + 3 * (last // 6) + 1}[kind]
                        md = metadata(store.generate_ledger_id(), [(0, ids)], last=last)
                        write_ledger(store, bk, md, args.entries, skip=[(gone, ids[2])])
                        expected[kind].add(md.ledger_id)

                recovery = harness.AutoRecovery(
                    classpath, uri, base / "autorecovery",
                    extra={"auditorPeriodicCheckInterval": 86400,
                           "auditorPeriodicBookieCheckInterval": 86400,
                           "auditorLedgerVerificationPercentage": 0},
                )  # fmt: skip
                recovery.dir.mkdir(parents=True, exist_ok=True)
                for n in range(args.rounds):
                    java = java_round(zk, recovery, bookies)
                    java_found = marked_ledgers(zk)
                    # Round 0 creates the warehouse; later rounds append to it, as an
                    # operator's next audit would.
                    ours = sample_round(
                        connect, base / "wh-sample", base / f"sample{n}.log", bookies
                    )
                    ours_found = flagged(base / "wh-sample")
                    rounds.append((java, ours))
                    if java_found != ours_found:
                        mismatched.append(n)
                    print(f"round {n}: same findings {java_found == ours_found}; "
                          f"Java {java.span:.2f} s (its log; JVM {java.wall:.1f} s, "
                          f"bookies {java.bookies_cpu:.1f} CPU-s, JVM {java.tool_cpu:.1f} "
                          f"CPU-s); bkaudit {ours.span:.2f} s scan to last commit ({ours.phases}"
                          f"; command {ours.wall:.2f} s, bookies {ours.bookies_cpu:.1f} CPU-s, "
                          f"bkaudit {ours.tool_cpu:.1f} CPU-s); {java.span / ours.span:.2f}x",
                          flush=True)  # fmt: skip
                recovery = None
                replicas_s = audit(connect, base / "wh-replicas", "replicas", base / "rep.log")
                replicas_found = flagged(base / "wh-replicas")
            finally:
                if recovery is not None:
                    recovery.stop()
                for b in bookies:
                    b.stop()
                zk.stop()
                client.close()
        total = args.ledgers + args.damaged
        java_s = statistics.median(j.span for j, _ in rounds)
        java_wall = statistics.median(j.wall for j, _ in rounds)
        ours_s = statistics.median(o.wall for _, o in rounds)
        ours_span = statistics.median(o.span for _, o in rounds)
        print(f"{total} ledgers, {args.damaged} damaged on one bookie "
              f"(first/last/middle: {len(expected['first'])}/{len(expected['last'])}/"
              f"{len(expected['middle'])}); load {os.getloadavg()[0]:.1f}; medians of "
              f"{len(rounds)} alternating rounds")  # fmt: skip
        print(f"Java Auditor checkAllLedgers: {java_s:.2f} s (its log; {java_wall:.1f} s from "
              f"JVM start), flagged {len(java_found)}")  # fmt: skip
        print(
            f"bkaudit audit --check sample: {ours_s:.2f} s wall, flagged {len(ours_found)}; "
            f"{java_s / ours_s:.2f}x Java's speed ({java_wall / ours_s:.2f}x from JVM start)"
        )
        print(
            f"  of which scan to last commit (start-up excluded, as Java's log): "
            f"{ours_span:.2f} s; {java_s / ours_span:.2f}x Java's checkAllLedgers"
        )
        print(f"bkaudit audit --check replicas: {replicas_s:.1f} s wall, flagged "
              f"{len(replicas_found)}")  # fmt: skip
        want = expected["first"] | expected["last"]
        same = not mismatched
        print(f"same findings as Java in every round: {same}; "
              f"sample flags exactly first+last damage: "
              f"{ours_found == want}; replicas flags all damage: "
              f"{replicas_found == want | expected['middle']}")  # fmt: skip
        if not same:
            print(f"  rounds that differ: {mismatched}; in the last round, only Java: "
                  f"{sorted(java_found - ours_found)}; "
                  f"only bkaudit: {sorted(ours_found - java_found)}")  # fmt: skip


if __name__ == "__main__":
    main()
