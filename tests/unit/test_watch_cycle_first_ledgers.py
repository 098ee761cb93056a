"""A loss's first ledgers as the cycle hands them on (docs/watch.md, "The first ledgers"): the
audit's marks leave them out while their repair marks them; when that repair fails (perhaps
before its marks), the audit marks them after all and its repair takes them. The store's read,
the audit and the repair are stand-ins; the real ones are
tests/integration/test_watch_index_reaction.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bklib.audit.model import Finding, LedgerView
from bklib.meta.model import LedgerMetadata, Segment
from bklib.repair.requests import LedgerRequest
from bklib.states import ActionKind, ActionStatus, BookieState, Check, CountKey, Reason, RunStatus
from jobs.watch import cycle
from jobs.watch.cycle import Cycle
from tests.watch_stand_ins import OTHERS, VICTIM, Clock, FeedStore, audit_job, leader_cycle

A, B = sorted(OTHERS)
LEDGERS = {1: (VICTIM, A), 2: (A, B), 3: (B, VICTIM), 4: (VICTIM, B)}
NAMING_VICTIM = [1, 3, 4]


def view(ledger_id: int) -> LedgerView:
    md = LedgerMetadata(ledger_id, 2, 2, 1, (Segment(0, LEDGERS[ledger_id]),)).closed(9, 100)
    return LedgerView.from_metadata(md, f"/ledgers/00/0000/L{ledger_id:04d}", 0)


def finding(ledger_id: int) -> Finding:
    return Finding(
        ledger_id=ledger_id,
        segment_index=0,
        segment_first_entry_id=0,
        segment_last_entry_id=9,
        bookie_index=LEDGERS[ledger_id].index(VICTIM),
        bookie_id=VICTIM,
        reason=Reason.BOOKIE_LOST,
    )


class Audits:
    """A ``lost`` audit: once the victim is ``lost``, a finding for each ledger read that
    names it."""

    def __init__(self) -> None:
        self.lost = False
        self.preread: list[dict[int, Any]] = []

    def __call__(self, check: str, ledger_ids: Any = None, kind: Any = None, **kw: Any) -> Any:
        assert check == Check.LOST
        ids = list(LEDGERS) if ledger_ids is None else list(ledger_ids)
        self.preread.append(kw.get("preread") or {})
        counts = {CountKey.METADATA_ERRORS: 0, CountKey.LEDGERS: len(ids)}
        run = SimpleNamespace(run_id=kw.get("run_id") or "scan", counts=counts)
        run.status = RunStatus.COMPLETED
        job = audit_job(run, [view(i) for i in ids])
        if self.lost:
            job.bookies = [SimpleNamespace(bookie_id=VICTIM, state=BookieState.LOST)]
            job.findings = [finding(i) for i in ids if VICTIM in LEDGERS[i]]
        return job


class Repair:
    """The watch's repair, recording the marks and the repairs asked of it."""

    def __init__(self, first_fails: bool) -> None:
        self.first_fails = first_fails
        self.marked: list[list[int]] = []
        self.first: list[tuple[list[int], str]] = []
        self.repaired: list[tuple[list[int], str]] = []

    def mark(self, rows: Any, known: Any = None) -> None:
        self.marked.append(sorted({r["ledger_id"] for r in rows}))

    def paused(self) -> bool:
        return False

    def first_ledgers(
        self, reqs: list[LedgerRequest], audit_run_id: str, *_: Any, **__: Any
    ) -> list[dict[str, Any]]:
        self.first.append(([q.ledger_id for q in reqs], audit_run_id))
        if self.first_fails:
            raise ConnectionError("ZooKeeper connection lost before the marks")
        return [
            {"ledger_id": q.ledger_id, "action": a, "status": ActionStatus.DONE}
            | {"started_at": i, "run_id": "first"}
            for i, q in enumerate(reqs)
            for a in (ActionKind.COPY, ActionKind.METADATA_UPDATE)
        ]

    def repair(self, rows: Any, audit_run_id: str, **_: Any) -> list[dict[str, Any]]:
        self.repaired.append((sorted({r["ledger_id"] for r in rows}), audit_run_id))
        return []


def _lost_with_a_current_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first_fails: bool
) -> tuple[Cycle, Audits, Repair]:
    clock = Clock()
    monkeypatch.setattr(cycle.time, "monotonic", clock)
    c = leader_cycle(tmp_path, delay_override=0.0, first_ledgers=2)
    c.index.keeper.store = FeedStore()  # type: ignore[assignment]
    audits = Audits()
    c.audits.run = audits  # type: ignore[method-assign]
    c.audits.record_now = lambda: None  # type: ignore[method-assign]
    repair = Repair(first_fails)
    c.repair = repair  # type: ignore[assignment]
    read: list[list[int]] = []

    def read_ledgers(store: Any, ids: Any, **_: Any) -> dict[int, LedgerView | None]:
        read.append(list(ids))
        return {i: view(i) for i in ids}

    monkeypatch.setattr(cycle, "read_ledgers", read_ledgers)
    for lost in (False, True):
        # First a loss no ledger shows (the audit finds nothing): its full scan builds the
        # index, as a take-over's does; then the loss itself, with the index current.
        audits.lost = lost
        c.tracker.seed(OTHERS | {VICTIM}, [], [], clock.now)
        c.tracker.observe(OTHERS, clock.now, 0.0)
        c.retry_at = 0.0
        if not lost:
            c.run()
            assert audits.preread == [{}] and repair.marked == [] and not read
    c.run()
    assert read == [NAMING_VICTIM]  # the loss's first ledgers, read once
    assert audits.preread[-1].keys() == set(NAMING_VICTIM)  # the audit takes that read
    return c, audits, repair


def test_the_first_ledgers_are_left_out_of_the_audits_marks_and_repair(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, _, repair = _lost_with_a_current_index(tmp_path, monkeypatch, first_fails=False)
    assert [ids for ids, _ in repair.first] == [[1, 3]]
    assert repair.marked == [[4]]
    audit_id = repair.first[0][1]
    assert repair.repaired == [([4], audit_id)]  # one run id for the audit and its repairs


def test_a_failed_first_repair_leaves_its_ledgers_marked_and_repaired_by_the_audit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, _, repair = _lost_with_a_current_index(tmp_path, monkeypatch, first_fails=True)
    assert [ids for ids, _ in repair.first] == [[1, 3]]
    assert repair.marked == [[4], [1, 3]]  # the failed repair's ledgers, marked after all
    assert repair.repaired == [([1, 3, 4], repair.first[0][1])]
