"""Pulsar's references against BookKeeper's ledgers: dangling and orphan ledgers (pure).

* **DANGLING** (critical): a managed ledger, cursor or schema names a ledger BookKeeper does
  not have, and Pulsar did not delete it on purpose after offloading it. The topic is broken:
  its reads fail (pulsar#23280). BookKeeper's own audit cannot see this.
* **ORPHAN**: a ledger whose Pulsar custom metadata names an owner (a managed ledger, a cursor
  or a schema) that does not list it, nor does any other key, and older than a minimum age.
  Pulsar creates a ledger before listing it and unlists one before deleting it
  (``ManagedLedgerImpl``, ``ManagedCursorImpl``, ``BookkeeperSchemaStorage``), so a young
  unlisted ledger is normal; an old one holds disk forever.

Fail closed: an owner whose value could not be decoded lists nothing we know, so no ledger it
might own is an orphan; a ledger without a creation time has no age, so it is no orphan
either. Ledgers Pulsar did not tag (other applications, function packages in DistributedLog,
compacted and delayed-delivery ledgers whose owner keeps their id elsewhere) are not judged.
Candidates are re-checked against fresh reads before they are reported
(:func:`confirm_dangling`, :func:`confirm_orphan`). See docs/pulsar.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from bklib.meta.pulsar import COMPONENT_MANAGED_LEDGER, COMPONENT_SCHEMA, PulsarLedger
from bklib.pulsar.references import (
    Owner,
    PulsarReferences,
    Reference,
    cursor_key,
    managed_ledger_key,
    schema_key,
)

__all__ = [
    "BookKeeperLedger",
    "Orphan",
    "confirm_dangling",
    "confirm_orphan",
    "dangling_candidates",
    "orphan_candidates",
    "owner_key",
]


@dataclass(frozen=True)
class BookKeeperLedger:
    """What the cross-check needs of one ledger in BookKeeper's metadata."""

    ledger_id: int
    ctime_ms: int | None
    length: int | None
    tags: PulsarLedger
    version: int | None = None
    """The metadata znode's version when read (a delete is a compare-and-set on it)."""


@dataclass(frozen=True)
class Orphan:
    """An unlisted ledger and the key of the owner its tags name."""

    ledger: BookKeeperLedger
    owner_key: str
    owner: str


def owner_key(root: str, tags: PulsarLedger) -> tuple[str, str] | None:
    """(key, owner kind) of the Pulsar key that must list a ledger with these tags, or None
    when the tags name no owner we can check."""
    if tags.application not in (None, "pulsar"):
        return None
    if tags.managed_ledger and tags.cursor:
        return cursor_key(root, tags.managed_ledger, tags.cursor), Owner.CURSOR
    if tags.managed_ledger and tags.component in (None, COMPONENT_MANAGED_LEDGER):
        return managed_ledger_key(root, tags.managed_ledger), Owner.MANAGED_LEDGER
    if tags.schema_id and tags.component == COMPONENT_SCHEMA:
        return schema_key(root, tags.schema_id), Owner.SCHEMA
    return None


def dangling_candidates(refs: PulsarReferences, exists: Callable[[int], bool]) -> list[Reference]:
    """References to ledgers BookKeeper does not have (``exists`` answers from the scan),
    but for ledgers deleted on purpose after offloading and a managed ledger's current, empty
    ledger (see :class:`~bklib.pulsar.references.Reference`)."""
    return [
        r
        for r in refs.refs
        if not r.bookkeeper_deleted and not r.current and not exists(r.ledger_id)
    ]


def orphan_candidates(
    refs: PulsarReferences,
    ledgers: Mapping[int, BookKeeperLedger],
    *,
    root: str,
    now_ms: int,
    min_age_ms: int,
) -> list[Orphan]:
    """Tagged ledgers older than ``min_age_ms`` that no key references, whose owner decoded
    and does not list them (or no longer exists)."""
    referenced = {r.ledger_id for r in refs.refs}
    out: list[Orphan] = []
    for lid, led in sorted(ledgers.items()):
        if lid in referenced:
            continue
        owner = owner_key(root, led.tags)
        if owner is None or owner[0] in refs.errors:
            continue
        if led.ctime_ms is None or now_ms - led.ctime_ms < min_age_ms:
            continue
        out.append(Orphan(led, *owner))
    return out


def confirm_dangling(ref: Reference, listed_now: frozenset[int] | None, exists_now: bool) -> bool:
    """A dangling candidate stands if, read again, its key still lists the ledger and the
    ledger is still missing (a topic deleted meanwhile, or a ledger created since the scan,
    is not dangling). ``listed_now`` is None when the key is gone or no longer decodes."""
    return listed_now is not None and ref.ledger_id in listed_now and not exists_now


def confirm_orphan(orphan: Orphan, listed_now: frozenset[int] | None, owner_gone: bool) -> bool:
    """An orphan candidate stands if, read again, its owner is gone or decodes and still does
    not list it (``listed_now`` None and not ``owner_gone``: undecodable, so unknown)."""
    if owner_gone:
        return True
    return listed_now is not None and orphan.ledger.ledger_id not in listed_now
