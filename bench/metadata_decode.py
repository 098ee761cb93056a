"""Benchmark: the CPU a scan spends on each ledger once its znode is read, with no server.

It builds distinct Pulsar-like ledger znodes (v3, two segments of E3/W2/A2, 80% closed, one
of 2,000 topics each) and times, per ledger, best of ``--repeat``:

- ``decode``: :func:`bklib.meta.serde.decode_metadata`;
- ``decode+view``: that and :meth:`bklib.audit.model.LedgerView.from_metadata`, the audit's
  view of the ledger;
- ``pickle`` (with ``--pickle``): one view pickled and unpickled, what shipping views between
  processes would cost.

This machine's speed drifts by a third within an hour, so the instruction count is the steadier
figure for a change to this path: run it under
``valgrind --tool=cachegrind --cache-sim=no`` with and without ``--setup-only`` and divide
the difference by ``--ledgers`` x ``--repeat`` (docs/benchmarks.md).

    .venv/bin/python bench/metadata_decode.py [--ledgers 20000] [--repeat 7] [--pickle]
"""

from __future__ import annotations

import argparse
import json
import pickle
import random
import time

from bklib.audit.model import LedgerView
from bklib.meta.model import DigestType, LedgerMetadata, LedgerState, Segment
from bklib.meta.serde import decode_metadata, encode_metadata


def znodes(n: int, seed: int = 1) -> list[bytes]:
    """``n`` distinct ledger znodes, as the scale harness's seeder writes them."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ensemble = tuple(f"10.0.{rng.randrange(3)}.{rng.randrange(100)}:3181" for _ in range(3))
        closed = rng.random() < 0.8
        md = LedgerMetadata(
            ledger_id=i, ensemble_size=3, write_quorum=2, ack_quorum=2,
            segments=(Segment(0, ensemble), Segment(500, ensemble[::-1])),
            state=LedgerState.CLOSED if closed else LedgerState.OPEN,
            last_entry_id=999 if closed else -1, length=123_456 if closed else 0,
            digest_type=DigestType.CRC32C, password=b"pw", ctime=1_700_000_000_000,
            custom_metadata={
                "component": b"managed-ledger", "application": b"pulsar",
                "pulsar/managed-ledger": f"tenant-1/ns-2/persistent/topic-{i % 2000}".encode(),
            },
        )  # fmt: skip
        out.append(encode_metadata(md))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ledgers", type=int, default=20_000)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--pickle", action="store_true", help="also time pickling the views")
    p.add_argument("--setup-only", action="store_true", help="build the znodes, time nothing")
    args = p.parse_args()
    data = znodes(args.ledgers)
    if args.setup_only:
        return
    path = "/ledgers/00/0000/L0001"
    best = {"decode": float("inf"), "decode+view": float("inf"), "pickle": float("inf")}
    for _ in range(args.repeat):
        t0 = time.process_time()
        mds = [decode_metadata(d, i, znode_ctime_ms=1) for i, d in enumerate(data)]
        t1 = time.process_time()
        views = [LedgerView.from_metadata(md, path, 1) for md in mds]
        t2 = time.process_time()
        best["decode"] = min(best["decode"], t1 - t0)
        best["decode+view"] = min(best["decode+view"], t2 - t0)
        if args.pickle:
            pickle.loads(pickle.dumps(views, protocol=pickle.HIGHEST_PROTOCOL))
            best["pickle"] = min(best["pickle"], time.process_time() - t2)
    per = {k: round(v / args.ledgers * 1e6, 2) for k, v in best.items() if v != float("inf")}
    print(json.dumps({"ledgers": args.ledgers, "cpu_us_per_ledger": per}))


if __name__ == "__main__":
    main()
