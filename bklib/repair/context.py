"""What every repair of a task shares: its settings, its metadata and bookie clients, and the
services the per-ledger repairs call (:mod:`bklib.repair.worker` for lost bookies,
:mod:`bklib.repair.placement_fix` for placement moves).

:class:`RepairContext` caches the cluster view (registrations, the disable flag), spreads the
replacements' load (:class:`~bklib.repair.plan.TargetChooser`) and copies stripes through one
rate limiter. Blocking API, thread-safe: Spark tasks share one context across threads.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from bklib.audit.placement import PlacementRule
from bklib.client.pool import (
    DEFAULT_BOOKIE_PROTOCOL,
    BookieClientPool,
    SyncBookieClient,
    WireProtocol,
)
from bklib.client.reader import ClientContext, resolve_credentials
from bklib.client.replicator import CopyResult, copy_fragment
from bklib.client.throttle import RateLimiter
from bklib.digest import digest_manager, master_key
from bklib.meta.model import DigestType, LedgerMetadata
from bklib.meta.racks import RackDocument
from bklib.meta.registration import BookieRegistry, list_bookies
from bklib.meta.store import LedgerStore
from bklib.meta.underreplication import UnderReplicationManager
from bklib.repair.plan import FragmentWork, TargetChooser

__all__ = ["RepairContext", "RepairSettings"]

T = TypeVar("T")


@dataclass
class RepairSettings:
    """How a task repairs. ``rate``: bytes/s per task (None: unlimited). ``exclude``: bookies
    never chosen as replacements (the sources of a manual recover). ``target``: the only
    replacement allowed (``recover --target``)."""

    grace_period: float = 30.0
    rate: float | None = 50e6
    dry_run: bool = False
    window: int = 64
    bookie_protocol: WireProtocol = DEFAULT_BOOKIE_PROTOCOL
    """Wire protocol of the copies' reads and adds (``--bookie-protocol``): v2 batch reads
    where the sources serve them, or v3 single reads."""
    password: bytes | None = None
    digest_type: DigestType | None = None
    exclude: frozenset[str] = frozenset()
    target: str | None = None
    retry_no_replica: bool = False
    registry_ttl: float = 5.0
    placement_rule: PlacementRule | None = None
    """The placement rule ``--fix-placement`` satisfies (requests with placement segments)."""
    marked_before: bool = False
    """The caller marked the ledgers just before the repair (the watch does): a repair's mark
    then merges into the one there, without first trying to create it."""


class RepairContext:
    """One task's repair state with one metadata store, one bookie client and one
    under-replication manager (all owned by the caller). Thread-safe."""

    def __init__(
        self,
        store: LedgerStore,
        client: SyncBookieClient,
        settings: RepairSettings,
        *,
        urm: UnderReplicationManager | None = None,
        rng: random.Random | None = None,
        racks: Mapping[str, str] | None = None,
        rack_document: RackDocument | None = None,
    ) -> None:
        self.store = store
        self.rack_document = rack_document
        """Racks and isolation groups for ``--fix-placement`` (None: no racks known)."""
        if rack_document is not None and racks is None:
            racks = rack_document.racks
        self.client = client
        self.settings = settings
        self.urm = urm or UnderReplicationManager(store.zk, store.root)
        self.chooser = TargetChooser(rng or random.Random(), racks=dict(racks or {}))
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[float, Any]] = {}
        self._refreshing: dict[str, threading.Lock] = {}
        self._limiter: RateLimiter | None = None

    # ---- cluster view --------------------------------------------------------------------------

    def _cached(self, key: str, read: Callable[[], T]) -> T:
        """``read()``, remembered for ``registry_ttl`` seconds (cluster state every ledger
        asks for: registrations, the disable flag). One thread reads when it expires; the
        others wait for its answer rather than each reading it again (the registry is a
        read per bookie)."""

        def fresh() -> tuple[bool, Any]:
            with self._lock:
                hit = self._cache.get(key)
            if hit is not None and time.monotonic() - hit[0] < self.settings.registry_ttl:
                return True, hit[1]
            return False, None

        found, value = fresh()  # the common case: no refresh lock taken
        if found:
            return value  # type: ignore[no-any-return]
        with self._lock:
            refresh = self._refreshing.setdefault(key, threading.Lock())
        with refresh:
            found, value = fresh()  # another thread refreshed it while this one waited
            if not found:
                value = read()
                with self._lock:
                    self._cache[key] = (time.monotonic(), value)
            return value  # type: ignore[no-any-return]

    @contextlib.contextmanager
    def choosing(self) -> Iterator[TargetChooser]:
        """The repairer's :class:`~bklib.repair.plan.TargetChooser`, held exclusively for the
        ``with`` block: Spark tasks share one repairer across threads, and a choice reads and
        updates the chooser's load counts."""
        with self._lock:
            yield self.chooser

    def registry(self) -> BookieRegistry:
        """Registered bookies, cached for ``registry_ttl`` seconds."""
        return self._cached("registry", lambda: list_bookies(self.store.zk, self.store.root))

    def writable_ids(self) -> list[str]:
        """Sorted writable bookies from :meth:`registry`: the candidates of the ensemble
        changes that recovery makes (``ClientContext.writable_source``)."""
        return sorted(self.registry().writable)

    def client_context(self, pool: BookieClientPool) -> ClientContext:
        """A client context whose ensemble changes take their candidates from the cached
        registry, not from a fresh read of every registration per ledger."""
        return ClientContext(self.store, pool, writable_source=self.writable_ids)

    def replication_enabled(self) -> bool:
        """``underreplication/disable`` absent; re-checked at most every ``registry_ttl``."""
        return self._cached("enabled", self.urm.is_replication_enabled)

    def credentials(self, md: LedgerMetadata) -> tuple[bytes, DigestType]:
        """``(password, digest type)`` of ledger ``md``: the settings' where given, else what
        its metadata says (:func:`~bklib.client.reader.resolve_credentials`)."""
        return resolve_credentials(md, self.settings.password, self.settings.digest_type)

    def copy_entries(
        self,
        md: LedgerMetadata,
        frag: FragmentWork,
        targets: Mapping[int, str],
        dead: Collection[str],
        pwd: bytes,
        dt: DigestType,
    ) -> CopyResult:
        """Copy the stripes of ``targets``' positions (position -> new bookie) of ``frag`` with
        the recovery-add flag (:func:`~bklib.client.replicator.copy_fragment`, BookKeeper's
        ``LedgerFragmentReplicator``), not reading from ``dead`` bookies; throttled by the rate
        limiter every copy of this repairer shares. Touches no metadata; raises BKError."""
        dm = digest_manager(md.ledger_id, dt, pwd)
        mk = master_key(pwd)

        async def run(pool: BookieClientPool) -> CopyResult:
            if self._limiter is None:  # created on the client's loop, shared by all copies
                self._limiter = RateLimiter(self.settings.rate)
            return await copy_fragment(
                pool,
                ledger_id=md.ledger_id,
                ensemble=frag.ensemble,
                ensemble_size=md.ensemble_size,
                write_quorum=md.write_quorum,
                first_entry_id=frag.first_entry_id,
                last_entry_id=frag.last_entry_id,
                targets=targets,
                dead=dead,
                digest=dm,
                master_key=mk,
                limiter=self._limiter,
                window=self.settings.window,
                protocol=self.settings.bookie_protocol,
            )

        return self.client.run(run)
