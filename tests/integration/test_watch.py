"""``bkaudit watch`` as a real subprocess on a real sandbox: a bookie killed -9 is repaired
with nothing typed, a bookie back within the delay costs nothing, a bookie back mid-repair
stops it and its marks are cleared, a second loss is marked without waiting for the first's
repair, a killed leader's standby finishes, the disable flag pauses, SIGTERM mid-copy exits
cleanly, and the metrics agree with the Delta tables."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from bklib.meta.model import LedgerMetadata
from bklib.meta.paths import ur_ledger_path
from bklib.meta.underreplication import UnderReplicationManager
from bklib.testing.metrics_page import samples
from bklib.testing.ports import free_port
from jobs.tables import delta
from jobs.tables.schema import ACTIONS, AUDIT_RUNS, FRAGMENTS
from tests.audit_helpers import AuditCluster, audit_cluster
from tests.cli_helpers import REPO, bkaudit
from tests.http_helpers import http_get
from tests.repair_helpers import assert_fully_replicated

pytestmark = pytest.mark.integration

SESSION = "3s"
"""The watch's ZooKeeper session (the sandbox's bookies use 4 s)."""

SLOW_COPY = ("--lost-bookie-recovery-delay", "0s", "--rate", "1KB", "--ledgers-in-flight", "1")
"""A watch that repairs at once and copies slowly (about 1 KB/s, one ledger at a time), so
a test acts while its repair is under way."""


class Watch:
    """``python -m jobs.cli watch`` in a subprocess, its log in a file."""

    def __init__(self, zk: str, warehouse: str, log: Path, *extra: str) -> None:
        self.port = free_port()
        self.log = log
        argv = [
            sys.executable, "-m", "jobs.cli", "watch", "--zk", zk, "--warehouse", warehouse,
            "--every", "off", "--zk-session-timeout", SESSION, "--grace-period", "0s",
            "--retry-interval", "1s", "--poll-interval", "0.5s", "--read-timeout", "3s",
            "--connect-timeout", "2s", "--metrics-port", str(self.port),
            "--metrics-host", "127.0.0.1", "--instance-id", log.stem, *extra,
        ]  # fmt: skip
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )  # fmt: skip

    def get(self, path: str) -> tuple[int, str]:
        return http_get(self.port, path)

    def role(self) -> str | None:
        try:
            return str(json.loads(self.get("/readyz")[1]).get("role"))
        except (OSError, ValueError):
            return None

    def wait_role(self, role: str, timeout: float = 60.0) -> None:
        wait_for(lambda: self.role() == role, timeout, f"{self.log.stem} {role}", self)

    def metrics(self) -> dict[str, float]:
        status, page = self.get("/metrics")
        assert status == 200, (status, page)
        return samples(page)

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-60:])

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()

    def kill9(self) -> None:
        self.proc.kill()
        self.proc.wait()


def wait_for(cond: Callable[[], Any], timeout: float, what: str, *watches: Watch) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        for w in watches:
            assert w.proc.poll() is None or w.proc.returncode == 0, w.tail()
        time.sleep(0.25)
    logs = "\n\n".join(w.tail() for w in watches)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{logs}")


@contextmanager
def watching(zk: str, warehouse: str, tmp: Path, name: str, *extra: str) -> Iterator[Watch]:
    w = Watch(zk, warehouse, tmp / f"{name}.log", *extra)
    try:
        yield w
    finally:
        w.stop()


def ledgers(c: AuditCluster, victim: str, n: int = 6, entries: int = 20) -> list[LedgerMetadata]:
    """``n`` closed 3/2/2 ledgers naming ``victim``, and one open one (a gone writer)."""
    others = [b for b in c.bookie_ids if b != victim]
    out = [
        c.ledger([victim, others[i % len(others)], others[(i + 1) % len(others)]], entries,
                 wq=2, aq=2)
        for i in range(n)
    ]  # fmt: skip
    out.append(c.ledger([others[0], victim, others[1]], entries, wq=2, aq=2, closed=False))
    return out


def marks(c: AuditCluster) -> list[Any]:
    return list(UnderReplicationManager(c.store.zk).list_underreplicated())


def locked(c: AuditCluster) -> bool:
    """Some ledger's under-replication lock is held: a repair is copying."""
    path = UnderReplicationManager(c.store.zk).base + "/locks"
    return bool(c.store.meta.exists(path) and c.store.meta.children(path))


