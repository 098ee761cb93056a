"""Soak: two ``bkaudit watch`` replicas on a scale farm for ``--duration`` seconds under faults on a
schedule (docs/watch.md, "The index"; ``make soak-scale``).

A ZooKeeper (2 GB heap), a farm of ``--bookies`` identities over ``--ledgers`` planned ledgers,
and two watches (leader and standby: lostBookieRecoveryDelay 0, grace period 0, a full ``lost``
audit every ``--reconcile-every``, which reconciles the index). The faults, at fixed fractions
of the run:

- a bookie lost every ``--loss-every`` seconds (the farm stops an identity; its registration
  goes at once);
- the leader killed with SIGKILL (restarted ten seconds later, as a pod would be);
- the leader's ZooKeeper session expired (SIGSTOP past its session timeout, then SIGCONT);
- ZooKeeper restarted (stopped and started on the same port and data);
- a bookie that stalls for a minute (the farm drops its requests), then answers again;
- a bookie that flaps: stopped, then started again ``FLAP_DOWN`` seconds later on the same
  port with its entries (after the watch has marked its ledgers and started their repair).

Recorded: each fault's reaction (from the watches' own log lines: a loss to its marks and to no
ledger naming it; a leader's death or expiry to the next ``elected leader``; a flap to its
marks and to its repair stopping), each watch's RSS
every ten seconds (the last quarter's peak against the first's), and ZooKeeper's requests per
second from the leader while nothing happens (a fault that moved no leadership gets no
election time). At the end, from the ``replication_actions`` rows: no fragment swapped twice in
the metadata, and a fragment copied twice only where its first copy's swap was not saved (a
compare-and-set lost, ZooKeeper gone under it). Also no reconciliation difference (the logs of
both), no ledger naming a lost bookie, no mark left standing (a flap's are checked and
cleared), and a ``replicas`` audit (every planned entry where the
metadata says) that finds nothing missing.

    .venv/bin/python bench/watch_soak.py --ledgers 1000000 --bookies 100 --duration 3600 \
        [--loss-every 600] [--reconcile-every 1200] [--json FILE] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

from bench.watch_scale import seeded_farm, zk_requests  # noqa: E402
from bklib.audit.engine import scan_dirs  # noqa: E402
from bklib.meta.store import LedgerStore  # noqa: E402
from bklib.meta.stores import open_store  # noqa: E402
from bklib.meta.underreplication import UnderReplicationManager  # noqa: E402
from bklib.states import DEFAULT_LEDGERS_ROOT, ActionKind, ActionStatus  # noqa: E402
from bklib.testing.metrics_page import samples  # noqa: E402
from bklib.testing.ports import free_port  # noqa: E402
from jobs.tables import delta  # noqa: E402
from jobs.tables.schema import ACTIONS  # noqa: E402

SESSION = 10.0
FLAP_DOWN = 30.0
"""Seconds a flapping bookie is gone: past the marks of its ledgers at a million (about 13 s)."""
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


@dataclass
class Replica:
    """One watch process (restarted under the same name after a kill)."""

    name: str
    zk: str
    warehouse: Path
    base: Path
    every: str
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> Path:
        return self.base / f"{self.name}.log"

    def start(self) -> None:
        argv = [
            sys.executable, "-m", "jobs.cli", "watch", "--zk", self.zk,
            "--warehouse", str(self.warehouse), "--every", self.every,
            "--grace-period", "0s", "--lost-bookie-recovery-delay", "0s",
            "--zk-session-timeout", f"{SESSION:g}s", "--metrics-port", str(self.port),
            "--metrics-host", "127.0.0.1", "--read-timeout", "10s", "--rate", "0",
            "--instance-id", self.name, "--spool-dir", str(self.base / f"spool-{self.name}"),
        ]  # fmt: skip
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )  # fmt: skip

    def role(self) -> str | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=5) as r:
                return str(json.loads(r.read()).get("role"))
        except (OSError, ValueError):
            return None

    def metrics(self) -> dict[str, float]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as r:
                return samples(r.read().decode())
        except OSError:
            return {}

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class RssLog(threading.Thread):
    """Each replica's RSS every ten seconds, with the time since the start."""

    def __init__(self, replicas: list[Replica]) -> None:
        super().__init__(daemon=True)
        self.replicas = replicas
        self.rows: list[tuple[float, str, float]] = []
        self.stop = threading.Event()
        self.t0 = time.monotonic()
        self.wall0 = time.time()

    def run(self) -> None:
        while not self.stop.wait(10.0):
            for r in self.replicas:
                try:
                    mb = psutil.Process(r.proc.pid).memory_info().rss / 2**20 if r.proc else 0.0
                except psutil.NoSuchProcess:
                    continue
                self.rows.append((time.monotonic() - self.t0, r.name, mb))


