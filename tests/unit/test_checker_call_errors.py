"""A bookie call that fails outside BookKeeper's errors (``SyncBookieClient.submit_many`` puts
the error of a call it could not start in that call's future; ``post``, the sampled check's
hand-over, raises it) stops the check: the ledger
is never reported, so it cannot count as held, missing or clean (docs/checks.md)."""

from __future__ import annotations

import concurrent.futures
from typing import Any

import pytest

from bklib.audit.checker import CheckSettings
from bklib.audit.engine import check_ledgers
from bklib.audit.model import LedgerView, SegmentSpan
from bklib.meta.model import LedgerState
from bklib.states import Check

BOOKIES = ("10.0.0.1:3181", "10.0.0.2:3181", "10.0.0.3:3181")


class _RefusingClient:
    """Stands in for SyncBookieClient: every call fails as one that could not start."""

    def __init__(self) -> None:
        self.calls = 0

    def _failed(self) -> concurrent.futures.Future[Any]:
        self.calls += 1
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        fut.set_running_or_notify_cancel()
        fut.set_exception(RuntimeError("no task for this call"))
        return fut

    def guard(self, op_timeout: float) -> float:
        return op_timeout + 5.0

    def submit(self, fn: Any) -> concurrent.futures.Future[Any]:
        return self._failed()

    def submit_many(self, fns: list[Any]) -> list[concurrent.futures.Future[Any]]:
        return [self._failed() for _ in fns]

    def post(self, fn: Any) -> None:
        """The sampled check's hand-over (``SyncBookieClient.post``), refused the same way."""
        self.calls += 1
        raise RuntimeError("no task for this call")


def _closed_ledger() -> LedgerView:
    return LedgerView(
        ledger_id=7,
        state=LedgerState.CLOSED.name,
        ensemble_size=3,
        write_quorum=3,
        ack_quorum=2,
        last_entry_id=9,
        digest_type="CRC32C",
        segments=(SegmentSpan(0, 9, BOOKIES),),
    )


@pytest.mark.parametrize("check", [Check.SAMPLE, Check.DEEP])
def test_a_call_that_could_not_start_fails_the_check(check: str) -> None:
    client = _RefusingClient()
    reported: list[Any] = []
    with pytest.raises(RuntimeError, match="no task for this call"):
        for item in check_ledgers(
            [_closed_ledger()], frozenset(), check, client=client, settings=CheckSettings()
        ):
            reported.append(item)
    assert client.calls >= 1  # the probes were asked for, and their error surfaced
    assert reported == []
