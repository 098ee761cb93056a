"""Path arithmetic of BookKeeper's (Long)HierarchicalLedgerManager and
ZkLedgerUnderreplicationManager."""

import pytest

from bklib.meta import paths
from bklib.meta.paths import LayoutKind


@pytest.mark.parametrize(
    ("ledger_id", "hier", "long"),
    [
        (1, "/ledgers/00/0000/L0001", "/ledgers/000/0000/0000/0000/L0001"),
        (123456789, "/ledgers/01/2345/L6789", "/ledgers/000/0000/0001/2345/L6789"),
        (2147483646, "/ledgers/21/4748/L3646", "/ledgers/000/0000/0021/4748/L3646"),
        (2147483647, "/ledgers/000/0000/0021/4748/L3647", "/ledgers/000/0000/0021/4748/L3647"),
        (4294967296, "/ledgers/000/0000/0042/9496/L7296", "/ledgers/000/0000/0042/9496/L7296"),
    ],
)
def test_ledger_paths(ledger_id, hier, long):
    assert paths.ledger_path("/ledgers", ledger_id) == hier
    assert paths.ledger_path("/ledgers", ledger_id, LayoutKind.LONG_HIERARCHICAL) == long
    assert paths.ledger_id_from_path("/ledgers", hier) == ledger_id
    assert paths.ledger_id_from_path("/ledgers", long) == ledger_id


def test_flat_path_and_parse():
    assert paths.ledger_path("/ledgers", 5, LayoutKind.FLAT) == "/ledgers/L0000000005"
    assert paths.ledger_id_from_path("/ledgers", "/ledgers/L0000000005") == 5


def test_non_ledger_paths_do_not_parse():
    assert paths.ledger_id_from_path("/ledgers", "/ledgers/available") is None
    assert paths.ledger_id_from_path("/ledgers", "/ledgers/00/0000/Lxx01") is None
    assert paths.ledger_id_from_path("/ledgers", "/ledgers/00/L0001") is None


def test_negative_id_rejected():
    with pytest.raises(ValueError):
        paths.ledger_path("/ledgers", -1)


def test_special_znodes():
    for name in ("available", "cookies", "LAYOUT", "INSTANCEID", "underreplication", "idgen",
                 "idgen-long", "ID-0000000001"):  # fmt: skip
        assert paths.is_special_znode(name)
    assert not paths.is_special_znode("00")


def test_under_replication_paths():
    assert (
        paths.ur_ledger_path("/ledgers", 5)
        == "/ledgers/underreplication/ledgers/0000/0000/0000/0005/urL0000000005"
    )
    assert (
        paths.ur_ledger_path("/ledgers", 4294967296)
        == "/ledgers/underreplication/ledgers/0000/0001/0000/0000/urL4294967296"
    )
    assert paths.ur_lock_path("/ledgers", 5) == "/ledgers/underreplication/locks/urL0000000005"


def test_layout_kind_from_factory():
    assert LayoutKind.from_factory(paths.HIERARCHICAL_FACTORY) is LayoutKind.HIERARCHICAL
    assert LayoutKind.from_factory("flat") is LayoutKind.FLAT
    with pytest.raises(ValueError):
        LayoutKind.from_factory("org.example.Unknown")