def naming(c: AuditCluster, ids: list[int], bookie: str) -> list[int]:
    return [lid for lid in ids if bookie in c.store.read_ledger(lid).value.bookies()]


def repaired(c: AuditCluster, ids: list[int], bookie: str) -> bool:
    return not naming(c, ids, bookie) and not marks(c)


def assert_clean(c: AuditCluster, ids: list[int], victim: str) -> None:
    """Every entry on every replica of its write set, read back; no segment doubled."""
    for lid in ids:
        md = assert_fully_replicated(c.store, c.client, lid, excluded=frozenset({victim}))
        firsts = [s.first_entry_id for s in md.segments]
        assert firsts == sorted(set(firsts)), (lid, firsts)
        for s in md.segments:
            assert len(set(s.ensemble)) == len(s.ensemble), (lid, s)


def settled(m: dict[str, float]) -> bool:
    return (
        m.get("bkaudit_time_to_repair_seconds_count") == 1
        and m.get('bkaudit_bookies{state="lost"}') == 0
        and m.get("bkaudit_underreplication_marks") == 0
    )


def rows(warehouse: str, table: str) -> list[dict[str, Any]]:
    return list(delta.read_rows(warehouse, table)) if delta.table_exists(warehouse, table) else []


def test_killed_bookie_is_repaired_with_nothing_typed_and_metrics_match_tables(
    tmp_path: Path, store_locator: str
) -> None:
    wh = str(tmp_path / "wh")
    with audit_cluster(tmp_path / "sb", store_locator, bookies=4) as c:
        victim = c.bookie_ids[3]
        ids = [md.ledger_id for md in ledgers(c, victim)]
        with watching(c.zk, wh, tmp_path, "w1", "--lost-bookie-recovery-delay", "0s") as w:
            w.wait_role("leader")
            t0 = time.monotonic()
            c.sandbox.kill_bookie(victim)
            wait_for(lambda: repaired(c, ids, victim), 90, "repair", w)
            # The clean re-audit (the watch's latest lost audit) resolves the loss; the time
            # to repair is recorded after it, so it is bounded by the time until then.
            wait_for(lambda: settled(w.metrics()), 30, "time to repair", w)
            took = time.monotonic() - t0
            m = w.metrics()
            assert w.get("/healthz")[0] == 200 and w.get("/readyz")[0] == 200
        assert w.proc.returncode == 0, w.tail()
        assert_clean(c, ids, victim)
        st = bkaudit("status", "--zk", c.zk, "--warehouse", wh, "--format", "json")
        # The dead bookie is lost (its cookie stays until decommission): exit 1.
        assert st.returncode == 1, st.stderr
        status = json.loads(st.stdout)
        assert (status["lost"], status["unreachable"], status["marked_ledgers"]) == (
            [victim],
            [],
            0,
        )
        assert sorted(status["writable"]) == sorted(set(c.bookie_ids) - {victim})
        assert status["last_audits"]["lost"]["status"] == "COMPLETED"
        text = bkaudit("status", "--zk", c.zk, "--warehouse", wh).stdout
        assert "under-replicated ledgers (marks): 0" in text and "java auditor: none" in text
    runs = sorted(
        (r for r in rows(wh, AUDIT_RUNS) if r["check"] == "lost"), key=lambda r: r["started_at"]
    )
    assert runs and dict(runs[-1]["counts"])["fragments"] == 0, runs[-1]
    fragments = [f for f in rows(wh, FRAGMENTS) if f["run_id"] == runs[-1]["run_id"]]
    assert fragments == []
    actions = rows(wh, ACTIONS)
    copies = [a for a in actions if a["action"] == "COPY" and a["status"] == "DONE"]
    assert {a["ledger_id"] for a in copies} == set(ids)
    assert all(a["old_bookie"] == victim for a in copies)
    assert len(copies) == len({(a["ledger_id"], a["segment_first_entry_id"]) for a in copies})
    # The metrics are the tables' numbers.
    assert m["bkaudit_copied_bytes_total"] == sum(a["bytes_copied"] for a in copies) > 0
    assert m["bkaudit_copied_entries_total"] == sum(a["entries_copied"] for a in copies)
    for sev in ("NO_REPLICA", "BELOW_AQ", "BELOW_WQ"):
        assert m[f'bkaudit_underreplicated_fragments{{check="lost",severity="{sev}"}}'] == 0
    assert m["bkaudit_watch_leader"] == 1
    assert m['bkaudit_bookies{state="lost"}'] == 0 and m['bkaudit_bookies{state="writable"}'] == 3
    assert m["bkaudit_underreplication_marks"] == 0
    assert 0 < m["bkaudit_time_to_repair_seconds_sum"] <= took + 1
    # The gauge is the schedule's: the last full scan (the runs of the index's ledgers that
    # answered the loss are no run of the schedule).
    full = [r for r in runs if "ledgers_from_index" not in dict(r["counts"])]
    assert len(full) < len(runs)
    assert m['bkaudit_last_audit_timestamp_seconds{check="lost"}'] == pytest.approx(
        full[-1]["finished_at"].timestamp(), abs=0.001
    )
    dones = [a for a in actions if a["status"] == "DONE"]
    assert m['bkaudit_repair_actions_total{action="COPY",status="DONE"}'] == len(copies)
    assert (
        sum(v for k, v in m.items() if k.startswith("bkaudit_repair_actions_total")) == len(actions)
        and dones
    )


