"""Bookie racks as Pulsar publishes them for BookKeeper's rack-aware placement
(``ZkBookieRackAffinityMapping``): one JSON znode, ``/bookies`` by default, mapping a group
to bookie ids to ``{"rack": ..., "hostname": ...}``."""

from __future__ import annotations

import json
import logging

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

log = logging.getLogger(__name__)

DEFAULT_RACKS_ZNODE = "/bookies"


def parse_racks(data: bytes, path: str = DEFAULT_RACKS_ZNODE) -> dict[str, str]:
    """bookie id -> rack from the znode's JSON; an unreadable document yields no racks (the
    choice then is rack-unaware) and a warning naming the znode."""
    try:
        doc = json.loads(data.decode() or "{}")
        out: dict[str, str] = {}
        for group in doc.values():
            for bookie, info in group.items():
                rack = info.get("rack") if isinstance(info, dict) else None
                if rack:
                    out[bookie] = str(rack)
        return out
    except (ValueError, AttributeError) as exc:
        log.warning(
            "racks znode %s is not Pulsar's rack JSON (%s): placement is rack-unaware", path, exc
        )
        return {}


def read_racks(zk: KazooClient, path: str = DEFAULT_RACKS_ZNODE) -> dict[str, str]:
    """Racks from ``path``, or {} when the znode does not exist."""
    try:
        data, _ = zk.get(path)
    except NoNodeError:
        return {}
    return parse_racks(data, path)
