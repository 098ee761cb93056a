"""An S3 warehouse in each engine's words (jobs/tables/object_store.py, jobs/spark/s3.py):
pure functions of the URI and the AWS environment, never a credential."""

from __future__ import annotations

import pytest

from jobs.spark.s3 import LOG_STORE_CLASS, UnsafeLogStore, check_log_store, s3a_conf
from jobs.tables.object_store import (
    delta_storage_options,
    is_s3,
    s3_location,
    set_retry_budget,
    spark_uri,
)

ENV = {
    "AWS_ENDPOINT_URL": "http://minio:9000",
    "AWS_REGION": "eu-west-1",
    "AWS_ACCESS_KEY_ID": "key-id-1",
    "AWS_SECRET_ACCESS_KEY": "secret-2",
}


def test_s3_and_s3a_name_the_same_place() -> None:
    assert is_s3("s3://b/p") and is_s3("S3A://b/p") and not is_s3("/data/s3://x")
    assert not is_s3("gs://b/p") and not is_s3("s3:/b")
    assert spark_uri("s3://b/wh/t") == "s3a://b/wh/t" == spark_uri("s3a://b/wh/t")
    assert spark_uri("/data/wh") == "/data/wh"
    where = s3_location("s3a://ops/bkaudit/tables/")
    assert (where.bucket, where.prefix, where.key("x")) == (
        "ops",
        "bkaudit/tables",
        "bkaudit/tables/x",
    )
    assert s3_location("s3://ops").key("x") == "x"


def test_delta_rs_gets_the_endpoint_and_region_but_no_key() -> None:
    set_retry_budget(30)
    opts = delta_storage_options("s3://b/wh", ENV)
    assert opts == {
        "endpoint_url": "http://minio:9000",
        "virtual_hosted_style_request": "false",
        "allow_http": "true",
        "region": "eu-west-1",
        "retry_timeout": "30s",
    }
    https = delta_storage_options("s3://b/wh", {"AWS_ENDPOINT_URL_S3": "https://s3.local"})
    assert https["endpoint_url"] == "https://s3.local" and "allow_http" not in https
    assert delta_storage_options("s3://b/wh", {}) == {"retry_timeout": "30s"}  # AWS itself
    assert delta_storage_options("/data/wh", ENV) == {}
    set_retry_budget(10)
    assert delta_storage_options("s3://b/wh", {})["retry_timeout"] == "10s"
    set_retry_budget(30)


def test_spark_gets_the_same_facts_the_sdk_chain_and_the_log_store() -> None:
    conf = s3a_conf(ENV)
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://minio:9000"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert conf["spark.hadoop.fs.s3a.endpoint.region"] == "eu-west-1"
    assert conf["spark.delta.logStore.s3a.impl"] == LOG_STORE_CLASS
    assert "DefaultCredentialsProvider" in conf["spark.hadoop.fs.s3a.aws.credentials.provider"]
    assert not any(v in str(conf) for v in ("key-id-1", "secret-2"))
    assert "spark.hadoop.fs.s3a.endpoint" not in s3a_conf({})  # AWS's own endpoint


@pytest.mark.parametrize(
    "override",
    [
        {"spark.delta.logStore.s3a.impl": "io.delta.storage.S3SingleDriverLogStore"},
        {"spark.delta.logStore.s3.impl": "io.delta.storage.S3SingleDriverLogStore"},
        {"spark.delta.logStore.class": "io.delta.storage.HDFSLogStore"},
    ],
)
def test_another_log_store_for_s3_is_refused_naming_the_setting(override: dict[str, str]) -> None:
    conf = {**s3a_conf(ENV), **override}
    with pytest.raises(UnsafeLogStore, match=next(iter(override))):
        check_log_store(conf)
    check_log_store(s3a_conf(ENV))  # bkaudit's own passes


def test_no_log_store_at_all_is_refused() -> None:
    with pytest.raises(UnsafeLogStore, match="not set"):
        check_log_store({})
