"""``bkaudit watch`` and Java AutoRecovery (Auditor + ReplicationWorker) on the same all-Java
cluster: a bookie is killed -9 and the cluster converges with no fragment copied twice.

Four Java bookies (DbLedgerStorage); the Java client writes 12 closed and 2 open ledgers
(E=3 WQ=2 AQ=2, ensembles rotating over the bookies, so 11 of them use the victim). Both
repairers run at once with no delay and no grace period; the Auditor's checkAllLedgers is off,
so both learn of the loss from the registration's expiry. Once no ledger names the victim and
no under-replication mark is left:

* every copy is counted, by the tool that made it: ours are the ``COPY``/``DONE`` rows of the
  ``replication_actions`` table, Java's the ``Replicating fragment Fragment(LedgerID: L,
  FirstEntryID: F...)`` INFO line ``LedgerFragmentReplicator.replicate`` logs before it
  copies a fragment (BookKeeper 4.17.3). Each segment that named the victim is copied exactly
  once, over its whole range: by one tool, once, never by both (the shared
  ``underreplication/locks/urL<id>`` locks). Each open ledger is fenced and closed once: our
  ``FENCE_AND_CLOSE`` row or the worker's ``Opening Ledger L for Recovery`` line;
* the metadata replaced the victim once in each of those segments (every other position and
  every segment boundary unchanged), by the bookie our copy wrote to where we copied;
* every entry is on every bookie of its write set with a valid digest and the written bytes,
  and the Java client reads every ledger back.

The open ledgers' writer added its entries one at a time, so the bookies know the LAC up to
the next-to-last entry, and the victim sits where the last entry's write set does not reach:
recovery writes back that entry only, to live bookies, with no ensemble change. (A recovery
write-back failing on the victim would replace it, in a new segment from the recovery's start,
or in place when recovery starts at the segment's first entry -- as after pipelined writes,
whose LAC the bookies may not know at all: a third way of moving data, by whichever tool
fences, that neither records as a copy and this count does not model.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bklib.meta.underreplication import UnderReplicationManager
from tests.interop.autorecovery_tools import (
    AUTORECOVERY_RACE_CONF,
    Watch,
    affected_segments,
    assert_each_fragment_copied_once,
    wait_converged,
    wait_until,
    write_rotating_ledgers,
)
from tests.interop.harness import AutoRecovery, JavaClient

pytestmark = pytest.mark.interop

PWD = b"watch-java-pwd"
CONVERGE = 120.0
"""A safety bound on the convergence, not a speed assertion."""


@pytest.mark.timeout(300)
def test_watch_and_java_autorecovery_converge_without_copying_twice(
    own_cluster: Any, java_client: JavaClient, bk_classpath: str, tmp_path: Path
) -> None:
    # Short bookie sessions: the killed bookie's registration goes within seconds.
    with own_cluster(java=4, init="bklib", bookie_conf={"zkTimeout": 4000}) as c:
        urm = UnderReplicationManager(c.zk, "/ledgers")
        urm.ensure_layout()
        urm.set_lost_bookie_recovery_delay(0)
        victim = c.java[0]
        dead = victim.bookie_id
        data = write_rotating_ledgers(java_client, c.uri, c.java_ids, PWD)
        before = {lid: c.store.read_ledger(lid).value for lid in data}
        affected = affected_segments(before, dead)
        opened = [lid for lid, md in before.items() if not md.is_closed]
        assert len({lid for lid, _ in affected}) == 11 and len(opened) == 2, before

        ar = AutoRecovery(
            bk_classpath, c.uri, c.base / "autorecovery", extra=AUTORECOVERY_RACE_CONF
        )
        warehouse = str(tmp_path / "wh")
        ar.start()
        watch = Watch(c.connect, warehouse, tmp_path / "watch.log")

        def logs() -> str:
            return (
                f"--- autorecovery ---\n{ar.log_tail()}\n--- watch ---\n{watch.tail()}\n"
                f"{c.logs(10)}"
            )

        try:
            election = "/ledgers/underreplication/auditorelection"
            wait_until(
                lambda: c.zk.exists(election) and c.zk.get_children(election),
                60,
                "the Java Auditor",
                logs,
            )
            wait_until(watch.leading, 60, "the watch leader", logs)
            assert ar.proc is not None and ar.proc.poll() is None, logs()

            victim.kill9()
            wait_until(
                lambda: not c.zk.exists(f"/ledgers/available/{dead}"),
                30,
                "the victim's registration to expire",
                logs,
            )
            took = wait_converged(c, data, dead, CONVERGE, logs)
        finally:
            code = watch.stop()
            ar.stop()
        assert code == 0, watch.tail()
        assert took < CONVERGE
        ours, theirs, fenced = assert_each_fragment_copied_once(
            c, java_client, data, before, dead, warehouse, ar.log_path, PWD, logs
        )
        print(
            f"converged in {took:.1f}s after the registration expired; the watch copied "
            f"{ours} fragments, the Java ReplicationWorker {theirs}; fenced: {fenced} by the watch"
        )
