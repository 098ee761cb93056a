"""Journal (group commit, replay, rotation, torn tails) and ledger storage of the Python bookie."""

from __future__ import annotations

import asyncio
import os
import struct
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from bklib.bookie import journal as jr
from bklib.bookie import storage as st
from bklib.bookie.journal import CorruptJournalError, Journal
from bklib.bookie.storage import DataDirLockedError, Storage, StorageError
from bklib.errors import NoSuchEntryError, NoSuchLedgerError, UnauthorizedAccessError
from bklib.testing import datadir

KEY = b"k" * 20
OTHER_KEY = b"o" * 20


def body(ledger: int, entry: int, lac: int = -1, payload: bytes = b"payload") -> bytes:
    """A body shaped like a real entry: ids and LAC at the offsets the bookie parses."""
    return struct.pack(">qqqq", ledger, entry, lac, len(payload)) + payload


T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


# -- journal ---------------------------------------------------------------------------------


def test_journal_append_read_durable_and_replay(tmp_path: Path) -> None:
    async def go() -> list[int]:
        j = Journal(tmp_path)
        j.open()
        locs = [j.append(jr.REC_ENTRY, 7, i, b"x%d" % i) for i in range(100)]
        # Readable before any write reached the file.
        assert j.read(locs[5]) == b"x5"
        seq = j.pending_seq
        done: list[BaseException | None] = []
        j.when_durable(seq, done.append)
        assert not j.is_durable(seq)
        await j.wait_durable(seq)
        assert done == [None]
        assert j.read(locs[99]) == b"x99"
        await j.close()
        return locs

    locs = run(go())
    records = list(jr.replay(tmp_path))
    assert [(r.rtype, r.ledger_id, r.entry_id, bytes(r.payload)) for r in records] == [
        (jr.REC_ENTRY, 7, i, b"x%d" % i) for i in range(100)
    ]
    assert [r.loc for r in records] == locs


def test_journal_group_commit_batches_many_appends(tmp_path: Path) -> None:
    """Appends made while an fsync is in flight share the next fsync."""

    async def go() -> int:
        j = Journal(tmp_path)
        j.open()
        seqs = set()
        for round_ in range(20):
            for i in range(500):
                j.append(jr.REC_ENTRY, 1, round_ * 500 + i, b"y" * 100)
            seqs.add(j.pending_seq)
            await asyncio.sleep(0)  # let the loop run flushes between bursts
        await j.drain()
        await j.close()
        return len(seqs)

    n_batches = run(go())
    assert n_batches <= 21  # far fewer fsync batches than 10,000 appends
    assert sum(1 for _ in jr.replay(tmp_path)) == 10_000


def test_journal_rotation_and_reads_across_files(tmp_path: Path) -> None:
    async def go() -> dict[int, int]:
        j = Journal(tmp_path, max_file_size=4096)
        j.open()
        locs = {}
        for i in range(200):
            locs[i] = j.append(jr.REC_ENTRY, 3, i, bytes([i % 256]) * 100)
            if i % 37 == 0:
                await j.drain()
        await j.drain()
        for i, loc in locs.items():
            assert j.read(loc) == bytes([i % 256]) * 100
        await j.close()
        return locs

    locs = run(go())
    files = jr.list_files(tmp_path)
    assert len(files) > 5
    assert all(p.stat().st_size <= 4096 for _, p in files)
    assert {r.entry_id: r.loc for r in jr.replay(tmp_path)} == locs


def test_journal_torn_tail_of_newest_file_is_truncated(tmp_path: Path) -> None:
    async def go() -> None:
        j = Journal(tmp_path)
        j.open()
        for i in range(10):
            j.append(jr.REC_ENTRY, 1, i, b"z" * 50)
        await j.close()

    run(go())
    ((_, path),) = jr.list_files(tmp_path)
    good_size = path.stat().st_size
    # A crash mid-write: a record header promising more bytes than exist, then garbage.
    with open(path, "ab") as f:
        f.write(jr.encode_record(jr.REC_ENTRY, 1, 10, b"w" * 50)[:40])
    assert [r.entry_id for r in jr.replay(tmp_path)] == list(range(10))
    assert path.stat().st_size == good_size
    # A flipped byte inside the last record is torn too (CRC).
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    assert [r.entry_id for r in jr.replay(tmp_path)] == list(range(9))


def test_journal_corruption_in_older_file_refuses(tmp_path: Path) -> None:
    async def go() -> None:
        for _ in range(2):  # every open starts a new file
            j = Journal(tmp_path)
            j.open()
            j.append(jr.REC_ENTRY, 1, 0, b"a" * 64)
            await j.close()

    run(go())
    (_, first), _second = jr.list_files(tmp_path)
    data = bytearray(first.read_bytes())
    data[jr.FILE_HEADER_LEN + jr.RECORD_HEADER_LEN + 3] ^= 0x55
    first.write_bytes(bytes(data))
    with pytest.raises(CorruptJournalError):
        list(jr.replay(tmp_path))


