"""Benchmark: bkaudit at production size, on the scale harness (docs/scale.md).

A ZooKeeper server (2 GB heap), a bookie farm of ``--bookies`` identities and ``--ledgers``
planned ledgers seeded through pipelined creates. Then, as separate processes, each measured for
wall time, CPU (user + system, every process of its tree: the Spark driver JVM and its Python
workers included), peak RSS of each process, and the requests ZooKeeper received (``mntr``):

- ``audit --check C`` for each check of ``--checks`` (default ``lost``) with each executor of
  ``--executors``;
- with ``--repair``, for each executor of ``--repair-executors`` (default local): another
  identity stopped, then ``audit --check lost`` and ``rereplicate`` on that executor (each
  executor repairs a different identity's ledgers, about the same number), and again for each
  ``--repair-in-flight`` value (``rereplicate --ledgers-in-flight``), another identity each time;
- ``listunderreplicated`` on the warehouse (exit 1: it lists findings);
- the commands of ``--commands`` on the warehouse of the first repair (else of the first lost
  audit): ``whatif --bookie`` (one live identity, the audit's missing replicas counted as
  gone), ``blastradius`` with each executor of ``--executors``, and ``report``;
- with ``--zk-rates``, the local lost audit again under each ``--zk-rate``.

``--compare-with DIR`` is an A/B of two commits on one seeded farm: every audit and repair
above runs from this checkout and from DIR (another checkout, e.g. a ``git worktree`` of the
commit before a change, run with this virtualenv), alternating which goes first, so that
whatever else loads the machine loads both; each side's repair loses an identity of its own.
``--repeat N`` runs each audit N times a side. The names of DIR's measurements end in
`` [DIR's name]``.

A latency probe reads one znode every 10 ms on its own session through every command and
reports p50, p99 and the maximum: what a broker would see meanwhile.

    .venv/bin/python bench/scale.py --ledgers 100000 [--bookies 100] [--executors local,spark]
        [--checks lost,sample] [--repair [--repair-executors local,spark] [--repair-in-flight 8,16]]
        [--zk-rates 0,20000,10000] [--commands whatif,blastradius,report] [--json FILE]
        [--keep-warehouse DIR] [--logs DIR] [--compare-with DIR [--repeat N]]

``--keep-warehouse`` copies the first repair's warehouse (two audit runs and a repair run) to
DIR before the cluster goes: ``bench/warehouse_history.py`` grows it to 30 runs.

Figures go to docs/benchmarks.md with the command that produced them.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

from bklib.audit.checks import replication_names  # noqa: E402
from bklib.states import DEFAULT_LEDGERS_ROOT, Check, CountKey  # noqa: E402
from bklib.testing.scale.farm import FarmClient  # noqa: E402
from bklib.testing.scale.harness import running_farm  # noqa: E402
from bklib.testing.scale.probe import LatencyProbe  # noqa: E402
from bklib.testing.scale.seeder import seed_ledgers  # noqa: E402
from bklib.testing.zkclient import connect  # noqa: E402
from bklib.testing.zkserver import ZooKeeperServer, four_letter_word  # noqa: E402
from jobs.tables import delta  # noqa: E402
from jobs.tables.schema import ACTIONS  # noqa: E402


@dataclass
class Measured:
    """One measured command."""

    name: str
    wall_s: float
    cpu_s: float
    peak_rss_mb: dict[str, float]
    """The largest process of each kind (``python``, ``jvm``)."""
    zk_requests: int
    exit_code: int
    probe: dict[str, float] = field(default_factory=dict)
    """What another ZooKeeper client saw meanwhile (bklib/testing/scale/probe.py)."""
    entries_read: int = 0
    """Entries the farm served meanwhile: the command's reads (CPU per read = cpu_s / this)."""
    peers_cpu_s: dict[str, float] = field(default_factory=dict)
    """CPU the cluster's own processes (the farm, ZooKeeper) spent meanwhile, on the same
    two cores: the floor they set under the command's wall time."""
    detail: dict[str, object] = field(default_factory=dict)
    peak_rss_total_mb: float = 0.0
    """The command's whole process tree at its largest (a run with a helper process, or Spark's
    driver and workers, is several processes at once)."""


