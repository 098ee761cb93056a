"""AvailabilityOfEntriesOfLedger bytes and missing-stripe arithmetic."""

from __future__ import annotations

import pickle
import random
import struct
import time

import pytest

from bklib.availability import (
    HEADER_SIZE,
    AvailabilityFormatError,
    EntryRuns,
    decode,
    encode,
    from_entry_ids,
)
from bklib.errors import IncorrectParameterError
from bklib.quorum import write_set


def _header(n: int, version: int = 0) -> bytes:
    return struct.pack(">ii", version, n) + bytes(56)


def _group(first: int, last: int, size: int, period: int) -> bytes:
    return struct.pack(">qqii", first, last, size, period)


# ---- encoding, byte for byte ------------------------------------------------------------------


def test_entry_runs_of_1_2_4_5_7_8_encode_byte_for_byte() -> None:
    data = encode(from_entry_ids([1, 2, 4, 5, 7, 8]))
    expected = bytes.fromhex("00000000 00000003") + bytes(56)
    expected += bytes.fromhex("0000000000000001 0000000000000001 00000002 00000000")
    expected += bytes.fromhex("0000000000000004 0000000000000004 00000002 00000000")
    expected += bytes.fromhex("0000000000000007 0000000000000007 00000002 00000000")
    assert len(data) == 136
    assert data == expected
    runs = decode(data)
    assert list(runs.runs()) == [(1, 2), (4, 5), (7, 8)]
    assert list(runs.iter_ids()) == [1, 2, 4, 5, 7, 8]


def test_equal_sized_runs_are_never_merged_into_periodic_groups() -> None:
    # Java's encoder opens each group with last == first, so (1,2),(4,5),(7,8) are not one
    # periodic group even though they share size 2 and period 3.
    data = from_entry_ids(range(0, 3000, 3)).encode()
    assert len(data) == HEADER_SIZE + 24 * 1000
    assert data[HEADER_SIZE + 24 : HEADER_SIZE + 48] == _group(3, 3, 1, 0)


def test_empty_ledger_is_bare_header() -> None:
    data = encode(from_entry_ids([]))
    assert data == _header(0)
    assert len(data) == 64
    empty = decode(data)
    assert empty.count() == 0 and not empty and empty.num_runs == 0
    assert empty.first_id() is None and empty.last_id() is None


def test_unsorted_and_duplicate_input_encodes_like_sorted() -> None:
    ids = [8, 1, 2, 2, 7, 5, 4, 1, 8]
    assert from_entry_ids(ids) == from_entry_ids([1, 2, 4, 5, 7, 8])
    assert from_entry_ids([1, 1, 2, 3, 3, 9]) == EntryRuns([(1, 3), (9, 9)])
    assert EntryRuns([(5, 9), (0, 2), (3, 4), (7, 12), (20, 20)]) == EntryRuns([(0, 12), (20, 20)])


def test_single_long_run() -> None:
    data = EntryRuns([(0, 999_999)]).encode()
    assert data == _header(1) + _group(0, 0, 1_000_000, 0)


def test_run_longer_than_java_int_is_split_and_roundtrips() -> None:
    runs = EntryRuns([(10, 10 + 2**31 + 5)])
    data = encode(runs)
    assert data[:8] == struct.pack(">ii", 0, 2)
    assert decode(data) == runs
    assert runs.count() == 2**31 + 6


def test_negative_ids_rejected_on_build() -> None:
    with pytest.raises(IncorrectParameterError):
        from_entry_ids([0, -1])
    with pytest.raises(IncorrectParameterError):
        EntryRuns([(3, 2)])


# ---- decoding ---------------------------------------------------------------------------------


def test_decode_periodic_group() -> None:
    runs = decode(_header(1) + _group(0, 20, 2, 10))
    assert list(runs.iter_ids()) == [0, 1, 10, 11, 20, 21]
    assert runs.count() == 6  # ((last - first) / period + 1) * size


def test_decode_overlapping_and_touching_sequences_merge() -> None:
    assert list(decode(_header(1) + _group(0, 10, 7, 5)).runs()) == [(0, 16)]
    assert list(decode(_header(1) + _group(4, 10, 2, 2)).runs()) == [(4, 11)]


