"""bkaudit on a ZooKeeper that listens on IPv6 loopback alone (``clientPortAddress=::1``),
given as ``--zk [::1]:PORT``: the audit's scan reads through the pipelined bulk reader (which
once kept the brackets and could not connect), the Python bookies and kazoo sessions register
and mark through kazoo, and ``rereplicate`` repairs a lost bookie's ledgers. One connect-string
parser serves both clients (bklib.meta.stores.zookeeper.connect_string)."""

from __future__ import annotations

import argparse
import contextlib
import io
import socket
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from bklib.meta.stores.zookeeper.bulk import BulkReader, GetResult
from bklib.meta.underreplication import UnderReplicationManager
from bklib.testing.zkserver import ZooKeeperServer
from jobs.commands.audit import add_audit_arguments, run_audit
from tests.audit_helpers import audit_cluster
from tests.cli_helpers import bkaudit, failure
from tests.repair_helpers import assert_fully_replicated

pytestmark = pytest.mark.integration


def _ipv6_loopback() -> bool:
    """Whether this machine can listen on ``::1``."""
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.fixture(scope="module")
def zk6(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    """A ZooKeeper server on ``[::1]`` only. A machine without IPv6 loopback (a container
    started with IPv6 disabled) fails here, saying why: in CI nothing skips."""
    assert _ipv6_loopback(), "no IPv6 loopback (::1) on this machine: `ip -6 addr show lo`"
    server = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper-ipv6"), host="::1")
    server.start()
    try:
        yield server
    finally:
        server.stop()


class BulkSpy:
    """Records the servers every bulk reader connected to and the znodes it read."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.connected: list[tuple[str, int]] = []
        self.read = 0
        connect, get_many = BulkReader.connect, BulkReader.get_many
        spy = self

        def connected(reader: BulkReader, timeout: float = 10.0) -> None:
            connect(reader, timeout)
            assert reader.sock is not None
            spy.connected.append(reader.sock.getpeername()[:2])

        def counted(
            reader: BulkReader, paths: Iterable[str], max_in_flight: int = 500
        ) -> Iterator[GetResult]:
            for got in get_many(reader, paths, max_in_flight):
                spy.read += 1
                yield got

        monkeypatch.setattr(BulkReader, "connect", connected)
        monkeypatch.setattr(BulkReader, "get_many", counted)


def test_the_server_listens_on_ipv6_alone(zk6: ZooKeeperServer) -> None:
    assert zk6.connect_string == f"[::1]:{zk6.port}"
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", zk6.port), timeout=2).close()


def test_audit_and_rereplicate_over_ipv6(
    tmp_path: Path, zk6: ZooKeeperServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    zk = zk6.connect_string  # [::1]:PORT
    wh = str(tmp_path / "wh")
    with audit_cluster(tmp_path / "sandbox", zk, bookies=4) as c:
        b0, b1, b2, b3 = c.bookie_ids
        lost = [c.ledger([b0, b1, b2], 20, wq=2, aq=2) for _ in range(3)]
        intact = c.ledger([b0, b1, b3], 20, wq=2, aq=2)
        c.sandbox.stop_bookie(b2)
        c.sandbox.wait_unregistered(b2)

        # `bkaudit audit --zk [::1]:PORT --check lost`, in this process so the scan's reader
        # can be watched: it connected to ::1 (no brackets) and read every ledger's znode.
        spy = BulkSpy(monkeypatch)
        argv = ["--zk", zk, "--warehouse", wh, "--check", "lost", "--executor", "local"]
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = run_audit(add_audit_arguments(argparse.ArgumentParser()).parse_args(argv))
        assert code == 0, out.getvalue()
        assert "4 ledgers, 3 under-replicated" in out.getvalue(), out.getvalue()
        assert spy.connected and set(spy.connected) == {("::1", zk6.port)}
        assert spy.read >= 4
        monkeypatch.undo()

        # `bkaudit rereplicate --zk [::1]:PORT`, the real command in its own process.
        proc = bkaudit(
            "rereplicate", "--zk", zk, "--warehouse", wh, "--executor", "local",
            "--grace-period", "0s", timeout=300,
        )  # fmt: skip
        assert proc.returncode == 0, failure(proc)
        for md in lost:
            assert_fully_replicated(c.store, c.client, md.ledger_id, excluded=frozenset({b2}))
        assert c.store.read_ledger(intact.ledger_id).value.bookies() == {b0, b1, b3}
        assert list(UnderReplicationManager(c.store.zk).list_underreplicated()) == []
