"""Benchmark: the warehouse on S3 against the same warehouse on local disk.

Starts the suite's S3-compatible server (s3proxy 4.1.0, ``bklib/testing/s3server.py``, on
loopback: the store's own cost, not a network's), uploads a local warehouse to it, and times
on each side:

- a local audit's commit: the latest audit run's rows (``ledgers``, ``bookies``,
  ``underreplicated_fragments`` in parallel, then ``audit_runs``) appended again under a new
  run id, as ``jobs.local.audit.LocalAudit.load`` commits them;
- ``bkaudit listunderreplicated`` and ``bkaudit report`` as separate processes (wall, CPU, peak
  RSS), ``--repeat`` times each.

The warehouse is the one ``bench/warehouse_history.py --workdir DIR`` grows and ``maintain``s
(30 daily audits and repairs): ``bench/scale.py --ledgers 100000 --repair --keep-warehouse BASE``,
then ``bench/warehouse_history.py BASE --workdir DIR``, then

    .venv/bin/python bench/s3_warehouse.py DIR/wh [--repeat 3] [--json FILE]

Figures go to docs/benchmarks.md with the commands that produced them.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow.compute as pc

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

from bench.warehouse_history import PER_AUDIT_RUN, _with, append_json, timed  # noqa: E402
from bklib.testing.s3server import S3Server  # noqa: E402
from jobs.tables import delta  # noqa: E402
from jobs.tables.runs import new_run_id  # noqa: E402
from jobs.tables.schema import AUDIT_RUNS, RUN_DATE  # noqa: E402


def upload(local: Path, s3: S3Server, bucket: str) -> str:
    """Every file of ``local`` to ``s3://bucket/wh/...`` through the S3 API; the URI."""
    import boto3
    from botocore.config import Config

    client = boto3.client(
        "s3", endpoint_url=s3.endpoint, region_name="us-east-1",
        aws_access_key_id=s3.access_key, aws_secret_access_key=s3.secret_key,
        config=Config(s3={"addressing_style": "path"}),
    )  # fmt: skip
    files = [p for p in local.rglob("*") if p.is_file() and not p.name.endswith(".crc")]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda p: client.upload_file(str(p), bucket, f"wh/{p.relative_to(local)}"),
                      files))  # fmt: skip
    return f"s3://{bucket}/wh"


def commit(wh: str) -> dict[str, Any]:
    """The latest audit's rows appended again under a new run id, as an audit commits them;
    seconds for the per-run tables (in parallel) and for the run's row."""
    runs = delta.read_arrow(wh, AUDIT_RUNS)
    latest = max(runs.to_pylist(), key=lambda r: r["started_at"])
    rid = new_run_id()
    tables = {}
    for name in PER_AUDIT_RUN:
        t = delta.read_arrow(wh, name, filters=[("run_id", "=", latest["run_id"])])
        tables[name] = _with(
            t.drop_columns([RUN_DATE]), "run_id", rid, t.schema.field("run_id").type
        )
    own = runs.filter(pc.equal(runs.column("run_id"), latest["run_id"]))
    own = _with(own, "run_id", rid, own.schema.field("run_id").type)
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(len(tables)) as pool:
        list(pool.map(lambda kv: delta.append_arrow(wh, kv[0], kv[1]), tables.items()))
    t1 = time.monotonic()
    delta.append_arrow(wh, AUDIT_RUNS, own)
    t2 = time.monotonic()
    return {
        "rows": {n: t.num_rows for n, t in tables.items()},
        "per_run_tables_s": round(t1 - t0, 2),
        "audit_runs_s": round(t2 - t1, 2),
        "commit_s": round(t2 - t0, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("warehouse", type=Path, help="a local warehouse (DIR/wh)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bkaudit-s3-bench-") as tmp, S3Server(Path(tmp)) as s3:
        s3.make_bucket("bench")
        t0 = time.monotonic()
        s3_wh = upload(args.warehouse, s3, "bench")
        print(json.dumps({"upload_s": round(time.monotonic() - t0, 1)}), flush=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update({k: v for k, v in s3.env().items() if k != "AWS_ALLOW_HTTP"})
        os.environ.update(env)
        sides = {"local": str(args.warehouse), "s3": s3_wh}
        for side, wh in sides.items():
            for _ in range(args.repeat):
                r = {"side": side, "what": "audit commit", **commit(wh)}
                print(json.dumps(r), flush=True)
                results.append(r)
        for _ in range(args.repeat):
            for side, wh in sides.items():
                for name, argv in {
                    "listunderreplicated": ["listunderreplicated", "--warehouse", wh],
                    "report": ["report", "--warehouse", wh, "--out", f"{tmp}/r-{side}.html"],
                }.items():
                    results.append({"side": side, **timed(f"{name} ({side})", argv)})
    append_json(args.json, results)


if __name__ == "__main__":
    main()