def test_bookie_back_within_the_delay_costs_nothing(tmp_path: Path, zk_chroot: str) -> None:
    wh = str(tmp_path / "wh")
    with audit_cluster(tmp_path / "sb", zk_chroot, bookies=4) as c:
        victim = c.bookie_ids[3]
        ids = [md.ledger_id for md in ledgers(c, victim, n=3)]
        before = {lid: c.store.read_ledger(lid).value for lid in ids}
        UnderReplicationManager(c.store.zk).set_lost_bookie_recovery_delay(30)  # the znode
        with watching(c.zk, wh, tmp_path, "w1") as w:
            w.wait_role("leader")
            c.sandbox.stop_bookie(victim)  # unregisters at once
            wait_for(lambda: w.metrics().get('bkaudit_bookies{state="lost"}') == 1, 20, "loss",
                     w)  # fmt: skip
            assert w.metrics()["bkaudit_lost_bookie_recovery_delay_seconds"] == 30
            b = c.sandbox.bookie(victim)
            b.start()
            c.sandbox.wait_registered([victim])
            wait_for(lambda: w.metrics().get('bkaudit_bookies{state="lost"}') == 0, 20, "back", w)
            time.sleep(2)
        assert "due for repair" not in w.log.read_text()
        assert marks(c) == []
        assert {lid: c.store.read_ledger(lid).value for lid in ids} == before
    assert rows(wh, ACTIONS) == []


