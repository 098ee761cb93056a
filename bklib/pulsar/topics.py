"""Pulsar topic names and the admin API paths that name them (pure).

``persistent://tenant/namespace/local`` (v2) maps to ``/admin/v2/persistent/tenant/namespace/
<encoded local>``; the v1 form ``persistent://tenant/cluster/namespace/local`` to
``/admin/persistent/tenant/cluster/namespace/<encoded local>`` (Pulsar's
``PersistentTopics`` v2 and v1 resources). The local name is encoded as
``TopicName.getEncodedLocalName`` does (``Codec.encode``: ``URLEncoder`` in UTF-8).
A partition (``t-partition-3``) is a topic of its own, with its own managed ledger.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote_plus

__all__ = ["InvalidTopicName", "TopicName", "encode_local_name", "parse_topic"]

DOMAINS = ("persistent", "non-persistent")


class InvalidTopicName(ValueError):
    """The text is no full Pulsar topic name."""


@dataclass(frozen=True)
class TopicName:
    """A full topic name split into its parts; ``cluster`` is set for v1 names only."""

    domain: str
    tenant: str
    namespace: str
    local: str
    cluster: str | None = None

    def __str__(self) -> str:
        middle = f"{self.cluster}/" if self.cluster else ""
        return f"{self.domain}://{self.tenant}/{middle}{self.namespace}/{self.local}"

    @property
    def namespace_name(self) -> str:
        """``tenant/namespace`` (v2) or ``tenant/cluster/namespace`` (v1)."""
        middle = f"{self.cluster}/" if self.cluster else ""
        return f"{self.tenant}/{middle}{self.namespace}"

    def admin_path(self, action: str | None = None) -> str:
        """The admin REST path of the topic, or of ``action`` (``unload``, ``stats``...) on
        it."""
        encoded = encode_local_name(self.local)
        tail = f"/{action}" if action else ""
        if self.cluster:
            return (
                f"/admin/{self.domain}/{self.tenant}/{self.cluster}/{self.namespace}/"
                f"{encoded}{tail}"
            )
        return f"/admin/v2/{self.domain}/{self.tenant}/{self.namespace}/{encoded}{tail}"


def encode_local_name(local: str) -> str:
    """Pulsar's ``Codec.encode`` (Java's ``URLEncoder`` in UTF-8): space becomes ``+``,
    letters, digits and ``.-*_`` stay, everything else is ``%XX``."""
    return quote_plus(local, safe="*").replace("~", "%7E")


def parse_topic(name: str) -> TopicName:
    """Split a full topic name (``persistent://t/ns/x``, or v1 ``persistent://t/c/ns/x``).
    Raises :class:`InvalidTopicName` naming the text."""
    domain, sep, rest = name.partition("://")
    if not sep or domain not in DOMAINS:
        raise InvalidTopicName(f"topic {name!r}: expected persistent://tenant/namespace/topic")
    parts = rest.split("/", 3)
    if len(parts) == 3 and all(parts):
        return TopicName(domain, parts[0], parts[1], parts[2])
    if len(parts) == 4 and all(parts):
        return TopicName(domain, parts[0], parts[2], parts[3], cluster=parts[1])
    raise InvalidTopicName(f"topic {name!r}: expected persistent://tenant/namespace/topic")