class TreeSampler(threading.Thread):
    """Samples a process and its descendants every 0.2 s: the last CPU times and the peak RSS
    of each, and the peak of their sum (a process that lives less than a sample is missed)."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.root = psutil.Process(pid)
        self.cpu: dict[int, float] = {}
        self.rss: dict[int, tuple[str, float]] = {}
        self.total_peak = 0.0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            total = 0.0
            for p in procs:
                try:
                    t = p.cpu_times()
                    mem = p.memory_info().rss / 2**20
                    name = p.name()
                except psutil.Error:
                    continue
                # Each process's own time (children are sampled themselves, not added twice).
                self.cpu[p.pid] = t.user + t.system
                total += mem
                if mem > self.rss.get(p.pid, ("", 0.0))[1]:
                    self.rss[p.pid] = (name, mem)
            self.total_peak = max(self.total_peak, total)
            self.done.wait(0.2)


def zk_packets(zk: ZooKeeperServer) -> int:
    out = four_letter_word(zk.host, zk.port, b"mntr").decode()
    for line in out.splitlines():
        key, _, value = line.partition("\t")
        if key == "zk_packets_received":
            return int(value)
    raise RuntimeError(f"no zk_packets_received in mntr: {out[:200]}")


PROBE_PATH = f"/scale{DEFAULT_LEDGERS_ROOT}/LAYOUT"


FARM: list[FarmClient] = []
"""The farm, asked for the entries it served during each command."""

LOGS: list[Path] = []
"""With ``--logs DIR``: the directory each command's stderr (its log) is saved to."""

PEERS: dict[str, psutil.Process] = {}
"""The cluster's processes whose CPU each command is charged with: ``farm`` and ``zookeeper``."""

READ_ONLY_COMMANDS = ("whatif", "blastradius", "report")
"""What ``--commands`` may name: timed on the audited warehouse after the audits and repairs."""


def _cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return float(t.user + t.system)


def measure(name: str, argv: list[str], zk: ZooKeeperServer, tree: Path = REPO) -> Measured:
    """Run ``python -m jobs.cli ARGV`` in the checkout ``tree`` and measure it, with a latency
    probe reading one znode every 10 ms on a session of its own."""
    peers_before = {k: _cpu(p) for k, p in PEERS.items()}
    read_before = FARM[0].entries_read() if FARM else 0
    with LatencyProbe(zk.connect_string, PROBE_PATH) as probe:
        before = zk_packets(zk)
        t0 = time.monotonic()
        cmd = [sys.executable, "-m", "jobs.cli", *argv]
        proc = subprocess.Popen(cmd, cwd=tree, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)  # fmt: skip
        sampler = TreeSampler(proc.pid)
        sampler.start()
        out, err = proc.communicate()
        wall = time.monotonic() - t0
        sampler.done.set()
        sampler.join()
    seen = probe.summary()
    cpu = sum(sampler.cpu.values())
    peaks: dict[str, float] = {}
    for pname, mem in sampler.rss.values():
        label = "jvm" if pname == "java" else pname
        peaks[label] = max(peaks.get(label, 0.0), round(mem, 1))
    if proc.returncode != 0:
        print(f"{name}: exit {proc.returncode}\n{err[-3000:]}", file=sys.stderr)
    requests = zk_packets(zk) - before - seen.reads - seen.errors
    peers = {k: round(_cpu(p) - peers_before[k], 2) for k, p in PEERS.items()}
    entries_read = FARM[0].entries_read() - read_before if FARM else 0
    m = Measured(name, round(wall, 2), round(cpu, 2), peaks, requests, proc.returncode,
                 {"p50_ms": seen.p50_ms, "p99_ms": seen.p99_ms, "max_ms": seen.max_ms},
                 peers_cpu_s=peers, entries_read=entries_read,
                 peak_rss_total_mb=round(sampler.total_peak, 1))  # fmt: skip
    print(json.dumps(asdict(m)), flush=True)
    del out
    if LOGS:
        LOGS[0].mkdir(parents=True, exist_ok=True)
        (LOGS[0] / f"{name.replace(' ', '_')}.log").write_text(err)
    return m