def test_bookie_back_mid_repair_stops_it_and_its_marks_are_cleared(
    tmp_path: Path, zk_chroot: str
) -> None:
    """A bookie that flaps past the delay: lost, marked and being repaired, then registered
    again with its data. No more of its ledgers are copied, and the marks the cut-off repair
    left are checked (every entry read back) and cleared, as a ReplicationWorker clears
    them."""
    wh = str(tmp_path / "wh")
    with audit_cluster(tmp_path / "sb", zk_chroot, bookies=4) as c:
        victim = c.bookie_ids[3]
        ids = [md.ledger_id for md in ledgers(c, victim, n=8, entries=60)]
        with watching(c.zk, wh, tmp_path, "w1", *SLOW_COPY) as w:
            w.wait_role("leader")
            c.sandbox.kill_bookie(victim)
            wait_for(lambda: len(marks(c)) == len(ids) and locked(c), 60, "marks, a copy", w)
            c.sandbox.bookie(victim).start()
            c.sandbox.wait_registered([victim])
            wait_for(lambda: not marks(c) and not locked(c), 60, "the marks cleared", w)
            wait_for(lambda: w.metrics().get('bkaudit_bookies{state="lost"}') == 0, 20, "back", w)
            log = w.log.read_text()
        assert f"bookie {victim} registered again: its repair stops" in log, w.tail()
        still = naming(c, ids, victim)
        assert still, "every ledger was moved: the repair did not stop"
        # The moved ones on their new bookie, the others on the victim; the open ledger, when
        # not reached, is left open (its writer's bookie is back: nothing to fence for).
        for lid in ids:
            if c.store.read_ledger(lid).value.is_closed:
                assert_fully_replicated(c.store, c.client, lid)
    actions = rows(wh, ACTIONS)
    copied = {a["ledger_id"] for a in actions if a["action"] == "COPY" and a["status"] == "DONE"}
    assert copied and not copied & set(still), (copied, still)
    cleared = {a["ledger_id"] for a in actions if a["action"] == "CLEAR_MARK"}
    assert set(still) <= cleared and all(
        a["status"] == "DONE" for a in actions if a["action"] == "CLEAR_MARK"
    ), actions


def test_a_bookie_lost_during_a_repair_is_marked_without_waiting_for_it(
    tmp_path: Path, zk_chroot: str
) -> None:
    """A second loss while the first one's repair copies slowly: the repair stops before its
    next ledger, and the next cycle marks the second bookie's ledgers while the first's are
    still being moved (as BookKeeper's Auditor marks a loss without waiting for its
    ReplicationWorkers)."""
    wh = str(tmp_path / "wh")
    with audit_cluster(tmp_path / "sb", zk_chroot, bookies=5) as c:
        first, second, rest = c.bookie_ids[3], c.bookie_ids[4], c.bookie_ids[:3]

        def on(bookie: str, n: int, entries: int) -> list[int]:
            return [
                c.ledger([bookie, rest[i % 3], rest[(i + 1) % 3]], entries, wq=2, aq=2).ledger_id
                for i in range(n)
            ]

        ids1, ids2 = on(first, 8, 60), on(second, 3, 20)
        with watching(c.zk, wh, tmp_path, "w1", *SLOW_COPY) as w:
            w.wait_role("leader")
            c.sandbox.kill_bookie(first)
            wait_for(lambda: locked(c), 60, "the first loss's repair copying", w)
            c.sandbox.kill_bookie(second)
            # Each of the second's ledgers marked, or already moved off it: a new loss's first
            # ledgers are marked and repaired at once (jobs/watch/first_ledgers.py).
            wait_for(
                lambda: not set(naming(c, ids2, second)) - {m.ledger_id for m in marks(c)},
                30,
                "the second's marks",
                w,
            )
            assert naming(c, ids1, first), "the first repair ended before the second was marked"
            log = w.log.read_text()
        assert "during a repair, which stops" in log, w.tail()


