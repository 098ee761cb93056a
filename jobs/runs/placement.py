"""The placement check and fix, as the jobs wire them (docs/placement.md): the rack
document (Pulsar's ``/bookies`` znode or ``--racks-file``), the metadata-only pass the audit
runs over closed ledgers, and its counts and log lines. The rule itself is
:mod:`bklib.audit.placement`, its flags :mod:`jobs.options.placement`; this module never
imports Spark.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from bklib.audit.model import Finding, LedgerView
from bklib.audit.placement import PlacementRule, placement_findings
from bklib.audit.placement import rack_resolver as _resolver
from bklib.meta.racks import RackDocument, load_racks_file, read_racks_strict
from bklib.meta.stores import MetadataStore
from bklib.states import UNKNOWN_RACK, CountKey, Reason

__all__ = [
    "PlacementPass",
    "load_rack_document",
    "placement_counts",
]

log = logging.getLogger("jobs.runs.placement")


def load_rack_document(
    session: MetadataStore, znode: str, racks_file: str | None
) -> RackDocument | None:
    """The racks file when given, else the racks znode parsed strictly; None when neither
    exists. Raises :class:`~bklib.meta.racks.RacksFormatError` naming the znode or file when
    it does not parse."""
    if racks_file:
        return load_racks_file(racks_file)
    return read_racks_strict(session, znode)


class PlacementPass:
    """The audit's placement pass over ledgers (either executor): findings plus what the
    counts need. Picklable: a Spark task gets a copy."""

    def __init__(self, document: RackDocument, rule: PlacementRule) -> None:
        self.racks = dict(document.racks)
        self.source = document.source
        self.rule = rule

    def ledger(self, view: LedgerView) -> tuple[int, list[Finding]]:
        """(segments checked, findings) of one ledger."""
        return placement_findings(
            view, self.rule, _resolver(self.racks, self.rule.default_location)
        )

    def rows(self, rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Finding rows for ledger rows (the Spark path)."""
        out: list[dict[str, Any]] = []
        for row in rows:
            _, found = self.ledger(LedgerView.from_row(row))
            out.extend(f.as_row() for f in found)
        return out


def placement_counts(
    checked: int,
    findings: Iterable[Finding] | Iterable[Mapping[str, Any]],
    named: Iterable[str],
    document: RackDocument,
    rule: PlacementRule,
) -> dict[str, int]:
    """``audit_runs.counts`` of the pass, and one log line: racks seen, the bookies with no
    rack (one "unknown" rack), violations."""
    rows = [f if isinstance(f, Mapping) else f.as_row() for f in findings]
    named_set = set(named)
    unknown = sorted(b for b in named_set if document.rack(b) is None)
    racks = {document.racks[b] for b in named_set if b in document.racks}
    counts = {
        CountKey.PLACEMENT_SEGMENTS: checked,
        CountKey.PLACEMENT_VIOLATIONS: len(rows),
        CountKey.PLACEMENT_LEDGERS: len({r["ledger_id"] for r in rows}),
        CountKey.PLACEMENT_RACKS: len(racks) + (1 if unknown else 0),
        CountKey.PLACEMENT_UNKNOWN_RACK_BOOKIES: len(unknown),
        CountKey.reason(Reason.PLACEMENT_VIOLATION): len(rows),
    }
    log.info(
        "placement (%s, racks from %s): %d segments of closed ledgers checked, %d violate it "
        "in %d ledgers; racks: %s",
        rule.describe(),
        document.source,
        checked,
        len(rows),
        counts[CountKey.PLACEMENT_LEDGERS],
        ", ".join(sorted(racks) + ([UNKNOWN_RACK] if unknown else [])) or "none",
    )
    if unknown:
        log.warning(
            "placement: %d bookies have no rack in %s and count as one rack, %r "
            "(BookKeeper's default rack): %s",
            len(unknown),
            document.source,
            UNKNOWN_RACK,
            ", ".join(unknown[:20]) + (" ..." if len(unknown) > 20 else ""),
        )
    return counts


def under_replication(findings: Iterable[Finding]) -> list[Finding]:
    """The findings that are under-replication (what ``summarize`` counts as fragments)."""
    return [f for f in findings if f.reason != Reason.PLACEMENT_VIOLATION]


def final_placement_counts(
    findings: Iterable[Finding], counts: Mapping[str, int]
) -> dict[str, int]:
    """The violation counts after the re-read dropped findings (only when the pass ran)."""
    if CountKey.PLACEMENT_SEGMENTS not in counts:
        return {}
    rows = [f for f in findings if f.reason == Reason.PLACEMENT_VIOLATION]
    return {
        CountKey.PLACEMENT_VIOLATIONS: len(rows),
        CountKey.PLACEMENT_LEDGERS: len({f.ledger_id for f in rows}),
        CountKey.reason(Reason.PLACEMENT_VIOLATION): len(rows),
    }


def placement_note(counts: Mapping[str, int]) -> str:
    """The summary line's placement part ("" when the pass did not run)."""
    if CountKey.PLACEMENT_SEGMENTS not in counts:
        return ""
    text = f", {counts.get(CountKey.PLACEMENT_VIOLATIONS, 0)} placement violations"
    unknown = counts.get(CountKey.PLACEMENT_UNKNOWN_RACK_BOOKIES, 0)
    if unknown:
        text += f" ({unknown} bookies with no rack count as one rack, {UNKNOWN_RACK!r})"
    return text
