"""copy_fragment against real Python bookie processes: the v2 batch-read path and its
fallbacks (a source lacking an entry mid-batch, a bad digest in a batch, a source that fails
batches or never answers them), no-replica entries, E == WQ and E > WQ shapes, and v3.

Entries are written straight to the bookies of each write set (no metadata: the copy needs
none), position 0's bookie is "dead", and its stripe goes to a bookie outside the ensemble.
Every check reads the copy back and compares it byte for byte with what was written."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from bklib.client.pool import BookieClientPool, WireProtocol
from bklib.client.replicator import CopyResult, copy_fragment
from bklib.digest import DigestManager, digest_manager, master_key
from bklib.errors import BKError, NoSuchEntryError
from bklib.meta.model import DigestType
from bklib.quorum import iter_stripe, write_set
from tests.integration.conftest import Cluster, run

pytestmark = pytest.mark.integration

PWD = b"copy-batch"
_ids = itertools.count(9_100_000)


class Ledger:
    """Entries written to the write sets of one ensemble, and the bodies sent."""

    def __init__(self, ensemble: list[str], n: int, wq: int, size: int = 300) -> None:
        self.id = next(_ids)
        self.ensemble = ensemble
        self.e, self.wq, self.n = len(ensemble), wq, n
        self.dm: DigestManager = digest_manager(self.id, DigestType.CRC32C, PWD)
        self.key = master_key(PWD)
        self.bodies = [
            self.dm.package_entry(x, x - 1, (x + 1) * size, bytes([x % 251]) * size)
            for x in range(n)
        ]

    async def write(self, pool: BookieClientPool) -> None:
        for x, body in enumerate(self.bodies):
            for i in write_set(x, self.e, self.wq):
                await pool.add(self.ensemble[i], self.id, x, self.key, body)

    def stripe(self, pos: int = 0) -> list[int]:
        return list(iter_stripe(pos, 0, self.n - 1, self.e, self.wq))

    async def copy(self, pool: BookieClientPool, target: str, **kw: Any) -> CopyResult:
        return await copy_fragment(
            pool,
            ledger_id=self.id,
            ensemble=self.ensemble,
            ensemble_size=self.e,
            write_quorum=self.wq,
            first_entry_id=0,
            last_entry_id=self.n - 1,
            targets={0: target},
            dead={self.ensemble[0]},
            digest=self.dm,
            master_key=self.key,
            **kw,
        )

    async def assert_copied(self, pool: BookieClientPool, target: str, entries: list[int]) -> None:
        """``target`` holds exactly the bytes written for each of ``entries``."""
        for x in entries:
            got = (await pool.read(target, self.id, x)).body
            assert got == self.bodies[x], f"entry {x} differs on {target}"
            self.dm.verify_entry(got, x)


def _copy_case(
    cluster: Cluster,
    e: int,
    wq: int,
    n: int,
    *,
    protocol: WireProtocol = "v2",
    prepare: Any = None,
    **kw: Any,
) -> tuple[Ledger, CopyResult, str]:
    ids = cluster.bookie_ids
    led = Ledger(ids[:e], n, wq)
    target = ids[e]

    async def main() -> CopyResult:
        async with cluster.client() as ctx:
            await led.write(ctx.pool)
            if prepare is not None:
                prepare(led)
            res = await led.copy(ctx.pool, target, protocol=protocol, **kw)
            missing = set(res.no_replica)
            await led.assert_copied(ctx.pool, target, [x for x in led.stripe() if x not in missing])
            for x in missing:
                with pytest.raises(NoSuchEntryError):
                    await ctx.pool.read(target, led.id, x)
            return res

    return led, run(main()), target


@pytest.mark.parametrize(("e", "wq"), [(3, 3), (2, 2), (4, 4)])
def test_e_equals_wq_copies_through_batches_byte_identical(
    cluster: Cluster, e: int, wq: int
) -> None:
    led, res, target = _copy_case(cluster, e, wq, 300, batch_entries=50)
    assert res.entries == 300 and res.no_replica == []
    assert res.per_target == {target: [300, sum(len(b) for b in led.bodies)]}
    # 300 entries in batches of at most 50 (window 64 // 4 = 16 per chunk): batches only.
    assert res.batch_reads >= 300 // 16 and res.single_reads == 0


@pytest.mark.parametrize(("e", "wq"), [(3, 2), (5, 3), (5, 4)])
def test_e_above_wq_copies_runs_byte_identical(cluster: Cluster, e: int, wq: int) -> None:
    led, res, _ = _copy_case(cluster, e, wq, 200)
    stripe = led.stripe()
    assert res.entries == len(stripe) and res.no_replica == []
    if wq >= 3:
        # A survivor holds WQ - 1 consecutive entries of each lost run: batches of 2 or more.
        assert res.batch_reads > 0
    else:
        assert res.batch_reads == 0 and res.single_reads == len(stripe)


def test_v3_reads_entry_by_entry(cluster: Cluster) -> None:
    _, res, _ = _copy_case(cluster, 3, 3, 120, protocol="v3")
    assert res.entries == 120 and res.batch_reads == 0 and res.single_reads == 120


def test_source_missing_entries_mid_batch_falls_back_to_the_other_replica(
    cluster: Cluster,
) -> None:
    ids = cluster.bookie_ids
    gaps1 = [x for x in range(120) if x % 8 == 3]
    gaps2 = [x for x in range(120) if x % 8 == 6]

    def prepare(led: Ledger) -> None:
        # Each survivor lacks entries in every chunk: whichever serves a batch stops there.
        assert cluster.admin(ids[1]).delete_entries(led.id, gaps1) == gaps1
        assert cluster.admin(ids[2]).delete_entries(led.id, gaps2) == gaps2

    _, res, _ = _copy_case(cluster, 3, 3, 120, prepare=prepare, batch_entries=64)
    assert res.entries == 120 and res.no_replica == []
    # A batch stops at its source's gap; the gap entry is read singly (the other replica
    # first), and the rest of the chunk is batched again.
    assert res.batch_reads > 120 // 16 and 1 <= res.single_reads <= len(gaps1) + len(gaps2)


def test_entry_missing_on_every_replica_is_no_replica_and_the_rest_is_copied(
    cluster: Cluster,
) -> None:
    ids = cluster.bookie_ids

    def prepare(led: Ledger) -> None:
        for b in ids[1:3]:
            cluster.admin(b).delete_entries(led.id, [20, 21, 99])

    _, res, _ = _copy_case(cluster, 3, 3, 100, prepare=prepare)
    assert res.no_replica == [20, 21, 99]
    assert res.entries == 97


def test_entry_missing_on_every_replica_e_above_wq(cluster: Cluster) -> None:
    ids = cluster.bookie_ids

    def prepare(led: Ledger) -> None:
        # E=3 WQ=2: entry 3 (residue 0) is on positions 0 (dead) and 1 only.
        cluster.admin(ids[1]).delete_entries(led.id, [3])

    led, res, _ = _copy_case(cluster, 3, 2, 30, prepare=prepare)
    assert res.no_replica == [3]
    assert res.entries == len(led.stripe()) - 1


def test_bad_digest_in_a_batch_is_read_from_another_replica(cluster: Cluster) -> None:
    ids = cluster.bookie_ids

    def prepare(led: Ledger) -> None:
        for b in ids[1:3]:
            cluster.admin(b).corrupt_entry(led.id, 33 if b == ids[1] else 66)

    _, res, _ = _copy_case(cluster, 3, 3, 100, prepare=prepare)
    assert res.entries == 100 and res.no_replica == []
    assert res.single_reads >= 1


def test_bad_digest_on_every_replica_fails_the_copy(cluster: Cluster) -> None:
    ids = cluster.bookie_ids

    def prepare(led: Ledger) -> None:
        for b in ids[1:3]:
            cluster.admin(b).corrupt_entry(led.id, 7)

    with pytest.raises(BKError) as err:
        _copy_case(cluster, 3, 3, 40, prepare=prepare)
    assert err.value.entry_id == 7


def test_batch_errors_fall_back_to_single_reads(cluster: Cluster) -> None:
    ids = cluster.bookie_ids
    rules: list[int] = []

    def prepare(led: Ledger) -> None:
        # ids[1] fails every batch read with EIO; ids[2] serves them.
        rules.append(cluster.fault(ids[1], "fail", op="BATCH_READ_ENTRY", ledger=led.id))

    _, res, _ = _copy_case(cluster, 3, 3, 150, prepare=prepare)
    assert res.entries == 150 and res.no_replica == []
    assert cluster.hits(ids[1], rules[0]) >= 1
    assert res.batch_reads > 0


def test_bookie_that_never_answers_batch_reads_is_read_entry_by_entry(cluster: Cluster) -> None:
    """A bookie that predates BATCH_READ (no answer): the probe, on a connection of its own,
    times out; the copy reads entry by entry and nothing fails."""
    ids = cluster.bookie_ids

    def prepare(led: Ledger) -> None:
        for b in ids[1:3]:
            cluster.fault(b, "drop", op="BATCH_READ_ENTRY")

    _, res, _ = _copy_case(cluster, 3, 3, 60, prepare=prepare)
    assert res.entries == 60 and res.batch_reads == 0 and res.single_reads == 60


def test_two_replacements_get_the_overlapping_entries(cluster: Cluster) -> None:
    ids = cluster.bookie_ids
    led = Ledger(ids[:3], 90, 3)

    async def main() -> CopyResult:
        async with cluster.client() as ctx:
            await led.write(ctx.pool)
            res = await copy_fragment(
                ctx.pool,
                ledger_id=led.id,
                ensemble=led.ensemble,
                ensemble_size=3,
                write_quorum=3,
                first_entry_id=0,
                last_entry_id=89,
                targets={0: ids[3], 1: ids[4]},
                dead={ids[0]},
                digest=led.dm,
                master_key=led.key,
            )
            for t in (ids[3], ids[4]):
                await led.assert_copied(ctx.pool, t, list(range(90)))
            return res

    res = run(main())
    assert res.entries == 180 and res.batch_reads > 0
