"""LedgerMetadata validation (BookKeeper's ``LedgerMetadataBuilder`` checks), queries and
transforms (in-place segment rewrites, as ``LedgerFragmentReplicator`` does)."""

from __future__ import annotations

import pytest

from bklib.errors import CorruptMetadataError
from bklib.meta import DigestType, LedgerMetadata, LedgerState, Segment
from bklib.meta.model import INVALID_ENTRY_ID, is_valid_bookie_id

A, B, C, D, E = (f"10.0.0.{i}:3181" for i in range(1, 6))


def make(**changes: object) -> LedgerMetadata:
    md = LedgerMetadata(
        ledger_id=9,
        ensemble_size=3,
        write_quorum=2,
        ack_quorum=2,
        segments=(Segment(0, (A, B, C)), Segment(10, (D, B, C)), Segment(25, (D, E, C))),
    )
    return md.replace(**changes)


# ---- bookie ids ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bookie",
    [A, "bookie-1.example.com:3181", "custom_id", "UPPER:1", ";<=>?@[\\]^", "a@b", "[::1]:3181"],
)
def test_valid_bookie_ids(bookie: str) -> None:
    assert is_valid_bookie_id(bookie)


@pytest.mark.parametrize(
    "bookie", ["", "readonly", "ReadOnly", "READONLY", "a b", "a/b", "a,b", "é:1", "a`b", "a{b}"]
)
def test_invalid_bookie_ids(bookie: str) -> None:
    assert not is_valid_bookie_id(bookie)


def test_readonly_is_only_rejected_as_a_whole() -> None:
    assert is_valid_bookie_id("readonly-1")
    assert is_valid_bookie_id("readonly:3181")


# ---- validate -----------------------------------------------------------------------------------


def test_valid_metadata_validates_to_itself() -> None:
    md = make()
    assert md.validate() is md
    closed = md.closed(40, 1000)
    assert closed.validate() is closed


def test_constructor_accepts_lists_and_normalises() -> None:
    md = LedgerMetadata(
        ledger_id=1,
        ensemble_size=1,
        write_quorum=1,
        ack_quorum=1,
        segments=[(0, [A])],
        state=3,
        last_entry_id=5,
        length=6,
        digest_type=2,
    )
    assert md.segments == (Segment(0, (A,)),)
    assert md.state is LedgerState.CLOSED and md.digest_type is DigestType.HMAC
    assert md.validate() is md


@pytest.mark.parametrize(
    ("changes", "word"),
    [
        ({"ledger_id": -1}, "negative ledger id"),
        ({"write_quorum": 4}, "E=3 WQ=4"),
        ({"ack_quorum": 3}, "WQ=2 AQ=3"),
        ({"ack_quorum": 0}, "AQ=0"),
        ({"segments": ()}, "no ensembles"),
        ({"segments": (Segment(0, (A, B)),)}, "has 2 bookies"),
        ({"segments": (Segment(5, (A, B, C)), Segment(5, (A, B, D)))}, "strictly increasing"),
        ({"segments": (Segment(5, (A, B, C)), Segment(2, (A, B, D)))}, "strictly increasing"),
        ({"segments": (Segment(0, (A, "readonly", C)),)}, "invalid bookie id"),
        ({"password": None}, "both present or both absent"),
        ({"digest_type": None}, "both present or both absent"),
        ({"last_entry_id": 4}, "OPEN ledger must have lastEntryId -1"),
        ({"state": LedgerState.IN_RECOVERY, "length": 1}, "IN_RECOVERY"),
        ({"state": LedgerState.CLOSED, "last_entry_id": -2}, "lastEntryId -2"),
        ({"format_version": 4}, "format version 4"),
    ],
)
def test_validate_rejects(changes: dict[str, object], word: str) -> None:
    with pytest.raises(CorruptMetadataError) as info:
        make(**changes).validate()
    assert info.value.ledger_id == (changes.get("ledger_id", 9))
    assert word in str(info.value)


def test_first_segment_need_not_start_at_zero_and_members_may_repeat() -> None:
    # BookKeeper checks neither (LedgerMetadataBuilder).
    make(segments=(Segment(3, (A, A, B)),)).validate()


def test_no_password_and_no_digest_is_the_v1_case() -> None:
    make(password=None, digest_type=None, format_version=1).validate()


# ---- queries ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "index"), [(0, 0), (9, 0), (10, 1), (24, 1), (25, 2), (10**6, 2), (-1, 0)]
)
def test_segment_index_for(entry: int, index: int) -> None:
    md = make()
    assert md.segment_index_for(entry) == index
    assert md.ensemble_for(entry) == md.segments[index].ensemble


def test_segment_last_entry_id() -> None:
    md = make()
    assert md.segment_last_entry_id(0) == 9
    assert md.segment_last_entry_id(1) == 24
    assert md.segment_last_entry_id(2) == INVALID_ENTRY_ID
    assert md.segment_last_entry_id(2, lac=30) == 30
    closed = md.closed(40, 1000)
    assert closed.segment_last_entry_id(2) == 40
    assert closed.segment_last_entry_id(2, lac=7) == 40
    # A closed ledger whose last segment never got an entry: empty segment.
    assert md.closed(24, 1000).segment_last_entry_id(2) == 24 < md.segments[2].first_entry_id


def test_bookies_and_last_segment() -> None:
    md = make()
    assert md.bookies() == {A, B, C, D, E}
    assert md.last_segment == Segment(25, (D, E, C))
    assert not md.is_closed and md.closed(1, 1).is_closed


# ---- transforms ---------------------------------------------------------------------------------


def test_with_bookies_replaced_keeps_positions_and_other_segments() -> None:
    md = make(ctoken=1234)
    new = md.with_bookies_replaced(10, {B: A, "not-there:1": E})
    assert new.segments == (Segment(0, (A, B, C)), Segment(10, (D, A, C)), Segment(25, (D, E, C)))
    assert new.ctoken == 0
    assert (new.state, new.last_entry_id, new.length) == (md.state, md.last_entry_id, md.length)
    assert new.format_version == md.format_version
    assert md.segments[1] == Segment(10, (D, B, C))  # the original is untouched
    assert new.validate() is new


def test_with_bookies_replaced_needs_an_existing_key() -> None:
    with pytest.raises(CorruptMetadataError) as info:
        make().with_bookies_replaced(11, {B: A})
    assert info.value.ledger_id == 9


def test_with_new_segment_appends_or_replaces_last() -> None:
    md = make(ctoken=5)
    appended = md.with_new_segment(30, (A, B, E))
    assert appended.segments[-1] == Segment(30, (A, B, E))
    assert len(appended.segments) == 4 and appended.ctoken == 0
    replaced = md.with_new_segment(25, (A, B, E))
    assert replaced.segments[-1] == Segment(25, (A, B, E))
    assert len(replaced.segments) == 3
    with pytest.raises(CorruptMetadataError):
        md.with_new_segment(24, (A, B, E))


def test_closed() -> None:
    md = make(ctoken=5).closed(99, 4096)
    assert (md.state, md.last_entry_id, md.length, md.ctoken) == (LedgerState.CLOSED, 99, 4096, 0)
