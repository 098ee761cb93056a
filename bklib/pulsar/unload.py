"""Which topics to unload after a repair, and unloading them at a bounded rate.

A Pulsar broker keeps a read handle of each ledger it has opened, with the ensemble the ledger
had then (``ManagedLedgerImpl.ledgerCache``), and keeps reading a fenced ledger through its
own handle. Once a repair has changed a ledger's ensemble or fenced and closed it, that
broker's reads may go to the dead bookies until the topic is reloaded. Unloading the topic
(its owner closes it; the next client reopens it) drops those handles; Java AutoRecovery
leaves the broker in the same state and unloads nothing. See docs/pulsar.md.

The plan is pure; :func:`unload_topics` does the I/O through a :class:`PulsarAdmin`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from bklib.pulsar.admin import PulsarAdmin, PulsarAdminError, PulsarAdminUnreachable
from bklib.pulsar.topics import InvalidTopicName, parse_topic
from bklib.states import ActionKind, ActionStatus

__all__ = [
    "UnloadOutcome",
    "ledgers_changed",
    "operator_command",
    "topics_awaiting_unload",
    "topics_to_unload",
    "unload_topics",
]

log = logging.getLogger(__name__)

CHANGES_HANDLES = frozenset({ActionKind.FENCE_AND_CLOSE, ActionKind.METADATA_UPDATE})
"""Actions after which a broker's open handle of the ledger is stale."""


def ledgers_changed(rows: Iterable[Mapping[str, object]], *, dry_run: bool = False) -> set[int]:
    """Ledgers whose ensemble or state the run changed (DONE), or would change (PLANNED in a
    dry run)."""
    wanted = ActionStatus.PLANNED if dry_run else ActionStatus.DONE
    return {
        int(str(r["ledger_id"]))
        for r in rows
        if r["action"] in CHANGES_HANDLES and r["status"] == wanted
    }


def topics_to_unload(
    ledgers: Iterable[int], topic_of: Mapping[int, str | None]
) -> dict[str, list[int]]:
    """Each persistent topic behind ``ledgers`` with its ledgers (ascending), once per topic.
    Ledgers Pulsar did not tag have no topic and need no unload."""
    out: dict[str, list[int]] = {}
    for lid in sorted(set(ledgers)):
        topic = topic_of.get(lid)
        if topic and topic.startswith("persistent://"):
            out.setdefault(topic, []).append(lid)
    return dict(sorted(out.items()))


def topics_awaiting_unload(actions: Iterable[Mapping[str, Any]]) -> list[str]:
    """Topics whose latest ``UNLOAD_TOPIC`` row (dry runs aside) is not DONE or SKIPPED: a
    repair changed their ledgers and no unload has reached their broker since (MANUAL: the
    admin API was not given, the operator's step; FAILED: the admin API refused)."""
    latest: dict[str, Mapping[str, Any]] = {}
    for a in actions:
        if a["action"] != ActionKind.UNLOAD_TOPIC or not a.get("topic"):
            continue
        if a["status"] == ActionStatus.PLANNED:
            continue
        t = str(a["topic"])
        if t not in latest or a["started_at"] >= latest[t]["started_at"]:
            latest[t] = a
    return sorted(
        t for t, a in latest.items() if a["status"] not in (ActionStatus.DONE, ActionStatus.SKIPPED)
    )


def operator_command(topic: str) -> str:
    """What an operator runs to do the unload by hand."""
    return f"pulsar-admin topics unload {topic}"


@dataclass(frozen=True)
class UnloadOutcome:
    """One topic's unload: ``status`` is DONE, PLANNED (dry run), SKIPPED (the topic no longer
    exists, so no broker holds it), MANUAL (no admin API was given: the operator runs
    ``error``'s command, or a later run with the admin API does it) or FAILED (the admin API
    refused; ``error`` says why, and a later run with the admin API retries it)."""

    topic: str
    ledger_ids: tuple[int, ...]
    status: str
    error: str | None
    started_at: float
    finished_at: float


def unload_topics(
    admin: PulsarAdmin | None,
    plan: Mapping[str, list[int]],
    *,
    per_second: float = 2.0,
    dry_run: bool = False,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.time,
) -> list[UnloadOutcome]:
    """Unload each topic of ``plan`` once, at most ``per_second`` a second (each unload makes
    the topic's producers and consumers reconnect). Never raises for the admin API: once it is
    unreachable, the remaining topics fail with the same error without more attempts. Without
    an ``admin`` nothing was asked of the admin API, so nothing failed: each topic is MANUAL,
    with the command that would unload it, so the need is on record until a later run (or
    the operator) does it."""
    out: list[UnloadOutcome] = []
    interval = 1.0 / per_second if per_second > 0 else 0.0
    unreachable: str | None = None
    last = 0.0
    for topic, lids in plan.items():
        t0 = clock()
        if dry_run:
            out.append(UnloadOutcome(topic, tuple(lids), ActionStatus.PLANNED, None, t0, t0))
            continue
        if admin is None:
            why = f"not unloaded: no --pulsar-admin-url; run {operator_command(topic)}"
            out.append(UnloadOutcome(topic, tuple(lids), ActionStatus.MANUAL, why, t0, t0))
            continue
        if unreachable is not None:
            out.append(UnloadOutcome(topic, tuple(lids), ActionStatus.FAILED, unreachable, t0, t0))
            continue
        wait = last + interval - time.monotonic()
        if last and wait > 0:
            sleep(wait)
        last = time.monotonic()
        status, error = ActionStatus.DONE, None
        try:
            admin.unload(parse_topic(topic))
            log.info("topic %s unloaded (ledgers %s repaired)", topic, lids)
        except InvalidTopicName as exc:
            status, error = ActionStatus.FAILED, str(exc)
        except PulsarAdminUnreachable as exc:
            status, error = ActionStatus.FAILED, str(exc)
            unreachable = str(exc)
            log.warning("topic %s: %s", topic, exc)
        except PulsarAdminError as exc:
            if exc.status == 404:  # deleted meanwhile: no broker holds a handle
                status, error = ActionStatus.SKIPPED, str(exc)
            else:
                status, error = ActionStatus.FAILED, str(exc)
            if exc.status in (401, 403):  # the credentials fail for every topic alike
                unreachable = str(exc)
            log.warning("topic %s: %s", topic, exc)
        out.append(UnloadOutcome(topic, tuple(lids), status, error, t0, clock()))
    return out
