"""A watch on 20,000 ledgers reacts to a lost bookie from its bookie index, not from a scan
(docs/watch.md, "The index"): after the take-over's scan, the loss of one farm identity is
marked and repaired with the metadata-scan counter where the take-over left it, by an audit
that read exactly the ledgers naming the victim, and every ledger that named it names it no
more.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from bklib.meta.store import LedgerStore
from bklib.meta.stores import open_store
from bklib.states import DEFAULT_LEDGERS_ROOT, Check, CountKey, Reason
from bklib.testing.scale.farm import FarmClient
from bklib.testing.scale.harness import running_farm
from bklib.testing.scale.seeder import seed_ledgers
from bklib.testing.zkserver import ZooKeeperServer
from jobs.tables import delta
from jobs.tables.schema import ACTIONS, AUDIT_RUNS, FRAGMENTS
from jobs.watch.first_ledgers import FIRST_LEDGERS
from tests.integration.test_watch import Watch, wait_for
from tests.integration.test_watch_repair_processes import assert_swapped_once

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

LEDGERS = 20_000
BOOKIES = 24
FIRST = re.compile(r"repair (\S+): the loss's first (\d+) ledgers, before audit (\S+) is done")


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, FarmClient]]:
    """A ZooKeeper of this module's own (20,000 znodes nobody needs to wipe) and a farm."""
    base = tmp_path_factory.mktemp("index-reaction")
    with (
        ZooKeeperServer(base / "zk") as server,
        running_farm(server.connect_string, base / "farm", bookies=BOOKIES, ledgers=LEDGERS) as (
            client,
            _,
        ),
    ):
        report = seed_ledgers(server.connect_string, client.plan)
        assert report.created == LEDGERS
        yield server.connect_string, client


def _sum(m: dict[str, float], prefix: str, *labels: str) -> float:
    return sum(v for k, v in m.items() if k.startswith(prefix) and all(x in k for x in labels))


def test_a_loss_is_marked_and_repaired_from_the_index_without_a_scan(
    farm: tuple[str, FarmClient], tmp_path: Path
) -> None:
    zk, client = farm
    plan = client.plan
    victim = client.bookies[7]
    naming = plan.segments_naming(victim)
    ledgers = {lid for lid, _ in naming}
    assert len(ledgers) > 1000
    wh = tmp_path / "wh"
    w = Watch(zk, str(wh), tmp_path / "w.log", "--lost-bookie-recovery-delay", "0s",
              "--read-timeout", "5s")  # fmt: skip
    try:
        w.wait_role("leader", 120)
        wait_for(lambda: w.metrics().get("bkaudit_index_ledgers") == LEDGERS, 180, "the index", w)
        scans = w.metrics()["bkaudit_metadata_scans_total"]
        assert scans == 1, scans  # the take-over's

        client.stop(victim)
        wait_for(
            lambda: _sum(w.metrics(), "bkaudit_time_to_repair_seconds_count") >= 1,
            600,
            "no ledger naming the victim",
            w,
        )
        m = w.metrics()
        assert m["bkaudit_metadata_scans_total"] == scans, w.tail()
        assert _sum(m, "bkaudit_loss_reaction_seconds_count", 'stage="marked"') == 1
        assert _sum(m, "bkaudit_loss_reaction_seconds_count", 'stage="first_copy"') == 1
        assert m["bkaudit_index_stale"] == 0
    finally:
        w.stop()
    assert w.proc.returncode == 0, w.tail()

    # The reaction's first audit read exactly the victim's ledgers, and found each segment.
    runs = sorted(
        (r for r in delta.read_rows(str(wh), AUDIT_RUNS) if r["check"] == Check.LOST),
        key=lambda r: r["started_at"],
    )
    take_over, first = runs[0], runs[1]
    assert CountKey.LEDGERS_FROM_INDEX not in dict(take_over["counts"])
    assert dict(take_over["counts"])[CountKey.LEDGERS] == LEDGERS
    assert all(CountKey.LEDGERS_FROM_INDEX in dict(r["counts"]) for r in runs[1:]), runs
    assert dict(first["counts"])[CountKey.LEDGERS_FROM_INDEX] == len(ledgers)
    found = {
        (r["ledger_id"], r["segment_first_entry_id"])
        for r in delta.read_rows(str(wh), FRAGMENTS)
        if r["run_id"] == first["run_id"] and r["reason"] == Reason.BOOKIE_LOST
    }
    assert found == set(naming)

    # The loss's first ledgers were repaired before the audit's marks, by a run of their own
    # recorded under the loss's audit; the audit's repair left them out: no segment swapped
    # twice, and only the first run touched them (jobs/watch/first_ledgers.py).
    log = w.log.read_text()
    early = FIRST.search(log)
    assert early is not None, w.tail()
    assert early.group(3) == first["run_id"] and int(early.group(2)) == FIRST_LEDGERS
    actions = list(delta.read_rows(str(wh), ACTIONS))
    assert_swapped_once(str(wh))
    mine = [a for a in actions if a["run_id"] == early.group(1)]
    assert {a["audit_run_id"] for a in mine} == {first["run_id"]}
    repaired = {a["ledger_id"] for a in mine if a["action"] == "METADATA_UPDATE"}
    assert len(repaired) == FIRST_LEDGERS and repaired <= ledgers
    again = [a for a in actions if a["ledger_id"] in repaired and a["run_id"] != early.group(1)]
    assert again == []
    assert log.index(early.group(0)) < log.index("ledgers marked under-replicated")

    with open_store(zk, timeout=30) as store:
        meta = LedgerStore(store, DEFAULT_LEDGERS_ROOT)
        still = [lid for lid in ledgers if victim in meta.read_ledger(lid).value.bookies()]
    assert still == []
