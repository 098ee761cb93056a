"""Which ledgers Pulsar's metadata references, read from its metadata store (ZooKeeper).

Pulsar keeps, next to BookKeeper's ``ledgers`` tree (usually under the same root):

* ``managed-ledgers/<tenant>/<namespace>/persistent/<topic>`` (v1 names add ``<cluster>``
  after the tenant): a topic's ledgers, and as children its cursors, each naming its ledger;
* ``schemas/<tenant>/<namespace>/<topic>``: the ledgers of a topic's schema versions.

:func:`read_references` walks both and decodes every value (:mod:`bklib.pulsar.metadata`).
A value that does not decode is an error naming its key, and the owner it describes is then
unknown: nothing it might list may be judged orphan. A key deleted during the walk (a topic
deleted meanwhile) is simply absent. Reads are pipelined a batch at a time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from urllib.parse import unquote_plus

from kazoo.client import KazooClient

from bklib.errors import ZKError
from bklib.meta import paths
from bklib.meta.pulsar import (
    COMPONENT_COMPACTED,
    COMPONENT_MANAGED_LEDGER,
    COMPONENT_SCHEMA,
    topic_of_managed_ledger,
)
from bklib.meta.stores import KeyNotFound, MetadataStore
from bklib.meta.stores.zookeeper import as_store
from bklib.pulsar.metadata import (
    CorruptPulsarMetadata,
    decode_cursor,
    decode_managed_ledger,
    decode_schema_ledgers,
)

__all__ = [
    "MANAGED_LEDGERS",
    "SCHEMAS",
    "Owner",
    "PulsarMetadataMissing",
    "PulsarReferences",
    "Reference",
    "cursor_key",
    "managed_ledger_key",
    "read_references",
    "references_in",
    "schema_key",
]

log = logging.getLogger(__name__)

MANAGED_LEDGERS = "managed-ledgers"
SCHEMAS = "schemas"
DOMAIN = "persistent"
BATCH = 256


class Owner:
    """What references a ledger (``pulsar_references.component``): Pulsar's own ``component``
    tag names, and ``cursor`` for a cursor's ledger (which Pulsar tags as a managed ledger's)."""

    MANAGED_LEDGER = COMPONENT_MANAGED_LEDGER
    CURSOR = "cursor"
    SCHEMA = COMPONENT_SCHEMA
    COMPACTED = COMPONENT_COMPACTED


@dataclass(frozen=True)
class Reference:
    """One ledger id named by one Pulsar key."""

    ledger_id: int
    key: str
    owner: str
    topic: str | None
    bookkeeper_deleted: bool = False
    """Offloaded and deleted from BookKeeper on purpose: its absence is no loss."""
    current: bool = False
    """A managed ledger's last ledger with no entries recorded: the one being written, which
    the broker deletes before unlisting when it closes it empty (``ManagedLedgerImpl.
    ledgerClosed``) and drops when missing on reopen: its absence breaks no read."""


class PulsarMetadataMissing(ValueError):
    """No Pulsar metadata where it was looked for: a wrong ``--pulsar-root``, or a store of
    its own. Nothing may be judged orphan then."""


@dataclass
class PulsarReferences:
    """Everything the walk found: the references, and the keys that could not be decoded
    (``errors``: key -> reason)."""

    refs: list[Reference] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    managed_ledgers: int = 0
    cursors: int = 0
    schemas: int = 0


def managed_ledger_key(root: str, name: str) -> str:
    """The key of managed ledger ``name`` (``tenant/namespace/persistent/topic``)."""
    return paths.join(root, MANAGED_LEDGERS, name)


def cursor_key(root: str, managed_ledger: str, cursor: str) -> str:
    return paths.join(root, MANAGED_LEDGERS, managed_ledger, cursor)


def schema_key(root: str, schema_id: str) -> str:
    return paths.join(root, SCHEMAS, schema_id)


def references_in(key: str, owner: str, data: bytes, topic: str | None) -> list[Reference]:
    """The ledgers one value references, by what kind of key it is: the one rule the walk and
    every re-read use. Raises :class:`~bklib.pulsar.metadata.CorruptPulsarMetadata`."""
    if owner == Owner.MANAGED_LEDGER:
        ledgers = decode_managed_ledger(key, data).ledgers
        last = len(ledgers) - 1
        return [
            Reference(
                e.ledger_id,
                key,
                owner,
                topic,
                bookkeeper_deleted=e.bookkeeper_deleted,
                current=i == last and not e.entries,
            )
            for i, e in enumerate(ledgers)
        ]
    if owner == Owner.CURSOR:
        cursor = decode_cursor(key, data)
        if cursor.cursor_ledger is not None:
            return [Reference(cursor.cursor_ledger, key, owner, topic)]
        # The compacted ledger's property is authoritative only while the position lives in
        # the value: with a cursor ledger, that ledger's last entry holds it.
        if cursor.compacted_ledger is not None:
            return [Reference(cursor.compacted_ledger, key, Owner.COMPACTED, topic)]
        return []
    if owner == Owner.SCHEMA:
        return [Reference(x, key, owner, topic) for x in decode_schema_ledgers(key, data)]
    raise ValueError(f"unknown owner kind {owner!r}")


def schema_topic(schema_id: str) -> str:
    """``tenant/namespace/topic`` -> ``persistent://tenant/namespace/topic`` (decoded)."""
    head, _, local = schema_id.rpartition("/")
    return f"persistent://{head}/{unquote_plus(local)}"


