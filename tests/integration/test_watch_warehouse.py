"""``bkaudit watch`` as a real process when things around it fail: the warehouse cannot be
written (the repair goes on, the rows wait in the spool and reach the Delta tables once it
can), and its own ZooKeeper session expires (it rejoins, is elected again, and does not act on
what it knew before). docs/watch.md, "Unreachable warehouse" and "ZooKeeper session expiry"."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from jobs.tables.schema import ACTIONS, AUDIT_RUNS, BOOKIES, FRAGMENTS, LEDGERS
from jobs.watch.election import election_path
from tests.audit_helpers import audit_cluster
from tests.integration.test_watch import (
    Watch,
    assert_clean,
    ledgers,
    marks,
    naming,
    repaired,
    rows,
    settled,
    wait_for,
    watching,
)

pytestmark = pytest.mark.integration


def spooled(spool: Path) -> list[str]:
    return sorted(n for n in os.listdir(spool) if n.endswith(".jsonl")) if spool.exists() else []


def test_unwritable_warehouse_repair_goes_on_and_rows_are_written_later(
    tmp_path: Path, zk_chroot: str
) -> None:
    wh, spool = tmp_path / "wh", tmp_path / "spool"
    with audit_cluster(tmp_path / "sb", zk_chroot, bookies=4) as c:
        victim = c.bookie_ids[3]
        ids = [md.ledger_id for md in ledgers(c, victim, n=2, entries=10)]
        with watching(
            c.zk, str(wh), tmp_path, "w1", "--lost-bookie-recovery-delay", "0s",
            "--spool-dir", str(spool),
        ) as w:  # fmt: skip
            w.wait_role("leader")
            wait_for(lambda: rows(str(wh), AUDIT_RUNS), 20, "the take-over audit's row", w)
            # Unwritable even for root: the warehouse path is a regular file, so every table
            # path is under a file (ENOTDIR).
            wh.rename(tmp_path / "wh.real")
            wh.write_text("not a directory\n")
            c.sandbox.kill_bookie(victim)
            wait_for(lambda: repaired(c, ids, victim), 60, "repair", w)
            wait_for(lambda: settled(w.metrics()), 30, "the clean re-audit", w)
            # The clean re-audit's rows are written by a thread after the time to repair is
            # recorded: wait until the gauge and the spool agree, read on both sides of it.
            seen: dict[str, Any] = {}

            def spool_agrees() -> bool:
                seen["m"], seen["files"] = w.metrics(), spooled(spool)
                gauge = seen["m"]["bkaudit_spooled_files"]
                runs = [n for n in seen["files"] if n.endswith(f"-{AUDIT_RUNS}.jsonl")]
                agree = gauge == len(seen["files"]) == w.metrics()["bkaudit_spooled_files"]
                return agree and len(runs) >= 2  # the loss's audit and the clean re-audit

            wait_for(spool_agrees, 20, "both audits spooled and the gauge to match", w)
            m, files = seen["m"], seen["files"]
            code, body = w.get("/readyz")
            assert (code, json.loads(body)["detail"]) == (503, "warehouse unreachable")
            assert len(files) > 0
            tables = Counter(n.split("-", 2)[2].removesuffix(".jsonl") for n in files)
            # The loss's audit, the repair and the clean re-audit, all kept.
            assert tables[AUDIT_RUNS] >= 2 and tables[ACTIONS] >= 1 and tables[FRAGMENTS] >= 1
            assert m["bkaudit_spooled_rows"] > len(files)
            assert m["bkaudit_warehouse_errors_total"] >= 1
            audits = sum(v for k, v in m.items() if k.startswith("bkaudit_audit_runs_total"))
            written = sum(v for k, v in m.items() if k.startswith("bkaudit_repair_actions_total"))
            # Writable again: the spool drains into the tables, in order, and /readyz is 200.
            wh.unlink()
            (tmp_path / "wh.real").rename(wh)
            wait_for(lambda: w.metrics().get("bkaudit_spooled_files") == 0, 20, "flush", w)
            assert spooled(spool) == [] and w.get("/readyz")[0] == 200
            assert w.metrics()["bkaudit_spooled_rows"] == 0
        assert w.proc.returncode == 0, w.tail()
        assert_clean(c, ids, victim)
        # The bound: with the warehouse unwritable again and a 1 KB spool, the take-over
        # audit's rows go over it. The service keeps them and stops with one error line.
        full = tmp_path / "full"
        full.write_text("not a directory\n")
        small = Watch(
            c.zk, str(full), tmp_path / "w2.log", "--spool-dir", str(tmp_path / "spool2"),
            "--spool-max-bytes", "1KB",
        )  # fmt: skip
        try:
            assert small.proc.wait(20) == 2, small.tail()
        finally:
            small.stop()
        last = small.log.read_text().strip().splitlines()[-1]
        assert last.startswith("watch: SpoolFullError: spool ") and "--spool-max-bytes 1000" in last
        kept = Counter(n.split("-", 2)[2] for n in spooled(tmp_path / "spool2"))
        assert kept == {f"{t}.jsonl": 1 for t in (LEDGERS, BOOKIES, AUDIT_RUNS)}, kept
    log = w.log.read_text()
    assert "spooled" in log and "writable again" in log
    runs = sorted(rows(str(wh), AUDIT_RUNS), key=lambda r: r["started_at"])
    assert len(runs) == audits  # every audit this instance ran has its row: none lost
    assert runs[-1]["status"] == "COMPLETED" and dict(runs[-1]["counts"])["fragments"] == 0
    assert all(r["finished_at"] is not None for r in runs)
    loss = [r for r in runs if dict(r["counts"])["fragments"] > 0]
    assert loss and runs[0] not in loss  # the take-over audit, before the kill, was clean
    frags = [f for f in rows(str(wh), FRAGMENTS) if f["run_id"] == loss[0]["run_id"]]
    assert {f["ledger_id"] for f in frags} == set(ids)
    assert {f["bookie_id"] for f in frags} == {victim}
    assert len(frags) == dict(loss[0]["counts"])["fragments"]
    assert all(f["first_detected_at"] == loss[0]["started_at"] for f in frags)
    # Each run's per-run rows made it too: every ledger it read (a full scan's: all of them),
    # and the bookies with the victim lost.
    led = Counter(r["run_id"] for r in rows(str(wh), LEDGERS))
    assert all(led[r["run_id"]] == dict(r["counts"])["ledgers"] for r in runs), (led, runs)
    full = [r for r in runs if "ledgers_from_index" not in dict(r["counts"])]
    assert full and all(led[r["run_id"]] == len(ids) for r in full), (led, full)
    lost = {(b["run_id"], b["bookie_id"]) for b in rows(str(wh), BOOKIES) if b["state"] == "lost"}
    assert {(r["run_id"], victim) for r in loss} <= lost
    assert (runs[-1]["run_id"], victim) not in lost  # repaired: no ensemble names it
    actions = rows(str(wh), ACTIONS)
    assert len(actions) == written
    copies = [a for a in actions if a["action"] == "COPY" and a["status"] == "DONE"]
    assert {a["ledger_id"] for a in copies} == set(ids)
    assert {a["audit_run_id"] for a in actions} <= {r["run_id"] for r in loss}
    assert all(a["old_bookie"] == victim and a["bytes_copied"] > 0 for a in copies)


def test_session_expired_while_paused_rejoins_and_does_not_act_on_the_old_view(
    tmp_path: Path, zk_chroot: str
) -> None:
    wh = str(tmp_path / "wh")
    with audit_cluster(tmp_path / "sb", zk_chroot, bookies=3) as c:
        victim = c.bookie_ids[2]
        ids = [md.ledger_id for md in ledgers(c, victim, n=2, entries=10)]
        before = {lid: c.store.read_ledger(lid).value for lid in ids}
        members = election_path("/ledgers")
        zk = c.store.zk
        # A 3 s session: the pause outlives it (and a 1 s one would drop its connection on
        # any 0.4 s stall of a loaded machine, a step-down and an extra take-over before the
        # pause); a 3 s delay: the lost bookie becomes due while the process is paused.
        with watching(
            c.zk, wh, tmp_path, "w1", "--zk-session-timeout", "3s",
            "--lost-bookie-recovery-delay", "3s", "--spool-dir", str(tmp_path / "spool"),
        ) as w:  # fmt: skip
            w.wait_role("leader")
            (first,) = zk.get_children(members)
            c.sandbox.stop_bookie(victim)  # unregisters at once
            wait_for(lambda: w.metrics().get('bkaudit_bookies{state="lost"}') == 1, 10, "loss", w)
            paused = time.monotonic()
            os.kill(w.proc.pid, signal.SIGSTOP)
            try:
                # While it sleeps: its session expires (the server deletes its member), the
                # bookie it saw lost comes back, and the delay runs out.
                wait_for(lambda: zk.get_children(members) == [], 15, "the session to expire")
                c.sandbox.bookie(victim).start()
                c.sandbox.wait_registered([victim])
                time.sleep(max(0.0, paused + 3.5 - time.monotonic()))
            finally:
                os.kill(w.proc.pid, signal.SIGCONT)
            resumed = time.monotonic()
            wait_for(
                lambda: (kids := zk.get_children(members)) != [] and kids != [first],
                15,
                "a new election member",
                w,
            )
            w.wait_role("leader", 15)
            wait_for(lambda: w.metrics().get("bkaudit_zk_session_losses_total", 0) >= 1, 10,
                     "the loss counted", w)  # fmt: skip
            wait_for(lambda: w.metrics().get('bkaudit_bookies{state="lost"}') == 0, 10, "back", w)
            # A few cycles of the new term, past what the old delay would have allowed.
            time.sleep(1.5)
            m = w.metrics()
            assert (m["bkaudit_watch_leader"], m["bkaudit_underreplication_marks"]) == (1, 0)
            assert time.monotonic() - resumed < 30
        assert w.proc.returncode == 0, w.tail()
        log = w.log.read_text()
        assert log.count("elected leader") == 2, w.tail()
        assert "due for repair" not in log and "ZooKeeper session LOST" in log
        assert marks(c) == [] and sorted(naming(c, ids, victim)) == sorted(ids)
        assert {lid: c.store.read_ledger(lid).value for lid in ids} == before
    assert rows(wh, ACTIONS) == []
    # The new term started from a fresh reading: its take-over audit saw every bookie.
    runs = sorted(rows(wh, AUDIT_RUNS), key=lambda r: r["started_at"])
    assert len(runs) == 2 and dict(runs[-1]["counts"])["fragments"] == 0, runs
    last = [b for b in rows(wh, BOOKIES) if b["run_id"] == runs[-1]["run_id"]]
    assert {b["bookie_id"]: b["state"] for b in last}[victim] != "lost"
