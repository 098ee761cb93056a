"""The metadata-store interface: what bkaudit does with BookKeeper's metadata, on any store.

BookKeeper keeps its metadata under ZooKeeper paths, and Pulsar's Oxia driver keeps the same
keys and bytes (``org.apache.pulsar.metadata.impl.oxia.OxiaMetadataStore``). Everything above
this package reads and writes through :class:`MetadataStore`, with ZooKeeper's semantics:

* paths are absolute (``/ledgers/00/0000/L0001``); a key's parents are keys too;
* a version is what compare-and-set presents: ZooKeeper's data version, Oxia's ``versionId``.
  :data:`ANY_VERSION` (-1, BookKeeper's ``Version.ANY``) matches every version;
* ephemeral keys belong to the store session and end with it.

Differences the callers must know about are in :class:`Stat` (a store may not count
children) and in docs/metadata-stores.md.
"""

from __future__ import annotations

import contextlib
import enum
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from bklib.errors import BKError, ZKError
from bklib.meta import paths

__all__ = [
    "ANY_VERSION",
    "BadVersion",
    "ChangeFeed",
    "ChangeListener",
    "ChildrenRead",
    "GapListener",
    "KeyExists",
    "KeyNotFound",
    "KeyStateError",
    "MetadataStore",
    "NotEmpty",
    "SessionState",
    "Stat",
    "StoreUnavailable",
    "ValueRead",
]

ANY_VERSION = -1
"""A compare-and-set or delete that matches every version (BookKeeper's ``Version.ANY``)."""


class StoreUnavailable(ZKError):
    """The store cannot be reached, refused the session, or the session ended mid-operation."""


class KeyStateError(BKError):
    """A key is not in the state an operation requires. Not a failure of the store."""


class KeyNotFound(KeyStateError):
    """The key does not exist (ZooKeeper's NONODE)."""


class KeyExists(KeyStateError):
    """The key already exists (NODEEXISTS)."""


class BadVersion(KeyStateError):
    """The key's version is not the one presented (BADVERSION)."""


class NotEmpty(KeyStateError):
    """The key has children and cannot be deleted (NOTEMPTY)."""


@dataclass(frozen=True)
class Stat:
    """What a store says about a key besides its value."""

    version: int
    """What compare-and-set presents: ZooKeeper's data version, Oxia's ``versionId``."""
    ctime_ms: int
    mtime_ms: int
    ephemeral_owner: str | None = None
    """Who owns an ephemeral key (compare with :attr:`MetadataStore.session_owner`); None for
    a persistent key."""
    num_children: int | None = None
    """Children, where the store counts them (ZooKeeper); None where it does not (Oxia)."""
    child_version: int | None = None
    """ZooKeeper's cversion: unchanged while no child was created or deleted. None on Oxia."""


@dataclass(frozen=True)
class ValueRead:
    """One key of a bulk read: its value and stat, or ``error`` (None when ``missing``)."""

    path: str
    data: bytes | None
    stat: Stat | None
    error: str | None = None

    @property
    def missing(self) -> bool:
        return self.data is None and self.error is None


@dataclass(frozen=True)
class ChildrenRead:
    """One key of a bulk listing: its children's names, sorted, or ``error`` (both None when
    the key is gone)."""

    path: str
    children: list[str] | None
    error: str | None = None


class SessionState(enum.Enum):
    """The store session as a caller sees it (kazoo's KazooState, Oxia's session)."""

    CONNECTED = "connected"
    SUSPENDED = "suspended"
    """Disconnected; the session and its ephemeral keys may still be alive."""
    LOST = "lost"
    """The session expired: its ephemeral keys are gone. A new session follows."""


StateListener = Callable[[SessionState], None]
ChildrenListener = Callable[[list[str] | None], None]
"""Called with a key's children after each change, or None once the key is gone."""


