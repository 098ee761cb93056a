"""``--metadata-uri`` and secrets from files, through the real ``bkaudit`` CLI and ZooKeeper."""

from __future__ import annotations

from pathlib import Path

import pytest
from kazoo.security import OPEN_ACL_UNSAFE, make_digest_acl

from bklib.meta.model import LedgerMetadata, Segment
from bklib.meta.store import LedgerStore
from bklib.testing.zkclient import connect
from jobs.tables.delta import read_rows
from tests.cli_helpers import bkaudit, failure, one_error_line

pytestmark = pytest.mark.integration

SECRET = "s3cr3t-Pa55"


@pytest.fixture
def cluster(zk_chroot: str) -> str:
    zk = connect(zk_chroot)
    try:
        store = LedgerStore(zk)
        store.init_cluster()
        store.create_ledger(
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
    return zk_chroot


def _uri(cluster: str, scheme: str = "zk+hierarchical") -> str:
    hosts, _, chroot = cluster.partition("/")
    return f"{scheme}://{hosts}/{chroot}/ledgers"  # the chroot is part of the ledgers root


def test_audit_through_a_metadata_service_uri(cluster: str, tmp_path: Path) -> None:
    wh = tmp_path / "wh"
    proc = bkaudit(
        "audit", "--metadata-uri", _uri(cluster), "--warehouse", str(wh), "--check", "lost",
        "--executor", "local",
    )  # fmt: skip
    assert proc.returncode == 0, failure(proc)
    (run,) = read_rows(str(wh), "audit_runs")
    assert run["status"] == "COMPLETED"
    assert run["counts"] and dict(run["counts"]).get("ledgers") == 1, run


@pytest.mark.parametrize(
    "uri", ["etcd://127.0.0.1:2379/ledgers", "metadata-store:etcd:http://127.0.0.1:2379"]
)
def test_a_backend_we_cannot_serve_is_one_line(uri: str, tmp_path: Path) -> None:
    wh = tmp_path / "wh"
    proc = bkaudit("audit", "--metadata-uri", uri, "--warehouse", str(wh))
    line = one_error_line(proc)
    assert line.startswith("audit: ") and uri in line and "not supported" in line
    assert not wh.exists()


def test_metadata_uri_with_zk_is_one_line(cluster: str, tmp_path: Path) -> None:
    proc = bkaudit(
        "audit", "--metadata-uri", _uri(cluster), "--zk", cluster,
        "--warehouse", str(tmp_path / "wh"),
    )  # fmt: skip
    assert "--metadata-uri and --zk" in one_error_line(proc)


def test_zk_auth_file_reads_an_acl_tree_and_stays_secret(cluster: str, tmp_path: Path) -> None:
    zk = connect(cluster, auth=f"admin:{SECRET}")
    try:
        zk.set_acls("/ledgers/00", [make_digest_acl("admin", SECRET, all=True)])
    finally:
        zk.stop()
        zk.close()
    auth = tmp_path / "zk-auth"
    auth.write_text(f"admin:{SECRET}\n")
    wh = tmp_path / "wh"
    try:
        proc = bkaudit(
            "-v", "audit", "--zk", cluster, "--zk-auth-file", str(auth), "--warehouse", str(wh),
            "--check", "lost", "--executor", "local",
        )  # fmt: skip
        assert proc.returncode == 0, failure(proc)
        assert SECRET not in proc.stdout and SECRET not in proc.stderr
        (run,) = read_rows(str(wh), "audit_runs")
        assert run["status"] == "COMPLETED"
        assert dict(run["counts"]).get("ledgers") == 1, run
        assert SECRET not in repr(run)

        missing = bkaudit(
            "audit", "--zk", cluster, "--zk-auth-file", str(tmp_path / "nope"),
            "--warehouse", str(wh),
        )  # fmt: skip
        line = one_error_line(missing)
        assert line.startswith("audit: --zk-auth-file ") and "nope" in line
    finally:  # let the fixture wipe the chroot
        zk = connect(cluster, auth=f"admin:{SECRET}")
        try:
            zk.set_acls("/ledgers/00", OPEN_ACL_UNSAFE)
        finally:
            zk.stop()
            zk.close()
