"""A leader cycle whose audit did not complete fails, by the rule of a cycle that raises.

An audit that raised (FAILED) or finished missing something (COMPLETED_WITH_ERRORS) still
drives the repair, but the cycle counts in ``bkaudit_watch_cycle_failures_total`` and
``/healthz`` turns red after ``--max-failed-cycles`` such cycles in a row; a cycle whose audit
completes resets the count. The audits are stand-ins here (the integration side, a corrupt
ledger znode under a real watch, is ``tests/integration/test_watch.py``).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bklib.states import CountKey, RunStatus
from jobs.watch import cycle
from jobs.watch.audits import AuditIncomplete
from jobs.watch.cycle import Cycle
from tests.watch_stand_ins import OTHERS, VICTIM, Clock, audit_job, leader_cycle

RETRY = 5.0


class _Audits:
    """Stands in for :meth:`jobs.watch.audits.WatchAudits.run`: each audit ends as
    ``status`` says (raised when FAILED), with no finding."""

    def __init__(self, c: Cycle) -> None:
        self.c = c
        self.status = RunStatus.COMPLETED
        self.runs = 0

    def __call__(self, check: str) -> Any:
        self.runs += 1
        run_id = f"run-{self.runs}"
        if self.status == RunStatus.FAILED:
            self.c.audits.incomplete.append(AuditIncomplete(check, None, self.status, "boom"))
            return None
        counts = {CountKey.METADATA_ERRORS: 0, CountKey.LEDGERS: 3}
        if self.status == RunStatus.COMPLETED_WITH_ERRORS:
            counts[CountKey.METADATA_ERRORS] = 1
            why = "1 unreadable znodes"
            self.c.audits.incomplete.append(AuditIncomplete(check, run_id, self.status, why))
        run = SimpleNamespace(run_id=run_id, counts=counts, status=self.status)
        return audit_job(run, [])


def _cycle(tmp_path: Path, clock: Clock) -> tuple[Cycle, _Audits]:
    c = leader_cycle(tmp_path, delay_override=0.0, retry_interval=RETRY, max_failed_cycles=3)
    c.tracker.seed(OTHERS | {VICTIM}, [], [], clock.now)
    c.tracker.observe(OTHERS, clock.now, 0.0)  # the victim is lost, due at once
    audits = _Audits(c)
    c.audits.run = audits  # type: ignore[method-assign]
    return c, audits


def _failures(c: Cycle) -> float:
    value = c.metrics.registry.get_sample_value("bkaudit_watch_cycle_failures_total")
    return float(value or 0)


@pytest.mark.parametrize("status", [RunStatus.COMPLETED_WITH_ERRORS, RunStatus.FAILED])
def test_cycles_whose_audit_did_not_complete_fail_and_turn_healthz_red(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, status: str
) -> None:
    clock = Clock()
    monkeypatch.setattr(cycle.time, "monotonic", clock)
    c, audits = _cycle(tmp_path, clock)
    audits.status = status
    for n in (1, 2, 3):
        assert c.run() == RETRY  # a failed cycle waits the retry interval, as a raised one
        assert (audits.runs, c.health.failed_cycles, _failures(c)) == (n, n, n)
        clock.now += RETRY + 1  # the loss's retry is due again
    ok, why = c.health.healthy()
    assert not ok
    assert "3 cycles failed in a row" in why and status in why, why
    # The fault is gone: the next audit completes, and the count starts again.
    audits.status = RunStatus.COMPLETED
    c.run()
    assert c.health.healthy() == (True, "ok")
    assert (c.health.failed_cycles, _failures(c)) == (0, 3)
    assert not c.tracker.due  # a complete audit naming no ledger resolves the loss


def test_a_completed_audit_keeps_healthz_green(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    monkeypatch.setattr(cycle.time, "monotonic", clock)
    c, audits = _cycle(tmp_path, clock)
    c.run()
    assert audits.runs == 1
    assert (c.health.failed_cycles, _failures(c)) == (0, 0)
    assert c.health.healthy() == (True, "ok")
