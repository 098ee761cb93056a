"""Ctrl-C is an answer, not a crash (issue 47, docs/exit-status.md): a real ``bkaudit``
subprocess on a real ZooKeeper with Python bookies, signalled mid-work (found by watching a
bookie's fault rule being hit or the command's log, never by sleeping blindly), prints one
line, exits 130 (143 for SIGTERM), records its run as INTERRUPTED where it records runs, and
leaves no process behind. A repair stops starting ledgers, finishes those in flight, writes
their rows and releases its locks; rerun, it converges with nothing copied twice."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from bklib.states import ActionKind, ActionStatus, RunStatus
from jobs.runtime.exit_status import ExitStatus
from jobs.tables import delta
from jobs.tables.schema import ACTIONS, AUDIT_RUNS
from tests.audit_helpers import AuditCluster, audit_cluster
from tests.cli_helpers import REPO, bkaudit, error_lines, failure

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

WAIT = 120.0
"""How long a command may take to reach the point where it is signalled (a bound, not a
timing: the tests wait for an event)."""


class Running:
    """A ``bkaudit`` subprocess in a session of its own, its output read as it comes, and
    every process it started seen while it ran."""

    def __init__(self, *argv: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jobs.cli", *argv],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
        self.me = psutil.Process(self.proc.pid)
        self.out: list[str] = []
        self.err: list[str] = []
        self.children: set[psutil.Process] = set()
        self.seen: list[list[str]] = []
        """The command lines of the processes it started."""
        self._readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self.out), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, self.err), daemon=True),
        ]
        for t in self._readers:
            t.start()

    @staticmethod
    def _read(stream: object, into: list[str]) -> None:
        for line in stream:  # type: ignore[attr-defined]
            into.append(line)

    def stderr(self) -> str:
        return "".join(self.err)

    def wait_for(self, what: str, ready: Callable[[], bool]) -> None:
        """Until ``ready()``; fails if the command exits first or takes past :data:`WAIT`."""
        deadline = time.monotonic() + WAIT
        while not ready():
            self._see_children()
            assert self.proc.poll() is None, f"exited before {what}:\n{self.stderr()[-4000:]}"
            assert time.monotonic() < deadline, f"no {what} in {WAIT}s:\n{self.stderr()[-4000:]}"
            time.sleep(0.05)
        self._see_children()

    def _see_children(self) -> None:
        with contextlib.suppress(psutil.NoSuchProcess):
            for p in self.me.children(recursive=True):
                if p not in self.children:
                    self.children.add(p)
                    with contextlib.suppress(psutil.Error):
                        self.seen.append(p.cmdline())

    def signal(self, sig: int = signal.SIGINT, *, group: bool = False) -> None:
        """``sig`` to the command, or to its whole process group as a terminal's Ctrl-C."""
        if group:
            os.killpg(self.proc.pid, sig)
        else:
            self.proc.send_signal(sig)

    def finish(self, timeout: float = 90) -> subprocess.CompletedProcess[str]:
        """Wait for the exit; a command still running after ``timeout`` is killed, and fails
        the test with its output."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout)
        hung = self.proc.poll() is None
        if hung:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for t in self._readers:
            t.join(10)
        assert not hung, f"still running {timeout}s after the signal:\n{self.stderr()[-6000:]}"
        return subprocess.CompletedProcess(
            self.proc.args, self.proc.returncode, "".join(self.out), self.stderr()
        )

    def left_behind(self) -> list[str]:
        """The processes it started that are still alive (zombies count as gone), once each
        had a few seconds to see its parent gone (multiprocessing's resource tracker reads
        until its pipe closes); their command lines."""
        _, waiting = psutil.wait_procs(list(self.children), timeout=10)
        alive = []
        for p in waiting:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(" ".join(p.cmdline()))
            except psutil.NoSuchProcess:
                pass
        return alive


def _interrupted(
    proc: subprocess.CompletedProcess[str], running: Running, pattern: str, sig: int
) -> str:
    """The command exited 128 + ``sig`` with one line matching ``pattern``, no traceback, and
    no process of its own left alive; returns the line."""
    want = ExitStatus.INTERRUPTED if sig == signal.SIGINT else ExitStatus.TERMINATED
    assert proc.returncode == want, failure(proc)
    assert "Traceback" not in proc.stderr, failure(proc)
    lines = error_lines(proc)
    assert len(lines) == 1, failure(proc)
    assert re.fullmatch(pattern, lines[0]), failure(proc, f"want {pattern}")
    assert not running.left_behind(), running.left_behind()
    return lines[0]


def _hit(c: AuditCluster, bookies: list[str]) -> Callable[[], bool]:
    """Whether any fault rule of ``bookies`` has been hit: the command is talking to them."""

    def hit() -> bool:
        return any(r["hits"] for b in bookies for r in c.admin(b).faults())

    return hit


@pytest.fixture
def cluster(zk_server, tmp_path: Path) -> Iterator[AuditCluster]:  # type: ignore[no-untyped-def]
    """Four bookies; twelve closed ledgers of ten entries over the first three."""
    with (
        zk_server.private_chroot("interrupts") as chroot,
        audit_cluster(tmp_path / "sandbox", chroot, bookies=4) as c,
    ):
        b0, b1, b2, _ = c.bookie_ids
        for _ in range(12):
            c.ledger([b0, b1, b2], 10, wq=2, aq=2)
        yield c


def _zk(c: AuditCluster) -> list[str]:
    return ["--zk", c.zk]


@pytest.mark.parametrize(
    ("sig", "executor"),
    [(signal.SIGINT, "local"), (signal.SIGTERM, "local"), (signal.SIGINT, "spark")],
)
def test_an_audit_stopped_mid_check_records_its_run_as_interrupted(
    cluster: AuditCluster, tmp_path: Path, sig: int, executor: str
) -> None:
    """The replicas check waits on a bookie that answers in ten minutes; the signal ends it
    without waiting (on Spark, its jobs cancelled; Spark's own start and stop may take a few
    minutes on a busy machine, far less than the bookie's answer), its run is INTERRUPTED
    (never COMPLETED), and the line names the run."""
    slow = cluster.bookie_ids[1]
    cluster.admin(slow).add_fault("delay", ops=["GET_LIST_OF_ENTRIES_OF_LEDGER"], delay_ms=600_000)
    wh = str(tmp_path / "warehouse")
    run = Running("audit", *_zk(cluster), "--warehouse", wh, "--check", "replicas",
                  "--executor", executor, "--read-timeout", "900s")  # fmt: skip
    run.wait_for("a list-entries request at the slow bookie", _hit(cluster, [slow]))
    run.signal(sig)
    proc = run.finish(timeout=300 if executor == "spark" else 90)
    name = signal.Signals(sig).name
    line = _interrupted(
        proc, run, rf"audit: interrupted \({name}\); run (\S+) recorded as INTERRUPTED", sig
    )
    (row,) = delta.read_rows(wh, AUDIT_RUNS)
    assert row["status"] == RunStatus.INTERRUPTED, row
    assert row["run_id"] in line and row["error"] == f"interrupted by {name}"
    assert row["finished_at"] is not None


def test_status_stopped_while_probing_says_one_line(cluster: AuditCluster) -> None:
    """status asks each bookie; one takes ten minutes to answer: Ctrl-C, one line, 130."""
    slow = cluster.bookie_ids[0]
    cluster.admin(slow).add_fault("delay", ops=["GET_BOOKIE_INFO"], delay_ms=600_000)
    run = Running("status", *_zk(cluster), "--probe-timeout", "900s")
    run.wait_for("the probe at the slow bookie", _hit(cluster, [slow]))
    run.signal(signal.SIGINT)
    proc = run.finish()
    _interrupted(proc, run, r"status: interrupted \(SIGINT\)", signal.SIGINT)


def _copies(wh: str) -> Counter[tuple[int, int]]:
    """COPY DONE rows per (ledger, segment), across every run in ``wh``."""
    return Counter(
        (r["ledger_id"], r["segment_first_entry_id"])
        for r in delta.read_rows(wh, ACTIONS)
        if r["action"] == ActionKind.COPY and r["status"] == ActionStatus.DONE
    )


def _locks(c: AuditCluster) -> list[str]:
    """The ledgers locked for re-replication (BookKeeper's ``underreplication/locks``)."""
    zk: Any = c.store.zk
    return list(zk.get_children("/ledgers/underreplication/locks"))


def _rerun_converges(c: AuditCluster, writers: list[str], repair: list[str], wh: str) -> None:
    """With the faults gone, the interrupted repair run again finishes: every one of the 12
    segments copied exactly once across both runs, and no lock left."""
    for b in writers:
        c.admin(b).clear_faults()
    again = bkaudit(*repair)
    assert again.returncode == 0, failure(again)
    copies = _copies(wh)
    assert len(copies) == 12 and set(copies.values()) == {1}, copies
    assert _locks(c) == []


def _lost_bookie_repair(c: AuditCluster, wh: str, executor: str) -> tuple[list[str], list[str]]:
    """A bookie of the twelve ledgers stopped and audited, every add at the others slowed to
    300 ms: (the bookies copies go to, the ``rereplicate`` command line)."""
    b0, b1, b2, b3 = c.bookie_ids
    c.sandbox.stop_bookie(b2)
    audit = bkaudit("audit", *_zk(c), "--warehouse", wh, "--check", "lost",
                    "--executor", "local")  # fmt: skip
    assert audit.returncode == 0, failure(audit)
    writers = [b0, b1, b3]
    for b in writers:
        c.admin(b).add_fault("delay", ops=["ADD_ENTRY"], delay_ms=300)
    repair = ["rereplicate", *_zk(c), "--warehouse", wh, "--executor", executor,
              "--grace-period", "0s", "--read-timeout", "10s"]  # fmt: skip
    return writers, repair


def _drained(c: AuditCluster, wh: str, run: Running, writers: list[str], *, group: bool) -> None:
    """Ctrl-C once a copy to ``writers`` is under way: the run ends with its in-flight ledgers
    finished and recorded, the rest not started, and no lock left."""
    run.wait_for("a copy's first add", _hit(c, writers))
    run.signal(signal.SIGINT, group=group)
    proc = run.finish(timeout=180)
    line = _interrupted(
        proc,
        run,
        r"rereplicate: interrupted \(SIGINT\); rereplicate \S+: the actions of (\d+) ledgers "
        r"recorded, (\d+) not started; run rereplicate again",
        signal.SIGINT,
    )
    done, not_started = map(int, re.findall(r"(\d+) ledgers recorded, (\d+) not", line)[0])
    assert done >= 1 and not_started >= 1, line  # stopped mid-work, not before, not after
    first = _copies(wh)
    assert len(first) == done, (first, line)  # every ledger in flight finished and was written
    assert _locks(c) == []


@pytest.mark.parametrize("processes", [1, 2])
def test_rereplicate_interrupted_then_rerun_converges_copying_nothing_twice(
    cluster: AuditCluster, tmp_path: Path, processes: int
) -> None:
    """A lost bookie's ledgers are being copied slowly (each add delayed): Ctrl-C (to the
    process group, as a terminal sends it, with worker processes; to the command alone
    otherwise) stops the run with its in-flight ledgers finished and recorded, the rest not
    started, no lock left; the rerun repairs the rest, and no segment is copied twice."""
    wh = str(tmp_path / "warehouse")
    writers, repair = _lost_bookie_repair(cluster, wh, "local")
    run = Running(*repair, "--window", "1", "--ledgers-in-flight", "2",
                  "--local-processes", str(processes), "--stop-timeout", "60s")  # fmt: skip
    _drained(cluster, wh, run, writers, group=processes > 1)
    _rerun_converges(cluster, writers, repair, wh)


@pytest.mark.timeout(900)
def test_rereplicate_on_spark_interrupted_drains_its_tasks_then_rerun_converges(
    cluster: AuditCluster, tmp_path: Path
) -> None:
    """The same on the Spark executor, with a terminal's Ctrl-C reaching the driver and the
    local executors' Python workers alike: the driver's stop marker tells the two tasks to
    start no ledger, those in flight finish, the driver writes their rows and exits 130; the
    rerun (on Spark too) converges with nothing copied twice."""
    wh = str(tmp_path / "warehouse")
    writers, repair = _lost_bookie_repair(cluster, wh, "spark")
    run = Running(*repair, "--window", "1", "--ledgers-in-flight", "2", "--tasks", "2",
                  "--stop-timeout", "60s")  # fmt: skip
    _drained(cluster, wh, run, writers, group=True)
    _rerun_converges(cluster, writers, repair, wh)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_the_watch_stopped_mid_audit_records_it_as_interrupted(
    cluster: AuditCluster, tmp_path: Path, sig: int
) -> None:
    """The watch's scheduled replicas audit waits on a slow bookie: SIGINT stops the audit at
    once, records it INTERRUPTED through the spool and exits 130 with one line; SIGTERM, the
    watch's ordinary stop, records it the same and exits 0."""
    slow = cluster.bookie_ids[1]
    cluster.admin(slow).add_fault("delay", ops=["GET_LIST_OF_ENTRIES_OF_LEDGER"], delay_ms=600_000)
    wh = str(tmp_path / "warehouse")
    run = Running("watch", *_zk(cluster), "--warehouse", wh, "--every", "replicas=1h",
                  "--poll-interval", "0.5s", "--read-timeout", "900s",
                  "--spool-dir", str(tmp_path / "spool"), "--instance-id", "w1")  # fmt: skip
    run.wait_for("the audit's list-entries at the slow bookie", _hit(cluster, [slow]))
    run.signal(sig)
    proc = run.finish()
    # The take-over's lost audit may have completed before; the replicas audit never does.
    (row,) = [r for r in delta.read_rows(wh, AUDIT_RUNS) if r["check"] == "replicas"]
    assert row["status"] == RunStatus.INTERRUPTED, row
    if sig == signal.SIGTERM:
        assert proc.returncode == 0 and not error_lines(proc), failure(proc)
        assert not run.left_behind()
        return
    line = _interrupted(
        proc, run, r"watch: interrupted \(SIGINT\); run (\S+) recorded as INTERRUPTED", sig
    )
    assert row["run_id"] in line


@pytest.mark.timeout(900)
@pytest.mark.parametrize("times", [1, 2])
def test_demo_interrupted_mid_workload_leaves_no_sandbox_behind(tmp_path: Path, times: int) -> None:
    """Ctrl-C while the demo writes its workload: one line, 130, and its sandbox (a ZooKeeper
    JVM, Python bookies) stopped, also when a second Ctrl-C makes it leave at once."""
    env = {"BKAUDIT_PROGRESS": "off"}
    run = Running("demo", "--ledgers", "200", "--bookies", "4", "--dir", str(tmp_path), env=env)
    run.wait_for("the workload step", lambda: any("== [2/9]" in x for x in run.out))
    for _ in range(times):
        run.signal(signal.SIGINT)
    proc = run.finish()
    _interrupted(proc, run, r"demo: interrupted \(SIGINT\)(; .*)?", signal.SIGINT)
    assert any("zookeeper" in " ".join(cmd).lower() for cmd in run.seen), run.seen


def test_rereplicate_past_its_stop_timeout_leaves_with_its_rows_and_no_lock(
    cluster: AuditCluster, tmp_path: Path
) -> None:
    """The ledgers in flight need longer than --stop-timeout: the process leaves at the
    timeout, with one line, 130, the finished ledgers' rows written and its session closed
    (no lock left); the rerun converges and copies no segment twice."""
    wh = str(tmp_path / "warehouse")
    # ten adds one after another: three seconds a ledger, past the timeout
    writers, repair = _lost_bookie_repair(cluster, wh, "local")
    run = Running(*repair, "--window", "1", "--ledgers-in-flight", "2", "--local-processes", "1",
                  "--stop-timeout", "1s")  # fmt: skip
    run.wait_for("a copy's first add", _hit(cluster, writers))
    run.signal(signal.SIGINT)
    proc = run.finish()
    _interrupted(
        proc,
        run,
        r"rereplicate: interrupted \(SIGINT\); rereplicate \S+: the actions of \d+ ledgers "
        r"recorded; the work in flight was abandoned after --stop-timeout 1s \(its locks go "
        r"with the session\)",
        signal.SIGINT,
    )
    assert _locks(cluster) == []

    _rerun_converges(cluster, writers, repair, wh)


@pytest.mark.timeout(900)
def test_rereplicate_on_spark_past_its_stop_timeout_cancels_its_tasks(
    cluster: AuditCluster, tmp_path: Path
) -> None:
    """On Spark, ledgers in flight past --stop-timeout: the driver cancels its tasks and
    leaves with one line and 130; the tasks' locks go with their sessions (within the session
    timeout), and the rerun converges."""
    wh = str(tmp_path / "warehouse")
    writers, repair = _lost_bookie_repair(cluster, wh, "spark")
    repair += ["--zk-session-timeout", "4s"]
    run = Running(*repair, "--window", "1", "--ledgers-in-flight", "2", "--tasks", "2",
                  "--stop-timeout", "1s")  # fmt: skip
    run.wait_for("a copy's first add", _hit(cluster, writers))
    run.signal(signal.SIGINT, group=True)
    proc = run.finish(timeout=180)
    _interrupted(
        proc,
        run,
        r"rereplicate: interrupted \(SIGINT\); rereplicate \S+: the tasks in flight were "
        r"cancelled and their ledgers' actions not recorded; run rereplicate again; the work in "
        r"flight was abandoned after --stop-timeout 1s \(its locks go with the session\)",
        signal.SIGINT,
    )
    deadline = time.monotonic() + 30
    while _locks(cluster) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _locks(cluster) == []
    for b in writers:
        cluster.admin(b).clear_faults()
    again = bkaudit(*repair)
    assert again.returncode == 0, failure(again)
    copies = _copies(wh)
    assert len(copies) <= 12 and set(copies.values()) == {1}, copies
