"""The S3-compatible server the object-store tests rely on (bklib.testing.s3server), held to
what Delta's commits need of S3: of writers racing to create one key with ``If-None-Match: *``,
exactly one wins and the others get 412; a listing shows every key written before it; and
delta-rs writers in several processes appending to one table on it keep every commit. A
server that checked before writing fails the first (s3proxy before 4.0.0), one whose listing
lags fails the second and the third (s3proxy 4.0.0)."""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from bklib.testing.s3server import REGION, S3Server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with S3Server(tmp_path_factory.mktemp("s3")) as server:
        yield server


def _client(s3: S3Server) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=s3.endpoint,
        region_name=REGION,
        aws_access_key_id=s3.access_key,
        aws_secret_access_key=s3.secret_key,
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )


def _race(s3: S3Server, bucket: str, key: str, writers: int) -> list[tuple[int, str]]:
    """``writers`` threads, each with its own client, PUT ``key`` with ``If-None-Match: *``
    at once (a barrier lines them up): (writer, "won" or the error code) for each."""
    from botocore.exceptions import ClientError

    barrier = threading.Barrier(writers)
    outcomes: list[tuple[int, str]] = []
    lock = threading.Lock()

    def put(i: int) -> None:
        client = _client(s3)
        body = f"writer {i}".encode()
        barrier.wait()
        try:
            client.put_object(Bucket=bucket, Key=key, Body=body, IfNoneMatch="*")
            outcome = "won"
        except ClientError as exc:
            outcome = str(exc.response["Error"]["Code"])
        with lock:
            outcomes.append((i, outcome))

    threads = [threading.Thread(target=put, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return outcomes


def test_racing_creates_of_one_key_have_exactly_one_winner(s3: S3Server) -> None:
    s3.make_bucket("race")
    for round_ in range(20):
        key = f"_delta_log/{round_:020d}.json"
        outcomes = _race(s3, "race", key, 8)
        winners = [i for i, o in outcomes if o == "won"]
        assert len(winners) == 1, outcomes
        assert {o for _, o in outcomes if o != "won"} == {"PreconditionFailed"}, outcomes
        body = _client(s3).get_object(Bucket="race", Key=key)["Body"].read()
        assert body == f"writer {winners[0]}".encode()  # the winner's, never overwritten


def test_a_listing_shows_every_key_written_before_it(s3: S3Server) -> None:
    """One writer creates 300 keys in order while another client lists them: every listing is
    a run without gaps from the first key (Delta reads its log this way)."""
    s3.make_bucket("listing")
    done = threading.Event()
    gaps: list[list[int]] = []

    def write() -> None:
        client = _client(s3)
        try:
            for i in range(300):
                client.put_object(Bucket="listing", Key=f"log/{i:020d}.json", Body=b"x" * 700)
        finally:
            done.set()

    writer = threading.Thread(target=write)
    writer.start()
    client = _client(s3)
    listings = 0
    while not done.is_set():
        found = client.list_objects_v2(Bucket="listing", Prefix="log/").get("Contents", [])
        versions = [int(o["Key"].split("/")[1].split(".")[0]) for o in found]
        if versions != list(range(len(versions))):
            gaps.append(versions)
        listings += 1
    writer.join(60)
    assert listings > 10 and not gaps, (listings, gaps[:2])


def _append(uri: str, options: dict[str, str], writer: int, commits: int) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    for n in range(commits):
        table = pa.table({"writer": [writer] * 3, "n": [n] * 3})
        write_deltalake(uri, table, mode="append", storage_options=options)


def test_delta_rs_writers_in_several_processes_keep_every_commit(s3: S3Server) -> None:
    """Four processes append ten times each to one table: 40 commits after the creation, and
    every row of each of them there."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    uri = s3.make_bucket("delta") + "/wh/t"
    options = s3.storage_options()
    write_deltalake(uri, pa.table({"writer": [-1], "n": [-1]}), storage_options=options)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_append, args=(uri, options, w, 10)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(240)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    table = DeltaTable(uri, storage_options=options)
    assert table.version() == 40
    rows = table.to_pyarrow_table().to_pylist()
    assert len(rows) == 1 + 4 * 10 * 3
    for w in range(4):
        assert sorted({r["n"] for r in rows if r["writer"] == w}) == list(range(10))
    assert len(table.history()) == 41


def test_a_bucket_is_a_directory_of_the_backend(s3: S3Server) -> None:
    """A bucket is a directory of the backend: what a test made is there, and a listing over
    S3 names it."""
    s3.make_bucket("listed")
    names = {b["Name"] for b in _client(s3).list_buckets()["Buckets"]}
    assert "listed" in names and (s3.buckets / "listed").is_dir()