@contextmanager
def cluster(
    base: Path, bookies: int, ledgers: int
) -> Iterator[tuple[ZooKeeperServer, str, FarmClient]]:
    zk = ZooKeeperServer(base / "zk", heap="3g")
    zk.start()
    try:
        hosts = f"{zk.connect_string}/scale"
        kz = connect(zk.connect_string)
        kz.ensure_path("/scale")
        kz.stop()
        t0 = time.monotonic()
        with running_farm(hosts, base / "farm", bookies=bookies, ledgers=ledgers,
                          start_timeout=600) as (farm, farm_proc):  # fmt: skip
            assert zk.proc is not None
            PEERS.update(farm=psutil.Process(farm_proc.pid), zookeeper=psutil.Process(zk.proc.pid))
            FARM[:] = [farm]
            print(json.dumps({"farm_up_s": round(time.monotonic() - t0, 1)}), flush=True)
            before = zk_packets(zk)
            report = seed_ledgers(hosts, farm.plan, progress=_progress(ledgers))
            print(json.dumps({"seeded": report.created, "seed_s": round(report.seconds, 1),
                              "seed_per_s": round(report.created / report.seconds),
                              "zk_requests": zk_packets(zk) - before}), flush=True)  # fmt: skip
            yield zk, hosts, farm
    finally:
        zk.stop()


