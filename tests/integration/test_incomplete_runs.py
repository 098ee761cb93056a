"""No run that missed something ends green (docs/exit-status.md): on a real cluster with one
unreadable ledger znode, every command that reads the cluster (audit, listunderreplicated,
triage, whatif, blastradius, recover, decommission, status) exits 3 (never 0), its run row is not
COMPLETED, and a listing over that run says so on its first line; a bookie that never answers
the sample check's reads does the same. The session-expiry case is in
tests/integration/test_scale_harness.py (a scan that outlives its session)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from bklib.states import Reason, RunStatus
from jobs.runtime.exit_status import ExitStatus
from jobs.tables import delta
from jobs.tables.schema import AUDIT_RUNS, BLAST_RADIUS, FRAGMENTS
from tests.audit_helpers import AuditCluster, audit_cluster
from tests.cli_helpers import bkaudit, error_lines

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

GARBAGE = b"BookieMetadataFormatVersion\t3\n\x05garbage"


@pytest.fixture(scope="module")
def cluster(
    zk_server,  # type: ignore[no-untyped-def]
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[AuditCluster]:
    """Four bookies, six healthy ledgers over the first three, and one ledger whose znode is
    garbage: what that ledger names is unknown."""
    with (
        zk_server.private_chroot("incomplete") as chroot,
        audit_cluster(tmp_path_factory.mktemp("incomplete"), chroot, bookies=4) as c,
    ):
        b0, b1, b2, _ = c.bookie_ids
        for _ in range(6):
            c.ledger([b0, b1, b2], 6, wq=2, aq=2)
        bad = c.ledger([b0, b1, b2], 6, wq=2, aq=2)
        c.store.zk.set(c.store.path_for(bad.ledger_id), GARBAGE)
        yield c


def _zk(c: AuditCluster) -> list[str]:
    return ["--zk", c.zk]


def _incomplete(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == ExitStatus.INCOMPLETE, (proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr


def test_a_lost_audit_over_an_unreadable_znode_is_incomplete_and_so_is_its_listing(
    cluster: AuditCluster, tmp_path: Path
) -> None:
    wh = str(tmp_path / "warehouse")
    audit = bkaudit("audit", *_zk(cluster), "--warehouse", wh, "--check", "lost",
                    "--executor", "local")  # fmt: skip
    _incomplete(audit)
    (line,) = error_lines(audit)
    assert "incomplete" in line and "1 unreadable znodes" in line, line
    (run,) = delta.read_rows(wh, AUDIT_RUNS)
    assert run["status"] == RunStatus.COMPLETED_WITH_ERRORS

    # No ledger is under-replicated, yet the listing is no clean bill: the unread one may be.
    for extra in ([], ["--missing-replica", cluster.bookie_ids[0]], ["--by-topic"]):
        listing = bkaudit("listunderreplicated", "--warehouse", wh, *extra)
        _incomplete(listing)
        first = listing.stdout.splitlines()[0]
        assert first.startswith("INCOMPLETE: audit run ") and "1 unreadable znodes" in first
        assert "no under-replicated ledgers" not in listing.stdout, extra
    # Triage over it: nothing to triage in what it read, but it did not read everything.
    triage = bkaudit("triage", "--warehouse", wh, *_zk(cluster))
    _incomplete(triage)
    assert "INCOMPLETE: audit run " in triage.stdout


def test_commands_that_scan_the_ledgers_exit_incomplete_over_an_unreadable_znode(
    cluster: AuditCluster, tmp_path: Path
) -> None:
    wh = str(tmp_path / "warehouse")
    b0 = cluster.bookie_ids[0]
    whatif = bkaudit("whatif", *_zk(cluster), "--bookie", b0)
    _incomplete(whatif)
    assert "UNSAFE" in whatif.stdout
    blast = bkaudit("blastradius", *_zk(cluster), "--warehouse", wh, "--executor", "local")
    _incomplete(blast)
    assert delta.read_rows(wh, BLAST_RADIUS), "the figures are written, as a lower bound"
    # recover of a bookie: the unreadable ledger may name it too, so the run is not done.
    recover = bkaudit("recover", b0, *_zk(cluster), "--warehouse", wh, "--dry-run",
                      "--executor", "local")  # fmt: skip
    _incomplete(recover)
    assert "could not be read" in recover.stdout


def test_a_sample_check_with_a_bookie_that_never_answers_is_incomplete(
    cluster: AuditCluster, tmp_path: Path
) -> None:
    wh = str(tmp_path / "warehouse")
    silent = cluster.bookie_ids[1]
    admin = cluster.admin(silent)
    admin.add_fault("drop", op="READ_ENTRY")  # registered, connected, never answers
    try:
        audit = bkaudit(
            "audit", *_zk(cluster), "--warehouse", wh, "--check", "sample",
            "--executor", "local", "--read-timeout", "1s", "--connect-timeout", "2s",
            "--bookie-protocol", "v3",
        )  # fmt: skip
    finally:
        admin.clear_faults()
    _incomplete(audit)
    (run,) = delta.read_rows(wh, AUDIT_RUNS)
    assert run["status"] == RunStatus.COMPLETED_WITH_ERRORS
    reasons = {
        (r["bookie_id"], r["reason"])
        for r in delta.read_rows(wh, FRAGMENTS)
        if r["run_id"] == run["run_id"]
    }
    assert (silent, Reason.BOOKIE_UNREACHABLE) in reasons
    assert all(r == Reason.BOOKIE_UNREACHABLE for _, r in reasons), reasons
    listing = bkaudit("listunderreplicated", "--warehouse", wh)
    _incomplete(listing)
    assert listing.stdout.startswith("INCOMPLETE: ")


def test_status_over_an_unreadable_mark_names_it_and_is_incomplete(cluster: AuditCluster) -> None:
    from bklib.meta import paths

    mark = paths.ur_ledger_path(cluster.store.root, 987_654)
    cluster.store.zk.create(mark, GARBAGE, makepath=True)
    try:
        for fmt in ("text", "json"):
            status = bkaudit("status", *_zk(cluster), "--format", fmt)
            _incomplete(status)
            assert mark in status.stdout, status.stdout
        text = bkaudit("status", *_zk(cluster)).stdout
        assert "INCOMPLETE: 1 marks cannot be decoded" in text, text
    finally:
        cluster.store.zk.delete(mark)
    assert bkaudit("status", *_zk(cluster)).returncode == ExitStatus.OK


def test_status_calls_a_bookie_that_never_answers_unreachable_not_writable(
    cluster: AuditCluster,
) -> None:
    import json

    silent = cluster.bookie_ids[2]
    admin = cluster.admin(silent)
    admin.add_fault("drop", op="GET_BOOKIE_INFO")  # registered, connected, never answers
    try:
        status = bkaudit("status", *_zk(cluster), "--format", "json", "--probe-timeout", "1s")
        text = bkaudit("status", *_zk(cluster), "--probe-timeout", "1s")
    finally:
        admin.clear_faults()
    assert status.returncode == ExitStatus.FINDINGS, (status.stdout, status.stderr)
    st = json.loads(status.stdout)
    assert st["unreachable"] == [silent] and silent not in st["writable"], st
    assert st["bookie_answers"][silent]["error"], st["bookie_answers"]
    assert text.returncode == ExitStatus.FINDINGS
    assert f"unreachable {silent}" in " ".join(text.stdout.split()), text.stdout
    assert "1 unreachable" in text.stdout.splitlines()[0]


def test_decommission_over_an_unreadable_znode_keeps_the_cookie_and_is_incomplete(
    cluster: AuditCluster, tmp_path: Path
) -> None:
    # Last in the module: it stops a bookie. No readable ledger names it, the unreadable one
    # may: the bookie is not proved unused, so its cookie stays and the run is not done.
    gone = cluster.bookie_ids[3]
    cluster.sandbox.stop_bookie(gone)
    wh = str(tmp_path / "warehouse")
    done = bkaudit("decommission", gone, *_zk(cluster), "--warehouse", wh,
                   "--executor", "local")  # fmt: skip
    _incomplete(done)
    assert "cookie" in done.stdout and "kept" in done.stdout, done.stdout
    cookie = cluster.store.zk.exists(f"{cluster.store.root}/cookies/{gone}")
    assert cookie is not None
