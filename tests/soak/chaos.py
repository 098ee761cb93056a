"""The chaos soak's harness: a mixed cluster, writers, a fault scheduler, the real CLI jobs in a
loop, a timeline of what was injected, and the end-of-run invariants.

Everything random comes from one seed. The *decisions* (which fault, which target, how long,
when to kill a job) are drawn from seeded generators in a fixed order, so a seed replays the
same schedule; the interleaving with real processes on a loaded machine cannot be replayed
exactly, which is why every injected event is written to the timeline with its time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from bklib.client.operations import ClientConfig
from bklib.client.placement import PlacementPolicy
from bklib.client.pool import BookieClientPool
from bklib.client.reader import ClientContext, LedgerReader
from bklib.client.recovery import recover_ledger
from bklib.client.writer import LedgerWriter
from bklib.digest import digest_manager
from bklib.errors import BKError
from bklib.meta import paths
from bklib.meta.model import DigestType, LedgerMetadata
from bklib.meta.store import LedgerStore
from bklib.meta.underreplication import UnderReplicationManager
from bklib.quorum import write_set
from tests.bookie_helpers import BookieProcess
from tests.interop import harness
from tests.interop.harness import JavaBookie, JavaClient, JavaClientError

REPO = Path(__file__).resolve().parents[2]
ROOT = "/ledgers"
# Worker sessions of the repair job: short, so a frozen job's session expires quickly.
JOB_SESSION_TIMEOUT = 3.0
JOB_TIMEOUT = 300.0  # a job still running after this is a liveness finding


# ---- timeline ------------------------------------------------------------------------------


@dataclass
class Event:
    t: float
    kind: str
    target: str
    detail: str = ""


class Timeline:
    """Every injected event and notable observation, with seconds since the start."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.events: list[Event] = []
        self._lock = threading.Lock()

    def add(self, kind: str, target: str = "", detail: str = "") -> None:
        with self._lock:
            self.events.append(Event(time.monotonic() - self.t0, kind, target, detail))

    def counts(self) -> Counter[str]:
        with self._lock:
            return Counter(e.kind for e in self.events)

    def render(self, last: int | None = None) -> str:
        with self._lock:
            events = self.events if last is None else self.events[-last:]
            return "\n".join(
                f"  {e.t:8.2f}s {e.kind:<16} {e.target:<18} {e.detail}" for e in events
            )


# ---- cluster -------------------------------------------------------------------------------


@dataclass
class Node:
    """One bookie of the soak: its process wrapper and what the chaos did to it."""

    kind: str  # "java" or "python"
    proc: JavaBookie | BookieProcess
    state: str = "up"  # up | killed | stopped | lost
    faulted: bool = False

    @property
    def id(self) -> str:
        return self.proc.bookie_id

    def popen(self) -> subprocess.Popen[bytes] | None:
        return self.proc.proc


