"""What the tests that run Java BookKeeper beside bkaudit share, on either metadata store:
the ledgers they write (the audit story's layouts, the ledgers the watch and AutoRecovery race
over), the watch as a process, the Java log lines that count Java's copies and fences, and the
checks that no fragment was copied twice.

Used by tests/interop (ZooKeeper) and tests/pulsar/test_oxia_java.py (Oxia).
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
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bklib.digest import digest_manager
from bklib.meta.model import DigestType, LedgerMetadata, LedgerState
from bklib.meta.stores.zookeeper import as_store
from bklib.meta.underreplication import UnderReplicationManager
from bklib.quorum import write_set
from bklib.testing.ports import free_port
from bklib.testing.zkserver import terminate
from jobs.tables import delta
from jobs.tables.schema import ACTIONS
from tests.interop.conftest import InteropCluster
from tests.interop.harness import REPO, JavaClient, payloads

JAVA_COPY = re.compile(
    r"Replicating fragment Fragment\(LedgerID: (\d+), FirstEntryID: (\d+)\[-?\d+\], "
    r"LastKnownEntryID: (-?\d+)\[-?\d+\], Host: \[([^\]]*)\]"
)
"""``LedgerFragmentReplicator.replicate``: logged once per fragment, before it is copied."""
JAVA_RECOVERY = re.compile(r"Opening Ledger (\d+) for Recovery")
"""``ReplicationWorker``'s deferred lock release, before it fences and closes an open ledger."""


