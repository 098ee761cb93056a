"""Metadata stores: the interface (:mod:`.base`) and its ZooKeeper and Oxia implementations.

A *locator* says which store and where, as one picklable string that travels to Spark
executors: a ZooKeeper connect string (``h1:2181,h2:2181/chroot``) or
``oxia://HOST:PORT/NAMESPACE`` (from ``--metadata-uri metadata-store:oxia://...``, see
:mod:`bklib.meta.uri`). :func:`open_store` turns it into a session.
"""

from __future__ import annotations

from bklib.meta.oxia_security import OxiaAccess
from bklib.meta.stores.base import (
    ANY_VERSION,
    BadVersion,
    KeyExists,
    KeyNotFound,
    KeyStateError,
    MetadataStore,
    NotEmpty,
    SessionState,
    Stat,
    StoreUnavailable,
    ValueRead,
)
from bklib.meta.stores.zookeeper import ZkAuth, connect_zookeeper

__all__ = [
    "ANY_VERSION",
    "OXIA_PREFIX",
    "BadVersion",
    "KeyExists",
    "KeyNotFound",
    "KeyStateError",
    "MetadataStore",
    "NotEmpty",
    "SessionState",
    "Stat",
    "StoreUnavailable",
    "ValueRead",
    "is_oxia",
    "open_store",
    "oxia_locator",
    "parse_oxia_locator",
]

OXIA_PREFIX = "oxia://"


def is_oxia(locator: str) -> bool:
    """Whether ``locator`` names an Oxia namespace rather than a ZooKeeper ensemble."""
    return locator.startswith(OXIA_PREFIX)


def oxia_locator(address: str, namespace: str) -> str:
    """``oxia://ADDRESS/NAMESPACE``."""
    return f"{OXIA_PREFIX}{address}/{namespace}"


def parse_oxia_locator(locator: str) -> tuple[str, str]:
    """``oxia://h:6648/ns`` -> (``h:6648``, ``ns``); the namespace defaults to ``default``,
    as Pulsar's Oxia store does."""
    rest = locator[len(OXIA_PREFIX) :]
    address, _, namespace = rest.partition("/")
    return address, namespace.strip("/") or "default"


def open_store(
    locator: str,
    *,
    auth: ZkAuth = None,
    timeout: float = 30.0,
    read_only: bool = False,
    session_timeout: float | None = None,
) -> MetadataStore:
    """A session on the store ``locator`` names, connected within ``timeout`` seconds.
    ``session_timeout`` (default: ``timeout``) is how long the store keeps the session, and
    its ephemeral keys, after the client goes silent. ZooKeeper takes ``auth`` (digest or a
    :class:`~bklib.meta.stores.zookeeper.ZkAccess`), Oxia an
    :class:`~bklib.meta.oxia_security.OxiaAccess` (TLS and a token; any other ``auth`` means
    plain text, the ZooKeeper flags being refused on Oxia before this); its client is the
    ``oxia`` extra. Raises :class:`StoreUnavailable` (a ZKError) with one line when
    the store cannot be reached."""
    session = session_timeout if session_timeout is not None else timeout
    if is_oxia(locator):
        from bklib.meta.stores.oxia import connect_oxia

        address, namespace = parse_oxia_locator(locator)
        # The Oxia client heartbeats every 2 s at least: a shorter session cannot live.
        session_ms = max(2_000, int(session * 1000))
        access = auth if isinstance(auth, OxiaAccess) else None
        return connect_oxia(
            address, namespace, timeout=timeout, session_timeout_ms=session_ms, access=access
        )
    return connect_zookeeper(
        locator, timeout=timeout, auth=auth, read_only=read_only, session_timeout=session
    )
