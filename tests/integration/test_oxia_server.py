"""The Oxia server and client bkaudit will run BookKeeper's metadata on: ``oxia standalone``
built by scripts/install_oxia.sh, and PyPI's ``oxia`` client at the pins of the ``oxia`` extra.
These are the store facts the metadata layer relies on, checked against the real server:
children listed as the key range ``p/`` to ``p//``, compare-and-set by ``versionId``, and
ephemeral keys that end with their client's session."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import oxia
import oxia.ex
import pytest

from bklib.testing.oxiaserver import OxiaServer, OxiaUnavailable

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OxiaServer]:
    # Several shards: the client must route each key to the shard the server hashes it to
    # (the xxhash pin of the `oxia` extra).
    with OxiaServer(tmp_path_factory.mktemp("oxia"), shards=3) as srv:
        yield srv


@pytest.fixture
def client(server: OxiaServer) -> Iterator[oxia.Client]:
    c = oxia.Client(server.address, session_timeout_ms=5_000)
    try:
        yield c
    finally:
        c.close()


def test_children_are_the_range_from_slash_to_double_slash(client: oxia.Client) -> None:
    # BookKeeper's keys, as Pulsar's Oxia driver stores them: ZooKeeper paths, unchanged.
    keys = [
        "/ledgers/00/0000/L0001",
        "/ledgers/00/0000/L0002",
        "/ledgers/00/0001/L0003",
        "/ledgers/available/127.0.0.1:3181",
    ]
    for key in ["/ledgers", "/ledgers/00", "/ledgers/00/0000", "/ledgers/00/0001", *keys]:
        client.put(key, b"")
    children = client.list("/ledgers/00/0000/", "/ledgers/00/0000//")
    assert children == ["/ledgers/00/0000/L0001", "/ledgers/00/0000/L0002"]
    assert client.list("/ledgers/00/", "/ledgers/00//") == ["/ledgers/00/0000", "/ledgers/00/0001"]
    # Oxia sorts hierarchically: a grandchild is not a child.
    assert "/ledgers/00/0000/L0001" not in client.list("/ledgers/", "/ledgers//")


def test_compare_and_set_by_version_id(client: oxia.Client) -> None:
    key = "/ledgers/00/0000/L0042"
    _, v1 = client.put(key, b"metadata v1", expected_version_id=oxia.EXPECTED_RECORD_DOES_NOT_EXIST)
    _, v2 = client.put(key, b"metadata v2", expected_version_id=v1.version_id())
    assert v2.version_id() != v1.version_id()
    with pytest.raises(oxia.ex.UnexpectedVersionId):
        client.put(key, b"stale writer", expected_version_id=v1.version_id())
    _, value, version = client.get(key)
    assert (value, version.version_id()) == (b"metadata v2", v2.version_id())
    with pytest.raises(oxia.ex.UnexpectedVersionId):
        client.delete(key, expected_version_id=v1.version_id())
    assert client.delete(key, expected_version_id=v2.version_id())
    with pytest.raises(oxia.ex.KeyNotFound):
        client.get(key)


def test_an_ephemeral_key_ends_with_its_session(server: OxiaServer) -> None:
    key = "/bkaudit/ledgers/watch-leader"
    owner = oxia.Client(server.address, session_timeout_ms=2_000)
    observer = oxia.Client(server.address)
    try:
        _, version = owner.put(key, b"instance-a", ephemeral=True)
        assert version.is_ephemeral()
        assert observer.get(key)[1] == b"instance-a"
        owner.close()  # the session closes with the client
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                observer.get(key)
            except oxia.ex.KeyNotFound:
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"{key} outlived its session")
    finally:
        observer.close()


def test_a_missing_binary_is_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BKAUDIT_OXIA_BIN", str(tmp_path / "no-oxia"))
    with pytest.raises(OxiaUnavailable, match=r"scripts/install_oxia\.sh"):
        OxiaServer(tmp_path).start()
