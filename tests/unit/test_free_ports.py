"""The ports handed to the servers a test starts lie outside the kernel's ephemeral range."""

from __future__ import annotations

import socket

import pytest

from bklib.testing import ports
from bklib.testing.ports import (
    DEFAULT_EPHEMERAL_RANGE,
    LOWEST_PORT,
    NoFreePort,
    ephemeral_range,
    free_port,
    outside_ephemeral,
)


def test_ephemeral_range_reads_the_kernels_setting() -> None:
    assert ephemeral_range("32768\t60999\n") == (32768, 60999)
    assert ephemeral_range("1024 65535") == (1024, 65535)
    assert ephemeral_range("") == DEFAULT_EPHEMERAL_RANGE
    assert ephemeral_range("garbage") == DEFAULT_EPHEMERAL_RANGE


def test_the_ports_outside_the_range_are_below_and_above_it() -> None:
    assert outside_ephemeral(32768, 60999) == [range(LOWEST_PORT, 32768), range(61000, 65536)]
    # A range from 1024 to 61000 leaves only the ports above it.
    assert outside_ephemeral(1024, 61000) == [range(61001, 65536)]
    assert outside_ephemeral(1024, 65535) == []


def test_ports_lie_outside_the_ephemeral_range_and_are_never_repeated() -> None:
    first, last = ephemeral_range()
    seen = [free_port() for _ in range(50)]
    assert len(set(seen)) == 50
    assert all(p >= LOWEST_PORT and not first <= p <= last for p in seen)


def test_a_port_a_listener_holds_is_never_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        # The only port outside the range is the one a listener holds.
        monkeypatch.setattr(ports, "outside_ephemeral", lambda a, b: [range(taken, taken + 1)])
        with pytest.raises(NoFreePort, match="outside the ephemeral range"):
            free_port()


def test_with_no_room_outside_the_range_the_kernel_picks(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (1024, 65535))
    port = free_port()
    assert "leaves no room" in caplog.text
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", port))  # free: the server can take it
