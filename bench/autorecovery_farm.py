"""Benchmark: Java AutoRecovery (Auditor + ReplicationWorker) beside ``bkaudit watch`` on the
scale farm (docs/scale.md), at production size.

One ZooKeeper (3 GB heap). For each side in turn, a bookie farm of ``--bookies`` identities
over a plan of ``--ledgers`` ledgers in a fresh chroot, seeded once (every side starts from the
same planned cluster: identities are drawn by index, so the same identity names the same
ledgers). Then one repairer:

- ``watch``: ``bkaudit watch --lost-bookie-recovery-delay 0s --grace-period 0s --rate 0``
  (tests/interop/autorecovery_tools.Watch), once it leads and its bookie index is built;
- ``java``: three ``AutoRecoveryMain`` JVMs (an Auditor elected among them and a
  ReplicationWorker each) with bench/time_to_replicated.py's settings: lostBookieRecoveryDelay
  0, openLedgerRereplicationGracePeriod 0, rereplicationEntryBatchSize 100, the v2 protocol,
  no periodic checkAllLedgers, the bookies' JVM options (256 MB heap, full JIT); once the
  Auditor has audited the bookies at its election.

The middle identity is stopped (its session closes: the registration goes at once). From
that moment, every 0.25 s, the ledgers that named it are re-read where a ZooKeeper data watch
says they changed (bench/time_to_replicated.py's sampler), giving:

- the time to the first repaired ledger (no longer naming the lost identity);
- the time to fully replicated: no ledger names it and no under-replication mark is left;
- ledgers per minute, from the loss and from the first repaired ledger;
- the CPU seconds of the repairer's processes (the JVMs; the watch and its children), of the
  farm and of ZooKeeper (psutil), and the repairer's per repaired ledger. All of them share
  this machine's cores, so their sum over the cores is the least wall time the work can take
  here (the shared-core floor).

A side that is not done within ``--java-budget`` seconds (the watch gets the same) is stopped;
its rate from the first repaired ledger gives the extrapolated time, reported as such.

Before the first side's loss, on its healthy farm, ``--check-rounds`` alternating rounds time
Java's Auditor ``checkAllLedgers`` (one AutoRecoveryMain started with no
``checkallledgersctime`` znode, ``auditorLedgerVerificationPercentage`` 0; its own "Completed
checkAllLedgers" time) against ``bkaudit audit --check sample --executor local`` (scan to last
commit, and the whole command), as bench/java_sample_vs_checkallledgers.py does on Java
bookies, with the farm's CPU meanwhile.

Java's repair also reports the open ledgers its ReplicationWorkers recovered (each attempt
on one ends "failed while replicating fragments" and the worker waits rwRereplicateBackoffMs,
5 s by default, before its next ledger) and the fragments it copied, from their logs;
``--java-set KEY=VALUE`` overrides one of its settings (e.g. ``rwRereplicateBackoffMs=500``).

Results are JSON lines on stdout (appended to ``--json``), then a summary; ``--project-to``
adds each side's figures scaled to that many ledgers at the measured rates (projections).

    .venv/bin/python bench/autorecovery_farm.py [--ledgers 100000] [--bookies 100] \\
        [--java-budget 3600] [--check-rounds 1] [--only java|watch] [--java-set KEY=VALUE] \\
        [--java-heap 256m] [--json FILE] [--dir DIR] [--project-to 1000000]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
from kazoo.client import KazooClient

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

from bench.java_sample_vs_checkallledgers import (  # noqa: E402
    engine_seconds,
    java_round,
    marked_ledgers,
)
from bench.time_to_replicated import JVM, _Named, wait  # noqa: E402
from bench.warehouse_history import append_json  # noqa: E402
from bklib.meta.store import LedgerStore  # noqa: E402
from bklib.meta.underreplication import UnderReplicationManager  # noqa: E402
from bklib.states import DEFAULT_LEDGERS_ROOT  # noqa: E402
from bklib.testing.scale.farm import FarmClient  # noqa: E402
from bklib.testing.scale.harness import running_farm  # noqa: E402
from bklib.testing.scale.seeder import seed_ledgers  # noqa: E402
from bklib.testing.zkclient import connect  # noqa: E402
from bklib.testing.zkserver import ZooKeeperServer  # noqa: E402
from jobs.tables import delta  # noqa: E402
from tests.cli_helpers import byte_compile  # noqa: E402
from tests.interop import harness  # noqa: E402
from tests.interop.autorecovery_tools import JAVA_COPY, JAVA_RECOVERY, Watch  # noqa: E402
from tests.interop.harness import children_cpu  # noqa: E402

SAMPLE = 0.25
SIDES = ("watch", "java")
JAVA_CONF: dict[str, object] = {
    # bench/time_to_replicated.py's AutoRecovery, as Pulsar runs it.
    "lostBookieRecoveryDelay": 0,
    "openLedgerRereplicationGracePeriod": 0,
    "rereplicationEntryBatchSize": 100,
    "useV2WireProtocol": "true",
    "auditorPeriodicCheckInterval": 0,
}
AUDITOR_CONF: dict[str, object] = {
    # checkAllLedgers at start (no ctime znode), nothing periodic after, first and last
    # entry of each fragment only: what `audit --check sample` reads too.
    "auditorPeriodicCheckInterval": 86400,
    "auditorPeriodicBookieCheckInterval": 86400,
    "auditorLedgerVerificationPercentage": 0,
}
AUDITED = re.compile(r"Completed auditBookies")
"""``AuditorBookieCheckTask``: the Auditor has read every ledger's ensembles once."""


