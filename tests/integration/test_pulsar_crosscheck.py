"""``audit --check pulsar`` and ``orphans delete`` on a real ZooKeeper, with Pulsar's metadata
written the way a broker lays it out: plain and compressed managed ledgers, a cursor, a v1
name, a schema, an offloaded ledger deleted from BookKeeper on purpose, a corrupt value, a
young unlisted ledger, an untagged one, and a topic deleted while the check runs.
tests/pulsar makes the same cases on a real broker.
"""

from __future__ import annotations

import struct
import time
import zlib
from pathlib import Path

import pytest

from bklib.meta.cluster import MetadataDriver
from bklib.meta.model import LedgerMetadata
from bklib.meta.store import LedgerStore
from bklib.meta.stores import open_store
from bklib.proto.pulsar_formats_pb2 import (
    CompressionType,
    ManagedCursorInfo,
    ManagedInfoMetadata,
    ManagedLedgerInfo,
    SchemaLocator,
)
from bklib.states import ActionKind, ActionStatus, PulsarFinding
from bklib.testing.zkclient import connect
from jobs.runs.pulsar_check import check_pulsar
from jobs.runtime.exit_status import ExitStatus
from jobs.tables.delta import read_rows
from tests.audit_helpers import metadata
from tests.cli_helpers import (
    bkaudit,
    error_lines,
    failure,
    frozen_past_its_session,
    one_error_line,
)

pytestmark = pytest.mark.integration

OLD = 1_700_000_000_000
BOOKIES = ["127.0.0.1:3181", "127.0.0.1:3182"]


def _ml(*ledgers: int, deleted: tuple[int, ...] = ()) -> bytes:
    info = ManagedLedgerInfo()
    for lid in ledgers:
        li = info.ledgerInfo.add(ledgerId=lid, entries=5, size=500)
        if lid in deleted:
            li.offloadContext.complete = True
            li.offloadContext.bookkeeperDeleted = True
    return info.SerializeToString()


def _zlib(raw: bytes) -> bytes:
    c = zlib.compressobj()
    body = c.compress(raw) + c.flush(zlib.Z_SYNC_FLUSH)
    header = ManagedInfoMetadata(
        compressionType=CompressionType.ZLIB, uncompressedSize=len(raw)
    ).SerializeToString()
    return b"\x47\x78" + struct.pack(">i", len(header)) + header + body


def _schema(*ledgers: int) -> bytes:
    loc = SchemaLocator()
    for i, lid in enumerate(ledgers):
        e = loc.index.add(version=i, hash=b"h")
        e.position.ledgerId, e.position.entryId = lid, 0
    loc.info.CopyFrom(loc.index[-1])
    return loc.SerializeToString()


def _ledger(store: LedgerStore, lid: int, ctime: int, **tags: str) -> None:
    md: LedgerMetadata = metadata(lid, [(0, BOOKIES)], wq=2, aq=2, last=4)
    custom = {k: v.encode() for k, v in tags.items()}
    store.create_ledger(md.replace(custom_metadata=custom, ctime=ctime, store_ctime=True))


def _tags(ml: str, **more: str) -> dict[str, str]:
    return {
        "application": "pulsar",
        "component": "managed-ledger",
        "pulsar/managed-ledger": ml,
        **more,
    }


A = "public/default/persistent/a"
B = "public/default/persistent/b"
V1 = "prop/use/ns/persistent/c"
BAD = "public/default/persistent/bad"
GONE = "public/default/persistent/gone"


