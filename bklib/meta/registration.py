"""Reading bookie registrations and cookies (``available``, ``available/readonly``, ``cookies``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from kazoo.client import KazooClient

from bklib.meta import paths
from bklib.meta.formats import BookieServiceInfo, decode_service_info
from bklib.meta.stores.base import KeyNotFound, MetadataStore
from bklib.meta.stores.zookeeper import as_store
from bklib.states import DEFAULT_LEDGERS_ROOT

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BookieRegistration:
    """One registered bookie: its id, whether it is read-only, and its published endpoints
    (None when the registration data could not be decoded; ``error`` says why)."""

    bookie_id: str
    readonly: bool
    info: BookieServiceInfo | None
    error: str | None = None


@dataclass(frozen=True)
class BookieRegistry:
    """A snapshot of ``available``: writable and read-only bookies, and the parent cversion
    (BookKeeper's version of the bookie set; -1 on a store without child versions)."""

    writable: dict[str, BookieRegistration] = field(default_factory=dict)
    readonly: dict[str, BookieRegistration] = field(default_factory=dict)
    cversion: int = -1

    def all(self) -> dict[str, BookieRegistration]:
        return {**self.readonly, **self.writable}

    def is_available(self, bookie_id: str) -> bool:
        """Read-only bookies are available (they serve reads); only unregistered ones are lost."""
        return bookie_id in self.writable or bookie_id in self.readonly


def _read_one(zk: MetadataStore, path: str, bookie_id: str, readonly: bool) -> BookieRegistration:
    data, _ = zk.get(path)  # KeyNotFound propagates: the caller skips a vanished bookie
    try:
        return BookieRegistration(bookie_id, readonly, decode_service_info(data, bookie_id))
    except Exception as exc:  # noqa: BLE001 - corrupt data: the bookie is listed, with its error
        log.warning("bookie %s: unreadable registration at %s: %s", bookie_id, path, exc)
        return BookieRegistration(bookie_id, readonly, None, f"{path}: {exc}")


def _children(zk: MetadataStore, path: str) -> list[str]:
    try:
        return zk.children(path)
    except KeyNotFound:
        return []


def registered_ids(
    store: MetadataStore | KazooClient, root: str = DEFAULT_LEDGERS_ROOT
) -> tuple[frozenset[str], frozenset[str]]:
    """The writable and the read-only bookie ids: the children of ``available`` and of
    ``available/readonly``, without their data. Two requests whatever the number of bookies,
    as BookKeeper's ``Auditor`` learns the bookie set (``BookieWatcher.getBookies``)."""
    zk = as_store(store)
    avail = paths.join(root, "available")
    writable = frozenset(c for c in _children(zk, avail) if c != "readonly")
    return writable, frozenset(_children(zk, paths.join(avail, "readonly")))


def list_bookies(
    store: MetadataStore | KazooClient, root: str = DEFAULT_LEDGERS_ROOT
) -> BookieRegistry:
    """Read every writable and read-only registration with its service info."""
    zk = as_store(store)
    avail = paths.join(root, "available")
    stat = zk.exists(avail)
    if stat is None:
        return BookieRegistry()
    writable_ids, readonly_ids = registered_ids(zk, root)
    found: dict[bool, dict[str, BookieRegistration]] = {False: {}, True: {}}
    for readonly, ids in ((False, writable_ids), (True, readonly_ids)):
        parent = paths.join(avail, "readonly") if readonly else avail
        for child in sorted(ids):
            try:
                found[readonly][child] = _read_one(zk, paths.join(parent, child), child, readonly)
            except KeyNotFound:  # went away while we listed
                continue
    cversion = stat.child_version if stat.child_version is not None else -1
    return BookieRegistry(found[False], found[True], cversion)


def delete_cookie(
    store: MetadataStore | KazooClient, bookie_id: str, root: str = DEFAULT_LEDGERS_ROOT
) -> bool:
    """Remove a decommissioned bookie's cookie, as the shell's ``decommissionbookie`` does
    after the admin call. Returns False if it had none."""
    path = paths.join(root, "cookies", bookie_id)
    try:
        as_store(store).delete(path)
    except KeyNotFound:
        return False
    log.info("deleted cookie %s", path)
    return True
