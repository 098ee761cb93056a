"""Benchmark: what BookKeeper's under-replication marks cost to publish and to list, at the
size of one lost bookie at a million ledgers (docs/benchmarks.md, "The lost bookies change
during a repair").

A ZooKeeper server (1 GB heap) in a temporary directory; ``--marks`` marks published through
:meth:`~bklib.meta.underreplication.UnderReplicationManager.mark_many` (fifty to a ``multi``,
many in flight), then listed with ``list_underreplicated`` (the walk ``listunderreplicated``
does, a ``getChildren`` per hex dir and a ``getData`` per mark and per lock, pipelined fifty
to a ``multiRead``). The watch lists them in each cycle's snapshot.

    .venv/bin/python bench/marks_listing.py [--marks 44000] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

from bklib.meta.stores import open_store  # noqa: E402
from bklib.meta.underreplication import UnderReplicationManager  # noqa: E402
from bklib.testing.zkserver import ZooKeeperServer  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--marks", type=int, default=44_000)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="marks-listing-") as tmp,
        ZooKeeperServer(Path(tmp) / "zk", heap="1g") as zk,
        open_store(zk.connect_string, timeout=30) as store,
    ):
        urm = UnderReplicationManager(store)
        urm.ensure_layout()
        # Spread over the id space as a cluster's ledgers are (each its own hex dir).
        wanted = {lid * 23: ["10.0.0.1:3181"] for lid in range(args.marks)}
        t0 = time.monotonic()
        urm.mark_many(wanted)
        t1 = time.monotonic()
        listed = sum(1 for _ in urm.list_underreplicated())
        t2 = time.monotonic()
    out = {
        "marks": args.marks,
        "mark_many_s": round(t1 - t0, 1),
        "list_s": round(t2 - t1, 1),
        "listed": listed,
    }
    print(json.dumps(out))
    if args.json:
        with args.json.open("a") as f:
            f.write(json.dumps({"bench": "marks_listing", **out}) + "\n")


if __name__ == "__main__":
    main()
