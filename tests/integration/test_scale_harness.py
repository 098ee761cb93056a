"""The scale bench's small variant, as a test of correctness (the figures are in bench/scale.py):
a seeded plan on a bookie farm, one identity lost and entries damaged on another; the audits
find exactly what the plan and the damage list say, the repair leaves nothing to find, a
stalled identity is unknown, never missing, and an audit whose ZooKeeper session expires in the
middle of its scan fails with one line and records nothing as completed.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bklib.states import DEFAULT_LEDGERS_ROOT, CountKey, Reason, RunStatus
from bklib.testing.scale.farm import FarmClient
from bklib.testing.scale.harness import running_farm
from bklib.testing.scale.seeder import seed_ledgers
from bklib.testing.zkclient import connect
from jobs.runtime.exit_status import ExitStatus
from jobs.tables import delta
from jobs.tables.schema import ACTIONS, AUDIT_RUNS, FRAGMENTS
from tests.bookie_helpers import wait_for_no_znode
from tests.cli_helpers import REPO, bkaudit, error_lines, frozen_past_its_session

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

LEDGERS = 3000
BOOKIES = 24


@dataclass
class ScaleCluster:
    zk: str
    farm: FarmClient


@pytest.fixture(scope="module")
def cluster(zk_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScaleCluster]:  # type: ignore[no-untyped-def]
    base = tmp_path_factory.mktemp("scale")
    with (
        zk_server.private_chroot("scale") as zk,
        running_farm(zk, base / "farm", bookies=BOOKIES, ledgers=LEDGERS) as (farm, _),
    ):
        report = seed_ledgers(zk, farm.plan)
        assert (report.created, report.existing) == (LEDGERS, 0)
        yield ScaleCluster(zk, farm)


def _audit(
    c: ScaleCluster, warehouse: Path, check: str, status: int = ExitStatus.OK
) -> dict[str, Any]:
    out = bkaudit(
        "audit", "--zk", c.zk, "--warehouse", str(warehouse), "--check", check,
        "--executor", "local", "--read-timeout", "2", "--connect-timeout", "2", timeout=600,
    )  # fmt: skip
    assert out.returncode == status, out.stderr[-3000:]
    return delta.latest_run(str(warehouse)) or {}


def _found(warehouse: Path, run_id: object) -> set[tuple[int, int, str, str]]:
    return {
        (r["ledger_id"], r["segment_first_entry_id"], r["bookie_id"], r["reason"])
        for r in delta.read_rows(str(warehouse), FRAGMENTS)
        if r["run_id"] == run_id
    }


def test_audits_and_repair_are_exact_against_the_plan_and_the_damage(
    cluster: ScaleCluster, tmp_path: Path
) -> None:
    farm, plan = cluster.farm, cluster.farm.plan
    victim, damaged = farm.bookies[5], farm.bookies[11]
    # The damage list: the first entry of a few closed ledgers on ``damaged`` that do not name
    # the victim (their findings are ENTRIES_MISSING alone).
    damage: dict[int, int] = {}
    for lp in plan:
        md = lp.metadata
        held = lp.entries_on(damaged)
        if md.is_closed and held and victim not in md.bookies() and len(damage) < 6:
            assert farm.damage(damaged, lp.ledger_id, held[:1]) == held[:1]
            damage[lp.ledger_id] = held[0]
    farm.stop(victim)
    zk = connect(cluster.zk)
    try:
        wait_for_no_znode(zk, f"{DEFAULT_LEDGERS_ROOT}/available/{victim}")
    finally:
        zk.stop()
    naming = plan.segments_naming(victim)
    wh = tmp_path / "warehouse"

    run = _audit(cluster, wh, "lost")
    assert run["status"] == RunStatus.COMPLETED, run
    assert dict(run["counts"])[CountKey.LEDGERS] == LEDGERS, run
    assert _found(wh, run["run_id"]) == {(lid, f, victim, Reason.BOOKIE_LOST) for lid, f in naming}

    run = _audit(cluster, wh, "replicas")
    assert run["status"] == RunStatus.COMPLETED, run
    missing = {
        (lid, plan.by_id(lid).metadata.segments[  # type: ignore[union-attr]
            plan.by_id(lid).metadata.segment_index_for(e)  # type: ignore[union-attr]
        ].first_entry_id, damaged, Reason.ENTRIES_MISSING)
        for lid, e in damage.items()
    }  # fmt: skip
    lost = {(lid, f, victim, Reason.BOOKIE_LOST) for lid, f in naming}
    assert _found(wh, run["run_id"]) == lost | missing

    out = bkaudit(
        "rereplicate", "--zk", cluster.zk, "--warehouse", str(wh), "--executor", "local",
        "--grace-period", "0s", "--read-timeout", "3", timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    every = delta.read_rows(str(wh), ACTIONS)
    # Pulsar's topics would be unloaded after a metadata change; no broker here, so each unload
    # is a MANUAL step with the command to run instead (nothing failed: it was not asked for).
    unloads = [a for a in every if a["action"] == "UNLOAD_TOPIC"]
    assert unloads and all("no --pulsar-admin-url" in a["error"] for a in unloads)
    assert {a["status"] for a in unloads} == {"MANUAL"}
    acts = [a for a in every if a["action"] != "UNLOAD_TOPIC"]
    assert {a["status"] for a in acts} == {"DONE"}, out.stdout[:3000]
    repaired = {a["ledger_id"] for a in acts}
    assert repaired == {lid for lid, _ in naming} | set(damage)
    # Missing entries go back to the bookie that lost them; the ensemble stays.
    in_place = {
        a["ledger_id"]
        for a in acts
        if a["action"] == "COPY" and a["old_bookie"] == a["new_bookie"] == damaged
    }
    assert in_place == set(damage)
    # A closed ledger's copies are exactly the victim's stripe (none where it held no entry).
    copied: dict[int, int] = {}
    for a in acts:
        if a["action"] == "COPY":
            copied[a["ledger_id"]] = copied.get(a["ledger_id"], 0) + a["entries_copied"]
    for lid in repaired - set(damage):
        lp = plan.by_id(lid)
        assert lp is not None
        if lp.metadata.is_closed:
            assert copied.get(lid, 0) == len(lp.entries_on(victim)), lid

    run = _audit(cluster, wh, "replicas")
    assert run["status"] == RunStatus.COMPLETED, run
    assert _found(wh, run["run_id"]) == set()
    runs = delta.read_rows(str(wh), AUDIT_RUNS)
    assert len(runs) == 3


def test_a_stalled_identity_is_unreachable_never_missing(
    cluster: ScaleCluster, tmp_path: Path
) -> None:
    farm, plan = cluster.farm, cluster.farm.plan
    stalled = farm.bookies[17]
    farm.stall(stalled)
    try:
        wh = tmp_path / "warehouse"
        run = _audit(cluster, wh, "replicas", ExitStatus.INCOMPLETE)  # unknown is not clean
    finally:
        farm.clear(stalled)
    found = _found(wh, run["run_id"])
    # Every finding is about the stalled identity, and none says its entries are missing.
    assert {(b, r) for _, _, b, r in found} == {(stalled, Reason.BOOKIE_UNREACHABLE)}
    # Each segment of a closed ledger that gave it entries is among them.
    holding = set()
    for lp in plan:
        md = lp.metadata
        if not md.is_closed:
            continue
        for i, seg in enumerate(md.segments):
            last = md.segment_last_entry_id(i)
            if any(lp.holds(stalled, e) for e in range(seg.first_entry_id, last + 1)):
                holding.add((lp.ledger_id, seg.first_entry_id))
    on_stalled = {(lid, f) for lid, f, _, _ in found}
    assert holding and holding <= on_stalled, sorted(holding - on_stalled)[:5]
    assert run["status"] == RunStatus.COMPLETED_WITH_ERRORS, run


def test_a_session_expired_mid_scan_fails_the_run_and_records_nothing_completed(
    cluster: ScaleCluster, tmp_path: Path
) -> None:
    wh = tmp_path / "warehouse"
    # A slow scan (the budget: 250 reads/s, so about 12 s for the plan) and a short session, so
    # a pause of the process (a GC pause, a frozen VM) outlives its sessions mid-scan.
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobs.cli", "audit", "--zk", cluster.zk, "--warehouse", str(wh),
         "--check", "lost", "--executor", "local", "--zk-rate", "250",
         "--zk-session-timeout", "2s"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "BKAUDIT_PROGRESS": "lines"},
    )  # fmt: skip
    lines: list[str] = []
    scanning = threading.Event()

    def follow() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            got = re.search(rf"metadata scan: (\d+)/{LEDGERS} ledgers", line)
            if got and 0 < int(got.group(1)) < LEDGERS:
                scanning.set()

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    try:
        assert scanning.wait(60), "".join(lines)[-3000:]
        proc.send_signal(signal.SIGSTOP)
        time.sleep(5)  # more than twice the session timeout: ZooKeeper expires both sessions
        proc.send_signal(signal.SIGCONT)
        proc.wait(timeout=120)  # stderr has one reader only: the thread, to its end
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(10)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, "", "".join(lines))
    assert done.returncode == ExitStatus.INCOMPLETE, done.stderr[-3000:]
    (line,) = error_lines(done)
    assert "FAILED" in line and "expired" in line, line
    assert "Traceback" not in done.stderr
    runs = delta.read_rows(str(wh), AUDIT_RUNS)
    assert [r["status"] for r in runs] == [RunStatus.FAILED], runs


def _paused_past_its_session(argv: list[str], zk_port: int) -> subprocess.CompletedProcess[str]:
    """Run ``bkaudit ARGV`` with a slow scan (250 reads/s) and a 2 s session, frozen for 5 s
    a second into its scan (3,000 ledgers at 250 reads/s take about 12 s)."""
    return frozen_past_its_session(
        [*argv, "--zk-rate", "250", "--zk-session-timeout", "2s"], zk_port, after=1.0
    )


@pytest.mark.parametrize("command", ["whatif", "recover", "blastradius"])
def test_a_session_expired_mid_scan_is_incomplete_for_every_scanning_command(
    cluster: ScaleCluster, tmp_path: Path, command: str
) -> None:
    bookie = cluster.farm.bookies[3]
    argv = {
        "whatif": ["whatif", "--zk", cluster.zk, "--bookie", bookie],
        "recover": ["recover", bookie, "--zk", cluster.zk, "--warehouse",
                    str(tmp_path / "wh"), "--executor", "local", "--dry-run"],
        "blastradius": ["blastradius", "--zk", cluster.zk, "--warehouse", str(tmp_path / "wh"),
                        "--executor", "local"],
    }[command]  # fmt: skip
    done = _paused_past_its_session(argv, int(cluster.zk.split(":")[1].split("/")[0]))
    assert done.returncode == ExitStatus.INCOMPLETE, (done.stdout[-2000:], done.stderr[-3000:])
    (line,) = error_lines(done)
    assert "expired" in line, line
    assert "Traceback" not in done.stderr
    if command == "whatif":
        assert done.stdout.strip() == ""  # no verdict from a read across the gap


def test_request_groups_read_what_batch_reads_read(cluster: ScaleCluster) -> None:
    """A bookie without v2 batch reads is read by request groups (``read_many``) that span a
    probe's ranges: on ledgers of several segments, the deep check through them finds, entry
    for entry, what it finds through batch reads, the damage in a later segment included."""
    from bklib.audit.checker import CheckSettings
    from bklib.audit.engine import check_ledgers
    from bklib.audit.model import LedgerView
    from bklib.client.pool import SyncBookieClient
    from bklib.states import Check

    farm, plan = cluster.farm, cluster.farm.plan
    lost, damaged = farm.bookies[5], farm.bookies[20]  # the first test stopped bookies[5]
    chosen = [
        lp
        for lp in plan
        if lp.metadata.is_closed
        and len(lp.metadata.segments) > 1
        and lost not in lp.metadata.bookies()
    ][:150]
    # The damage: one entry of ``damaged`` in a segment after the first, on a few ledgers.
    damage: dict[int, int] = {}
    for lp in chosen:
        later = [e for e in lp.entries_on(damaged) if e >= lp.metadata.segments[1].first_entry_id]
        if later and len(damage) < 5:
            assert farm.damage(damaged, lp.ledger_id, later[-1:]) == later[-1:]
            damage[lp.ledger_id] = later[-1]
    assert len(damage) == 5, "the plan should hold multi-segment ledgers on every identity"
    views = [LedgerView.from_metadata(lp.metadata, f"/ledgers/L{lp.ledger_id}", 0) for lp in chosen]

    def check(settings: CheckSettings) -> dict[tuple[int, str], Any]:
        with SyncBookieClient(cluster.zk) as client:
            return {
                (ledger.ledger_id, r.bookie_id): (
                    r.status,
                    r.entries,
                    r.bad_entries,
                    r.unknown_entries,
                )
                for ledger, reports, _ in check_ledgers(
                    views, frozenset(), Check.DEEP, client=client, settings=settings
                )
                for r in reports
            }

    batched = check(CheckSettings(batch_read=frozenset(farm.bookies)))
    grouped = check(CheckSettings(batch_read=frozenset(), reads_in_flight=8))
    assert grouped == batched
    for lid, entry in damage.items():
        _, held, bad, unknown = grouped[(lid, damaged)]
        assert not any(a <= entry <= b for a, b in held), (lid, entry, held)
        assert (bad, unknown) == ((), ())
    # Everything else each bookie was written is held.
    for lp in chosen:
        for b in lp.metadata.bookies():
            _, held, _, _ = grouped[(lp.ledger_id, b)]
            for e in lp.entries_on(b):
                if damage.get(lp.ledger_id) == e and b == damaged:
                    continue
                assert any(a <= e <= z for a, z in held), (lp.ledger_id, b, e)
