"""A safe-to-stop verdict fails closed: unreadable ledgers or an incomplete scan are UNSAFE."""

from __future__ import annotations

from bklib.audit.model import LedgerView
from bklib.meta.model import LedgerMetadata, Segment
from bklib.states import Verdict
from jobs.commands.whatif import ClusterState, what_if

A, B, C, D = "a:1", "b:1", "c:1", "d:1"


def _state(views: list[LedgerView], unaccounted: int = 0) -> ClusterState:
    return ClusterState(
        views, frozenset({A, B, C, D}), frozenset(), frozenset(), {}, unaccounted=unaccounted
    )


def _healthy() -> LedgerView:
    md = LedgerMetadata(
        ledger_id=1,
        ensemble_size=3,
        write_quorum=3,
        ack_quorum=2,
        segments=(Segment(0, (A, B, C)),),
    ).closed(9, 100)
    return LedgerView.from_metadata(md)


def test_safe_only_when_everything_was_read() -> None:
    assert what_if(_state([_healthy()]), {D}).verdict == Verdict.SAFE
    unread = what_if(_state([_healthy(), LedgerView.unreadable(7, "/ledgers/L7", "corrupt")]), {D})
    assert unread.verdict == Verdict.UNSAFE and not unread.impacts
    assert unread.notes == ["UNSAFE: 1 ledgers could not be read (7); not provably safe"]
    short = what_if(_state([_healthy()], unaccounted=3), {D})
    assert short.verdict == Verdict.UNSAFE
    assert short.notes == ["UNSAFE: the metadata scan missed 3 ledgers; not provably safe"]
