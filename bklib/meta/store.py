"""Ledger metadata in BookKeeper's own layout, on any metadata store (ZooKeeper or Oxia,
through :class:`~bklib.meta.stores.base.MetadataStore`).

Creates are ``create`` (never ``setData``); updates are compare-and-set on the key's version
(ZooKeeper's data version, Oxia's versionId); on a version conflict the caller's transform is
re-applied to freshly read metadata.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from kazoo.client import KazooClient

from bklib.errors import (
    CompatibilityError,
    CorruptMetadataError,
    LedgerExistsError,
    LedgerIdOverflowError,
    MetadataVersionError,
    NoSuchLedgerOnMetadataServerError,
)
from bklib.meta import paths
from bklib.meta.cluster import ClusterLayout, MetadataDriver, recognise_cluster
from bklib.meta.formats import LedgerLayout, encode_layout, parse_layout
from bklib.meta.model import LedgerMetadata
from bklib.meta.paths import LayoutKind
from bklib.meta.serde import decode_metadata, encode_metadata
from bklib.meta.stores.base import (
    BadVersion,
    KeyExists,
    KeyNotFound,
    KeyStateError,
    MetadataStore,
    NotEmpty,
    StoreUnavailable,
)
from bklib.meta.stores.zookeeper import as_store
from bklib.states import DEFAULT_LEDGERS_ROOT

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeafDir:
    """A directory whose children are ledger znodes: one contiguous ledger-id range.

    ``prefix`` is the id digits the path contributes (a leaf ``L1234`` adds the rest);
    ``count`` is its child count from the znode stat; ``cversion`` the stat's child version
    then (-1 when not read; on a store without child versions, Oxia, a checksum of the listed
    names): while it stays the same, no child was created or deleted, so a scan of the
    directory must find exactly ``count`` ledgers (see docs/reliability.md).
    """

    path: str
    prefix: str
    count: int
    cversion: int = -1


T = TypeVar("T")

DEFAULT_ROOT = DEFAULT_LEDGERS_ROOT


@dataclass(frozen=True)
class Versioned(Generic[T]):
    """A value read from the metadata store with the version a CAS must present."""

    value: T
    version: int


class LedgerStore:
    """Ledger metadata, id generation and cluster znodes under one ledgers root."""

    def __init__(
        self,
        zk: MetadataStore | KazooClient,
        root: str = DEFAULT_ROOT,
        kind: LayoutKind | None = None,
    ) -> None:
        self.zk = zk
        """What the store was built on, handed on to callers not yet on the interface."""
        self.meta = as_store(zk)
        self.root = root.rstrip("/") or "/"
        self._kind = kind

    # ---- cluster layout --------------------------------------------------------------------

    def read_layout(self) -> LedgerLayout | None:
        try:
            data, _ = self.meta.get(paths.join(self.root, paths.LAYOUT_ZNODE))
        except KeyNotFound:
            return None
        return parse_layout(data)

    @property
    def kind(self) -> LayoutKind:
        """The ledger manager in force: from LAYOUT, else hierarchical (BookKeeper's default,
        and the only manager of Pulsar's driver, which writes no LAYOUT)."""
        if self._kind is None:
            layout = self.read_layout()
            self._kind = (
                LayoutKind.from_factory(layout.factory_class) if layout else LayoutKind.HIERARCHICAL
            )
        return self._kind

    def ensure_layout(self, kind: LayoutKind = LayoutKind.HIERARCHICAL) -> LedgerLayout:
        """Create LAYOUT if missing, as the first BookKeeper client would; on a race re-read
        and require the same manager."""
        wanted = LedgerLayout(2, kind.factory_class, 1)
        path = paths.join(self.root, "LAYOUT")
        try:
            self.meta.create(path, encode_layout(wanted), parents=True)
            self._kind = kind
            return wanted
        except KeyExists:
            existing = self.read_layout()
            assert existing is not None
            if LayoutKind.from_factory(existing.factory_class) is not kind:
                raise CompatibilityError(
                    f"configured layout {kind.value} does not match existing layout "
                    f"{existing.factory_class}",
                    path=path,
                ) from None
            self._kind = kind
            return existing

    def init_cluster(
        self,
        kind: LayoutKind = LayoutKind.HIERARCHICAL,
        driver: MetadataDriver = MetadataDriver.BOOKKEEPER,
    ) -> str:
        """Like ``bookkeeper shell initnewcluster``: root, available, readonly, INSTANCEID and
        LAYOUT. With Pulsar's driver, as ``PulsarClusterMetadataSetup`` (through
        ``BookKeeperAdmin.format``) leaves it: the same without LAYOUT, hierarchical only.
        Idempotent; returns the instance id."""
        if driver is MetadataDriver.PULSAR and kind is not LayoutKind.HIERARCHICAL:
            raise ValueError(f"Pulsar's driver lays ledgers out hierarchically, not {kind.value}")
        for p in ("", paths.AVAILABLE_ZNODE, paths.join(paths.AVAILABLE_ZNODE, "readonly")):
            self.meta.ensure_path(paths.join(self.root, p) if p else self.root)
        iid_path = paths.join(self.root, paths.INSTANCEID_ZNODE)
        try:
            instance_id = str(uuid.uuid4())
            self.meta.create(iid_path, instance_id.encode())
        except KeyExists:
            instance_id = self.meta.get(iid_path)[0].decode()
        if driver is MetadataDriver.BOOKKEEPER:
            self.ensure_layout(kind)
        else:
            self._kind = kind
        return instance_id

    def instance_id(self) -> str | None:
        try:
            data: bytes = self.meta.get(paths.join(self.root, paths.INSTANCEID_ZNODE))[0]
            return data.decode()
        except KeyNotFound:
            return None

    # ---- paths and listing -----------------------------------------------------------------

    def path_for(self, ledger_id: int) -> str:
        return paths.ledger_path(self.root, ledger_id, self.kind)

    def _children(self, path: str) -> list[str]:
        """Children of ``path``; a node deleted meanwhile has none. The store retries transient
        errors; anything else (no auth, session gone) raises StoreUnavailable (a ZKError)
        naming the path, so a listing never silently shrinks."""
        try:
            return self.meta.children(path)
        except KeyNotFound:  # raced with a delete: an empty directory
            return []

    def _stat(self, path: str) -> tuple[int, int] | None:
        """(children, child version) of ``path``, or None when it does not exist. A store
        that neither counts children nor versions them (Oxia) is answered by a listing, and a
        checksum of the child names stands in for the version: it stays the same while no
        child is created or deleted, which is what the scan accounting needs."""
        stat = self.meta.exists(path)
        if stat is None:
            return None
        if stat.num_children is None or stat.child_version is None:
            try:
                names = self.meta.children(path)
            except KeyNotFound:
                return None
            return len(names), zlib.crc32("\n".join(names).encode()) & 0x7FFFFFFF
        return stat.num_children, stat.child_version

    def _leaf(self, path: str, prefix: str, with_counts: bool) -> LeafDir:
        stat = self._stat(path) if with_counts else None
        return LeafDir(path, prefix, *(stat or (0, -1)))

    def dir_versions(self, dirs: Iterable[str]) -> dict[str, int | None]:
        """The current child version of each directory (None: deleted), to tell after a scan
        which directories changed while it ran."""
        out: dict[str, int | None] = {}
        for path in dirs:
            stat = self._stat(path)
            out[path] = stat[1] if stat is not None else None
        return out

    def require_cluster(self, where: str = "") -> ClusterLayout:
        """Fail closed before reading anything: the ledgers root must be a cluster of
        BookKeeper's driver (``LAYOUT``) or Pulsar's (``INSTANCEID``, no ``LAYOUT``), with
        ``available/``, or a typo in a chroot or ``--ledgers-root`` would audit an empty tree
        and report a healthy cluster (:func:`~bklib.meta.cluster.recognise_cluster`).
        ``where`` names the connect string in the message. Returns what was recognised."""

        def exists(path: str) -> bool:
            return self.meta.exists(path) is not None

        found = recognise_cluster(self.root, exists, where)
        if found.kind is not None and self._kind is None:
            self._kind = found.kind
        return found

    def leaf_dirs(self, *, with_counts: bool = True) -> list[LeafDir]:
        """Every directory holding ledger znodes, each one contiguous id range, in id order
        within each tree (flat children, short hierarchical, long hierarchical). Counts come
        from the directories' stats, so nothing below them is listed."""
        root = self.root
        out: list[LeafDir] = []
        # The root's child version is read before its listing, so a flat ledger created
        # in between shows as a changed directory rather than as an unexplained count.
        root_stat = self._stat(root) if with_counts else None
        top = self._children(root)
        flat = [c for c in top if paths.FLAT_LEAF_RE.match(c)]
        if flat:
            out.append(LeafDir(root, "", len(flat), root_stat[1] if root_stat else -1))
        for l1 in (c for c in top if paths.SHORT_TOP_RE.match(c)):
            for l2 in self._children(paths.join(root, l1)):
                if paths.LEVEL_RE.match(l2):
                    out.append(self._leaf(paths.join(root, l1, l2), l1 + l2, with_counts))

        def walk_long(path: str, prefix: str, depth: int) -> None:
            for child in self._children(path):
                if not paths.LEVEL_RE.match(child):
                    continue
                p = paths.join(path, child)
                if depth == 3:
                    out.append(self._leaf(p, prefix + child, with_counts))
                else:
                    walk_long(p, prefix + child, depth + 1)

        for l1 in (c for c in top if paths.LONG_TOP_RE.match(c)):
            walk_long(paths.join(root, l1), l1, 1)
        return out

    def ledger_ids_in(self, leaf_dir: LeafDir) -> list[int]:
        """The ledger ids whose znodes are children of ``leaf_dir``, ascending."""
        leaf = paths.FLAT_LEAF_RE if leaf_dir.prefix == "" else paths.LEAF_RE
        return [
            int(leaf_dir.prefix + name[1:])
            for name in self._children(leaf_dir.path)
            if leaf.match(name)
        ]

    def list_ledger_ids(self) -> Iterator[int]:
        """Every ledger id, in ascending order within each tree: the short hierarchical tree,
        then the long one (or the flat children). Special znodes are never ledgers."""
        for d in self.leaf_dirs(with_counts=False):
            yield from self.ledger_ids_in(d)

    # ---- id generation ---------------------------------------------------------------------

    def _short_id(self, parent: str) -> int:
        node = self.meta.create_sequential(paths.join(parent, "ID-"), ephemeral=True)
        try:
            self.meta.delete(node)
        except (KeyStateError, StoreUnavailable) as exc:  # the id is ours; the node is
            # ephemeral and dies with the session: nothing for an operator to do
            log.debug("could not delete id node %s: %s", node, exc)
        value = int(node.rsplit("ID-", 1)[1])
        if value < 0 or value >= paths.SHORT_ID_LIMIT:
            raise LedgerIdOverflowError(f"id {value} from {parent} overflows 31 bits", path=node)
        return value

    def generate_ledger_id(self) -> int:
        """A new ledger id from the same znodes Java clients use, so ids never collide."""
        if self.kind is LayoutKind.FLAT:
            return self._short_id(self.root)
        long_root = paths.join(self.root, "idgen-long")
        if self.meta.exists(long_root) is None:
            try:
                return self._short_id(paths.join(self.root, "idgen"))
            except LedgerIdOverflowError:
                self.meta.ensure_path(long_root)
        return self._long_id(long_root)

    def _long_id(self, long_root: str) -> int:
        while True:
            hobs = sorted(int(c[4:]) for c in self._children(long_root) if c.startswith("HOB-"))
            if not hobs:
                with contextlib.suppress(KeyExists):
                    self.meta.create(paths.join(long_root, "HOB-0000000001"), b"")
                continue
            high = hobs[-1]
            try:
                low = self._short_id(paths.join(long_root, f"HOB-{high:010d}"))
            except LedgerIdOverflowError:
                with contextlib.suppress(KeyExists):
                    self.meta.create(paths.join(long_root, f"HOB-{high + 1:010d}"), b"")
                continue
            for old in hobs[:-3]:  # BookKeeper keeps the newest few; pruning is best effort
                with contextlib.suppress(KeyStateError, StoreUnavailable):
                    self.meta.delete_recursive(paths.join(long_root, f"HOB-{old:010d}"))
            return (high << 32) | low

    # ---- ledger CRUD and CAS -----------------------------------------------------------------

    def create_ledger(self, md: LedgerMetadata) -> Versioned[LedgerMetadata]:
        """Create the ledger's znode (parents made on demand). An existing node with the same
        cToken is our own earlier attempt and counts as success."""
        path = self.path_for(md.ledger_id)
        data = encode_metadata(md)
        try:
            stat = self.meta.create(path, data, parents=True)
            return Versioned(md, stat.version)
        except KeyExists:
            existing = self.read_ledger(md.ledger_id)
            if md.format_version >= 3 and existing.value.ctoken == md.ctoken and md.ctoken != 0:
                return existing
            raise LedgerExistsError(
                "ledger already exists", ledger_id=md.ledger_id, path=path
            ) from None

    def read_ledger(self, ledger_id: int) -> Versioned[LedgerMetadata]:
        path = self.path_for(ledger_id)
        try:
            data, stat = self.meta.get(path)
        except KeyNotFound:
            raise NoSuchLedgerOnMetadataServerError(
                "no metadata", ledger_id=ledger_id, path=path
            ) from None
        return Versioned(decode_at(path, data, ledger_id, stat.ctime_ms), stat.version)

    def write_ledger(self, md: LedgerMetadata, expected_version: int) -> Versioned[LedgerMetadata]:
        """One compare-and-set write. BADVERSION raises MetadataVersionError."""
        path = self.path_for(md.ledger_id)
        try:
            stat = self.meta.set(path, encode_metadata(md), expected_version)
        except BadVersion:
            raise MetadataVersionError(
                f"version {expected_version} is stale", ledger_id=md.ledger_id, path=path
            ) from None
        except KeyNotFound:
            raise NoSuchLedgerOnMetadataServerError(
                "deleted", ledger_id=md.ledger_id, path=path
            ) from None
        return Versioned(md, stat.version)

    def update_ledger(
        self,
        ledger_id: int,
        transform: Callable[[LedgerMetadata], LedgerMetadata | None],
        *,
        current: Versioned[LedgerMetadata] | None = None,
        max_attempts: int = 100,
    ) -> Versioned[LedgerMetadata]:
        """BookKeeper's MetadataUpdateLoop. ``transform`` gets the freshest metadata and returns
        the new value, or None when no change is needed any more (then the stored value is
        returned without a write). On a version conflict it is re-applied to a fresh read, so
        concurrent edits are never overwritten."""
        cur = current if current is not None else self.read_ledger(ledger_id)
        for _ in range(max_attempts):
            new = transform(cur.value)
            if new is None:
                return cur
            try:
                return self.write_ledger(new, cur.version)
            except MetadataVersionError:
                log.info("ledger %d: metadata changed concurrently, re-applying", ledger_id)
                cur = self.read_ledger(ledger_id)
        raise MetadataVersionError(f"gave up after {max_attempts} conflicts", ledger_id=ledger_id)

    def delete_ledger(self, ledger_id: int, version: int = -1) -> None:
        """Delete the ledger znode (NONODE is success), then empty hierarchical parents."""
        path = self.path_for(ledger_id)
        try:
            self.meta.delete(path, version)
        except KeyNotFound:
            return
        except BadVersion:
            raise MetadataVersionError(
                f"version {version} is stale", ledger_id=ledger_id, path=path
            ) from None
        if self.kind in (LayoutKind.FLAT, LayoutKind.LEGACY_HIERARCHICAL):
            return
        if not self.meta.prunes_safely:  # a ledger created meanwhile would lose its parent
            return
        parent = path.rsplit("/", 1)[0]
        while parent != self.root and parent.startswith(self.root + "/"):
            try:
                self.meta.delete(parent)
            except (NotEmpty, KeyNotFound):
                break
            parent = parent.rsplit("/", 1)[0]


def decode_at(path: str, data: bytes, ledger_id: int, ctime_ms: int | None) -> LedgerMetadata:
    """Decode metadata read from ``path``; a CorruptMetadataError then names the znode."""
    try:
        return decode_metadata(data, ledger_id, znode_ctime_ms=ctime_ms)
    except CorruptMetadataError as exc:
        raise CorruptMetadataError(exc.reason, ledger_id=ledger_id, path=path) from exc