def test_decode_single_sequence_ignores_period() -> None:
    assert list(decode(_header(1) + _group(5, 5, 3, 7)).runs()) == [(5, 7)]


def test_decode_mixed_groups_and_adjacent_groups_merge() -> None:
    data = _header(3) + _group(0, 4, 1, 2) + _group(5, 5, 3, 0) + _group(100, 100, 1, 0)
    runs = decode(data)
    assert list(runs.runs()) == [(0, 0), (2, 2), (4, 7), (100, 100)]
    assert runs.count() == 7


def test_decode_ignores_reserved_header_bytes() -> None:
    data = struct.pack(">ii", 0, 1) + b"\xff" * 56 + _group(3, 3, 1, 0)
    assert list(decode(data).runs()) == [(3, 3)]


def test_decode_accepts_buffer_types() -> None:
    data = encode(from_entry_ids([1, 2, 3]))
    assert decode(bytearray(data)) == decode(memoryview(data)) == decode(data)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "shorter"),
        (_header(0)[:63], "shorter"),
        (_header(0, version=1), "unsupported availability header version 1"),
        (_header(0, version=-1), "invalid availability header version"),
        (_header(-1), "negative"),
        (_header(1), "need 88"),
        (_header(1) + _group(1, 1, 1, 0)[:23], "need 88"),
        (_header(0) + b"\0", "need 64"),
        (_header(1) + _group(1, 1, 1, 0) + b"\0" * 24, "need 88"),
        (_header(1) + _group(-1, -1, 1, 0), "invalid fields"),
        (_header(1) + _group(5, 4, 1, 0), "invalid fields"),
        (_header(1) + _group(5, 5, 0, 0), "invalid fields"),
        (_header(1) + _group(5, 5, -3, 0), "invalid fields"),
        (_header(1) + _group(5, 9, 1, -2), "invalid fields"),
        (_header(1) + _group(5, 9, 1, 0), "multiple of the period"),
        (_header(1) + _group(5, 9, 1, 3), "multiple of the period"),
        (_header(2) + _group(5, 5, 3, 0) + _group(7, 7, 1, 0), "disjoint"),
        (_header(2) + _group(9, 9, 1, 0) + _group(2, 2, 1, 0), "disjoint"),
        (_header(2) + _group(9, 9, 1, 0) + _group(9, 9, 1, 0), "disjoint"),
        (_header(1) + _group(2**63 - 2, 2**63 - 2, 5, 0), "beyond"),
    ],
)
def test_decode_rejects_malformed(data: bytes, message: str) -> None:
    with pytest.raises(AvailabilityFormatError, match=message):
        decode(data)


def test_format_error_is_value_error() -> None:
    with pytest.raises(ValueError):
        decode(b"\0" * 10)


def test_decode_bounds_periodic_expansion() -> None:
    bomb = _header(1) + _group(0, 2 * 10**12, 1, 2)
    t0 = time.perf_counter()
    with pytest.raises(AvailabilityFormatError, match="more than"):
        decode(bomb)
    with pytest.raises(AvailabilityFormatError, match="more than 10 runs"):
        decode(_header(1) + _group(0, 40, 1, 2), max_runs=10)
    assert time.perf_counter() - t0 < 1.0
    # A contiguous periodic group of any length costs one run.
    assert decode(_header(1) + _group(0, 2 * 10**12, 2, 2)).count() == 2 * 10**12 + 2


def test_roundtrip_random_sets() -> None:
    rng = random.Random(5)
    for _ in range(300):
        ids = {rng.randrange(200) for _ in range(rng.randrange(120))}
        runs = from_entry_ids(ids)
        assert decode(encode(runs)) == runs
        assert list(runs.iter_ids()) == sorted(ids)
        assert runs.count() == len(ids)


# ---- queries ----------------------------------------------------------------------------------


