"""BookKeeper's under-replication znodes: marks, locks, the disable flag and the recovery delay.

Same paths and data forms as ``ZkLedgerUnderreplicationManager``, so a Java Auditor,
ReplicationWorker or ``bookkeeper shell listunderreplicated`` sees what we write and we see
what they write.
"""

from __future__ import annotations

import contextlib
import logging
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from kazoo.client import KazooClient

from bklib.errors import CorruptMetadataError, ZKError
from bklib.meta import paths
from bklib.meta.formats import (
    UR_LAYOUT_DATA,
    check_ur_layout,
    decode_lock_data,
    decode_ur_ledger,
    encode_lock_data,
    encode_ur_ledger,
)
from bklib.meta.stores.base import (
    ANY_VERSION,
    BadVersion,
    KeyExists,
    KeyNotFound,
    MetadataStore,
    NotEmpty,
    StoreUnavailable,
)
from bklib.meta.stores.zookeeper import as_store
from bklib.states import DEFAULT_LEDGERS_ROOT

log = logging.getLogger(__name__)

UR_HEX_LEVELS = 4
"""Hex dir levels between ``underreplication/ledgers`` and a mark (:func:`paths.ur_ledger_path`)."""


@dataclass(frozen=True)
class UnderReplicatedLedger:
    ledger_id: int
    missing_replicas: tuple[str, ...]
    ctime_ms: int | None
    version: int
    lock_holder: str | None = None


@dataclass(frozen=True)
class UrLock:
    """A held ledger lock, with the mark's version when it was taken (None if unmarked)."""

    ledger_id: int
    mark_version: int | None


MARKS_PER_REQUEST = 50
"""New marks per ZooKeeper ``multi`` (two creates each: 100 operations, some 20 KB). At a
million ledgers a lost bookie is named by tens of thousands; one request each would take
longer than the reaction's goal (docs/watch.md)."""


LISTINGS_PER_ROUND = 5000
"""Dirs listed, or marks read, per round of :meth:`UnderReplicationManager.list_underreplicated`:
enough to keep the pipeline full, few enough that the marks stream out as they are read."""


