"""The audit's steps in their one order (bklib/audit/pipeline.py), for every executor: the
order, the helper stopped whatever happens, and a session lost before the commit failing the
run with nothing recorded."""

from __future__ import annotations

from typing import Any, cast

import pytest

from bklib.audit.pipeline import STEPS, run_audit_steps
from bklib.meta.stores.base import MetadataStore, SessionState
from bklib.meta.stores.session_guard import SessionLost


class _Session:
    """What the session guard uses of a store: its listeners, kind and locator."""

    kind, locator = "zookeeper", "127.0.0.1:1"

    def __init__(self) -> None:
        self.listeners: list[Any] = []

    def add_state_listener(self, listener: Any) -> None:
        self.listeners.append(listener)

    def remove_state_listener(self, listener: Any) -> None:
        self.listeners.remove(listener)

    def expire(self) -> None:
        for listener in list(self.listeners):
            listener(SessionState.LOST)


class _Executor:
    def __init__(self, session: _Session, *, expire_in: str = "", fail_in: str = "") -> None:
        self.session, self.expire_in, self.fail_in = session, expire_in, fail_in
        self.ran: list[str] = []

    def _step(self, name: str) -> None:
        self.ran.append(name)
        if name == self.expire_in:
            self.session.expire()
        if name == self.fail_in:
            raise RuntimeError(f"{name} failed")

    def scan(self) -> None:
        self._step("scan")

    def check(self) -> None:
        self._step("check")

    def abandon(self) -> None:
        self.ran.append("abandon")

    def placement(self) -> None:
        self._step("placement")

    def recheck(self) -> None:
        self._step("re-read")

    def commit(self) -> str:
        self._step("commit")
        return "run"


def _store(s: _Session) -> MetadataStore:
    return cast(MetadataStore, s)


def test_every_step_runs_once_in_the_one_order() -> None:
    s = _Session()
    ex = _Executor(s)
    assert run_audit_steps(ex, _store(s)) == "run"
    assert [r for r in ex.ran if r != "abandon"] == list(STEPS)
    assert ex.ran.index("abandon") == ex.ran.index("check") + 1
    assert s.listeners == []  # the guard let go of the session


def test_without_the_commit_nothing_is_recorded() -> None:
    s = _Session()
    ex = _Executor(s)
    assert run_audit_steps(ex, _store(s), commit=False) is None
    assert "commit" not in ex.ran


@pytest.mark.parametrize("step", ["scan", "check", "placement", "re-read"])
def test_a_session_lost_before_the_commit_records_nothing(step: str) -> None:
    s = _Session()
    ex = _Executor(s, expire_in=step)
    with pytest.raises(SessionLost, match="expired during"):
        run_audit_steps(ex, _store(s))
    assert "commit" not in ex.ran and "abandon" in ex.ran


@pytest.mark.parametrize("step", ["scan", "check"])
def test_a_failed_scan_or_check_still_stops_the_helper(step: str) -> None:
    s = _Session()
    ex = _Executor(s, fail_in=step)
    with pytest.raises(RuntimeError):
        run_audit_steps(ex, _store(s))
    assert ex.ran[-1] == "abandon" and "commit" not in ex.ran
