"""The bulk reader's multiRead against a real ZooKeeper (3.9): the same answers as one getData
per znode, in order, across batch boundaries, with each znode's error kept to that znode, and
far fewer requests for the server."""

from __future__ import annotations

import re

import pytest
from kazoo.client import KazooClient
from kazoo.security import make_digest_acl

from bklib.meta.stores.zookeeper.bulk import READS_PER_MULTI, ZNOAUTH, ZNONODE, BulkReader
from bklib.testing.zkserver import ZooKeeperServer, four_letter_word

pytestmark = pytest.mark.integration


def _received_from(server: ZooKeeperServer, reader: BulkReader) -> int:
    """Packets the server received on this reader's connection (``cons``), so the other
    tests' sessions on the shared server (their pings, their writes) are not counted."""
    assert reader.sock is not None
    host, port = reader.sock.getsockname()[:2]
    for line in four_letter_word(server.host, server.port, b"cons").decode().splitlines():
        if f"/{host}:{port}[" in line:
            match = re.search(r"recved=(\d+)", line)
            assert match is not None, line
            return int(match.group(1))
    raise AssertionError(f"no connection from {host}:{port} in cons")


def test_multiread_answers_as_one_getdata_each(
    zk: KazooClient, zk_chroot: str, zk_server: ZooKeeperServer
) -> None:
    zk.ensure_path("/m")
    paths = []
    for i in range(2 * READS_PER_MULTI + 23):
        path = f"/m/n{i:03d}"
        paths.append(path)
        if i in (READS_PER_MULTI - 1, READS_PER_MULTI, 2 * READS_PER_MULTI):
            continue  # missing, on each side of a batch boundary
        zk.create(path, b"x" * (i % 7) * 100)  # empty data too
        if i % 5 == 0:
            zk.set(path, b"changed")
    zk.create("/m/secret", b"s", acl=[make_digest_acl("bk", "pw", all=True)])
    paths.insert(7, "/m/secret")

    try:
        with BulkReader(zk_chroot) as multi:
            before = _received_from(zk_server, multi)
            got = list(multi.get_many(paths, max_in_flight=120))
            sent = _received_from(zk_server, multi) - before
            assert multi.multi_read is True
        with BulkReader(zk_chroot) as each:
            each.multi_read = False
            expected = list(each.get_many(paths, max_in_flight=7))
    finally:
        zk.add_auth("digest", "bk:pw")  # the chroot's wipe cannot list what it cannot read
        zk.delete("/m/secret")

    assert got == expected
    assert [g.path for g in got] == paths
    by_path = {g.path: g for g in got}
    assert by_path["/m/secret"].err == ZNOAUTH and by_path["/m/secret"].data is None
    for i in (READS_PER_MULTI - 1, READS_PER_MULTI, 2 * READS_PER_MULTI):
        assert by_path[f"/m/n{i:03d}"].err == ZNONODE
    five = by_path["/m/n005"]
    assert five.err == 0 and five.data == b"changed" and five.stat is not None
    assert five.stat.version == 1
    assert by_path["/m/n007"].data == b"" and by_path["/m/n006"].data == b"x" * 600
    # 124 reads in three multiRead requests (a ping at most besides).
    assert sent <= 3 + 1, sent


def test_multiread_lists_children_as_one_getchildren_each(
    zk: KazooClient, zk_chroot: str, zk_server: ZooKeeperServer
) -> None:
    zk.ensure_path("/c")
    dirs = []
    for i in range(READS_PER_MULTI + 17):
        path = f"/c/d{i:03d}"
        dirs.append(path)
        if i == READS_PER_MULTI:
            continue  # missing, just past the first batch
        zk.create(path)
        for j in range(i % 4):  # none to three children
            zk.create(f"{path}/k{j}", b"v")
    zk.create("/c/closed", acl=[make_digest_acl("bk", "pw", all=True)])
    dirs.insert(3, "/c/closed")

    try:
        with BulkReader(zk_chroot) as multi:
            before = _received_from(zk_server, multi)
            got = list(multi.children_many(dirs, max_in_flight=40))
            sent = _received_from(zk_server, multi) - before
        with BulkReader(zk_chroot) as each:
            each.multi_read = False
            expected = list(each.children_many(dirs, max_in_flight=5))
    finally:
        zk.add_auth("digest", "bk:pw")
        zk.delete("/c/closed")

    assert got == expected
    assert [g.path for g in got] == dirs
    by_path = {g.path: g for g in got}
    assert by_path["/c/closed"].err == ZNOAUTH and by_path["/c/closed"].children is None
    assert by_path[f"/c/d{READS_PER_MULTI:03d}"].err == ZNONODE
    for i in (0, 3, 7):
        names = by_path[f"/c/d{i:03d}"].children
        assert names is not None and sorted(names) == sorted(zk.get_children(f"/c/d{i:03d}"))
        assert len(names) == i % 4
    assert sent <= 2 + 1, sent  # 68 listings in two multiRead requests (a ping at most)
