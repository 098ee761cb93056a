"""Benchmark: the memory of a scan's views (:class:`bklib.audit.model.LedgerView`) and of the
same ledgers as the ``ledgers`` table's Arrow rows (:mod:`jobs.local.ledger_columns`).

It encodes ``--ledgers`` ledgers of the scale plan (bklib/testing/scale/plan.py) as their
znodes would hold them, then decodes them as a scan does (``decode_metadata`` and
``LedgerView.from_metadata``) and keeps the views, then builds the rows from them. Printed as
one JSON object: the Python heap the views hold, per view (tracemalloc), and the bytes of the
Arrow rows, per ledger. ``--bookie-ids`` picks the ids' form: ``farm`` (``127.0.0.1:PORT``, the
scale farm's) or ``dns`` (a Kubernetes StatefulSet's, as Pulsar's chart names bookies).
``--no-sharing`` decodes without the decoder's shared bookie ids and passwords (the figure
before them).

    .venv/bin/python bench/view_memory.py [--ledgers 200000] [--bookies 100]
        [--bookie-ids farm|dns] [--no-sharing]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import tracemalloc
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

from bklib.audit.model import LedgerView  # noqa: E402
from bklib.meta import paths, serde  # noqa: E402
from bklib.testing.scale.plan import ScalePlan  # noqa: E402
from jobs.local.ledger_columns import LedgerColumns  # noqa: E402


def bookie_ids(form: str, n: int) -> tuple[str, ...]:
    if form == "farm":
        return tuple(f"127.0.0.1:{40000 + i}" for i in range(n))
    return tuple(f"pulsar-bookie-{i}.pulsar-bookie.pulsar.svc.cluster.local:3181" for i in range(n))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ledgers", type=int, default=200_000)
    ap.add_argument("--bookies", type=int, default=100)
    ap.add_argument("--bookie-ids", choices=("farm", "dns"), default="farm")
    ap.add_argument("--no-sharing", action="store_true")
    args = ap.parse_args()
    if args.no_sharing:
        serde._SHARED_MAX = -1  # emptied before every ensemble: nothing shared across ledgers
    plan = ScalePlan(ledgers=args.ledgers, bookies=bookie_ids(args.bookie_ids, args.bookies))
    znodes = [(lp.ledger_id, serde.encode_metadata(lp.metadata)) for lp in plan]
    tracemalloc.start()
    t0 = time.perf_counter()
    views = [
        LedgerView.from_metadata(
            serde.decode_metadata(data, lid), paths.ledger_path("/ledgers", lid), 0
        )
        for lid, data in znodes
    ]
    decoded = time.perf_counter() - t0
    held, _peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    columns = LedgerColumns("run")
    columns.take(views)
    rows = columns.table().nbytes
    n = args.ledgers
    print(
        json.dumps(
            {
                "ledgers": n,
                "bookies": args.bookies,
                "bookie_ids": args.bookie_ids,
                "shared_ids": not args.no_sharing,
                "view_bytes_each": round(held / n),
                "views_mb": round(held / 2**20, 1),
                "rows_bytes_each": round(rows / n),
                "rows_mb": round(rows / 2**20, 1),
                "decode_us_each_traced": round(decoded / n * 1e6, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
