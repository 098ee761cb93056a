"""Fault rules of the Python bookie: parsing, matching, counting."""

from __future__ import annotations

import pytest

from bklib.bookie.faults import FaultInjector, FaultRule
from bklib.proto import protocol_pb2 as pb


def test_rule_parsing_and_shorthands() -> None:
    r = FaultRule.from_json(
        {"action": "fail", "op": "read_entry", "ledger": 5, "entry": 3, "status": "EFENCED"}
    )
    assert (r.ops, r.ledger, r.first_entry, r.last_entry, r.status) == (
        ("READ_ENTRY",),
        5,
        3,
        3,
        pb.EFENCED,
    )
    r = FaultRule.from_json({"action": "delay", "entries": [2, 9], "delay_ms": 50, "after": True})
    assert (r.ops, r.first_entry, r.last_entry, r.delay_ms, r.after) == (None, 2, 9, 50, True)
    assert FaultRule.from_json({"action": "fail", "status": 506}).status == pb.ETOOMANYREQUESTS
    for bad in (
        {"action": "explode"},
        {"action": "drop", "op": "NOT_AN_OP"},
        {"action": "drop", "colour": "red"},
        {"action": "fail", "status": "ENOPE"},
    ):
        with pytest.raises(ValueError):
            FaultRule.from_json(bad)


def test_matching_order_count_and_fence_filter() -> None:
    inj = FaultInjector()
    first = inj.add(FaultRule.from_json({"action": "drop", "op": "ADD_ENTRY", "count": 2}))
    inj.add(FaultRule.from_json({"action": "fail", "ledger": 7, "entries": [0, 4]}))
    inj.add(FaultRule.from_json({"action": "delay", "op": "READ_ENTRY", "fence": True}))
    hits = [inj.match("ADD_ENTRY", 7, 1) for _ in range(3)]
    assert [h.id if h else None for h in hits] == [first, first, 2]  # spent after two
    assert inj.match("READ_ENTRY", 7, 5) is None  # entry outside the range
    assert inj.match("READ_ENTRY", 8, 5) is None  # plain read: the fence rule does not apply
    fence = inj.match("READ_ENTRY", 8, -1, fence=True)
    assert fence is not None and fence.action == "delay"
    assert inj.match("READ_LAC", 7, None) is None  # an entry range needs an entry
    assert [r.hits for r in inj.rules] == [2, 1, 1]
    inj.clear()
    assert inj.match("ADD_ENTRY", 7, 1) is None
