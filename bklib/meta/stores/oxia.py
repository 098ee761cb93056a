"""The metadata-store interface on Oxia, through PyPI's ``oxia`` client (the ``oxia`` extra).

Keys and values are the ones Pulsar's ``OxiaMetadataStore`` writes for BookKeeper: ZooKeeper
paths unchanged inside an Oxia namespace, every parent present as a key of its own (Pulsar
creates them, empty, on each put; Java's Auditor and ReplicationWorker list children, so we
create them too). Differences from ZooKeeper, and how this module bridges them:

* children of ``p`` are the key range ``p/`` to ``p//`` (Oxia sorts keys hierarchically);
  a key with neither a value nor children does not exist;
* compare-and-set presents Oxia's ``versionId``; ``-1`` (BookKeeper's ``Version.ANY``) is
  sent as no expectation, since Oxia reads ``-1`` as "must not exist";
* an ephemeral key names its owner by the client identity (Oxia's sessions are per shard),
  so :attr:`OxiaStore.session_owner` is that identity;
* children are not counted and have no version: :class:`~bklib.meta.stores.base.Stat` says
  None, and callers that need a directory's count list it;
* session loss is seen through notifications (the client reports none): when an ephemeral
  key this session wrote is deleted and we did not delete it, or a write finds the session
  gone, the server ended the session. The store then reports LOST, replaces its client (a new
  session with a new owner, as ZooKeeper's new session has a new id) and reports CONNECTED.
  See docs/metadata-stores.md.

The client is beta: this is the one module to change when it does.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from bklib.errors import ZKError
from bklib.meta.oxia_security import OxiaAccess
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
from bklib.meta.stores.oxia_changes import BARRIER_ROOT, OxiaChangeFeed
from bklib.meta.stores.reachability import CONNECT_TIMEOUT, check_reachable
from bklib.version import extra_hint

__all__ = ["OXIA_EXTRA_HINT", "OxiaClientMissing", "OxiaStore", "connect_oxia"]

log = logging.getLogger(__name__)

T = TypeVar("T")

OXIA_EXTRA_HINT = extra_hint("oxia")
_DOES_NOT_EXIST = -1  # oxia.EXPECTED_RECORD_DOES_NOT_EXIST


class OxiaClientMissing(ZKError):
    """The ``oxia`` extra is not installed."""


def _import_oxia() -> Any:
    # gRPC's core runs fork handlers unless told not to, and a fork while the client's threads
    # are inside gRPC skips them and leaves the child broken: the Spark driver's JVM, launched
    # by a fork (pyspark's preexec_fn) from an audit reading Oxia, then sometimes died before
    # exec. Nothing here forks to use gRPC in the child. Read when gRPC's core starts.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    try:
        import oxia
        import oxia.ex
    except ImportError as exc:
        raise OxiaClientMissing(
            f"the Oxia client is not installed ({OXIA_EXTRA_HINT}): {exc}"
        ) from None
    # The client logs each retry with a multi-line gRPC dump; every failure that matters
    # reaches the caller as one StoreUnavailable line naming the store.
    logging.getLogger("oxia").setLevel(logging.CRITICAL)
    _fix_service_discovery()
    return oxia


def _fix_service_discovery() -> None:
    """Work around a race in ``oxia`` 0.2.1's ``ServiceDiscovery``: it starts the thread that
    reads shard assignments before it creates the barrier that thread signals, so a fast
    server's first answer kills the thread (AttributeError) and the client gives up after
    30 s; and every later assignment update waits on that two-party barrier forever, so a
    leader change would never reach the client. The subclass signals an event instead, set
    up before the thread starts.

    It also routes keys to shards as the server and the Java client do: the low 32 bits of
    XXH3-64 (Oxia's ``hash.Xxh332``). 0.2.1 uses XXH64, so with more than one shard a key it
    writes lands on a shard where Pulsar's Java driver never looks for it, and the reverse.
    Installed once, where ``oxia.Client`` looks it up."""
    import oxia.client
    from oxia.internal import service_discovery as sd

    if getattr(oxia.client.ServiceDiscovery, "_bkaudit_fixed", False):
        return

    class FixedServiceDiscovery(sd.ServiceDiscovery):  # type: ignore[misc]
        _bkaudit_fixed = True

        def __init__(
            self, service_address: str, connection_pool: Any, namespace: str, init_timeout: int = 30
        ) -> None:
            self._assignments: dict[int, Any] = {}
            self._service_address = service_address
            self._connection_pool = connection_pool
            self._namespace = namespace
            self._closed = False
            self._lock = threading.Lock()
            self._first = threading.Event()
            self._thread = threading.Thread(target=self.get_assignments, daemon=True)
            self._thread.start()
            if not self._first.wait(init_timeout):
                raise RuntimeError(
                    f"Timed out after {init_timeout}s waiting for initial shard "
                    f"assignments from {service_address}"
                )

        def shard_leaders(self) -> list[tuple[int, str]]:
            """(shard id, leader address) of every shard of the namespace."""
            with self._lock:
                return [(s.shard, s.leader) for s in self._assignments.values()]

        def get_shard(self, key: str) -> Any:
            with self._lock:
                return shard_of(self._assignments.values(), key, self._service_address)

        def get_assignments(self) -> None:
            stub = self._connection_pool.get(self._service_address)
            backoff = sd.Backoff()
            request = sd.pb.ShardAssignmentsRequest(namespace=self._namespace)
            while not self._closed:
                try:
                    for sa in stub.get_shard_assignments(request):
                        self._parse_assignments(sa.namespaces[self._namespace])
                        self._first.set()
                        backoff.reset()
                except sd.grpc.RpcError as e:
                    if not self._closed:
                        if e.code() != sd.grpc.StatusCode.CANCELLED:
                            log.debug("Oxia shard assignments: %s", e)
                        backoff.wait_next()

    oxia.client.ServiceDiscovery = FixedServiceDiscovery


def shard_hash(key: str) -> int:
    """The hash Oxia places ``key`` by: the low 32 bits of XXH3-64 (``hash.Xxh332``)."""
    import xxhash

    return int(xxhash.xxh3_64_intdigest(key.encode())) & 0xFFFFFFFF


def shard_of(shards: Iterable[Any], key: str, address: str) -> Any:
    """The shard (of the client's assignments) whose hash range holds ``key``."""
    key_hash = shard_hash(key)
    for shard in shards:
        if shard.contains(key_hash):
            return shard
    raise StoreUnavailable(f"Oxia at {address}: no shard for key {key}")


def child_range(path: str) -> tuple[str, str]:
    """The key range holding the children of ``path`` in Oxia's hierarchical order."""
    base = path.rstrip("/")
    return base + "/", base + "//"


def _ms(ts: Any) -> int:
    # The client turns epoch milliseconds into a datetime; round, as float seconds may not
    # give the same milliseconds back when truncated.
    return round(float(ts.timestamp()) * 1000)


class OxiaStore(MetadataStore):
    """One Oxia client (its sessions, one per shard, share one client identity)."""

    kind = "oxia"
    prunes_safely = False  # delete checks for children by a listing first: not atomic

    def __init__(
        self,
        address: str,
        namespace: str,
        *,
        session_timeout_ms: int = 30_000,
        access: OxiaAccess | None = None,
    ) -> None:
        self._oxia = _import_oxia()
        self.address = address
        self.namespace = namespace
        self.access = access
        self.identity = ""
        self._session_timeout_ms = session_timeout_ms
        self._client: Any = None
        self._lock = threading.Lock()
        self._owned: set[str] = set()  # ephemeral keys this session wrote and still holds
        self._deleting: set[str] = set()
        self._listeners: list[StateListener] = []
        self._watches: dict[str, list[ChildrenListener]] = {}
        self._feeds: list[OxiaChangeFeed] = []
        self._notifications: Any = None
        self._watcher: threading.Thread | None = None
        self._closed = False
        self._renewing = False
        self._open_timeout = 30.0
        self._state = SessionState.SUSPENDED
        # grpc comes with the extra, so the scanner is imported only once the client is.
        from bklib.meta.stores.oxia_scan import RangeScanner
        from bklib.meta.stores.oxia_transport import channel_opener

        self._scanner = RangeScanner(channel_opener(access))

    # ---- session ---------------------------------------------------------------------------

    def _new_client(self, timeout: float) -> tuple[Any, str]:
        """A client with a fresh identity that answered one listing of every shard, within
        ``timeout``; StoreUnavailable (one line) otherwise."""
        identity = f"bkaudit-{uuid.uuid4().hex}"
        # A refused, unresolvable or silent address fails now (Unreachable, naming the cause),
        # not after the client's retries.
        _check_reachable(self.address, timeout)
        from bklib.meta.stores.oxia_transport import probe, secure_client

        # A wrong CA or token is one line now (OxiaSecurityError), not the client's retries.
        probe(self.address, self.namespace, self.access, timeout)
        result: dict[str, Any] = {}

        def attempt() -> None:
            try:
                if self.access is not None and self.access.tls is not None:
                    client = secure_client(
                        self._oxia,
                        self.address,
                        self.access,
                        namespace=self.namespace,
                        session_timeout_ms=self._session_timeout_ms,
                        client_identifier=identity,
                    )
                else:
                    client = self._oxia.Client(
                        self.address,
                        namespace=self.namespace,
                        session_timeout_ms=self._session_timeout_ms,
                        client_identifier=identity,
                    )
                client.list("/", "//")  # one round trip to every shard
                result["client"] = client
            except Exception as exc:  # noqa: BLE001 - reported below as StoreUnavailable
                result["error"] = exc

        thread = threading.Thread(target=attempt, daemon=True, name="oxia-connect")
        thread.start()
        thread.join(timeout)
        if "client" not in result:
            error = result.get("error")
            reason = (
                f"{type(error).__name__}: {_reason(error)}"
                if error
                else f"no answer in {timeout:g}s"
            )
            raise StoreUnavailable(f"cannot connect to Oxia at {self.locator}: {reason}")
        return result["client"], identity

    def open(self, timeout: float = 30.0) -> OxiaStore:
        """Connect, and prove the namespace answers: StoreUnavailable within ``timeout``."""
        self._client, self.identity = self._new_client(timeout)
        self._open_timeout = timeout
        self._state = SessionState.CONNECTED
        return self

    def _renew(self, why: str) -> None:
        """The session is gone (the server expired it): report LOST, then replace the client,
        so that ephemeral keys are written in a new session with a new owner (as ZooKeeper's
        new session has a new id), re-arm the notifications and report CONNECTED. A failure
        leaves the store SUSPENDED; the next call that finds the session gone tries again."""
        with self._lock:
            if self._renewing or self._closed:
                return
            self._renewing = True
        try:
            log.warning("Oxia session to %s lost (%s): opening a new one", self.locator, why)
            self._set_state(SessionState.LOST)
            self._feeds_gap(f"the Oxia session was lost ({why})")
            try:
                client, identity = self._new_client(self._open_timeout)
            except ZKError as exc:  # unreachable, or (a rotated token) refused
                log.warning("%s", exc)
                self._set_state(SessionState.SUSPENDED)
                return
            with self._lock:
                old, old_notes = self._client, self._notifications
                self._client, self.identity = client, identity
                self._owned.clear()
                self._watcher, self._notifications = None, None
            for closing in (old_notes, old):
                if closing is not None:
                    with contextlib.suppress(Exception):
                        closing.close()
            self._ensure_watcher()
            self._set_state(SessionState.CONNECTED)
            for key in list(self._watches):
                self._fire(key)  # what changed while no stream was open
        finally:
            with self._lock:
                self._renewing = False

    @property
    def locator(self) -> str:
        return f"oxia://{self.address}/{self.namespace}"

    @property
    def session_owner(self) -> str | None:
        return self.identity

    @property
    def connected(self) -> bool:
        return self._state is SessionState.CONNECTED and not self._closed

    def add_state_listener(self, listener: StateListener) -> None:
        with self._lock:
            if listener not in self._listeners:
                self._listeners.append(listener)
        self._ensure_watcher()

    def remove_state_listener(self, listener: StateListener) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def _set_state(self, state: SessionState) -> None:
        with self._lock:
            if self._state is state:
                return
            self._state = state
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(state)
            except Exception:  # a listener's bug: logged; its state is already recorded above
                log.exception("Oxia session listener failed")

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            feeds, self._feeds = list(self._feeds), []
        for feed in feeds:
            feed.close()
        if self._notifications is not None:
            with contextlib.suppress(Exception):
                self._notifications.close()
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
        self._scanner.close()

    # ---- calls -------------------------------------------------------------------------------

    def _call(self, path: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if self._client is None or self._closed:
            raise StoreUnavailable(f"Oxia session to {self.locator} is closed", path=path)
        ex = self._oxia.ex
        try:
            return fn(*args, **kwargs)
        except ex.KeyNotFound:
            raise KeyNotFound("no such key", path=path) from None
        except ex.UnexpectedVersionId:
            raise BadVersion("version is stale", path=path) from None
        except ex.SessionNotFound:
            threading.Thread(target=self._renew, args=("session not found",), daemon=True).start()
            raise StoreUnavailable(f"Oxia at {self.locator}: session expired", path=path) from None
        except Exception as exc:
            raise StoreUnavailable(
                f"Oxia at {self.locator}: {type(exc).__name__}: {_reason(exc)}", path=path
            ) from exc

    def _stat(self, version: Any, with_children: bool = False, path: str = "") -> Stat:
        return Stat(
            version=int(version.version_id()),
            ctime_ms=_ms(version.created_timestamp()),
            mtime_ms=_ms(version.modified_timestamp()),
            ephemeral_owner=version.client_identity() if version.is_ephemeral() else None,
        )

    def get(self, path: str) -> tuple[bytes, Stat]:
        _, value, version = self._call(path, self._client.get, path)
        return bytes(value or b""), self._stat(version)

    def exists(self, path: str) -> Stat | None:
        try:
            _, _, version = self._call(path, self._client.get, path, include_value=False)
        except KeyNotFound:
            return None
        return self._stat(version)

    def children(self, path: str) -> list[str]:
        lo, hi = child_range(path)
        keys: list[str] = self._call(path, self._client.list, lo, hi)
        if not keys and path != "/" and self.exists(path) is None:
            raise KeyNotFound("no such key", path=path)
        return sorted(k[len(lo) :] for k in keys if len(k) > len(lo))

    def create(
        self, path: str, data: bytes = b"", *, ephemeral: bool = False, parents: bool = False
    ) -> Stat:
        parent = path.rsplit("/", 1)[0] or "/"
        if parent != "/":
            if parents:
                self._ensure_parents(parent)
            elif self.exists(parent) is None:
                raise KeyNotFound("parent does not exist", path=parent)
        try:
            _, version = self._call(
                path,
                self._client.put,
                path,
                data,
                expected_version_id=_DOES_NOT_EXIST,
                ephemeral=ephemeral,
            )
        except BadVersion:
            raise KeyExists("key exists", path=path) from None
        if ephemeral:
            with self._lock:
                self._owned.add(path)
            self._ensure_watcher()
        return self._stat(version)

    def _ensure_parents(self, path: str) -> None:
        """Create ``path`` and its missing ancestors, empty and persistent, top down."""
        missing: list[str] = []
        p = path
        while p and p != "/" and self.exists(p) is None:
            missing.append(p)
            p = p.rsplit("/", 1)[0]
        for key in reversed(missing):
            with contextlib.suppress(BadVersion):  # created meanwhile: fine
                self._call(key, self._client.put, key, b"", expected_version_id=_DOES_NOT_EXIST)

    def create_sequential(self, prefix: str, data: bytes = b"", *, ephemeral: bool) -> str:
        """As Pulsar's ``OxiaMetadataStore`` does for ``CreateOption.Sequential``, so Java
        clients and we draw from one counter: overwrite the parent with an empty value and take
        its ``modificationsCount`` as the 10-digit suffix (the first child is ...0001)."""
        parent = prefix.rsplit("/", 1)[0] or "/"
        self._ensure_parents(parent)
        _, version = self._call(parent, self._client.put, parent, b"")
        path = f"{prefix}{int(version.modifications_count()):010d}"
        self.create(path, data, ephemeral=ephemeral)
        return path

    def set(self, path: str, data: bytes, version: int = ANY_VERSION) -> Stat:
        expected = None if version == ANY_VERSION else version
        if expected is None and self.exists(path) is None:
            raise KeyNotFound("no such key", path=path)
        try:
            _, v = self._call(path, self._client.put, path, data, expected_version_id=expected)
        except BadVersion:
            if self.exists(path) is None:
                raise KeyNotFound("no such key", path=path) from None
            raise
        return self._stat(v)

    def delete(self, path: str, version: int = ANY_VERSION) -> None:
        lo, hi = child_range(path)
        if self._call(path, self._client.list, lo, hi):
            raise NotEmpty("key has children", path=path)
        expected = None if version == ANY_VERSION else version
        with self._lock:
            self._deleting.add(path)
        try:
            existed = self._call(path, self._client.delete, path, expected_version_id=expected)
        except BadVersion:
            if self.exists(path) is None:
                raise KeyNotFound("no such key", path=path) from None
            raise
        finally:
            with self._lock:
                self._deleting.discard(path)
                self._owned.discard(path)
        if not existed:
            raise KeyNotFound("no such key", path=path)

    def get_many(self, paths_: Iterable[str], max_in_flight: int = 500) -> Iterator[ValueRead]:
        def one(path: str) -> ValueRead:
            try:
                data, stat = self.get(path)
            except KeyNotFound:
                return ValueRead(path, None, None)
            return ValueRead(path, data, stat)

        return _in_threads(one, paths_, max_in_flight)

    def children_many(
        self, paths_: Iterable[str], max_in_flight: int = 500
    ) -> Iterator[ChildrenRead]:
        def one(path: str) -> ChildrenRead:
            try:
                return ChildrenRead(path, self.children(path))
            except KeyNotFound:
                return ChildrenRead(path, None)

        return _in_threads(one, paths_, max_in_flight)

    def scan_children(self, path: str, max_in_flight: int = 500) -> Iterator[ValueRead]:
        """Every child of ``path`` with its value: one range scan per shard, in key order
        (bklib/meta/stores/oxia_scan.py). A broken stream raises StoreUnavailable: the listing
        is incomplete."""
        if self._client is None or self._closed:
            raise StoreUnavailable(f"Oxia session to {self.locator} is closed", path=path)
        lo, hi = child_range(path)
        shards = self._client._service_discovery.shard_leaders()
        if not shards:  # no assignments known: an empty answer would read as no children
            raise StoreUnavailable(f"Oxia at {self.locator}: no shard assignments", path=path)
        try:
            records = self._scanner.scan(shards, lo, hi, self._open_timeout)
        except Exception as exc:  # any failure: StoreUnavailable (a ZKError), never a short list
            raise StoreUnavailable(
                f"Oxia at {self.locator}: range scan failed: {exc}", path=path
            ) from exc
        for rec in records:
            if len(rec.key) > len(lo):
                yield ValueRead(rec.key, rec.value, rec.stat)

    # ---- notifications: watches and session loss ---------------------------------------------

    def watch_children(self, path: str, listener: ChildrenListener) -> None:
        key = path.rstrip("/") or "/"
        with self._lock:
            self._watches.setdefault(key, []).append(listener)
        self._ensure_watcher()
        self._fire(key)

    def _fire(self, key: str) -> None:
        with self._lock:
            listeners = list(self._watches.get(key, ()))
        if not listeners:
            return
        try:
            names: list[str] | None = self.children(key)
        except KeyNotFound:
            names = None
        except StoreUnavailable as exc:
            if not self._closed:  # a notification racing our own close is no news
                log.warning("cannot list %s after a change: %s", key, exc)
            return
        for listener in listeners:
            try:
                listener(names)
            except Exception:  # a listener only wakes a loop that also polls: logged, go on
                log.exception("watch listener on %s failed", key)
        if names is None:
            with self._lock:
                self._watches.pop(key, None)

    def _ensure_watcher(self) -> None:
        with self._lock:
            if self._watcher is not None or self._closed or self._client is None:
                return
            self._notifications = self._client.get_notifications()
            self._watcher = threading.Thread(
                target=self._watch_loop, daemon=True, name="oxia-notifications"
            )
            self._watcher.start()

    def watch_tree(self, path: str, on_change: ChangeListener, on_gap: GapListener) -> ChangeFeed:
        feed = OxiaChangeFeed(
            path, on_change, on_gap, markers=self._barrier_keys, put_markers=self._put_markers,
            drop_markers=self._drop_markers, detach=self._detach,
        )  # fmt: skip
        with self._lock:
            self._feeds.append(feed)
        self._ensure_watcher()  # the stream is open once this returns
        return feed

    def _detach(self, feed: OxiaChangeFeed) -> None:
        with self._lock:
            if feed in self._feeds:
                self._feeds.remove(feed)

    def _feeds_gap(self, why: str) -> None:
        with self._lock:
            feeds = list(self._feeds)
        for feed in feeds:
            feed.gap(why)

    def _barrier_keys(self) -> list[str]:
        """New marker keys, one in each shard of the namespace (their names found by hash)."""
        discovery = self._client._service_discovery  # our FixedServiceDiscovery
        shards = {shard for shard, _ in discovery.shard_leaders()}
        token = uuid.uuid4().hex[:12]
        keys: dict[int, str] = {}
        for i in range(64 * max(1, len(shards))):
            key = f"{BARRIER_ROOT}/{self.identity}-{token}-{i}"
            keys.setdefault(int(discovery.get_shard(key).shard), key)
            if len(keys) == len(shards):
                break
        return list(keys.values())

    def _put_markers(self, keys: Sequence[str]) -> None:
        for key in keys:
            self._call(key, self._client.put, key, b"", ephemeral=True)

    def _drop_markers(self, keys: Sequence[str]) -> None:
        for key in keys:
            with contextlib.suppress(Exception):  # ephemeral: gone with the session anyway
                self._client.delete(key)

    def _watch_loop(self) -> None:
        deleted = self._oxia.defs.NotificationType.KEY_DELETED
        range_deleted = self._oxia.defs.NotificationType.KEY_RANGE_DELETED
        stream = self._notifications
        try:
            for note in stream:
                key = note.key()
                if note.notification_type() == range_deleted:
                    # It names a range, not the keys that were in it.
                    self._feeds_gap(f"a range of keys from {key} was deleted")
                else:
                    with self._lock:
                        feeds = list(self._feeds)
                    for feed in feeds:
                        feed.deliver(key)
                if note.notification_type() == deleted:
                    self._on_deleted(key)
                parent = key.rsplit("/", 1)[0] or "/"
                self._fire(parent)
                if note.notification_type() == deleted:
                    self._fire(key)
            if not self._closed and stream is self._notifications:
                self._feeds_gap("the Oxia notifications ended")
        except Exception as exc:  # noqa: BLE001 - the stream ended: report, do not guess
            if not self._closed and stream is self._notifications:
                log.warning("Oxia notifications from %s ended: %s", self.locator, _reason(exc))
                self._feeds_gap(f"the Oxia notifications ended: {_reason(exc)}")
                self._set_state(SessionState.SUSPENDED)

    def _on_deleted(self, key: str) -> None:
        with self._lock:
            ours = key in self._owned and key not in self._deleting
            if ours:
                self._owned.clear()  # every ephemeral key of the session goes with it
        if ours:
            # Not on this thread: renewing closes the stream this thread reads.
            why = f"the server deleted our ephemeral key {key}"
            threading.Thread(target=self._renew, args=(why,), daemon=True).start()


def _reason(exc: BaseException | None) -> str:
    if exc is None:
        return ""
    details = getattr(exc, "details", None)
    if callable(details):
        with contextlib.suppress(Exception):
            text = details()
            if text:
                return str(text)
    return str(exc) or type(exc).__name__


def _check_reachable(address: str, timeout: float) -> None:
    """:func:`~bklib.meta.stores.reachability.check_reachable` for ``HOST:PORT``."""
    host, _, port = address.rpartition(":")
    try:
        server = (host.strip("[]"), int(port))
    except ValueError:
        raise StoreUnavailable(f"cannot connect to Oxia at {address}: bad port") from None
    check_reachable([server], "Oxia", timeout=min(timeout, CONNECT_TIMEOUT))


def connect_oxia(
    address: str,
    namespace: str,
    *,
    timeout: float = 30.0,
    session_timeout_ms: int = 30_000,
    access: OxiaAccess | None = None,
) -> OxiaStore:
    """A connected :class:`OxiaStore` (with TLS and a token per ``access``);
    :class:`StoreUnavailable` (one line) when the server cannot be reached within ``timeout``,
    :class:`~bklib.meta.stores.oxia_transport.OxiaSecurityError` when it refuses the
    certificate or the token, :class:`OxiaClientMissing` without the extra."""
    _check_reachable(address, timeout)  # before the client is imported: said in a second
    store = OxiaStore(address, namespace, session_timeout_ms=session_timeout_ms, access=access)
    return store.open(timeout)


def _in_threads(one: Callable[[str], T], keys: Iterable[str], max_in_flight: int) -> Iterator[T]:
    """``one`` of every key, in order. The client is synchronous and thread-safe: a few
    threads keep requests in flight."""
    with ThreadPoolExecutor(max_workers=max(1, min(16, max_in_flight))) as pool:
        yield from pool.map(one, keys)
