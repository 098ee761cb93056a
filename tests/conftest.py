"""Shared fixtures: a real ZooKeeper server for the whole session, one chroot per test."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient

from bklib.meta.stores import KeyStateError, MetadataStore, open_store
from bklib.testing.oxiaserver import OxiaServer
from bklib.testing.zkserver import ZooKeeperServer
from tests.jvm import spark_jvm_options

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# Every Spark driver JVM the suite starts (pyspark in this process, bkaudit and spark-submit
# subprocesses) takes spark-submit's SPARK_SUBMIT_OPTS: quick-start options and the shared
# class archive (tests/jvm.py).
if "SPARK_SUBMIT_OPTS" not in os.environ:
    os.environ["SPARK_SUBMIT_OPTS"] = " ".join(spark_jvm_options())


HEAVY_FIRST = (
    "tests/objectstore/test_s3_writers.py",
    "tests/deploy/test_images.py",
    "tests/deploy/test_spark_standalone.py",
    "tests/pulsar/test_pulsar_repair.py",
    "tests/integration/test_executors_differential.py",
    "tests/integration/test_rereplicate_safety.py",
    "tests/integration/test_watch.py",
    "tests/pulsar/test_oxia_java.py",
    "tests/integration/test_demo.py",
    "tests/objectstore/test_s3_story.py",
    "tests/integration/test_install_line.py",
    "tests/integration/test_stores_differential.py",
    "tests/integration/test_secret_scan.py",
    "tests/objectstore/test_s3_faults.py",
    "tests/report/test_notebook.py",
    "tests/integration/test_audit_replicas.py",
)
"""The files that take the most worker time (docs/benchmarks.md, "The suite's time"), most
first. ``make test`` hands whole files to two workers in collection order, so these start
first and the run does not end on one of them while the other worker idles."""


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    rank = {path: i for i, path in enumerate(HEAVY_FIRST)}
    # A stable sort: the other files, and the tests inside each file, keep their order.
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


def pytest_addoption(parser: pytest.Parser) -> None:
    # Here, not in tests/integration/conftest.py, so the flag works from the repo root.
    parser.addoption(
        "--schedules",
        type=int,
        default=None,
        help="randomized schedules test_ledger_random_schedules runs (default 60; soak: 1,000)",
    )
    # The chaos soak and kill campaign (tests/soak); `make soak` runs the long variant.
    parser.addoption(
        "--soak-minutes",
        type=float,
        default=None,
        help="minutes of chaos in tests/soak/test_chaos_soak.py (default 0.5, "
        "or $BKAUDIT_SOAK_MINUTES)",
    )
    parser.addoption(
        "--soak-kills",
        type=int,
        default=None,
        help="SIGKILLs of bkaudit rereplicate in tests/soak/test_kill_campaign.py "
        "(default 5, or $BKAUDIT_SOAK_KILLS)",
    )
    parser.addoption(
        "--soak-seed",
        type=int,
        default=None,
        help="seed of the soak tests (default 20261122, or $BKAUDIT_SOAK_SEED)",
    )


@pytest.fixture(autouse=True)
def _forget_redactions() -> Iterator[None]:
    """A command run in this process masks its secrets in every later log record
    (redact_in_logs, on the root handlers pytest keeps for the session); a one-letter test
    password would then mask that letter in the next tests' records."""
    yield
    from jobs.options.zookeeper import forget_redactions

    forget_redactions()


@pytest.fixture(scope="session")
def zk_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    """A real ZooKeeper server process on a free loopback port. Never skipped: a missing
    ZooKeeper or Java is a test failure."""
    server = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def zk_chroot(zk_server: ZooKeeperServer) -> Iterator[str]:
    """A connect string ``host:port/chroot`` private to this test; wiped afterwards."""
    with zk_server.private_chroot() as hosts:
        yield hosts


@pytest.fixture
def zk(zk_chroot: str) -> Iterator[KazooClient]:
    """A started kazoo client inside this test's chroot."""
    client = KazooClient(hosts=zk_chroot, timeout=10)
    client.start(timeout=15)
    try:
        yield client
    finally:
        client.stop()
        client.close()


@pytest.fixture(scope="session")
def oxia_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OxiaServer]:
    """A real ``oxia standalone`` on free loopback ports, 3 shards (so keys are routed by
    hash). Never skipped: a missing binary is a test failure (scripts/install_oxia.sh)."""
    with OxiaServer(tmp_path_factory.mktemp("oxia"), shards=3) as server:
        yield server


def wipe_oxia(locator: str) -> None:
    """Delete every key of the namespace: one Oxia server serves a whole session. Processes
    of an earlier test may still be ending (a bookie's last registration, a lock): retry
    until the namespace stays empty."""
    deadline = time.monotonic() + 30
    with open_store(locator, timeout=15) as store:
        while names := store.children("/"):
            assert time.monotonic() < deadline, f"Oxia keys keep coming back: {names}"
            for name in names:
                with contextlib.suppress(KeyStateError):
                    store.delete_recursive("/" + name)


@pytest.fixture(params=["zookeeper", "oxia"])
def store_locator(request: pytest.FixtureRequest) -> Iterator[str]:
    """A locator for an empty metadata store, once on ZooKeeper (a private chroot) and once
    on Oxia (the session's server, wiped before the test)."""
    if request.param == "zookeeper":
        yield request.getfixturevalue("zk_chroot")
        return
    server: OxiaServer = request.getfixturevalue("oxia_server")
    wipe_oxia(server.locator())
    yield server.locator()


@pytest.fixture
def meta_store(store_locator: str) -> Iterator[MetadataStore]:
    """An open session on :func:`store_locator`'s store."""
    with open_store(store_locator, timeout=15) as store:
        yield store


@pytest.fixture
def restore_zk_budget() -> Iterator[None]:
    """Put back this process's ZooKeeper request budget (bklib.meta.stores.zookeeper.budget) after
    a test that sets its own."""
    from bklib.meta.stores.zookeeper import budget as zk_budget

    before = zk_budget.request_budget()
    yield
    zk_budget._budget = before
