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

import asyncio
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bklib.digest import digest_manager
from bklib.meta.model import DigestType, LedgerMetadata, LedgerState
from bklib.meta.underreplication import UnderReplicationManager
from bklib.quorum import write_set
from bklib.testing.zkserver import free_port, terminate
from jobs.tables import delta
from jobs.tables.schema import ACTIONS
from tests.interop.conftest import InteropCluster
from tests.interop.harness import REPO, AutoRecovery, JavaClient, payloads

pytestmark = pytest.mark.interop

PWD = b"watch-java-pwd"
CONVERGE = 120.0
"""A safety bound on the convergence, not a speed assertion."""
JAVA_COPY = re.compile(
    r"Replicating fragment Fragment\(LedgerID: (\d+), FirstEntryID: (\d+)\[-?\d+\], "
    r"LastKnownEntryID: (-?\d+)\[-?\d+\], Host: \[([^\]]*)\]"
)
"""``LedgerFragmentReplicator.replicate``: logged once per fragment, before it is copied."""
JAVA_RECOVERY = re.compile(r"Opening Ledger (\d+) for Recovery")
"""``ReplicationWorker``'s deferred lock release, before it fences and closes an open ledger."""


def wait_until(cond: Callable[[], Any], timeout: float, what: str, logs: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.25)  # polling state the Java and Python processes write to ZooKeeper
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}\n{logs()}")


class Watch:
    """``python -m jobs.cli watch`` on the cluster, its log in a file."""

    def __init__(self, connect: str, warehouse: str, log: Path) -> None:
        self.port = free_port()
        self.log = log
        argv = [
            sys.executable, "-m", "jobs.cli", "watch", "--zk", connect, "--warehouse", warehouse,
            "--every", "off", "--lost-bookie-recovery-delay", "0s", "--grace-period", "0s",
            "--rate", "0", "--zk-session-timeout", "4s", "--retry-interval", "1s",
            "--poll-interval", "0.5s", "--read-timeout", "3s", "--connect-timeout", "2s",
            "--metrics-port", str(self.port), "--metrics-host", "127.0.0.1",
            "--instance-id", "watch-java",
        ]  # fmt: skip
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"},
            )  # fmt: skip

    def leading(self) -> bool:
        assert self.proc.poll() is None, f"watch exited {self.proc.returncode}:\n{self.tail()}"
        try:
            url = f"http://127.0.0.1:{self.port}/readyz"
            with urllib.request.urlopen(url, timeout=2) as r:
                return bool(json.loads(r.read()).get("role") == "leader")
        except (OSError, ValueError):
            return False

    def tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except FileNotFoundError:
            return "(no watch log)"

    def stop(self) -> int:
        terminate(self.proc, 40)
        return self.proc.wait()


def java_copies(log: Path) -> list[tuple[int, int, int, str]]:
    """(ledger, first entry, last entry, bookies) of each fragment the ReplicationWorker
    copied."""
    text = log.read_text(errors="replace")
    return [(int(m[1]), int(m[2]), int(m[3]), m[4]) for m in JAVA_COPY.finditer(text)]


def segment_bounds(md: LedgerMetadata) -> dict[int, int]:
    """First entry -> last entry of each segment of a closed ledger."""
    firsts = [s.first_entry_id for s in md.segments]
    return dict(zip(firsts, [f - 1 for f in firsts[1:]] + [md.last_entry_id], strict=True))


def assert_replicas(c: InteropCluster, lid: int, data: list[bytes], dead: str) -> LedgerMetadata:
    """Every entry on every bookie of its write set: digest valid, the written payload."""
    md = c.store.read_ledger(lid).value
    assert md.state is LedgerState.CLOSED, md
    assert md.last_entry_id == len(data) - 1, md
    assert dead not in md.bookies(), md
    dm = digest_manager(lid, DigestType.CRC32C, PWD)

    async def check() -> None:
        async with c.client() as ctx:
            for eid in range(md.last_entry_id + 1):
                ensemble = md.ensemble_for(eid)
                for idx in write_set(eid, md.ensemble_size, md.write_quorum):
                    body = (await ctx.pool.read(ensemble[idx], lid, eid)).body
                    got = bytes(dm.verify_entry(body, eid).payload)
                    assert got == data[eid], (lid, eid, ensemble[idx])

    asyncio.run(check())
    return md


