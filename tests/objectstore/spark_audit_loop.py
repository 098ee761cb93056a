"""``python -m tests.objectstore.spark_audit_loop ZK WAREHOUSE RUNS``: RUNS Spark audits
(``local[2]``) in one driver, one after another, each committing its run as ``bkaudit audit
--executor spark`` does; prints each run's summary line. One of the writers of
tests/objectstore/test_s3_writers.py."""

from __future__ import annotations

import argparse
import sys

from jobs.commands.audit import add_audit_arguments, run_audit
from jobs.spark.session import build_spark


def main(argv: list[str]) -> int:
    zk, warehouse, runs = argv[0], argv[1], int(argv[2])
    spark = build_spark("bkaudit-s3-writers", master="local[2]", warehouse=warehouse)
    try:
        for _ in range(runs):
            ns = add_audit_arguments(argparse.ArgumentParser()).parse_args(
                ["--zk", zk, "--warehouse", warehouse, "--check", "lost", "--executor", "spark"]
            )
            rc = run_audit(ns, spark=spark)
            if rc not in (0, 1):
                return rc
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
