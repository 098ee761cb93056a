"""bklib.meta.stores.reachability on real sockets: the first server that accepts is enough;
otherwise every server is named with its cause."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from bklib.meta.stores.base import StoreUnavailable
from bklib.meta.stores.reachability import Unreachable, check_reachable, diagnose
from bklib.testing.ports import free_port


@pytest.fixture
def listening() -> Iterator[int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    try:
        yield server.getsockname()[1]
    finally:
        server.close()


def test_a_listening_port_is_reachable(listening: int) -> None:
    assert diagnose("127.0.0.1", listening) is None
    assert diagnose("localhost", listening) is None  # ::1 may refuse; 127.0.0.1 accepts


def test_one_server_up_is_enough_whatever_precedes_it(listening: int) -> None:
    check_reachable(
        [("zk.bkaudit-test.invalid", 2181), ("127.0.0.1", free_port()), ("127.0.0.1", listening)],
        "ZooKeeper",
    )


def test_no_server_up_names_each_with_its_cause() -> None:
    refused = free_port()
    with pytest.raises(Unreachable) as info:
        check_reachable([("zk.bkaudit-test.invalid", 2181), ("127.0.0.1", refused)], "ZooKeeper")
    text = str(info.value)
    assert text.startswith("cannot connect to ZooKeeper at zk.bkaudit-test.invalid:2181: ")
    assert "zk.bkaudit-test.invalid:2181: name not found" in text, text
    assert f"127.0.0.1:{refused}: connection refused" in text, text
    assert isinstance(info.value, StoreUnavailable)  # the commands' one-line, exit-2 path


def test_the_servers_of_an_address_are_asked_at_the_same_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three servers that never answer cost one connect timeout, not three: each probe waits
    at a barrier that only opens once all three are in flight, so asked one after another
    they would break it."""
    import threading

    from bklib.meta.stores import reachability

    barrier = threading.Barrier(3, timeout=10)

    def silent(host: str, port: int, timeout: float) -> str:
        barrier.wait()
        return f"timed out after {timeout:g}s"

    monkeypatch.setattr(reachability, "_diagnose_once", silent)
    servers = [("10.0.0.1", 2181), ("10.0.0.2", 2181), ("10.0.0.3", 2181)]
    with pytest.raises(Unreachable) as info:
        check_reachable(servers, "ZooKeeper", timeout=5)
    for host, port in servers:
        assert f"{host}:{port}: timed out after 5s" in str(info.value), info.value