def test_queries_match_python_sets() -> None:
    rng = random.Random(11)
    for _ in range(400):
        ids = {rng.randrange(150) for _ in range(rng.randrange(100))}
        runs = from_entry_ids(sorted(ids) if rng.random() < 0.5 else list(ids))
        for x in range(-2, 155):
            assert runs.contains(x) == (x in ids)
            assert (x in runs) == (x in ids)
        for _ in range(20):
            a = rng.randint(-5, 155)
            b = a + rng.randint(-3, 80)
            assert runs.count_in(a, b) == sum(1 for x in ids if a <= x <= b)
            gaps = list(runs.gaps(max(a, 0), b))
            holes = [x for x in range(max(a, 0), b + 1) if x not in ids]
            assert [x for g0, g1 in gaps for x in range(g0, g1 + 1)] == holes
        assert runs.first_id() == (min(ids) if ids else None)
        assert runs.last_id() == (max(ids) if ids else None)


def test_missing_checklist_item_19() -> None:
    # docs/safety-rules.md scenario 19. Closed ledger E=3, WQ=3, AQ=2, entries 0..5, one segment.
    full = from_entry_ids(range(6))
    lacks_1 = from_entry_ids([0, 2, 3, 4, 5])
    for idx in range(3):
        assert full.missing_stripe_count(idx, 0, 5, 3, 3) == 0
        assert lacks_1.missing_stripe_entries(idx, 0, 5, 3, 3) == [1]
        assert lacks_1.missing_from_stripe(idx, 0, 5, 3, 3) == [(1, 1)]
    # NoSuchLedger is an empty list: every expected entry is missing.
    none = from_entry_ids([])
    assert none.missing_stripe_count(0, 0, 5, 3, 3) == 6
    assert none.missing_from_stripe(0, 0, 5, 3, 3) == [(0, 5)]
    # Entries beyond lastEntryId (a stray tail) are ignored.
    extra = from_entry_ids([0, 1, 2, 3, 4, 5, 14])
    assert extra.missing_stripe_count(0, 0, 5, 3, 3) == 0


def test_missing_only_counts_the_bookies_own_stripe() -> None:
    # E=3, WQ=2: index 0 stores {0, 2, 3, 5, 6, 8}; it holds 0, 2, 3 only.
    runs = from_entry_ids([0, 2, 3])
    assert runs.missing_stripe_entries(0, 0, 8, 3, 2) == [5, 6, 8]
    assert runs.missing_stripe_count(0, 0, 8, 3, 2) == 3
    assert runs.missing_from_stripe(0, 0, 8, 3, 2) == [(5, 8)]
    assert runs.missing_stripe_entries(0, 0, 8, 3, 2, limit=2) == [5, 6]
    assert runs.missing_stripe_entries(0, 0, 8, 3, 2, limit=0) == []
    # Entry 1 is absent but not on index 0's stripe.
    assert runs.missing_stripe_count(0, 0, 3, 3, 2) == 0
    assert runs.missing_from_stripe(0, 0, 3, 3, 2) == []
    with pytest.raises(IncorrectParameterError):
        runs.missing_stripe_entries(0, 0, 8, 3, 2, limit=-1)


def test_missing_empty_range_and_validation() -> None:
    runs = from_entry_ids([1, 2])
    assert runs.missing_stripe_count(0, 5, 4, 3, 2) == 0
    assert runs.missing_from_stripe(0, 5, 4, 3, 2) == []
    assert runs.missing_stripe_entries(0, 5, 4, 3, 2) == []
    for args in [(3, 0, 5, 3, 2), (0, -1, 5, 3, 2), (0, 0, 5, 2, 3)]:
        with pytest.raises(IncorrectParameterError):
            runs.missing_stripe_count(*args)


def _brute_missing(ids: set[int], idx: int, first: int, last: int, e: int, wq: int) -> list[int]:
    return [x for x in range(first, last + 1) if idx in write_set(x, e, wq) and x not in ids]


def _brute_ranges(missing: list[int], ids: set[int]) -> list[tuple[int, int]]:
    # Group missing stripe entries that no present id separates.
    out: list[tuple[int, int]] = []
    for x in missing:
        if out and not any(out[-1][1] < y < x for y in ids):
            out[-1] = (out[-1][0], x)
        else:
            out.append((x, x))
    return out


