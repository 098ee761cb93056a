"""Benchmark: ``bkaudit watch`` at production size on the scale farm (docs/watch.md, "The index").

A ZooKeeper server (2 GB heap), a farm of ``--bookies`` identities serving ``--ledgers`` planned
ledgers (seeded through pipelined creates), and one watch (lostBookieRecoveryDelay 0, grace
period 0, no periodic audit). Measured:

- the take-over: from start to the bookie index built (the one full scan), and the watch's RSS;
- idle: for ``--idle`` seconds with nothing happening, the requests ZooKeeper received from the
  watch's connections (``cons``' per-connection ``recved``: its session, the pipelined reads'
  and the change feed's), per second;
- one identity lost (the farm stops it: its registration goes at once): from the watch seeing
  the registration go to every mark published, to the first fragment copied, and to no ledger
  naming the bookie (the watch's own log lines and ``bkaudit_loss_reaction_seconds``), and the
  wall time from the stop to the last;
- with ``--second-loss-after S``, a second identity lost S seconds after the first, while the
  first one's repair runs: its marks and first copy, also from its stop (wall clock) to its
  marks (a repair stops once the lost bookies change, so the second loss need not wait for
  it). The run then ends at the second loss's first copy: ledgers naming both may have
  entries on those two only, lost for good, so neither loss is ever resolved;
- the watch's peak RSS over the whole run (sampled every second), alone and with its child
  processes (the full scan's helper, the repair's worker), and its CPU-seconds, and the
  farm's and ZooKeeper's CPU-seconds (they share the machine's cores).

    .venv/bin/python bench/watch_scale.py --ledgers 1000000 [--bookies 100] [--idle 60]
        [--second-loss-after S] [--json FILE] [--log FILE]

Figures go to docs/benchmarks.md with the command that produced them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

from bklib.testing.metrics_page import samples  # noqa: E402
from bklib.testing.ports import free_port  # noqa: E402
from bklib.testing.scale.farm import FarmClient  # noqa: E402
from bklib.testing.scale.harness import running_farm  # noqa: E402
from bklib.testing.scale.seeder import seed_ledgers  # noqa: E402
from bklib.testing.zkserver import ZooKeeperServer  # noqa: E402

_AFTER = re.compile(r"bookie (\S+): (marked|first copy|no ledger names it any more),? ([0-9.]+)s")


def zk_requests(zk: ZooKeeperServer, pid: int) -> int:
    """Requests ZooKeeper has received on the connections process ``pid`` has open."""
    ports = {
        c.laddr.port
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.raddr and c.raddr.port == zk.port
    }
    return zk.requests_on(ports)


def metrics(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return samples(r.read().decode())


def cpu(pid: int) -> float:
    """CPU-seconds of the process and of its children: those it waited for (the scan's
    helper, a repair's worker processes once joined) and those alive now."""
    try:
        proc = psutil.Process(pid)
        t = proc.cpu_times()
        live = proc.children(recursive=True)
    except psutil.NoSuchProcess:
        return 0.0
    total = t.user + t.system + t.children_user + t.children_system
    for child in live:
        try:
            c = child.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += c.user + c.system
    return float(total)


class RssSampler(threading.Thread):
    """The peak RSS of one process (``peak``) and of it with its children (``tree_peak``: the
    scan's helper, the repair's worker), sampled every second, by phase."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.proc = psutil.Process(pid)
        self.phase = "take-over"
        self.peak: dict[str, float] = {}
        self.tree_peak: dict[str, float] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(1.0):
            try:
                mb = self.proc.memory_info().rss / 2**20
                children = self.proc.children(recursive=True)
            except psutil.NoSuchProcess:
                return
            tree = mb
            for child in children:
                with contextlib.suppress(psutil.NoSuchProcess):
                    tree += child.memory_info().rss / 2**20
            self.peak[self.phase] = max(self.peak.get(self.phase, 0.0), mb)
            self.tree_peak[self.phase] = max(self.tree_peak.get(self.phase, 0.0), tree)


def wait(cond: Any, timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if cond():
            return time.monotonic() - t0
        time.sleep(1.0)  # a scrape costs the watch CPU too
    raise SystemExit(f"timed out after {timeout:.0f}s waiting for {what}")


@dataclass
class SeededFarm:
    """A scale cluster for one bench: its directory, ZooKeeper, farm and the seeding's time."""

    base: Path
    zk: ZooKeeperServer
    farm: FarmClient
    proc: subprocess.Popen[bytes]
    seed_s: float


@contextmanager
def seeded_farm(prefix: str, ledgers: int, bookies: int) -> Iterator[SeededFarm]:
    """A temporary directory, a ZooKeeper (2 GB heap) and a farm of ``bookies`` identities
    over ``ledgers`` planned ledgers, seeded."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        base = Path(tmp)
        with (
            ZooKeeperServer(base / "zk", heap="2g") as zk,
            running_farm(
                zk.connect_string, base / "farm", bookies=bookies, ledgers=ledgers,
                start_timeout=900,
            ) as (farm, proc),
        ):  # fmt: skip
            t0 = time.monotonic()
            seed_ledgers(zk.connect_string, farm.plan)
            yield SeededFarm(base, zk, farm, proc, round(time.monotonic() - t0, 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ledgers", type=int, default=100_000)
    ap.add_argument("--bookies", type=int, default=100)
    ap.add_argument("--idle", type=float, default=60.0)
    ap.add_argument("--second-loss-after", type=float, help="lose a second identity then")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--log", type=Path, help="keep the watch's log here")
    args = ap.parse_args()
    out: dict[str, Any] = {"ledgers": args.ledgers, "bookies": args.bookies}
    with seeded_farm("watch-scale-", args.ledgers, args.bookies) as cluster:
        base, zk, farm, farm_proc = cluster.base, cluster.zk, cluster.farm, cluster.proc
        out["seed_s"] = cluster.seed_s
        print(f"seeded {args.ledgers} ledgers in {out['seed_s']}s", flush=True)
        victim = farm.bookies[len(farm.bookies) // 2]
        second = farm.bookies[len(farm.bookies) // 2 + 1]
        second_stopped: float | None = None
        naming = {lid for lid, _ in farm.plan.segments_naming(victim)}
        out["victim_ledgers"] = len(naming)
        port = free_port()
        log_path = args.log or base / "watch.log"
        argv = [
            sys.executable, "-m", "jobs.cli", "watch", "--zk", zk.connect_string,
            "--warehouse", str(base / "wh"), "--every", "off", "--grace-period", "0s",
            "--lost-bookie-recovery-delay", "0s", "--metrics-port", str(port),
            "--metrics-host", "127.0.0.1", "--read-timeout", "10s", "--rate", "0",
            "--instance-id", "bench",
        ]  # fmt: skip
        with open(log_path, "ab") as logf:
            watch = subprocess.Popen(
                argv, cwd=REPO, stdout=logf, stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )  # fmt: skip
        rss = RssSampler(watch.pid)
        rss.start()
        try:

            def built() -> bool:
                try:
                    return bool(metrics(port).get("bkaudit_index_ledgers") == args.ledgers)
                except OSError:
                    return False

            out["take_over_s"] = round(wait(built, 3600, "the index"), 1)
            print(f"index built in {out['take_over_s']}s", flush=True)
            rss.phase = "idle"
            time.sleep(5)  # the take-over's writes settle
            before, c0 = zk_requests(zk, watch.pid), time.monotonic()
            time.sleep(args.idle)
            after = zk_requests(zk, watch.pid)
            out["idle_zk_requests_per_s"] = round((after - before) / (time.monotonic() - c0), 2)
            print(f"idle: {out['idle_zk_requests_per_s']} ZooKeeper requests/s", flush=True)

            rss.phase = "loss"
            cpu0 = {"watch": cpu(watch.pid), "farm": cpu(farm_proc.pid), "zk": zk_cpu(zk)}
            t_stop = time.monotonic()
            farm.stop(victim)
            losses = 1
            if args.second_loss_after is not None:
                time.sleep(args.second_loss_after)
                farm.stop(second)
                second_stopped = time.time()
                losses = 2
                theirs = {lid for lid, _ in farm.plan.segments_naming(second)}
                out["second_victim_ledgers"] = len(theirs)
                out["ledgers_naming_both"] = len(theirs & naming)

            def resolved() -> bool:
                m = metrics(port)
                if losses == 2:
                    # Ledgers naming both may have entries on those two only (lost for good):
                    # the bench ends at the second loss's first copy, not at full repair.
                    first_copies = 'bkaudit_loss_reaction_seconds_count{stage="first_copy"}'
                    return bool(m.get(first_copies, 0) >= 2)
                return bool(m.get("bkaudit_time_to_repair_seconds_count", 0) >= 1)

            out["stop_to_resolved_s"] = round(wait(resolved, 7200, "the repair"), 1)
            out["loss_cpu_s"] = {
                "watch": round(cpu(watch.pid) - cpu0["watch"], 1),
                "farm": round(cpu(farm_proc.pid) - cpu0["farm"], 1),
                "zk": round(zk_cpu(zk) - cpu0["zk"], 1),
            }
            out["loss_wall_s"] = round(time.monotonic() - t_stop, 1)
            m = metrics(port)
            out["metadata_scans"] = m.get("bkaudit_metadata_scans_total")
        finally:
            rss.stop.set()
            watch.send_signal(signal.SIGTERM)
            try:
                watch.wait(120)
            except subprocess.TimeoutExpired:
                watch.kill()
        out["watch_peak_rss_mb"] = {k: round(v) for k, v in rss.peak.items()}
        out["watch_tree_peak_rss_mb"] = {k: round(v) for k, v in rss.tree_peak.items()}
        text = Path(log_path).read_text(errors="replace")
        for bookie, what, seconds in _AFTER.findall(text):
            if bookie == victim:
                out[f"loss_to_{what.replace(' ', '_')}_s"] = float(seconds)
            elif bookie == second:
                out[f"second_loss_to_{what.replace(' ', '_')}_s"] = float(seconds)
        if second_stopped is not None:
            line = re.search(
                rf"^(\S+ \S+) .*bookie {re.escape(second)}: marked", text, re.MULTILINE
            )
            if line:
                at = datetime.strptime(line.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                out["second_stop_to_marked_wall_s"] = round(at - second_stopped, 1)
        marked = re.search(r"watch: (\d+) ledgers marked under-replicated", text)
        out["ledgers_marked"] = int(marked.group(1)) if marked else None
    print(json.dumps(out, indent=1))
    if args.json:
        with args.json.open("a") as f:
            f.write(json.dumps({"bench": "watch_scale", **out}) + "\n")


def zk_cpu(zk: ZooKeeperServer) -> float:
    return cpu(zk.proc.pid) if zk.proc is not None else 0.0


if __name__ == "__main__":
    main()
