"""The real S3-compatible server (s3proxy, bklib.testing.s3server) the object-store tests
write their warehouses to, and the environment a bkaudit process is given to reach it: the
standard AWS variables only, as an operator's shell or a pod would have them."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from bklib.testing.s3server import S3Server


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """One server per test process (buckets are directories: each test makes its own)."""
    with S3Server(tmp_path_factory.mktemp("s3")) as server:
        yield server


def no_aws_env() -> dict[str, str]:
    """This process's environment without any AWS setting, profile files included."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_SHARED_CREDENTIALS_FILE="/nonexistent", AWS_CONFIG_FILE="/nonexistent")
    return env


def aws_env(s3: S3Server, **changes: str) -> dict[str, str]:
    """:func:`no_aws_env` plus the server's standard variables (no ``AWS_ALLOW_HTTP``:
    bkaudit infers plain HTTP from the endpoint)."""
    env = no_aws_env()
    env.update({k: v for k, v in s3.env().items() if k != "AWS_ALLOW_HTTP"})
    env.update(changes)
    return env


def use_aws_env(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    """This test process (its own reads of the tables) and the children it starts without an
    ``env`` of their own see ``env``'s AWS settings only."""
    for key in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        if key.startswith("AWS_"):
            monkeypatch.setenv(key, value)


@pytest.fixture
def s3_env(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """``s3``, with this process's environment pointing at it (:func:`use_aws_env`)."""
    use_aws_env(monkeypatch, aws_env(s3))
    return s3


@pytest.fixture
def bucket(s3: S3Server) -> Iterator[str]:
    """A fresh bucket's ``s3://`` URI. The shared server is checked before and after the test:
    one that stopped is reported with its exit status and log, where it stopped."""
    s3.check_running()
    yield s3.make_bucket(f"t-{uuid.uuid4().hex[:12]}")
    s3.check_running()
