"""jobs.watch.decide: the Auditor's lost-bookie delay rules, the schedule, metric summaries."""

from __future__ import annotations

import pytest

from jobs.watch.decide import LossTracker, Schedule, finding_counts, parse_every

A, B, C = "10.0.0.1:3181", "10.0.0.2:3181", "10.0.0.3:3181"


def test_single_loss_waits_the_delay_and_a_comeback_cancels_it() -> None:
    t = LossTracker()
    assert t.observe({A, B, C}, 0.0, 60) == []
    assert t.observe({A, B}, 1.0, 60) == []  # C gone: pending
    assert t.pending == {C: 1.0} and t.next_deadline(60) == 61.0
    assert t.observe({A, B}, 30.0, 60) == []
    assert t.observe({A, B, C}, 31.0, 60) == []  # back within the delay: forgotten
    assert not t.pending and not t.due
    assert t.observe({A, B}, 40.0, 60) == []
    assert t.observe({A, B}, 100.0, 60) == [C]  # gone for the whole delay
    assert t.due == {C: 40.0}
    assert t.resolve(C) == 40.0 and not t.due


def test_zero_delay_or_two_losses_are_due_at_once() -> None:
    t = LossTracker()
    t.observe({A, B, C}, 0.0, 0)
    assert t.observe({A, B}, 1.0, 0) == [C]
    t = LossTracker()
    t.observe({A, B, C}, 0.0, 600)
    assert t.observe({A, B}, 1.0, 600) == []
    # A second failure: not a rolling restart; the Auditor audits both at once.
    assert t.observe({A}, 2.0, 600) == [B, C]


def test_a_second_loss_during_repair_widens_the_work() -> None:
    t = LossTracker()
    t.observe({A, B, C}, 0.0, 0)
    assert t.observe({A, B}, 1.0, 0) == [C]
    assert t.observe({A}, 2.0, 0) == [B]
    assert set(t.due) == {B, C}


def test_due_bookie_that_registers_again_is_dropped_and_read_only_is_available() -> None:
    t = LossTracker()
    t.observe({A, B, C}, 0.0, 0)
    t.observe({A, B}, 1.0, 0)
    assert C in t.due
    t.observe({A, B, C}, 2.0, 0)  # e.g. back as read-only: it serves reads
    assert not t.due and not t.pending


def test_seed_marked_bookies_are_due_others_wait() -> None:
    t = LossTracker()
    t.seed({A}, lost={B, C}, marked={B}, now=5.0)
    assert t.due == {B: 5.0} and t.pending == {C: 5.0}
    t.add_lost({C, A}, 6.0)  # already known: unchanged
    assert t.pending == {C: 5.0}


def test_parse_every() -> None:
    assert parse_every("lost=1h,sample=24h") == {"lost": 3600.0, "sample": 86400.0}
    assert parse_every("off") == {} and parse_every("") == {}
    for bad in ("lost", "nope=1h", "lost=soon", "lost=0s"):
        with pytest.raises(ValueError, match="--every"):
            parse_every(bad)


def test_schedule_due_and_next() -> None:
    s = Schedule({"sample": 100.0, "lost": 10.0})
    assert s.due(1000.0) == ["lost", "sample"]  # never ran: both, cheapest first
    s.ran("lost", 1000.0)
    s.ran("sample", 1000.0)
    assert s.due(1005.0) == [] and s.next_due() == 1010.0
    assert s.due(1010.0) == ["lost"]
    assert Schedule({}).next_due() is None


def test_finding_counts_by_severity_and_worst_per_ledger() -> None:
    rows = [
        {"ledger_id": 1, "severity": "BELOW_WQ", "reason": "BOOKIE_LOST"},
        {"ledger_id": 1, "severity": "NO_REPLICA", "reason": "BOOKIE_LOST"},
        {"ledger_id": 2, "severity": "BELOW_AQ", "reason": "ENTRIES_MISSING"},
        {"ledger_id": 3, "severity": None, "reason": "PLACEMENT_VIOLATION"},
    ]
    frags, ledgers = finding_counts(rows)
    assert frags == {"NO_REPLICA": 1, "BELOW_AQ": 1, "BELOW_WQ": 1}
    assert ledgers == {"NO_REPLICA": 1, "BELOW_AQ": 1, "BELOW_WQ": 0}
