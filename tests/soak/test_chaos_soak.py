"""The chaos soak: a mixed cluster (2 Java BookKeeper 4.17 bookies, 4 Python bookies) under
continuous writes from the bklib writer and the Java client, while bookies are killed -9 and
restarted, frozen (SIGSTOP/SIGCONT) and given faults (stalls, unknown replies, dropped replies,
failed adds), one Python bookie is lost for good, and ``bkaudit audit`` / ``rereplicate``
(local executor) run in a loop as real processes -- some SIGKILLed as a process group, some
frozen past their ZooKeeper session timeout so their sessions expire.

Then everything is healed (but the lost bookie), audit + rereplicate run until they converge,
and the invariants of :func:`tests.soak.chaos.check_invariants` must hold with 0 violations.

``--soak-minutes M`` (default 0.5; ``make soak``: 30) and ``--soak-seed S`` (default
20261122). A failure prints the seed and the timeline of injected events.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from bklib.testing.zkserver import ZooKeeperServer
from tests.interop.harness import JavaClient
from tests.soak import chaos
from tests.soak.chaos import (
    BookieChaos,
    JavaWriter,
    JobLoop,
    Ledgers,
    PythonWriters,
    SoakCluster,
    Timeline,
)

pytestmark = pytest.mark.integration


def test_chaos_soak_keeps_every_acknowledged_entry(
    zk_server: ZooKeeperServer,
    tmp_path: Path,
    soak_classpath: str,
    soak_minutes: float,
    soak_seed: int,
) -> None:
    seed, duration = soak_seed, soak_minutes * 60
    started = time.monotonic()
    warehouse = str(tmp_path / "warehouse")
    jobs_log = tmp_path / "jobs.log"
    tl = Timeline()
    ledgers = Ledgers()
    with zk_server.private_chroot("soak") as connect:
        cluster = SoakCluster(connect, tmp_path / "cluster", soak_classpath, java=2, python=4)
        java = JavaClient(soak_classpath, tmp_path / "java-client")
        try:
            cluster.start()
            tl.add("cluster_up", "", " ".join(f"{n.kind}:{n.id}" for n in cluster.nodes))
            py = PythonWriters(cluster, ledgers, tl, seed, n=2)
            jv = JavaWriter(java, cluster, ledgers, tl, seed)
            jobs = JobLoop(cluster, warehouse, tl, seed, jobs_log)
            bookies = BookieChaos(cluster, tl, seed, lose_at=duration * 0.3)
            for t in (py, jv, jobs):
                t.start()
            bookies.run(duration, should_stop=lambda: False)

            # Heal: writers and the job loop stop, every bookie but the lost one comes back.
            tl.add("heal", "", "chaos over")
            for t in (py, jv, jobs):
                t.stop_flag.set()
            bookies.finish()
            cluster.heal()
            py.join(120)
            jv.join(180)
            jobs.join(chaos.JOB_TIMEOUT + 60)
            stuck = [t.name for t in (py, jv, jobs) if t.is_alive()]
            assert bookies.lost is not None, "no bookie was lost: the soak is too short"
            gone = {bookies.lost.id}
            chaos.wait_locks_gone(cluster.zk)
            problems = chaos.converge(cluster, warehouse, jobs_log, gone, tl)
            chaos.wait_locks_gone(cluster.zk)
            violations, st = asyncio.run(chaos.check_invariants(cluster, ledgers, gone))
            violations += problems + py.errors + jv.errors + jobs.errors
            violations += [f"thread {name} did not stop" for name in stuck]

            counts = tl.counts()
            faults = {k: v for k, v in sorted(counts.items()) if k.startswith("fault_")}
            faults.pop("fault_clear", None)
            summary = [
                f"chaos soak: {soak_minutes:g} min of chaos, "
                f"{(time.monotonic() - started) / 60:.1f} min in all, seed {seed}",
                f"  bookie kill -9: {counts['bookie_kill9']}, SIGSTOP: {counts['bookie_sigstop']},"
                f" lost for good: {counts['bookie_lost']} ({sorted(gone)})",
                f"  bookie faults: {sum(faults.values())} {faults}",
                f"  rereplicate SIGKILLed: {counts['job_kill']} "
                f"(missed {counts['job_kill_missed']}), sessions expired: "
                f"{counts['job_expire']} (missed {counts['job_expire_missed']})",
                f"  jobs: {dict(sorted(jobs.codes.items()))}",
                f"  writers: {len(ledgers.records)} ledgers, acked entries python "
                f"{ledgers.acked_total('python')}, java {ledgers.acked_total('java')}",
                f"  checked: {st.ledgers} ledgers ({st.closed} closed), {st.entries} entries, "
                f"{st.acked} acked, {st.replica_reads} replica reads, "
                f"{st.identical_neighbours} identical neighbouring ensembles after repairs",
                f"  invariant violations: {len(violations)}",
            ]
            print("\n" + "\n".join(summary))
            if violations:
                print(f"\nSEED {seed}; violations:")
                for v in violations[:60]:
                    print(f"  {v}")
                print(chaos.describe_ledgers(cluster, ledgers, violations))
                print(cluster.logs())
            assert violations == [], f"seed {seed}: {violations[:10]}"
        except BaseException:
            print(f"\nchaos soak FAILED, seed {seed}; timeline:\n{tl.render()}")
            raise
        finally:
            java.close()
            cluster.stop()
