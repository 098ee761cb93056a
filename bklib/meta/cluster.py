"""What makes a ZooKeeper path a BookKeeper cluster, and which driver laid it out (pure).

Two drivers lay out the same tree under a ledgers root:

* BookKeeper's own (``ZKMetadataDriverBase``) records its ledger manager in ``LAYOUT``
  (``AbstractZkLedgerManagerFactory`` writes it on first use);
* Pulsar's (``org.apache.pulsar.metadata.bookkeeper.AbstractMetadataDriver``), used whenever
  bookies or brokers are given ``metadataServiceUri=metadata-store:...``, never writes
  ``LAYOUT``: it hard-codes the hierarchical manager (``PulsarLedgerManager`` keeps ledgers at
  ``StringUtils.getHybridHierarchicalLedgerPath``). ``BookKeeperAdmin.format``, which
  ``PulsarClusterMetadataSetup`` runs, leaves ``INSTANCEID`` and ``available``.

A root with neither ``LAYOUT`` nor Pulsar's ``INSTANCEID`` is no cluster: a typo in a chroot
or ``--ledgers-root`` must not audit an empty tree as a healthy cluster. ``idgen`` is not
required, although the first ledger creates it: a freshly set-up Pulsar cluster has none yet.
See docs/pulsar.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from bklib.errors import ClusterNotFoundError
from bklib.meta import paths
from bklib.meta.paths import LayoutKind

__all__ = ["ClusterLayout", "MetadataDriver", "recognise_cluster"]

LAYOUT = paths.LAYOUT_ZNODE
INSTANCEID = paths.INSTANCEID_ZNODE
AVAILABLE = paths.AVAILABLE_ZNODE


class MetadataDriver(Enum):
    """Which driver's conventions the tree follows."""

    BOOKKEEPER = "bookkeeper"
    """``LAYOUT`` present; Auditor election under ``underreplication/auditorelection``."""
    PULSAR = "pulsar"
    """No ``LAYOUT``; hierarchical; Auditor leader at ``underreplication/leader``."""


@dataclass(frozen=True)
class ClusterLayout:
    """A recognised cluster: its driver, and the ledger manager its ledgers are laid out by
    (None: read ``LAYOUT``)."""

    driver: MetadataDriver
    kind: LayoutKind | None


def recognise_cluster(root: str, exists: Callable[[str], bool], where: str = "") -> ClusterLayout:
    """Decide from which znodes exist under ``root`` whether it is a cluster, and whose.

    ``exists(path)`` answers for one path (I/O errors propagate). Raises
    :class:`~bklib.errors.ClusterNotFoundError` naming the missing znode; ``where`` (the
    connect string) prefixes the root in the message.
    """

    def missing(what: str, path: str) -> ClusterNotFoundError:
        return ClusterNotFoundError(f"no BookKeeper cluster at {where}{root}: {what} ({path})")

    if not exists(root):
        raise missing("ledgers root missing", root)
    layout = paths.join(root, LAYOUT)
    if exists(layout):
        found = ClusterLayout(MetadataDriver.BOOKKEEPER, None)
    elif exists(paths.join(root, INSTANCEID)):
        found = ClusterLayout(MetadataDriver.PULSAR, LayoutKind.HIERARCHICAL)
    else:
        raise missing(f"{LAYOUT} znode missing, and no {INSTANCEID} of Pulsar's driver", layout)
    available = paths.join(root, AVAILABLE)
    if not exists(available):
        raise missing(f"{AVAILABLE} znode missing", available)
    return found
