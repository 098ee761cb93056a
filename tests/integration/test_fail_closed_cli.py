"""Fail closed through the real CLI: a wrong chroot, a wrong ledgers root or a ledger tree the
audit may not read is one line on stderr and exit 2, never "0 ledgers, COMPLETED"."""

from __future__ import annotations

from pathlib import Path

import pytest
from kazoo.security import OPEN_ACL_UNSAFE, make_digest_acl

from bklib.meta.model import LedgerMetadata, Segment
from bklib.meta.store import LedgerStore
from bklib.testing.zkclient import connect
from tests.cli_helpers import bkaudit, error_lines, failure, one_error_line

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(zk_chroot: str) -> str:
    zk = connect(zk_chroot)
    try:
        LedgerStore(zk).init_cluster()
    finally:
        zk.stop()
        zk.close()
    return zk_chroot


@pytest.mark.parametrize("executor", ["local", "spark"])
def test_a_wrong_chroot_is_not_a_clean_cluster(cluster: str, tmp_path: Path, executor: str) -> None:
    wh = tmp_path / "wh"
    proc = bkaudit(
        "audit", "--zk", f"{cluster}/typo", "--warehouse", str(wh), "--check", "lost",
        "--executor", executor,
    )  # fmt: skip
    line = one_error_line(proc)
    where = f"{cluster}/typo/ledgers"
    assert line == f"audit: no BookKeeper cluster at {where}: ledgers root missing (/ledgers)"
    assert not wh.exists()


def test_a_wrong_ledgers_root_is_not_a_clean_cluster(cluster: str, tmp_path: Path) -> None:
    zk = connect(cluster)
    try:
        zk.create("/nope", b"")  # exists, but is no BookKeeper cluster
    finally:
        zk.stop()
        zk.close()
    proc = bkaudit(
        "audit", "--zk", cluster, "--warehouse", str(tmp_path / "wh"), "--check", "lost",
        "--ledgers-root", "/nope",
    )  # fmt: skip
    line = one_error_line(proc)
    assert line == (
        f"audit: no BookKeeper cluster at {cluster}/nope: LAYOUT znode missing, and no "
        "INSTANCEID of Pulsar's driver (/nope/LAYOUT)"
    )


def test_a_pulsar_uri_with_a_wrong_chroot_is_not_a_clean_cluster(
    cluster: str, tmp_path: Path
) -> None:
    # metadata-store:zk:H/<chroot>/ledgers is <chroot>/ledgers/ledgers to Pulsar: no cluster.
    hosts, _, chroot = cluster.partition("/")
    uri = f"metadata-store:zk:{hosts}/{chroot}/ledgers"
    proc = bkaudit("audit", "--metadata-uri", uri, "--warehouse", str(tmp_path / "wh"))
    line = one_error_line(proc)
    assert line == (
        f"audit: no BookKeeper cluster at {cluster}/ledgers/ledgers: ledgers root missing "
        "(/ledgers)"
    )


def test_repair_on_a_wrong_chroot_does_nothing(cluster: str, tmp_path: Path) -> None:
    wh = tmp_path / "wh"
    assert (
        bkaudit("audit", "--zk", cluster, "--warehouse", str(wh), "--check", "lost").returncode == 0
    )
    for args in (
        ("rereplicate", "--zk", f"{cluster}/typo", "--warehouse", str(wh)),
        ("recover", "10.0.0.1:3181", "--zk", f"{cluster}/typo", "--warehouse", str(wh)),
    ):
        line = one_error_line(bkaudit(*args))
        assert f"no BookKeeper cluster at {cluster}/typo/ledgers" in line, line


def test_an_unreadable_ledger_tree_fails_the_run(cluster: str, tmp_path: Path) -> None:
    # The ledger tree's directory is readable only with credentials the audit lacks.
    zk = connect(cluster, auth="admin:secret")
    try:
        acl = make_digest_acl("admin", "secret", all=True)
        zk.create("/ledgers/00/0000", b"", makepath=True)
        zk.set_acls("/ledgers/00", [acl])
    finally:
        zk.stop()
        zk.close()
    wh = tmp_path / "wh"
    try:
        proc = bkaudit("audit", "--zk", cluster, "--warehouse", str(wh), "--check", "lost")
        line = one_error_line(proc)
        assert "NoAuth" in line and "/ledgers/00" in line, line
    finally:  # let the fixture wipe the chroot
        zk = connect(cluster, auth="admin:secret")
        try:
            zk.set_acls("/ledgers/00", OPEN_ACL_UNSAFE)
        finally:
            zk.stop()
            zk.close()


def test_recover_of_a_bookie_no_ensemble_names_warns(cluster: str, tmp_path: Path) -> None:
    zk = connect(cluster)
    try:
        LedgerStore(zk).create_ledger(
            LedgerMetadata(
                ledger_id=5,
                ensemble_size=2,
                write_quorum=2,
                ack_quorum=2,
                segments=(Segment(0, ("127.0.0.1:3181", "127.0.0.1:3182")),),
                ctoken=1,
            )
        )
    finally:
        zk.stop()
        zk.close()
    proc = bkaudit(
        "recover", "127.0.0.1:3811", "--zk", cluster, "--warehouse", str(tmp_path / "wh"),
        "--executor", "local",
    )  # fmt: skip
    assert proc.returncode == 0, failure(proc)
    assert error_lines(proc) == [
        "recover: warning: no ledger's ensemble names bookie 127.0.0.1:3811; check the id "
        "(host:port as the bookie registers it)"
    ]