def test_missing_matches_brute_force() -> None:
    rng = random.Random(424242)
    for _ in range(2500):
        e = rng.randint(1, 8)
        wq = rng.randint(1, e)
        idx = rng.randrange(e)
        span = rng.randint(1, 120)
        density = rng.random()
        ids = {x for x in range(span) if rng.random() < density}
        # Sometimes build from runs, to exercise long runs and merging.
        if rng.random() < 0.3:
            pairs = []
            for _ in range(rng.randint(0, 6)):
                s = rng.randrange(span)
                pairs.append((s, s + rng.randint(0, 30)))
            ids = {x for s, t in pairs for x in range(s, t + 1)}
            runs = EntryRuns(pairs)
        else:
            runs = from_entry_ids(ids)
        first = rng.randint(0, span)
        last = first + rng.randint(-3, span)
        expected = _brute_missing(ids, idx, first, last, e, wq)
        assert runs.missing_stripe_entries(idx, first, last, e, wq) == expected
        assert runs.missing_stripe_count(idx, first, last, e, wq) == len(expected)
        limit = rng.randint(0, 5)
        assert runs.missing_stripe_entries(idx, first, last, e, wq, limit=limit) == expected[:limit]
        assert runs.missing_from_stripe(idx, first, last, e, wq) == _brute_ranges(expected, ids)
        # Decoding what Java would send gives the same answers.
        assert decode(encode(runs)).missing_stripe_count(idx, first, last, e, wq) == len(expected)


def test_missing_is_arithmetic_over_huge_ranges() -> None:
    # A bookie holding [0, 10**12] except three holes: nothing is ever enumerated.
    holes = [17, 5 * 10**11, 10**12 - 1]
    pairs = [(0, 16), (18, 5 * 10**11 - 1), (5 * 10**11 + 1, 10**12 - 2), (10**12, 10**12)]
    runs = EntryRuns(pairs)
    assert runs.count() == 10**12 + 1 - 3
    t0 = time.perf_counter()
    for idx in range(5):
        expected = [h for h in holes if idx in write_set(h, 5, 2)]
        assert runs.missing_stripe_count(idx, 0, 10**12, 5, 2) == len(expected)
        assert runs.missing_stripe_entries(idx, 0, 10**12, 5, 2) == expected
    # An empty list (NoSuchLedger) over a huge ledger: the whole stripe, counted arithmetically.
    # Index 0 stores 2 of every 5 entries.
    assert EntryRuns().missing_stripe_count(0, 0, 10**12 - 1, 5, 2) == 4 * 10**11
    assert EntryRuns().missing_from_stripe(0, 0, 10**12 - 1, 5, 2) == [(0, 10**12 - 1)]
    assert time.perf_counter() - t0 < 1.0


def test_many_runs_performance() -> None:
    # 200k runs (a bookie holding only its stripe, E=5 WQ=2): count must stay fast.
    runs = from_entry_ids(x for x in range(1_000_000) if (0 - x) % 5 < 2)
    assert runs.num_runs == 200_001
    t0 = time.perf_counter()
    assert runs.missing_stripe_count(0, 0, 999_999, 5, 2) == 0
    assert runs.missing_stripe_count(2, 0, 999_999, 5, 2) == 400_000
    assert runs.count_in(10, 999_000) == runs.count() - runs.count_in(0, 9) - runs.count_in(
        999_001, 999_999
    )
    assert time.perf_counter() - t0 < 5.0


# ---- value semantics --------------------------------------------------------------------------


def test_immutable_hashable_picklable() -> None:
    runs = from_entry_ids([1, 2, 4, 5, 7, 8])
    with pytest.raises(AttributeError):
        runs._starts = None  # type: ignore[misc]
    assert hash(runs) == hash(from_entry_ids([8, 7, 5, 4, 2, 1]))
    assert {runs, from_entry_ids([1, 2, 4, 5, 7, 8])} == {runs}
    clone = pickle.loads(pickle.dumps(runs))
    assert clone == runs and clone.count() == 6 and clone.contains(7)
    assert runs != from_entry_ids([1, 2])
    assert repr(runs) == "EntryRuns([1, 2], [4, 5], [7, 8])"
