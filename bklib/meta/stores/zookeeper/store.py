"""The metadata-store interface on ZooKeeper: kazoo for everything, and the pipelined
:class:`~.bulk.BulkReader` for bulk reads (kazoo costs ~250 µs per request).

Transient errors (connection loss, timeouts) are retried with back-off before a call fails;
anything else that ends the session raises :class:`~bklib.meta.stores.base.StoreUnavailable`
naming the znode, so a listing never silently shrinks.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from kazoo.client import KazooClient, KazooState, TransactionRequest
from kazoo.exceptions import (
    BadVersionError,
    KazooException,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
)
from kazoo.protocol.states import ZnodeStat
from kazoo.retry import KazooRetry, RetryFailedError

from bklib.errors import ZKError
from bklib.meta.stores.base import (
    ANY_VERSION,
    BadVersion,
    ChangeFeed,
    ChangeListener,
    ChildrenListener,
    ChildrenRead,
    GapListener,
    KeyExists,
    KeyNotFound,
    MetadataStore,
    NotEmpty,
    SessionState,
    Stat,
    StateListener,
    StoreUnavailable,
    ValueRead,
)
from bklib.meta.stores.zookeeper.bulk import DEFAULT_SESSION_TIMEOUT, ZNONODE, BulkReader, GetResult
from bklib.meta.stores.zookeeper.client import new_client, start_client
from bklib.meta.stores.zookeeper.connect_string import ConnectString
from bklib.meta.stores.zookeeper.security import ZkAuth, ZkSecurityError
from bklib.records import frozen_record

__all__ = ["ZooKeeperStore", "connect_zookeeper"]

MULTIS_IN_FLIGHT = 64
"""Asynchronous ``multi`` requests :meth:`ZooKeeperStore.create_together_many` keeps in flight."""

log = logging.getLogger(__name__)

T = TypeVar("T")

_RETRY = KazooRetry(max_tries=5, delay=0.2, backoff=2, max_delay=3.0)
"""Connection loss and operation timeouts are retried before a call fails."""

_STATES = {
    KazooState.CONNECTED: SessionState.CONNECTED,
    KazooState.SUSPENDED: SessionState.SUSPENDED,
    KazooState.LOST: SessionState.LOST,
}


def _stat(s: ZnodeStat) -> Stat:
    return Stat(
        version=int(s.version),
        ctime_ms=int(s.ctime),
        mtime_ms=int(s.mtime),
        ephemeral_owner=_owner(int(s.ephemeralOwner)),
        num_children=int(s.numChildren),
        child_version=int(s.cversion),
    )


def _value_read(got: GetResult) -> ValueRead:
    if got.err == ZNONODE:
        return ValueRead(got.path, None, None)
    if got.err != 0 or got.data is None or got.stat is None:
        return ValueRead(got.path, None, None, got.error_name)
    s = got.stat
    # Built without __init__, as a scan reads a million (bklib/records.py).
    stat = frozen_record(
        Stat,
        {"version": s.version, "ctime_ms": s.ctime, "mtime_ms": s.mtime,
         "ephemeral_owner": _owner(s.ephemeral_owner), "num_children": s.num_children,
         "child_version": s.cversion},
    )  # fmt: skip
    return frozen_record(
        ValueRead, {"path": got.path, "data": got.data, "stat": stat, "error": None}
    )


def _owner(session_id: int) -> str | None:
    return f"{session_id:#x}" if session_id else None


class ZooKeeperStore(MetadataStore):
    """One kazoo session. ``hosts`` may carry a chroot (``h1:2181,h2:2181/pulsar``)."""

    kind = "zookeeper"

    def __init__(
        self,
        client: KazooClient,
        hosts: str,
        auth: ZkAuth = None,
        session_timeout: float = DEFAULT_SESSION_TIMEOUT,
    ) -> None:
        self.client = client
        self.hosts = hosts
        self.auth = auth
        self.session_timeout = session_timeout  # seconds; the pipelined reads' session too
        self._listeners: dict[StateListener, Callable[[Any], None]] = {}
        self._lock = threading.Lock()
        self._bulk: BulkReader | None = None
        self._bulk_lock = threading.Lock()
        self._closed = threading.Event()
        self._keepalive: threading.Thread | None = None
        self._pinging = False  # the keepalive holds the bulk lock for one ping, briefly

    @property
    def locator(self) -> str:
        return self.hosts

    def _call(
        self, path: str, fn: Callable[..., T], *args: Any, retry: bool = False, **kwargs: Any
    ) -> T:
        """Run one kazoo call, turning kazoo's errors into the interface's. Reads are retried;
        writes are not, since a write that succeeded before a connection loss would fail its
        retry (NODEEXISTS, BADVERSION) and hide the success."""
        try:
            return _RETRY.copy()(fn, *args, **kwargs) if retry else fn(*args, **kwargs)
        except NoNodeError:
            raise KeyNotFound("no such key", path=path) from None
        except NodeExistsError:
            raise KeyExists("key exists", path=path) from None
        except BadVersionError:
            raise BadVersion("version is stale", path=path) from None
        except NotEmptyError:
            raise NotEmpty("key has children", path=path) from None
        except (KazooException, RetryFailedError) as exc:
            reason = str(exc) or type(exc).__name__
            raise StoreUnavailable(
                f"ZooKeeper at {self.hosts}: {type(exc).__name__} {reason}".rstrip(), path=path
            ) from exc

    def get(self, path: str) -> tuple[bytes, Stat]:
        data, stat = self._call(path, self.client.get, path, retry=True)
        return bytes(data), _stat(stat)

    def exists(self, path: str) -> Stat | None:
        stat = self._call(path, self.client.exists, path, retry=True)
        return _stat(stat) if stat is not None else None

    def children(self, path: str) -> list[str]:
        return sorted(self._call(path, self.client.get_children, path, retry=True))

    def create(
        self, path: str, data: bytes = b"", *, ephemeral: bool = False, parents: bool = False
    ) -> Stat:
        _, stat = self._call(
            path,
            self.client.create,
            path,
            data,
            ephemeral=ephemeral,
            makepath=parents,
            include_data=True,
        )
        return _stat(stat)

    def create_sequential(self, prefix: str, data: bytes = b"", *, ephemeral: bool) -> str:
        created: str = self._call(
            prefix,
            self.client.create,
            prefix,
            data,
            ephemeral=ephemeral,
            sequence=True,
            makepath=True,
        )
        return created

    def set(self, path: str, data: bytes, version: int = ANY_VERSION) -> Stat:
        return _stat(self._call(path, self.client.set, path, data, version=version))

    def delete(self, path: str, version: int = ANY_VERSION) -> None:
        self._call(path, self.client.delete, path, version=version)

    def create_together(self, keys: Sequence[tuple[str, bytes]]) -> int | None:
        txn = self.client.transaction()
        for path, data in keys:
            txn.create(path, data)
        # A znode is created at data version 0.
        return 0 if self._committed(keys[0][0], txn) else None

    def create_together_many(
        self, groups: Sequence[Sequence[tuple[str, bytes]]]
    ) -> list[int | None]:
        # kazoo pipelines asynchronous requests on its one connection: a window of multis in
        # flight instead of one round trip each (a loss's tens of thousands of marks).
        out: list[int | None] = []
        window: deque[tuple[str, Any]] = deque()

        def settle() -> None:
            path, pending = window.popleft()
            results = self._call(path, pending.get)
            out.append(None if any(isinstance(r, Exception) for r in results) else 0)

        for keys in groups:
            txn = self.client.transaction()
            for path, data in keys:
                txn.create(path, data)
            window.append((keys[0][0], txn.commit_async()))
            if len(window) >= MULTIS_IN_FLIGHT:
                settle()
        while window:
            settle()
        return out

    def delete_together(self, keys: Sequence[tuple[str, int]]) -> bool:
        txn = self.client.transaction()
        for path, version in keys:
            txn.delete(path, version)
        return self._committed(keys[0][0], txn)

    def _committed(self, path: str, txn: TransactionRequest) -> bool:
        """Send a ``multi``: True if every operation was applied. A failed operation is in
        the results (the others roll back with it); a lost connection raises, as a single
        write's does, since the request may or may not have been applied."""
        results = self._call(path, txn.commit)
        return not any(isinstance(r, Exception) for r in results)

    def ensure_path(self, path: str) -> None:
        self._call(path, self.client.ensure_path, path, retry=True)

    def get_many(self, paths: Iterable[str], max_in_flight: int = 500) -> Iterator[ValueRead]:
        for got in self._bulk_read(lambda reader: reader.get_many(paths, max_in_flight)):
            yield _value_read(got)

    def children_many(
        self, paths: Iterable[str], max_in_flight: int = 500
    ) -> Iterator[ChildrenRead]:
        for got in self._bulk_read(lambda reader: reader.children_many(paths, max_in_flight)):
            if got.err == ZNONODE:
                yield ChildrenRead(got.path, None)
            elif got.err != 0 or got.children is None:
                yield ChildrenRead(got.path, None, got.error_name)
            else:
                yield ChildrenRead(got.path, sorted(got.children))

    def _bulk_read(self, read: Callable[[BulkReader], Iterator[T]]) -> Iterator[T]:
        """What ``read`` pipelines on the store's bulk session.

        One pipelined session for the store's life (a scan calls this once per directory).
        A call made while another one is still being consumed (nested, or from another
        thread) gets a session of its own: one pipeline cannot serve two streams."""
        taken = self._bulk_lock.acquire(blocking=False)
        if not taken and self._pinging:  # only a ping: wait for it, not a session of our own
            taken = self._bulk_lock.acquire(timeout=self.session_timeout)
        if not taken:
            own = self._open_bulk()
            try:
                yield from read(own)
            finally:
                own.close()
            return
        try:
            reader = self._bulk
            if reader is not None and reader.may_have_expired():
                # It sends no pings between calls: after a long check, reopen rather than
                # find the session expired by the server (reads hold no session state).
                reader.close()
                reader = self._bulk = None
            if reader is None:
                reader = self._bulk = self._open_bulk()
                self._keep_bulk_alive()
            try:
                yield from read(reader)
            except ZKError:
                reader.close()  # a failed session is not reused
                if self._bulk is reader:
                    self._bulk = None
                raise
        finally:
            self._bulk_lock.release()

    def _keep_bulk_alive(self) -> None:
        """Ping the pipelined session while no scan uses it, so a long-lived process (the
        watch, between its audits) keeps one bulk session for its life instead of a new one
        per scan. One daemon thread per store, ended by close.

        The thread wakes every sixth of the timeout and pings a session idle that long, so
        no session is left idle for more than a third of it: below the half at which
        :meth:`BulkReader.may_have_expired` makes the next scan reopen it."""
        if self._keepalive is not None:
            return
        every = max(0.1, self.session_timeout / 6)

        def run() -> None:
            while not self._closed.wait(every):
                if not self._bulk_lock.acquire(blocking=False):
                    continue  # a scan is reading: its own requests keep the session alive
                try:
                    reader = self._bulk
                    if reader is None or reader.idle_for() < every:
                        continue
                    self._pinging = True
                    try:
                        reader.ping()
                    except (ZKError, OSError) as exc:  # reopened by the next scan
                        log.debug("pipelined session to %s dropped: %s", self.hosts, exc)
                        reader.close()
                        self._bulk = None
                finally:
                    self._pinging = False
                    self._bulk_lock.release()

        self._keepalive = threading.Thread(target=run, name="zk-bulk-keepalive", daemon=True)
        self._keepalive.start()

    def _open_bulk(self) -> BulkReader:
        reader = BulkReader(
            self.hosts, auth=self.auth, session_timeout_ms=int(self.session_timeout * 1000)
        )
        try:
            reader.connect()
        except ZKError as exc:
            raise StoreUnavailable(exc.reason, path=exc.path) from exc
        return reader

    def watch_children(self, path: str, listener: ChildrenListener) -> None:
        def changed(children: list[str] | None) -> bool | None:
            listener(sorted(children) if children is not None else None)
            return False if children is None else None

        # kazoo's ChildrenWatch calls with the children, and stops once told False; a
        # deleted znode calls with an empty list only if it was watched, so check first.
        if self.exists(path) is None:
            listener(None)
            return
        self.client.ChildrenWatch(path, changed)

    def watch_tree(self, path: str, on_change: ChangeListener, on_gap: GapListener) -> ChangeFeed:
        # A session of its own (the persistent watch and its events are that session's).
        from bklib.meta.stores.zookeeper.change_feed import open_change_feed

        return open_change_feed(
            self.hosts, path, on_change, on_gap, auth=self.auth,
            session_timeout=self.session_timeout,
        )  # fmt: skip

    @property
    def session_owner(self) -> str | None:
        cid = self.client.client_id
        return _owner(int(cid[0])) if cid else None

    @property
    def connected(self) -> bool:
        return bool(self.client.connected)

    def add_state_listener(self, listener: StateListener) -> None:
        def translate(state: Any) -> None:
            listener(_STATES[state])

        with self._lock:
            if listener in self._listeners:
                return
            self._listeners[listener] = translate
        self.client.add_listener(translate)

    def remove_state_listener(self, listener: StateListener) -> None:
        with self._lock:
            translate = self._listeners.pop(listener, None)
        if translate is not None:
            self.client.remove_listener(translate)

    def close(self) -> None:
        # Not under the bulk lock: an abandoned get_many generator may still hold it.
        self._closed.set()
        bulk, self._bulk = self._bulk, None
        if bulk is not None:
            bulk.close()
        try:
            self.client.stop()
            self.client.close()
        except KazooException as exc:  # closing is best effort; the session times out anyway
            log.debug("closing the ZooKeeper session to %s: %s", self.hosts, exc)