def wait_until(cond: Callable[[], Any], timeout: float, what: str, logs: Callable[[], str]) -> Any:
    """Poll ``cond`` (state the Java and Python processes write to the store) until truthy."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}\n{logs()}")


def parse_listunderreplicated(out: str) -> dict[int, set[str]]:
    """``listunderreplicated -printmissingreplica`` output: ledger id -> missing replicas."""
    found: dict[int, set[str]] = {}
    current: int | None = None
    for line in out.splitlines():
        # 4.18 logs attributes: "Under-replicated ledger {ledgerId=5}", "Missing replica
        # {missingReplica=host:port}" (scripts/java/bookkeeper/log4j2-shell.xml).
        m18 = re.fullmatch(r"Under-replicated ledger \{ledgerId=(\d+)\}", line.strip())
        if m18 or (re.fullmatch(r"\d+", line.strip()) and not line.startswith("\t")):
            current = int(m18.group(1) if m18 else line.strip())
            found[current] = set()
        elif current is not None and "MissingReplica" in line:
            found[current] |= set(re.findall(r"[\w.\-]+:\d+", line.split(":", 1)[1]))
        elif current is not None and "missingReplica=" in line:
            found[current] |= set(re.findall(r"[\w.\-]+:\d+", line.split("=", 1)[1]))
    return found


class Watch:
    """``python -m jobs.cli watch`` on the cluster whose store is ``locator`` (a ZooKeeper
    connect string or ``oxia://``), its log in a file."""

    def __init__(self, locator: str, warehouse: str, log: Path) -> None:
        self.port = free_port()
        self.log = log
        argv = [
            sys.executable, "-m", "jobs.cli", "watch", "--zk", locator, "--warehouse", warehouse,
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


AUTORECOVERY_RACE_CONF: Mapping[str, object] = {
    "lostBookieRecoveryDelay": 0,
    "openLedgerRereplicationGracePeriod": 0,
    "rwRereplicateBackoffMs": 500,
    # No checkAllLedgers: its first run, at election, reads every ledger and would find the
    # loss by failed reads before the registration expires. The Auditor, like the watch,
    # learns of the loss from the registrations.
    "auditorPeriodicCheckInterval": 0,
}
"""AutoRecoveryMain settings for racing the watch: no delay, no grace period."""


def write_rotating_ledgers(
    java_client: JavaClient, uri: str, ring: Sequence[str], password: bytes, *, v2: bool = False
) -> dict[int, list[bytes]]:
    """Over four bookies ``ring`` (the victim first): 12 closed ledgers over the four
    rotations (9 use the victim, at every position) and two left open by an idle writer, the
    victim second, so recovery writes back only the last entry, to live bookies (see
    tests/interop/test_watch_java.py). E=3 WQ=2 AQ=2; ledger id -> payloads."""
    j0, j1, j2, j3 = ring
    layouts = [([ring[(n + k) % 4] for k in range(3)], True) for n in range(12)]
    layouts += [([j3, j0, j1], False), ([j2, j0, j3], False)]
    data: dict[int, list[bytes]] = {}
    for n, (ensemble, close) in enumerate(layouts):
        entries = payloads(f"wj{n}", 24, size=160)
        lid = java_client.write(
            uri,
            entries,
            ensemble=3,
            write_quorum=2,
            ack_quorum=2,
            password=password,
            bookies=ensemble,
            pipelined=close,
            close=close,
            v2=v2,
        )
        data[lid] = entries
    return data


def write_story_ledgers(
    java_client: JavaClient,
    uri: str,
    ring: Sequence[str],
    password: bytes,
    *,
    v2: bool = False,
    tag: str = "story",
    after_each: Callable[[int], object] | None = None,
) -> dict[str, tuple[int, list[bytes]]]:
    """The audit story's five ledgers over four bookies ``ring`` (the victim first), pinned:
    E3/W2, E3/W3 and E2/W2 using the victim, one that does not, and one left open that does;
    name -> (ledger id, payloads). ``after_each`` is called with each new ledger's id."""
    j0, j1, j2, j3 = ring
    layouts = {
        "e3w2": ([j0, j1, j2], 3, 2, 2, 50, True),
        "e3w3": ([j0, j2, j3], 3, 3, 2, 30, True),
        "e2w2": ([j1, j0], 2, 2, 2, 30, True),
        "unaffected": ([j1, j2, j3], 3, 2, 2, 30, True),
        "open": ([j0, j1, j3], 3, 2, 2, 40, False),
    }
    out: dict[str, tuple[int, list[bytes]]] = {}
    for name, (bookies, e, wq, aq, n, close) in layouts.items():
        entries = payloads(f"{tag}-{name}", n, size=500)
        lid = java_client.write(
            uri,
            entries,
            ensemble=e,
            write_quorum=wq,
            ack_quorum=aq,
            password=password,
            close=close,
            bookies=bookies,
            v2=v2,
        )
        out[name] = (lid, entries)
        if after_each is not None:
            after_each(lid)
    return out


def wait_converged(
    c: InteropCluster,
    data: Mapping[int, list[bytes]],
    dead: str,
    bound: float,
    logs: Callable[[], str],
) -> float:
    """Until no ledger names ``dead`` and no under-replication mark is left, then until every
    ledger lock is released; the seconds the first took."""
    meta = as_store(c.zk)
    urm = UnderReplicationManager(meta, "/ledgers")
    t0 = time.monotonic()

    def converged() -> bool:
        named = [lid for lid in data if dead in c.store.read_ledger(lid).value.bookies()]
        return not named and not any(True for _ in urm.list_underreplicated())

    wait_until(converged, bound, "no ledger naming the victim and no mark", logs)
    took = time.monotonic() - t0
    locks = "/ledgers/underreplication/locks"
    wait_until(lambda: not meta.children(locks), 10, "the locks' release", logs)
    return took


def affected_segments(before: Mapping[int, LedgerMetadata], dead: str) -> set[tuple[int, int]]:
    """(ledger, first entry) of each segment whose ensemble names ``dead``."""
    return {
        (lid, s.first_entry_id)
        for lid, md in before.items()
        for s in md.segments
        if dead in s.ensemble
    }


def java_copies(log: Path) -> list[tuple[int, int, int, str]]:
    """(ledger, first entry, last entry, bookies) of each fragment the ReplicationWorker
    copied."""
    text = log.read_text(errors="replace")
    return [(int(m[1]), int(m[2]), int(m[3]), m[4]) for m in JAVA_COPY.finditer(text)]


def segment_bounds(md: LedgerMetadata) -> dict[int, int]:
    """First entry -> last entry of each segment of a closed ledger."""
    firsts = [s.first_entry_id for s in md.segments]
    return dict(zip(firsts, [f - 1 for f in firsts[1:]] + [md.last_entry_id], strict=True))


def assert_replicas(
    c: InteropCluster, lid: int, data: list[bytes], dead: str, password: bytes
) -> LedgerMetadata:
    """Every entry on every bookie of its write set: digest valid, the written payload."""
    md = c.store.read_ledger(lid).value
    assert md.state is LedgerState.CLOSED, md
    assert md.last_entry_id == len(data) - 1, md
    assert dead not in md.bookies(), md
    dm = digest_manager(lid, DigestType.CRC32C, password)

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


def assert_each_fragment_copied_once(
    c: InteropCluster,
    java_client: JavaClient,
    data: Mapping[int, list[bytes]],
    before: Mapping[int, LedgerMetadata],
    dead: str,
    warehouse: str,
    autorecovery_log: Path,
    password: bytes,
    logs: Callable[[], str],
    *,
    v2: bool = False,
) -> tuple[int, int, int]:
    """After the watch and Java AutoRecovery converged on the loss of ``dead``:

    * each segment that named it was copied exactly once, over its whole range, by one tool
      (ours: the COPY/DONE rows of ``replication_actions``; Java's: the JAVA_COPY log lines);
    * each open ledger was fenced and closed once (FENCE_AND_CLOSE or JAVA_RECOVERY);
    * the metadata replaced ``dead`` once in each of those segments, by the bookie our copy
      wrote to where we copied, every other position and boundary unchanged;
    * every entry is on every bookie of its write set, and the Java client reads it back.

    Returns (our copies, Java's copies, our fences)."""
    after = {lid: c.store.read_ledger(lid).value for lid in data}
    affected = affected_segments(before, dead)
    opened = {lid for lid, md in before.items() if md.state is LedgerState.OPEN}
    actions = (
        list(delta.read_rows(warehouse, ACTIONS)) if delta.table_exists(warehouse, ACTIONS) else []
    )
    done = [a for a in actions if a["status"] == "DONE"]
    ours = [
        (a["ledger_id"], a["segment_first_entry_id"], a["segment_last_entry_id"])
        for a in done
        if a["action"] == "COPY"
    ]
    assert all(a["old_bookie"] == dead for a in done if a["action"] == "COPY"), actions
    java = java_copies(autorecovery_log)
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
    our_fences = Counter(a["ledger_id"] for a in done if a["action"] == "FENCE_AND_CLOSE")
    fenced = our_fences + Counter(
        int(m[1]) for m in JAVA_RECOVERY.finditer(autorecovery_log.read_text())
    )
    assert fenced == dict.fromkeys(opened, 1), f"fenced {fenced}\n{summary}"

    for lid, entries in data.items():
        md = assert_replicas(c, lid, entries, dead, password)
        assert [s.first_entry_id for s in md.segments] == [
            s.first_entry_id for s in before[lid].segments
        ], (before[lid], md)
        for old, new in zip(before[lid].segments, md.segments, strict=True):
            changed = [
                i for i, (a, b) in enumerate(zip(old.ensemble, new.ensemble, strict=True)) if a != b
            ]
            if dead in old.ensemble:
                assert changed == [old.ensemble.index(dead)], (before[lid], md)
                assert new.ensemble[changed[0]] not in old.ensemble, (before[lid], md)
            else:
                assert changed == [], (before[lid], md)
        got, reply = java_client.read(c.uri, lid, password=password, v2=v2)
        assert got == entries, lid
        assert reply["metadata"]["state"] == "CLOSED", reply
    # Where we copied, the metadata names the bookie we wrote to.
    for a in done:
        if a["action"] == "COPY":
            md = after[a["ledger_id"]]
            seg = next(s for s in md.segments if s.first_entry_id == a["segment_first_entry_id"])
            assert a["new_bookie"] in seg.ensemble, (a, md)
    return len(ours), len(theirs), sum(our_fences.values())
