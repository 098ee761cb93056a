"""BookieId -> (host, port), the way BookKeeper's DefaultBookieAddressResolver does it.

A BookieId is opaque. Its address comes from the bookie's registration znode
(``<root>/available/<id>``, else ``<root>/available/readonly/<id>``), whose data is a
BookieServiceInfo with a "bookie-rpc" endpoint; empty data means a legacy registration whose id is
itself ``host:port``. An unregistered id ending in ``:0`` is parsed as ``host:port`` (Java does
that); with ``legacy_fallback`` any unregistered ``host:port`` id is tried the same way, so a
bookie whose registration is missing can still be reached (a down one then fails to connect,
which is the answer an auditor wants).

Blocking (the metadata store's calls); thread-safe. The asyncio pool calls it from an
executor thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

from kazoo.client import KazooClient

from bklib.errors import BookieHandleNotAvailableError, ClientClosedError, ZKError
from bklib.meta import paths
from bklib.meta.formats import decode_service_info
from bklib.meta.stores import KeyNotFound, MetadataStore, open_store
from bklib.meta.stores.zookeeper import as_store
from bklib.meta.stores.zookeeper.security import ZkAuth
from bklib.states import DEFAULT_LEDGERS_ROOT, parse_host_port

log = logging.getLogger(__name__)


def parse_legacy_bookie_id(bookie_id: str) -> tuple[str, int] | None:
    """``"host:port"`` -> (host, port) as Java's ``BookieSocketAddress(String)`` reads it;
    None if the id is not of that form (see :func:`bklib.states.parse_host_port`)."""
    return parse_host_port(bookie_id)


class BookieAddressResolver:
    """Resolves bookie ids through their registrations, with a cache refreshed on demand.

    ``zk`` is an open metadata store or a started KazooClient (not owned, not closed here), a
    store locator (``host:port[,host:port][/chroot]`` or ``oxia://host:port/namespace``; a
    session is opened on first use and closed by :meth:`close`) or None (no registry: ids
    must be ``host:port`` or be in ``addresses``).
    ``addresses`` pins ids to fixed addresses and wins over everything else. ``zk_auth``
    (digest ``user:password`` or a :class:`~bklib.meta.stores.zookeeper.security.ZkAccess`: TLS,
    SASL) is how a client started here reaches ZooKeeper: the same access as the job's
    metadata reads.
    """

    def __init__(
        self,
        zk: MetadataStore | KazooClient | str | None = None,
        *,
        ledgers_root: str = DEFAULT_LEDGERS_ROOT,
        addresses: Mapping[str, tuple[str, int]] | None = None,
        legacy_fallback: bool = True,
        zk_timeout: float = 10.0,
        zk_auth: ZkAuth = None,
    ) -> None:
        self.ledgers_root = ledgers_root.rstrip("/") or "/"
        self.legacy_fallback = legacy_fallback
        self.zk_timeout = zk_timeout
        self._static = dict(addresses or {})
        self.zk_auth = zk_auth
        self._connect_string = zk if isinstance(zk, str) else None
        self._zk: MetadataStore | None = (
            as_store(zk) if zk is not None and not isinstance(zk, str) else None
        )
        self._owns_zk = False
        self._cache: dict[str, tuple[str, int]] = {}
        self._lock = threading.Lock()
        self._closed = False

    @property
    def uses_zookeeper(self) -> bool:
        """True if resolving may block on ZooKeeper (callers on an event loop use an executor)."""
        return self._zk is not None or self._connect_string is not None

    @property
    def connect_string(self) -> str | None:
        """The connect string this resolver was built from, if any (a KazooClient gives None)."""
        return self._connect_string

    def _client(self, bookie_id: str) -> MetadataStore:
        with self._lock:
            if self._closed:
                raise ZKError("address resolver closed", bookie=bookie_id)
            if self._zk is None:
                assert self._connect_string is not None
                try:
                    client = open_store(
                        self._connect_string, timeout=self.zk_timeout, auth=self.zk_auth
                    )
                except ZKError as exc:
                    raise type(exc)(exc.reason, bookie=bookie_id) from exc
                self._zk, self._owns_zk = client, True
            return self._zk

    def _lookup(self, bookie_id: str) -> tuple[str, int] | None:
        """Address from the registration znodes; None if the bookie is not registered."""
        zk = self._client(bookie_id)
        available = paths.join(self.ledgers_root, "available")
        candidates = (
            paths.join(available, bookie_id),
            paths.join(available, "readonly", bookie_id),
        )
        for path in candidates:
            try:
                data, _ = zk.get(path)
            except KeyNotFound:
                continue
            except Exception as exc:
                raise ZKError(
                    f"cannot read registration: {exc!r}", bookie=bookie_id, path=path
                ) from exc
            if not data:
                # Legacy registration: the id is the address.
                legacy = parse_legacy_bookie_id(bookie_id)
                if legacy is None:
                    raise BookieHandleNotAvailableError(
                        "registration has no service info and the id is not host:port",
                        bookie=bookie_id,
                        path=path,
                    )
                return legacy
            try:
                return decode_service_info(data, bookie_id).rpc_address()
            except Exception as exc:
                raise BookieHandleNotAvailableError(
                    f"registration has no usable bookie-rpc endpoint: {exc}",
                    bookie=bookie_id,
                    path=path,
                ) from exc
        return None

    def resolve(self, bookie_id: str, *, refresh: bool = False) -> tuple[str, int]:
        """The (host, port) to connect to for ``bookie_id``.

        ``refresh`` skips the cache (the cached address failed). If ZooKeeper cannot be read, a
        cached address is still returned; otherwise ZKError. An id that resolves nowhere raises
        BookieHandleNotAvailableError (Java: BookieIdNotResolvedException).
        """
        if self._closed:
            raise ClientClosedError("address resolver closed", bookie=bookie_id)
        if bookie_id in self._static:
            return self._static[bookie_id]
        if not refresh:
            with self._lock:
                cached = self._cache.get(bookie_id)
            if cached is not None:
                return cached
        address: tuple[str, int] | None = None
        if self.uses_zookeeper:
            try:
                address = self._lookup(bookie_id)
            except ZKError:
                with self._lock:
                    cached = self._cache.get(bookie_id)
                if cached is None:
                    raise
                log.warning("bookie %s: ZooKeeper unreadable, using cached address", bookie_id)
                return cached
            if address is None and (self.legacy_fallback or bookie_id.endswith(":0")):
                address = parse_legacy_bookie_id(bookie_id)
        else:
            address = parse_legacy_bookie_id(bookie_id)
        if address is None:
            raise BookieHandleNotAvailableError(
                "bookie id not resolvable: not registered under "
                f"{paths.join(self.ledgers_root, 'available')} and not host:port",
                bookie=bookie_id,
            )
        with self._lock:
            self._cache[bookie_id] = address
        return address

    def invalidate(self, bookie_id: str | None = None) -> None:
        """Forget the cached address of ``bookie_id`` (or of every bookie)."""
        with self._lock:
            if bookie_id is None:
                self._cache.clear()
            else:
                self._cache.pop(bookie_id, None)

    def close(self) -> None:
        """Stop the ZooKeeper client if this resolver started it."""
        with self._lock:
            self._closed = True
            zk, owned = self._zk, self._owns_zk
            self._zk, self._owns_zk = None, False
        if zk is not None and owned:
            try:
                zk.close()
            except Exception as exc:  # noqa: BLE001 - closing must not mask the caller's outcome
                log.debug("closing ZooKeeper client: %s", exc)
