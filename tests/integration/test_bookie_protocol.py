"""The Python bookie as a real process, spoken to over real sockets with raw v3/v2 frames.

One bookie (with fault injection) serves the whole module; every test uses its own ledger ids.
"""

from __future__ import annotations

import itertools
import os
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from bklib.availability import decode as decode_availability
from bklib.digest import parse_entry_header
from bklib.meta.formats import decode_service_info
from bklib.proto import protocol_pb2 as pb
from bklib.proto.framing import encode_frame
from bklib.testing.zkserver import ZooKeeperServer
from tests.bookie_helpers import (
    KEY,
    WRONG_KEY,
    BookieProcess,
    RawClient,
    entry_body,
    lac_body,
    v2_add,
    v2_read,
    wait_for_no_znode,
    wait_for_znode,
)

pytestmark = pytest.mark.integration

_ledger_ids = itertools.count(1000)


def new_ledger() -> int:
    return next(_ledger_ids)


@pytest.fixture(scope="module")
def chroot(zk_server: ZooKeeperServer) -> Iterator[str]:
    with zk_server.private_chroot("bk") as hosts:
        yield hosts


@pytest.fixture(scope="module")
def mzk(chroot: str) -> Iterator[KazooClient]:
    client = KazooClient(hosts=chroot, timeout=10)
    client.start(timeout=15)
    try:
        yield client
    finally:
        client.stop()
        client.close()


@pytest.fixture(scope="module")
def bookie(chroot: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BookieProcess]:
    proc = BookieProcess(chroot, tmp_path_factory.mktemp("bookie") / "data")
    proc.start()
    try:
        yield proc
        assert proc.alive(), proc.log_tail()
    finally:
        proc.stop()


@pytest.fixture
def client(bookie: BookieProcess) -> Iterator[RawClient]:
    with RawClient(bookie.address) as c:
        yield c


