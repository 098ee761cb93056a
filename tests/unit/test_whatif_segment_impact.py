"""How :func:`bklib.audit.whatif.segment_impact` lists lost ranges when it cannot list them all:
the ``max_ranges`` cap, the 64-stripe limit on a partly lost piece, and ``max_ranges=0``. The
oracle tests in test_whatif.py pass a cap no case reaches; these pin the truncation rules."""

from __future__ import annotations

from bklib.audit.whatif import segment_impact

# E=3 WQ=2 AQ=2, index 1 already gone, index 0 fails: residue 0 (write set {0, 1}) has no
# replica left, residue 2 (write set {2, 0}) one.


def test_partly_lost_piece_lists_64_stripes_exactly() -> None:
    res = segment_impact(0, 192, 3, 2, 2, [0], {1: None})
    assert (res.below_aq_entries, res.lost_entries) == (129, 65)
    assert res.lost_ranges == tuple((x, x) for x in range(0, 193, 3))
    assert not res.truncated


def test_partly_lost_piece_past_64_stripes_is_truncated() -> None:
    res = segment_impact(0, 195, 3, 2, 2, [0], {1: None})
    assert (res.below_aq_entries, res.lost_entries) == (131, 66)  # counts stay complete
    assert res.lost_ranges == tuple((x, x) for x in range(0, 193, 3))
    assert res.truncated


def test_max_ranges_caps_the_listing() -> None:
    res = segment_impact(0, 192, 3, 2, 2, [0], {1: None}, 2)
    assert res.lost_ranges == ((0, 0), (3, 3)) and res.truncated
    assert res.lost_entries == 65


def test_max_ranges_zero_lists_nothing_and_says_so() -> None:
    res = segment_impact(0, 192, 3, 2, 2, [0], {1: None}, 0)
    assert res.lost_ranges == () and res.truncated and res.lost
    whole = segment_impact(10, 5000, 3, 2, 1, [0, 1, 2], {}, 0)
    assert whole.lost_ranges == () and whole.truncated and whole.lost_entries == 4991


def test_wholly_lost_piece_is_one_run() -> None:
    res = segment_impact(10, 5000, 3, 2, 1, [0, 1, 2], {})
    assert res.lost_ranges == ((10, 5000),) and not res.truncated
    assert (res.below_aq_entries, res.lost_entries) == (4991, 4991)


def test_partial_gap_pieces() -> None:
    # Index 1 lacks 20..29; index 0 fails: residue 1 (write set {1, 2}) does not hold on 0,
    # residue 0 ({0, 1}) is lost there, residue 2 ({2, 0}) keeps index 2.
    res = segment_impact(0, 99, 3, 2, 1, [0], {1: [(20, 29)]})
    assert res.lost_ranges == ((21, 21), (24, 24), (27, 27)) and not res.truncated
    # existing: only entry 12 (write set {0, 1}) lacks both replicas now.
    now = segment_impact(0, 99, 4, 2, 1, [], {0: [(10, 12)], 1: [(11, 40)]}, existing=True)
    assert now.lost_ranges == ((12, 12),) and now.lost_entries == 1