def test_dangling_orphans_and_errors_then_orphans_delete(zk_chroot: str, tmp_path: Path) -> None:
    zk = connect(zk_chroot)
    try:
        store = LedgerStore(zk)
        store.init_cluster(driver=MetadataDriver.PULSAR)
        _ledger(store, 1, OLD, **_tags(A))
        _ledger(store, 4, OLD, **_tags(A, **{"pulsar/cursor": "sub"}))
        _ledger(store, 5, OLD, **_tags(B))
        _ledger(store, 6, OLD, **_tags(B))  # never listed: orphan
        _ledger(store, 7, OLD, **_tags(V1))
        _ledger(store, 8, OLD, application="pulsar", component="schema",
                **{"pulsar/schemaId": "public/default/a"})  # fmt: skip
        _ledger(store, 9, OLD, application="pulsar", component="schema",
                **{"pulsar/schemaId": "public/default/a"})  # fmt: skip  # orphan
        _ledger(store, 11, OLD, **_tags(BAD))  # its owner is corrupt: unknown
        _ledger(store, 12, int(time.time() * 1000), **_tags(A))  # young: not yet
        _ledger(store, 13, OLD)  # untagged: not judged
        zk.create(f"/managed-ledgers/{A}", _ml(1, 2, 3, deleted=(3,)), makepath=True)
        zk.create(
            f"/managed-ledgers/{A}/sub", ManagedCursorInfo(cursorsLedgerId=4).SerializeToString()
        )
        zk.create(f"/managed-ledgers/{B}", _zlib(_ml(5)), makepath=True)
        zk.create(f"/managed-ledgers/{V1}", _ml(7), makepath=True)
        zk.create(f"/managed-ledgers/{BAD}", b"\xff\x01garbage", makepath=True)
        zk.create(f"/managed-ledgers/{GONE}", _ml(10), makepath=True)
        zk.create("/schemas/public/default/a", _schema(8), makepath=True)
        zk.ensure_path("/schemas/public/empty-namespace")

        # A topic deleted during the check (its ledger 10 went first) is not dangling.
        with open_store(zk_chroot) as session:
            check = check_pulsar(
                session,
                "/ledgers",
                before_confirm=lambda: zk.delete(f"/managed-ledgers/{GONE}"),
            )
    finally:
        zk.stop()
        zk.close()
    assert [(r.ledger_id, r.key) for r in check.dangling] == [(2, f"/managed-ledgers/{A}")]
    assert [o.ledger.ledger_id for o in check.orphans] == [6, 9]
    assert [o.owner_key for o in check.orphans] == [
        f"/managed-ledgers/{B}",
        "/schemas/public/default/a",
    ]
    assert list(check.refs.errors) == [f"/managed-ledgers/{BAD}"]
    assert (check.refs.managed_ledgers, check.refs.cursors, check.refs.schemas) == (5, 1, 1)

    wh = str(tmp_path / "wh")
    proc = bkaudit("audit", "--zk", zk_chroot, "--warehouse", wh, "--check", "pulsar")
    # Findings, but a key did not decode: incomplete outranks findings (docs/exit-status.md).
    assert proc.returncode == ExitStatus.INCOMPLETE, (proc.stdout, proc.stderr)
    (run,) = read_rows(wh, "pulsar_checks")
    assert run["status"] == "COMPLETED_WITH_ERRORS" and dict(run["counts"])["orphans"] == 2
    found = sorted((r["kind"], r["ledger_id"]) for r in read_rows(wh, "pulsar_references"))
    assert found == [
        (PulsarFinding.DANGLING, 2),
        (PulsarFinding.ERROR, None),
        (PulsarFinding.ORPHAN, 6),
        (PulsarFinding.ORPHAN, 9),
    ]

    # A wrong Pulsar root is one line, never "every Pulsar ledger is an orphan".
    for cmd in (
        ("audit", "--zk", zk_chroot, "--warehouse", wh, "--check", "pulsar"),
        ("orphans", "delete", "--zk", zk_chroot, "--warehouse", wh, "--older-than", "1d"),
    ):
        line = one_error_line(bkaudit(*cmd, "--pulsar-root", "/elsewhere"))
        assert "no Pulsar metadata at /elsewhere/managed-ledgers" in line, line
    young = bkaudit("orphans", "delete", "--zk", zk_chroot, "--warehouse", wh,
                    "--older-than", "10m")  # fmt: skip
    assert "--older-than must be at least 1h" in one_error_line(young)

    args = ("orphans", "delete", "--zk", zk_chroot, "--warehouse", wh, "--older-than", "1d",
            "--delay", "0s")  # fmt: skip
    # The corrupt key's ledgers are not judged: the agreed orphans are deleted (or planned),
    # and the run says what it could not judge, exit 3 (docs/exit-status.md).
    dry = bkaudit(*args, "--dry-run")
    assert dry.returncode == ExitStatus.INCOMPLETE, failure(dry)
    said = "INCOMPLETE: not judged, the ledgers of 1 Pulsar keys that do not decode (e.g. "
    assert f"{said}/managed-ledgers/{BAD})" in dry.stdout, dry.stdout
    # --include-unowned refuses while a Pulsar key does not decode: it could name any ledger.
    unowned = bkaudit(*args, "--include-unowned")
    assert unowned.returncode == ExitStatus.INCOMPLETE and "could not be decoded" in unowned.stderr
    real = bkaudit(*args)
    assert real.returncode == ExitStatus.INCOMPLETE, failure(real)
    zk = connect(zk_chroot)
    try:
        assert sorted(LedgerStore(zk).list_ledger_ids()) == [1, 4, 5, 7, 8, 11, 12, 13]
    finally:
        zk.stop()
        zk.close()
    rows = [
        a for a in read_rows(wh, "replication_actions") if a["action"] == ActionKind.DELETE_ORPHAN
    ]
    assert sorted((a["ledger_id"], a["status"]) for a in rows) == [
        (6, ActionStatus.DONE),
        (6, ActionStatus.PLANNED),
        (9, ActionStatus.DONE),
        (9, ActionStatus.PLANNED),
    ]


