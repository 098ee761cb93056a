"""bklib.meta.cluster: which trees are clusters, and whose driver laid them out (no I/O)."""

from __future__ import annotations

import pytest

from bklib.errors import ClusterNotFoundError
from bklib.meta.cluster import ClusterLayout, MetadataDriver, recognise_cluster
from bklib.meta.paths import LayoutKind

# What the drivers leave: BookKeeper's `initnewcluster`, Pulsar's `BookKeeperAdmin.format`
# (PulsarClusterMetadataSetup), and the same after bookies and the first ledger.
BOOKKEEPER = {"/ledgers", "/ledgers/LAYOUT", "/ledgers/INSTANCEID", "/ledgers/available"}
PULSAR_FRESH = {"/ledgers", "/ledgers/INSTANCEID", "/ledgers/available"}
PULSAR_USED = PULSAR_FRESH | {"/ledgers/cookies", "/ledgers/idgen", "/ledgers/00"}


def _recognise(tree: set[str], root: str = "/ledgers") -> ClusterLayout:
    return recognise_cluster(root, tree.__contains__, "h:2181")


def test_bookkeepers_layout_is_read_from_layout() -> None:
    assert _recognise(BOOKKEEPER) == ClusterLayout(MetadataDriver.BOOKKEEPER, None)


@pytest.mark.parametrize("tree", [PULSAR_FRESH, PULSAR_USED])
def test_pulsars_driver_is_hierarchical_without_layout(tree: set[str]) -> None:
    assert _recognise(tree) == ClusterLayout(MetadataDriver.PULSAR, LayoutKind.HIERARCHICAL)


@pytest.mark.parametrize(
    ("tree", "root", "message"),
    [
        (set(), "/ledgers", "h:2181/ledgers: ledgers root missing (/ledgers)"),
        # A typo'd chroot or an unrelated node: neither driver's marker.
        ({"/nope"}, "/nope", "LAYOUT znode missing, and no INSTANCEID of Pulsar's driver"),
        ({"/x", "/x/available", "/x/idgen"}, "/x", "(/x/LAYOUT)"),
        ({"/x", "/x/LAYOUT"}, "/x", "available znode missing (/x/available)"),
        ({"/x", "/x/INSTANCEID"}, "/x", "available znode missing (/x/available)"),
    ],
)
def test_anything_else_fails_closed_naming_the_znode(
    tree: set[str], root: str, message: str
) -> None:
    with pytest.raises(ClusterNotFoundError) as exc:
        _recognise(tree, root)
    assert message in str(exc.value) and "\n" not in str(exc.value)
