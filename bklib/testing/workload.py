"""A realistic write workload for the sandbox: many ledgers through the real writer, with
several ensemble/quorum shapes and some ledgers left open (their writer gone, as after a
crashed Pulsar broker). Used by the demo and the end-to-end benchmarks."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Mapping
from dataclasses import dataclass

from bklib.client.pool import BookieClientPool
from bklib.client.reader import ClientContext
from bklib.client.writer import LedgerWriter
from bklib.meta.model import DigestType
from bklib.meta.store import LedgerStore
from bklib.meta.stores import open_store
from bklib.states import DEFAULT_LEDGERS_ROOT

log = logging.getLogger(__name__)

# (E, WQ, AQ) shapes seen under Pulsar: the default 2/2/2, 3/2/2 striping, 3/3/2, 5/3/2.
SHAPES: tuple[tuple[int, int, int], ...] = ((2, 2, 2), (3, 2, 2), (3, 3, 2), (5, 3, 2))
PASSWORD = b"bkaudit-demo"


@dataclass(frozen=True)
class WrittenLedger:
    ledger_id: int
    shape: tuple[int, int, int]
    entries: int  # acknowledged entries: 0..entries-1
    closed: bool
    payload_size: int


async def write_ledgers(
    zk_connect: str,
    count: int,
    *,
    seed: int = 7,
    max_entries: int = 200,
    payload_size: int = 1024,
    open_fraction: float = 0.1,
    concurrency: int = 16,
    ledgers_root: str = DEFAULT_LEDGERS_ROOT,
    shapes: tuple[tuple[int, int, int], ...] = SHAPES,
    custom_metadata: Mapping[str, bytes] | None = None,
) -> list[WrittenLedger]:
    """Write ``count`` ledgers with 1..``max_entries`` entries each; close most of them.
    ``custom_metadata`` tags every ledger (default: ``application=bkaudit-demo``)."""
    rng = random.Random(seed)
    plan = [
        (rng.choice(shapes), rng.randint(1, max_entries), rng.random() >= open_fraction)
        for _ in range(count)
    ]
    zk = open_store(zk_connect, timeout=15)
    done: list[WrittenLedger] = []
    try:
        writable = await asyncio.get_running_loop().run_in_executor(
            None, lambda: len(zk.children(f"{ledgers_root}/available")) - 1
        )
        usable = [p for p in plan if p[0][0] <= writable]
        if len(usable) < len(plan):
            log.warning("only %d writable bookies: skipping wider ensembles", writable)
        async with BookieClientPool(zk, ledgers_root=ledgers_root) as pool:
            ctx = ClientContext(LedgerStore(zk, ledgers_root), pool)
            sem = asyncio.Semaphore(concurrency)

            async def one(shape: tuple[int, int, int], n: int, close: bool) -> None:
                async with sem:
                    e, wq, aq = shape
                    w = await LedgerWriter.create(
                        ctx,
                        ensemble_size=e,
                        write_quorum=wq,
                        ack_quorum=aq,
                        digest_type=DigestType.CRC32C,
                        password=PASSWORD,
                        custom_metadata=dict(custom_metadata or {"application": b"bkaudit-demo"}),
                    )
                    payload = bytes(rng.getrandbits(8) for _ in range(16)) * (payload_size // 16)
                    futs = [w.add_async(payload) for _ in range(n)]
                    await asyncio.gather(*futs)
                    if close:
                        await w.close()
                    else:
                        await w.abort()  # the writer "dies": the ledger stays OPEN
                    done.append(WrittenLedger(w.ledger_id, shape, n, close, len(payload)))

            await asyncio.gather(*(one(*p) for p in usable))
    finally:
        zk.close()
    return sorted(done, key=lambda w: w.ledger_id)