@pytest.fixture(autouse=True)
def _no_leftover_faults(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "bookie" in request.fixturenames:
        request.getfixturevalue("bookie").admin().clear_faults()


def test_add_then_read_back_and_last_entry(client: RawClient) -> None:
    lid = new_ledger()
    bodies = {e: entry_body(lid, e, b"payload-%d" % e) for e in range(5)}
    for e, b in bodies.items():
        assert client.add(lid, e, b) == pb.EOK
    for e, b in bodies.items():
        r = client.read(lid, e)
        assert r.status == pb.EOK
        assert r.readResponse.body == b  # byte-identical
        assert (r.readResponse.ledgerId, r.readResponse.entryId) == (lid, e)
        assert r.readResponse.maxLAC == 3  # highest piggybacked LAC (entry 4 carries 3)
    last = client.read(lid, -1)
    assert last.status == pb.EOK and last.readResponse.body == bodies[4]
    assert last.readResponse.entryId == -1
    assert parse_entry_header(last.readResponse.body)[1] == 4


def test_unknown_ledger_vs_missing_entry(client: RawClient) -> None:
    lid = new_ledger()
    assert client.read(lid, 0).status == pb.ENOLEDGER
    assert client.read(lid, -1).status == pb.ENOLEDGER
    assert client.add(lid, 0) == pb.EOK
    missing = client.read(lid, 7)
    assert missing.status == pb.ENOENTRY
    assert (missing.readResponse.ledgerId, missing.readResponse.entryId) == (lid, 7)
    assert not missing.readResponse.HasField("body")


def test_pipelined_adds_on_many_connections(bookie: BookieProcess) -> None:
    lids = [new_ledger() for _ in range(4)]
    results: dict[int, list[int]] = {}

    def worker(lid: int) -> None:
        with RawClient(bookie.address) as c:
            results[lid] = c.add_many(lid, range(500), b"z" * 1024)

    threads = [threading.Thread(target=worker, args=(lid,)) for lid in lids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(results[lid] == [pb.EOK] * 500 for lid in lids)
    with RawClient(bookie.address) as c:
        for lid in lids:
            ids = decode_availability(
                c.list_entries(lid).getListOfEntriesOfLedgerResponse.availabilityOfEntriesOfLedger
            )
            assert ids.count() == 500 and ids.first_id() == 0 and ids.last_id() == 499


def test_replies_carry_txn_and_operation_out_of_order(client: RawClient) -> None:
    lid = new_ledger()
    assert client.add(lid, 0) == pb.EOK
    add = client.add_req(lid, 1)
    read = client.read_req(lid, 0)
    client.send_many([add, read])
    # The read is answered at once, the add only after its fsync: match by txnId.
    r_read = client.response(read.header.txnId)
    r_add = client.response(add.header.txnId)
    assert r_read.header.operation == pb.READ_ENTRY and r_read.status == pb.EOK
    assert r_add.header.operation == pb.ADD_ENTRY and r_add.status == pb.EOK
    assert r_add.header.version == pb.VERSION_THREE


def test_fencing(client: RawClient) -> None:
    lid = new_ledger()
    for e in range(3):
        assert client.add(lid, e) == pb.EOK
    assert client.read(lid, -1, fence=True).status == pb.EUA  # fencing needs the key
    assert client.read(lid, -1, fence_key=WRONG_KEY).status == pb.EUA
    assert client.add(lid, 3) == pb.EOK  # still not fenced
    fenced = client.read(lid, -1, fence_key=KEY)
    assert fenced.status == pb.EOK
    assert parse_entry_header(fenced.readResponse.body)[1] == 3
    assert not fenced.readResponse.HasField("maxLAC")
    assert client.add(lid, 4) == pb.EFENCED
    assert client.add(lid, 4, recovery=True) == pb.EOK
    assert client.add(lid, 5, recovery=True, priority=100) == pb.EOK
    assert client.read(lid, 4).status == pb.EOK  # reads are unaffected
    # Fencing is idempotent.
    assert client.read(lid, 0, fence_key=KEY).status == pb.EOK


def test_fencing_an_unknown_ledger_creates_it_and_answers_enoentry(client: RawClient) -> None:
    lid = new_ledger()
    r = client.read(lid, -1, fence_key=KEY)
    assert r.status == pb.ENOENTRY
    assert client.read(lid, 0).status == pb.ENOENTRY  # the ledger exists now
    assert client.add(lid, 0) == pb.EFENCED
    assert client.add(lid, 0, key=WRONG_KEY) == pb.EUA  # created with the fencer's key
    assert client.add(lid, 0, recovery=True) == pb.EOK


def test_master_key_checked_on_add_and_write_lac(client: RawClient) -> None:
    lid = new_ledger()
    assert client.add(lid, 0) == pb.EOK
    assert client.add(lid, 1, key=WRONG_KEY) == pb.EUA
    assert client.read(lid, 1).status == pb.ENOENTRY
    wl = client.write_lac(lid, 0, key=WRONG_KEY)
    assert wl.status == pb.EUA and wl.writeLacResponse.ledgerId == lid


def test_write_and_read_lac(client: RawClient) -> None:
    lid = new_ledger()
    assert client.read_lac(lid).status == pb.ENOLEDGER
    # Explicit LAC on a ledger with no entries: EIO with lacBody (a ReadLacProcessorV3 quirk).
    wl = client.write_lac(lid, 7)
    assert wl.status == pb.EOK and wl.writeLacResponse.ledgerId == lid
    r = client.read_lac(lid)
    assert r.status == pb.EIO and r.readLacResponse.lacBody == lac_body(lid, 7)
    assert client.add(lid, 0) == pb.EOK
    r = client.read_lac(lid)
    assert r.status == pb.EOK
    assert r.readLacResponse.lacBody == lac_body(lid, 7)
    assert r.readLacResponse.lastEntryBody == entry_body(lid, 0, b"x" * 16)
    # The LAC from body[8:16] raised the bookie's known LAC, reported as maxLAC.
    assert client.read(lid, 0).readResponse.maxLAC == 7
    # Nothing at all: ENOENTRY (a fenced empty ledger).
    empty = new_ledger()
    assert client.read(empty, -1, fence_key=KEY).status == pb.ENOENTRY
    assert client.read_lac(empty).status == pb.ENOENTRY


def test_force_ledger_and_deferred_sync(client: RawClient) -> None:
    lid = new_ledger()
    add = client.add_req(lid, 0, write_flags=1)
    assert client.call(add).status == pb.EOK
    f = client.force(lid)
    assert f.status == pb.EOK and f.forceLedgerResponse.ledgerId == lid
    assert client.force(new_ledger()).status == pb.EOK  # no existence check


def test_list_of_entries(client: RawClient) -> None:
    lid = new_ledger()
    written = [0, 1, 2, 5, 6, 9]
    for e in written:
        assert client.add(lid, e) == pb.EOK
    r = client.list_entries(lid)
    assert r.status == pb.EOK
    sub = r.getListOfEntriesOfLedgerResponse
    assert sub.ledgerId == lid
    assert list(decode_availability(sub.availabilityOfEntriesOfLedger).iter_ids()) == written
    assert len(sub.availabilityOfEntriesOfLedger) == 64 + 3 * 24  # one record per run
    assert client.list_entries(new_ledger()).status == pb.ENOLEDGER


def test_bookie_info(client: RawClient, bookie: BookieProcess) -> None:
    r = client.bookie_info(3)
    assert r.status == pb.EOK
    info = r.getBookieInfoResponse
    st = os.statvfs(bookie.data_dir)
    assert info.totalDiskCapacity == st.f_blocks * st.f_frsize
    assert 0 < info.freeDiskSpace <= info.totalDiskCapacity
    only_free = client.bookie_info(2).getBookieInfoResponse
    assert only_free.HasField("freeDiskSpace") and not only_free.HasField("totalDiskCapacity")


def test_unsupported_operations_and_versions(client: RawClient) -> None:
    for op in (pb.RANGE_READ_ENTRY, pb.RANGE_ADD_ENTRY, pb.START_TLS, pb.BATCH_READ_ENTRY):
        req = client.request(op, priority=7)
        r = client.call(req)
        assert r.status == pb.EBADREQ
        assert r.header == req.header  # header copied, priority included
    req = client.read_req(new_ledger(), 0)
    req.header.version = pb.VERSION_TWO
    r = client.call(req)
    assert r.status == pb.EBADVERSION and r.readResponse.status == pb.EBADVERSION
    auth = client.request(pb.AUTH)
    auth.authRequest.authPluginName = "AuthDisabledPlugin"
    auth.authRequest.payload = b""
    r = client.call(auth)
    assert r.status == pb.EOK and r.authResponse.authPluginName == "AuthDisabledPlugin"
    # A read request without its sub-message: a complete EBADREQ reply, not a crash.
    r = client.call(client.request(pb.READ_ENTRY))
    assert r.status == pb.EBADREQ and r.readResponse.status == pb.EBADREQ


def test_malformed_v3_frame_closes_only_that_connection(bookie: BookieProcess) -> None:
    with RawClient(bookie.address) as good, RawClient(bookie.address) as bad:
        lid = new_ledger()
        assert good.add(lid, 0) == pb.EOK
        # A header without txnId: parses as protobuf but misses a required field.
        bad.sock.sendall(encode_frame(bytes.fromhex("0a0408031002")))
        with pytest.raises(ConnectionError):
            bad.read_frame()
        assert good.read(lid, 0).status == pb.EOK


def test_long_poll_read(client: RawClient, bookie: BookieProcess) -> None:
    lid = new_ledger()
    assert client.add(lid, 0) == pb.EOK
    req = client.read_req(lid, -1)
    req.readRequest.previousLAC = 0
    req.readRequest.timeOut = 10_000
    req.readRequest.flag = pb.ReadRequest.ENTRY_PIGGYBACK
    txn = client.send_request(req)
    with RawClient(bookie.address) as writer:
        assert writer.add(lid, 1) == pb.EOK
        assert writer.add(lid, 2) == pb.EOK  # carries LAC 1: wakes the poll
    r = client.response(txn)
    assert r.status == pb.EOK
    assert r.readResponse.maxLAC == 1
    assert r.readResponse.entryId == 1
    assert r.readResponse.body == entry_body(lid, 1, b"x" * 16)
    assert r.readResponse.HasField("lacUpdateTimestamp")
    bad = client.read_req(lid, 3)
    bad.readRequest.flag = pb.ReadRequest.ENTRY_PIGGYBACK
    assert client.call(bad).status == pb.EBADREQ


def test_v2_add_read_fence_and_batch_read(bookie: BookieProcess) -> None:
    lid = new_ledger()
    with RawClient(bookie.address) as c:
        for e in range(4):
            reply = c.v2_call(v2_add(lid, e))
            header, rc, rl, re_ = struct.unpack(">iiqq", reply)
            assert (header, rc, rl, re_) == ((2 << 24) | (1 << 16), 0, lid, e)
        reply = c.v2_call(v2_read(lid, -1))
        header, rc, rl, re_ = struct.unpack_from(">iiqq", reply)
        assert (rc, rl, re_) == (0, lid, -1)  # echoes -1
        assert reply[24:] == entry_body(lid, 3, b"v2")
        # Unknown ledger: rc 1 (ENOLEDGER); missing entry: rc 2.
        assert struct.unpack_from(">i", c.v2_call(v2_read(new_ledger(), 0)), 4)[0] == 1
        assert struct.unpack_from(">i", c.v2_call(v2_read(lid, 99)), 4)[0] == 2
        # Batch read of entries 1.. (maxCount 2).
        req = struct.pack(">iqqqiq", (2 << 24) | (7 << 16), lid, 1, 4242, 2, 1 << 20)
        reply = c.v2_call(req)
        _, rc, rl, start, rid = struct.unpack_from(">iiqqq", reply)
        assert (rc, rl, start, rid) == (0, lid, 1, 4242)
        bodies, pos = [], 32
        while pos < len(reply):
            (n,) = struct.unpack_from(">i", reply, pos)
            bodies.append(reply[pos + 4 : pos + 4 + n])
            pos += 4 + n
        assert bodies == [entry_body(lid, 1, b"v2"), entry_body(lid, 2, b"v2")]
        # Fence over v2, then a normal add gets EFENCED (104), a recovery add passes.
        reply = c.v2_call(v2_read(lid, -1, flags=1, key=KEY))
        assert struct.unpack_from(">i", reply, 4)[0] == 0
        assert struct.unpack_from(">i", c.v2_call(v2_add(lid, 4)), 4)[0] == 104
        assert struct.unpack_from(">i", c.v2_call(v2_add(lid, 4, flags=0x6)), 4)[0] == 0
        # Version 3 in a v2 header: EBADVERSION (103).
        bad = struct.pack(">iqq", (3 << 24) | (2 << 16), lid, 0)
        assert struct.unpack_from(">i", c.v2_call(bad), 4)[0] == 103
        # The same connection still speaks v3.
        assert c.read(lid, 0).status == pb.EOK
    with RawClient(bookie.address) as c:
        # A v2 fencing read without its key is truncated: the connection is closed.
        c.sock.sendall(encode_frame(v2_read(lid, -1, flags=1)))
        with pytest.raises(ConnectionError):
            c.read_frame()
    with RawClient(bookie.address) as c:
        c.sock.sendall(encode_frame(struct.pack(">iq", (2 << 24) | (5 << 16), lid)))  # WRITE_LAC
        with pytest.raises(ConnectionError):
            c.read_frame()


def test_live_delete_and_corrupt_helpers(client: RawClient, bookie: BookieProcess) -> None:
    lid = new_ledger()
    for e in range(4):
        assert client.add(lid, e) == pb.EOK
    admin = bookie.admin()
    assert admin.delete_entries(lid, [1, 3, 8]) == [1, 3]
    assert client.read(lid, 1).status == pb.ENOENTRY
    assert parse_entry_header(client.read(lid, -1).readResponse.body)[1] == 2
    admin.corrupt_entry(lid, 2)
    body = client.read(lid, 2).readResponse.body
    good = entry_body(lid, 2, b"x" * 16)
    assert body[:-1] == good[:-1] and body[-1] == good[-1] ^ 0xFF


# -- fault injection ---------------------------------------------------------------------------


def test_fault_delay(client: RawClient, bookie: BookieProcess) -> None:
    lid = new_ledger()
    assert client.add(lid, 0) == pb.EOK
    # 2 s: an add on this shared 2-core machine can take a few hundred ms under load, and the
    # test is about order (the add is not queued behind the delayed read), not speed.
    bookie.admin().add_fault("delay", op="READ_ENTRY", ledger=lid, entry=0, delay_ms=2000)
    slow = client.read_req(lid, 0)
    t0 = time.monotonic()
    client.send_request(slow)
    # Other work is not held up behind the delayed request.
    assert client.add(lid, 1) == pb.EOK
    assert time.monotonic() - t0 < 2.0
    r = client.response(slow.header.txnId)
    assert time.monotonic() - t0 >= 2.0
    assert r.status == pb.EOK


def test_fault_drop_before_and_after_processing(client: RawClient, bookie: BookieProcess) -> None:
    lid = new_ledger()
    admin = bookie.admin()
    admin.add_fault("drop", op="ADD_ENTRY", ledger=lid, entry=0, count=1)
    lost = client.add_req(lid, 0)
    client.send_request(lost)
    # FORCE_LEDGER answers after everything queued before it: a reply to the add would
    # have come first.
    assert client.force(lid).status == pb.EOK
    assert lost.header.txnId not in client._pending
    assert client.read(lid, 0).status == pb.ENOLEDGER  # never processed
    # Processed but the ack is lost: the entry exists on the bookie.
    admin.add_fault("drop", op="ADD_ENTRY", ledger=lid, entry=1, after=True)
    acked_nowhere = client.add_req(lid, 1)
    client.send_request(acked_nowhere)
    assert client.force(lid).status == pb.EOK
    assert acked_nowhere.header.txnId not in client._pending
    assert client.read(lid, 1).status == pb.EOK
    rules = admin.faults()
    assert [r["hits"] for r in rules] == [1, 1]


def test_fault_fail_with_status(client: RawClient, bookie: BookieProcess) -> None:
    lid = new_ledger()
    admin = bookie.admin()
    assert client.add(lid, 0) == pb.EOK
    admin.add_fault("fail", op="READ_ENTRY", ledger=lid, status="EIO", count=2)
    for _ in range(2):
        r = client.read(lid, 0)
        assert r.status == pb.EIO and r.readResponse.entryId == 0
    assert client.read(lid, 0).status == pb.EOK  # the rule is spent
    admin.add_fault("fail", op=["ADD_ENTRY"], ledger=lid, status="ETOOMANYREQUESTS")
    assert client.add(lid, 1) == pb.ETOOMANYREQUESTS
    assert client.read(lid, 1).status == pb.ENOENTRY
    admin.clear_faults()
    # Stored, then answered with an error anyway.
    admin.add_fault("fail", op="ADD_ENTRY", ledger=lid, entry=2, after=True, status="EIO")
    assert client.add(lid, 2) == pb.EIO
    assert client.read(lid, 2).status == pb.EOK
    # Fencing reads can be targeted separately from plain reads.
    admin.add_fault("fail", op="READ_ENTRY", ledger=lid, fence=True, status="EUNKNOWNLEDGERSTATE")
    assert client.read(lid, -1, fence_key=KEY).status == pb.EUNKNOWNLEDGERSTATE
    assert client.read(lid, 0).status == pb.EOK
    assert client.add(lid, 3) == pb.EOK  # the failed fence did not fence
    # v2 requests obey the same rules.
    with RawClient(bookie.address) as c:
        assert struct.unpack_from(">i", c.v2_call(v2_read(lid, 0)), 4)[0] == 0
        admin.add_fault("fail", op="READ_ENTRY", ledger=lid, entry=0, fence=False)
        assert struct.unpack_from(">i", c.v2_call(v2_read(lid, 0)), 4)[0] == 101


# -- read-only -----------------------------------------------------------------------------------


def test_readonly_mode_and_registration_move(
    client: RawClient, bookie: BookieProcess, mzk: KazooClient
) -> None:
    writable = f"/ledgers/available/{bookie.bookie_id}"
    readonly = f"/ledgers/available/readonly/{bookie.bookie_id}"
    data = wait_for_znode(mzk, writable)
    assert decode_service_info(data, bookie.bookie_id).rpc_address() == bookie.address
    lid = new_ledger()
    assert client.add(lid, 0) == pb.EOK
    admin = bookie.admin()
    admin.set_readonly(True)
    try:
        assert mzk.exists(readonly) is not None and mzk.exists(writable) is None
        ro_info = decode_service_info(mzk.get(readonly)[0], bookie.bookie_id)
        assert ro_info.rpc_address() == bookie.address
        assert client.add(lid, 1) == pb.EREADONLY
        assert client.write_lac(lid, 0).status == pb.EREADONLY
        assert client.add(lid, 1, recovery=True, priority=100) == pb.EOK  # high priority
        assert client.read(lid, 0).status == pb.EOK
        assert client.read(lid, -1, fence_key=KEY).status == pb.EOK
        assert client.read_lac(lid).status == pb.EOK
        assert client.force(lid).status == pb.EOK
        assert struct.unpack_from(">i", client.v2_call(v2_add(lid, 2)), 4)[0] == 105
    finally:
        admin.set_readonly(False)
    assert mzk.exists(writable) is not None
    wait_for_no_znode(mzk, readonly, timeout=5)
    assert client.add(new_ledger(), 0) == pb.EOK


def test_connection_survives_client_half_garbage(bookie: BookieProcess) -> None:
    """Bytes that never complete a frame only cost that connection."""
    s = socket.create_connection(bookie.address)
    s.sendall(struct.pack(">I", 1000) + b"\x0a" * 10)
    s.close()
    with RawClient(bookie.address) as c:
        lid = new_ledger()
        assert c.add(lid, 0) == pb.EOK


def test_data_dir_has_a_cookie(bookie: BookieProcess, mzk: KazooClient) -> None:
    from bklib.meta.formats import parse_cookie

    local = parse_cookie((Path(bookie.data_dir) / "current" / "VERSION").read_bytes())
    remote = parse_cookie(mzk.get(f"/ledgers/cookies/{bookie.bookie_id}")[0])
    assert local == remote
    assert local.bookie_host == bookie.bookie_id
    assert local.journal_dirs == [str(Path(bookie.data_dir).resolve())]


def test_half_closed_client_still_gets_every_reply(bookie: BookieProcess) -> None:
    lid = new_ledger()
    with RawClient(bookie.address) as c:
        reqs = [c.add_req(lid, e) for e in range(200)]
        c.send_many(reqs)
        c.sock.shutdown(socket.SHUT_WR)
        for r in reqs:
            assert c.response(r.header.txnId).status == pb.EOK
        with pytest.raises(ConnectionError):
            c.read_frame()  # and then the bookie closes
