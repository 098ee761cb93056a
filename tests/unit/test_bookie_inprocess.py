"""The Bookie class in-process without ZooKeeper (as a sandbox may embed it), over real
sockets; and the journal's behaviour when the disk fails under it."""

from __future__ import annotations

import asyncio
import os
import struct
from pathlib import Path

import pytest

from bklib.bookie import journal as jr
from bklib.bookie.faults import AdminClient
from bklib.bookie.main import Bookie, BookieConfig
from bklib.digest import master_key
from bklib.proto import protocol_pb2 as pb
from bklib.testing.frames import read_frame, write_frame

KEY = master_key(b"")


def _add(txn: int, ledger: int, entry: int) -> bytes:
    req = pb.Request()
    req.header.version = pb.VERSION_THREE
    req.header.operation = pb.ADD_ENTRY
    req.header.txnId = txn
    a = req.addRequest
    a.ledgerId, a.entryId, a.masterKey = ledger, entry, KEY
    a.body = struct.pack(">qqqq", ledger, entry, entry - 1, 10 * (entry + 1)) + b"0123456789"
    return req.SerializeToString()


def test_bookie_without_zookeeper_serves_and_restarts(tmp_path: Path) -> None:
    async def session(expect_existing: bool) -> None:
        bookie = Bookie(BookieConfig(data_dir=tmp_path, port=0, fault_injection=True))
        await bookie.start()
        try:
            assert bookie.bookie_id == f"127.0.0.1:{bookie.port}"
            reader, writer = await asyncio.open_connection("127.0.0.1", bookie.port)
            base = 100 if expect_existing else 0
            for i in range(50):
                write_frame(writer, _add(base + i + 1, 1, base + i))
            await writer.drain()
            replies = [pb.Response.FromString(await read_frame(reader)) for _ in range(50)]
            assert sorted(r.header.txnId for r in replies) == list(range(base + 1, base + 51))
            assert {r.status for r in replies} == {pb.EOK}
            assert bookie.storage is not None
            assert sorted(bookie.storage.ledgers[1].entries) == (
                list(range(50)) + list(range(100, 150)) if expect_existing else list(range(50))
            )
            # The admin port works in-process too (run the blocking client off the loop).
            status = await asyncio.to_thread(AdminClient.for_data_dir(tmp_path).status)
            assert status["ledgers"] == 1 and status["readonly"] is False
            await bookie.set_readonly(True)
            write_frame(writer, _add(999, 1, 999))
            assert pb.Response.FromString(await read_frame(reader)).status == pb.EREADONLY
            writer.close()
        finally:
            await bookie.stop()

    asyncio.run(session(False))
    asyncio.run(session(True))


def test_journal_write_failure_fails_waiters_and_later_appends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def go() -> None:
        j = jr.Journal(tmp_path)
        j.open()
        j.append(jr.REC_ENTRY, 1, 0, b"ok")
        await j.drain()

        def broken(fd: int) -> None:
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(os, "fdatasync", broken)
        j.append(jr.REC_ENTRY, 1, 1, b"lost")
        outcome: list[BaseException | None] = []
        j.when_durable(j.pending_seq, outcome.append)
        with pytest.raises(jr.JournalError):
            await j.wait_durable(j.pending_seq)
        assert isinstance(outcome[0], OSError)
        assert j.failed is not None
        with pytest.raises(jr.JournalError):
            j.append(jr.REC_ENTRY, 1, 2, b"refused")
        monkeypatch.undo()
        await j.close()

    asyncio.run(go())
