"""A TCP relay on loopback that records what clients send, for tests that must prove what
went over the wire (e.g. that every byte to a TLS port was TLS)."""

from __future__ import annotations

import contextlib
import socket
import threading
from dataclasses import dataclass, field

from bklib.testing.ports import free_port

__all__ = ["TcpRelay"]


@dataclass
class TcpRelay:
    """Accepts on ``host:port`` and relays each connection to ``target`` (``HOST:PORT``),
    keeping the bytes each client sent in :attr:`sent` (one entry per connection)."""

    target: str
    host: str = "127.0.0.1"
    port: int = 0
    sent: list[bytearray] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _listener: socket.socket | None = field(default=None, repr=False)
    _closed: bool = False

    @property
    def address(self) -> str:
        """``HOST:PORT`` clients connect to."""
        return f"{self.host}:{self.port}"

    def start(self) -> TcpRelay:
        """Listen and relay in daemon threads."""
        self.port = self.port or free_port(self.host)
        listener = socket.create_server((self.host, self.port))
        self._listener = listener
        threading.Thread(target=self._accept, daemon=True, name="tcp-relay").start()
        return self

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            host, _, port = self.target.rpartition(":")  # may be set after start()
            try:
                server = socket.create_connection((host, int(port)), timeout=10)
            except OSError:
                client.close()
                continue
            record = bytearray()
            with self._lock:
                self.sent.append(record)
            threading.Thread(target=self._pump, args=(client, server, record), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, None), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, record: bytearray | None) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if record is not None:
                    with self._lock:
                        record.extend(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):  # the other direction's recv ends too
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            src.close()

    def streams(self) -> list[bytes]:
        """What each client connection sent so far."""
        with self._lock:
            return [bytes(r) for r in self.sent]

    def stop(self) -> None:
        """Stop accepting (relayed connections end with their peers)."""
        self._closed = True
        if self._listener is not None:
            self._listener.close()

    def __enter__(self) -> TcpRelay:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
