"""Randomized schedules: a writer, faulty bookies and concurrent recoverers, checked against the
protocol's invariants.

Each schedule (seeded, reproducible) creates a fresh ledger with random E/WQ/AQ on the shared
cluster, runs a writer adding entries while bookies stall, drop or fail requests (fault
injection, scoped to the schedule's ledger), occasionally crash (kill -9) and restart, and
starts one to three recoverers at random moments while the old writer is still alive. The
writer ends by closing or by vanishing (abort). Then faults are cleared, a final recovery makes
sure the ledger is CLOSED, and the invariants are checked:

1. every entry acknowledged to the writer is <= the closed lastEntryId (and acks were
   delivered in order: 0..k without gaps);
2. every entry <= lastEntryId is readable with a valid digest, with the payload the writer
   gave it;
3. every entry <= lastEntryId is stored (valid digest) on >= AQ bookies of its write set;

and every recoverer or writer close that succeeded reported that same lastEntryId.

``--schedules N`` runs N schedules (default 60); ``BKAUDIT_SCHEDULE_SEED`` changes the seed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
from collections import Counter
from dataclasses import dataclass, field

import pytest

from bklib.client.reader import ClientContext, LedgerReader
from bklib.client.recovery import recover_ledger
from bklib.client.writer import LedgerWriter
from bklib.errors import BKError
from bklib.meta.model import LedgerMetadata
from bklib.quorum import write_set
from tests.integration.conftest import Cluster, run, stored_on

pytestmark = pytest.mark.integration

SEED = int(os.environ.get("BKAUDIT_SCHEDULE_SEED", "20261122"))
ADD_TIMEOUT = 0.25
READ_TIMEOUT = 0.25
SPECULATIVE = 0.08
RESTART_EVERY = 40  # about one schedule in this many kills and restarts a bookie process


def payload(seed: int, e: int) -> bytes:
    return b"s%d-e%d-" % (seed, e) + bytes([e % 251]) * (e % 7)


@dataclass
class Outcome:
    seed: int
    ledger_id: int = -1
    acked: list[int] = field(default_factory=list)
    writer_end: str = ""
    recoveries: list[str] = field(default_factory=list)
    final: LedgerMetadata | None = None
    violations: list[str] = field(default_factory=list)
    restarted: bool = False
    ensemble_changes: int = 0
    phase_times: list[float] = field(default_factory=list)


def fault_rules(rng: random.Random, lid: int, n: int) -> list[tuple[float, str, dict]]:
    """(time offset s, action, rule) events for one bookie."""
    events = []
    for _ in range(rng.randint(1, 2)):
        t = 0.0 if rng.random() < 0.4 else rng.uniform(0, 0.2)
        kind = rng.choices(
            ["stall", "drop_adds", "fail_adds", "fail_reads", "drop_reads", "silent", "slow_fence"],
            weights=[2, 3, 3, 1, 1, 2, 1],
        )[0]
        first = rng.randint(0, n // 2)
        last = first + rng.randint(0, 8)
        if kind == "stall":
            rule = {"ledger": lid, "delay_ms": rng.randint(20, 500), "after": rng.random() < 0.5}
            events.append((t, "delay", rule))
        elif kind == "drop_adds":
            rule = {"ledger": lid, "op": "ADD_ENTRY", "entries": [first, last]}
            if rng.random() < 0.5:
                rule["count"] = rng.randint(1, 3)
            events.append((t, "drop", rule))
        elif kind == "fail_adds":
            rule = {"ledger": lid, "op": "ADD_ENTRY", "entries": [first, last], "status": "EIO"}
            events.append((t, "fail", rule))
        elif kind == "fail_reads":
            rule = {"ledger": lid, "op": "READ_ENTRY", "status": rng.choice(["EIO", "EUA"])}
            if rng.random() < 0.5:
                rule["fence"] = True
            events.append((t, "fail", rule))
        elif kind == "drop_reads":
            events.append((t, "drop", {"ledger": lid, "op": "READ_ENTRY"}))
        elif kind == "silent":
            events.append((t, "drop", {"ledger": lid}))  # a crashed/partitioned bookie
        else:
            rule = {"ledger": lid, "op": "READ_ENTRY", "fence": True}
            events.append((t, "delay", {**rule, "delay_ms": rng.randint(50, 400)}))
    return events


async def run_schedule(cluster: Cluster, index: int) -> Outcome:
    seed = SEED + index
    rng = random.Random(seed)
    out = Outcome(seed)
    e = rng.randint(2, 4)
    wq = rng.randint(2, e) if rng.random() < 0.85 else 1
    aq = rng.randint(1, wq)
    n = rng.randint(4, 30)
    opts = {
        "add_timeout": ADD_TIMEOUT,
        "read_timeout": READ_TIMEOUT,
        "speculative": SPECULATIVE,
        # Faults last the whole schedule: without a limit a writer or recoverer could keep
        # replacing bookies that keep failing until the faults are cleared.
        "max_ensemble_changes": 6,
    }
    async with contextlib.AsyncExitStack() as stack:
        wctx = await stack.enter_async_context(cluster.client(**opts))
        w = await LedgerWriter.create(
            wctx, ensemble_size=e, write_quorum=wq, ack_quorum=aq, password=b"p%d" % seed
        )
        lid = out.ledger_id = w.ledger_id
        loop = asyncio.get_running_loop()
        tasks: list[asyncio.Future] = []

        # Faults on ensemble bookies mostly, sometimes on a spare (hit after a change).
        for b in cluster.bookie_ids:
            p = 0.6 if b in w.ensemble else 0.15
            if rng.random() < p:
                for t, action, rule in fault_rules(rng, lid, n):
                    tasks.append(asyncio.ensure_future(apply_fault(cluster, b, t, action, rule)))

        victim: str | None = None
        if index % RESTART_EVERY == RESTART_EVERY - 1:
            victim = rng.choice(w.ensemble)
            out.restarted = True
            tasks.append(asyncio.ensure_future(crash_and_restart(cluster, victim, rng)))

        async def writer() -> None:
            pending: list[asyncio.Future[int]] = []
            try:
                for i in range(n):
                    try:
                        f = w.add_async(payload(seed, i))
                    except BKError as exc:
                        out.writer_end = f"refused:{type(exc).__name__}"
                        break
                    f.add_done_callback(
                        lambda f: (
                            out.acked.append(f.result())
                            if not f.cancelled() and f.exception() is None
                            else None
                        )
                    )
                    pending.append(f)
                    if rng.random() < 0.4:
                        await asyncio.sleep(rng.uniform(0, 0.03))
                    while len([p for p in pending if not p.done()]) >= 8:
                        await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                await asyncio.gather(*pending, return_exceptions=True)
            finally:
                if rng.random() < 0.5:
                    try:
                        md = await w.close()
                        out.writer_end += f" close:ok@{md.last_entry_id}"
                    except BKError as exc:
                        out.writer_end += f" close:{type(exc).__name__}"
                else:
                    await w.abort()
                    out.writer_end += " abort"
                out.ensemble_changes = w.pipeline.ensemble_changes

        async def recoverer(k: int) -> None:
            # Mostly while the writer is busy; sometimes late, after faults forced ensemble
            # changes.
            late = rng.random() < 0.3
            await asyncio.sleep(rng.uniform(0.3, 0.6) if late else rng.uniform(0.02, 0.3))
            async with cluster.client(**opts) as rctx:
                try:
                    md = await recover_ledger(rctx, lid)
                    out.recoveries.append(f"r{k}:closed@{md.last_entry_id}")
                except BKError as exc:
                    out.recoveries.append(f"r{k}:{type(exc).__name__}")

        tasks.append(asyncio.ensure_future(writer()))
        for k in range(rng.choice([1, 1, 2, 2, 3])):
            tasks.append(asyncio.ensure_future(recoverer(k)))
        t0 = time.monotonic()
        _, stuck = await asyncio.wait(tasks, timeout=60)
        out.phase_times.append(time.monotonic() - t0)
        if stuck:
            out.violations.append(f"schedule did not finish within 60 s: {stuck}")
            if os.environ.get("BKAUDIT_SCHEDULE_VERBOSE"):
                for t in asyncio.all_tasks():
                    t.print_stack()
            for t in stuck:
                t.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t
        # Heal the cluster for this ledger and make sure it ends CLOSED.
        t0 = time.monotonic()
        await loop.run_in_executor(None, heal, cluster, victim)
        out.phase_times.append(time.monotonic() - t0)
        t0 = time.monotonic()
        async with cluster.client(add_timeout=3.0, read_timeout=3.0, speculative=0.5) as cctx:
            out.final = await final_recovery(cctx, lid, out)
            if out.final is not None:
                await check_invariants(cctx, out, aq)
        out.phase_times.append(time.monotonic() - t0)
    return out


async def apply_fault(cluster: Cluster, bookie: str, t: float, action: str, rule: dict) -> None:
    await asyncio.sleep(t)
    await asyncio.get_running_loop().run_in_executor(
        None, lambda: cluster.fault(bookie, action, **rule)
    )


async def crash_and_restart(cluster: Cluster, bookie: str, rng: random.Random) -> None:
    loop = asyncio.get_running_loop()
    await asyncio.sleep(rng.uniform(0, 0.2))
    await loop.run_in_executor(None, cluster.kill, bookie)
    await asyncio.sleep(rng.uniform(0.1, 0.5))
    await loop.run_in_executor(None, lambda: cluster.start(bookie, wait_registered=False))


def heal(cluster: Cluster, victim: str | None) -> None:
    for b in cluster.bookies:
        if not b.alive():
            b.start()
    for b in cluster.bookie_ids:
        cluster.admin(b).clear_faults()


async def final_recovery(ctx: ClientContext, lid: int, out: Outcome) -> LedgerMetadata | None:
    last_error: BaseException | None = None
    for _ in range(5):
        try:
            return await recover_ledger(ctx, lid)
        except BKError as exc:  # e.g. a restarted bookie still refusing connections
            last_error = exc
            await asyncio.sleep(0.5)
    out.violations.append(f"final recovery on a healthy cluster failed: {last_error!r}")
    return None


async def check_invariants(ctx: ClientContext, out: Outcome, aq: int) -> None:
    md = out.final
    assert md is not None
    last = md.last_entry_id
    if not md.is_closed:
        out.violations.append(f"ledger not CLOSED: {md.state.name}")
        return
    # Convergence: every close that reported success (recoverers, the writer) saw this end.
    reported = [r.split("@")[1] for r in out.recoveries if "closed@" in r]
    reported += [w.split("@")[1] for w in out.writer_end.split() if w.startswith("close:ok@")]
    if any(int(x) != last for x in reported):
        out.violations.append(f"closes disagree: {reported} vs stored lastEntryId {last}")
    acked = sorted(out.acked)
    if acked != list(range(len(acked))):
        out.violations.append(f"acks not delivered in order: {acked}")
    if acked and acked[-1] > last:
        out.violations.append(f"(1) acked entry {acked[-1]} > lastEntryId {last}")
    if last < 0:
        return
    reader = await LedgerReader.open(ctx, md.ledger_id)
    try:
        entries = await reader.read_entries(0, last)
    except BKError as exc:
        out.violations.append(f"(2) entries 0..{last} not readable: {exc!r}")
        return
    for ent in entries:
        if ent.payload != payload(out.seed, ent.entry_id):
            out.violations.append(f"(2) entry {ent.entry_id} has a foreign payload")
    checks = [
        (eid, md.ensemble_for(eid)[i])
        for eid in range(last + 1)
        for i in write_set(eid, md.ensemble_size, md.write_quorum)
    ]
    results = await asyncio.gather(*(copy_state(ctx, b, md.ledger_id, e) for e, b in checks))
    copies = Counter(eid for (eid, _), state in zip(checks, results, strict=True) if state == "ok")
    for eid in range(last + 1):
        if copies[eid] < aq:
            why = [
                f"{b}: {state}"
                for (e, b), state in zip(checks, results, strict=True)
                if e == eid and state != "ok"
            ]
            segments = [(s.first_entry_id, s.ensemble) for s in md.segments]
            out.violations.append(
                f"(3) entry {eid} on {copies[eid]} bookies of its write set, AQ={aq} "
                f"({'; '.join(why)}; segments {segments})"
            )


async def copy_state(ctx: ClientContext, bookie_id: str, ledger_id: int, entry_id: int) -> str:
    """ "ok" if the bookie returns the entry with a valid digest; otherwise why not.

    A read that times out or loses its connection says nothing about the copy, so it is tried
    again (up to three times) before the check counts the copy as absent and names the error.
    """
    state = ""
    for attempt in range(3):
        try:
            if await stored_on(ctx, bookie_id, ledger_id, entry_id, raise_unknown=True):
                return "ok"
            return "missing"
        except BKError as exc:
            state = f"unknown after 3 reads ({exc!r})"
            await asyncio.sleep(0.5 * (attempt + 1))
    return state


def test_random_schedules_keep_the_invariants(cluster: Cluster, schedules: int) -> None:
    async def main() -> list[Outcome]:
        outcomes = []
        only = os.environ.get("BKAUDIT_SCHEDULE_ONLY")  # reproduce one schedule by index
        for i in [int(only)] if only else range(schedules):
            outcomes.append(await run_schedule(cluster, i))
        return outcomes

    started = time.monotonic()
    outcomes = run(main())
    elapsed = time.monotonic() - started
    violations = [(o.seed, o.ledger_id, v) for o in outcomes for v in o.violations]
    ends = Counter(o.writer_end.split()[-1].split(":")[0] for o in outcomes)
    recs = Counter(r.split(":")[1].split("@")[0] for o in outcomes for r in o.recoveries)
    print(
        f"\nrandom schedules: {len(outcomes)} run in {elapsed:.1f}s (seed {SEED}); "
        f"violations: {len(violations)}"
    )
    print(
        f"  entries acked: {sum(len(o.acked) for o in outcomes)}, "
        f"writer ensemble changes: {sum(o.ensemble_changes for o in outcomes)}, "
        f"bookie restarts: {sum(o.restarted for o in outcomes)}"
    )
    print(f"  writer endings: {dict(ends)}; recoverer outcomes: {dict(recs)}")
    phases = [sum(p) for p in zip(*(o.phase_times for o in outcomes), strict=False)]
    print(f"  time in run / heal / check: {', '.join(f'{p:.1f}s' for p in phases)}")
    if os.environ.get("BKAUDIT_SCHEDULE_VERBOSE"):
        for o in outcomes:
            print(
                f"  seed {o.seed} ledger {o.ledger_id}: acked {len(o.acked)} changes "
                f"{o.ensemble_changes} writer '{o.writer_end.strip()}' {o.recoveries} "
                f"final {o.final.last_entry_id if o.final else None}"
            )
    for seed, lid, v in violations:
        print(f"  VIOLATION seed {seed} ledger {lid}: {v}")
    assert len(outcomes) == (1 if os.environ.get("BKAUDIT_SCHEDULE_ONLY") else schedules)
    assert violations == []