def test_orphans_delete_nothing_after_an_incomplete_read_or_a_lost_session(
    zk_chroot: str, tmp_path: Path
) -> None:
    """An unreadable ledger znode (exit 3, and it says so), or a session that expired between
    the two reads (exit 3, one line, no ledger deleted); once both are gone the orphan is
    deleted and the run is clean."""
    zk = connect(zk_chroot)
    try:
        store = LedgerStore(zk)
        store.init_cluster(driver=MetadataDriver.PULSAR)
        _ledger(store, 1, OLD, **_tags(A))
        _ledger(store, 2, OLD, **_tags(A))  # never listed: orphan
        _ledger(store, 3, OLD, **_tags(A))
        zk.create(f"/managed-ledgers/{A}", _ml(1), makepath=True)
        good = zk.get(store.path_for(3))[0]
        zk.set(store.path_for(3), b"BookieMetadataFormatVersion\t3\n\x05garbage")
    finally:
        zk.stop()
        zk.close()
    wh = str(tmp_path / "wh")
    args = ["orphans", "delete", "--zk", zk_chroot, "--warehouse", wh, "--older-than", "1d"]

    def ledgers() -> list[int]:
        with open_store(zk_chroot) as session:
            return sorted(LedgerStore(session).list_ledger_ids())

    # Ledger 3 unreadable: ledger 2 is still proved an orphan (its owner does not list it)
    # and deleted, but ledger 3 may be one too, so the run is incomplete.
    unread = bkaudit(*args, "--delay", "0s", "--dry-run")
    assert unread.returncode == ExitStatus.INCOMPLETE, failure(unread)
    last = unread.stdout.splitlines()[-1]
    assert last == "INCOMPLETE: not judged, 1 ledgers whose metadata could not be read", last
    assert ledgers() == [1, 2, 3]

    zk = connect(zk_chroot)
    try:
        zk.set(LedgerStore(zk).path_for(3), good)
        ledger_3_listed = _ml(1, 3)
        zk.set(f"/managed-ledgers/{A}", ledger_3_listed)
    finally:
        zk.stop()
        zk.close()
    port = int(zk_chroot.split(":")[1].split("/")[0])
    paused = frozen_past_its_session(
        [*args, "--delay", "6s", "--zk-session-timeout", "2s"], port, after=1.5
    )
    assert paused.returncode == ExitStatus.INCOMPLETE, failure(paused)
    (line,) = error_lines(paused)
    assert "expired" in line, line
    assert ledgers() == [1, 2, 3]

    done = bkaudit(*args, "--delay", "0s")
    assert done.returncode == ExitStatus.OK, failure(done)
    assert ledgers() == [1, 3]
