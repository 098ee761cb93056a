"""The one ZooKeeper connect-string parser (bklib.meta.stores.zookeeper.connect_string): kazoo's
rules (``kazoo.hosts.collect_hosts``), IPv6 literals in brackets, and the same servers for
kazoo's sessions and the bulk reader."""

from __future__ import annotations

import pytest
from kazoo.hosts import collect_hosts

from bklib.meta.stores.zookeeper.bulk import BulkReader
from bklib.meta.stores.zookeeper.client import new_client
from bklib.meta.stores.zookeeper.connect_string import (
    ConnectString,
    ConnectStringError,
    format_server,
    parse_connect_string,
)
from bklib.meta.stores.zookeeper.store import as_store

VALID = [
    ("h1:2181", [("h1", 2181)], ""),
    ("h1", [("h1", 2181)], ""),
    ("h1:", [("h1", 2181)], ""),
    ("10.0.0.1:2182", [("10.0.0.1", 2182)], ""),
    ("[::1]:2181", [("::1", 2181)], ""),
    ("[::1]", [("::1", 2181)], ""),
    ("[::1]:2181,[::1]:2182/chroot", [("::1", 2181), ("::1", 2182)], "/chroot"),
    ("[2001:DB8::7]:2181", [("2001:db8::7", 2181)], ""),
    ("H1:2181, h2:2182,[::1]:3/a/b", [("h1", 2181), ("h2", 2182), ("::1", 3)], "/a/b"),
    ("h1:2181/pulsar/", [("h1", 2181)], "/pulsar"),
    ("h1:2181/a//b", [("h1", 2181)], "/a/b"),
    ("h1:2181/", [("h1", 2181)], ""),
    ("h1:2181//", [("h1", 2181)], ""),
]


@pytest.mark.parametrize(("hosts", "servers", "chroot"), VALID)
def test_servers_and_chroot(hosts: str, servers: list[tuple[str, int]], chroot: str) -> None:
    parsed = parse_connect_string(hosts)
    assert parsed == ConnectString(tuple(servers), chroot)


@pytest.mark.parametrize(("hosts", "servers", "chroot"), VALID)
def test_kazoo_reads_the_canonical_form_as_we_do(
    hosts: str, servers: list[tuple[str, int]], chroot: str
) -> None:
    """kazoo's own parser, on the string we hand it, finds our servers and chroot; on the
    original it finds the same servers (its chroot is normalized later, by the client)."""
    canonical = str(parse_connect_string(hosts))
    kazoo_servers, kazoo_chroot = collect_hosts(canonical)
    assert kazoo_servers == servers
    assert (kazoo_chroot or "") == chroot
    assert collect_hosts(hosts)[0] == servers
    assert parse_connect_string(canonical) == parse_connect_string(hosts)


def test_the_canonical_form_brackets_ipv6() -> None:
    # Spaces after a port too (kazoo's urlsplit refuses those): the canonical form has none.
    assert str(parse_connect_string(" [::1]:2181 ,h:2 /x")) == "[::1]:2181,h:2/x"
    assert format_server("::1", 2181) == "[::1]:2181"
    assert format_server("zk-1", 2181) == "zk-1:2181"


@pytest.mark.parametrize(
    ("hosts", "says"),
    [
        ("", "an empty server"),
        ("h1:2181,", "an empty server"),
        ("/chroot", "an empty server"),
        ("::1", "in brackets"),
        ("::1:2181", "in brackets"),
        ("[::1:2181", "lacks ']'"),
        ("[::1]2181", "after the address"),
        ("[h1]:2181", "not an IPv6 address"),
        ("h1:abc", "bad port"),
        ("h1:0", "bad port"),
        ("h1:65536", "bad port"),
        ("h1:-1", "bad port"),
        ("user@h1:2181", "bad host"),
        ("h1:2181/a/../b", "'.' or '..'"),
    ],
)
def test_malformed_strings_name_the_bad_part(hosts: str, says: str) -> None:
    with pytest.raises(ConnectStringError, match=says.replace("[", r"\[").replace(".", r"\.")):
        parse_connect_string(hosts)
    assert issubclass(ConnectStringError, ValueError)  # as kazoo's own parser raises


def test_kazoo_and_the_bulk_reader_get_the_same_servers() -> None:
    """The bug this parser fixed: the bulk reader kept the brackets of ``[::1]:2181`` and
    could not connect where kazoo could."""
    hosts = "[::1]:2181,[::1]:2182/ledgers//x/"
    client = new_client(hosts)
    try:
        reader = BulkReader(hosts)
        assert reader.servers == [("::1", 2181), ("::1", 2182)]
        assert reader.chroot == "/ledgers/x"
        assert client.hosts == reader.servers
        assert client.chroot == reader.chroot
        # A store wrapped around a bare client rebuilds a string both read the same way.
        assert as_store(client).locator == "[::1]:2181,[::1]:2182/ledgers/x"
    finally:
        client.close()


def test_a_malformed_string_fails_before_any_connection() -> None:
    with pytest.raises(ConnectStringError):
        new_client("::1:2181")
    with pytest.raises(ConnectStringError):
        BulkReader("h1:2181,,h2")
