"""kazoo sessions as bklib makes them: the connect string read by our one parser, the access's
TLS, SASL, digest and ACLs, the process's request budget and the one-poll handler; started
so that a security failure raises at once instead of an endless reconnect.
"""

from __future__ import annotations

import contextlib
import logging
import os

from kazoo.client import KazooClient
from kazoo.exceptions import AuthFailedError, KazooException
from kazoo.handlers.threading import KazooTimeoutError

from bklib.errors import ZKError
from bklib.meta.stores.reachability import CONNECT_TIMEOUT, check_reachable
from bklib.meta.stores.zookeeper.budget import BudgetedKazooClient
from bklib.meta.stores.zookeeper.bulk import BulkReader
from bklib.meta.stores.zookeeper.connect_string import parse_connect_string
from bklib.meta.stores.zookeeper.handler import PollingHandler
from bklib.meta.stores.zookeeper.security import ZkAccess, ZkAuth, ZkSecurityError, probe_tls

__all__ = ["new_client", "probe_sasl", "start_client"]

log = logging.getLogger(__name__)


def new_client(
    hosts: str, auth: ZkAuth = None, *, timeout: float = 30.0, read_only: bool = False
) -> KazooClient:
    """An unstarted KazooClient for ``hosts`` with ``auth``'s TLS, SASL, digest and default
    ACL. Start it with :func:`start_client`. Raises
    :class:`~bklib.meta.stores.zookeeper.connect_string.ConnectStringError` for a malformed
    connect string."""
    access = ZkAccess.of(auth)
    if access.sasl is not None and access.sasl.keytab:
        # GSSAPI reads the client keytab from the environment (MIT krb5); an explicit
        # setting wins.
        os.environ.setdefault("KRB5_CLIENT_KTNAME", access.sasl.keytab)
    # Every request of every session draws from the process's ZooKeeper budget (budget.py),
    # and its connection thread waits through one poll per wait (handler.py). kazoo gets the
    # canonical connect string, so it reads the servers and chroot the bulk reader does.
    return BudgetedKazooClient(
        hosts=str(parse_connect_string(hosts)),
        timeout=timeout,
        read_only=read_only,
        handler=PollingHandler(),
        **access.kazoo_kwargs(),
    )


_SASL_PROBED: set[tuple[str, ZkAccess]] = set()
"""(hosts, access) whose SASL exchange succeeded in this process: probed once, not per
client."""


def probe_sasl(hosts: str, access: ZkAccess, timeout: float = 10.0) -> None:
    """Run the SASL exchange once on a short session of our own. Raises
    :class:`ZkSecurityError` when ZooKeeper rejects the credentials: kazoo would die in its
    connection thread (ZooKeeper 3.9 answers SessionClosedRequireSasl) and then retry. Any
    other failure is left to kazoo's own connection retries."""
    if access.sasl is None or (hosts, access) in _SASL_PROBED:
        return
    reader = BulkReader(hosts, auth=access, session_timeout_ms=max(int(timeout * 1000), 4000))
    try:
        reader.connect(timeout)
    except ZkSecurityError:
        raise
    except (ZKError, OSError) as exc:
        log.debug("SASL probe of %s inconclusive: %s", hosts, exc)
        return
    finally:
        reader.close()
    _SASL_PROBED.add((hosts, access))


def start_client(
    client: KazooClient, hosts: str, auth: ZkAuth = None, timeout: float = 30.0
) -> None:
    """Start ``client`` (from :func:`new_client`) and make sure the security holds: a TLS
    certificate problem or rejected SASL credentials raise :class:`ZkSecurityError` at once
    instead of an endless reconnect, a name not found, a refused or silent port
    :class:`~bklib.meta.stores.reachability.Unreachable` within seconds (kazoo would retry
    them for ``timeout``, then say only "Connection time-out"), anything else
    :class:`~bklib.errors.ZKError`. A failed client is stopped and closed."""
    access = ZkAccess.of(auth)
    try:
        servers = parse_connect_string(hosts).servers
        check_reachable(servers, "ZooKeeper", timeout=min(timeout, CONNECT_TIMEOUT))
        if access.tls is not None:
            probe_tls(hosts, access.tls, timeout)
        probe_sasl(hosts, access, timeout)
        client.start(timeout=timeout)
        if access.sasl is not None:
            # kazoo reports CONNECTED before the SASL exchange; a request after it fails
            # with AuthFailedError if the server rejected the credentials.
            client.exists("/")
    except Exception as exc:
        with contextlib.suppress(Exception):
            client.stop()
            client.close()
        if isinstance(exc, ZKError):
            raise
        if isinstance(exc, AuthFailedError):
            who = access.sasl.describe() if access.sasl else "authentication"
            raise ZkSecurityError(f"ZooKeeper at {hosts} rejected {who}") from None
        reason = str(exc) or type(exc).__name__
        if isinstance(exc, KazooException) and not str(exc):
            reason = type(exc).__name__
        if isinstance(exc, KazooTimeoutError):  # a server took the TCP connection: not ZK?
            reason = (
                f"no ZooKeeper session within {timeout:g}s, though the address accepts "
                "connections (is it ZooKeeper's client port, and is ZooKeeper serving?)"
            )
        raise ZKError(f"cannot connect to ZooKeeper at {hosts}: {reason}") from exc
