"""Bookie capabilities are learnt once per run: a bookie that never answers list-entries (as
a Java bookie on DbLedgerStorage) costs one short timeout for the whole run, not one per
task, and is then probed with v2 batch reads. A bookie that stalls mid-probe yields
BOOKIE_UNREACHABLE for what it did not answer, never missing entries."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bklib.states import CountKey, Executor, FetchMethod, Reason, RunStatus
from jobs.commands.audit import run_audit
from jobs.runtime.exit_status import ExitStatus
from jobs.tables import delta
from jobs.tables.schema import BOOKIES, FRAGMENTS
from tests.audit_helpers import AuditCluster, audit_args, audit_cluster
from tests.audit_helpers import spark as spark  # the session fixture

pytestmark = pytest.mark.integration

LIST_OP = "GET_LIST_OF_ENTRIES_OF_LEDGER"


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, zk_server: Any
) -> Iterator[tuple[AuditCluster, dict[str, int]]]:
    base = tmp_path_factory.mktemp("audit-capabilities")
    with zk_server.private_chroot() as hosts, audit_cluster(base, hosts, bookies=4) as c:
        b0, b1, b2, b3 = c.bookie_ids
        ids = {
            "deleted": c.ledger([b0, b1, b2], 30, wq=2, aq=2).ledger_id,
            "stall": c.ledger([b1, b0, b3], 30, wq=2, aq=2).ledger_id,
            "full": c.ledger([b0, b1, b2], 30, wq=3, aq=2).ledger_id,  # E == WQ: one long run
        }
        for k in range(5):
            ids[f"healthy{k}"] = c.ledger([b0, b2, b3], 30, wq=2, aq=2).ledger_id
        # b0 (index 0 of [b0, b1, b2], WQ 2) stores 0 2 3 5 6 ...: 14 is in a run of two (14 15).
        assert c.admin(b0).delete_entries(ids["deleted"], [14]) == [14]
        # full: b0 stores everything; 20 gone splits its batch.
        assert c.admin(b0).delete_entries(ids["full"], [20]) == [20]
        yield c, ids


def _faults(c: AuditCluster, stall_ledger: int) -> None:
    b0 = c.bookie_ids[0]
    c.admin(b0).clear_faults()
    c.admin(b0).add_fault("drop", op=LIST_OP)  # never answers list-entries, on any ledger
    for op in ("READ_ENTRY", "BATCH_READ_ENTRY"):  # stalls from entry 12 of one ledger on
        c.admin(b0).add_fault("drop", op=op, ledger=stall_ledger, first_entry=12)


@pytest.mark.parametrize("executor", [Executor.LOCAL, Executor.SPARK])
def test_learnt_once_per_run_and_stalls_are_unknown(
    cluster: tuple[AuditCluster, dict[str, int]], tmp_path: Path, spark: Any, executor: str
) -> None:
    c, ids = cluster
    b0 = c.bookie_ids[0]
    _faults(c, ids["stall"])
    wh = str(tmp_path / "wh")
    args = audit_args(c.zk, wh, "replicas", "--executor", executor, "--ledgers-in-flight", "2")
    try:
        # b0 does not answer everything: the run is incomplete (3), never 0.
        got = run_audit(args, spark if executor == Executor.SPARK else None)
        assert got == ExitStatus.INCOMPLETE
        hits = {f["ops"][0]: f["hits"] for f in c.admin(b0).faults()}
    finally:
        c.admin(b0).clear_faults()
    # Asked once, by the run's capability probe; every check task then went straight to reads.
    assert hits[LIST_OP] == 1, hits
    run = delta.latest_run(wh)
    assert run is not None
    counts = run["counts"]
    assert counts[CountKey.BOOKIES_NO_LIST_ENTRIES] == 1
    assert counts[CountKey.BOOKIES_BATCH_READ] == 4
    assert counts[f"pairs_{FetchMethod.PROBE}_OK"] == len(ids)  # b0 is in every ledger
    assert run["status"] == RunStatus.COMPLETED_WITH_ERRORS  # b0 did not answer everything
    rows = {
        r["bookie_id"]: (r["list_entries"], r["batch_read"])
        for r in delta.read_rows(wh, BOOKIES)
        if r["run_id"] == run["run_id"]
    }
    assert rows == {b: (b != b0, True) for b in c.bookie_ids}

    found = {
        (r["ledger_id"], r["bookie_id"], r["reason"]): r
        for r in delta.read_rows(wh, FRAGMENTS)
        if r["run_id"] == run["run_id"]
    }
    ranges = {
        k: [(x["first_entry_id"], x["last_entry_id"]) for x in r["missing_ranges"] or []]
        for k, r in found.items()
    }
    assert ranges[(ids["deleted"], b0, Reason.ENTRIES_MISSING)] == [(14, 14)]
    assert ranges[(ids["full"], b0, Reason.ENTRIES_MISSING)] == [(20, 20)]
    # The stalled bookie: what it did not answer is unknown, never missing.
    stalled = found[(ids["stall"], b0, Reason.BOOKIE_UNREACHABLE)]
    assert stalled["unknown_entries"] >= 1 and stalled["missing_entries"] is None
    assert (ids["stall"], b0, Reason.ENTRIES_MISSING) not in found
    assert {k[0] for k in found} == {ids["deleted"], ids["full"], ids["stall"]}