ChangeListener = Callable[[str], None]
"""Called with the path of a key created, changed or deleted under a watched tree."""
GapListener = Callable[[str], None]
"""Called, with the reason, when a change feed may have missed changes."""


class ChangeFeed(ABC):
    """The keys that change under one tree, as the store announces them
    (:meth:`MetadataStore.watch_tree`): each change calls the feed's listener with the key's
    path, from the feed's own thread, in the store's order. The feed says what a change was
    not: the listener re-reads the key. Anything that may have lost an announcement (the
    connection or session dropped, the stream ended) calls the gap listener once and ends the
    feed; a new feed must be opened and everything it watches read again."""

    @abstractmethod
    def barrier(self, timeout: float) -> bool:
        """Wait until every change the store committed before this call has been delivered
        to the listener; False if that is not so within ``timeout`` seconds (the caller must
        then treat what it knows as stale), or if the feed has ended."""

    @property
    @abstractmethod
    def open(self) -> bool:
        """Whether the feed still delivers (no gap, not closed)."""

    @abstractmethod
    def close(self) -> None:
        """Stop delivering; no gap is reported. Idempotent."""


class MetadataStore(ABC):
    """A session on a metadata store. Thread-safe; every call blocks until answered.

    Failures of the store itself (unreachable, session ended) raise :class:`StoreUnavailable`;
    a key in the wrong state raises a :class:`KeyStateError`. Both name the key.
    """

    kind: str
    """``zookeeper`` or ``oxia``: for messages and the few store-specific decisions."""
    prunes_safely: bool = True
    """Deleting a key fails while it has children, atomically (ZooKeeper's NOTEMPTY). Without
    it (Oxia: a listing, then a delete), a child created in between outlives its deleted
    parent and drops out of every listing, so empty parent directories are left in place."""

    @property
    @abstractmethod
    def locator(self) -> str:
        """Where the store is, without secrets (``h1:2181/chroot``, ``oxia://h:6648/ns``)."""

    @abstractmethod
    def get(self, path: str) -> tuple[bytes, Stat]:
        """The key's value and stat; :class:`KeyNotFound` when it does not exist."""

    @abstractmethod
    def exists(self, path: str) -> Stat | None:
        """The key's stat, or None."""

    @abstractmethod
    def children(self, path: str) -> list[str]:
        """The names of the key's direct children, sorted. :class:`KeyNotFound` when the key
        itself does not exist (on Oxia: when it has no children and no value)."""

    @abstractmethod
    def create(
        self, path: str, data: bytes = b"", *, ephemeral: bool = False, parents: bool = False
    ) -> Stat:
        """Create the key; :class:`KeyExists` if it exists. ``parents`` creates missing parents
        (empty, persistent), else a missing parent raises :class:`KeyNotFound`."""

    @abstractmethod
    def create_sequential(self, prefix: str, data: bytes = b"", *, ephemeral: bool) -> str:
        """Create ``prefix`` + a 10-digit counter unique under its parent (ZooKeeper's
        sequential znodes), parents included; returns the created path."""

    @abstractmethod
    def set(self, path: str, data: bytes, version: int = ANY_VERSION) -> Stat:
        """Compare-and-set: :class:`BadVersion` when the version differs, :class:`KeyNotFound`
        when the key is gone."""

    @abstractmethod
    def delete(self, path: str, version: int = ANY_VERSION) -> None:
        """Delete the key: :class:`KeyNotFound`, :class:`BadVersion`, or :class:`NotEmpty`
        when it has children."""

    def create_together(self, keys: Sequence[tuple[str, bytes]]) -> int | None:
        """Create every ``(key, value)`` of ``keys``, in order, in one atomic request where the
        store has one (ZooKeeper's ``multi``): all of them or none. Returns the version the new
        keys have; None when nothing was created, because one of them could not be (it exists,
        or its parent does not) or the store has no such request. The caller then creates
        them one at a time and meets the failure there."""
        return None

    def create_together_many(
        self, groups: Sequence[Sequence[tuple[str, bytes]]]
    ) -> list[int | None]:
        """:meth:`create_together` for each group, in order, many requests in flight where
        the store pipelines them; one result per group."""
        return [self.create_together(g) for g in groups]

    def delete_together(self, keys: Sequence[tuple[str, int]]) -> bool:
        """Delete every ``(key, version)`` of ``keys``, in order, in one atomic request where
        the store has one: all of them or none. False when nothing was deleted, because one
        of them could not be (gone, another version, children) or the store has no such
        request; the caller then deletes them one at a time and meets the failure there."""
        return False

    def delete_recursive(self, path: str) -> None:
        """Delete the key and everything below it; a missing key is success."""
        try:
            names = self.children(path)
        except KeyNotFound:
            return
        for name in names:
            self.delete_recursive(paths.join(path, name))
        with contextlib.suppress(KeyNotFound):
            self.delete(path)

    def ensure_path(self, path: str) -> None:
        """Create the key and its parents where missing (empty values)."""
        if self.exists(path) is None:
            with contextlib.suppress(KeyExists):
                self.create(path, parents=True)

    @abstractmethod
    def get_many(self, paths: Iterable[str], max_in_flight: int = 500) -> Iterator[ValueRead]:
        """Read many keys with up to ``max_in_flight`` requests outstanding; results in input
        order. A per-key failure comes back in :attr:`ValueRead.error`; a failed session
        raises :class:`StoreUnavailable`."""

    def children_many(
        self, paths: Iterable[str], max_in_flight: int = 500
    ) -> Iterator[ChildrenRead]:
        """:meth:`children` of many keys, in input order, with up to ``max_in_flight``
        listings outstanding where the store pipelines them (here: one at a time). A per-key
        failure comes back in :attr:`ChildrenRead.error`; a failed session raises
        :class:`StoreUnavailable`."""
        for path in paths:
            try:
                yield ChildrenRead(path, self.children(path))
            except KeyNotFound:
                yield ChildrenRead(path, None)

    def scan_children(self, path: str, max_in_flight: int = 500) -> Iterator[ValueRead]:
        """Every child of ``path`` with its value, in name order ([] when ``path`` is gone).
        Oxia answers it with one range scan; elsewhere it is a listing plus a bulk read with
        up to ``max_in_flight`` reads outstanding."""
        try:
            names = self.children(path)
        except KeyNotFound:
            return
        yield from self.get_many((paths.join(path, n) for n in names), max_in_flight)

    @abstractmethod
    def watch_children(self, path: str, listener: ChildrenListener) -> None:
        """Call ``listener`` with the children of ``path`` now and after every change, from the
        store's thread (it must not block), until the key is gone."""

    @abstractmethod
    def watch_tree(self, path: str, on_change: ChangeListener, on_gap: GapListener) -> ChangeFeed:
        """Announce every key created, changed or deleted under ``path`` (itself included)
        from now on (:class:`ChangeFeed`): ZooKeeper's persistent recursive watch (3.6+),
        Oxia's notifications. Raises :class:`StoreUnavailable` when it cannot start."""

    @property
    @abstractmethod
    def session_owner(self) -> str | None:
        """What :attr:`Stat.ephemeral_owner` holds for this session's ephemeral keys, or None
        before the session is established."""

    @property
    @abstractmethod
    def connected(self) -> bool:
        """Whether the session is connected now."""

    @abstractmethod
    def add_state_listener(self, listener: StateListener) -> None:
        """Call ``listener`` on every session state change, from the store's thread."""

    @abstractmethod
    def remove_state_listener(self, listener: StateListener) -> None:
        """Stop calling ``listener``; unknown listeners are ignored."""

    @abstractmethod
    def close(self) -> None:
        """End the session (its ephemeral keys with it). Idempotent."""

    def __enter__(self) -> MetadataStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
