"""Can an S3 warehouse take a run? Asked before any cluster work, answered in one line.

With the AWS chain's credentials (never a flag; :mod:`jobs.tables.object_store`), under the
warehouse's prefix:

1. list one key: the endpoint answers, the credentials are accepted, the bucket exists;
2. create a probe key with ``If-None-Match: *``: the credentials may write;
3. create it again the same way: the store must refuse (412). Every writer's commit is such
   a create, and the refusal is what keeps two writers from overwriting each other's commit
   (docs/tables.md, "Object storage"). A store that accepts the second create would lose
   commits silently, so the warehouse is refused;
4. delete it: retention and ``maintain`` delete files.

Each failure is a :class:`~jobs.tables.warehouse_probe.WarehouseUnusable` naming the
warehouse and what to fix. The probe costs four requests, once per process.
"""

from __future__ import annotations

import os
import re
import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

from jobs.tables.object_store import S3Location, s3_endpoint, s3_location, s3_region
from jobs.tables.warehouse_errors import WarehouseUnreachable, WarehouseUnusable

__all__ = ["PROBE_DIR", "probe_s3", "s3_client", "unreachable_reason"]

PROBE_DIR = "_bkaudit_probe"
"""Where under the warehouse's prefix the probe key is written (and deleted at once)."""

_NO_BUCKET = ("NoSuchBucket",)
_BAD_CREDENTIALS = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken")
_DENIED = ("AccessDenied", "403", "Forbidden", "AllAccessDisabled")


def s3_client() -> Any:
    """A boto3 S3 client told what the AWS environment says (endpoint, path-style addressing
    for an endpoint of one's own, region), with boto3's own credential chain; two attempts
    and short timeouts: a probe, not a transfer."""
    import boto3
    from botocore.config import Config

    endpoint = s3_endpoint()
    config = Config(
        connect_timeout=5,
        read_timeout=10,
        retries={"max_attempts": 2, "mode": "standard"},
        s3={"addressing_style": "path"} if endpoint else None,
    )
    return boto3.session.Session().client(
        "s3", endpoint_url=endpoint, region_name=s3_region() or "us-east-1", config=config
    )


def probe_s3(warehouse: str) -> None:
    """Raise :class:`WarehouseUnusable` when the S3 warehouse cannot be reached, read,
    written and deleted from, or does not refuse a create of an existing key
    (:class:`WarehouseUnreachable` when the store did not answer). Only botocore's errors are
    classified; anything else is a fault of this code and propagates."""
    where = s3_location(warehouse)
    key = where.key(f"{PROBE_DIR}/{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    with _step(warehouse, where, "list"):
        client = s3_client()
        client.list_objects_v2(Bucket=where.bucket, Prefix=where.key(""), MaxKeys=1)
    with _step(warehouse, where, "write"):
        _create(client, where.bucket, key)
    try:
        with _step(warehouse, where, "write"):
            refused = _refuses_second_create(client, where.bucket, key)
    finally:
        with _step(warehouse, where, "delete"):
            client.delete_object(Bucket=where.bucket, Key=key)
    if not refused:
        raise WarehouseUnusable(
            f"warehouse {warehouse}: the object store accepted a second create of one key "
            "(If-None-Match: * ignored), so two writers could overwrite each other's commits; "
            "use a store that honours conditional writes (docs/tables.md, Object storage)"
        )


@contextmanager
def _step(warehouse: str, where: S3Location, step: str) -> Iterator[None]:
    """One probe request: botocore's errors become one line, an unanswered request
    :class:`WarehouseUnreachable`, any other :class:`WarehouseUnusable`."""
    from botocore.exceptions import BotoCoreError, ClientError
    from botocore.exceptions import ConnectionError as BotoConnectionError

    try:
        yield
    except BotoConnectionError as exc:  # refused, unresolvable, timed out
        raise WarehouseUnreachable(_why(warehouse, where, exc, step)) from None
    except (BotoCoreError, ClientError) as exc:
        raise WarehouseUnusable(_why(warehouse, where, exc, step)) from None


def unreachable_reason(uri: str) -> str | None:
    """Why the store of S3 location ``uri`` does not answer (``endpoint http://…: Connection
    refused``), or None when it answers: for an error that does not say so itself (Arrow
    reports a file it could not fetch as "0 bytes"). Only the message depends on it: the
    caller raises its error either way."""
    from botocore.exceptions import BotoCoreError, ClientError
    from botocore.exceptions import ConnectionError as BotoConnectionError

    where = s3_location(uri)
    try:
        s3_client().list_objects_v2(Bucket=where.bucket, Prefix=where.key(""), MaxKeys=1)
    except BotoConnectionError as exc:
        return _connection_cause(exc)
    except (BotoCoreError, ClientError):  # it answered, if only with an error
        return None
    return None


def _create(client: Any, bucket: str, key: str) -> None:
    client.put_object(Bucket=bucket, Key=key, Body=b"bkaudit warehouse probe\n", IfNoneMatch="*")


def _refuses_second_create(client: Any, bucket: str, key: str) -> bool:
    from botocore.exceptions import ClientError

    try:
        _create(client, bucket, key)
    except ClientError as exc:
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return status in (409, 412)
    return False


def _connection_cause(exc: BaseException) -> str:
    """``endpoint http://HOST:PORT: Connection refused`` from botocore's connection error
    (its own text is the whole request URL without the reason)."""
    kwargs = getattr(exc, "kwargs", {}) or {}
    url = urlsplit(str(kwargs.get("endpoint_url", "")))
    where = f"endpoint {url.scheme}://{url.netloc}" if url.netloc else "the endpoint"
    cause = str(kwargs.get("error") or exc)
    match = re.search(r"\[Errno -?\d+\] ([^\])'\"]+)", cause)
    return f"{where}: {match.group(1).strip() if match else cause.splitlines()[0]}"


def _why(warehouse: str, where: S3Location, exc: BaseException, step: str) -> str:
    """One line for a failed probe step: the bucket missing, the credentials missing, wrong
    or without the permission, the endpoint unreachable; else botocore's first line."""
    from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

    head = f"warehouse {warehouse}"
    if isinstance(exc, NoCredentialsError):
        return (
            f"{head} cannot be reached: no credentials (AWS: the environment, a profile or a "
            "ServiceAccount's web identity; never a flag)"
        )
    if isinstance(exc, EndpointConnectionError):
        return f"{head} cannot be reached: {_connection_cause(exc)}"
    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code in _NO_BUCKET:
            return f"{head}: bucket {where.bucket} does not exist"
        if code in _BAD_CREDENTIALS:
            return f"{head}: the AWS credentials were refused ({code})"
        if code == "NotImplemented" and step == "write":
            return (
                f"{head}: the object store does not implement conditional creates "
                "(If-None-Match: *), which every writer's commit needs (docs/tables.md, "
                "Object storage)"
            )
        if code in _DENIED:
            what = {"list": "list", "write": "write to", "delete": "delete from"}[step]
            return f"{head}: the AWS credentials may not {what} it ({code})"
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"{head} cannot be reached: {first}"
