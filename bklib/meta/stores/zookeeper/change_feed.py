"""A ZooKeeper change feed: a persistent recursive watch (ZooKeeper 3.6+, ``addWatch`` with
``AddWatchMode.PERSISTENT_RECURSIVE``) on a session of its own.

kazoo 2.11 has no ``addWatch``, and its event dispatch only knows one-shot watches, so the
feed speaks the two requests it needs (``addWatch``, ``sync``) over the same minimal client
protocol as the pipelined reads (:class:`~bklib.meta.stores.zookeeper.bulk.BulkReader`:
connect, digest or SASL auth, TLS). One thread reads the session: each ``WatcherEvent`` is
handed to the listener with its path (relative to the chroot), pings keep the session alive,
and ``sync`` replies mark barriers. ZooKeeper sends a session's watch events and replies in
the order it applied the changes, so once the reply to a ``sync`` sent after a change has
arrived, that change's event has been delivered (:meth:`ZkChangeFeed.barrier`).

Any failure of the session is a gap: the listener is told once and the feed ends; the watch
died with its session, and whoever relied on it must read the tree again.
"""

from __future__ import annotations

import logging
import struct
import threading
import time

from bklib.errors import ZKError
from bklib.meta.stores.base import ChangeFeed, ChangeListener, GapListener, StoreUnavailable
from bklib.meta.stores.zookeeper.bulk import (
    DEFAULT_SESSION_TIMEOUT,
    ERROR_NAMES,
    INT32,
    REPLY_HEADER,
    XID_PING,
    XID_WATCH,
    ZOK,
    BulkReader,
    zk_string,
)
from bklib.meta.stores.zookeeper.security import ZkAuth

__all__ = ["ZkChangeFeed", "open_change_feed"]

log = logging.getLogger(__name__)

OP_SYNC = 9
OP_ADD_WATCH = 106
PERSISTENT_RECURSIVE = 1  # ZooDefs.AddWatchModes.persistentRecursive
EVENT_NONE = -1  # Watcher.Event.EventType.None: a connection-state event, not a change
_EVENT = struct.Struct(">ii")


class _FeedSession(BulkReader):
    """The pipelined reader's session, used for the two requests of a feed."""

    def send(self, xid: int, op: int, body: bytes) -> None:
        self._send_frame(struct.pack(">ii", xid, op) + body)

    def next_xid(self) -> int:
        return self._next_xid()

    def read_frame(self) -> bytes:
        return self._read_frame()


