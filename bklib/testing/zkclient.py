"""A raw kazoo client for tests and test harnesses that poke at ZooKeeper itself (ACLs,
chroots, znodes bkaudit never writes). bkaudit's own code reaches metadata through
:func:`bklib.meta.stores.open_store` instead."""

from __future__ import annotations

import warnings

from kazoo.client import KazooClient

from bklib.meta.stores.zookeeper.client import new_client, start_client
from bklib.meta.stores.zookeeper.security import ZkAuth


def connect(
    hosts: str,
    *,
    timeout: float = 30.0,
    auth: ZkAuth = None,
    read_only: bool = False,
) -> KazooClient:
    """Start a kazoo client. ``hosts`` may carry a chroot (``h1:2181,h2:2181/chroot``);
    ``auth`` is ``user:password`` for ZooKeeper digest auth or a :class:`ZkAccess` (TLS,
    SASL, and CREATOR_ALL ACLs on every znode the client creates under ``zkEnableSecurity``).
    Raises :class:`~bklib.meta.stores.zookeeper.ZkSecurityError` for an untrusted certificate
    or rejected credentials, :class:`~bklib.errors.ZKError` when ZooKeeper cannot be
    reached."""
    client = new_client(hosts, auth, timeout=timeout, read_only=read_only)
    with warnings.catch_warnings():
        # A missing chroot is reported by require_cluster, naming the path, not as a warning.
        warnings.filterwarnings("ignore", message="No chroot path exists")
        start_client(client, hosts, auth, timeout)
    return client