class UnderReplicationManager:
    """Marks, locks and flags under ``<root>/underreplication``."""

    def __init__(
        self,
        zk: MetadataStore | KazooClient,
        root: str = DEFAULT_LEDGERS_ROOT,
        worker_id: str | None = None,
    ):
        self.meta = as_store(zk)
        self.root = root.rstrip("/")
        self.base = paths.ur_base(self.root)
        # BookKeeper stores the worker's hostname in the lock, not a bookie id.
        self.worker_id = worker_id or socket.gethostname()
        self._unpruned: set[str] = set()
        self._unpruned_lock = threading.Lock()

    def ensure_layout(self) -> None:
        """Create the tree like the Java manager's constructor; reject unknown layouts."""
        self.meta.ensure_path(self.base)
        layout = paths.join(self.base, "LAYOUT")
        try:
            self.meta.create(layout, UR_LAYOUT_DATA)
        except KeyExists:
            check_ur_layout(self.meta.get(layout)[0])
        self.meta.ensure_path(paths.join(self.base, "ledgers"))
        self.meta.ensure_path(paths.join(self.base, "locks"))

    # ---- marks -------------------------------------------------------------------------------

    def mark_underreplicated(self, ledger_id: int, missing: Sequence[str]) -> bool:
        """Publish ``missing`` replicas for a ledger, merging into an existing mark. Returns
        True if anything was written (a mark that already lists them all is left alone)."""
        return self.mark(ledger_id, missing)[0]

    def mark_many(
        self,
        marks: Mapping[int, Sequence[str]],
        *,
        per_request: int = MARKS_PER_REQUEST,
        known: Mapping[int, Sequence[str]] | None = None,
    ) -> int:
        """:meth:`mark_underreplicated` for many ledgers: new marks go ``per_request`` to one
        atomic request (each with its own hex dir), many requests in flight where the store
        pipelines them; a request that cannot be applied whole (a mark or its dir already
        there, a parent missing) leaves its ledgers to :meth:`mark` one at a time, which
        merges. Returns the marks written.

        ``known``: the marks the caller read a moment ago (ledger -> missing replicas). A
        ledger whose known mark lists every bookie already is left alone, and one that needs
        a merge is merged at once: neither is put in a request that a mark already there
        would fail whole. A known mark that went meanwhile is harmless: a repair marks its
        ledger again before it acts (:class:`~bklib.repair.worker.LedgerRepairer`)."""
        known = known or {}
        merge: dict[int, Sequence[str]] = {}
        new: dict[int, Sequence[str]] = {}
        for ledger_id, missing in marks.items():
            if ledger_id not in known:
                new[ledger_id] = missing
            elif not set(missing) <= set(known[ledger_id]):
                merge[ledger_id] = missing
        merged = sum(self.mark(lid, b, likely_new=False)[0] for lid, b in sorted(merge.items()))
        return merged + self._create_many(new, per_request)

    def _create_many(self, marks: Mapping[int, Sequence[str]], per_request: int) -> int:
        """New marks, ``per_request`` to a request (see :meth:`mark_many`)."""
        items = sorted(marks.items())
        chunks = [items[i : i + per_request] for i in range(0, len(items), per_request)]
        now = _now_ms()
        groups: list[list[tuple[str, bytes]]] = []
        parents: set[str] = set()
        for chunk in chunks:
            keys: list[tuple[str, bytes]] = []
            for ledger_id, missing in chunk:
                path = paths.ur_ledger_path(self.root, ledger_id)
                mark = encode_ur_ledger(list(missing), now)
                own_dir = path.rsplit("/", 1)[0]
                keys += [(own_dir, b""), (path, mark)]
                parents.add(own_dir.rsplit("/", 1)[0])
            groups.append(keys)
        # The hex dirs above each mark's own, first: few (a million ids share sixteen), and
        # every request that needs a missing one would fail whole.
        for parent in sorted(parents):
            self._make_dirs(parent)
        written = 0
        for chunk, version in zip(chunks, self.meta.create_together_many(groups), strict=True):
            if version is not None:
                written += len(chunk)
            else:
                written += sum(self.mark(ledger_id, missing)[0] for ledger_id, missing in chunk)
        return written

    def mark(
        self, ledger_id: int, missing: Sequence[str], *, likely_new: bool = True
    ) -> tuple[bool, int]:
        """:meth:`mark_underreplicated`, also returning the mark's version after it: a repair
        takes its lock with that version (:meth:`try_acquire_marked`), so that a re-mark by
        anyone else before the repair ends keeps the mark. ``likely_new=False``: the caller
        expects the mark to exist (it marked the ledger itself just before), so the request
        that creates a new one is not tried first."""
        path = paths.ur_ledger_path(self.root, ledger_id)
        # The mark's own hex dir (its id's low 16 bits: one ledger's) and the mark in one
        # request where the store has one, instead of a refused create, the dir, then the
        # mark. A dir that exists (a mark already there) or a missing parent: one at a time.
        if likely_new:
            version = self.meta.create_together(
                [(path.rsplit("/", 1)[0], b""), (path, encode_ur_ledger(list(missing), _now_ms()))]
            )
            if version is not None:
                log.debug("ledger %d: marked under-replicated, missing %s", ledger_id, missing)
                return True, version
        while True:
            try:
                # Parents first only when missing: makepath costs a round trip per level on
                # every mark, and a lost bookie is marked on hundreds of ledgers at once.
                stat = self.meta.create(path, encode_ur_ledger(list(missing), _now_ms()))
                log.debug("ledger %d: marked under-replicated, missing %s", ledger_id, missing)
                return True, stat.version
            except KeyExists:
                pass
            except KeyNotFound:
                # No parent yet, or a worker pruned an empty hex parent meanwhile (as
                # BookKeeper's marker does on NONODE: create again).
                with contextlib.suppress(KeyNotFound):  # pruned while making it: again
                    self._make_dirs(path.rsplit("/", 1)[0])
                continue
            try:
                data, stat = self.meta.get(path)
            except KeyNotFound:
                continue
            replicas, _ = decode_ur_ledger(data)
            added = [b for b in missing if b not in replicas]
            if not added:
                return False, stat.version
            try:
                stat = self.meta.set(
                    path, encode_ur_ledger(replicas + added, _now_ms()), stat.version
                )
                log.debug("ledger %d: under-replication mark now also lists %s", ledger_id, added)
                return True, stat.version
            except (BadVersion, KeyNotFound):
                continue

    def _make_dirs(self, path: str) -> None:
        """Create the hex dir ``path`` and, only where missing, its parents. Bottom up: the
        leaf dir is each ledger's own (its id's low 16 bits) and its parent is usually there,
        so a mark costs one create for its dir, not a check of every level."""
        try:
            self.meta.create(path)
        except KeyExists:
            return
        except KeyNotFound:
            self._make_dirs(path.rsplit("/", 1)[0])
            with contextlib.suppress(KeyExists):
                self.meta.create(path)

    def get(self, ledger_id: int) -> UnderReplicatedLedger | None:
        path = paths.ur_ledger_path(self.root, ledger_id)
        try:
            data, stat = self.meta.get(path)
        except KeyNotFound:
            return None
        replicas, ctime = decode_ur_ledger(data)
        return UnderReplicatedLedger(
            ledger_id, tuple(replicas), ctime, stat.version, self.lock_holder(ledger_id)
        )

    def list_underreplicated(
        self, on_unreadable: Callable[[str, CorruptMetadataError], None] | None = None
    ) -> Iterator[UnderReplicatedLedger]:
        """Breadth-first walk like ``listunderreplicated``; every ``urL`` child is a ledger.

        Each level's listings, and then the marks and their locks, are read pipelined
        (:meth:`MetadataStore.children_many`, :meth:`MetadataStore.get_many`), a chunk of
        :data:`LISTINGS_PER_ROUND` dirs at a time: every mark has a hex dir of its own, so a
        walk of one request at a time costs three round trips per mark (53.7 s for 44,000
        marks, docs/benchmarks.md), and the watch lists the marks every cycle.

        A mark that does not decode raises :class:`~bklib.errors.CorruptMetadataError`, or,
        with ``on_unreadable``, is handed to it (with its key) and the walk goes on. A dir
        that cannot be listed, or a mark that cannot be read, raises: a walk that skipped one
        would report the ledger as not marked."""
        level = [paths.join(self.base, "ledgers")]
        while level:
            below: list[str] = []
            for start in range(0, len(level), LISTINGS_PER_ROUND):
                marked: list[int] = []
                chunk = level[start : start + LISTINGS_PER_ROUND]
                for listed in self.meta.children_many(chunk):
                    if listed.error is not None:
                        where = listed.path
                        raise ZKError(f"cannot list {where}: {listed.error}", path=where)
                    for child in listed.children or ():
                        m = paths.UR_NODE_RE.match(child) if child.startswith("urL") else None
                        if m:
                            marked.append(int(m.group(1)))
                        else:
                            below.append(paths.join(listed.path, child))
                yield from self._read_marks(marked, on_unreadable)
            level = below

    def _read_marks(
        self,
        ledger_ids: list[int],
        on_unreadable: Callable[[str, CorruptMetadataError], None] | None,
    ) -> Iterator[UnderReplicatedLedger]:
        """The marks of ``ledger_ids`` with their lock holders, read pipelined, in order; a
        mark gone since its dir was listed is skipped."""
        keys: list[str] = []
        for ledger_id in ledger_ids:
            keys += (paths.ur_ledger_path(self.root, ledger_id),
                     paths.ur_lock_path(self.root, ledger_id))  # fmt: skip
        # Read in full before yielding: a caller that reads the store for each mark would
        # otherwise meet the bulk session busy and open one of its own each time.
        reads = iter(list(self.meta.get_many(keys)))
        for ledger_id, mark, lock in zip(ledger_ids, reads, reads, strict=True):
            for read in (mark, lock):
                if read.error is not None:
                    raise ZKError(f"cannot read {read.path}: {read.error}", path=read.path)
            if mark.data is None or mark.stat is None:
                continue
            try:
                replicas, ctime = decode_ur_ledger(mark.data)
                holder = decode_lock_data(lock.data) if lock.data is not None else None
            except CorruptMetadataError as exc:
                if on_unreadable is None:
                    raise
                on_unreadable(mark.path, exc)
                continue
            version = mark.stat.version
            yield UnderReplicatedLedger(ledger_id, tuple(replicas), ctime, version, holder)

    # ---- locks -------------------------------------------------------------------------------

    def lock_holder(self, ledger_id: int) -> str | None:
        try:
            return decode_lock_data(self.meta.get(paths.ur_lock_path(self.root, ledger_id))[0])
        except KeyNotFound:
            return None

    def try_acquire(self, ledger_id: int) -> UrLock | None:
        """Take the ledger's ephemeral lock; None if someone (a Java ReplicationWorker or
        another job) holds it. The mark's version is remembered for ``mark_replicated``."""
        mark = self.meta.exists(paths.ur_ledger_path(self.root, ledger_id))
        return self.try_acquire_marked(ledger_id, mark.version if mark is not None else None)

    def try_acquire_marked(self, ledger_id: int, mark_version: int | None) -> UrLock | None:
        """:meth:`try_acquire` for a caller that knows the mark's version (it just wrote or
        read the mark: :meth:`mark`), without reading it again."""
        try:
            self.meta.create(
                paths.ur_lock_path(self.root, ledger_id),
                encode_lock_data(self.worker_id),
                ephemeral=True,
                parents=True,
            )
        except KeyExists:
            return None
        return UrLock(ledger_id, mark_version)

    def poll_ledger_to_rereplicate(self) -> UrLock | None:
        """A ReplicationWorker's acquire: random walk of the hex levels, skipping locked
        ledgers; None when nothing is available."""
        return self._walk_for_lock(paths.join(self.base, "ledgers"), depth=0)

    def _walk_for_lock(self, node: str, depth: int) -> UrLock | None:
        try:
            children = self.meta.children(node)
        except KeyNotFound:
            return None
        random.shuffle(children)
        for child in children:
            if depth == 4:
                m = paths.UR_NODE_RE.match(child)
                if not m or self.meta.exists(paths.join(self.base, "locks", child)):
                    continue
                lock = self.try_acquire(int(m.group(1)))
                if lock is not None and lock.mark_version is not None:
                    return lock
                if lock is not None:  # the mark vanished between listing and locking
                    self.release(lock)
            else:
                found = self._walk_for_lock(paths.join(node, child), depth + 1)
                if found is not None:
                    return found
        return None

    def release(self, lock: UrLock) -> None:
        """Drop the lock only (the ledger stays marked for another attempt)."""
        with contextlib.suppress(KeyNotFound):
            self.meta.delete(paths.ur_lock_path(self.root, lock.ledger_id))

    def mark_replicated(self, lock: UrLock, *, prune: bool = True) -> bool:
        """Delete the mark only if its version is the one seen when the lock was taken (a
        re-mark meanwhile survives), prune empty hex dirs, release the lock. Returns True if
        the mark was removed.

        ``prune=False`` prunes the ledger's own dir now and leaves the three shared levels
        above it for :meth:`prune_cleared`: a repair clears many marks under one parent, and
        trying that parent after each would cost a refused delete per ledger."""
        path = paths.ur_ledger_path(self.root, lock.ledger_id)
        leaf = path.rsplit("/", 1)[0]
        # The mark at the version the lock saw, its own dir and the lock in one request where
        # the store has one. If any of them cannot go (re-marked meanwhile, or the lock is
        # gone), nothing went, and the steps below run one at a time as before.
        if lock.mark_version is not None and self.meta.prunes_safely:
            try:
                cleared = self.meta.delete_together(
                    [
                        (path, lock.mark_version),
                        (leaf, ANY_VERSION),
                        (paths.ur_lock_path(self.root, lock.ledger_id), ANY_VERSION),
                    ]
                )
            except StoreUnavailable:
                # Applied or not, the lock must not outlive the attempt (as below).
                with contextlib.suppress(StoreUnavailable):
                    self.release(lock)
                raise
            if cleared:
                self._pruned_leaf(leaf, prune)
                return True
        removed = False
        try:
            if lock.mark_version is not None:
                self.meta.delete(path, lock.mark_version)
                removed = True
                if self._prune_up(leaf, 1):
                    self._pruned_leaf(leaf, prune)
        except BadVersion:
            log.info("ledger %d: re-marked while being repaired; mark kept", lock.ledger_id)
        except KeyNotFound:
            pass
        finally:
            self.release(lock)
        return removed

    def _pruned_leaf(self, leaf: str, prune: bool) -> None:
        """After a cleared mark's own dir ``leaf`` went: its shared parents now (``prune``),
        or later, once per parent (:meth:`prune_cleared`)."""
        parent = leaf.rsplit("/", 1)[0]
        if prune:
            self._prune_up(parent, UR_HEX_LEVELS - 1)
        else:
            with self._unpruned_lock:
                self._unpruned.add(parent)

    def prune_cleared(self) -> int:
        """Prune the shared hex dirs that :meth:`mark_replicated` left (``prune=False``)
        where they are empty now; returns how many were removed."""
        with self._unpruned_lock:
            parents, self._unpruned = self._unpruned, set()
        return sum(self._prune_up(p, UR_HEX_LEVELS - 1) for p in sorted(parents))

    def _prune_up(self, parent: str, levels: int) -> int:
        """Delete ``parent`` and then its own parents, up to ``levels`` hex levels, while each
        is empty (ZooKeeper refuses to delete a znode with children, so no check is needed
        first); returns how many went."""
        # Pulsar's manager never prunes; on a store that cannot prune atomically a
        # concurrent mark under this parent would vanish from every listing.
        removed = 0
        for _ in range(levels if self.meta.prunes_safely else 0):
            try:
                self.meta.delete(parent)
            except (NotEmpty, KeyNotFound):
                break
            removed += 1
            parent = parent.rsplit("/", 1)[0]
        return removed

    # ---- flags -------------------------------------------------------------------------------

    def is_replication_enabled(self) -> bool:
        """Autorecovery is disabled exactly while the ``disable`` znode exists."""
        return self.meta.exists(paths.join(self.base, "disable")) is None

    def disable_replication(self) -> None:
        with contextlib.suppress(KeyExists):
            self.meta.create(paths.join(self.base, "disable"), b"", parents=True)

    def enable_replication(self) -> None:
        with contextlib.suppress(KeyNotFound):
            self.meta.delete(paths.join(self.base, "disable"))

    def get_lost_bookie_recovery_delay(self) -> int | None:
        try:
            return int(self.meta.get(paths.join(self.base, "lostBookieRecoveryDelay"))[0].decode())
        except KeyNotFound:
            return None

    def set_lost_bookie_recovery_delay(self, seconds: int) -> None:
        """Decimal text, ``setData(-1)`` like the shell (create if absent)."""
        path = paths.join(self.base, "lostBookieRecoveryDelay")
        data = str(int(seconds)).encode()
        try:
            self.meta.set(path, data)
        except KeyNotFound:
            self.meta.create(path, data, parents=True)


def _now_ms() -> int:
    return int(time.time() * 1000)
