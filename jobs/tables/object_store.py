"""A warehouse on S3 (or an S3-compatible store), in each engine's words.

Users give one URI, ``s3://bucket/prefix`` (``s3a://`` is the same place). delta-rs and
Arrow take ``s3://`` with storage options; Spark's Hadoop file system takes ``s3a://`` with
``fs.s3a.*`` settings (:mod:`jobs.spark.s3`). What they are told comes from the standard AWS
environment, read here once:

- the endpoint: ``AWS_ENDPOINT_URL_S3``, else ``AWS_ENDPOINT_URL`` (an S3-compatible server;
  path-style addressing then, as such servers expect); plain HTTP is allowed only when the
  endpoint says ``http://``;
- the region: ``AWS_REGION``, else ``AWS_DEFAULT_REGION``.

How long delta-rs retries one request against an unreachable store is this process's
:func:`retry_budget` (object_store's own default, three minutes, would hold a one-shot
command that long and the watch's loop on every write): 30 s, which rides out a blip, and
less for the watch, which spools rows the store does not take (docs/watch.md).

Credentials are never passed: each engine finds them itself through the AWS chain (the
environment, a profile, web identity for an IRSA-style ServiceAccount, the instance or pod's
role), so no key is ever in an argument, a log line or a table. docs/tables.md, "Object
storage".
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DEFAULT_RETRY_BUDGET",
    "S3_SCHEMES",
    "S3Location",
    "arrow_s3_filesystem",
    "delta_storage_options",
    "is_s3",
    "retry_budget",
    "s3_endpoint",
    "s3_location",
    "s3_region",
    "set_retry_budget",
    "spark_uri",
]

S3_SCHEMES = ("s3", "s3a")
"""The schemes naming an S3 location: ``s3://`` for users and delta-rs, ``s3a://`` for
Hadoop. Both are accepted everywhere and mean the same place."""


DEFAULT_RETRY_BUDGET = 30.0
"""Seconds delta-rs retries one request to S3 before the operation fails."""

_retry_budget = DEFAULT_RETRY_BUDGET


def retry_budget() -> float:
    """Seconds delta-rs retries one S3 request in this process."""
    return _retry_budget


def set_retry_budget(seconds: float) -> None:
    """Set this process's :func:`retry_budget` (the watch shortens it: it spools instead)."""
    global _retry_budget
    _retry_budget = max(1.0, float(seconds))


def is_s3(uri: str) -> bool:
    """True when ``uri`` names an S3 location (``s3://`` or ``s3a://``)."""
    scheme, sep, _ = uri.partition("://")
    return bool(sep) and scheme.lower() in S3_SCHEMES


@dataclass(frozen=True)
class S3Location:
    """A bucket and a key prefix (no leading or trailing slash; empty for the bucket root)."""

    bucket: str
    prefix: str

    def key(self, name: str) -> str:
        """The key of ``name`` under the prefix."""
        return f"{self.prefix}/{name}" if self.prefix else name


def s3_location(uri: str) -> S3Location:
    """The bucket and prefix of an ``s3://`` or ``s3a://`` URI."""
    _, _, rest = uri.partition("://")
    bucket, _, prefix = rest.partition("/")
    return S3Location(bucket, prefix.strip("/"))


def spark_uri(uri: str) -> str:
    """``uri`` as Spark's Hadoop file system names it: ``s3a://`` for an S3 location,
    anything else unchanged."""
    if is_s3(uri):
        return "s3a://" + uri.partition("://")[2]
    return uri


def s3_endpoint(environ: Mapping[str, str] | None = None) -> str | None:
    """The S3 endpoint the AWS environment names (``AWS_ENDPOINT_URL_S3`` first), or None
    for AWS's own."""
    env = os.environ if environ is None else environ
    return env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None


def s3_region(environ: Mapping[str, str] | None = None) -> str | None:
    """The region the AWS environment names (``AWS_REGION`` first), or None."""
    env = os.environ if environ is None else environ
    return env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None


def delta_storage_options(uri: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """delta-rs's storage options for ``uri``: for S3 the endpoint, region, path-style
    addressing with an endpoint of one's own, and plain HTTP when the endpoint is
    ``http://``; nothing for other locations. Never credentials (see the module)."""
    if not is_s3(uri):
        return {}
    options: dict[str, str] = {}
    endpoint = s3_endpoint(environ)
    if endpoint:
        options["endpoint_url"] = endpoint
        options["virtual_hosted_style_request"] = "false"
        if endpoint.lower().startswith("http://"):
            options["allow_http"] = "true"
    region = s3_region(environ)
    if region:
        options["region"] = region
    options["retry_timeout"] = f"{retry_budget():g}s"
    return options


def arrow_s3_filesystem(uri: str, environ: Mapping[str, str] | None = None) -> Any:
    """Arrow's own S3 file system rooted at ``uri``'s bucket and prefix (Arrow's C++ client,
    with the AWS chain's credentials): reading a table's files through it needs no Python
    callbacks into delta-rs (see :func:`jobs.tables.delta.arrow_dataset`)."""
    import pyarrow.fs as pa_fs

    endpoint = s3_endpoint(environ)
    fs = pa_fs.S3FileSystem(
        endpoint_override=endpoint,
        region=s3_region(environ) or "us-east-1",
        scheme="http" if endpoint and endpoint.lower().startswith("http://") else "https",
    )
    where = s3_location(uri)
    return pa_fs.SubTreeFileSystem(f"{where.bucket}/{where.prefix}".rstrip("/"), fs)
