"""``pulsar``: Pulsar's metadata against BookKeeper's ledgers (docs/pulsar.md).

Not one of BookKeeper's replication checks: it writes ``pulsar_checks`` and
``pulsar_references``, not ``audit_runs``, and ``audit`` runs it with
``jobs.runs.pulsar_check`` instead of the engine.
"""

from __future__ import annotations

from bklib.audit.checks.base import AuditCheck
from bklib.states import Check

__all__ = ["PulsarCrossCheck"]


class PulsarCrossCheck(AuditCheck):
    """Dangling and orphan ledgers between Pulsar's managed ledgers, cursors and schemas and
    BookKeeper's ledgers (:mod:`bklib.pulsar.crosscheck`)."""

    name = Check.PULSAR
    summary = (
        "Pulsar's managed ledgers, cursors and schemas against BookKeeper's ledgers "
        "(dangling and orphan ledgers; docs/pulsar.md)"
    )
    asks = "nothing"
    finds = (
        "ledgers a topic, cursor or schema references that BookKeeper does not have (DANGLING); "
        "ledgers older than `--orphan-min-age` whose Pulsar owner does not list them (ORPHAN); "
        "written to `pulsar_checks` and `pulsar_references`, not `audit_runs` "
        "([pulsar.md](pulsar.md))"
    )
    misses = "under-replication (the other checks' job); an orphan without Pulsar's tags"
    cost = "metadata only: one read per ledger and per Pulsar key"
    replication = False
