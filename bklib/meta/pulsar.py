"""Pulsar's ledger custom metadata: which topic a ledger belongs to, and what it holds.

Pulsar's broker tags every ledger it creates (``org.apache.bookkeeper.mledger.impl.
LedgerMetadataUtils``, Pulsar 2.6 and later):

==========================  ==========================================================
key                         value
==========================  ==========================================================
``application``             ``pulsar``
``component``               ``managed-ledger`` (topic data and cursor ledgers),
                            ``compacted-ledger`` (``buildMetadataForCompactedLedger``),
                            ``schema`` (``buildMetadataForSchema``)
``pulsar/managed-ledger``   the managed-ledger name ``tenant/namespace/domain/encodedName``
                            (``buildBaseManagedLedgerMetadata``; also on cursor ledgers)
``pulsar/cursor``           the cursor name, on a cursor's ledger
``pulsar/compactedTopic``   the compacted topic's full name, on a compacted ledger
``pulsar/compactedTo``      the last compacted message id (binary)
``pulsar/schemaId``         the schema id ``tenant/namespace/topic`` (domain-independent)
==========================  ==========================================================

Pulsar 2.5 wrote ``psr/managed-ledger``, ``psr/cursor`` and ``compactedTopic``; they are read
too. The topic comes from the managed-ledger name as ``TopicName.fromPersistenceNamingEncoding``
derives it: ``tenant/namespace/persistent/my%20topic`` is ``persistent://tenant/namespace/my
topic`` (the local name is URL-decoded, ``Codec.decode``), and a v1 name
``tenant/cluster/namespace/persistent/t`` is ``persistent://tenant/cluster/namespace/t``.
A schema ledger's topic is ``persistent://`` + its schema id: Pulsar keeps one schema for the
persistent and non-persistent topic of a name, and only the persistent one has ledgers.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote_plus

__all__ = [
    "COMPONENT",
    "CURSOR",
    "MANAGED_LEDGER",
    "PulsarLedger",
    "decode_pulsar_metadata",
    "topic_of_managed_ledger",
]

APPLICATION = "application"
COMPONENT = "component"
MANAGED_LEDGER = "pulsar/managed-ledger"
CURSOR = "pulsar/cursor"
COMPACTED_TOPIC = "pulsar/compactedTopic"
SCHEMA_ID = "pulsar/schemaId"
LEGACY_MANAGED_LEDGER = "psr/managed-ledger"
LEGACY_CURSOR = "psr/cursor"
LEGACY_COMPACTED_TOPIC = "compactedTopic"

COMPONENT_MANAGED_LEDGER = "managed-ledger"
COMPONENT_COMPACTED = "compacted-ledger"
COMPONENT_SCHEMA = "schema"


@dataclass(frozen=True)
class PulsarLedger:
    """What Pulsar's custom metadata says about a ledger (every field None when absent)."""

    component: str | None = None
    topic: str | None = None
    managed_ledger: str | None = None
    cursor: str | None = None
    schema_id: str | None = None
    application: str | None = None


def _text(value: bytes | None) -> str | None:
    if value is None:
        return None
    try:
        return value.decode("utf-8") or None
    except UnicodeDecodeError:
        return None


@functools.lru_cache(maxsize=65536)  # a topic's ledgers all carry its managed-ledger name
def topic_of_managed_ledger(name: str) -> str | None:
    """The full topic name of a managed ledger name (``TopicName.fromPersistenceNamingEncoding``),
    or None when the name has neither 4 (v2) nor 5 (v1) parts."""
    parts = name.split("/")
    if len(parts) == 4:
        tenant, namespace, domain, local = parts
        return f"{domain}://{tenant}/{namespace}/{unquote_plus(local)}"
    if len(parts) == 5:
        tenant, cluster, namespace, domain, local = parts
        return f"{domain}://{tenant}/{cluster}/{namespace}/{unquote_plus(local)}"
    return None


def decode_pulsar_metadata(custom: Mapping[str, bytes]) -> PulsarLedger:
    """Decode a ledger's custom metadata; a ledger Pulsar did not tag gives all-None fields."""
    values = tuple(map(custom.get, _PULSAR_KEYS))
    try:
        return _decode_pulsar(values)
    except TypeError:  # an unhashable value (a bytearray) is decoded, not cached
        return _decode_pulsar.__wrapped__(values)


_PULSAR_KEYS = (
    COMPONENT, MANAGED_LEDGER, LEGACY_MANAGED_LEDGER, CURSOR, LEGACY_CURSOR, COMPACTED_TOPIC,
    LEGACY_COMPACTED_TOPIC, SCHEMA_ID, APPLICATION,
)  # fmt: skip
"""The custom metadata keys :func:`decode_pulsar_metadata` reads, in :func:`_decode_pulsar`'s
order."""


@functools.lru_cache(maxsize=65536)  # a topic's ledgers all carry the same values
def _decode_pulsar(values: tuple[bytes | None, ...]) -> PulsarLedger:
    """:func:`decode_pulsar_metadata` of the values of :data:`_PULSAR_KEYS`."""
    raw = dict(zip(_PULSAR_KEYS, values, strict=True))
    component = _text(raw[COMPONENT])
    ml = _text(raw[MANAGED_LEDGER]) or _text(raw[LEGACY_MANAGED_LEDGER])
    cursor = _text(raw[CURSOR]) or _text(raw[LEGACY_CURSOR])
    topic: str | None = None
    if ml is not None:
        topic = topic_of_managed_ledger(ml)
    if topic is None:
        topic = _text(raw[COMPACTED_TOPIC]) or _text(raw[LEGACY_COMPACTED_TOPIC])
    schema = _text(raw[SCHEMA_ID])
    if topic is None and schema is not None:
        topic = schema if "://" in schema else f"persistent://{schema}"
    return PulsarLedger(component, topic, ml, cursor, schema, _text(raw[APPLICATION]))
