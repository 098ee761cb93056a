"""The audit's steps, in their one order, for every executor.

The command checks the cluster and plans the scan (:class:`~bklib.audit.engine.ScanPlan`)
before it picks an executor; then every run, whichever executor and whoever starts it
(``bkaudit audit``, the Spark entry point, the watch), goes through :func:`run_audit_steps`:
scan, check, placement, re-read, and commit, under the process's session guard. An executor
supplies only where each step runs (:class:`AuditExecutor`): in this process and its helper
(:class:`jobs.local.audit.LocalAudit`) or as Spark phases (:class:`jobs.spark.audit_job.AuditJob`).

A session that expired anywhere before the commit fails the run with
:class:`~bklib.meta.stores.session_guard.SessionLost`: what was read across the gap is not
one view of the cluster, so nothing is recorded as completed (docs/reliability.md).
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from bklib.meta.stores.base import MetadataStore
from bklib.meta.stores.session_guard import SessionGuard

__all__ = ["STEPS", "AuditExecutor", "run_audit_steps"]

STEPS = ("scan", "check", "placement", "re-read", "commit")
"""The steps after the plan, in the order every executor runs them."""

R_co = TypeVar("R_co", covariant=True)


class AuditExecutor(Protocol[R_co]):
    """Where an audit's steps run. Each method is one step of :data:`STEPS`."""

    def scan(self) -> None:
        """Read every ledger's metadata and the bookie registrations."""

    def check(self) -> object:
        """Run the check over every readable ledger."""

    def abandon(self) -> None:
        """Stop whatever the scan or the check left running (a helper process), at once if
        they failed; called after the check whatever happened."""

    def placement(self) -> None:
        """The placement pass, where racks are known."""

    def recheck(self) -> object:
        """Re-read the flagged ledgers; drop findings whose ledger changed or vanished."""

    def commit(self) -> R_co:
        """Record the run (its ``audit_runs`` row last); returns the run's record."""


def run_audit_steps(
    executor: AuditExecutor[R_co], session: MetadataStore, *, commit: bool = True
) -> R_co | None:
    """Run ``executor``'s steps in :data:`STEPS`' order under the guard of the process's
    store ``session``; the commit's record, or None with ``commit=False`` (a caller that
    records the run its own way, as the watch does through its spool)."""
    with SessionGuard(session) as guard:
        try:
            executor.scan()
            guard.check("the metadata scan")
            executor.check()
        finally:
            executor.abandon()  # a failed run stops its helper too
        executor.placement()
        executor.recheck()
        guard.check("the check")  # the last moment before anything is recorded
        return executor.commit() if commit else None
