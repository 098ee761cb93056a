"""ZooKeeper connect strings: ``host:port,host:port/chroot``, parsed once for every client.

kazoo sessions (:func:`~bklib.meta.stores.zookeeper.client.new_client`), the pipelined bulk
reader (:mod:`~bklib.meta.stores.zookeeper.bulk`) and the TLS probe all take their servers and
chroot from :func:`parse_connect_string`; kazoo is handed the canonical form
(:meth:`ConnectString.__str__`), which its ``kazoo.hosts.collect_hosts`` reads back unchanged.

The rules are kazoo's (``collect_hosts``, ``kazoo.protocol.paths.normpath``), which are
ZooKeeper's ``ConnectStringParser`` with IPv6 literals in brackets:

- the chroot is everything from the first ``/``; empty path components are dropped
  (``/a//b/`` is ``/a/b``), ``.`` and ``..`` are refused, and ``/`` alone is no chroot;
- servers are separated by commas, each ``host``, ``host:port`` or ``[ipv6]:port``, spaces
  around it ignored; a missing port (``host``, ``host:``) is 2181;
- host names are case-insensitive and kept lower-case, as kazoo keeps them;
- an IPv6 literal must be in brackets (``[::1]:2181``; ``::1`` is ambiguous): the brackets
  belong to the connect string, not to the address a socket connects to.

Anything else (an empty server, a port that is not a number from 1 to 65535, user info)
raises :class:`ConnectStringError`. kazoo takes a port of 0 as 2181 and drops user info;
both are refused here, where they are more likely typos than intent.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

__all__ = [
    "CONNECT_STRING_FORMS",
    "DEFAULT_PORT",
    "ConnectString",
    "ConnectStringError",
    "format_server",
    "parse_connect_string",
]

DEFAULT_PORT = 2181
"""ZooKeeper's ``clientPort`` when a server names none."""

CONNECT_STRING_FORMS = "HOST:PORT[,HOST:PORT...][/CHROOT] (IPv6 in brackets: [::1]:2181)"
"""What a connect string looks like, for ``--zk``'s help text and its errors."""


class ConnectStringError(ValueError):
    """A ZooKeeper connect string that cannot be used (one line naming the bad part). A
    ValueError, as kazoo's own parser raises."""


def format_server(host: str, port: int) -> str:
    """``host:port``, with an IPv6 literal in brackets (``[::1]:2181``)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True)
class ConnectString:
    """A parsed connect string: its servers in order and its chroot (``""``: none)."""

    servers: tuple[tuple[str, int], ...]
    chroot: str = ""

    def __str__(self) -> str:
        """The canonical form: ``h1:2181,[::1]:2182/chroot``."""
        return ",".join(format_server(h, p) for h, p in self.servers) + self.chroot


def parse_connect_string(hosts: str) -> ConnectString:
    """The servers and chroot of ``hosts`` (see the module docstring for the rules):
    ``h1:2181,[::1]:2182/pulsar`` -> ``((h1, 2181), (::1, 2182))``, ``/pulsar``. Raises
    :class:`ConnectStringError`."""
    servers, slash, path = hosts.partition("/")
    parsed = tuple(_server(part.strip(), hosts) for part in servers.split(","))
    return ConnectString(parsed, _chroot(path, hosts) if slash else "")


def _server(part: str, hosts: str) -> tuple[str, int]:
    """One ``host[:port]`` or ``[ipv6][:port]`` of ``hosts``, as (host, port)."""
    if not part:
        raise ConnectStringError(f"ZooKeeper connect string {hosts!r}: an empty server")
    if part.startswith("["):
        literal, bracket, rest = part[1:].partition("]")
        if not bracket:
            raise ConnectStringError(f"ZooKeeper connect string {hosts!r}: {part!r} lacks ']'")
        _check_ipv6(literal, part, hosts)
        host = literal
        if rest and not rest.startswith(":"):
            raise ConnectStringError(
                f"ZooKeeper connect string {hosts!r}: {part!r} has {rest!r} after the address"
            )
        port_text = rest[1:]
    else:
        if part.count(":") > 1:
            raise ConnectStringError(
                f"ZooKeeper connect string {hosts!r}: put the IPv6 address of {part!r} in "
                "brackets ([::1]:2181)"
            )
        host, _, port_text = part.partition(":")
        if not host or any(c in host for c in " \t@[]"):
            raise ConnectStringError(f"ZooKeeper connect string {hosts!r}: bad host in {part!r}")
    return host.lower(), _port(port_text, part, hosts)


def _check_ipv6(literal: str, part: str, hosts: str) -> None:
    """Raise unless ``literal`` is an IPv6 address, with an optional ``%zone``."""
    try:
        ipaddress.IPv6Address(literal.partition("%")[0])
    except ValueError:
        raise ConnectStringError(
            f"ZooKeeper connect string {hosts!r}: {part!r} is not an IPv6 address in brackets"
        ) from None


def _port(text: str, part: str, hosts: str) -> int:
    """The port of one server; empty is :data:`DEFAULT_PORT`."""
    text = text.strip()
    if not text:
        return DEFAULT_PORT
    if not (text.isascii() and text.isdigit()) or not 0 < int(text) <= 65535:
        raise ConnectStringError(
            f"ZooKeeper connect string {hosts!r}: bad port in {part!r} (1 to 65535)"
        )
    return int(text)


def _chroot(path: str, hosts: str) -> str:
    """The chroot after the first ``/`` (``path`` is what follows it), normalized as kazoo's
    ``normpath`` does; ``""`` for the root."""
    parts = [p for p in path.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise ConnectStringError(
            f"ZooKeeper connect string {hosts!r}: a chroot may not hold '.' or '..'"
        )
    return "/" + "/".join(parts) if parts else ""
