"""ZooKeeper path arithmetic for BookKeeper's ledger managers and under-replication tree (pure)."""

from __future__ import annotations

import re
from enum import Enum

# Ids strictly below Integer.MAX_VALUE use the short (legacy) hierarchical path.
SHORT_ID_LIMIT = 2_147_483_647

LAYOUT_ZNODE = "LAYOUT"
INSTANCEID_ZNODE = "INSTANCEID"
AVAILABLE_ZNODE = "available"
SPECIAL_ZNODES = frozenset(
    {
        AVAILABLE_ZNODE,
        "cookies",
        LAYOUT_ZNODE,
        INSTANCEID_ZNODE,
        "underreplication",
        "idgen",
        "idgen-long",
    }
)

HIERARCHICAL_FACTORY = "org.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory"
LONG_HIERARCHICAL_FACTORY = "org.apache.bookkeeper.meta.LongHierarchicalLedgerManagerFactory"
FLAT_FACTORY = "org.apache.bookkeeper.meta.FlatLedgerManagerFactory"
LEGACY_HIERARCHICAL_FACTORY = "org.apache.bookkeeper.meta.LegacyHierarchicalLedgerManagerFactory"


class LayoutKind(Enum):
    """Which ledger manager decides where a ledger's znode lives."""

    HIERARCHICAL = "hierarchical"  # hybrid: short path below 2^31-1, long path above
    LONG_HIERARCHICAL = "longhierarchical"
    LEGACY_HIERARCHICAL = "legacyhierarchical"
    FLAT = "flat"

    @classmethod
    def from_factory(cls, factory: str) -> LayoutKind:
        """Map a LAYOUT factory class (or a version-1 layout type name) to a kind."""
        table = {
            HIERARCHICAL_FACTORY: cls.HIERARCHICAL,
            LONG_HIERARCHICAL_FACTORY: cls.LONG_HIERARCHICAL,
            LEGACY_HIERARCHICAL_FACTORY: cls.LEGACY_HIERARCHICAL,
            FLAT_FACTORY: cls.FLAT,
            # Version-1 LAYOUT files name a type instead of a class.
            "hierarchical": cls.LEGACY_HIERARCHICAL,
            "flat": cls.FLAT,
        }
        try:
            return table[factory]
        except KeyError:
            raise ValueError(f"unsupported ledger manager {factory!r}") from None

    @property
    def factory_class(self) -> str:
        return {
            LayoutKind.HIERARCHICAL: HIERARCHICAL_FACTORY,
            LayoutKind.LONG_HIERARCHICAL: LONG_HIERARCHICAL_FACTORY,
            LayoutKind.LEGACY_HIERARCHICAL: LEGACY_HIERARCHICAL_FACTORY,
            LayoutKind.FLAT: FLAT_FACTORY,
        }[self]


def join(root: str, *parts: str) -> str:
    root = root.rstrip("/")
    return "/".join([root, *parts]) if parts else (root or "/")


def short_hierarchical_path(root: str, ledger_id: int) -> str:
    s = f"{ledger_id:010d}"
    return join(root, s[0:2], s[2:6], "L" + s[6:10])


def long_hierarchical_path(root: str, ledger_id: int) -> str:
    s = f"{ledger_id:019d}"
    return join(root, s[0:3], s[3:7], s[7:11], s[11:15], "L" + s[15:19])


def flat_path(root: str, ledger_id: int) -> str:
    return join(root, f"L{ledger_id:010d}")


def ledger_path(root: str, ledger_id: int, kind: LayoutKind = LayoutKind.HIERARCHICAL) -> str:
    """The znode holding ``ledger_id``'s metadata under ``root`` for the given ledger manager."""
    if ledger_id < 0:
        raise ValueError(f"negative ledger id {ledger_id}")
    if kind is LayoutKind.FLAT:
        return flat_path(root, ledger_id)
    if kind is LayoutKind.LONG_HIERARCHICAL or ledger_id >= SHORT_ID_LIMIT:
        return long_hierarchical_path(root, ledger_id)
    return short_hierarchical_path(root, ledger_id)


def ledger_id_from_path(root: str, path: str) -> int | None:
    """Parse a ledger id back from a hierarchical or flat path; None if it is not a ledger."""
    rel = path[len(root.rstrip("/")) + 1 :] if path.startswith(root.rstrip("/") + "/") else path
    parts = rel.strip("/").split("/")
    if not parts or not parts[-1].startswith("L"):
        return None
    parts[-1] = parts[-1][1:]
    digits = "".join(parts)
    if len(parts) not in (1, 3, 5) or not digits.isdigit():
        return None
    return int(digits)


SHORT_TOP_RE = re.compile(r"^\d{2}$")
LONG_TOP_RE = re.compile(r"^\d{3}$")
LEVEL_RE = re.compile(r"^\d{4}$")
LEAF_RE = re.compile(r"^L\d{4}$")
FLAT_LEAF_RE = re.compile(r"^L\d{10}$")


def is_special_znode(name: str) -> bool:
    return name in SPECIAL_ZNODES or name.startswith("ID-")


# ---- under-replication tree -------------------------------------------------------------------


def ur_base(root: str) -> str:
    return join(root, "underreplication")


def ur_ledger_path(root: str, ledger_id: int) -> str:
    """``underreplication/ledgers/<h1>/<h2>/<h3>/<h4>/urL<id>`` with 16-bit hex levels."""
    h = [(ledger_id >> shift) & 0xFFFF for shift in (48, 32, 16, 0)]
    return join(ur_base(root), "ledgers", *(f"{x:04x}" for x in h), f"urL{ledger_id:010d}")


def ur_lock_path(root: str, ledger_id: int) -> str:
    return join(ur_base(root), "locks", f"urL{ledger_id:010d}")


UR_NODE_RE = re.compile(r"urL(\d+)$")


# ---- bkaudit's own keys ------------------------------------------------------------------------


def own_path(ledgers_root: str, *parts: str) -> str:
    """``/bkaudit<ledgers root>/<parts>``: bkaudit's own keys (the watch's election, a repair's
    stop marker), one namespace per cluster of the chroot, outside BookKeeper's tree, where
    no ledger manager walks."""
    root = "/" + ledgers_root.strip("/")
    return join("/bkaudit" + root.rstrip("/"), *parts)
