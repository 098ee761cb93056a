"""Oxia key placement and child ranges, without a server."""

from __future__ import annotations

import pytest

from bklib.meta.stores.oxia import child_range, shard_hash


@pytest.mark.parametrize(
    ("key", "expected"),
    # The vectors of Oxia's own common/hash/hash_test.go (TestXxh332).
    [("foo", 125730186), ("bar", 2687685474), ("baz", 862947621)],
)
def test_shard_hash_is_oxias_xxh332(key: str, expected: int) -> None:
    assert shard_hash(key) == expected


def test_shard_hash_is_not_the_python_clients_xxh64() -> None:
    # oxia 0.2.1 placed keys by XXH64; that disagrees with the server and the Java client.
    import xxhash

    assert shard_hash("foo") != xxhash.xxh64("foo").intdigest() & 0xFFFFFFFF


def test_child_range_spans_exactly_the_children() -> None:
    low, high = child_range("/ledgers/available/")
    assert (low, high) == ("/ledgers/available/", "/ledgers/available//")