def connect_zookeeper(
    hosts: str,
    *,
    timeout: float = 30.0,
    auth: ZkAuth = None,
    read_only: bool = False,
    session_timeout: float | None = None,
) -> ZooKeeperStore:
    """A started session on ZooKeeper. ``hosts`` may carry a chroot; ``auth`` is
    ``user:password`` digest auth or a :class:`~.security.ZkAccess` (TLS, SASL, ACLs).
    Raises :class:`~.security.ZkSecurityError` for an untrusted certificate or rejected
    credentials, :class:`~bklib.errors.ZKError` when ZooKeeper cannot be reached."""
    session = session_timeout if session_timeout is not None else timeout
    client = new_client(hosts, auth, timeout=session, read_only=read_only)
    with warnings.catch_warnings():
        # A missing chroot is reported by require_cluster, naming the path, not as a warning.
        warnings.filterwarnings("ignore", message="No chroot path exists")
        try:
            start_client(client, hosts, auth, timeout)
        except (ZkSecurityError, StoreUnavailable):
            raise
        except ZKError as exc:
            raise StoreUnavailable(exc.reason, path=exc.path) from exc
    return ZooKeeperStore(client, hosts, auth, session_timeout=session)


def as_store(zk: MetadataStore | KazooClient) -> MetadataStore:
    """The interface over ``zk``: a store as it is, a started kazoo client wrapped (its
    connect string rebuilt from the client, without credentials: bulk reads through it use
    no digest auth). For callers not yet handed a store; see docs/metadata-stores.md."""
    if isinstance(zk, MetadataStore):
        return zk
    hosts = str(ConnectString(tuple((h, int(p)) for h, p in zk.hosts), zk.chroot or ""))
    return ZooKeeperStore(zk, hosts)
