"""The kill campaign: the real ``bkaudit rereplicate`` (local executor) SIGKILLed as a process
group at random moments, over and over, then rerun until it converges -- with 0 entries lost
and 0 duplicate segments.

The campaign runs in waves of up to five kills. Each wave writes fresh ledgers with the bklib
writer (a quarter left open by a "crashed" writer), loses the bookie that is in most of them
(kill -9), audits, and then starts ``rereplicate`` (slowed by ``--rate`` so a kill lands in the
middle of fencing, copying or a metadata swap) and SIGKILLs its process group after a seeded
random delay. A kill only counts if the job was still running. Then audit + rereplicate run
until the metadata names the lost bookie nowhere and the replicas audit is clean, and:

* every acknowledged entry reads back with its digest and payload, and every entry of every
  ledger is on >= WQ bookies of its write set (0 entries lost);
* no ledger ends below an acknowledged entry; a writer's successful close is the stored end;
* segment keys are the writer's (repairs rewrite segments in place), plus at most one
  recovery segment for a ledger that was open; no key twice, no two consecutive identical
  ensembles (0 duplicate segments);
* no under-replication lock or mark is left.

The lost bookie is restarted after its wave (the metadata no longer names it). ``--soak-kills
N`` (default 5; ``make soak``: 25) and ``--soak-seed S``.
"""

from __future__ import annotations

import asyncio
import math
import random
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from bklib.client.reader import ClientContext
from bklib.client.writer import LedgerWriter
from bklib.meta.model import Segment
from bklib.testing.zkserver import ZooKeeperServer
from tests.soak import chaos
from tests.soak.chaos import Job, LedgerRecord, Ledgers, SoakCluster, Timeline

pytestmark = pytest.mark.integration

KILLS_PER_WAVE = 5
LEDGERS_PER_WAVE = 14


async def write_wave(
    cluster: SoakCluster, ledgers: Ledgers, rng: random.Random, wave: int
) -> dict[int, list[Segment]]:
    """Write this wave's ledgers concurrently; returns each ledger's segments as its writer
    left them."""
    keys: dict[int, list[Segment]] = {}

    async def one(k: int, ctx: ClientContext) -> None:
        e = 3
        wq = rng.randint(2, 3)
        tag = f"kill{wave}-{k}"
        w = await LedgerWriter.create(
            ctx, ensemble_size=e, write_quorum=wq, ack_quorum=2, password=tag.encode()
        )
        rec = LedgerRecord(w.ledger_id, "python", tag, wq)
        ledgers.add(rec)
        n, leave_open = rng.randint(60, 120), rng.random() < 0.25
        futures = [w.add_async(rec.payload(eid)) for eid in range(n)]
        for eid, res in enumerate(await asyncio.gather(*futures, return_exceptions=True)):
            if res == eid:  # acknowledged (an exception otherwise)
                ledgers.ack(rec, eid)
        if leave_open:
            await w.abort()
            rec.end = "abandoned open"
        else:
            md = await w.close()
            rec.closed_at, rec.end = md.last_entry_id, f"closed@{md.last_entry_id}"
        keys[w.ledger_id] = list(w.metadata.segments)

    async with cluster.client() as ctx:
        await asyncio.gather(*(one(k, ctx) for k in range(LEDGERS_PER_WAVE)))
    return keys


def test_rereplicate_killed_again_and_again_converges_without_loss(
    zk_server: ZooKeeperServer, tmp_path: Path, soak_kills: int, soak_seed: int
) -> None:
    seed = soak_seed
    rng = random.Random(seed * 31 + 7)
    warehouse = str(tmp_path / "warehouse")
    log = tmp_path / "jobs.log"
    tl, ledgers = Timeline(), Ledgers()
    kills, missed, waves = 0, 0, math.ceil(soak_kills / KILLS_PER_WAVE)
    kill_ages: list[float] = []
    violations: list[str] = []
    st_total: Counter[str] = Counter()
    started = time.monotonic()
    with zk_server.private_chroot("kills") as connect:
        cluster = SoakCluster(connect, tmp_path / "cluster", "", java=0, python=5)
        try:
            cluster.start()
            for wave in range(waves):
                keys = asyncio.run(write_wave(cluster, ledgers, rng, wave))
                # The victim: the bookie named by most of this wave's ledgers.
                named = Counter(
                    b for lid in keys for b in cluster.store.read_ledger(lid).value.bookies()
                )
                victim = cluster.node(named.most_common(1)[0][0])
                cluster.kill9(victim)
                victim.state = "lost"
                tl.add("bookie_lost", victim.id, f"wave {wave}: in {named[victim.id]} ledgers")
                while cluster.registered(victim.id):
                    time.sleep(0.2)  # its registration goes with its session
                chaos.run_job(chaos.audit_args(connect, warehouse, "lost"), log)

                target = min(KILLS_PER_WAVE, soak_kills - kills)
                wave_kills, attempts = 0, 0
                while wave_kills < target and attempts < 4 * target:
                    attempts += 1
                    if attempts > 1 and rng.random() < 0.3:
                        chaos.run_job(chaos.audit_args(connect, warehouse, "lost"), log)
                    delay = rng.uniform(0.5, 5.0)
                    job = Job(
                        chaos.rereplicate_args(
                            connect, warehouse, "--grace-period", "0s", "--rate", "2KB"
                        ),
                        log,
                    )
                    while job.alive() and job.age < delay:
                        time.sleep(0.01)
                    if job.signal_group(signal.SIGKILL):
                        job.proc.wait()
                        wave_kills += 1
                        kill_ages.append(job.age)
                        tl.add("job_kill", "rereplicate", f"wave {wave}: at {job.age:.2f}s")
                    else:
                        missed += 1
                        tl.add("job_kill_missed", "rereplicate", f"exit {job.proc.returncode}")
                        if not chaos.ledgers_naming(cluster.store, {victim.id}):
                            break  # nothing left to interrupt in this wave
                kills += wave_kills

                chaos.wait_locks_gone(cluster.zk)
                violations += chaos.converge(cluster, warehouse, log, {victim.id}, tl)
                chaos.wait_locks_gone(cluster.zk)
                v, st = asyncio.run(chaos.check_invariants(cluster, ledgers, {victim.id}))
                violations += [f"wave {wave}: {x}" for x in v]
                violations += [f"wave {wave}: {x}" for x in segment_violations(cluster, keys)]
                st_total.update(st.__dict__)
                # Back it comes (the metadata no longer names it) for the next wave.
                cluster.restart(victim)
                cluster.wait_registered([victim.id])

            print(
                f"\nkill campaign: {kills} SIGKILLs of bkaudit rereplicate in {waves} waves "
                f"(missed {missed}: job ended first), kill ages "
                f"{min(kill_ages, default=0):.1f}-{max(kill_ages, default=0):.1f}s, seed {seed}, "
                f"{(time.monotonic() - started) / 60:.1f} min\n"
                f"  {len(ledgers.records)} ledgers, {ledgers.acked_total()} acked entries, "
                f"{st_total['replica_reads']} replica reads; violations: {len(violations)}"
            )
            for line in violations[:40]:
                print(f"  {line}")
            assert kills >= soak_kills, f"only {kills} kills landed (seed {seed})"
            assert violations == [], f"seed {seed}: {violations[:10]}"
        except BaseException:
            print(f"\nkill campaign FAILED, seed {seed}; timeline:\n{tl.render()}")
            raise
        finally:
            cluster.stop()


