"""The watch's log after a repair whose Pulsar topics were not unloaded (jobs/watch/repair.py):
a few topics named with their commands, the rest counted in one line, not a line each (a
repair of one lost bookie at a million ledgers touched 2,000 topics)."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from bklib.pulsar.unload import UnloadOutcome, unload_topics
from bklib.states import ActionStatus
from jobs.runs import pulsar_unload
from jobs.runs.pulsar_unload import Unloads
from jobs.watch.repair import TOPICS_NAMED, WatchRepair


def _repair(written: list[Any]) -> WatchRepair:
    repair = WatchRepair.__new__(WatchRepair)
    repair.cfg = SimpleNamespace(  # type: ignore[assignment]
        ledgers_root="/ledgers", warehouse="wh", pulsar_admin=None, unload_rate=0.0
    )
    repair.watcher = SimpleNamespace(zk=None)  # type: ignore[assignment]
    repair.metrics = SimpleNamespace(count_actions=lambda rows: None)  # type: ignore[assignment]
    repair.warehouse = SimpleNamespace(write=written.append)  # type: ignore[assignment]
    return repair


def test_topics_left_to_unload_are_named_up_to_a_few_then_counted(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    plan = {f"persistent://t/ns/topic-{i:04d}": [i] for i in range(2000)}
    outcomes = unload_topics(None, plan)  # no admin API: every topic MANUAL
    outcomes[5] = UnloadOutcome(outcomes[5].topic, (5,), ActionStatus.DONE, None, 0.0, 0.0)
    failed = [UnloadOutcome(f"persistent://t/ns/f{i}", (9000 + i,), ActionStatus.FAILED,
                            "HTTP 503", 0.0, 0.0) for i in range(3)]  # fmt: skip
    done = Unloads(plan, outcomes + failed, [{"row": i} for i in range(2003)])
    monkeypatch.setattr(pulsar_unload, "unload_changed_topics", lambda *a, **k: done)
    written: list[Any] = []
    with caplog.at_level(logging.INFO, logger="jobs.watch"):
        _repair(written)._unload([], SimpleNamespace(audit_run_id="a"), "run-1")  # type: ignore[arg-type]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == TOPICS_NAMED + 1
    named = [w for w in warnings if "still holds stale ledger handles" in w]
    assert len(named) == TOPICS_NAMED
    assert "topic-0000" in named[0] and "pulsar-admin topics unload" in named[0]
    assert all("topic-0005" not in w for w in named)  # the one unloaded is not among them
    last = warnings[-1]
    left = 2000 - 1 + 3 - TOPICS_NAMED
    assert f"{left} more Pulsar topics" in last
    assert f"{left - 3} {ActionStatus.MANUAL}" in last and f"3 {ActionStatus.FAILED}" in last
    assert "topic-1999" not in last  # no command per topic in the summary
    assert written and len(written[0][0][1]) == 2003  # every topic's row is on record