def _progress(total: int):  # type: ignore[no-untyped-def]
    step = max(total // 10, 10_000)

    def show(done: int) -> None:
        if done % step == 0:
            print(f"  seeded {done}/{total}", file=sys.stderr, flush=True)

    return show


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ledgers", type=int, default=100_000)
    p.add_argument("--bookies", type=int, default=100)
    p.add_argument("--executors", default="local,spark")
    p.add_argument(
        "--checks",
        default="lost",
        help=f"audit checks to run, comma-separated ({', '.join(replication_names())})",
    )
    p.add_argument("--repair", action="store_true", help="lose one identity and rereplicate")
    p.add_argument(
        "--repair-executors", default="local", help="rereplicate on each, comma-separated"
    )
    p.add_argument(
        "--repair-in-flight",
        default="",
        help="rereplicate with each of these --ledgers-in-flight values, comma-separated, each "
        "after losing another identity (empty: the command's default)",
    )
    p.add_argument(
        "--zk-rates",
        default="",
        help="also run the local lost audit under each of these --zk-rate values (0: none)",
    )
    p.add_argument(
        "--commands",
        default=",".join(READ_ONLY_COMMANDS),
        help="read-only commands to time on the audited warehouse, comma-separated (empty: none)",
    )
    p.add_argument("--json", help="append the results to this file")
    p.add_argument("--keep-warehouse", help="copy the first repair's warehouse here")
    p.add_argument("--logs", help="save each command's log (its stderr) in this directory")
    p.add_argument(
        "--compare-with",
        type=Path,
        default=None,
        help="another checkout: run every audit and repair from it too, alternating (an A/B)",
    )
    p.add_argument("--repeat", type=int, default=1, help="runs of each audit, per side")
    args = p.parse_args()
    trees = [(REPO, "")]
    if args.compare_with is not None:
        trees.append((args.compare_with.resolve(), f" [{args.compare_with.name}]"))
    turn = [0]

    def in_turn() -> list[tuple[Path, str]]:
        """The checkouts in this step's order: who goes first alternates."""
        turn[0] += 1
        return trees if turn[0] % 2 else trees[::-1]

    LOGS[:] = [Path(args.logs)] if args.logs else []
    commands = [c for c in args.commands.split(",") if c]
    unknown = set(commands) - set(READ_ONLY_COMMANDS)
    if unknown:  # before the cluster is seeded, not after
        raise SystemExit(f"--commands: unknown {sorted(unknown)}")
    results: list[Measured] = []
    with tempfile.TemporaryDirectory(prefix="bkaudit-scale-") as tmp:
        base = Path(tmp)
        with cluster(base, args.bookies, args.ledgers) as (zk, hosts, farm):
            common = ["--zk", hosts, "--read-timeout", "5"]

            def audit(
                name: str,
                executor: str,
                wh: str,
                rate: str | None = None,
                check: str = "lost",
                tree: Path = REPO,
            ) -> Measured:
                argv = ["audit", "--check", check, "--executor", executor, "--warehouse", wh]
                argv += ["--connect-timeout", "5"]
                argv += ["--zk-rate", rate] if rate is not None else []
                m = measure(name, [*argv, *common], zk, tree)
                run = delta.latest_run(wh) or {}
                counts = dict(run.get("counts") or [])
                m.detail = {"status": run.get("status"), "ledgers": counts.get(CountKey.LEDGERS),
                            "fragments": counts.get(CountKey.FRAGMENTS)}  # fmt: skip
                results.append(m)
                return m

            audited: str | None = None  # the warehouse the read-only commands read
            for check in filter(None, args.checks.split(",")):
                for ex in filter(None, args.executors.split(",")):
                    for _ in range(args.repeat):
                        for tree, tag in in_turn():
                            wh = str(base / f"wh-{check}-{ex}{tag.strip(' []')}")
                            audit(f"audit {check} {ex}{tag}", ex, wh, check=check, tree=tree)
                            if check == Check.LOST and audited is None and not tag:
                                audited = wh
            for rate in filter(None, args.zk_rates.split(",")):
                wh = str(base / f"wh-r{rate}")
                audit(f"audit lost local --zk-rate {rate}", "local", wh, rate)
            executors = filter(None, args.repair_executors.split(",")) if args.repair else []
            in_flight = [n for n in args.repair_in_flight.split(",") if n] or [None]
            repairs = [(ex, n, t) for ex in executors for n in in_flight for t in in_turn()]
            for k, (ex, n, (tree, tag)) in enumerate(repairs):
                wh = str(base / f"wh-repair-{k}-{ex}")
                lose_one(hosts, farm, k)
                audit(f"audit lost after a loss{tag}", "local", wh, tree=tree)
                argv = ["rereplicate", "--executor", ex, "--grace-period", "0s"]
                argv += ["--ledgers-in-flight", n] if n else []
                name = f"rereplicate {ex}" + (f" --ledgers-in-flight {n}" if n else "") + tag
                m = measure(name, [*argv, "--warehouse", wh, *common], zk, tree)
                acts = delta.read_rows(wh, ACTIONS)
                repaired = {a["ledger_id"] for a in acts if a["action"] == "METADATA_UPDATE"}
                per_min = round(len(repaired) / m.wall_s * 60)
                m.detail = {"ledgers_repaired": len(repaired), "ledgers_per_min": per_min}
                results.append(m)
                if k == 0 and not tag:
                    argv = ["listunderreplicated", "--warehouse", wh]
                    results.append(measure("listunderreplicated", argv, zk))
                    if args.keep_warehouse:
                        shutil.copytree(wh, args.keep_warehouse, dirs_exist_ok=True)
                    audited = wh  # the repair's warehouse holds findings and actions
            if commands:
                if audited is None:
                    audited = str(base / "wh-lost-local")
                    audit("audit lost local", "local", audited)
                executors = [ex for ex in args.executors.split(",") if ex]
                live = farm.bookies[0]  # lose_one stops from the middle on
                results += read_only(commands, audited, live, executors, base, zk, hosts)
    if args.json:
        with open(args.json, "a") as f:
            for m in results:
                row = {"ledgers": args.ledgers, "bookies": args.bookies, **asdict(m)}
                f.write(json.dumps(row) + "\n")


def read_only(
    commands: list[str],
    wh: str,
    bookie: str,
    executors: list[str],
    base: Path,
    zk: ZooKeeperServer,
    hosts: str,
) -> list[Measured]:
    """Time the read-only commands on ``wh``: ``whatif --bookie``, ``blastradius`` with each
    executor (it writes its own table, nothing else), ``report``."""
    out: list[Measured] = []
    for name in commands:
        if name == "whatif":
            argv = ["whatif", "--bookie", bookie, "--warehouse", wh, "--max-ledgers", "20"]
            out.append(measure("whatif --bookie", [*argv, "--zk", hosts], zk))
        elif name == "blastradius":
            for ex in executors:
                argv = ["blastradius", "--executor", ex, "--warehouse", wh, "--zk", hosts]
                out.append(measure(f"blastradius {ex}", argv, zk))
        elif name == "report":
            argv = ["report", "--warehouse", wh, "--out", str(base / "report.html")]
            m = measure("report", argv, zk)
            m.detail = {"html_bytes": (base / "report.html").stat().st_size}
            out.append(m)
    return out


def lose_one(hosts: str, farm: FarmClient, k: int = 0) -> str:
    """Stop the ``k``-th victim (the middle identity, then every seventh after it) and wait
    until its registration is gone."""
    victim = farm.bookies[(len(farm.bookies) // 2 + 7 * k) % len(farm.bookies)]
    farm.stop(victim)
    kz = connect(hosts)
    try:
        while kz.exists(f"{DEFAULT_LEDGERS_ROOT}/available/{victim}"):
            time.sleep(0.2)
    finally:
        kz.stop()
    return victim


if __name__ == "__main__":
    main()