class _Reader:
    def __init__(self, zk: MetadataStore) -> None:
        self.zk = zk

    def children(self, path: str) -> list[str]:
        """Children of ``path`` ([] once deleted); a store failure raises StoreUnavailable
        (a ZKError) naming the path."""
        try:
            return self.zk.children(path)
        except KeyNotFound:
            return []

    def values(self, keys: Iterable[str]) -> Iterator[tuple[str, bytes | None]]:
        """(key, data) for each key, None when deleted meanwhile; pipelined."""
        for got in self.zk.get_many(keys):
            if got.error is not None:
                raise ZKError(f"cannot read Pulsar metadata: {got.error}", path=got.path)
            yield got.path, got.data


def _managed_ledger_names(r: _Reader, root: str) -> Iterator[str]:
    """Every managed-ledger name: the children of a ``persistent`` level, the third (v2:
    tenant/namespace/persistent) or fourth (v1: tenant/cluster/namespace/persistent) below
    ``managed-ledgers``."""
    base = paths.join(root, MANAGED_LEDGERS)

    def walk(rel: list[str]) -> Iterator[str]:
        if len(rel) in (3, 4) and rel[-1] == DOMAIN:
            for topic in r.children(paths.join(base, *rel)):
                yield "/".join([*rel, topic])
            return
        if len(rel) >= 4:
            return
        for child in r.children(paths.join(base, *rel) if rel else base):
            yield from walk([*rel, child])

    yield from walk([])


def read_references(
    store: MetadataStore | KazooClient,
    root: str = "/",
    progress: Callable[[int], None] | None = None,
) -> PulsarReferences:
    """Read every managed ledger, cursor and schema under ``root`` (Pulsar's metadata root:
    the parent of BookKeeper's ledgers root when both share a store). ``progress`` is called
    with the count of keys read so far."""
    zk = as_store(store)
    r = _Reader(zk)
    out = PulsarReferences()
    read = 0

    def tick() -> None:
        nonlocal read
        read += 1
        if progress is not None and read % 1000 == 0:
            progress(read)

    base = paths.join(root, MANAGED_LEDGERS)
    if zk.exists(base) is None:
        raise PulsarMetadataMissing(
            f"no Pulsar metadata at {base}: give --pulsar-root (where managed-ledgers is)"
        )
    names = list(_managed_ledger_names(r, root))
    for key, data in r.values(managed_ledger_key(root, n) for n in names):
        tick()
        if data is None:
            continue
        topic = topic_of_managed_ledger(key[len(base) + 1 :])
        out.managed_ledgers += 1
        _collect(out, key, Owner.MANAGED_LEDGER, data, topic)
        cursor_keys = [paths.join(key, c) for c in r.children(key)]
        for ckey, cdata in r.values(cursor_keys):
            tick()
            if cdata is None:
                continue
            out.cursors += 1
            _collect(out, ckey, Owner.CURSOR, cdata, topic)
    for key, data in r.values(_schema_keys(r, root)):
        tick()
        if not data:  # deleted meanwhile, or an empty namespace level (no locator is empty)
            continue
        out.schemas += 1
        schema_id = key[len(paths.join(root, SCHEMAS)) + 1 :]
        _collect(out, key, Owner.SCHEMA, data, schema_topic(schema_id))
    log.info(
        "pulsar metadata: %d managed ledgers, %d cursors, %d schemas, %d ledger references, "
        "%d undecodable keys",
        out.managed_ledgers,
        out.cursors,
        out.schemas,
        len(out.refs),
        len(out.errors),
    )
    return out


def _schema_keys(r: _Reader, root: str) -> Iterator[str]:
    """Schema keys: ``schemas/tenant/namespace/topic`` (v1: ``tenant/cluster/ns/topic``),
    the leaves three or four levels down."""
    base = paths.join(root, SCHEMAS)

    def walk(rel: list[str]) -> Iterator[str]:
        kids = r.children(paths.join(base, *rel) if rel else base)
        if not kids and len(rel) in (3, 4):
            yield paths.join(base, *rel)
            return
        if len(rel) >= 4:
            return
        for child in kids:
            yield from walk([*rel, child])

    yield from walk([])


def _collect(out: PulsarReferences, key: str, owner: str, data: bytes, topic: str | None) -> None:
    try:
        out.refs.extend(references_in(key, owner, data, topic))
    except CorruptPulsarMetadata as exc:
        log.error("pulsar metadata %s: %s", key, exc.reason)
        out.errors[key] = exc.reason