def test_journal_read_of_missing_file_raises(tmp_path: Path) -> None:
    async def go() -> None:
        j = Journal(tmp_path)
        j.open()
        loc = j.append(jr.REC_ENTRY, 1, 0, b"q" * 10)
        await j.drain()
        j.forget_file(jr.unpack_loc(loc)[0])
        os.unlink(tmp_path / jr.file_name(jr.unpack_loc(loc)[0]))
        with pytest.raises(jr.JournalError):
            j.read(loc)
        await j.close()

    run(go())


# -- storage ---------------------------------------------------------------------------------


def test_storage_semantics_and_restart(tmp_path: Path) -> None:
    async def first() -> None:
        s = Storage(tmp_path)
        s.open()
        led = s.handle(10, KEY)
        for e in range(5):
            s.add_entry(led, e, body(10, e, lac=e - 1))
        with pytest.raises(UnauthorizedAccessError):
            s.handle(10, OTHER_KEY)
        assert s.read(10, -1) == body(10, 4, lac=3)
        assert led.lac == 3
        f = s.handle(11, KEY)
        seq = s.fence(f)
        assert s.fence(f) == seq  # idempotent
        await s.journal.wait_durable(seq)
        lacbody = struct.pack(">qq", 12, 41) + b"dg"
        await s.journal.wait_durable(s.set_explicit_lac(s.handle(12, KEY), lacbody))
        with pytest.raises(NoSuchLedgerError):
            s.read(99, 0)
        with pytest.raises(NoSuchEntryError):
            s.read(10, 5)
        with pytest.raises(NoSuchEntryError):
            s.read(11, -1)  # fenced, created, empty
        with pytest.raises(DataDirLockedError):
            Storage(tmp_path).open()
        await s.close()

    async def second() -> None:
        s = Storage(tmp_path)
        s.open()
        led = s.ledger(10)
        assert led is not None and led.master_key == KEY and led.lac == 3 and not led.fenced
        assert s.entry_ids(10) == [0, 1, 2, 3, 4]
        assert s.read(10, 2) == body(10, 2, lac=1)
        f = s.ledger(11)
        assert f is not None and f.fenced and f.master_key == KEY
        lac = s.ledger(12)
        assert lac is not None and lac.lac == 41 and lac.explicit_lac is not None
        with pytest.raises(UnauthorizedAccessError):
            s.handle(11, OTHER_KEY)
        await s.close()

    run(first())
    run(second())


def test_storage_index_says_present_but_bytes_gone_is_storage_error(tmp_path: Path) -> None:
    async def go() -> None:
        s = Storage(tmp_path)
        s.open()
        led = s.handle(1, KEY)
        s.add_entry(led, 0, body(1, 0))
        await s.journal.drain()
        for file_no, path in jr.list_files(st.journal_dir(tmp_path)):
            s.journal.forget_file(file_no)
            path.unlink()
        with pytest.raises(StorageError) as info:
            s.read(1, 0)
        assert not isinstance(info.value, NoSuchEntryError)
        await s.close()

    run(go())


def test_offline_delete_and_corrupt_helpers(tmp_path: Path) -> None:
    async def write() -> None:
        s = Storage(tmp_path)
        s.open()
        led = s.handle(5, KEY)
        for e in range(6):
            s.add_entry(led, e, body(5, e, payload=b"hello-%d" % e))
        await s.close()

    run(write())
    assert datadir.stored_entries(tmp_path) == {5: [0, 1, 2, 3, 4, 5]}
    assert datadir.delete_entries(tmp_path, 5, [1, 5, 77]) == [1, 5]
    datadir.corrupt_entry(tmp_path, 5, 3)
    assert datadir.stored_entries(tmp_path) == {5: [0, 2, 3, 4]}
    corrupted = datadir.read_stored_entry(tmp_path, 5, 3)
    original = body(5, 3, payload=b"hello-3")
    assert corrupted[:-1] == original[:-1] and corrupted[-1] == original[-1] ^ 0xFF

    async def reopen() -> None:
        s = Storage(tmp_path)
        s.open()
        with pytest.raises(NoSuchEntryError):
            s.read(5, 1)
        assert s.read(5, -1) == body(5, 4, payload=b"hello-4")  # 5 is gone: 4 is the last
        assert s.read(5, 3) == corrupted
        # Live helpers do the same on a running bookie.
        deleted, seq = s.delete_entries(5, [0, 9])
        assert deleted == [0]
        await s.journal.wait_durable(seq)
        await s.corrupt_entry(5, 4, offset=0)
        assert s.read(5, 4)[0] == body(5, 4)[0] ^ 0xFF
        await s.close()

    run(reopen())
    assert datadir.stored_entries(tmp_path) == {5: [2, 3, 4]}
