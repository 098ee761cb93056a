"""The placement flags (docs/placement.md): which BookKeeper placement rule the audit checks and
the repair keeps, and where the racks come from. The rule itself is
:mod:`bklib.audit.placement`; the pass that applies it is :mod:`jobs.runs.placement`.
"""

from __future__ import annotations

import argparse

from bklib.audit.placement import PlacementPolicyName, PlacementRule
from bklib.meta.racks import DEFAULT_RACKS_ZNODE, RackDocument

__all__ = [
    "PLACEMENT_AUTO",
    "PLACEMENT_MODES",
    "PLACEMENT_OFF",
    "PLACEMENT_ON",
    "add_placement_arguments",
    "document_to_check",
    "rule_from_args",
]


PLACEMENT_AUTO = "auto"


PLACEMENT_ON = "on"


PLACEMENT_OFF = "off"


PLACEMENT_MODES = (PLACEMENT_AUTO, PLACEMENT_ON, PLACEMENT_OFF)


def add_placement_arguments(parser: argparse.ArgumentParser, *, command: str) -> None:
    """The placement flags of ``command``: ``audit`` (the check), ``rereplicate`` (the fix)
    or ``recover`` / ``decommission`` (only ``--racks-file``, for replacement choice)."""
    if command == "audit":
        parser.add_argument(
            "--placement",
            choices=PLACEMENT_MODES,
            default=PLACEMENT_AUTO,
            help="placement check of every closed ledger's ensembles (metadata only): auto = "
            "when racks are configured (the racks znode or --racks-file names a rack for some "
            "bookie); on = always (no rack document is an error); off = never",
        )
        parser.add_argument(
            "--racks-znode",
            default=DEFAULT_RACKS_ZNODE,
            help="Pulsar's bookie rack JSON (BookieRackAffinityMapping)",
        )
    parser.add_argument(
        "--racks-file",
        default=None,
        help="YAML/JSON bookie -> rack mapping (plain BookKeeper), or Pulsar's /bookies "
        "layout; used instead of the racks znode",
    )
    if command == "recover" or command == "decommission":
        return
    if command == "rereplicate":
        parser.add_argument(
            "--fix-placement",
            action="store_true",
            help="fix the audit's PLACEMENT_VIOLATION findings (and nothing else): move one "
            "replica at a time to a bookie in a rack that satisfies the rule, by copy then "
            "compare-and-set; plain rereplicate never moves replicas for placement",
        )
    parser.add_argument(
        "--placement-policy",
        choices=PlacementPolicyName.ALL,
        default=PlacementPolicyName.RACKAWARE,
        help="BookKeeper policy whose rule is checked: rackaware "
        "(RackawareEnsemblePlacementPolicy, Pulsar's) or zoneaware",
    )
    parser.add_argument(
        "--min-racks-per-write-quorum",
        type=int,
        default=2,
        help="BookKeeper's minNumRacksPerWriteQuorum: racks every write set must span "
        "(capped at the write quorum)",
    )
    parser.add_argument(
        "--enforce-min-racks-per-write-quorum",
        action="store_true",
        help="BookKeeper's enforceMinNumRacksPerWriteQuorum: a write set using the default "
        "(unknown) rack fails",
    )
    parser.add_argument(
        "--min-zones-per-write-quorum",
        type=int,
        default=2,
        help="zoneaware: BookKeeper's minNumZonesPerWriteQuorum",
    )
    parser.add_argument(
        "--desired-zones-per-write-quorum",
        type=int,
        default=3,
        help="zoneaware: BookKeeper's desiredNumZonesPerWriteQuorum (fewer zones: MEETS_SOFT)",
    )


def rule_from_args(args: argparse.Namespace) -> PlacementRule:
    """The rule the flags describe (defaults for flags the command does not have)."""
    return PlacementRule(
        policy=getattr(args, "placement_policy", PlacementPolicyName.RACKAWARE),
        min_racks_per_write_quorum=getattr(args, "min_racks_per_write_quorum", 2),
        enforce_min_racks_per_write_quorum=getattr(
            args, "enforce_min_racks_per_write_quorum", False
        ),
        min_zones_per_write_quorum=getattr(args, "min_zones_per_write_quorum", 2),
        desired_zones_per_write_quorum=getattr(args, "desired_zones_per_write_quorum", 3),
    )


def document_to_check(mode: str, document: RackDocument | None) -> RackDocument | None:
    """The rack document the audit's placement pass checks against, or None for no pass.
    ``off``: never. ``on``: whatever the document says, even no rack (the caller refuses a
    missing document). ``auto``: only a document that names a rack: Pulsar's
    ``initialize-cluster-metadata`` creates ``/bookies`` as ``{}`` on every cluster, and with
    no rack configured every write set spans one rack, so every closed ledger would break a
    rule nobody set (docs/placement.md)."""
    if mode == PLACEMENT_OFF or document is None:
        return None
    if mode == PLACEMENT_AUTO and not document.racks:
        return None
    return document
