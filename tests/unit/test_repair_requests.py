"""Findings grouped into per-ledger repair requests (pure)."""

from __future__ import annotations

from datetime import datetime

from bklib.repair.requests import LedgerRequest, request_for_bookies, requests_from_findings
from bklib.states import Reason

T1, T2 = datetime(2026, 11, 1, 10, 0), datetime(2026, 11, 1, 11, 0)


def _f(lid: int, seg: int, bookie: str, reason: str, t: datetime) -> dict[str, object]:
    return {
        "ledger_id": lid,
        "segment_first_entry_id": seg,
        "bookie_id": bookie,
        "reason": reason,
        "first_detected_at": t,
    }


def test_requests_group_findings_per_ledger() -> None:
    findings = [
        _f(1, 0, "b1", Reason.BOOKIE_LOST, T2),
        _f(1, 10, "b1", Reason.BOOKIE_LOST, T1),
        _f(1, 10, "b3", Reason.ENTRIES_MISSING, T2),
        _f(2, 0, "b2", Reason.DIGEST_MISMATCH, T1),
        _f(3, 5, "b4", Reason.BOOKIE_UNREACHABLE, T2),
    ]
    previous = [
        {"ledger_id": 2, "segment_first_entry_id": 0, "old_bookie": "b2"},
        {"ledger_id": 9, "segment_first_entry_id": 0, "old_bookie": "b9"},
        {"ledger_id": 2, "segment_first_entry_id": None, "old_bookie": "b2"},
    ]
    assert requests_from_findings(findings, previous) == [
        LedgerRequest(1, frozenset({"b1"}), {10: frozenset({"b3"})}, frozenset({0, 10}), T1),
        LedgerRequest(
            2, frozenset(), {0: frozenset({"b2"})}, frozenset({0}), T1, frozenset({(0, "b2")})
        ),
        LedgerRequest(3, frozenset({"b4"}), {}, frozenset({5}), T2),
    ]


def test_request_for_bookies_is_fenced_at_once() -> None:
    req = request_for_bookies(2, ["a", "b", "d", "e"], ["d", "e", "x"])
    assert req == LedgerRequest(2, frozenset({"d", "e"}))
    assert req.detected_segments is None and req.first_detected_at is None
    assert request_for_bookies(1, ["a", "b"], ["d"]) is None
