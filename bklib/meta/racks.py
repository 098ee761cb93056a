"""Bookie racks as Pulsar publishes them for BookKeeper's rack-aware placement
(``ZkBookieRackAffinityMapping``): one JSON znode, ``/bookies`` by default, mapping a group
to bookie ids to ``{"rack": ..., "hostname": ...}``."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kazoo.client import KazooClient

from bklib.meta.stores.base import KeyNotFound, MetadataStore
from bklib.meta.stores.zookeeper import as_store

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


def read_racks(zk: MetadataStore | KazooClient, path: str = DEFAULT_RACKS_ZNODE) -> dict[str, str]:
    """Racks from ``path``, or {} when the znode does not exist."""
    try:
        data, _ = as_store(zk).get(path)
    except KeyNotFound:
        return {}
    return parse_racks(data, path)


# ---- strict reading, for the placement check and repair (docs/placement.md) -------------------

DEFAULT_RACK = "/default-rack"
"""BookKeeper's ``NetworkTopology.DEFAULT_RACK``: the rack of a bookie no mapping names."""


class RacksFormatError(ValueError):
    """A rack document (the ``/bookies`` znode or a ``--racks-file``) that does not parse; the
    message names its source."""


@dataclass(frozen=True)
class RackDocument:
    """Racks as the placement check reads them.

    ``racks``: bookie id -> rack, normalized as Pulsar's ``BookieRackAffinityMapping.getRack``
    does (leading ``/`` added; an empty rack or ``/`` is no rack). ``groups``: Pulsar's
    isolation groups (top-level keys of the document) -> the bookie ids listed under them;
    empty for a flat racks file. ``source`` names the znode or file.
    """

    racks: Mapping[str, str]
    groups: Mapping[str, frozenset[str]] = field(default_factory=dict)
    source: str = DEFAULT_RACKS_ZNODE

    def rack(self, bookie: str) -> str | None:
        """The bookie's rack, or None when the document names none."""
        return self.racks.get(bookie)


def normalize_rack(rack: object) -> str | None:
    """Pulsar's ``BookieRackAffinityMapping.getRack``: None, blank or ``/`` is no rack; a rack
    without a leading ``/`` gets one (``rack-a`` and ``/rack-a`` are the same rack)."""
    if rack is None:
        return None
    text = str(rack).strip()
    if not text or text == "/":
        return None
    return text if text.startswith("/") else "/" + text


def _strict_doc(doc: object, source: str) -> RackDocument:
    """A decoded document: Pulsar's ``{group: {bookie: {"rack": ...}}}``, or (files only) a
    flat ``{bookie: rack}``; anything else raises RacksFormatError naming ``source``."""
    if doc is None:
        return RackDocument({}, {}, source)
    if not isinstance(doc, dict):
        raise RacksFormatError(
            f"rack document {source} is not a JSON object of groups (got {type(doc).__name__})"
        )
    racks: dict[str, str] = {}
    groups: dict[str, frozenset[str]] = {}
    for group, members in doc.items():
        if isinstance(members, str) or members is None:  # flat {bookie: rack}
            rack = normalize_rack(members)
            if rack is not None:
                racks[str(group)] = rack
            continue
        if not isinstance(members, dict):
            raise RacksFormatError(
                f"rack document {source}: group {group!r} is not an object of bookies"
            )
        for bookie, info in members.items():
            if not isinstance(info, dict):
                raise RacksFormatError(
                    f"rack document {source}: bookie {bookie!r} of group {group!r} is not an "
                    '{"rack": ..., "hostname": ...} object'
                )
            rack_value = info.get("rack")
            if rack_value is not None and not isinstance(rack_value, str):
                raise RacksFormatError(
                    f"rack document {source}: rack of {bookie!r} is not a string: {rack_value!r}"
                )
            rack = normalize_rack(rack_value)
            if rack is not None:
                racks.setdefault(str(bookie), rack)
        groups[str(group)] = frozenset(str(b) for b in members)
    return RackDocument(racks, groups, source)


def parse_racks_strict(data: bytes, path: str = DEFAULT_RACKS_ZNODE) -> RackDocument:
    """Pulsar's rack JSON, refusing anything else with a :class:`RacksFormatError` that names
    the znode (unlike :func:`parse_racks`, which falls back to rack-unaware). Empty data is an
    empty document."""
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        raise RacksFormatError(f"rack document {path} is not UTF-8: {exc}") from exc
    if not text.strip():
        return RackDocument({}, {}, path)
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise RacksFormatError(f"rack document {path} is not JSON: {exc}") from exc
    if isinstance(doc, dict) and any(isinstance(v, str) for v in doc.values()):
        raise RacksFormatError(
            f"rack document {path}: expected Pulsar's {{group: {{bookie: {{rack}}}}}} layout"
        )
    return _strict_doc(doc, path)


def read_racks_strict(
    zk: MetadataStore | KazooClient, path: str = DEFAULT_RACKS_ZNODE
) -> RackDocument | None:
    """The znode's document parsed strictly, or None when the znode does not exist."""
    try:
        data, _ = as_store(zk).get(path)
    except KeyNotFound:
        return None
    return parse_racks_strict(data, path)


def load_racks_file(path: str | Path) -> RackDocument:
    """A racks file for plain BookKeeper: YAML or JSON (JSON is YAML), either a flat
    ``{bookie: rack}`` mapping or Pulsar's ``/bookies`` layout. Raises RacksFormatError
    naming the file when it cannot be read or parsed."""
    import yaml  # type: ignore[import-untyped, unused-ignore]

    source = str(path)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise RacksFormatError(f"racks file {source} cannot be read: {exc}") from exc
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise RacksFormatError(f"racks file {source} is not YAML or JSON: {exc}") from exc
    return _strict_doc(doc, source)