def test_leader_killed_mid_repair_standby_finishes(tmp_path: Path, store_locator: str) -> None:
    wh = str(tmp_path / "wh")
    with audit_cluster(tmp_path / "sb", store_locator, bookies=4) as c:
        victim = c.bookie_ids[3]
        ids = [md.ledger_id for md in ledgers(c, victim, n=8, entries=60)]
        # The leader copies slowly: it is mid-copy when killed. The standby copies at full
        # speed.
        with watching(c.zk, wh, tmp_path, "a", *SLOW_COPY) as a:
            a.wait_role("leader")
            with watching(c.zk, wh, tmp_path, "b", "--lost-bookie-recovery-delay", "0s") as b:
                b.wait_role("standby")
                c.sandbox.kill_bookie(victim)
                wait_for(lambda: locked(c), 60, "a repair lock", a, b)
                a.kill9()
                assert naming(c, ids, victim), "the leader finished before it was killed"
                b.wait_role("leader", 30)
                wait_for(lambda: repaired(c, ids, victim), 90, "the standby's repair", b)
        assert b.proc.returncode == 0, b.tail()
        assert_clean(c, ids, victim)
    # No fragment copied twice to the metadata: one METADATA_UPDATE DONE per segment moved.
    updates = [a for a in rows(wh, ACTIONS) if a["action"] == "METADATA_UPDATE"]
    done = [(u["ledger_id"], u["segment_first_entry_id"]) for u in updates if u["status"] == "DONE"]
    assert len(done) == len(set(done))


def test_disable_flag_pauses_repair_and_clearing_it_resumes(tmp_path: Path, zk_chroot: str) -> None:
    wh = str(tmp_path / "wh")
    with audit_cluster(tmp_path / "sb", zk_chroot, bookies=4) as c:
        victim = c.bookie_ids[3]
        ids = [md.ledger_id for md in ledgers(c, victim, n=3)]
        urm = UnderReplicationManager(c.store.zk)
        urm.disable_replication()
        with watching(c.zk, wh, tmp_path, "w1", "--lost-bookie-recovery-delay", "0s") as w:
            w.wait_role("leader")
            c.sandbox.kill_bookie(victim)
            # Marked (the Auditor's part), not repaired.
            wait_for(lambda: len(marks(c)) == len(ids), 30, "marks", w)
            wait_for(lambda: w.metrics().get("bkaudit_repair_paused") == 1, 10, "paused", w)
            time.sleep(3)
            assert sorted(naming(c, ids, victim)) == sorted(ids)
            assert not [a for a in rows(wh, ACTIONS) if a["action"] == "COPY"]
            urm.enable_replication()
            wait_for(lambda: repaired(c, ids, victim), 60, "repair after enable", w)
        assert_clean(c, ids, victim)


def test_sigterm_mid_copy_exits_cleanly_and_a_later_run_converges(
    tmp_path: Path, zk_chroot: str
) -> None:
    wh = str(tmp_path / "wh")
    with audit_cluster(tmp_path / "sb", zk_chroot, bookies=4) as c:
        victim = c.bookie_ids[3]
        ids = [md.ledger_id for md in ledgers(c, victim, n=6, entries=60)]
        urm = UnderReplicationManager(c.store.zk)
        slow = ("--lost-bookie-recovery-delay", "0s", "--rate", "2KB", "--ledgers-in-flight", "1")
        w = Watch(c.zk, wh, tmp_path / "w1.log", *slow)
        try:
            w.wait_role("leader")
            c.sandbox.kill_bookie(victim)
            zk = c.store.zk
            wait_for(lambda: locked(c), 60, "a repair lock", w)
            t0 = time.monotonic()
            assert w.stop() == 0, w.tail()
            assert time.monotonic() - t0 < 30
        finally:
            w.stop()
        # Clean: its locks are released and its election member gone, at once.
        assert zk.get_children(urm.base + "/locks") == []
        assert zk.get_children("/bkaudit/ledgers/watch-leader") == []
        assert naming(c, ids, victim), "finished before the SIGTERM"
        with watching(c.zk, wh, tmp_path, "w2", "--lost-bookie-recovery-delay", "0s") as w2:
            wait_for(lambda: repaired(c, ids, victim), 90, "the next run's repair", w2)
        assert_clean(c, ids, victim)