def emit(row: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """Print one result as a JSON line now and keep it for ``--json``."""
    rows.append(row)
    print(json.dumps(row), flush=True)


class CpuGroups:
    """CPU seconds (user + system) of named groups of process trees, from psutil. A process
    seen once keeps its last reading after it exits, so a child that ends between two samples
    loses at most one sample's CPU; one never seen is not counted, so the repair samples on
    every pass."""

    def __init__(self, groups: dict[str, list[int]]) -> None:
        self.groups = {k: [psutil.Process(p) for p in pids] for k, pids in groups.items()}
        self.seen: dict[str, dict[int, float]] = {k: {} for k in groups}

    def sample(self) -> dict[str, float]:
        """Totals so far, per group."""
        for name, roots in self.groups.items():
            for root in roots:
                with contextlib.suppress(psutil.Error):
                    for p in [root, *root.children(recursive=True)]:
                        with contextlib.suppress(psutil.Error):
                            t = p.cpu_times()
                            self.seen[name][p.pid] = t.user + t.system
        return {k: sum(v.values()) for k, v in self.seen.items()}


@dataclass
class Repair:
    """One side's repair of the lost identity's ledgers."""

    side: str
    ledgers: int
    bookies: int
    naming: int
    """Ledgers whose metadata named the lost identity."""
    repaired: int
    first_s: float | None
    clean_s: float | None
    """From the registration's removal to fully replicated; None when out of budget."""
    finished: bool
    budget_s: float
    per_min_from_loss: float
    per_min_from_first: float
    extrapolated_clean_s: float | None = None
    """When not finished: the first repaired ledger's time plus every ledger at the rate
    measured since it (an extrapolation)."""
    cpu_s: dict[str, float] = field(default_factory=dict)
    """From the loss to the end: ``repairer``, ``farm``, ``zookeeper``."""
    repairer_cpu_ms_per_ledger: float = 0.0
    all_cpu_ms_per_ledger: float = 0.0
    floor_s: float = 0.0
    """All the CPU above over this machine's cores: the least wall time it can take here."""
    cores: int = 0
    load_1m: float = 0.0
    detail: dict[str, object] = field(default_factory=dict)
    """Java: the open ledgers its ReplicationWorkers recovered (each followed by the
    worker's rwRereplicateBackoffMs) and the settings overridden."""


def measure_repair(
    side: str,
    zk: KazooClient,
    farm: FarmClient,
    cpu: CpuGroups,
    budget: float,
) -> Repair:
    """Stop the middle identity and follow its ledgers until none names it and no mark is
    left, or the budget runs out."""
    victim = farm.bookies[len(farm.bookies) // 2]
    naming = {lid for lid, _ in farm.plan.segments_naming(victim)}
    store = LedgerStore(zk)
    named = _Named(zk, store, naming, victim)
    named.sample()  # arms every watch before the loss
    farm.stop(victim)
    while zk.exists(f"{DEFAULT_LEDGERS_ROOT}/available/{victim}"):
        time.sleep(0.05)
    t0 = time.monotonic()
    cpu0 = cpu.sample()
    urm = UnderReplicationManager(zk)
    first: float | None = None
    clean: float | None = None
    shown = 0.0
    while True:
        t = time.monotonic()
        cpu.sample()  # each pass: a child that lives between two (a repair worker) is counted
        pending = named.sample()
        repaired = len(naming) - len(pending)
        if first is None and repaired:
            first = t - t0
        if not pending and not any(True for _ in urm.list_underreplicated()):
            clean = t - t0
            break
        if t - t0 > budget:
            break
        if t - t0 - shown >= 30:
            shown = t - t0
            print(f"  {side}: {shown:.0f} s, {repaired}/{len(naming)} repaired",
                  file=sys.stderr, flush=True)  # fmt: skip
        time.sleep(max(0.0, SAMPLE - (time.monotonic() - t)))
    end = time.monotonic() - t0
    used = {k: round(v - cpu0[k], 2) for k, v in cpu.sample().items()}
    cores = os.cpu_count() or 1
    since_first = end - first if first is not None else 0.0
    rate_first = repaired / since_first * 60 if since_first > 0 else 0.0
    out = Repair(
        side, farm.plan.ledgers, len(farm.bookies), len(naming),
        repaired, _r(first), _r(clean), clean is not None, budget,
        round(repaired / end * 60, 1), round(rate_first, 1), cpu_s=used, cores=cores,
        load_1m=round(os.getloadavg()[0], 2),
    )  # fmt: skip
    if clean is None and first is not None and rate_first > 0:
        out.extrapolated_clean_s = round(first + len(naming) / rate_first * 60, 1)
    if repaired:
        out.repairer_cpu_ms_per_ledger = round(used["repairer"] / repaired * 1000, 1)
        out.all_cpu_ms_per_ledger = round(sum(used.values()) / repaired * 1000, 1)
    out.floor_s = round(sum(used.values()) / cores, 1)
    return out


@contextlib.contextmanager
def session(hosts: str) -> Iterator[KazooClient]:
    """A kazoo session on ``hosts``, closed on exit."""
    zk = connect(hosts)
    try:
        yield zk
    finally:
        zk.stop()
        zk.close()


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


@contextlib.contextmanager
def seeded_farm(
    zks: ZooKeeperServer,
    base: Path,
    side: str,
    args: argparse.Namespace,
    rows: list[dict[str, Any]],
) -> Iterator[tuple[str, FarmClient, int]]:
    """A farm in a chroot of its own, seeded; (connect string, client, farm pid). The chroot
    is left behind (deleting 100,000 znodes one by one would take longer than the run)."""
    hosts = f"{zks.connect_string}/ar-{side}"
    with session(zks.connect_string) as kz:
        kz.ensure_path(f"/ar-{side}")
    t0 = time.monotonic()
    with running_farm(
        hosts, base / f"farm-{side}", bookies=args.bookies, ledgers=args.ledgers,
        start_timeout=600,
    ) as (farm, proc):  # fmt: skip
        up = time.monotonic() - t0
        report = seed_ledgers(hosts, farm.plan)
        emit({"kind": "farm", "side": side, "ledgers": args.ledgers, "bookies": args.bookies,
              "farm_up_s": round(up, 1), "seed_s": round(report.seconds, 1),
              "seeded": report.created}, rows)  # fmt: skip
        yield hosts, farm, proc.pid


@dataclass
class SampleRun:
    """One ``audit --check sample``: its span (scan to last commit, as Java's log line), the
    whole command, its CPU (helper processes included) and its run's status."""

    span: float | None
    wall: float
    cpu: float
    status: str


def sample_round(hosts: str, wh: Path, log: Path) -> SampleRun:
    """``bkaudit audit --check sample --executor local`` once, with bench/scale.py's
    timeouts; its log in ``log``. A run that does not complete is reported, not fatal."""
    argv = [sys.executable, "-m", "jobs.cli", "audit", "--zk", hosts, "--warehouse", str(wh),
            "--check", "sample", "--executor", "local", "--read-timeout", "5",
            "--connect-timeout", "5"]  # fmt: skip
    c0, t0 = children_cpu(), time.monotonic()
    res = subprocess.run(argv, capture_output=True, text=True, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, check=False)  # fmt: skip
    wall = time.monotonic() - t0
    log.write_text(res.stdout + res.stderr)
    run = delta.latest_run(str(wh)) or {}
    try:
        span: float | None = engine_seconds(log)
    except SystemExit:
        span = None
    return SampleRun(span, wall, children_cpu() - c0, str(run.get("status", res.returncode)))


def java_options(heap: str) -> list[str]:
    """The JVMs' options: the bookies' (bench/time_to_replicated.py), with the heap's ceiling
    ``heap`` (256 MB there; the Auditor reads every ledger's metadata into it)."""
    return [f"-Xmx{heap}" if o.startswith("-Xmx") else o for o in JVM]


def compare_checks(
    hosts: str,
    base: Path,
    classpath: str,
    cpu: CpuGroups,
    rounds: int,
    rows: list[dict[str, Any]],
    jvm: list[str],
) -> None:
    """Java's checkAllLedgers against ``audit --check sample``, alternating, on a healthy farm
    (both should find nothing)."""
    recovery = harness.AutoRecovery(
        classpath, harness.metadata_uri(hosts), base / "auditor", AUDITOR_CONF, jvm
    )
    recovery.dir.mkdir(parents=True, exist_ok=True)
    with session(hosts) as zk, contextlib.ExitStack() as stop:
        stop.callback(recovery.stop)
        for n in range(rounds):
            before = cpu.sample()
            java = java_round(zk, recovery, [])
            mid = cpu.sample()
            ours = sample_round(hosts, base / "wh-sample", base / f"sample{n}.log")
            after = cpu.sample()
            emit({"kind": "checks", "round": n,
                  "java_checkallledgers_s": round(java.span, 2), "java_from_jvm_start_s":
                  round(java.wall, 2), "java_cpu_s": round(java.tool_cpu, 2),
                  "java_farm_cpu_s": round(mid["farm"] - before["farm"], 2),
                  "java_marked": len(marked_ledgers(zk)),
                  "sample_span_s": _r(ours.span), "sample_wall_s": round(ours.wall, 2),
                  "sample_cpu_s": round(ours.cpu, 2), "sample_status": ours.status,
                  "sample_farm_cpu_s": round(after["farm"] - mid["farm"], 2),
                  "ratio_span": _r(java.span / ours.span if ours.span else None),
                  "ratio_wall": round(java.wall / ours.wall, 2),
                  "load_1m": round(os.getloadavg()[0], 2)}, rows)  # fmt: skip


def metric(port: int, name: str) -> float | None:
    """One sample of the watch's /metrics, or None when absent or not answering."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            page = r.read().decode()
    except OSError:
        return None
    m = re.search(rf"^{re.escape(name)} (\S+)$", page, re.M)
    return float(m.group(1)) if m else None


def run_watch(hosts: str, farm: FarmClient, base: Path, cpu: CpuGroups, budget: float) -> Repair:
    """The watch: leading, its index built, then the loss."""
    watch = Watch(hosts, str(base / "wh-watch"), base / "watch.log")
    try:
        wait(watch.leading, 600, "the watch to lead")
        wait(lambda: metric(watch.port, "bkaudit_index_stale") in (0.0, None), 600,
             "the watch's bookie index")  # fmt: skip
        time.sleep(2)  # the take-over's commits
        cpu.groups["repairer"] = [psutil.Process(watch.proc.pid)]
        with session(hosts) as zk:
            return measure_repair("watch", zk, farm, cpu, budget)
    finally:
        watch.stop()


def run_java(
    hosts: str,
    farm: FarmClient,
    base: Path,
    classpath: str,
    cpu: CpuGroups,
    budget: float,
    conf: dict[str, object],
    jvm: list[str],
) -> Repair:
    """Three AutoRecoveryMain: an Auditor elected, its bookie audit done, then the loss."""
    uri = harness.metadata_uri(hosts)
    with session(hosts) as zk:
        urm = UnderReplicationManager(zk)
        urm.ensure_layout()
        urm.set_lost_bookie_recovery_delay(0)
        workers = [harness.AutoRecovery(classpath, uri, base / f"ar{i}", conf, jvm)
                   for i in range(3)]  # fmt: skip
        try:
            for w in workers:
                w.start()
            wait(lambda: any(AUDITED.search(w.log_path.read_text(errors="replace"))
                             for w in workers if w.log_path.exists()), 900,
                 "the Auditor's bookie audit")  # fmt: skip
            cpu.groups["repairer"] = [psutil.Process(w.proc.pid) for w in workers if w.proc]
            rep = measure_repair("java", zk, farm, cpu, budget)
            logs = [w.log_path.read_text(errors="replace") for w in workers]
            rep.detail["recoveries"] = sum(len(JAVA_RECOVERY.findall(text)) for text in logs)
            rep.detail["fragments_copied"] = sum(len(JAVA_COPY.findall(text)) for text in logs)
            rep.detail["conf"] = {
                k: conf[k] for k in conf if k not in JAVA_CONF or conf[k] != JAVA_CONF[k]
            }
            return rep
        finally:
            for w in workers:
                w.stop()


def summarize(rows: list[dict[str, Any]], project_to: int | None) -> None:
    """The human summary, and the ratios (as JSON lines too)."""
    reps = {r["side"]: r for r in rows if r["kind"] == "repair"}
    for side, r in reps.items():
        done = (f"fully replicated {r['clean_s']:.1f} s" if r["finished"] else
                f"NOT finished in {r['budget_s']:.0f} s ({r['repaired']}/{r['naming']}); "
                f"extrapolated {r['extrapolated_clean_s']} s at its rate")  # fmt: skip
        cpu = r["cpu_s"]
        print(f"{side}: {r['naming']} ledgers named the lost identity of {r['bookies']} "
              f"({r['ledgers']} ledgers); first repaired {r['first_s']} s, {done}; "
              f"{r['per_min_from_loss']:.0f} ledgers/min from the loss "
              f"({r['per_min_from_first']:.0f} from the first); CPU: repairer "
              f"{cpu['repairer']:.1f} s ({r['repairer_cpu_ms_per_ledger']} ms a ledger), farm "
              f"{cpu['farm']:.1f} s, ZooKeeper {cpu['zookeeper']:.1f} s "
              f"({r['all_cpu_ms_per_ledger']} ms a ledger in all); on {r['cores']} cores at "
              f"least {r['floor_s']:.1f} s; load {r['load_1m']}; {r['detail']}")  # fmt: skip
    if {"java", "watch"} <= reps.keys():
        j, w = reps["java"], reps["watch"]
        jt = j["clean_s"] if j["finished"] else j["extrapolated_clean_s"]
        if jt and w["clean_s"]:
            print(f"time to fully replicated, Java / watch: {jt / w['clean_s']:.1f}x"
                  + ("" if j["finished"] else " (Java's extrapolated)"))  # fmt: skip
        if w["repairer_cpu_ms_per_ledger"]:
            print(
                f"repairer CPU a ledger, Java / watch: "
                f"{j['repairer_cpu_ms_per_ledger'] / w['repairer_cpu_ms_per_ledger']:.1f}x; "
                f"all processes: {j['all_cpu_ms_per_ledger'] / w['all_cpu_ms_per_ledger']:.1f}x"
            )
    checks = [r for r in rows if r["kind"] == "checks"]
    for c in checks:
        print(
            f"checkAllLedgers {c['java_checkallledgers_s']} s (its log; "
            f"{c['java_from_jvm_start_s']} s from JVM start; {c['java_marked']} marked) against "
            f"audit --check sample {c['sample_span_s']} s scan to last commit "
            f"({c['sample_wall_s']} s command, {c['sample_status']}): {c['ratio_span']}x "
            f"({c['ratio_wall']}x); CPU: Java {c['java_cpu_s']} s + farm "
            f"{c['java_farm_cpu_s']} s, bkaudit {c['sample_cpu_s']} s + farm "
            f"{c['sample_farm_cpu_s']} s"
        )
    if project_to:
        for side, r in reps.items():
            k = project_to / r["ledgers"]
            rate = r["per_min_from_first"]
            if not rate or r["first_s"] is None:
                continue
            # Reaction scales with the ledgers read (Java's Auditor reads them all), the copy
            # with the ledgers naming the lost identity, at the measured rate.
            t = r["first_s"] * k + r["naming"] * k / rate * 60
            print(f"{side} at {project_to} ledgers (PROJECTION from these rates): about "
                  f"{r['naming'] * k:.0f} ledgers to repair, {t / 60:.0f} min to fully "
                  f"replicated")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ledgers", type=int, default=100_000)
    ap.add_argument("--bookies", type=int, default=100)
    ap.add_argument("--java-budget", type=float, default=3600.0,
                    help="seconds a side may take after the loss before it is stopped")  # fmt: skip
    ap.add_argument("--check-rounds", type=int, default=1,
                    help="checkAllLedgers / sample rounds on the first farm (0: none)")  # fmt: skip
    ap.add_argument("--only", choices=SIDES, help="one side only")
    ap.add_argument(
        "--java-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an AutoRecoveryMain setting, e.g. rwRereplicateBackoffMs=500",
    )
    ap.add_argument("--java-heap", default="256m",
                    help="the JVMs' -Xmx (256m: the bookies'; the Auditor's checkAllLedgers "
                         "ran out of it at a million ledgers)")  # fmt: skip
    ap.add_argument("--json", help="append the results to this file")
    ap.add_argument("--dir", help="keep farms, logs and warehouses here (default: temporary)")
    ap.add_argument("--project-to", type=int, help="also project each side to this many ledgers")
    args = ap.parse_args()
    jvm = java_options(args.java_heap)
    java_conf = {**JAVA_CONF, **dict(kv.split("=", 1) for kv in args.java_set)}
    byte_compile()  # as an installed package is
    classpath = harness.install()
    rows: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        if args.dir:
            base = Path(args.dir)
        else:
            base = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bkaudit-ar-")))
        base.mkdir(parents=True, exist_ok=True)
        zks = stack.enter_context(ZooKeeperServer(base / "zk", heap="3g"))
        assert zks.proc is not None
        sides = [args.only] if args.only else list(SIDES)
        for n, side in enumerate(sides):
            with seeded_farm(zks, base, side, args, rows) as (hosts, farm, farm_pid):
                cpu = CpuGroups({"repairer": [], "farm": [farm_pid], "zookeeper": [zks.proc.pid]})
                (base / side).mkdir(parents=True, exist_ok=True)  # its logs, with no checks too
                if n == 0 and args.check_rounds:
                    compare_checks(hosts, base / side, classpath, cpu, args.check_rounds, rows, jvm)
                if side == "watch":
                    rep = run_watch(hosts, farm, base / side, cpu, args.java_budget)
                else:
                    rep = run_java(
                        hosts, farm, base / side, classpath, cpu, args.java_budget, java_conf, jvm
                    )
                emit({"kind": "repair", **asdict(rep)}, rows)
    append_json(args.json, rows)
    summarize(rows, args.project_to)


if __name__ == "__main__":
    main()
