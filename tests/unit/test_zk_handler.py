"""PollingHandler.select against kazoo's own selector_select, on real sockets."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
from kazoo.handlers.utils import selector_select

from bklib.meta.stores.zookeeper.client import new_client
from bklib.meta.stores.zookeeper.handler import PollingHandler


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def both(rlist: list[object], wlist: list[object], timeout: float) -> tuple[object, object]:
    return PollingHandler().select(rlist, wlist, [], timeout), selector_select(
        rlist, wlist, [], timeout
    )


def test_nothing_to_read_until_the_peer_writes(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    ours, kazoos = both([a, b], [], 0)
    assert ours == kazoos == ([], [], [])
    b.send(b"x")
    ours, kazoos = both([a, b], [], 0)
    assert ours == kazoos == ([a], [], [])


def test_a_connected_socket_is_writable_and_fds_come_back_as_given(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    ours, kazoos = both([], [a, b.fileno()], 0)
    assert ours == kazoos == ([], [a, b.fileno()], [])


def test_a_hang_up_is_readable(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    b.close()
    ours, kazoos = both([a], [], 1.0)
    assert ours == kazoos == ([a], [], [])
    assert a.recv(1) == b""  # the next read says so


def test_a_wait_lasts_its_timeout(pair: tuple[socket.socket, socket.socket]) -> None:
    a, _ = pair
    t0 = time.monotonic()
    assert PollingHandler().select([a], [], [], 0.05) == ([], [], [])
    assert time.monotonic() - t0 >= 0.05


def test_bad_arguments_fail_as_kazoos_do(pair: tuple[socket.socket, socket.socket]) -> None:
    a, _ = pair
    handler = PollingHandler()
    with pytest.raises(ValueError, match="non-negative"):
        handler.select([a], [], [], -1)
    with pytest.raises(TypeError):
        handler.select([a], [], [], "1")  # type: ignore[arg-type]
    closed = socket.socket()
    fd = closed.fileno()
    closed.close()
    with pytest.raises(ValueError, match="Invalid event mask or fd"):
        handler.select([fd], [], [], 0)


def test_every_client_bklib_makes_uses_it() -> None:
    client = new_client("127.0.0.1:1")
    assert isinstance(client.handler, PollingHandler)
