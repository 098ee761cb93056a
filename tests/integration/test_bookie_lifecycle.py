"""Python bookie processes across crashes and restarts: durability of acknowledged adds and
fences after kill -9, cookies, registration, session expiry, disk-full read-only mode."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from bklib.availability import decode as decode_availability
from bklib.bookie import storage as st
from bklib.meta.formats import decode_service_info
from bklib.proto import protocol_pb2 as pb
from bklib.proto.framing import encode_frame
from bklib.testing import datadir
from bklib.testing.ports import free_port
from tests.bookie_helpers import (
    KEY,
    BookieProcess,
    RawClient,
    entry_body,
    lac_body,
    wait_for_znode,
)

pytestmark = pytest.mark.integration


def wait_until(pred: Callable[[], bool], timeout: float = 30.0, what: str = "condition") -> None:
    """Poll a condition until it holds (a deadline, not a sleep-as-assertion)."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout}s")
        time.sleep(0.05)


def test_kill9_after_acks_then_restart_keeps_every_acknowledged_entry_and_fence(
    zk_chroot: str, zk: KazooClient, tmp_path: Path
) -> None:
    bookie = BookieProcess(zk_chroot, tmp_path / "b", zk_timeout=2.0)
    bookie.start()
    payload = b"p" * 1024
    writable = f"/ledgers/available/{bookie.bookie_id}"
    wait_for_znode(zk, writable)
    old_owner = zk.exists(writable).ephemeralOwner
    with RawClient(bookie.address) as c:
        assert c.add_many(1, range(2000), payload) == [pb.EOK] * 2000
        assert c.add_many(2, range(3), payload) == [pb.EOK] * 3
        assert c.read(2, -1, fence_key=KEY).status == pb.EOK
        assert c.read(3, -1, fence_key=KEY).status == pb.ENOENTRY  # created + fenced
        assert c.write_lac(4, 17).status == pb.EOK

    # Adds in flight while the process is killed: whatever was acked must survive.
    acked: list[int] = []
    sock = RawClient(bookie.address)
    reqs = [sock.add_req(5, e, entry_body(5, e, payload)) for e in range(5000)]
    by_txn = {r.header.txnId: r.addRequest.entryId for r in reqs}

    def reader() -> None:
        try:
            while True:
                resp = pb.Response.FromString(sock.read_frame())
                if resp.status == pb.EOK:
                    acked.append(by_txn[resp.header.txnId])
        except (ConnectionError, OSError):
            pass

    t = threading.Thread(target=reader)
    t.start()
    for i in range(0, 5000, 250):
        sock.send_many(reqs[i : i + 250])
        if len(acked) > 500:
            break
    wait_until(lambda: len(acked) > 500, what="some acks")
    bookie.kill9()
    t.join(10)
    sock.close()
    acked_now = sorted(acked)
    assert acked_now

    bookie.start()
    with RawClient(bookie.address) as c:
        for e in range(2000):
            r = c.read(1, e)
            assert r.status == pb.EOK and r.readResponse.body == entry_body(1, e, payload)
        ids = decode_availability(
            c.list_entries(1).getListOfEntriesOfLedgerResponse.availabilityOfEntriesOfLedger
        )
        assert ids.count() == 2000
        for e in acked_now:
            r = c.read(5, e)
            assert r.status == pb.EOK and r.readResponse.body == entry_body(5, e, payload)
        # Fences are still in force and still keyed.
        assert c.add(2, 3) == pb.EFENCED
        assert c.add(3, 0) == pb.EFENCED
        assert c.add(2, 3, recovery=True) == pb.EOK
        r = c.read_lac(4)
        assert r.status == pb.EIO and r.readLacResponse.lacBody == lac_body(4, 17)
        assert c.add(6, 0) == pb.EOK  # and it keeps taking writes
    # The restarted bookie registers again once the killed one's session has expired.
    wait_until(
        lambda: (s := zk.exists(writable)) is not None and s.ephemeralOwner != old_owner,
        what="re-registration after kill -9",
    )
    bookie.stop()


def test_cookie_refuses_wiped_or_moved_data_dir(
    zk_chroot: str, zk: KazooClient, tmp_path: Path
) -> None:
    port = free_port()
    first = BookieProcess(zk_chroot, tmp_path / "d1", port)
    first.start()
    with RawClient(first.address) as c:
        assert c.add(1, 0) == pb.EOK
    assert first.stop() == 0
    assert zk.exists(f"/ledgers/cookies/{first.bookie_id}") is not None

    wiped = BookieProcess(zk_chroot, tmp_path / "empty", port)
    assert wiped.run_to_exit() == 2
    assert "data dir has none" in wiped.log_tail()
    assert not (tmp_path / "empty" / "current" / "VERSION").exists()

    (tmp_path / "d1").rename(tmp_path / "moved")
    moved = BookieProcess(zk_chroot, tmp_path / "moved", port)
    assert moved.run_to_exit() == 2
    assert "does not match" in moved.log_tail()

    # Put back where the cookie says: it starts and still has its data.
    (tmp_path / "moved").rename(tmp_path / "d1")
    again = BookieProcess(zk_chroot, tmp_path / "d1", port)
    with again, RawClient(again.address) as c:
        assert c.read(1, 0).status == pb.EOK


def test_cookie_carries_the_cluster_instance_id(
    zk_chroot: str, zk: KazooClient, tmp_path: Path
) -> None:
    from bklib.meta.formats import parse_cookie

    zk.create("/ledgers/INSTANCEID", b"instance-a", makepath=True)
    port = free_port()
    with BookieProcess(zk_chroot, tmp_path / "d", port) as bookie:
        pass
    cookie = parse_cookie(zk.get(f"/ledgers/cookies/{bookie.bookie_id}")[0])
    assert cookie.instance_id == "instance-a"
    # The same data dir pointed at another cluster instance is refused.
    zk.set("/ledgers/INSTANCEID", b"instance-b")
    other = BookieProcess(zk_chroot, tmp_path / "d", port)
    assert other.run_to_exit() == 2
    assert "does not match" in other.log_tail()