@pytest.mark.timeout(300)
def test_watch_and_java_autorecovery_converge_without_copying_twice(
    own_cluster: Any, java_client: JavaClient, bk_classpath: str, tmp_path: Path
) -> None:
    # Short bookie sessions: the killed bookie's registration goes within seconds.
    with own_cluster(java=4, init="bklib", bookie_conf={"zkTimeout": 4000}) as c:
        urm = UnderReplicationManager(c.zk, "/ledgers")
        urm.ensure_layout()
        urm.set_lost_bookie_recovery_delay(0)
        j0, j1, j2, j3 = c.java_ids
        victim = c.java[0]
        dead = victim.bookie_id
        ring = [j0, j1, j2, j3]
        # 12 closed ledgers over the four rotations (9 use the victim, at every position), and
        # two left open by an idle writer, the victim second (see the module docstring).
        layouts = [([ring[(n + k) % 4] for k in range(3)], True) for n in range(12)]
        layouts += [([j3, j0, j1], False), ([j2, j0, j3], False)]
        data: dict[int, list[bytes]] = {}
        for n, (ensemble, close) in enumerate(layouts):
            entries = payloads(f"wj{n}", 24, size=160)
            lid = java_client.write(
                c.uri,
                entries,
                ensemble=3,
                write_quorum=2,
                ack_quorum=2,
                password=PWD,
                bookies=ensemble,
                pipelined=close,
                close=close,
            )
            data[lid] = entries
        before = {lid: c.store.read_ledger(lid).value for lid in data}
        affected = {
            (lid, s.first_entry_id)
            for lid, md in before.items()
            for s in md.segments
            if dead in s.ensemble
        }
        opened = {lid for lid, md in before.items() if md.state is LedgerState.OPEN}
        assert len({lid for lid, _ in affected}) == 11 and len(opened) == 2, before

        ar = AutoRecovery(
            bk_classpath,
            c.uri,
            c.base / "autorecovery",
            extra={
                "lostBookieRecoveryDelay": 0,
                "openLedgerRereplicationGracePeriod": 0,
                "rwRereplicateBackoffMs": 500,
                # No checkAllLedgers: its first run, at election, reads every ledger and would
                # find the loss by failed reads before the registration expires. The Auditor,
                # like the watch, learns of the loss from the registrations.
                "auditorPeriodicCheckInterval": 0,
            },
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
            t0 = time.monotonic()

            def converged() -> bool:
                named = [lid for lid in data if dead in c.store.read_ledger(lid).value.bookies()]
                return not named and not any(True for _ in urm.list_underreplicated())

            wait_until(converged, CONVERGE, "no ledger naming the victim and no mark", logs)
            took = time.monotonic() - t0
            locks = "/ledgers/underreplication/locks"
            wait_until(lambda: not c.zk.get_children(locks), 10, "the locks' release", logs)
        finally:
            code = watch.stop()
            ar.stop()
        assert code == 0, watch.tail()
        assert took < CONVERGE
        after = {lid: c.store.read_ledger(lid).value for lid in data}

        # Who copied and who fenced what.
        actions = (
            list(delta.read_rows(warehouse, ACTIONS))
            if delta.table_exists(warehouse, ACTIONS)
            else []
        )
        done = [a for a in actions if a["status"] == "DONE"]
        ours = [
            (a["ledger_id"], a["segment_first_entry_id"], a["segment_last_entry_id"])
            for a in done
            if a["action"] == "COPY"
        ]
        assert all(a["old_bookie"] == dead for a in done if a["action"] == "COPY"), actions
        java = java_copies(ar.log_path)
        assert all(host == dead for *_, host in java), java
        theirs = [(lid, first, last) for lid, first, last, _ in java]
        summary = (
            f"watch copied {sorted(ours)}\njava copied {sorted(theirs)}\n"
            f"affected {sorted(affected)}\n{logs()}"
        )
        copies = Counter((lid, first) for lid, first, _ in ours + theirs)
        twice = {k: n for k, n in copies.items() if n > 1}
        assert not twice, f"copied more than once: {twice}\n{summary}"
        assert set(copies) == affected, summary
        # Each copy covered its whole segment, as the ledger was finally closed.
        for lid, first, last in ours + theirs:
            assert segment_bounds(after[lid])[first] == last, (lid, first, last, after[lid])
        fenced = Counter(a["ledger_id"] for a in done if a["action"] == "FENCE_AND_CLOSE")
        fenced += Counter(int(m[1]) for m in JAVA_RECOVERY.finditer(ar.log_path.read_text()))
        assert fenced == dict.fromkeys(opened, 1), f"fenced {fenced}\n{summary}"

        # The metadata replaced the victim once in each of those segments.
        for lid, entries in data.items():
            md = assert_replicas(c, lid, entries, dead)
            assert [s.first_entry_id for s in md.segments] == [
                s.first_entry_id for s in before[lid].segments
            ], (before[lid], md)
            for old, new in zip(before[lid].segments, md.segments, strict=True):
                changed = [
                    i
                    for i, (a, b) in enumerate(zip(old.ensemble, new.ensemble, strict=True))
                    if a != b
                ]
                if dead in old.ensemble:
                    assert changed == [old.ensemble.index(dead)], (before[lid], md)
                    assert new.ensemble[changed[0]] not in old.ensemble, (before[lid], md)
                else:
                    assert changed == [], (before[lid], md)
            got, reply = java_client.read(c.uri, lid, password=PWD)
            assert got == entries, lid
            assert reply["metadata"]["state"] == "CLOSED", reply
        # Where we copied, the metadata names the bookie we wrote to.
        for a in done:
            if a["action"] == "COPY":
                md = after[a["ledger_id"]]
                seg = next(
                    s for s in md.segments if s.first_entry_id == a["segment_first_entry_id"]
                )
                assert a["new_bookie"] in seg.ensemble, (a, md)
        print(
            f"converged in {took:.1f}s after the registration expired; the watch copied "
            f"{len(ours)} fragments, the Java ReplicationWorker {len(theirs)}; fenced: "
            f"{len([a for a in done if a['action'] == 'FENCE_AND_CLOSE'])} by the watch"
        )