class ZkChangeFeed(ChangeFeed):
    """A persistent recursive watch on ``path``; see the module docstring."""

    def __init__(
        self,
        hosts: str,
        path: str,
        on_change: ChangeListener,
        on_gap: GapListener,
        *,
        auth: ZkAuth = None,
        session_timeout: float = DEFAULT_SESSION_TIMEOUT,
    ) -> None:
        self.path = path
        self.hosts = hosts
        self._on_change = on_change
        self._on_gap = on_gap
        self._session = _FeedSession(
            hosts, auth=auth, session_timeout_ms=int(session_timeout * 1000)
        )
        self._send_lock = threading.Lock()
        self._cond = threading.Condition()
        self._answered = 0  # the highest sync xid answered
        self._open = False
        self._closing = False
        self._thread: threading.Thread | None = None

    def start(self, timeout: float = 10.0) -> ZkChangeFeed:
        """Open the session and place the watch; StoreUnavailable (one line) if either fails."""
        s = self._session
        try:
            s.connect(timeout)
            xid = s.next_xid()
            watch = zk_string(s.chroot + self.path) + INT32.pack(PERSISTENT_RECURSIVE)
            s.send(xid, OP_ADD_WATCH, watch)
            while True:
                rxid, _, err = REPLY_HEADER.unpack_from(s.read_frame())
                if rxid == xid:
                    break
            if err != ZOK:
                raise ZKError(
                    f"ZooKeeper at {self.hosts} refused a persistent recursive watch on "
                    f"{self.path} ({ERROR_NAMES.get(err, err)}; it needs ZooKeeper 3.6 or later)"
                )
        except (ZKError, OSError) as exc:
            s.close()
            raise StoreUnavailable(str(exc), path=self.path) from exc
        assert s.sock is not None
        s.sock.settimeout(self._ping_every)
        self._open = True
        self._thread = threading.Thread(target=self._read, name="zk-change-feed", daemon=True)
        self._thread.start()
        return self

    @property
    def client_id(self) -> tuple[int, bytes]:
        """The feed session's id and password (kazoo's ``client_id``)."""
        return self._session.session_id, self._session.session_password

    @property
    def _ping_every(self) -> float:
        return max(0.1, self._session.session_timeout_ms / 1000.0 / 3)

    @property
    def open(self) -> bool:
        return self._open

    def barrier(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._send_lock:
            if not self._open:
                return False
            xid = self._session.next_xid()
            try:
                self._session.send(xid, OP_SYNC, zk_string(self._session.chroot + self.path))
            except OSError as exc:
                self._gap(f"a sync could not be sent: {exc}")
                return False
        with self._cond:
            while self._answered < xid and self._open:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return self._answered >= xid

    def close(self) -> None:
        self._closing = True
        self._open = False
        with self._send_lock:
            self._session.close()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)
        with self._cond:
            self._cond.notify_all()

    # ---- the reader thread -------------------------------------------------------------------

    def _read(self) -> None:
        s = self._session
        try:
            while not self._closing:
                if s.idle_for() >= self._ping_every:
                    with self._send_lock:
                        s.send(XID_PING, 11, b"")  # OpCode.ping
                try:
                    frame = s.read_frame()
                except TimeoutError:
                    continue  # nothing for a while: the next turn pings
                self._frame(frame)
        except (ZKError, OSError, struct.error) as exc:
            self._gap(f"the change feed's session to {self.hosts} ended: {exc}")
        except Exception as exc:  # a listener failed: what it knows is unknown now
            log.exception("change feed listener on %s failed", self.path)
            self._gap(f"the change listener failed: {exc}")

    def _frame(self, frame: bytes) -> None:
        xid, _, err = REPLY_HEADER.unpack_from(frame)
        if xid == XID_WATCH:
            kind, _state = _EVENT.unpack_from(frame, REPLY_HEADER.size)
            if kind == EVENT_NONE:
                return
            n = INT32.unpack_from(frame, REPLY_HEADER.size + _EVENT.size)[0]
            start = REPLY_HEADER.size + _EVENT.size + 4
            path = frame[start : start + n].decode()
            chroot = self._session.chroot
            if chroot and path.startswith(chroot):
                path = path[len(chroot) :] or "/"
            self._on_change(path)
            return
        if xid == XID_PING:
            return
        if err != ZOK:
            raise ZKError(f"ZooKeeper at {self.hosts} failed a sync ({ERROR_NAMES.get(err, err)})")
        with self._cond:
            self._answered = max(self._answered, xid)
            self._cond.notify_all()

    def _gap(self, why: str) -> None:
        if self._closing or not self._open:
            return
        self._open = False
        log.warning("change feed on %s: %s", self.path, why)
        with self._cond:
            self._cond.notify_all()
        try:
            self._on_gap(why)
        finally:
            self._session.close()


def open_change_feed(
    hosts: str,
    path: str,
    on_change: ChangeListener,
    on_gap: GapListener,
    *,
    auth: ZkAuth = None,
    session_timeout: float = DEFAULT_SESSION_TIMEOUT,
    timeout: float = 10.0,
) -> ZkChangeFeed:
    """A started :class:`ZkChangeFeed` on ``path``."""
    feed = ZkChangeFeed(hosts, path, on_change, on_gap, auth=auth, session_timeout=session_timeout)
    return feed.start(timeout)
