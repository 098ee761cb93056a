"""The Pulsar cross-check's results as the reports show them (``pulsar_checks`` and
``pulsar_references``; docs/pulsar.md): the latest finished check and what it found."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from bklib.states import PulsarFinding, RunStatus

__all__ = ["format_pulsar_by_topic", "latest_pulsar_check", "orphans_per_namespace"]

Row = dict[str, Any]


def latest_pulsar_check(
    checks: Iterable[Mapping[str, Any]], findings: Iterable[Mapping[str, Any]]
) -> tuple[Row | None, list[Row]]:
    """The latest finished check and its findings (dangling first, then orphans, then
    errors; by topic and ledger)."""
    done = [dict(c) for c in checks if c["status"] in RunStatus.FINISHED]
    if not done:
        return None, []
    latest = max(done, key=lambda c: c["started_at"])
    order = {PulsarFinding.DANGLING: 0, PulsarFinding.ORPHAN: 1, PulsarFinding.ERROR: 2}
    mine = sorted(
        (dict(f) for f in findings if f["run_id"] == latest["run_id"]),
        key=lambda f: (order.get(f["kind"], 9), f.get("topic") or "", f.get("ledger_id") or 0),
    )
    return latest, mine


def orphans_per_namespace(findings: Iterable[Mapping[str, Any]]) -> list[Row]:
    """Orphan ledgers and their bytes per namespace, most bytes first."""
    per_ns: dict[str, Row] = {}
    for f in findings:
        if f["kind"] != PulsarFinding.ORPHAN:
            continue
        ns = f.get("namespace") or "(no namespace)"
        row = per_ns.setdefault(ns, {"namespace": ns, "orphans": 0, "bytes": 0})
        row["orphans"] += 1
        row["bytes"] += int(f.get("bytes") or 0)
    return sorted(per_ns.values(), key=lambda r: (-r["bytes"], r["namespace"]))


def format_pulsar_by_topic(check: Mapping[str, Any], findings: Iterable[Mapping[str, Any]]) -> str:
    """``listunderreplicated --by-topic``'s Pulsar part: per topic its dangling and orphan
    ledgers, then the keys that could not be decoded."""
    by_topic: dict[str, dict[str, list[Mapping[str, Any]]]] = {}
    errors = []
    for f in findings:
        if f["kind"] == PulsarFinding.ERROR:
            errors.append(f)
            continue
        by_topic.setdefault(f.get("topic") or "(no topic)", {}).setdefault(f["kind"], []).append(f)
    lines = [f"pulsar check {check['run_id']} ({check['status']}): by topic"]
    for topic, kinds in sorted(by_topic.items()):
        dangling = kinds.get(PulsarFinding.DANGLING, [])
        orphans = kinds.get(PulsarFinding.ORPHAN, [])
        size = sum(int(o.get("bytes") or 0) for o in orphans)
        parts = []
        if dangling:
            ids = " ".join(str(d["ledger_id"]) for d in dangling)
            parts.append(f"{len(dangling)} dangling (ledgers {ids}: reads fail)")
        if orphans:
            ids = " ".join(str(o["ledger_id"]) for o in orphans)
            parts.append(f"{len(orphans)} orphan ({size} bytes; ledgers {ids})")
        lines.append(f"{topic}  " + ", ".join(parts))
    for e in errors:
        lines.append(f"undecodable {e.get('key')}: {e.get('error')}")
    if len(lines) == 1:
        lines.append("no dangling or orphan ledgers")
    return "\n".join(lines)
