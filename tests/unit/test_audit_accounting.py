"""Scan accounting: every difference between announced and scanned ledgers needs a reason."""

from __future__ import annotations

from bklib.audit.accounting import account_scan, directory_of, scanned_per_directory
from bklib.meta.store import LeafDir
from bklib.states import CountKey

A = LeafDir("/ledgers/00/0000", "000000", 3, cversion=7)
B = LeafDir("/ledgers/00/0001", "000001", 2, cversion=4)


def test_directory_of_a_ledger_znode() -> None:
    assert directory_of("/ledgers/00/0000/L0003") == "/ledgers/00/0000"
    assert directory_of("/ledgers/L0000000005") == "/ledgers"
    assert directory_of("/L1") == "/"
    per_dir = scanned_per_directory(["/ledgers/00/0000/L0001", "/ledgers/00/0000/L0002", None])
    assert per_dir == {"/ledgers/00/0000": 2}


def test_unchanged_directories_must_match_exactly() -> None:
    ok = account_scan([A, B], {A.path: 7, B.path: 4}, {A.path: 3, B.path: 2})
    assert ok.complete and ok.expected == ok.scanned == 5 and ok.changed_dirs == ()
    lost = account_scan([A, B], {A.path: 7, B.path: 4}, {A.path: 3, B.path: 1})
    assert not lost.complete
    assert (lost.unaccounted, lost.unaccounted_dirs) == (1, (B.path,))
    assert lost.counts() == {
        CountKey.LEDGERS_EXPECTED: 5,
        CountKey.LEDGER_DIRS_CHANGED: 0,
        CountKey.LEDGERS_UNACCOUNTED: 1,
    }
    assert "1 ledgers unaccounted for in unchanged directories /ledgers/00/0001" in (
        lost.describe()
    )
    extra = account_scan([A], {A.path: 7}, {A.path: 4})
    assert extra.unaccounted == 1  # found more than announced, with no change: also a bug


def test_a_changed_or_deleted_directory_explains_its_difference() -> None:
    moved = account_scan([A, B], {A.path: 8, B.path: None}, {A.path: 5})
    assert moved.complete and set(moved.changed_dirs) == {A.path, B.path}
    assert (moved.expected, moved.scanned) == (5, 5)


def test_unknown_versions_and_foreign_directories() -> None:
    unplanned = LeafDir("/ledgers/00/0002", "000002", 1)  # no version read: cannot be proved
    acc = account_scan([unplanned], {unplanned.path: 3}, {})
    assert acc.complete and acc.changed_dirs == (unplanned.path,)
    foreign = account_scan([A], {A.path: 7}, {A.path: 3, "/ledgers/99/9999": 2})
    assert (foreign.unaccounted, foreign.unaccounted_dirs) == (2, ("/ledgers/99/9999",))
