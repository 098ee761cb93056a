"""The ports handed to the servers a test starts lie outside the kernel's ephemeral range."""

from __future__ import annotations

import socket

import pytest

from bklib.testing import ports
from bklib.testing.ports import LOWEST_PORT, NoFreePort, ephemeral_start, free_port


def test_ephemeral_start_reads_the_range() -> None:
    assert ephemeral_start("32768\t60999\n") == 32768
    assert ephemeral_start("40000 50000") == 40000
    assert ephemeral_start("") == ports.DEFAULT_EPHEMERAL_START


def test_ports_lie_below_the_ephemeral_range_and_are_never_repeated() -> None:
    start = ephemeral_start()
    seen = [free_port() for _ in range(50)]
    assert len(set(seen)) == 50
    assert all(LOWEST_PORT <= p < start for p in seen)


def test_a_port_a_listener_holds_is_never_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        # The whole range is the one port a listener holds: no port can be handed out.
        monkeypatch.setattr(ports, "LOWEST_PORT", taken)
        monkeypatch.setattr(ports, "ephemeral_start", lambda: taken + 1)
        with pytest.raises(NoFreePort, match=f"{taken}-{taken}"):
            free_port()


def test_a_port_bound_since_it_was_picked_is_bindable_again_by_its_server() -> None:
    port = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", port))
        server.listen()
        assert server.getsockname()[1] == port
