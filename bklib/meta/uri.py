"""BookKeeper's ``metadataServiceUri`` as a ZooKeeper connect string plus a ledgers root.

BookKeeper (``MetadataDrivers.getClientDriver``, ``ZKMetadataDriverBase``):

* the scheme is lower-cased and split on ``+``; the first part picks the driver (``zk``), the
  second the ledger manager: ``flat``, ``hierarchical``, ``longhierarchical``, ``null`` or none
  (both: use the one recorded in the cluster's ``LAYOUT``); ``ms`` and others are refused;
* the servers are the URI's authority with ``;`` turned into ``,``
  (``getZKServersFromServiceUri``); a URI without one is invalid;
* the ledgers root is the URI's path (``resolveZkLedgersRootPath``). There is no separate
  chroot: ``zk://h:2181/pulsar/ledgers`` is ledgers root ``/pulsar/ledgers`` on ``h:2181``.

Pulsar's driver (``org.apache.pulsar.metadata.bookkeeper.AbstractMetadataDriver``, scheme
``metadata-store``) takes ``metadata-store:`` + a Pulsar metadata store URL, e.g.
``metadata-store:zk:h1:2181,h2:2181/pulsar``; ``zk:`` is optional, as in Pulsar, and ``;``
separates servers too. The URI is opaque to ``java.net.URI``, so the driver's ledgers root is
always ``/ledgers``; the store URL's path is a ZooKeeper chroot (``ZKMetadataStore`` hands
it to the ZooKeeper client). ``metadata-store:zk:h1:2181/pulsar`` is therefore ledgers root
``/ledgers`` under chroot ``/pulsar``, i.e. ``/pulsar/ledgers``, and
``metadata-store:zk:h1:2181/ledgers`` is ``/ledgers/ledgers``, as a Java bookie given it reads.
``metadata-store:zk://h1:2181/x`` is refused, as Pulsar refuses it (``//h1:2181/x`` is no
connect string).

``metadata-store:oxia://HOST:PORT[/NAMESPACE]`` is Pulsar's driver on Oxia
(``OxiaMetadataStoreProvider``: the namespace defaults to ``default``). Its target's
``connect`` is the store locator ``oxia://HOST:PORT/NAMESPACE``
(:func:`bklib.meta.stores.open_store`) and the ledgers root is ``/ledgers``, as on ZooKeeper.
Other metadata stores (``etcd``, ``rocksdb``, ``memory``) are refused by
:class:`UnsupportedMetadataUri`, as is any other scheme. See docs/pulsar.md and
docs/metadata-stores.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from bklib.meta.stores import OXIA_PREFIX
from bklib.meta.stores.zookeeper.connect_string import ConnectStringError, parse_connect_string
from bklib.states import DEFAULT_LEDGERS_ROOT

__all__ = [
    "LAYOUTS",
    "METADATA_URI_FORMS",
    "PULSAR_SCHEME",
    "InvalidMetadataUri",
    "MetadataTarget",
    "UnsupportedMetadataUri",
    "parse_metadata_uri",
]

PULSAR_SCHEME = "metadata-store"
LAYOUTS = ("flat", "hierarchical", "longhierarchical")
"""Ledger managers a ``zk+<layout>://`` URI may name (``null`` or none: read ``LAYOUT``)."""

METADATA_URI_FORMS = (
    "zk[+hierarchical|+longhierarchical|+flat]://HOST:PORT[;HOST:PORT...]/LEDGERS_ROOT, "
    "metadata-store:zk:HOST:PORT[,HOST:PORT...][/CHROOT] or "
    "metadata-store:oxia://HOST:PORT[/NAMESPACE]"
)
"""What ``--metadata-uri`` accepts, for its help text and its errors."""

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*):")
_PULSAR_UNSUPPORTED = ("etcd", "rocksdb", "memory", "local-memory")


class InvalidMetadataUri(ValueError):
    """The text is no metadata service URI we can read; the message ends with the forms we
    read (:data:`METADATA_URI_FORMS`)."""

    def __init__(self, message: str) -> None:
        super().__init__(f"{message}; give {METADATA_URI_FORMS}")


class UnsupportedMetadataUri(InvalidMetadataUri):
    """A valid URI for a metadata store that is not ZooKeeper (etcd, oxia, ...)."""


@dataclass(frozen=True)
class MetadataTarget:
    """Where the metadata is: the store's ``connect`` locator and ``ledgers_root``."""

    connect: str
    """The ZooKeeper connect string (Pulsar's form may end in a chroot: ``h1:2181/pulsar``),
    or an Oxia locator ``oxia://HOST:PORT/NAMESPACE``."""
    ledgers_root: str
    layout: str | None = None
    """The ledger manager the URI names, or None (the cluster's ``LAYOUT`` decides)."""
    pulsar_driver: bool = False
    """The URI names Pulsar's driver (``metadata-store:``), whose clusters have no ``LAYOUT``."""