def segment_violations(cluster: SoakCluster, keys: dict[int, list[Segment]]) -> list[str]:
    """Repairs rewrite segments in place: the writer's keys survive unchanged, and only a
    ledger left open may gain one segment (its recovery's write-back ensemble)."""
    v = []
    for lid, written in keys.items():
        md = cluster.store.read_ledger(lid).value
        orig = [s.first_entry_id for s in written]
        firsts = [s.first_entry_id for s in md.segments]
        if firsts[: len(orig)] != orig:
            v.append(f"ledger {lid}: segment keys {firsts}, the writer left {orig}")
        if len(firsts) > len(orig) + 1:
            v.append(f"ledger {lid}: {len(firsts) - len(orig)} segments added to {orig}")
        added = set(firsts) - set(orig)
        # Recovery appends its write-back segment with the lost bookie replaced; a later
        # in-place repair of the writer's last segment may pick the same replacement, which
        # makes them equal without anything having been appended wrongly. An append is wrong
        # only if it repeated the writer's own last ensemble.
        last_written = written[-1].ensemble if written else ()
        dup = [
            k
            for k in chaos.identical_neighbours(md)
            if k in added and md.segments[firsts.index(k)].ensemble == last_written
        ]
        if dup:
            v.append(f"ledger {lid}: segment at {dup} appended with its predecessor's ensemble")
    return v


def test_structure_checks_are_not_vacuous() -> None:
    """The metadata checks report what they look for: a gone bookie, identical neighbours."""
    from bklib.meta.model import DigestType, LedgerMetadata, LedgerState, Segment

    md = LedgerMetadata(
        ledger_id=7,
        ensemble_size=2,
        write_quorum=2,
        ack_quorum=2,
        segments=(Segment(0, ("a:1", "b:1")), Segment(5, ("a:1", "b:1"))),
        state=LedgerState.CLOSED,
        last_entry_id=9,
        length=10,
        digest_type=DigestType.CRC32C,
        password=b"",
    )
    assert chaos.identical_neighbours(md) == [5]
    v = chaos.structure_violations(md, {"b:1"})
    assert v == ["ledger 7: metadata still names gone bookie(s) ['b:1']"], v


def test_segment_check_tells_a_repeated_append_from_an_in_place_repair() -> None:
    """Recovery's write-back segment (lost b:1 replaced by c:1) equal to the writer's segment
    after its in-place repair picked c:1 too is fine; an appended copy of the writer's own
    ensemble is a violation."""
    from types import SimpleNamespace

    from bklib.meta.model import DigestType, LedgerMetadata, LedgerState

    def cluster_with(*segments: Segment) -> SoakCluster:
        md = LedgerMetadata(
            ledger_id=7,
            ensemble_size=2,
            write_quorum=2,
            ack_quorum=2,
            segments=segments,
            state=LedgerState.CLOSED,
            last_entry_id=9,
            length=10,
            digest_type=DigestType.CRC32C,
            password=b"",
        )
        store = SimpleNamespace(read_ledger=lambda lid: SimpleNamespace(value=md))
        return SimpleNamespace(store=store)  # type: ignore[return-value]

    written = {7: [Segment(0, ("a:1", "b:1"))]}
    repaired = cluster_with(Segment(0, ("a:1", "c:1")), Segment(5, ("a:1", "c:1")))
    assert segment_violations(repaired, written) == []
    repeated = cluster_with(Segment(0, ("a:1", "b:1")), Segment(5, ("a:1", "b:1")))
    assert segment_violations(repeated, written) == [
        "ledger 7: segment at [5] appended with its predecessor's ensemble"
    ]