def test_second_process_on_same_data_dir_is_refused(zk_chroot: str, tmp_path: Path) -> None:
    with BookieProcess(zk_chroot, tmp_path / "d") as running:
        # Another bookie id (port) on the same dir: the data dir lock refuses it.
        other = BookieProcess(zk_chroot, tmp_path / "d")
        assert other.run_to_exit() == 2
        assert "in use by another process" in other.log_tail()
        with RawClient(running.address) as c:
            assert c.add(1, 0) == pb.EOK


def test_registration_and_reregistration_after_session_expiry(
    zk_chroot: str, zk: KazooClient, tmp_path: Path, zk_server: object
) -> None:
    with BookieProcess(zk_chroot, tmp_path / "d") as bookie:
        path = f"/ledgers/available/{bookie.bookie_id}"
        data = wait_for_znode(zk, path)
        info = decode_service_info(data, bookie.bookie_id)
        (ep,) = info.endpoints
        assert (ep.id, ep.protocol, ep.host, ep.port) == (
            "bookie",
            "bookie-rpc",
            "127.0.0.1",
            bookie.port,
        )
        stat = zk.exists(path)
        sid, pwd = bookie.admin().zk_session()
        assert stat.ephemeralOwner == sid
        # Expire the bookie's session: a second client with the same id/password closes it.
        hosts = zk_chroot.split("/", 1)[0]
        thief = KazooClient(hosts=hosts, client_id=(sid, pwd), timeout=10)
        thief.start(timeout=15)
        thief.stop()
        thief.close()
        wait_until(
            lambda: (s := zk.exists(path)) is not None and s.ephemeralOwner != sid,
            what="re-registration with a new session",
        )
        new_sid, _ = bookie.admin().zk_session()
        assert zk.exists(path).ephemeralOwner == new_sid != sid
        with RawClient(bookie.address) as c:
            assert c.add(1, 0) == pb.EOK
    # A clean stop removes the registration at once.
    assert zk.exists(path) is None


def test_disk_full_makes_the_bookie_read_only(
    zk_chroot: str, zk: KazooClient, tmp_path: Path
) -> None:
    data_dir = tmp_path / "d"
    # Write something first, as a writable bookie.
    with BookieProcess(zk_chroot, data_dir) as bookie, RawClient(bookie.address) as c:
        assert c.add(1, 0) == pb.EOK
        port = bookie.port
    full = BookieProcess(zk_chroot, data_dir, port, extra=["--min-free-bytes", str(10**18)])
    with full, RawClient(full.address) as c:
        wait_for_znode(zk, f"/ledgers/available/readonly/{full.bookie_id}")
        assert zk.exists(f"/ledgers/available/{full.bookie_id}") is None
        assert c.add(1, 1) == pb.EREADONLY
        assert c.add(1, 1, recovery=True, priority=100) == pb.EREADONLY  # no room at all
        assert c.write_lac(1, 0).status == pb.EREADONLY
        assert c.read(1, 0).status == pb.EOK
        assert full.admin().status()["readonly"] is True


def test_offline_helpers_on_a_stopped_bookie(zk_chroot: str, tmp_path: Path) -> None:
    data_dir = tmp_path / "d"
    bookie = BookieProcess(zk_chroot, data_dir)
    with bookie, RawClient(bookie.address) as c:
        assert c.add_many(9, range(10), b"q" * 100) == [pb.EOK] * 10
        with pytest.raises(st.DataDirLockedError):
            datadir.stored_entries(data_dir)  # refuses while the bookie runs
    assert datadir.delete_entries(data_dir, 9, [2, 3]) == [2, 3]
    datadir.corrupt_entry(data_dir, 9, 5)
    assert datadir.stored_entries(data_dir) == {9: [0, 1, 4, 5, 6, 7, 8, 9]}
    with bookie, RawClient(bookie.address) as c:
        assert c.read(9, 2).status == pb.ENOENTRY
        assert c.read(9, 4).readResponse.body == entry_body(9, 4, b"q" * 100)
        corrupted = c.read(9, 5).readResponse.body
        assert corrupted != entry_body(9, 5, b"q" * 100)
        assert len(corrupted) == len(entry_body(9, 5, b"q" * 100))


def test_oversized_frame_closes_only_that_connection(zk_chroot: str, tmp_path: Path) -> None:
    with BookieProcess(zk_chroot, tmp_path / "d") as bookie, RawClient(bookie.address) as ok:
        assert ok.add(1, 0) == pb.EOK
        s = socket.create_connection(bookie.address)
        s.sendall(struct.pack(">I", 5 * 1024 * 1024 - 3))  # N + 4 > 5 MiB
        with contextlib.suppress(ConnectionResetError):  # an abort is a close too
            assert s.recv(10) == b""
        s.close()
        # Exactly at the limit is accepted (an add whose frame is 5 MiB in total).
        limit = 5 * 1024 * 1024
        filler = limit
        while True:
            big = ok.add_req(1, 1, entry_body(1, 1, b"b" * filler))
            size = len(encode_frame(big.SerializeToString()))
            if size == limit:
                break
            filler -= size - limit  # varint lengths shrink too: converge in a few steps
        assert size == limit
        assert ok.call(big).status == pb.EOK
        assert ok.read(1, 1).readResponse.body == big.addRequest.body
        assert bookie.alive()