def test_a_cycle_that_keeps_raising_turns_healthz_red(tmp_path: Path, zk_chroot: str) -> None:
    # A corrupt under-replication mark makes every leader cycle raise (the marks are read each
    # cycle, and one that cannot be parsed is never guessed at): the loop still beats, but
    # /healthz must not stay green (--max-failed-cycles 3).
    with audit_cluster(tmp_path / "sb", zk_chroot, bookies=3) as c:
        wh = str(tmp_path / "wh")
        with watching(c.zk, wh, tmp_path, "w1", "--max-failed-cycles", "3") as w:
            w.wait_role("leader")
            assert w.get("/healthz")[0] == 200
            mark = ur_ledger_path("/ledgers", 42)
            c.store.zk.create(mark, b"replica: 5 garbage {", makepath=True)
            wait_for(lambda: w.get("/healthz")[0] == 503, 60, "healthz red", w)
            _, body = w.get("/healthz")
            assert "cycles failed in a row" in body and "unparsable" in body, body
            assert w.metrics()["bkaudit_watch_cycle_failures_total"] >= 3
            c.store.zk.delete(mark)  # mended: the next cycle succeeds and resets the count
            wait_for(lambda: w.get("/healthz")[0] == 200, 60, "healthz green again", w)


def test_audits_that_do_not_complete_turn_healthz_red(tmp_path: Path, zk_chroot: str) -> None:
    # A corrupt ledger znode makes every lost audit COMPLETED_WITH_ERRORS (the run missed a
    # ledger), and a lost bookie keeps the watch auditing every --retry-interval (while a
    # ledger is unreadable the loss is never resolved). Each of those cycles fails as a cycle
    # that raises does: /healthz turns red (--max-failed-cycles 3) while the repair still goes
    # on, and green again once the znode is mended and an audit completes.
    with audit_cluster(tmp_path / "sb", zk_chroot, bookies=4) as c:
        wh = str(tmp_path / "wh")
        victim = c.bookie_ids[3]
        ids = [md.ledger_id for md in ledgers(c, victim, n=2, entries=10)]
        bad = c.ledger(c.bookie_ids[:3], 5, wq=2, aq=2)  # never names the victim
        bad_path = c.store.path_for(bad.ledger_id)
        good_bytes = c.store.zk.get(bad_path)[0]
        c.store.zk.set(bad_path, b"BookieMetadataFormatVersion\t3\n\x05garbage")
        flags = ("--lost-bookie-recovery-delay", "0s", "--max-failed-cycles", "3")
        with watching(c.zk, wh, tmp_path, "w1", *flags) as w:
            w.wait_role("leader")
            c.sandbox.kill_bookie(victim)
            wait_for(lambda: w.get("/healthz")[0] == 503, 60, "healthz red", w)
            _, body = w.get("/healthz")
            assert "cycles failed in a row" in body, body
            assert "COMPLETED_WITH_ERRORS" in body and "1 unreadable znodes" in body, body
            m = w.metrics()
            assert m["bkaudit_watch_cycle_failures_total"] >= 3, m
            assert m['bkaudit_audit_runs_total{check="lost",status="COMPLETED_WITH_ERRORS"}'] >= 3
            # The cluster comes first: the readable ledgers were repaired all the same.
            wait_for(lambda: not naming(c, ids, victim), 60, "repair", w)
            assert m['bkaudit_bookies{state="lost"}'] == 1  # never resolved on a partial view
            c.store.zk.set(bad_path, good_bytes)  # mended: the next audit completes
            wait_for(lambda: w.get("/healthz")[0] == 200, 60, "healthz green again", w)
            wait_for(lambda: w.metrics().get('bkaudit_bookies{state="lost"}') == 0, 30, "resolved",
                     w)  # fmt: skip
        assert w.proc.returncode == 0, w.tail()
        text = w.log.read_text()
        # Each failed cycle's line names the run and why.
        runs = [r for r in rows(wh, AUDIT_RUNS) if r["status"] == "COMPLETED_WITH_ERRORS"]
        assert runs and all(
            f"lost audit {r['run_id']} COMPLETED_WITH_ERRORS: 1 unreadable znodes" in text
            for r in runs
        ), text[-3000:]
        assert_clean(c, ids, victim)