def leader(replicas: list[Replica]) -> Replica | None:
    for r in replicas:
        if r.role() == "leader":
            return r
    return None


def wait_leader(replicas: list[Replica], timeout: float) -> Replica:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = leader(replicas)
        if found is not None:
            return found
        time.sleep(1.0)
    raise SystemExit(f"no leader within {timeout:.0f}s")


def stamped(path: Path) -> list[tuple[float, str]]:
    """A log's lines with their wall-clock time (epoch seconds)."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        m = _STAMP.match(line)
        if m:
            t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            out.append((t, line))
    return out


def first_after(
    lines: list[tuple[float, str]], t: float, pattern: str, until: float = float("inf")
) -> float | None:
    """Seconds from ``t`` to the first line matching ``pattern`` before ``until``."""
    rx = re.compile(pattern)
    for ts, line in lines:
        if t <= ts < until and rx.search(line):
            return ts - t
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ledgers", type=int, default=100_000)
    ap.add_argument("--bookies", type=int, default=100)
    ap.add_argument("--duration", type=float, default=3600.0)
    ap.add_argument("--loss-every", type=float, default=600.0)
    ap.add_argument("--reconcile-every", type=float, default=1200.0)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--keep", type=Path, help="copy the logs here at the end")
    ap.add_argument(
        "--settle-timeout", type=float, default=3600.0,
        help="seconds to wait, after the hour, for no ledger to name a lost bookie; past "
        "them (or on Ctrl-C) the results are reported with what was left",
    )  # fmt: skip
    args = ap.parse_args()
    out: dict[str, Any] = {"ledgers": args.ledgers, "bookies": args.bookies}
    with seeded_farm("watch-soak-", args.ledgers, args.bookies) as cluster:
        base, zk, farm = cluster.base, cluster.zk, cluster.farm
        every = f"lost={args.reconcile_every:g}s"
        wh = base / "wh"
        replicas = [Replica(n, zk.connect_string, wh, base, every) for n in ("a", "b")]
        for r in replicas:
            r.start()
        rss = RssLog(replicas)
        rss.start()
        faults: list[tuple[float, str, str]] = []  # (wall time, kind, detail)
        lost: list[str] = []
        try:
            lead = wait_leader(replicas, 1800)
            while not lead.metrics().get("bkaudit_index_ledgers"):
                time.sleep(2)
            t_start = time.monotonic()
            pid = lead.proc.pid if lead.proc else 0
            before, c0 = zk_requests(zk, pid), time.monotonic()
            time.sleep(60)
            out["idle_zk_requests_per_s"] = round(
                (zk_requests(zk, pid) - before) / (time.monotonic() - c0), 2
            )
            plan = _schedule(args)
            victims = iter(farm.bookies[i] for i in range(3, len(farm.bookies), 7))
            for at, kind in plan:
                wait_s = at - (time.monotonic() - t_start)
                if wait_s > 0:
                    time.sleep(wait_s)
                now = time.time()
                lead = wait_leader(replicas, 600)
                if kind == "loss":
                    victim = next(victims)
                    lost.append(victim)
                    farm.stop(victim)
                    faults.append((now, kind, victim))
                elif kind == "kill-leader":
                    assert lead.proc is not None
                    lead.proc.kill()
                    lead.proc.wait()
                    faults.append((now, kind, lead.name))
                    time.sleep(10)
                    lead.start()
                elif kind == "expire-leader":
                    assert lead.proc is not None
                    lead.proc.send_signal(signal.SIGSTOP)
                    time.sleep(SESSION + 5)
                    lead.proc.send_signal(signal.SIGCONT)
                    faults.append((now, kind, lead.name))
                elif kind == "restart-zookeeper":
                    zk.stop()
                    zk.start()
                    faults.append((now, kind, ""))
                elif kind == "stall-bookie":
                    stalled = farm.bookies[1]
                    farm.stall(stalled)
                    faults.append((now, kind, stalled))
                    time.sleep(60)
                    farm.clear(stalled)
                elif kind == "flap-bookie":
                    flapping = farm.bookies[2]
                    farm.stop(flapping)
                    faults.append((now, kind, flapping))
                    time.sleep(FLAP_DOWN)
                    farm.start(flapping)
            rest = args.duration - (time.monotonic() - t_start)
            if rest > 0:
                time.sleep(rest)
            out.update(_settle(zk.connect_string, lost, args.settle_timeout))
            if out["settle_s"] is not None:
                out["marks_left"] = _marks_left(zk.connect_string, 600)
        finally:
            rss.stop.set()
            for r in replicas:
                r.stop()
        out.update(_results(replicas, faults, rss, wh, args.duration))
        out["replicas_audit"] = _replicas_audit(zk.connect_string, base)
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            for r in replicas:
                shutil.copy(r.log, args.keep / r.log.name)
    print(json.dumps(out, indent=1))
    if args.json:
        with args.json.open("a") as f:
            f.write(json.dumps({"bench": "watch_soak", **out}) + "\n")


def _schedule(args: argparse.Namespace) -> list[tuple[float, str]]:
    d = args.duration
    plan = [(t, "loss") for t in _range(60.0, d - 60.0, args.loss_every)]
    plan += [(0.2 * d, "kill-leader"), (0.35 * d, "expire-leader")]
    plan += [(0.5 * d, "restart-zookeeper"), (0.65 * d, "stall-bookie")]
    plan += [(0.8 * d, "flap-bookie")]
    return sorted(plan)


def _range(start: float, stop: float, step: float) -> list[float]:
    out, t = [], start
    while t < stop:
        out.append(t)
        t += step
    return out


def _settle(zk: str, lost: list[str], timeout: float) -> dict[str, Any]:
    """Wait until no ledger names a lost bookie (a full read of the metadata every half
    minute: a bookie resolved by a leader that died before it said so counts too). The
    seconds it took; or, past ``timeout`` (or on Ctrl-C), None and what was left: the
    ledgers still naming a lost bookie, and those whose every bookie is lost (two losses
    closer than a repair: no replica left to copy from), so the run still reports."""
    t0 = time.monotonic()
    left: list[Any] = []
    try:
        with open_store(zk, timeout=30) as store:
            while time.monotonic() - t0 < timeout:
                views = scan_dirs(store, LedgerStore(store, DEFAULT_LEDGERS_ROOT).leaf_dirs())
                left = [v for v in views if set(lost) & set(v.bookies())]
                if not left:
                    return {"settle_s": round(time.monotonic() - t0, 1)}
                time.sleep(30)
    except KeyboardInterrupt:
        pass
    return {
        "settle_s": None,
        "ledgers_still_naming_lost": len(left),
        "ledgers_with_every_bookie_lost": sum(set(v.bookies()) <= set(lost) for v in left),
    }


def _marks_left(zk: str, timeout: float) -> int:
    """Marks still standing once the cluster settled, after waiting up to ``timeout`` seconds
    for the leader's check of the marks no loss explains (a flap's)."""
    deadline = time.monotonic() + timeout
    with open_store(zk, timeout=30) as store:
        urm = UnderReplicationManager(store, DEFAULT_LEDGERS_ROOT)
        while True:
            left = sum(1 for _ in urm.list_underreplicated())
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(10)


def _results(
    replicas: list[Replica], faults: list[tuple[float, str, str]], rss: RssLog, wh: Path,
    duration: float,
) -> dict[str, Any]:  # fmt: skip
    lines = sorted(line for r in replicas for line in stamped(r.log))
    reactions = []
    for i, (t, kind, detail) in enumerate(faults):
        row: dict[str, Any] = {"fault": kind, "detail": detail}
        # A fault that moved no leadership (ZooKeeper back within the sessions' timeout, a
        # stalled bookie) must not be credited with the next fault's election.
        until = faults[i + 1][0] if i + 1 < len(faults) else float("inf")
        if kind == "loss":
            b = re.escape(detail)
            row["marked_s"] = first_after(lines, t, rf"bookie {b}: marked")
            row["first_copy_s"] = first_after(lines, t, rf"bookie {b}: first copy")
            row["no_ledger_names_it_s"] = first_after(lines, t, rf"bookie {b}: no ledger names")
        elif kind == "flap-bookie":
            b = re.escape(detail)
            row["marked_s"] = first_after(lines, t, rf"bookie {b}: marked", until)
            row["repair_stopped_s"] = first_after(lines, t, rf"bookie {b} registered again", until)
        else:
            row["elected_s"] = first_after(lines, t, r"elected leader", until)
            row["index_built_s"] = first_after(lines, t, r"bookie index built", until)
        reactions.append(row)
    quarter = duration / 4
    peaks: dict[str, Any] = {}
    for name in {r.name for r in replicas}:
        mine = [(t, mb) for t, n, mb in rss.rows if n == name]
        first = max(((mb, t) for t, mb in mine if t <= quarter), default=(0.0, 0.0))
        last = max(((mb, t) for t, mb in mine if t >= rss_end(rss) - quarter), default=(0.0, 0.0))
        # Where each peak was, and the whole series (seconds from the bench's start, MiB):
        # a peak is placed against the faults and the scans in the watches' logs.
        peaks[name] = {
            "first_quarter_peak_mb": round(first[0]),
            "first_quarter_peak_at": _clock(rss.wall0 + first[1]),
            "last_quarter_peak_mb": round(last[0]),
            "last_quarter_peak_at": _clock(rss.wall0 + last[1]),
            "series": [[round(t), round(mb)] for t, mb in mine],
        }
    copies, swaps = _copies_and_swaps(delta.read_rows(str(wh), ACTIONS))
    twice = [k for k, n in copies.items() if n > 1]
    differences = sum(line.count("bookie index differs from the scan") for _, line in lines)
    return {
        "reactions": reactions,
        "rss": peaks,
        "fragments_copied": sum(copies.values()),
        "fragments_copied_twice": len(twice),
        # A copy is done again only when the first one's swap was not saved (its compare-and-
        # set failed, or ZooKeeper went away under it): copying is idempotent, swapping twice
        # would not be.
        "copied_twice_after_an_unsaved_swap": sum(swaps[k] < copies[k] for k in twice),
        "fragments_swapped_twice": sum(n > 1 for n in swaps.values()),
        "reconciliation_differences": differences,
        "reconciliations": sum("reconciliation:" in line for _, line in lines),
    }


Fragment = tuple[int, int, str]
"""(ledger, segment's first entry, the bookie replaced)."""


def _copies_and_swaps(
    actions: Iterable[dict[str, Any]],
) -> tuple[Counter[Fragment], Counter[Fragment]]:
    """How often each fragment was copied, and how often its swap was saved in the metadata
    (``replication_actions``' COPY and METADATA_UPDATE rows that are DONE)."""
    copies: Counter[Fragment] = Counter()
    swaps: Counter[Fragment] = Counter()
    for a in actions:
        if a["status"] != ActionStatus.DONE:
            continue
        key = (a["ledger_id"], a["segment_first_entry_id"])
        if a["action"] == ActionKind.COPY:
            copies[(*key, a["old_bookie"])] += 1
        elif a["action"] == ActionKind.METADATA_UPDATE:
            for old in (a["old_bookie"] or "").split(","):
                swaps[(*key, old)] += 1
    return copies, swaps


def _clock(epoch: float) -> str:
    """A wall-clock time as the watches' logs print it (to the second)."""
    return datetime.fromtimestamp(epoch).strftime("%H:%M:%S")


def rss_end(rss: RssLog) -> float:
    return max((t for t, _, _ in rss.rows), default=0.0)


def _replicas_audit(zk: str, base: Path) -> dict[str, Any]:
    """A ``replicas`` audit of the cluster at the end: every entry where the metadata says."""
    wh = base / "final"
    done = subprocess.run(
        [sys.executable, "-m", "jobs.cli", "audit", "--zk", zk, "--warehouse", str(wh),
         "--check", "replicas", "--executor", "local", "--read-timeout", "10s"],
        cwd=REPO, capture_output=True, text=True, timeout=7200,
    )  # fmt: skip
    run = delta.latest_run(str(wh)) or {}
    counts = dict(run.get("counts") or {})
    return {
        "exit": done.returncode,
        "status": run.get("status"),
        "fragments": counts.get("fragments"),
        "missing_entries": counts.get("missing_entries"),
    }


if __name__ == "__main__":
    main()
