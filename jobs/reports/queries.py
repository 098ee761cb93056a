"""The report's queries: plain-Python functions over rows of the Delta tables, rows in and
rows out (dicts keyed by column, as :func:`jobs.tables.delta.read_rows` or a collected Spark
DataFrame gives them). No I/O, so each is tested on its own and on Spark's rows alike;
:mod:`jobs.reports.data` runs them for ``bkaudit report`` and
``notebooks/underreplication.ipynb`` runs them on Spark (docs/operations.md).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from bklib.states import ActionKind, ActionStatus, Reason, RunStatus, Severity

Row = dict[str, Any]

SEVERITIES = Severity.ALL
UNKNOWN_SEVERITY = "UNKNOWN"
"""Chart label for fragments without a severity (their replica count is unknown)."""
STUCK_STATUSES = (ActionStatus.WAITING_GRACE, ActionStatus.NO_REPLICA)
DEFAULT_RUNS = 30


def _epoch_seconds(ts: datetime) -> float:
    """Seconds since the epoch. A naive timestamp is local time, as pyspark's ``collect``
    gives it; delta-rs gives UTC-aware ones."""
    return ts.timestamp()


def _from_epoch(seconds: int, like: datetime) -> datetime:
    """``seconds`` as a timestamp of the same kind as ``like``: UTC-aware, or naive local
    time (what pyspark's ``collect`` of ``timestamp_seconds`` gives)."""
    if like.tzinfo is not None:
        return datetime.fromtimestamp(seconds, tz=timezone.utc)
    return datetime.fromtimestamp(seconds)


def _distinct_count(values: Iterable[Any]) -> int:
    """count(DISTINCT x): nulls are not counted."""
    return len({v for v in values if v is not None})


def fragments_per_bookie(fragments: Iterable[Mapping[str, Any]]) -> list[Row]:
    """Per missing bookie and severity: fragments, distinct ledgers and missing entries.

    Keys: bookie_id, severity, fragments, ledgers, missing_entries; sorted by bookie_id,
    severity. Fragments without a severity (the replica count is unknown) count as severity
    ``UNKNOWN``.
    """
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for f in fragments:
        key = (f["bookie_id"], f["severity"] or UNKNOWN_SEVERITY)
        groups.setdefault(key, []).append(f)
    return [
        {
            "bookie_id": bookie,
            "severity": sev,
            "fragments": len(rows),
            "ledgers": _distinct_count(r["ledger_id"] for r in rows),
            "missing_entries": sum(r["missing_entries"] or 0 for r in rows),
        }
        for (bookie, sev), rows in sorted(groups.items())
    ]


def run_recency(run: Mapping[str, Any]) -> tuple[Any, ...]:
    """Sort key of audit runs, newest last: the rule of :func:`jobs.tables.delta.latest_run`
    (finished before unfinished, then finished_at or started_at, then started_at)."""
    return (run["finished_at"] is not None, run["finished_at"] or run["started_at"],
            run["started_at"])  # fmt: skip


def latest_run_per_check(
    runs: Iterable[Mapping[str, Any]], checks: Sequence[str] = ()
) -> list[Row]:
    """Each check's latest finished audit run, in the order of ``checks`` (the registry's),
    then any other check by name. A ``lost`` audit after a ``sample`` one does not hide what
    the sample found: it did not ask the bookies."""
    best: dict[str, Mapping[str, Any]] = {}
    for r in runs:
        if r["status"] not in RunStatus.FINISHED:
            continue
        cur = best.get(r["check"])
        if cur is None or run_recency(r) > run_recency(cur):
            best[r["check"]] = r
    order = {c: i for i, c in enumerate(checks)}
    keys = sorted(best, key=lambda c: (order.get(c, len(order)), c or ""))
    return [dict(best[c]) for c in keys]


def unfinished_after(
    runs: Iterable[Mapping[str, Any]], shown: Sequence[Mapping[str, Any]]
) -> list[Row]:
    """Runs that did not finish (FAILED, INTERRUPTED, still running) started after the
    shown run of their check, or after every shown run for a check not shown: what they
    would have found is unknown, so the page says they exist. Newest first."""
    latest = {r["check"]: r["started_at"] for r in shown}
    oldest = min((r["started_at"] for r in shown), default=None)
    out = [
        dict(r)
        for r in runs
        if r["status"] not in RunStatus.FINISHED
        and (since := latest.get(r["check"], oldest)) is not None
        and r["started_at"] > since
    ]
    return sorted(out, key=lambda r: r["started_at"], reverse=True)


def merge_run_findings(
    runs: Sequence[Mapping[str, Any]], fragments: Iterable[Mapping[str, Any]]
) -> list[Row]:
    """The findings of several checks' latest runs as one list: one row per fragment
    (ledger, segment, bookie), the newest run's. A BOOKIE_LOST finding of an older run is
    dropped when a newer run exists, since every check finds lost bookies: it was repaired,
    or the bookie came back. Findings only a reading check makes (unreachable, missing,
    corrupt) stay until that check runs again."""
    rank = {r["run_id"]: i for i, r in enumerate(sorted(runs, key=run_recency))}
    newest = len(rank) - 1
    best: dict[tuple[Any, Any, Any], Mapping[str, Any]] = {}
    for f in fragments:
        pos = rank.get(f["run_id"])
        if pos is None or (f["reason"] == Reason.BOOKIE_LOST and pos < newest):
            continue
        k = (f["ledger_id"], f["segment_first_entry_id"], f["bookie_id"])
        cur = best.get(k)
        if cur is None or pos > rank[cur["run_id"]]:
            best[k] = f
    return [dict(best[k]) for k in sorted(best, key=lambda k: (k[0], k[1], k[2]))]


def recent_runs(runs: Iterable[Mapping[str, Any]], limit: int = DEFAULT_RUNS) -> list[Row]:
    """The latest ``limit`` finished audit runs (COMPLETED or COMPLETED_WITH_ERRORS), newest
    first: run_id, started_at, check, status."""
    finished = [r for r in runs if r["status"] in RunStatus.FINISHED]
    newest = heapq.nlargest(max(limit, 0), finished, key=lambda r: r["started_at"])
    return [{k: r[k] for k in ("run_id", "started_at", "check", "status")} for r in newest]


def severity_over_runs(
    runs: Iterable[Mapping[str, Any]],
    fragments: Iterable[Mapping[str, Any]],
    limit: int = DEFAULT_RUNS,
) -> list[Row]:
    """Fragments per severity in each of the latest ``limit`` completed audit runs, oldest
    first. Runs without findings are kept (with zeros), so a repair shows as a drop to 0.
    ``fragments`` is read once and may be a generator over many runs.

    Keys: run_id, started_at, check, status, NO_REPLICA, BELOW_AQ, BELOW_WQ, UNKNOWN (no
    severity: a bookie that did not answer), fragments, underreplicated_ledgers.
    """
    recent = recent_runs(runs, limit)
    per_sev = {r["run_id"]: dict.fromkeys(SEVERITIES, 0) for r in recent}
    total = dict.fromkeys(per_sev, 0)
    ledgers: dict[str, set[int]] = {run_id: set() for run_id in per_sev}
    for f in fragments:
        counts = per_sev.get(f["run_id"])
        if counts is None:  # an older run, or one that did not finish
            continue
        if f["severity"] in counts:
            counts[f["severity"]] += 1
        total[f["run_id"]] += 1
        if f["ledger_id"] is not None:
            ledgers[f["run_id"]].add(f["ledger_id"])
    return [
        {
            **r,
            **per_sev[r["run_id"]],
            UNKNOWN_SEVERITY: total[r["run_id"]] - sum(per_sev[r["run_id"]].values()),
            "fragments": total[r["run_id"]],
            "underreplicated_ledgers": len(ledgers[r["run_id"]]),
        }
        for r in reversed(recent)
    ]


def choose_bucket_seconds(span_seconds: float) -> int:
    """Throughput bucket width for a time span: minutes up to 2 h, hours up to 7 days, else
    days (keeps the chart to at most ~170 columns)."""
    if span_seconds <= 2 * 3600:
        return 60
    if span_seconds <= 7 * 86400:
        return 3600
    return 86400


def finished_span_seconds(actions: Iterable[Mapping[str, Any]]) -> int:
    """Whole seconds between the first and the last ``finished_at`` of ``actions`` (0 when
    fewer than two actions finished): what :func:`choose_bucket_seconds` takes."""
    secs = [math.floor(_epoch_seconds(a["finished_at"])) for a in actions if a["finished_at"]]
    return max(secs) - min(secs) if secs else 0


def repair_throughput(actions: Iterable[Mapping[str, Any]], bucket_seconds: int) -> list[Row]:
    """Entries and bytes copied by finished COPY actions per time bucket (by finished_at).

    Keys: bucket_start (timestamp, UTC-aware when the input is), copies, entries_copied,
    bytes_copied, bytes_per_second; oldest bucket first.
    """
    buckets: dict[int, Row] = {}
    for a in actions:
        done = a["finished_at"]
        if a["action"] != ActionKind.COPY or a["status"] != ActionStatus.DONE or done is None:
            continue
        # Whole seconds first, as Spark's unix_timestamp does, then down to the bucket.
        start = math.floor(_epoch_seconds(done)) // bucket_seconds * bucket_seconds
        b = buckets.get(start)
        if b is None:
            b = buckets[start] = {
                "bucket_start": _from_epoch(start, done),
                "copies": 0,
                "entries_copied": 0,
                "bytes_copied": 0,
            }
        b["copies"] += 1
        b["entries_copied"] += a["entries_copied"] or 0
        b["bytes_copied"] += a["bytes_copied"] or 0
    out = [buckets[k] for k in sorted(buckets)]
    for b in out:
        b["bytes_per_second"] = b["bytes_copied"] / float(bucket_seconds)
    return out


def _recency(a: Mapping[str, Any]) -> tuple[Any, Any]:
    return (a["finished_at"] or a["started_at"], a["started_at"])


def _latest(
    actions: Iterable[Mapping[str, Any]], key: Callable[[Mapping[str, Any]], Any]
) -> dict[Any, Mapping[str, Any]]:
    """Per ``key``, the most recent action: latest coalesce(finished_at, started_at), then
    latest started_at (the first one seen wins a full tie)."""
    best: dict[Any, Mapping[str, Any]] = {}
    for a in actions:
        k = key(a)
        cur = best.get(k)
        if cur is None or _recency(a) > _recency(cur):
            best[k] = a
    return best


def latest_ledger_status(actions: Iterable[Mapping[str, Any]]) -> list[Row]:
    """Each ledger's most recent repair action, by ledger_id: ledger_id, run_id, action,
    status, error, no_replica_entries, since (when that action started), finished_at."""
    latest = _latest(actions, lambda a: a["ledger_id"])
    return [
        {
            "ledger_id": a["ledger_id"],
            "run_id": a["run_id"],
            "action": a["action"],
            "status": a["status"],
            "error": a["error"],
            "no_replica_entries": a["no_replica_entries"],
            "since": a["started_at"],
            "finished_at": a["finished_at"],
        }
        for _, a in sorted(latest.items())
    ]


def stuck_ledgers(actions: Iterable[Mapping[str, Any]]) -> list[Row]:
    """Ledgers whose latest repair action is WAITING_GRACE (open, grace period not over) or
    NO_REPLICA (entries that exist nowhere): what an operator has to look at by hand.
    Same keys as :func:`latest_ledger_status`, sorted by status, ledger_id."""
    rows = [r for r in latest_ledger_status(actions) if r["status"] in STUCK_STATUSES]
    return sorted(rows, key=lambda r: (r["status"], r["ledger_id"]))


def findings_with_repair_status(
    fragments: Iterable[Mapping[str, Any]],
    actions: Iterable[Mapping[str, Any]] | None,
    since: Any = None,
) -> list[Row]:
    """One run's fragments with what the repair runs started after ``since`` (the audit's
    start) left their ledger in: ``repair_status`` and ``repair_error`` by the rule
    ``listunderreplicated`` uses (:func:`jobs.commands.listing.repair_status`), so both
    reports say the same of every finding; ``repair_run_id`` names the deciding run."""
    from bklib.repair.outcome import REPAIRED, repair_status

    if actions is None:
        return [
            {**f, "repair_status": None, "repair_error": None, "repair_run_id": None}
            for f in fragments
        ]
    repairs = repair_status([dict(a) for a in actions], since)
    out = []
    for f in fragments:
        status, last = repairs.get(f["ledger_id"], (None, {}))
        error = last.get("error") if status not in (None, REPAIRED) else None
        out.append(
            {
                **f,
                "repair_status": status,
                "repair_error": error,
                "repair_run_id": last.get("run_id"),
            }
        )
    return out


def time_to_repair(
    fragments: Iterable[Mapping[str, Any]], actions: Iterable[Mapping[str, Any]]
) -> list[Row]:
    """For every fragment ever found (ledger, segment, bookie): when it was first detected,
    when its repair finished (the DONE METADATA_UPDATE that swapped the bookie out, else the
    last DONE COPY), and the hours in between (None while unrepaired).

    Keys: ledger_id, segment_first_entry_id, bookie_id, first_detected_at, repaired_at,
    hours_to_repair; sorted by the first three.
    """
    found: dict[tuple[Any, Any, Any], Any] = {}
    for f in fragments:
        k = (f["ledger_id"], f["segment_first_entry_id"], f["bookie_id"])
        first, cur = f["first_detected_at"], found.get(k)
        found[k] = first if cur is None or (first is not None and first < cur) else cur
    swapped: dict[tuple[Any, Any, Any], datetime] = {}  # first DONE METADATA_UPDATE
    last_done: dict[tuple[Any, Any, Any], datetime] = {}  # last DONE COPY or METADATA_UPDATE
    repairs = (ActionKind.METADATA_UPDATE, ActionKind.COPY)
    for a in actions:
        done = a["finished_at"]
        if (
            a["status"] != ActionStatus.DONE
            or a["action"] not in repairs
            or a["old_bookie"] is None
            or done is None
        ):
            continue
        # A METADATA_UPDATE that swapped several bookies names them all, comma-joined.
        for old in a["old_bookie"].split(","):
            k = (a["ledger_id"], a["segment_first_entry_id"], old)
            swap = a["action"] == ActionKind.METADATA_UPDATE
            if swap and (k not in swapped or done < swapped[k]):
                swapped[k] = done
            if k not in last_done or done > last_done[k]:
                last_done[k] = done
    out = []
    for k in sorted(found):
        repaired = swapped.get(k, last_done.get(k))
        first = found[k]
        hours = None
        if repaired is not None and first is not None:
            hours = (_epoch_seconds(repaired) - _epoch_seconds(first)) / 3600
        out.append(
            {
                "ledger_id": k[0],
                "segment_first_entry_id": k[1],
                "bookie_id": k[2],
                "first_detected_at": first,
                "repaired_at": repaired,
                "hours_to_repair": hours,
            }
        )
    return out


def severity_rank(finding: Mapping[str, Any]) -> int:
    """Sort key putting the worst severity first (no severity last)."""
    return Severity.ORDER.get(finding["severity"], len(Severity.ORDER))


def finding_order(finding: Mapping[str, Any]) -> tuple[Any, ...]:
    """Sort key of findings, worst first: by severity, then ledger, segment and bookie."""
    f = finding
    return (severity_rank(f), f["ledger_id"], f["segment_first_entry_id"], f["bookie_id"])


def worst_findings(findings: Iterable[Mapping[str, Any]], limit: int) -> list[Mapping[str, Any]]:
    """The ``limit`` worst findings (:func:`finding_order`)."""
    return heapq.nsmallest(max(limit, 0), findings, key=finding_order)


def affected_topics(fragments: Iterable[Mapping[str, Any]]) -> list[Row]:
    """Per Pulsar topic of the fragments: ledgers, fragments and worst severity, worst first
    (fragments of ledgers without a topic are left out)."""
    acc: dict[str, dict[str, Any]] = {}
    for f in fragments:
        topic = f.get("topic")
        if not topic:
            continue
        t = acc.setdefault(
            topic, {"topic": topic, "ledgers": set(), "fragments": 0, "severities": set()}
        )
        t["ledgers"].add(f["ledger_id"])
        t["fragments"] += 1
        t["severities"].add(f.get("severity"))
    out = []
    for t in acc.values():
        worst = Severity.worst(t["severities"])
        out.append(
            {
                "topic": t["topic"],
                "ledgers": len(t["ledgers"]),
                "fragments": t["fragments"],
                "worst": None if worst == Severity.NONE else worst,
            }
        )
    return sorted(out, key=lambda t: (Severity.ORDER.get(t["worst"] or "", 9), -t["ledgers"]))


def latest_blast_radius(rows: Iterable[Mapping[str, Any]], limit: int = 10) -> list[Row]:
    """The riskiest bookies and racks of the latest ``blast_radius`` run (``limit`` of each):
    most entries lost, then ledgers lost, ledgers below AQ, writers blocked."""
    rows = list(rows)
    if not rows:
        return []
    latest = max(rows, key=lambda r: r["computed_at"])["run_id"]
    mine = [dict(r) for r in rows if r["run_id"] == latest]

    def risk(r: Mapping[str, Any]) -> tuple[int, ...]:
        keys = ("entries_lost", "ledgers_lost", "ledgers_below_aq", "writers_blocked")
        return tuple(-int(r.get(k) or 0) for k in keys)

    out: list[Row] = []
    for scope in ("bookie", "rack"):
        out += sorted((r for r in mine if r["scope"] == scope), key=risk)[:limit]
    return out


def latest_triage(rows: Iterable[Mapping[str, Any]]) -> list[Row]:
    """The rows of the latest ``triage`` run, by class then ledger."""
    rows = list(rows)
    if not rows:
        return []
    latest = max(rows, key=lambda r: r["triaged_at"])["run_id"]
    return sorted(
        (dict(r) for r in rows if r["run_id"] == latest),
        key=lambda r: (r["class"], r["ledger_id"]),
    )
