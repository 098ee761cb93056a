"""How a fragment copy groups the entries to copy into batch-read chunks: consecutive
entries one surviving bookie holds every one of, bounded by the chunk size."""

from __future__ import annotations

import asyncio

import pytest

from bklib.client.replicator import _chunks, _entries_to_copy, _FragmentCopy
from bklib.quorum import has_entry, write_set


def plan(
    e: int, wq: int, last: int, moved: dict[int, str], dead: set[int], max_entries: int
) -> list[tuple[list[int], tuple[str, ...]]]:
    ensemble = [f"b{i}" for i in range(e)]

    def holders(eid: int) -> tuple[str, ...]:
        return tuple(ensemble[i] for i in write_set(eid, e, wq) if i not in moved and i not in dead)

    work = _entries_to_copy(moved, 0, last, e, wq)
    return [([x for x, _ in c.entries], c.holders) for c in _chunks(work, holders, max_entries)]


def test_e_equals_wq_chunks_are_the_whole_stripe_cut_at_the_size() -> None:
    got = plan(3, 3, 9, {0: "new"}, {0}, 4)
    assert got == [
        ([0, 1, 2, 3], ("b1", "b2")),
        ([4, 5, 6, 7], ("b1", "b2")),
        ([8, 9], ("b2", "b1")),  # 8 % 3 == 2: write set (2, 0, 1)
    ]


def test_e_above_wq_wq2_chunks_are_single_entries_with_their_one_holder() -> None:
    got = plan(3, 2, 8, {0: "new"}, {0}, 16)
    # Position 0 stores residues 2 and 0: entries 0, 2, 3, 5, 6, 8.
    assert got == [
        ([0], ("b1",)),
        ([2], ("b2",)),
        ([3], ("b1",)),
        ([5], ("b2",)),
        ([6], ("b1",)),
        ([8], ("b2",)),
    ]


def test_e_above_wq_wq3_runs_split_between_the_neighbours() -> None:
    # E=5 WQ=3, position 2 lost: it stores residues 0, 1, 2 (runs of 3); b1 holds the first
    # two of each run (residues 0, 1: write sets {0,1,2} and {1,2,3}), b3 the last (residue 2:
    # {2,3,4}, with b4).
    got = plan(5, 3, 12, {2: "new"}, {2}, 16)
    assert got == [
        ([0, 1], ("b1",)),
        ([2], ("b3", "b4")),
        ([5, 6], ("b1",)),
        ([7], ("b3", "b4")),
        ([10, 11], ("b1",)),
        ([12], ("b3", "b4")),
    ]
    for entries, holders in got:
        for x in entries:
            for h in holders:
                assert has_entry(x, int(h[1:]), 5, 3)


def test_entries_without_a_holder_stand_alone() -> None:
    # E=3 WQ=2 with positions 0 and 1 moved: residue 0 ({0, 1}) has no surviving holder.
    got = plan(3, 2, 5, {0: "x", 1: "y"}, {0}, 16)
    assert got == [([0], ()), ([1, 2], ("b2",)), ([3], ()), ([4, 5], ("b2",))]


def test_bookie_protocol_flag_reaches_the_repair_settings() -> None:
    import argparse

    from jobs.commands.repair import MODE_RECOVER, add_repair_arguments
    from jobs.runs.repair_run import RepairConfig

    def settings(*flags: str) -> str:
        parser = add_repair_arguments(argparse.ArgumentParser(), MODE_RECOVER)
        args = parser.parse_args(["b:3181", "--zk", "z:2181", "--warehouse", "/w", *flags])
        return RepairConfig.from_args(args, MODE_RECOVER).settings.bookie_protocol

    assert settings() == "v2"
    assert settings("--bookie-protocol", "v3") == "v3"


def test_a_cut_off_batch_probe_is_asked_again_by_the_copies_waiting_on_it() -> None:
    import asyncio

    from bklib.client.replicator import _serves_batch_read

    class Probe:
        def __init__(self, hang: bool) -> None:
            self.hang = hang

        async def batch_read(self, *args: object, **kw: object) -> list[bytes]:
            if self.hang:
                await asyncio.sleep(3600)
            return [b"entry"]

        async def close(self) -> None:
            pass

    class Pool:
        probes = 0

        def dedicated_connection_v2(self, bookie: str) -> Probe:
            Pool.probes += 1
            return Probe(hang=Pool.probes == 1)  # the first probe hangs until cancelled

    async def main() -> bool:
        pool = Pool()
        first = asyncio.ensure_future(_serves_batch_read(pool, "b:1", 1, 0))  # type: ignore[arg-type]
        await asyncio.sleep(0.01)
        waiting = asyncio.ensure_future(_serves_batch_read(pool, "b:1", 2, 0))  # type: ignore[arg-type]
        await asyncio.sleep(0.01)
        first.cancel()  # the copy of ledger 1 fails and cancels its lanes
        answer = await waiting  # ledger 2's copy is not cancelled with it: it asks again
        assert first.cancelled() and Pool.probes == 2
        return answer

    assert asyncio.run(main()) is True


@pytest.mark.parametrize("lanes", [1, 2, 3, 64])
@pytest.mark.parametrize("chunks", [0, 1, 2, 5, 100])
def test_every_chunk_is_copied_on_at_most_lanes_at_once(lanes: int, chunks: int) -> None:
    # One lane (--window 1) once copied only the first chunk of a fragment: the copy must
    # take every chunk, whatever the lanes, never more at once than lanes or chunks.
    copied: list[int] = []
    running = peak = 0

    async def record(chunk: int) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0)
        copied.append(chunk)
        running -= 1

    copy = object.__new__(_FragmentCopy)
    copy.copy_chunk = record  # type: ignore[assignment,method-assign]
    asyncio.run(copy.run(iter(range(chunks)), lanes))  # type: ignore[arg-type]
    assert sorted(copied) == list(range(chunks))
    assert peak <= max(1, min(lanes, chunks))
