"""The local audit with a helper process (jobs.local.scan_shard), on a bookie farm with one
identity lost and a corrupt znode in the helper's half: the same rows and counts as the
single process, and findings exact against the plan, for the lost check and for the sample
check (damaged entries in both halves). A helper that cannot reach the store fails the run,
with nothing recorded as COMPLETED.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bklib.audit.checker import CheckSettings
from bklib.audit.engine import ScanPlan
from bklib.meta.paths import ledger_path
from bklib.meta.stores import open_store
from bklib.states import DEFAULT_LEDGERS_ROOT, Check, CountKey, Reason, RunStatus
from bklib.testing.scale.farm import FarmClient
from bklib.testing.scale.harness import running_farm
from bklib.testing.scale.seeder import seed_ledgers
from bklib.testing.zkclient import connect
from bklib.testing.zkserver import ZooKeeperServer
from jobs.local.audit import LocalAudit
from jobs.local.scan_shard import ScanHelperError, split_dirs
from jobs.runs.audit_run import AuditConfig
from jobs.tables import delta
from jobs.tables.schema import BOOKIES, FRAGMENTS, LEDGERS
from tests.bookie_helpers import wait_for_no_znode

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

N_LEDGERS = 2500
N_BOOKIES = 12


@pytest.fixture(scope="module")
def lost_farm(
    zk_server: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, FarmClient, str]]:
    """A seeded farm whose sixth identity is lost: (connect string, farm, lost bookie)."""
    base = tmp_path_factory.mktemp("split")
    with (
        zk_server.private_chroot("split") as zk,
        running_farm(zk, base / "farm", bookies=N_BOOKIES, ledgers=N_LEDGERS) as (farm, _),
    ):
        assert seed_ledgers(zk, farm.plan).created == N_LEDGERS
        victim = farm.bookies[5]
        farm.stop(victim)
        client = connect(zk)
        try:
            wait_for_no_znode(client, f"{DEFAULT_LEDGERS_ROOT}/available/{victim}")
        finally:
            client.stop()
        yield zk, farm, victim


def _run(
    zk: str,
    warehouse: Path,
    *,
    split: bool,
    helper_zk: str | None = None,
    check: str = Check.LOST,
    fetch: CheckSettings | None = None,
) -> Any:
    config = AuditConfig(
        zk=helper_zk or zk, warehouse=str(warehouse), check=check, fetch=fetch or CheckSettings()
    )
    # The run's own scan reads through a session on ``zk``; the helper opens ``config.zk``.
    with open_store(zk) as session:
        plan = ScanPlan.read(session, DEFAULT_LEDGERS_ROOT)
        return LocalAudit(config, plan, session, split=split).run_all()


def _rows(warehouse: Path, table: str, run_id: str) -> list[dict[str, Any]]:
    """The run's rows without its own identity and times, in a stable order (a table's files
    come back in any order)."""
    drop = {"run_id", "run_date", "detected_at", "first_detected_at"}
    rows = [
        {k: v for k, v in row.items() if k not in drop}
        for row in delta.read_rows(str(warehouse), table, filters=[("run_id", "=", run_id)])
    ]
    return sorted(rows, key=repr)


def test_the_helper_gives_the_single_process_rows(
    lost_farm: tuple[str, FarmClient, str], tmp_path: Path
) -> None:
    zk, farm, victim = lost_farm
    with open_store(zk) as session:
        plan = ScanPlan.read(session, DEFAULT_LEDGERS_ROOT)
    halves = split_dirs(list(plan.dirs), 2)
    assert len(halves) == 2 and all(halves), [len(h) for h in halves]
    # A corrupt znode in the helper's half: counted, and its row kept, as in one process.
    client = connect(zk)
    try:
        leaf = halves[1][-1].path
        corrupt = f"{leaf}/{sorted(client.get_children(leaf))[0]}"
        original, _ = client.get(corrupt)
        client.set(corrupt, b"BookieMetadataFormatVersion\t3\n\x05garbage")
        try:
            one = _run(zk, tmp_path / "one", split=False)
            two = _run(zk, tmp_path / "two", split=True)
        finally:
            client.set(corrupt, original)
    finally:
        client.stop()
    for run in (one, two):
        assert run.status == RunStatus.COMPLETED_WITH_ERRORS, run.counts
        assert run.counts[CountKey.LEDGERS] == N_LEDGERS
        assert run.counts[CountKey.METADATA_ERRORS] == 1
    assert {k: v for k, v in two.counts.items()} == {k: v for k, v in one.counts.items()}
    for table in (LEDGERS, FRAGMENTS, BOOKIES):
        single = _rows(tmp_path / "one", table, one.run_id)
        split = _rows(tmp_path / "two", table, two.run_id)
        assert split == single, table
    rows = _rows(tmp_path / "two", LEDGERS, two.run_id)
    unreadable = {r["ledger_id"] for r in rows if r["error"]}
    assert len(unreadable) == 1
    expected = {
        (lid, first) for lid, first in farm.plan.segments_naming(victim) if lid not in unreadable
    }
    found = {
        (r["ledger_id"], r["segment_first_entry_id"])
        for r in _rows(tmp_path / "two", FRAGMENTS, two.run_id)
        if r["bookie_id"] == victim and r["reason"] == Reason.BOOKIE_LOST
    }
    assert found == expected and expected


def test_a_helper_that_cannot_reach_the_store_fails_the_run(
    lost_farm: tuple[str, FarmClient, str], tmp_path: Path
) -> None:
    zk, _, _ = lost_farm
    with pytest.raises(ScanHelperError, match=r"helper process failed: .*127\.0\.0\.1:1"):
        _run(zk, tmp_path / "wh", split=True, helper_zk="127.0.0.1:1")
    assert delta.latest_run(str(tmp_path / "wh")) is None  # nothing recorded as finished


@pytest.fixture(scope="module")
def damaged(lost_farm: tuple[str, FarmClient, str]) -> tuple[str, dict[int, int]]:
    """One damaged entry in three closed ledgers of each half, on a live bookie, in ledgers
    that do not name the lost one: (the damaged bookie, ledger -> entry)."""
    zk, farm, victim = lost_farm
    with open_store(zk) as session:
        plan = ScanPlan.read(session, DEFAULT_LEDGERS_ROOT)
    helper_dirs = tuple(d.path + "/" for d in split_dirs(list(plan.dirs), 2)[1])

    def in_helper(lid: int) -> bool:
        return ledger_path(DEFAULT_LEDGERS_ROOT, lid, plan.kind).startswith(helper_dirs)

    bookie = farm.bookies[2]
    damage: dict[int, int] = {}
    per_half = {True: 0, False: 0}
    for lp in farm.plan:
        md, held = lp.metadata, lp.entries_on(bookie)
        half = in_helper(lp.ledger_id)
        if md.is_closed and held and victim not in md.bookies() and per_half[half] < 3:
            assert farm.damage(bookie, lp.ledger_id, held[-1:]) == held[-1:]
            damage[lp.ledger_id] = held[-1]
            per_half[half] += 1
    assert per_half == {True: 3, False: 3}
    return bookie, damage


@pytest.mark.parametrize("check", [Check.SAMPLE, Check.REPLICAS])
def test_a_check_that_reads_entries_on_two_processes_gives_the_single_process_rows(
    lost_farm: tuple[str, FarmClient, str],
    damaged: tuple[str, dict[int, int]],
    tmp_path: Path,
    check: str,
) -> None:
    zk, farm, victim = lost_farm
    bookie, damage = damaged
    # The sample reads every entry (so the damage is found whatever the picks), the same
    # picks each run; replicas lists each bookie's entries.
    fetch = CheckSettings(read_timeout=3.0, verify_percentage=100.0, sample_seed=11)
    one = _run(zk, tmp_path / "one", split=False, check=check, fetch=fetch)
    two = _run(zk, tmp_path / "two", split=True, check=check, fetch=fetch)
    for run in (one, two):
        assert run.status == RunStatus.COMPLETED, run.counts
        assert run.counts[CountKey.LEDGERS] == N_LEDGERS
    # The counts include the bookies' capabilities (replicas asks each bookie once).
    assert dict(two.counts) == dict(one.counts)
    assert two.counts[CountKey.BOOKIE_LEDGER_PAIRS] > N_LEDGERS  # both halves' answers
    for table in (LEDGERS, FRAGMENTS, BOOKIES):
        assert _rows(tmp_path / "two", table, two.run_id) == _rows(
            tmp_path / "one", table, one.run_id
        ), table
    missing = set()
    for lid, entry in damage.items():
        md = farm.plan.by_id(lid).metadata  # type: ignore[union-attr]
        first = md.segments[md.segment_index_for(entry)].first_entry_id
        missing.add((lid, first, bookie, Reason.ENTRIES_MISSING))
    lost = {(lid, f, victim, Reason.BOOKIE_LOST) for lid, f in farm.plan.segments_naming(victim)}
    found = {
        (r["ledger_id"], r["segment_first_entry_id"], r["bookie_id"], r["reason"])
        for r in _rows(tmp_path / "two", FRAGMENTS, two.run_id)
    }
    assert found == lost | missing
