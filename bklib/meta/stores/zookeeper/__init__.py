"""The metadata store on ZooKeeper, one job per module:

- :mod:`.store`: :class:`ZooKeeperStore`, the :class:`~bklib.meta.stores.base.MetadataStore`
  on one kazoo session, and :func:`connect_zookeeper`;
- :mod:`.client`: kazoo sessions as bklib makes them (:func:`~.client.new_client`,
  :func:`~.client.start_client`);
- :mod:`.bulk`: the pipelined reader (and the scale harness's writer) of the metadata scan;
- :mod:`.security`: TLS, SASL and JAAS files, digest auth, ACLs and their flags
  (:class:`ZkAccess`, :data:`ZkAuth`);
- :mod:`.budget`: the process's request budget (``--zk-rate``, docs/zookeeper-budget.md);
- :mod:`.handler`: kazoo's threading handler with one ``poll`` per wait;
- :mod:`.connect_string`: the one connect-string parser (``h1:2181,[::1]:2182/chroot``).

The modules depend on one another in that order, from the store down; none imports the
package itself, which re-exports what most callers need.
"""

from __future__ import annotations

from bklib.meta.stores.zookeeper.security import ZkAccess, ZkAuth, ZkSecurityError
from bklib.meta.stores.zookeeper.store import ZooKeeperStore, as_store, connect_zookeeper

__all__ = [
    "ZkAccess",
    "ZkAuth",
    "ZkSecurityError",
    "ZooKeeperStore",
    "as_store",
    "connect_zookeeper",
]
