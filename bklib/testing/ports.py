"""Free TCP ports for the servers the tests and the sandbox start.

A port is chosen here and bound seconds later by another process (a JVM's bookie, ZooKeeper,
Pulsar's broker). A port the kernel picks with ``bind(port 0)`` comes from the ephemeral range
(``net.ipv4.ip_local_port_range``), from which every outgoing connection on the machine also
takes its local port, so a client's connection could take it in those seconds and the server
would fail with "Address already in use". The ports handed out here lie below that range,
where the kernel never assigns one by itself, and none is handed out twice by one process.
"""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

_PORT_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# Below the kernel's ephemeral range, above the well-known and most registered services.
LOWEST_PORT = 10_000
# Linux's default ephemeral range starts at 32768 (used where /proc cannot say).
DEFAULT_EPHEMERAL_START = 32_768
_ATTEMPTS = 200

_handed_out: set[int] = set()
_lock = threading.Lock()


class NoFreePort(RuntimeError):
    """No free port was found below the ephemeral range."""


def ephemeral_start(text: str | None = None) -> int:
    """The first port of the kernel's ephemeral range (``ip_local_port_range``'s first value)."""
    if text is None:
        try:
            text = _PORT_RANGE_FILE.read_text()
        except OSError:
            return DEFAULT_EPHEMERAL_START
    fields = text.split()
    return int(fields[0]) if fields and fields[0].isdigit() else DEFAULT_EPHEMERAL_START


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free right now on ``host``, outside the ephemeral range, new to this process."""
    top = ephemeral_start() - 1
    if top < LOWEST_PORT:
        raise NoFreePort(f"the ephemeral range starts at {top + 1}: no room below it")
    with _lock:
        for _ in range(_ATTEMPTS):
            port = random.randint(LOWEST_PORT, top)
            if port in _handed_out or not _bindable(host, port):
                continue
            _handed_out.add(port)
            return port
    raise NoFreePort(f"no free port on {host} in {LOWEST_PORT}-{top} after {_ATTEMPTS} tries")