class SoakCluster:
    """A bklib-initialised cluster in one ZooKeeper chroot with Java and Python bookies."""

    def __init__(self, connect: str, base: Path, classpath: str, *, java: int, python: int):
        self.connect = connect
        self.base = base
        self.classpath = classpath
        self.zk = KazooClient(hosts=connect, timeout=10)
        self.zk.start(timeout=15)
        self.store = LedgerStore(self.zk, ROOT)
        self.store.init_cluster()
        UnderReplicationManager(self.zk, ROOT).ensure_layout()
        self.uri = harness.metadata_uri(connect, ROOT)
        self.nodes: list[Node] = []
        for i in range(java):
            self.nodes.append(Node("java", JavaBookie(classpath, self.uri, base / f"java{i}")))
        for i in range(python):
            extra = ["--ledgers-root", ROOT]
            self.nodes.append(Node("python", BookieProcess(connect, base / f"py{i}", extra=extra)))
        self._lock = threading.Lock()

    def start(self) -> None:
        for n in self.nodes:
            n.proc.spawn()
        self.wait_registered([n.id for n in self.nodes])

    def node(self, bookie_id: str) -> Node:
        return next(n for n in self.nodes if n.id == bookie_id)

    def registered(self, bookie_id: str) -> bool:
        return any(
            self.zk.exists(p)
            for p in (f"{ROOT}/available/{bookie_id}", f"{ROOT}/available/readonly/{bookie_id}")
        )

    def wait_registered(self, ids: list[str], timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        for bid in ids:
            while not self.registered(bid):
                n = self.node(bid)
                p = n.popen()
                if p is not None and p.poll() is not None:
                    raise RuntimeError(f"bookie {bid} exited:\n{n.proc.log_tail()}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"bookie {bid} did not register:\n{n.proc.log_tail()}")
                time.sleep(0.2)  # readiness polling

    # chaos operations (called from the scheduler thread)

    def kill9(self, n: Node) -> None:
        if n.state == "stopped":
            self._signal(n, signal.SIGCONT)  # a stopped process dies only once continued
        n.proc.kill9()
        n.state = "killed"

    def restart(self, n: Node) -> None:
        """Same port and data dir; does not wait for the registration (heal() does)."""
        if n.kind == "java":
            harness.wait_port_free(n.proc.port)
        n.proc.spawn()
        n.state = "up"

    def sigstop(self, n: Node) -> None:
        self._signal(n, signal.SIGSTOP)
        n.state = "stopped"

    def sigcont(self, n: Node) -> None:
        self._signal(n, signal.SIGCONT)
        n.state = "up"

    def _signal(self, n: Node, sig: int) -> None:
        p = n.popen()
        if p is not None and p.poll() is None:
            p.send_signal(sig)

    def set_faults(self, n: Node, rules: list[dict[str, Any]]) -> None:
        assert isinstance(n.proc, BookieProcess)
        n.proc.admin().set_faults(rules)
        n.faulted = True

    def clear_faults(self, n: Node) -> None:
        assert isinstance(n.proc, BookieProcess)
        with contextlib.suppress(Exception):  # the bookie may be down: faults die with it
            n.proc.admin().clear_faults()
        n.faulted = False

    def heal(self) -> None:
        """Every bookie but the lost one running, registered and without fault rules."""
        for n in self.nodes:
            if n.state == "stopped":
                self.sigcont(n)
            p = n.popen()
            if n.state != "lost" and (p is None or p.poll() is not None):
                self.restart(n)
        self.wait_registered([n.id for n in self.nodes if n.state != "lost"])
        for n in self.nodes:
            if n.kind == "python" and n.state != "lost":
                self.clear_faults(n)

    def logs(self, n: int = 15) -> str:
        return "\n".join(
            f"--- {x.kind} bookie {x.id} ---\n{x.proc.log_tail(n)}" for x in self.nodes
        )

    def stop(self) -> None:
        for n in self.nodes:
            if n.state == "stopped":
                self._signal(n, signal.SIGCONT)
            n.proc.stop()
        self.zk.stop()
        self.zk.close()

    @contextlib.asynccontextmanager
    async def client(self, timeout: float = 3.0) -> AsyncIterator[ClientContext]:
        config = ClientConfig(
            add_timeout=timeout,
            read_timeout=timeout,
            connect_timeout=2.0,
            reconnect_backoff_initial=0.05,
            reconnect_backoff_max=0.5,
        )
        pool = BookieClientPool(self.zk, ledgers_root=ROOT, config=config)
        try:
            yield ClientContext(self.store, pool, PlacementPolicy(), speculative_read_timeout=0.5)
        finally:
            await pool.close()


# ---- writers -------------------------------------------------------------------------------


@dataclass
class LedgerRecord:
    """What a writer knows about one of its ledgers: the acknowledged entries and their
    payloads, and how the writer ended."""

    ledger_id: int
    writer: str
    tag: str  # payloads are derived from it, so unacknowledged entries can be checked too
    write_quorum: int
    acked: dict[int, bytes] = field(default_factory=dict)
    closed_at: int | None = None  # lastEntryId of a close the writer saw succeed
    end: str = "writing"

    def payload(self, entry_id: int) -> bytes:
        return expected_payload(self.tag, entry_id)


def expected_payload(tag: str, entry_id: int) -> bytes:
    head = f"{tag}:{entry_id}:".encode()
    return head + bytes((entry_id * 31 + j) % 251 for j in range(40 + entry_id % 60))


class Ledgers:
    """The writers' records, shared across threads."""

    def __init__(self) -> None:
        self.records: dict[int, LedgerRecord] = {}
        self.lock = threading.Lock()

    def add(self, rec: LedgerRecord) -> None:
        with self.lock:
            self.records[rec.ledger_id] = rec

    def ack(self, rec: LedgerRecord, entry_id: int) -> None:
        with self.lock:
            rec.acked[entry_id] = rec.payload(entry_id)

    def acked_total(self, writer: str | None = None) -> int:
        with self.lock:
            return sum(len(r.acked) for r in self.records.values() if writer in (None, r.writer))


class PythonWriters(threading.Thread):
    """``n`` bklib writers on one event loop, each creating ledgers one after another: random
    E/WQ/AQ (AQ >= 2, so one lost bookie can never hold the only copy of an acknowledged
    entry), pipelined adds, then a close or -- a quarter of the time -- an abort that leaves
    the ledger OPEN like a crashed writer."""

    def __init__(self, cluster: SoakCluster, ledgers: Ledgers, tl: Timeline, seed: int, n: int):
        super().__init__(name="py-writers", daemon=True)
        self.cluster, self.ledgers, self.tl = cluster, ledgers, tl
        self.seed, self.n = seed, n
        self.stop_flag = threading.Event()
        self.errors: list[str] = []

    def run(self) -> None:
        try:
            asyncio.run(self._main())
        except Exception as exc:  # reported by the test
            self.errors.append(f"python writers crashed: {exc!r}")

    async def _main(self) -> None:
        async with self.cluster.client() as ctx:
            await asyncio.gather(*(self._writer(ctx, k) for k in range(self.n)))

    async def _writer(self, ctx: ClientContext, k: int) -> None:
        rng = random.Random(self.seed * 1000 + k)
        count = 0
        while not self.stop_flag.is_set():
            e = rng.choice([2, 3, 3, 4])
            wq = rng.randint(2, e)
            aq = rng.randint(2, wq)
            n = rng.randint(10, 120)
            leave_open = rng.random() < 0.25
            tag = f"py{self.seed}-{k}-{count}"
            count += 1
            try:
                w = await LedgerWriter.create(
                    ctx, ensemble_size=e, write_quorum=wq, ack_quorum=aq, password=tag.encode()
                )
            except BKError as exc:
                self.tl.add("writer_note", f"py{k}", f"create failed: {type(exc).__name__}")
                await asyncio.sleep(1.0)
                continue
            rec = LedgerRecord(w.ledger_id, "python", tag, wq)
            self.ledgers.add(rec)
            await self._fill(w, rec, n, rng)
            if leave_open:
                await w.abort()
                rec.end = "abandoned open"
            else:
                try:
                    md = await w.close()
                    rec.closed_at, rec.end = md.last_entry_id, f"closed@{md.last_entry_id}"
                except BKError as exc:
                    rec.end = f"close failed: {type(exc).__name__}"

    async def _fill(self, w: LedgerWriter, rec: LedgerRecord, n: int, rng: random.Random) -> None:
        pending: list[asyncio.Future[int]] = []

        def done(expected: int) -> Callable[[asyncio.Future[int]], None]:
            def cb(f: asyncio.Future[int]) -> None:
                if not f.cancelled() and f.exception() is None:
                    if f.result() != expected:
                        self.errors.append(
                            f"ledger {rec.ledger_id}: ack {f.result()} != {expected}"
                        )
                    self.ledgers.ack(rec, f.result())

            return cb

        for _ in range(n):
            if self.stop_flag.is_set():
                break
            eid = w.last_add_pushed + 1
            try:
                f = w.add_async(rec.payload(eid))
            except BKError as exc:
                rec.end = f"refused: {type(exc).__name__}"
                break
            f.add_done_callback(done(eid))
            pending.append(f)
            await asyncio.sleep(rng.uniform(0.005, 0.05))
            while sum(not p.done() for p in pending) >= 8:
                await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        await asyncio.gather(*pending, return_exceptions=True)


class JavaWriter(threading.Thread):
    """The Java BookKeeper 4.17 client (interop driver) writing ledgers one add at a time, so
    each acknowledgement is known exactly; some ledgers are left open in the driver."""

    def __init__(
        self, java: JavaClient, cluster: SoakCluster, ledgers: Ledgers, tl: Timeline, seed: int
    ):
        super().__init__(name="java-writer", daemon=True)
        self.java, self.cluster, self.ledgers, self.tl = java, cluster, ledgers, tl
        self.rng = random.Random(seed * 7919)
        self.seed = seed
        self.stop_flag = threading.Event()
        self.errors: list[str] = []

    def run(self) -> None:
        try:
            self._main()
        except Exception as exc:
            self.errors.append(f"java writer crashed: {exc!r}")

    def _main(self) -> None:
        rng, k = self.rng, 0
        while not self.stop_flag.is_set():
            e = rng.choice([3, 3, 4])
            wq = rng.randint(2, e)
            aq = rng.randint(2, wq)
            n = rng.randint(10, 80)
            leave_open = rng.random() < 0.25
            tag = f"jv{self.seed}-{k}"
            k += 1
            try:
                lid = self.java.write(
                    self.cluster.uri,
                    [expected_payload(tag, 0)],
                    ensemble=e,
                    write_quorum=wq,
                    ack_quorum=aq,
                    close=False,
                )
            except JavaClientError as exc:
                self.tl.add("writer_note", "java", f"create/add 0 failed: {exc.name}")
                time.sleep(1.0)
                continue
            rec = LedgerRecord(lid, "java", tag, wq)
            self.ledgers.add(rec)
            self.ledgers.ack(rec, 0)
            for i in range(1, n):
                if self.stop_flag.is_set():
                    break
                try:
                    reply = self.java.add(lid, [rec.payload(i)])
                except JavaClientError as exc:
                    rec.end = f"add {i} failed: {exc.name}"
                    break
                if int(reply["lastEntryId"]) != i:
                    self.errors.append(f"java ledger {lid}: add {i} acked as {reply}")
                    break
                self.ledgers.ack(rec, i)
                time.sleep(rng.uniform(0.005, 0.05))
            if leave_open or rec.end != "writing":
                rec.end = "left open" if rec.end == "writing" else rec.end
                continue
            try:
                self.java.call("close", ledgerId=lid)
                rec.closed_at = max(rec.acked)
                rec.end = f"closed@{rec.closed_at}"
            except JavaClientError as exc:
                rec.end = f"close failed: {exc.name}"


# ---- the real CLI jobs ---------------------------------------------------------------------


def cli_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "jobs.cli", *args]


def audit_args(connect: str, warehouse: str, check: str) -> list[str]:
    return [
        "audit",
        "--zk",
        connect,
        "--warehouse",
        warehouse,
        "--check",
        check,
        "--executor",
        "local",
        "--read-timeout",
        "2",
        "--connect-timeout",
        "2",
    ]


def rereplicate_args(connect: str, warehouse: str, *extra: str) -> list[str]:
    return [
        "rereplicate",
        "--zk",
        connect,
        "--warehouse",
        warehouse,
        "--executor",
        "local",
        "--read-timeout",
        "2",
        "--zk-session-timeout",
        f"{JOB_SESSION_TIMEOUT:g}s",
        *extra,
    ]


class Job:
    """One real ``bkaudit`` process in its own process group (so SIGKILL and SIGSTOP reach
    the spawned local-executor workers too); output appended to ``log``."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.args = args
        self.log = log
        self.started = time.monotonic()
        with open(log, "ab") as out:
            out.write(f"\n$ bkaudit {' '.join(args)}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                cli_command(*args),
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    @property
    def age(self) -> float:
        return time.monotonic() - self.started

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal_group(self, sig: int) -> bool:
        """Signal the whole group; False if the job had already ended."""
        if not self.alive():
            return False
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            return False
        return True

    def wait(self, timeout: float = JOB_TIMEOUT) -> int | None:
        """The exit status, or None (group killed) when it ran past ``timeout``."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.signal_group(signal.SIGKILL)
            self.proc.wait()
            return None

    def kill_group(self) -> None:
        """SIGKILL the group, then reap the leader; workers orphaned by it die too."""
        self.signal_group(signal.SIGKILL)
        self.proc.wait()


def run_job(args: list[str], log: Path, timeout: float = JOB_TIMEOUT) -> int | None:
    return Job(args, log).wait(timeout)


def lock_owners(zk: KazooClient) -> dict[str, int]:
    """Under-replication lock znodes and the session that owns each."""
    base = paths.join(paths.ur_base(ROOT), "locks")
    out: dict[str, int] = {}
    try:
        children = zk.get_children(base)
    except NoNodeError:
        return out
    for c in children:
        stat = zk.exists(paths.join(base, c))
        if stat is not None:
            out[c] = stat.ephemeralOwner
    return out


class JobLoop(threading.Thread):
    """``audit`` then ``rereplicate`` (local executor) in a loop as real CLI processes. Each
    rereplicate may be, by a seeded draw, SIGKILLed as a process group at a random moment, or
    frozen (SIGSTOP) past its ZooKeeper session timeout so its sessions expire, then continued."""

    def __init__(
        self,
        cluster: SoakCluster,
        warehouse: str,
        tl: Timeline,
        seed: int,
        log: Path,
        *,
        p_kill: float = 0.35,
        p_expire: float = 0.25,
    ) -> None:
        super().__init__(name="job-loop", daemon=True)
        self.cluster, self.warehouse, self.tl, self.log = cluster, warehouse, tl, log
        self.rng = random.Random(seed * 104729 + 1)
        self.p_kill, self.p_expire = p_kill, p_expire
        self.stop_flag = threading.Event()
        self.codes: Counter[str] = Counter()
        self.errors: list[str] = []

    def run(self) -> None:
        try:
            self._main()
        except Exception as exc:
            self.errors.append(f"job loop crashed: {exc!r}")

    def _main(self) -> None:
        c, rng, i = self.cluster, self.rng, 0
        while not self.stop_flag.is_set():
            check = "replicas" if i % 2 else "lost"
            i += 1
            code = run_job(audit_args(c.connect, self.warehouse, check), self.log)
            self.codes[f"audit {check} exit {code}"] += 1
            if code is None:
                self.errors.append(f"audit --check {check} ran past {JOB_TIMEOUT:.0f}s")
            if self.stop_flag.is_set():
                break
            # A rereplicate under chaos runs ~1-4 s; kill points spread over that span.
            draw, delay = rng.random(), rng.uniform(0.3, 3.5)
            hold = JOB_SESSION_TIMEOUT + rng.uniform(3.0, 6.0)
            job = Job(rereplicate_args(c.connect, self.warehouse, "--grace-period", "5s"), self.log)
            if draw < self.p_kill:
                self._kill_at(job, delay)
            elif draw < self.p_kill + self.p_expire:
                self._expire_at(job, delay, hold)
            code = job.wait()
            self.codes[f"rereplicate exit {code}"] += 1
            if code is None:
                self.errors.append(f"rereplicate ran past {JOB_TIMEOUT:.0f}s")

    def _kill_at(self, job: Job, delay: float) -> None:
        while job.alive() and job.age < delay:
            time.sleep(0.02)
        if job.signal_group(signal.SIGKILL):
            job.proc.wait()
            self.tl.add("job_kill", "rereplicate", f"SIGKILL group at {job.age:.2f}s")
        else:
            self.tl.add("job_kill_missed", "rereplicate", f"ended before {delay:.2f}s")

    def _expire_at(self, job: Job, delay: float, hold: float) -> None:
        while job.alive() and job.age < delay:
            time.sleep(0.02)
        before = lock_owners(self.cluster.zk)
        if not job.signal_group(signal.SIGSTOP):
            self.tl.add("job_expire_missed", "rereplicate", f"ended before {delay:.2f}s")
            return
        time.sleep(hold)
        after = lock_owners(self.cluster.zk)
        gone = [k for k, s in before.items() if after.get(k) != s]
        job.signal_group(signal.SIGCONT)
        self.tl.add(
            "job_expire",
            "rereplicate",
            f"SIGSTOP at {delay:.2f}s for {hold:.1f}s (> {JOB_SESSION_TIMEOUT:g}s session); "
            f"locks held then {len(before)}, released by expiry {len(gone)}",
        )


# ---- bookie chaos --------------------------------------------------------------------------


FAULT_KINDS = ("stall", "unknown_reads", "fail_adds", "drop_replies", "slow_fence")
UNKNOWN = ("EIO", "EUA", "EUNKNOWNLEDGERSTATE")  # never ENOENTRY: that would be a lying bookie


def fault_rules(kind: str, rng: random.Random) -> list[dict[str, Any]]:
    if kind == "stall":
        return [
            {"action": "delay", "delay_ms": rng.randint(200, 2500), "after": rng.random() < 0.5}
        ]
    if kind == "unknown_reads":
        ops = ["READ_ENTRY", "READ_LAC", "GET_LIST_OF_ENTRIES_OF_LEDGER"]
        return [{"action": "fail", "ops": ops, "status": rng.choice(UNKNOWN)}]
    if kind == "fail_adds":
        # EIO, not EUA: a writer takes EUA as unrecoverable and closes (as BookKeeper does).
        return [{"action": "fail", "op": "ADD_ENTRY", "status": "EIO"}]
    if kind == "drop_replies":
        return [{"action": "drop", "after": rng.random() < 0.5}]
    return [{"action": "delay", "op": "READ_ENTRY", "fence": True, "delay_ms": 1500}]


class BookieChaos:
    """Random kill -9 / restart, SIGSTOP / SIGCONT and fault rules on the bookies, at most
    ``max_down`` bookies down at once (the lost one aside), every effect undone after a drawn
    duration; one Python bookie is lost for good at ``lose_at`` seconds."""

    def __init__(
        self, cluster: SoakCluster, tl: Timeline, seed: int, *, lose_at: float, max_down: int = 2
    ) -> None:
        self.cluster, self.tl = cluster, tl
        self.rng = random.Random(seed)
        self.lose_at = lose_at
        self.max_down = max_down
        self.undo: list[tuple[float, str, Node]] = []
        self.lost: Node | None = None
        self.faults: Counter[str] = Counter()

    def run(self, duration: float, should_stop: Callable[[], bool]) -> None:
        start = time.monotonic()
        next_at = start + self.rng.expovariate(1 / 2.5)
        while time.monotonic() - start < duration and not should_stop():
            now = time.monotonic()
            for item in sorted(x for x in self.undo if x[0] <= now):
                self.undo.remove(item)
                self._undo(item[1], item[2])
            if self.lost is None and now - start >= self.lose_at:
                self._lose()
            if now >= next_at:
                self._step()
                next_at = now + self.rng.expovariate(1 / 2.5)
            time.sleep(0.05)

    def finish(self) -> None:
        """Undo whatever is still pending (heal() then restarts and clears the rest)."""
        for _, action, node in sorted(self.undo, key=lambda x: x[0]):
            self._undo(action, node)
        self.undo.clear()

    def _down(self) -> int:
        return sum(n.state in ("killed", "stopped") for n in self.cluster.nodes)

    def _step(self) -> None:
        rng, c = self.rng, self.cluster
        # Drawn every step in the same order, whatever the cluster's state: a seed replays
        # the same decisions.
        kind = rng.choices(["kill9", "sigstop", "fault"], weights=[2, 2, 4])[0]
        pick, duration = rng.random(), rng.uniform(1.0, 9.0)
        fault = rng.choice(FAULT_KINDS)
        rules = fault_rules(fault, rng)
        if kind == "fault":
            cands = [n for n in c.nodes if n.kind == "python" and n.state == "up" and not n.faulted]
        else:
            cands = [n for n in c.nodes if n.state == "up" and not n.faulted]
            if self._down() >= self.max_down:
                cands = []
        if not cands:
            self.tl.add("chaos_skip", kind, "no eligible bookie")
            return
        n = cands[int(pick * len(cands))]
        if kind == "kill9":
            c.kill9(n)
            self.undo.append((time.monotonic() + duration, "restart", n))
            self.tl.add("bookie_kill9", n.id, f"{n.kind}, restart in {duration:.1f}s")
        elif kind == "sigstop":
            c.sigstop(n)
            self.undo.append((time.monotonic() + duration, "sigcont", n))
            self.tl.add("bookie_sigstop", n.id, f"{n.kind}, SIGCONT in {duration:.1f}s")
        else:
            try:
                c.set_faults(n, rules)
            except Exception as exc:
                self.tl.add("chaos_skip", n.id, f"fault not set: {exc}")
                return
            self.faults[fault] += 1
            self.undo.append((time.monotonic() + duration, "clear", n))
            self.tl.add(f"fault_{fault}", n.id, f"{rules} for {duration:.1f}s")

    def _undo(self, action: str, n: Node) -> None:
        c = self.cluster
        if n.state == "lost":
            return
        if action == "restart" and n.state == "killed":
            c.restart(n)
            self.tl.add("bookie_restart", n.id, n.kind)
        elif action == "sigcont" and n.state == "stopped":
            c.sigcont(n)
            self.tl.add("bookie_sigcont", n.id, n.kind)
        elif action == "clear":
            c.clear_faults(n)
            self.tl.add("fault_clear", n.id)

    def _lose(self) -> None:
        cands = [n for n in self.cluster.nodes if n.kind == "python" and n.state == "up"]
        if not cands:
            return
        n = cands[self.rng.randrange(len(cands))]
        self.cluster.clear_faults(n)
        self.cluster.kill9(n)
        n.state = "lost"
        self.lost = n
        self.undo = [u for u in self.undo if u[2] is not n]
        self.tl.add("bookie_lost", n.id, "kill -9, never restarted")


# ---- convergence and invariants ------------------------------------------------------------


def converge(
    cluster: SoakCluster,
    warehouse: str,
    log: Path,
    gone: set[str],
    tl: Timeline,
    rounds: int = 6,  # a healthy cluster converges in 1-3
) -> list[str]:
    """Audit + rereplicate (grace 0) until no metadata names a gone bookie, then recover every
    ledger still open (its writer is dead), then replicas audits + repairs until the audit
    finds nothing and no under-replication mark is left. Returns problems (a run that never
    converged).

    A mark the chaos left (a job marked a ledger whose bookie's session had lapsed, then
    waited out the grace period on the open ledger) is cleared only by a rereplicate that
    verifies it on the healed cluster (``LedgerRequest.verify_mark``). So a clean audit alone
    does not end the loop: the marks must be gone too."""
    problems: list[str] = []
    for r in range(rounds):
        named = ledgers_naming(cluster.store, gone)
        if not named:
            break
        run_job(audit_args(cluster.connect, warehouse, "lost"), log)
        code = run_job(rereplicate_args(cluster.connect, warehouse, "--grace-period", "0s"), log)
        tl.add(
            "converge", "lost", f"round {r}: {len(named)} ledgers name {sorted(gone)}; exit {code}"
        )
    else:
        problems.append(f"ledgers still name gone bookies: {ledgers_naming(cluster.store, gone)}")
    asyncio.run(recover_open(cluster, tl))
    for r in range(rounds):
        run_job(audit_args(cluster.connect, warehouse, "replicas"), log)
        listing = subprocess.run(
            cli_command("listunderreplicated", "--warehouse", warehouse),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        marked = marked_ledgers(cluster.zk)
        tl.add(
            "converge",
            "replicas",
            f"round {r}: listunderreplicated exit {listing.returncode}; marked {marked}",
        )
        if listing.returncode == 0 and not marked:
            break
        run_job(rereplicate_args(cluster.connect, warehouse, "--grace-period", "0s"), log)
    else:
        problems.append(
            f"replicas audit never came back clean with no mark left in {rounds} rounds"
        )
    return problems


def marked_ledgers(zk: KazooClient) -> list[int]:
    """The ledgers BookKeeper's under-replication marks name."""
    return [m.ledger_id for m in UnderReplicationManager(zk, ROOT).list_underreplicated()]


def ledgers_naming(store: LedgerStore, gone: set[str]) -> list[int]:
    out = []
    for lid in store.list_ledger_ids():
        with contextlib.suppress(BKError):
            if store.read_ledger(lid).value.bookies() & gone:
                out.append(lid)
    return out


async def recover_open(cluster: SoakCluster, tl: Timeline) -> None:
    """Every writer is gone by now: recover (fence and close) each ledger still open, as a
    reader opening it with recovery would."""
    async with cluster.client() as ctx:
        for lid in list(cluster.store.list_ledger_ids()):
            if cluster.store.read_ledger(lid).value.is_closed:
                continue
            for attempt in range(5):
                try:
                    md = await recover_ledger(ctx, lid)
                    tl.add("final_recover", str(lid), f"closed@{md.last_entry_id}")
                    break
                except BKError as exc:
                    tl.add("final_recover", str(lid), f"attempt {attempt}: {exc!r}")
                    await asyncio.sleep(1.0)


@dataclass
class CheckStats:
    ledgers: int = 0
    closed: int = 0
    entries: int = 0
    acked: int = 0
    replica_reads: int = 0
    identical_neighbours: int = 0


async def check_invariants(
    cluster: SoakCluster, ledgers: Ledgers, gone: set[str]
) -> tuple[list[str], CheckStats]:
    """The end-of-run invariants over every ledger in ZooKeeper:

    1. every acknowledged entry is readable with its digest and the writer's payload (and
       every entry up to lastEntryId carries a payload its writer produced);
    2. no closed ledger ends below an acknowledged entry, and a close the writer saw succeed
       is the stored end;
    3. no metadata names a gone bookie;
    4. every entry of a closed ledger is on >= WQ bookies of its write set (digest-verified);
    5. segments have strictly increasing first ids (identical neighbouring ensembles are
       counted, see :func:`identical_neighbours`);
    6. no under-replication lock or mark is left (nothing runs, nothing is under-replicated).
    """
    v: list[str] = []
    st = CheckStats()
    store = cluster.store
    with ledgers.lock:
        records = dict(ledgers.records)
    ids = list(store.list_ledger_ids())
    missing = set(records) - set(ids)
    v += [f"ledger {lid} ({records[lid].writer}) vanished from ZooKeeper" for lid in missing]
    sem = asyncio.Semaphore(48)
    async with cluster.client(timeout=5.0) as ctx:
        for lid in ids:
            st.ledgers += 1
            md = store.read_ledger(lid).value
            rec = records.get(lid)
            v += structure_violations(md, gone)
            st.identical_neighbours += len(identical_neighbours(md))
            if not md.is_closed:
                v.append(f"ledger {lid}: still {md.state.name} after the final recovery")
                continue
            st.closed += 1
            last = md.last_entry_id
            if rec is not None:
                st.acked += len(rec.acked)
                if rec.acked and max(rec.acked) > last:
                    v.append(
                        f"ledger {lid} ({rec.writer}): TRUNCATED, lastEntryId {last} < "
                        f"acknowledged entry {max(rec.acked)}"
                    )
                if rec.closed_at is not None and rec.closed_at != last:
                    v.append(f"ledger {lid}: writer closed at {rec.closed_at}, stored {last}")
            if last < 0:
                continue
            st.entries += last + 1
            v += await read_all(ctx, md, rec)
            v += await replica_violations(ctx, md, sem, st)
    v += orphan_violations(cluster.zk, store)
    return v, st


def structure_violations(md: LedgerMetadata, gone: set[str]) -> list[str]:
    v = []
    firsts = [s.first_entry_id for s in md.segments]
    if firsts != sorted(set(firsts)):
        v.append(f"ledger {md.ledger_id}: duplicate or unordered segment keys {firsts}")
    named = md.bookies() & gone
    if named:
        v.append(f"ledger {md.ledger_id}: metadata still names gone bookie(s) {sorted(named)}")
    return v


def identical_neighbours(md: LedgerMetadata) -> list[int]:
    """First ids of segments whose ensemble equals the previous segment's. Not a violation by
    itself: a repair replacing a bookie in place may pick the bookie the writer's next
    ensemble already used. A segment *appended* with its predecessor's ensemble would be (the
    kill campaign checks that)."""
    return [
        b.first_entry_id
        for a, b in zip(md.segments, md.segments[1:], strict=False)
        if a.ensemble == b.ensemble
    ]


async def read_all(ctx: ClientContext, md: LedgerMetadata, rec: LedgerRecord | None) -> list[str]:
    lid, last = md.ledger_id, md.last_entry_id
    try:
        reader = await LedgerReader.open(ctx, lid)
        entries = await reader.read_entries(0, last)
    except BKError as exc:
        acked = sorted(rec.acked) if rec else []
        return [f"ledger {lid}: entries 0..{last} not readable ({len(acked)} acked): {exc!r}"]
    v = []
    got = {e.entry_id: e.payload for e in entries}
    if sorted(got) != list(range(last + 1)):
        v.append(f"ledger {lid}: read returned entries {sorted(got)[:5]}... for 0..{last}")
    if rec is not None:
        for eid, data in got.items():
            if data != rec.payload(eid):
                kind = "acknowledged" if eid in rec.acked else "unacknowledged"
                v.append(f"ledger {lid}: {kind} entry {eid} has a foreign payload")
        lost = sorted(set(rec.acked) - set(got))
        if lost:
            v.append(f"ledger {lid}: acknowledged entries LOST: {lost[:20]}")
    return v


async def replica_violations(
    ctx: ClientContext, md: LedgerMetadata, sem: asyncio.Semaphore, st: CheckStats
) -> list[str]:
    lid = md.ledger_id
    dm = digest_manager(lid, md.digest_type or DigestType.CRC32C, md.password or b"")

    async def stored(bookie: str, eid: int) -> bool:
        async with sem:
            for _ in range(3):  # a just-restarted bookie may refuse a first connection
                try:
                    res = await ctx.pool.read(bookie, lid, eid)
                    dm.verify_entry(res.body, eid)
                    return True
                except BKError:
                    await asyncio.sleep(0.2)
            return False

    checks = []
    for eid in range(md.last_entry_id + 1):
        ens = md.ensemble_for(eid)
        for i in write_set(eid, md.ensemble_size, md.write_quorum):
            checks.append((eid, ens[i], stored(ens[i], eid)))
    results = await asyncio.gather(*(c for _, _, c in checks))
    st.replica_reads += len(checks)
    copies: Counter[int] = Counter()
    absent: dict[int, list[str]] = {}
    for (eid, bookie, _), ok in zip(checks, results, strict=True):
        if ok:
            copies[eid] += 1
        else:
            absent.setdefault(eid, []).append(bookie)
    short = [e for e in range(md.last_entry_id + 1) if copies[e] < md.write_quorum]
    if not short:
        return []
    e = short[0]
    return [
        f"ledger {lid}: {len(short)} entries below WQ={md.write_quorum}, e.g. entry {e} on "
        f"{copies[e]} bookies (not on {absent.get(e)})"
    ]


def orphan_violations(zk: KazooClient, store: LedgerStore) -> list[str]:
    """With every job finished (and killed jobs' sessions long expired) no lock may remain;
    after :func:`converge`'s clean replicas audit and its rereplicates' verification of every
    mark, a mark that remains is orphaned."""
    urm = UnderReplicationManager(zk, ROOT)
    v = [f"orphaned lock {name} (session 0x{owner:x})" for name, owner in lock_owners(zk).items()]
    for mark in urm.list_underreplicated():
        try:
            named = store.read_ledger(mark.ledger_id).value.bookies()
        except BKError:
            named = set()
        still = sorted(set(mark.missing_replicas) & named)
        v.append(
            f"orphaned mark ledger {mark.ledger_id}: missing {list(mark.missing_replicas)}, "
            f"metadata names {still or 'none of them'}"
        )
    return v


def describe_ledgers(cluster: SoakCluster, ledgers: Ledgers, violations: list[str]) -> str:
    """Metadata and writer record of every ledger a violation names (for the failure report)."""
    ids = sorted({int(m) for v in violations for m in re.findall(r"ledger (\d+)", v)})
    out = []
    for lid in ids:
        rec = ledgers.records.get(lid)
        try:
            md = cluster.store.read_ledger(lid).value
            segs = [(s.first_entry_id, list(s.ensemble)) for s in md.segments]
            desc = (
                f"{md.state.name} last {md.last_entry_id} E/WQ/AQ "
                f"{md.ensemble_size}/{md.write_quorum}/{md.ack_quorum} segments {segs}"
            )
        except BKError as exc:
            desc = repr(exc)
        who = f"{rec.writer} writer, {len(rec.acked)} acked, {rec.end}" if rec else "no record"
        out.append(f"  ledger {lid}: {desc}; {who}")
    return "\n".join(out)


def wait_locks_gone(zk: KazooClient, timeout: float = 3 * JOB_SESSION_TIMEOUT + 10) -> None:
    """Killed jobs' locks go with their sessions; give them the session timeout."""
    deadline = time.monotonic() + timeout
    while lock_owners(zk) and time.monotonic() < deadline:
        time.sleep(0.5)
