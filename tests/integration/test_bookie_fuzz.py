"""Fuzzing the Python bookie's wire handling: garbage closes connections, never the server."""

from __future__ import annotations

import asyncio
import os
import random
import struct
from pathlib import Path

import pytest

from bklib.proto import protocol_pb2 as pb
from tests.bookie_helpers import KEY, BookieProcess, RawClient, entry_body

pytestmark = pytest.mark.integration

FRAMES = 12_000
CONCURRENCY = 32
SEED = int(os.environ.get("BKAUDIT_FUZZ_SEED", "20240917"))


def _valid_requests(rng: random.Random) -> list[bytes]:
    """A spread of well-formed requests to truncate and mutate."""
    reqs = []
    lid = rng.randrange(1, 50)
    for op in (pb.ADD_ENTRY, pb.READ_ENTRY, pb.READ_LAC, pb.WRITE_LAC, pb.FORCE_LEDGER):
        req = RawClient.request(op, priority=rng.choice([None, 0, 100]))
        if op == pb.ADD_ENTRY:
            req.addRequest.ledgerId = lid
            req.addRequest.entryId = rng.randrange(0, 20)
            req.addRequest.masterKey = KEY
            req.addRequest.body = entry_body(lid, req.addRequest.entryId, rng.randbytes(40))
        elif op == pb.READ_ENTRY:
            req.readRequest.ledgerId = lid
            req.readRequest.entryId = rng.choice([-1, 0, 5])
            if rng.random() < 0.3:
                req.readRequest.flag = pb.ReadRequest.FENCE_LEDGER
                req.readRequest.masterKey = KEY
        elif op == pb.READ_LAC:
            req.readLacRequest.ledgerId = lid
        elif op == pb.WRITE_LAC:
            req.writeLacRequest.ledgerId = lid
            req.writeLacRequest.lac = 1
            req.writeLacRequest.masterKey = KEY
            req.writeLacRequest.body = struct.pack(">qq", lid, 1) + b"dddd"
        else:
            req.forceLedgerRequest.ledgerId = lid
        reqs.append(req.SerializeToString())
    v2_add = struct.pack(">i", (2 << 24) | (1 << 16)) + KEY + entry_body(lid, 1, b"v2")
    v2_read = struct.pack(">iqq", (2 << 24) | (2 << 16) | 1, lid, -1) + KEY
    return [*reqs, v2_add, v2_read]


def _fuzz_frame(rng: random.Random) -> bytes:
    """One framed piece of garbage (or near-garbage)."""
    kind = rng.random()
    if kind < 0.25:  # random bytes
        msg = rng.randbytes(rng.randrange(0, 200))
        return struct.pack(">I", len(msg)) + msg
    if kind < 0.45:  # a valid request cut short, with a consistent length prefix
        msg = rng.choice(_valid_requests(rng))
        msg = msg[: rng.randrange(0, len(msg))]
        return struct.pack(">I", len(msg)) + msg
    if kind < 0.60:  # a valid request with a few bytes flipped
        msg = bytearray(rng.choice(_valid_requests(rng)))
        for _ in range(rng.randrange(1, 4)):
            msg[rng.randrange(len(msg))] = rng.randrange(256)
        return struct.pack(">I", len(msg)) + bytes(msg)
    if kind < 0.80:  # v2-looking: version byte 0..7, any opcode and flags, random tail
        head = bytes([rng.randrange(8), rng.randrange(10), rng.randrange(256), rng.randrange(256)])
        msg = head + rng.randbytes(rng.randrange(0, 80))
        return struct.pack(">I", len(msg)) + msg
    if kind < 0.90:  # huge or negative length prefix
        n = rng.choice([5 * 1024 * 1024 - 3, 1 << 30, 0x7FFFFFFF, 0xFFFFFFFF, 0x80000000])
        return struct.pack(">I", n) + rng.randbytes(rng.randrange(0, 16))
    # a length prefix promising more than will ever come (the client closes first)
    return struct.pack(">I", rng.randrange(10, 10_000)) + rng.randbytes(rng.randrange(0, 9))


async def _session(address: tuple[str, int], frames: list[bytes]) -> None:
    reader, writer = await asyncio.open_connection(*address)
    try:
        writer.write(b"".join(frames))
        await writer.drain()
        writer.write_eof()
        # The bookie closes after our EOF (or earlier, on garbage); drain its replies.
        await asyncio.wait_for(reader.read(-1), 30)
    except (ConnectionError, OSError):
        pass  # reset by the bookie: it refused our garbage, as it should
    finally:
        writer.close()


async def _fuzz(address: tuple[str, int], rng: random.Random) -> int:
    sent = 0
    sessions: list[list[bytes]] = []
    while sent < FRAMES:
        frames = [_fuzz_frame(rng) for _ in range(rng.randrange(1, 6))]
        sessions.append(frames)
        sent += len(frames)
    sem = asyncio.Semaphore(CONCURRENCY)

    async def one(frames: list[bytes]) -> None:
        async with sem:
            await _session(address, frames)

    await asyncio.gather(*(one(f) for f in sessions))
    return sent


def test_fuzzed_frames_never_take_the_bookie_down(zk_chroot: str, tmp_path: Path) -> None:
    rng = random.Random(SEED)
    bookie = BookieProcess(zk_chroot, tmp_path / "d", fault_injection=False)
    with bookie:
        with RawClient(bookie.address) as c:
            before = [entry_body(7777, e, b"before-%d" % e) for e in range(10)]
            for e, b in enumerate(before):
                assert c.add(7777, e, b) == pb.EOK
        sent = asyncio.run(_fuzz(bookie.address, rng))
        assert sent >= 10_000
        assert bookie.alive(), bookie.log_tail()
        # A well-formed client is served correctly, old data included.
        with RawClient(bookie.address) as c:
            for e, b in enumerate(before):
                r = c.read(7777, e)
                assert r.status == pb.EOK and r.readResponse.body == b
            assert c.add_many(8888, range(100), b"after" * 10) == [pb.EOK] * 100
            assert c.read(8888, -1).readResponse.body == entry_body(8888, 99, b"after" * 10)
            assert c.read(8888, 100).status == pb.ENOENTRY
    log = bookie.log_path.read_text(errors="replace")
    # Garbage is refused by design; an exception inside a handler would be a bug.
    assert "Traceback" not in log, f"seed {SEED}"
    assert "unexpected error" not in log, f"seed {SEED}"
