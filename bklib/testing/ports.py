"""Free TCP ports for the servers the tests and the sandbox start.

A port is chosen here and bound seconds later by another process (a JVM's bookie, ZooKeeper,
Pulsar's broker). A port the kernel picks with ``bind(port 0)`` comes from the ephemeral range
(``net.ipv4.ip_local_port_range``), from which every outgoing connection on the machine also
takes its local port, so a client's connection could take it in those seconds and the server
would fail with "Address already in use". The ports handed out here lie outside that range,
where the kernel never assigns one by itself, and none is handed out twice by one process.
"""

from __future__ import annotations

import logging
import random
import socket
import threading
from pathlib import Path

log = logging.getLogger(__name__)

_PORT_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PORT = 10_000
"""Below it: the well-known ports and most registered services'."""
HIGHEST_PORT = 65_535
DEFAULT_EPHEMERAL_RANGE = (32_768, 60_999)
"""Linux's default ``ip_local_port_range`` (used where /proc cannot say)."""
_ATTEMPTS = 200

_handed_out: set[int] = set()
_lock = threading.Lock()
_random = random.Random()  # its own: a test that seeds the global one must not steer the picks


class NoFreePort(RuntimeError):
    """No free port was found outside the ephemeral range."""


def ephemeral_range(text: str | None = None) -> tuple[int, int]:
    """The kernel's ephemeral port range (``ip_local_port_range``), first and last port."""
    if text is None:
        try:
            text = _PORT_RANGE_FILE.read_text()
        except OSError:
            return DEFAULT_EPHEMERAL_RANGE
    fields = text.split()
    if len(fields) != 2 or not all(f.isdigit() for f in fields):
        return DEFAULT_EPHEMERAL_RANGE
    return int(fields[0]), int(fields[1])


def outside_ephemeral(first: int, last: int) -> list[range]:
    """The port ranges from :data:`LOWEST_PORT` up that the ephemeral range leaves."""
    spans = [range(LOWEST_PORT, min(first, HIGHEST_PORT + 1)), range(last + 1, HIGHEST_PORT + 1)]
    return [r for r in spans if len(r) > 0]


def _family(host: str) -> socket.AddressFamily:
    """IPv6 for an IPv6 literal (``::1``), else IPv4."""
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _bindable(host: str, port: int) -> bool:
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def _kernel_port(host: str) -> int:
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free right now on ``host`` (an IPv4 address or name, or an IPv6 literal),
    outside the ephemeral range where there is room, new to this process.

    On a host whose ephemeral range leaves no room (``ip_local_port_range`` set to nearly
    every port), the kernel's pick is taken, with a warning: the race above is possible there.
    """
    spans = outside_ephemeral(*ephemeral_range())
    with _lock:
        if spans:
            sizes = [len(r) for r in spans]
            for _ in range(_ATTEMPTS):
                (span,) = _random.choices(spans, weights=sizes)
                port = _random.choice(span)
                if port in _handed_out or not _bindable(host, port):
                    continue
                _handed_out.add(port)
                return port
            raise NoFreePort(
                f"no free port on {host} outside the ephemeral range in {_ATTEMPTS} tries"
            )
        log.warning("the ephemeral port range leaves no room: the kernel picks the port")
        port = _kernel_port(host)
        _handed_out.add(port)
        return port