def parse_metadata_uri(uri: str) -> MetadataTarget:
    """Parse ``zk[+layout]://SERVERS/ROOT``, ``metadata-store:[zk:]SERVERS[/CHROOT]`` or
    ``metadata-store:oxia://HOST:PORT[/NAMESPACE]``.

    Raises :class:`UnsupportedMetadataUri` for another metadata store and
    :class:`InvalidMetadataUri` for text that is no such URI; both messages name the URI.
    """
    text = uri.strip()
    match = _SCHEME.match(text)
    if match is None:
        raise InvalidMetadataUri(f"metadata service URI {uri!r} has no scheme")
    scheme = match.group(1).lower()
    rest = text[match.end() :]
    if scheme == PULSAR_SCHEME:
        return _parse_pulsar(uri, rest)
    parts = [p for p in scheme.split("+") if p]  # StringUtils.split drops empty parts
    if not parts or parts[0] != "zk":
        name = parts[0] if parts else scheme
        raise UnsupportedMetadataUri(
            f"metadata service URI {uri!r}: backend {name!r} is not supported"
        )
    layout: str | None = None
    if len(parts) > 1 and parts[1] != "null":
        if parts[1] not in LAYOUTS:
            raise UnsupportedMetadataUri(
                f"metadata service URI {uri!r}: ledger manager {parts[1]!r} is not supported "
                f"(one of {', '.join(LAYOUTS)}, null)"
            )
        layout = parts[1]
    if not rest.startswith("//"):
        raise InvalidMetadataUri(f"invalid metadata service URI {uri!r}: no servers")
    authority, path = _split_authority(rest[2:])
    servers = _servers(uri, authority)
    return MetadataTarget(servers, _root(uri, path), layout)


def _parse_pulsar(uri: str, rest: str) -> MetadataTarget:
    store = rest
    if store.lower().startswith(OXIA_PREFIX):
        return _parse_oxia(uri, store[len(OXIA_PREFIX) :])
    if store.lower().startswith("zk:"):
        store = store[3:]
    else:
        inner = _SCHEME.match(store)
        name = inner.group(1).lower() if inner else ""
        # "zookeeper:h:2181" is no host and port: a store name we do not know, as Pulsar
        # would find no server in it ("h1:2181" is a host and its port).
        unknown = inner is not None and not store[inner.end() :][:1].isdigit()
        if "://" in store or name in _PULSAR_UNSUPPORTED or unknown:
            raise UnsupportedMetadataUri(
                f"metadata service URI {uri!r}: metadata store {name or store!r} is not supported"
            )
    if store.startswith("//"):  # ZKMetadataStore: Invalid path string "//h:2181/..."
        raise InvalidMetadataUri(
            f"invalid metadata service URI {uri!r}: Pulsar's zk: takes no '//'"
        )
    authority, path = _split_authority(store)
    servers = _servers(uri, authority)
    chroot = path.rstrip("/")
    # Pulsar's driver keeps the ledgers at BookKeeper's default root inside the chroot.
    return MetadataTarget(servers + chroot, DEFAULT_LEDGERS_ROOT, pulsar_driver=True)


def _parse_oxia(uri: str, rest: str) -> MetadataTarget:
    """``HOST:PORT[/NAMESPACE]`` after ``oxia://``: one service address (Oxia's clients take
    one; its servers route the shards)."""
    authority, path = _split_authority(rest)
    if not authority or "," in authority or ";" in authority or ":" not in authority:
        raise InvalidMetadataUri(
            f"invalid metadata service URI {uri!r}: Oxia takes one service address"
        )
    namespace = path.strip("/") or "default"
    if "/" in namespace:
        raise InvalidMetadataUri(
            f"invalid metadata service URI {uri!r}: Oxia namespace {namespace!r} has a '/'"
        )
    return MetadataTarget(
        f"{OXIA_PREFIX}{authority}/{namespace}", DEFAULT_LEDGERS_ROOT, pulsar_driver=True
    )


def _split_authority(text: str) -> tuple[str, str]:
    """``h1:2181;h2:2181/a/b?x#y`` -> (``h1:2181;h2:2181``, ``/a/b``), as ``java.net.URI``."""
    text = re.split(r"[?#]", text, maxsplit=1)[0]
    slash = text.find("/")
    return (text, "") if slash < 0 else (text[:slash], text[slash:])


def _servers(uri: str, authority: str) -> str:
    servers = [s.strip() for s in re.split(r"[;,]", authority)]
    if not authority or not all(servers):
        raise InvalidMetadataUri(f"invalid metadata service URI {uri!r}: no servers")
    connect = ",".join(servers)
    try:  # the connect string's own rules (ports, IPv6 brackets), read by its one parser
        parse_connect_string(connect)
    except ConnectStringError as exc:
        reason = str(exc).partition(": ")[2] or str(exc)
        raise InvalidMetadataUri(f"invalid metadata service URI {uri!r}: {reason}") from None
    return connect


def _root(uri: str, path: str) -> str:
    root = path.rstrip("/")
    if not root:
        raise InvalidMetadataUri(
            f"metadata service URI {uri!r} names no ledgers root (e.g. .../ledgers)"
        )
    return root
