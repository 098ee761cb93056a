"""Fixtures for the Pulsar tests: a real Apache Pulsar 4.0 broker over Java bookies.

* ``pulsar_classpath``: installs (once, cached) Pulsar's jars (scripts/install_pulsar.sh). A
  missing Java, Maven or jar fails the test, in CI and locally -- never a skip.
* ``pulsar_cluster``: a factory for a private cluster in its own ZooKeeper chroot of the
  session's ZooKeeper server (tests/conftest.py): ``with pulsar_cluster(driver="zk") as c``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bklib.testing.zkserver import ZooKeeperServer
from tests.interop.harness import JavaUnavailable
from tests.pulsar import harness
from tests.pulsar.harness import PulsarCluster


def pytest_report_header(config: pytest.Config) -> str:
    return f"pulsar: Apache Pulsar {harness.PULSAR_VERSION} ($BKAUDIT_PULSAR_VERSION)"


@pytest.fixture(scope="session")
def pulsar_classpath() -> str:
    """Classpath of the Pulsar broker (and the BookKeeper it pins). Fails (never skips) when
    unavailable."""
    try:
        return harness.install()
    except JavaUnavailable as e:
        pytest.fail(f"Apache Pulsar unavailable: {e}", pytrace=False)


@pytest.fixture
def pulsar_cluster(
    pulsar_classpath: str, zk_server: ZooKeeperServer, tmp_path: Path
) -> Callable[..., contextlib.AbstractContextManager[PulsarCluster]]:
    """A factory for a private cluster: ``with pulsar_cluster(driver="pulsar") as c``; its
    keywords are :func:`tests.pulsar.harness.pulsar_cluster`'s."""

    @contextlib.contextmanager
    def make(**kw: Any) -> Iterator[PulsarCluster]:
        with (
            zk_server.private_chroot("pulsar") as connect,
            harness.pulsar_cluster(pulsar_classpath, connect, tmp_path, **kw) as cluster,
        ):
            yield cluster

    return make
