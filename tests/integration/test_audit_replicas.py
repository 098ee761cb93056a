"""Audit integration (b) and (c) on a real sandbox: entries removed from a bookie's storage
are reported by ``replicas`` exactly, with the right severity; a corrupted stored entry is
reported by ``deep`` as DIGEST_MISMATCH. Also: a bookie that does not answer list-entries
is probed by reads, and one that answers nothing is BOOKIE_UNREACHABLE, never missing."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from bklib.states import RunStatus
from jobs.commands.audit import run_audit
from jobs.runtime.exit_status import ExitStatus
from jobs.spark import load
from tests.audit_helpers import (
    AuditCluster,
    audit_args,
    audit_cluster,
    fragments_of,
    list_report,
    metadata,
    write_ledger,
)
from tests.audit_helpers import spark as spark  # the session fixture

pytestmark = pytest.mark.integration


@dataclass
class Scenario:
    cluster: AuditCluster
    ids: dict[str, int]
    bookies: list[str]


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory, zk_server: Any) -> Iterator[Scenario]:
    # A module-wide chroot (zk_chroot is per test).
    base = tmp_path_factory.mktemp("audit-replicas")
    with (
        zk_server.private_chroot() as hosts,
        audit_cluster(base, hosts, bookies=4) as c,
    ):
        b0, b1, b2, b3 = c.bookie_ids
        ids: dict[str, int] = {}
        ids["wq2"] = c.ledger([b0, b1, b2], 20, wq=2, aq=2).ledger_id
        ids["wq3"] = c.ledger([b0, b1, b3], 10, wq=3, aq=2).ledger_id
        ids["none"] = c.ledger([b1, b2, b3], 10, wq=2, aq=2).ledger_id
        ids["open"] = c.ledger([b0, b2, b3], 10, wq=2, aq=2, closed=False).ledger_id
        # Closed at 9 with entries 10..11 physically on the bookies (an unacked tail).
        md = metadata(c.store.generate_ledger_id(), [(0, [b0, b1, b3])], wq=2, aq=2, last=9)
        ids["tail"] = write_ledger(c.store, c.client, md, 12).ledger_id
        ids["probe"] = c.ledger([b0, b1, b2], 10, wq=2, aq=2).ledger_id
        ids["silent"] = c.ledger([b1, b2, b3], 10, wq=2, aq=2).ledger_id
        ids["corrupt"] = c.ledger([b0, b1, b2], 10, wq=2, aq=2).ledger_id
        ids["healthy"] = c.ledger([b3, b2, b1, b0], 30, wq=3, aq=2).ledger_id

        # wq2: b1 (index 1, residues {1, 0} mod 3) loses 0 1 3 4; 5 was never on it.
        assert c.admin(b1).delete_entries(ids["wq2"], [0, 1, 3, 4, 5]) == [0, 1, 3, 4]
        # wq3: b3 loses entry 7: two replicas of three left.
        assert c.admin(b3).delete_entries(ids["wq3"], [7]) == [7]
        # none: entry 4 (write set [1, 2] = b2, b3) is gone from both.
        for b in (b2, b3):
            assert c.admin(b).delete_entries(ids["none"], [4]) == [4]
        # open: LAC is 8 (entry 9 carries LAC 8). Entry 9 gone from b0 is beyond the
        # LAC; entry 3 gone from b2 is not.
        assert c.admin(b0).delete_entries(ids["open"], [9]) == [9]
        assert c.admin(b2).delete_entries(ids["open"], [3]) == [3]
        # tail: entry 11 (beyond lastEntryId 9) gone from b0: not a finding.
        assert c.admin(b0).delete_entries(ids["tail"], [11]) == [11]
        # probe: b0 never answers list-entries for this ledger (as a Java bookie on
        # DbLedgerStorage), and lost entry 6.
        c.admin(b0).add_fault("drop", op="GET_LIST_OF_ENTRIES_OF_LEDGER", ledger=ids["probe"])
        assert c.admin(b0).delete_entries(ids["probe"], [6]) == [6]
        # silent: b3 answers nothing at all for this ledger.
        for op in ("GET_LIST_OF_ENTRIES_OF_LEDGER", "READ_ENTRY", "BATCH_READ_ENTRY", "READ_LAC"):
            c.admin(b3).add_fault("drop", op=op, ledger=ids["silent"])
        # corrupt: one stored byte of entry 5 on b2 flipped (write set [2, 0]).
        c.admin(b2).corrupt_entry(ids["corrupt"], 5)
        yield Scenario(c, ids, [b0, b1, b2, b3])


def _by_key(rows: list[dict[str, Any]]) -> dict[tuple[int, str, str], dict[str, Any]]:
    return {(r["ledger_id"], r["bookie_id"], r["reason"]): r for r in rows}


def test_replicas_reports_exactly_the_removed_entries(
    spark: SparkSession, scenario: Scenario, tmp_path: Path
) -> None:
    c, ids = scenario.cluster, scenario.ids
    b0, b1, b2, b3 = scenario.bookies
    warehouse = str(tmp_path / "warehouse")
    # b3 answered nothing for one ledger: the run completes, says so, and is incomplete (3).
    assert run_audit(audit_args(c.zk, warehouse, "replicas"), spark) == ExitStatus.INCOMPLETE
    run = load.latest_run(spark, warehouse)
    assert run is not None
    assert run["status"] == RunStatus.COMPLETED_WITH_ERRORS
    assert run["counts"]["pairs_PROBE_OK"] >= 1
    rows = _by_key(fragments_of(spark, warehouse, run["run_id"]))

    def ranges(r: dict[str, Any]) -> list[tuple[int, int]]:
        return [(x["first_entry_id"], x["last_entry_id"]) for x in r["missing_ranges"]]

    want = {
        (ids["wq2"], b1, "ENTRIES_MISSING"): (4, [(0, 4)], 1, "BELOW_AQ"),
        (ids["wq3"], b3, "ENTRIES_MISSING"): (1, [(7, 7)], 2, "BELOW_WQ"),
        (ids["none"], b2, "ENTRIES_MISSING"): (1, [(4, 4)], 0, "NO_REPLICA"),
        (ids["none"], b3, "ENTRIES_MISSING"): (1, [(4, 4)], 0, "NO_REPLICA"),
        (ids["open"], b2, "ENTRIES_MISSING"): (1, [(3, 3)], 1, "BELOW_AQ"),
        (ids["probe"], b0, "ENTRIES_MISSING"): (1, [(6, 6)], 1, "BELOW_AQ"),
    }
    got = {
        k: (r["missing_entries"], ranges(r), r["min_replicas"], r["severity"])
        for k, r in rows.items()
        if k[2] == "ENTRIES_MISSING"
    }
    assert got == want
    unreachable = [k for k in rows if k[2] == "BOOKIE_UNREACHABLE"]
    assert unreachable == [(ids["silent"], b3, "BOOKIE_UNREACHABLE")]
    silent = rows[unreachable[0]]
    assert silent["missing_entries"] is None and silent["severity"] is None
    assert silent["unknown_entries"] == 6  # b3 is index 2 of [b1, b2, b3]: 1 2 4 5 7 8
    # The open ledger is checked up to its LAC (8), not to the entries written (9).
    assert rows[(ids["open"], b2, "ENTRIES_MISSING")]["segment_last_entry_id"] == 8
    assert rows[(ids["open"], b2, "ENTRIES_MISSING")]["ledger_state"] == "OPEN"
    # Nothing about the unacked tail, the healthy ledger, or the corruption (lists cannot
    # see it).
    flagged = {k[0] for k in rows}
    assert not flagged & {ids["tail"], ids["healthy"], ids["corrupt"]}

    # Findings over an incomplete run: the listing says so first and exits 3, not 1.
    code, text = list_report(spark, warehouse)
    assert code == ExitStatus.INCOMPLETE and text.startswith("INCOMPLETE: ")
    assert f"\n{ids['none']}\n" in text and "NO_REPLICA" in text


def test_deep_reports_digest_mismatch_for_the_corrupted_entry(
    spark: SparkSession, scenario: Scenario, tmp_path: Path
) -> None:
    c, ids = scenario.cluster, scenario.ids
    b0, b1, b2, b3 = scenario.bookies
    warehouse = str(tmp_path / "warehouse")
    # b3 answers nothing for one ledger (silent): incomplete (3), as the replicas check is.
    assert run_audit(audit_args(c.zk, warehouse, "deep"), spark) == ExitStatus.INCOMPLETE
    run = load.latest_run(spark, warehouse)
    assert run is not None and run["check"] == "deep"
    rows = _by_key(fragments_of(spark, warehouse, run["run_id"]))
    mismatch = {k: r for k, r in rows.items() if k[2] == "DIGEST_MISMATCH"}
    assert list(mismatch) == [(ids["corrupt"], b2, "DIGEST_MISMATCH")]
    r = mismatch[(ids["corrupt"], b2, "DIGEST_MISMATCH")]
    assert r["missing_entries"] == 1
    assert [(x["first_entry_id"], x["last_entry_id"]) for x in r["missing_ranges"]] == [(5, 5)]
    assert (r["min_replicas"], r["severity"]) == (1, "BELOW_AQ")
    # Reading every replica finds the same removed entries as the lists did.
    missing = {k for k in rows if k[2] == "ENTRIES_MISSING"}
    assert missing == {
        (ids["wq2"], b1, "ENTRIES_MISSING"),
        (ids["wq3"], b3, "ENTRIES_MISSING"),
        (ids["none"], b2, "ENTRIES_MISSING"),
        (ids["none"], b3, "ENTRIES_MISSING"),
        (ids["open"], b2, "ENTRIES_MISSING"),
        (ids["probe"], b0, "ENTRIES_MISSING"),
    }
    assert rows[(ids["silent"], b3, "BOOKIE_UNREACHABLE")]["missing_entries"] is None
