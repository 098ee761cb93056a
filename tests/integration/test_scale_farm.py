"""The bookie farm of the scale harness against the real Python bookie: the same requests get
the same answers (docs/scale.md says what the farm does not reproduce).

A real bookie process is written exactly the entries the plan gives one farm identity; then
both answer the same v3 and v2 requests (reads inside and past the end, reads of entry -1, read
LAC, list-entries, an unknown ledger, a fencing read, adds after the fence, recovery adds and a
wrong master key), and their replies are compared field by field.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bklib.proto import protocol_pb2 as pb
from bklib.testing.scale.farm import FarmClient
from bklib.testing.scale.harness import running_farm
from bklib.testing.scale.plan import MASTER_KEY, LedgerPlan
from tests.bookie_helpers import WRONG_KEY, BookieProcess, RawClient, v2_read

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def farm(zk_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FarmClient]:  # type: ignore[no-untyped-def]
    base = tmp_path_factory.mktemp("farm")
    with (
        zk_server.private_chroot("farm") as zk,
        running_farm(zk, base, bookies=6, ledgers=300) as (
            client,
            _,
        ),
    ):
        yield client


def _ledgers_on(farm: FarmClient, bookie: str) -> list[LedgerPlan]:
    """Planned ledgers with entries on ``bookie``: open and closed, one and several segments."""
    chosen: dict[tuple[bool, bool], list[LedgerPlan]] = {}
    for lp in farm.plan:
        if not lp.entries_on(bookie):
            continue
        key = (lp.metadata.is_closed, len(lp.metadata.segments) > 1)
        chosen.setdefault(key, [])
        if len(chosen[key]) < 2:
            chosen[key].append(lp)
    assert set(chosen) == {(c, m) for c in (True, False) for m in (True, False)}, chosen.keys()
    return [lp for group in chosen.values() for lp in group]


def _same(a: pb.Response, b: pb.Response) -> None:
    a, b = (
        pb.Response.FromString(a.SerializeToString()),
        pb.Response.FromString(b.SerializeToString()),
    )
    a.header.txnId = b.header.txnId = 0
    assert a == b, f"farm answered\n{a}\nthe Python bookie answered\n{b}"


def test_farm_identity_answers_as_the_python_bookie_holding_the_same_entries(
    farm: FarmClient, zk_chroot: str, tmp_path: Path
) -> None:
    bookie = farm.bookies[2]
    ledgers = _ledgers_on(farm, bookie)
    real = BookieProcess(zk_chroot, tmp_path / "real").start()
    host, port = bookie.rsplit(":", 1)
    try:
        with RawClient(real.address) as r, RawClient((host, int(port))) as f:
            for lp in ledgers:
                for e in lp.entries_on(bookie):
                    assert r.add(lp.ledger_id, e, lp.entry_body(e), key=MASTER_KEY) == pb.EOK

            def both(req: pb.Request) -> None:
                _same(f.call(req), r.call(req))

            for lp in ledgers:
                lid = lp.ledger_id
                for e in [-1, *range(lp.entries + 2)]:
                    both(RawClient.read_req(lid, e))
                req = RawClient.request(pb.READ_LAC)
                req.readLacRequest.ledgerId = lid
                both(req)
                req = RawClient.request(pb.GET_LIST_OF_ENTRIES_OF_LEDGER)
                req.getListOfEntriesOfLedgerRequest.ledgerId = lid
                both(req)
                assert r.v2_call(v2_read(lid, 0)) == f.v2_call(v2_read(lid, 0))
            # An add to a planned ledger (a repair's copy) is kept.
            lp = next(lp for lp in ledgers if lp.metadata.is_closed)
            body = lp.entry_body(lp.entries)
            both(RawClient.add_req(lp.ledger_id, lp.entries, body, key=MASTER_KEY))
            both(RawClient.read_req(lp.ledger_id, lp.entries))
            req = RawClient.request(pb.GET_LIST_OF_ENTRIES_OF_LEDGER)
            req.getListOfEntriesOfLedgerRequest.ledgerId = lp.ledger_id
            both(req)
            unknown = max(lp.ledger_id for lp in farm.plan) + 1000
            both(RawClient.read_req(unknown, 0))
            # Fencing, then adds: refused after the fence, recovery adds accepted; a wrong key.
            lp = next(lp for lp in ledgers if not lp.metadata.is_closed)
            lid, last = lp.ledger_id, lp.entries_on(bookie)[-1]
            both(RawClient.read_req(lid, last, fence_key=WRONG_KEY))
            both(RawClient.read_req(lid, last, fence_key=MASTER_KEY))
            both(RawClient.add_req(lid, lp.entries, lp.entry_body(lp.entries), key=MASTER_KEY))
            body = lp.entry_body(lp.entries)
            both(RawClient.add_req(lid, lp.entries, body, key=MASTER_KEY, recovery=True))
            both(RawClient.read_req(lid, lp.entries))
            both(RawClient.add_req(lid, lp.entries + 1, body, key=WRONG_KEY, recovery=True))
            # The benches' unit of work: entries served, not requests answered with an error.
            lp = next(lp for lp in ledgers if lp.metadata.is_closed)
            before = farm.entries_read()
            f.call(RawClient.read_req(lp.ledger_id, lp.entries_on(bookie)[0]))
            f.call(RawClient.read_req(unknown, 0))
            assert farm.entries_read() == before + 1
    finally:
        real.stop()
