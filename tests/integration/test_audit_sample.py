"""The sample check on a real sandbox: BookKeeper's LedgerChecker semantics. The first and
last entry of each fragment on each bookie are read and digest-verified, plus a share of the
rest; a deleted first or last entry is found, a deleted middle entry only when the sample
reaches it (as in Java's check)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bklib.client.connection_v2 import BookieConnectionV2
from bklib.client.pool import BookieClientPool
from bklib.quorum import write_set
from bklib.states import Check, FetchMethod, Reason, ReplicaStatus, RunStatus
from jobs.commands.audit import run_audit
from jobs.tables import delta
from jobs.tables.schema import FRAGMENTS
from tests.audit_helpers import AuditCluster, audit_args, audit_cluster
from tests.audit_helpers import spark as spark  # the session fixture

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, zk_server: Any
) -> Iterator[tuple[AuditCluster, dict[str, int]]]:
    base = tmp_path_factory.mktemp("audit-sample")
    with zk_server.private_chroot() as hosts, audit_cluster(base, hosts, bookies=3) as c:
        b0, b1, b2 = c.bookie_ids
        ens = [b0, b1, b2]
        ids = {k: c.ledger(ens, 20, wq=2, aq=2).ledger_id for k in ("first", "last", "middle")}
        ids["corrupt"] = c.ledger(ens, 20, wq=2, aq=2).ledger_id
        ids["healthy"] = c.ledger(ens, 20, wq=2, aq=2).ledger_id
        assert write_set(0, 3, 2) == (0, 1) and write_set(19, 3, 2) == (1, 2)
        # b0 stores 0 2 3 5 ... 18: entry 0 is its first, 18 its last, 9 in the middle.
        assert c.admin(b0).delete_entries(ids["first"], [0]) == [0]
        assert c.admin(b2).delete_entries(ids["last"], [19]) == [19]
        assert c.admin(b0).delete_entries(ids["middle"], [9]) == [9]
        c.admin(b0).corrupt_entry(ids["corrupt"], 18)
        yield c, ids


def _findings(warehouse: str, run_id: str) -> dict[tuple[int, str, str], list[tuple[int, int]]]:
    out = {}
    for r in delta.read_rows(warehouse, FRAGMENTS):
        if r["run_id"] == run_id:
            ranges = [(x["first_entry_id"], x["last_entry_id"]) for x in r["missing_ranges"]]
            out[(r["ledger_id"], r["bookie_id"], r["reason"])] = ranges
    return out


def _audit(c: AuditCluster, wh: str, spark: Any, *extra: str) -> dict[str, Any]:
    args = audit_args(c.zk, wh, Check.SAMPLE, *extra)
    assert run_audit(args, spark) == 0
    run = delta.latest_run(wh)
    assert run is not None and run["check"] == Check.SAMPLE
    assert run["status"] == RunStatus.COMPLETED
    return run


@pytest.mark.parametrize("executor", ["local", "spark"])
def test_sample_finds_deleted_first_and_last_entries_and_bad_digests(
    cluster: tuple[AuditCluster, dict[str, int]], tmp_path: Path, spark: Any, executor: str
) -> None:
    c, ids = cluster
    b0, _, b2 = c.bookie_ids
    wh = str(tmp_path / "wh")
    run = _audit(c, wh, spark if executor == "spark" else None, "--executor", executor)
    assert _findings(wh, run["run_id"]) == {
        (ids["first"], b0, Reason.ENTRIES_MISSING): [(0, 0)],
        (ids["last"], b2, Reason.ENTRIES_MISSING): [(19, 19)],
        (ids["corrupt"], b0, Reason.DIGEST_MISMATCH): [(18, 18)],
        # The deleted middle entry is not read at 0%: the sample check can miss it.
    }
    # Every (ledger, bookie) pair was sampled; nothing was listed.
    assert run["counts"][f"pairs_{FetchMethod.SAMPLE}_{ReplicaStatus.OK}"] == 5 * 3


def test_a_full_sample_finds_the_middle_entry_too(
    cluster: tuple[AuditCluster, dict[str, int]], tmp_path: Path
) -> None:
    c, ids = cluster
    b0 = c.bookie_ids[0]
    wh = str(tmp_path / "wh")
    run = _audit(c, wh, None, "--executor", "local", "--verify-percentage", "100")
    found = _findings(wh, run["run_id"])
    assert found[(ids["middle"], b0, Reason.ENTRIES_MISSING)] == [(9, 9)]
    assert len(found) == 4 and not any(k[0] == ids["healthy"] for k in found)


@pytest.mark.parametrize("protocol", ["v2", "v3"])
def test_the_sample_reads_over_the_wire_protocol_it_is_given(
    cluster: tuple[AuditCluster, dict[str, int]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    protocol: str,
) -> None:
    """``--bookie-protocol``: v2 (the default, as Pulsar's brokers read) or v3; the same
    findings either way, and the reads go over the protocol asked for."""
    c, ids = cluster
    b0, _, b2 = c.bookie_ids
    v2_reads: Counter[str] = Counter()
    real = BookieClientPool.connection_v2

    def counted(pool: BookieClientPool, bookie_id: str) -> BookieConnectionV2:
        v2_reads[bookie_id] += 1
        return real(pool, bookie_id)

    monkeypatch.setattr(BookieClientPool, "connection_v2", counted)
    wh = str(tmp_path / "wh")
    extra = ("--executor", "local", "--verify-percentage", "100", "--bookie-protocol", protocol)
    run = _audit(c, wh, None, *extra)
    assert _findings(wh, run["run_id"]) == {
        (ids["first"], b0, Reason.ENTRIES_MISSING): [(0, 0)],
        (ids["last"], b2, Reason.ENTRIES_MISSING): [(19, 19)],
        (ids["middle"], b0, Reason.ENTRIES_MISSING): [(9, 9)],
        (ids["corrupt"], b0, Reason.DIGEST_MISMATCH): [(18, 18)],
    }
    if protocol == "v2":
        assert set(v2_reads) == set(c.bookie_ids), v2_reads
    else:
        assert not v2_reads, v2_reads
