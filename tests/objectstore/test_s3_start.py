"""An S3 warehouse that cannot take a run is one line and exit 2, before the cluster is read
(docs/tables.md, "Object storage"): a missing bucket, refused credentials, credentials that
may not write, a store that does not refuse a second create of one key (whose writers could
overwrite each other's commits), and a Spark session configured with a log store that can
lose a commit. Each runs the real ``bkaudit`` against the real S3-compatible server (through
a small proxy where a store's answer is changed); the ZooKeeper address given is a port
nobody listens on, so a line about the warehouse proves it was asked first."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bklib.testing.ports import free_port
from bklib.testing.s3server import S3Server
from tests.cli_helpers import REPO, bkaudit, failure, one_error_line
from tests.objectstore.conftest import aws_env
from tests.objectstore.proxy import deny_writes, ignore_conditions, s3_proxy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def _audit(warehouse: str, *more: str) -> list[str]:
    return ["audit", "--zk", f"127.0.0.1:{free_port()}", "--warehouse", warehouse, *more]


def test_a_missing_bucket_is_one_line_before_the_cluster(s3: S3Server) -> None:
    proc = bkaudit(*_audit("s3://no-such-bucket/wh"), env=aws_env(s3))
    line = one_error_line(proc)
    assert "warehouse s3://no-such-bucket/wh: bucket no-such-bucket does not exist" in line


def test_refused_credentials_are_one_line_before_the_cluster(s3: S3Server, bucket: str) -> None:
    proc = bkaudit(*_audit(f"{bucket}/wh"), env=aws_env(s3, AWS_SECRET_ACCESS_KEY="wrong-1e9c"))
    line = one_error_line(proc)
    assert f"warehouse {bucket}/wh: the AWS credentials were refused" in line, line
    assert "wrong-1e9c" not in proc.stderr + proc.stdout


def test_credentials_that_may_not_write_are_one_line_before_the_cluster(
    s3: S3Server, bucket: str
) -> None:
    with s3_proxy(s3, deny_writes) as proxy:
        proc = bkaudit(*_audit(f"{bucket}/wh"), env=aws_env(s3, AWS_ENDPOINT_URL=proxy.endpoint))
    line = one_error_line(proc)
    assert f"warehouse {bucket}/wh: the AWS credentials may not write to it" in line, line


def test_a_store_that_ignores_conditional_creates_is_refused(s3: S3Server, bucket: str) -> None:
    direct = bkaudit(*_audit(f"{bucket}/wh"), env=aws_env(s3))
    assert "cannot connect to ZooKeeper" in one_error_line(direct), failure(direct)
    with s3_proxy(s3, ignore_conditions) as proxy:
        proc = bkaudit(*_audit(f"{bucket}/wh"), env=aws_env(s3, AWS_ENDPOINT_URL=proxy.endpoint))
    line = one_error_line(proc)
    assert "accepted a second create of one key" in line, line
    assert "overwrite each other's commits" in line, line


def test_spark_submit_with_delta_s_own_s3_log_store_is_refused(s3: S3Server, bucket: str) -> None:
    import pyspark

    from jobs.spark.s3 import s3_jars

    spark_home = Path(pyspark.__file__).parent
    submit = spark_home / "bin" / "spark-submit"
    proc = subprocess.run(
        [
            str(submit), "--master", "local[1]", "--jars", ",".join(s3_jars(fetch=False)),
            "--conf", "spark.delta.logStore.s3a.impl=io.delta.storage.S3SingleDriverLogStore",
            "jobs/audit.py", *_audit(f"{bucket}/wh", "--executor", "spark")[1:],
        ],
        cwd=REPO, env=aws_env(s3, SPARK_HOME=str(spark_home), PYSPARK_PYTHON=sys.executable),
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert "spark.delta.logStore.s3a.impl is io.delta.storage.S3SingleDriverLogStore" in out, out
    assert "cannot connect to ZooKeeper" not in out
