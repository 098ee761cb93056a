"""The watch's repair of what an audit found: BookKeeper's marks first (as the Auditor
publishes them), then ``rereplicate``'s engine (:func:`jobs.runs.repair_partition.
repair_partition`, the :class:`~bklib.repair.worker.LedgerRepairer` with its locks, grace
period and compare-and-set) in this process, and for a large repair also in worker processes
(:mod:`jobs.watch.repair_workers`), its actions written to ``replication_actions``,
then the Pulsar topics whose ledgers changed unloaded (docs/watch.md, docs/repair.md).
Leadership is confirmed before the marks and before each ledger starts."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from bklib.meta.stores.zookeeper.budget import shared_budget
from bklib.repair.requests import LedgerRequest, mark_requests, requests_from_findings
from bklib.states import ActionStatus, Executor, RepairMode
from jobs.runs.repair_run import RepairConfig, stamp
from jobs.runtime.messages import one_line
from jobs.tables.runs import new_run_id
from jobs.tables.schema import ACTIONS
from jobs.watch.config import WatchConfig, repair_config
from jobs.watch.election import Leadership
from jobs.watch.metrics import WatchMetrics
from jobs.watch.repair_workers import RepairWorkers, repair_processes, split_shares
from jobs.watch.warehouse import WatchWarehouse
from jobs.watch.watcher import ClusterWatcher

__all__ = ["WatchRepair"]

log = logging.getLogger("jobs.watch")


TOPICS_NAMED = 10
"""Pulsar topics left to unload that a repair's log names one by one; the rest are counted."""


class WatchRepair:
    """Marks and repairs for the leader's cycles."""

    def __init__(
        self,
        config: WatchConfig,
        metrics: WatchMetrics,
        leadership: Leadership,
        warehouse: WatchWarehouse,
        watcher: ClusterWatcher,
    ) -> None:
        self.cfg = config
        self.metrics = metrics
        self.leadership = leadership
        self.warehouse = warehouse
        self.watcher = watcher
        self.no_replica: list[dict[str, Any]] = []
        """NO_REPLICA actions of earlier runs: reported again, not copied again."""
        self.workers_failed = False
        """A repair worker process failed in this term: repairs run in this process only."""

    def paused(self) -> bool:
        """``underreplication/disable`` exists: mark, but repair nothing."""
        return not self.watcher.urm.is_replication_enabled()

    def mark(
        self, rows: Iterable[Mapping[str, Any]], known: Mapping[int, Sequence[str]] | None = None
    ) -> None:
        """Publish BookKeeper's marks (merged into existing ones), as the Auditor does, so
        ``listunderreplicated`` and Java ReplicationWorkers see the work. ``known``: the marks
        this cycle read (a second loss's marks beside the first's still standing)."""
        self.leadership.confirm()
        missing: dict[int, set[str]] = {}
        for r in rows:
            missing.setdefault(int(r["ledger_id"]), set()).add(r["bookie_id"])
        # Many marks per request, many requests in flight: one round trip per mark was most
        # of the reaction time to a lost bookie.
        marks = {lid: sorted(b) for lid, b in missing.items()}
        written = self.watcher.urm.mark_many(marks, known=known)
        log.info("watch: %d ledgers marked under-replicated (%d marks new)", len(marks), written)

    def repair(
        self,
        rows: list[dict[str, Any]],
        audit_run_id: str,
        first_done: Callable[[], None] | None = None,
        changed: Callable[[], bool] | None = None,
    ) -> list[dict[str, Any]]:
        """The rereplicate engine over ``rows``, ``ledgers_in_flight`` ledgers at a time (a stop
        or a lost leadership waits only for the ledgers in flight); the actions it wrote.
        ``first_done`` is called once, when the first ledger with a copy done finishes, in
        whichever thread or process. Once ``changed`` says the lost bookies changed
        (:class:`~jobs.watch.loss_changes.LossChanges`), no more ledgers start either."""
        reqs = requests_from_findings(rows, self.no_replica)
        return self._run(reqs, audit_run_id, first_done, changed)

    def first_ledgers(
        self,
        reqs: list[LedgerRequest],
        audit_run_id: str,
        finished: Callable[[list[dict[str, Any]]], None],
        changed: Callable[[], bool],
        known: Mapping[int, Sequence[str]] | None = None,
    ) -> list[dict[str, Any]]:
        """A loss's first ledgers (:mod:`jobs.watch.first_ledgers`), in this process while
        the audit ``audit_run_id`` reads: marked first, all in one request (the audit's
        marks leave them out), then repaired ``--ledgers-in-flight`` at a time at
        ``--rate`` (the audit's repair waits for it), the actions recorded and the Pulsar
        topics unloaded as any repair's. ``finished`` gets each ledger's rows as it ends."""
        from jobs.runs.repair_partition import repair_partition

        if not self.leadership.may_proceed():
            return []
        marks = {q.ledger_id: sorted(q.bad_bookies) for q in reqs}
        self.watcher.urm.mark_many(marks, known=known)
        base = repair_config(self.cfg, audit_run_id)
        config = replace(base, ledgers_in_flight=min(len(reqs), base.ledgers_in_flight))
        run_id = new_run_id()
        log.info(
            "watch: repair %s: the loss's first %d ledgers, before audit %s is done",
            run_id, len(reqs), audit_run_id,
        )  # fmt: skip
        out: list[dict[str, Any]] = []

        def proceed() -> bool:
            return self.leadership.may_proceed() and not changed()

        try:
            for actions in repair_partition(
                config, self.watcher.zk, reqs, proceed, finished=finished
            ):
                out.extend(actions)
        finally:
            self._record(out, config, run_id)
        self._unload(out, config, run_id)
        return out

    def verify_marks(
        self, ledger_ids: Iterable[int], changed: Callable[[], bool] | None = None
    ) -> list[dict[str, Any]]:
        """Check each marked ledger no loss explains, as BookKeeper's ReplicationWorker does
        with every mark: one whose bookies are gone is repaired, one that checks healthy has
        its mark cleared, one with a silent bookie keeps it (:class:`~bklib.repair.worker.
        LedgerRepairer`, ``verify_mark``). The marks a bookie that came back left behind, or
        a repair cut off, end here."""
        reqs = mark_requests(ledger_ids, ())
        log.info("watch: %d marked ledgers that no lost bookie explains: checking each", len(reqs))
        return self._run(reqs, None, None, changed)

    def _run(
        self,
        reqs: list[LedgerRequest],
        audit_run_id: str | None,
        first_done: Callable[[], None] | None,
        changed: Callable[[], bool] | None,
    ) -> list[dict[str, Any]]:
        from jobs.runs.repair_partition import repair_partition

        procs = repair_processes(self.cfg.repair_processes, len(reqs))
        if procs > 1 and self.workers_failed:
            procs = 1
        config = repair_config(self.cfg, audit_run_id, procs)
        run_id = new_run_id()
        why = f"audit {audit_run_id}" if audit_run_id else "marks verified"
        where = f", in {procs} processes" if procs > 1 else ""
        log.info("watch: repair %s: %d ledgers (%s%s)", run_id, len(reqs), why, where)
        out: list[dict[str, Any]] = []
        workers: RepairWorkers | None = None
        finished = _FirstCopy(first_done)

        def proceed() -> bool:
            return self.leadership.may_proceed() and not (changed is not None and changed())

        def take(actions: list[dict[str, Any]]) -> None:  # a worker's: timed when it comes
            out.extend(actions)
            finished(actions)

        # The leader's share over its own session and bookie client, at once; the other
        # shares in worker processes (jobs/watch/repair_workers.py), each within its share of
        # the ZooKeeper budget. Leadership is asked before each ledger starts, so a stop or a
        # lost leadership waits only for those in flight.
        try:
            self.leadership.confirm()
            session = self.watcher.zk  # the watch's own: its locks go with its leadership
            shares = split_shares(reqs, procs)
            with shared_budget(procs) as zk_rate:
                if procs > 1:
                    fence = self.leadership.election.fence()
                    assert fence is not None  # confirmed: the member exists
                    workers = RepairWorkers(
                        config, shares[1:], fence, proceed, self.cfg.stop_timeout, zk_rate
                    )
                # The leader's own ledgers are timed in the thread that repaired each.
                for actions in repair_partition(
                    config, session, shares[0], proceed, finished=finished
                ):
                    out.extend(actions)
                    for sent in workers.ready() if workers is not None else ():
                        take(sent)
                for sent in workers.finish() if workers is not None else ():
                    take(sent)
            self.leadership.confirm()  # the ledgers not started were abandoned: say so
        finally:
            if workers is not None:
                for sent in workers.close():  # rows sent before the leader's share failed
                    take(sent)
                if workers.failed:
                    # Each cycle would split the same ledgers the same way: repair them here.
                    self.workers_failed = True
                    log.error("watch: repair worker failed; repairs run in this process only "
                              "until the next take-over")  # fmt: skip
            self._record(out, config, run_id)
        self._unload(out, config, run_id)
        return out

    def _unload(self, rows: list[dict[str, Any]], config: RepairConfig, run_id: str) -> None:
        """After a repair, the Pulsar topics whose ledgers changed: unloaded through the admin
        API (``--pulsar-admin-url``), so brokers drop stale ledger handles, or recorded and
        named for the operator. Never undoes the repair."""
        from bklib.pulsar.unload import operator_command
        from jobs.runs.pulsar_unload import unload_changed_topics

        try:
            done = unload_changed_topics(
                rows,
                run_id=run_id,
                mode=RepairMode.REREPLICATE,
                session=self.watcher.zk,
                ledgers_root=self.cfg.ledgers_root,
                warehouse=self.cfg.warehouse,
                audit_run_id=config.audit_run_id,
                dry_run=False,
                settings=self.cfg.pulsar_admin,
                unload_rate=self.cfg.unload_rate,
            )
        except Exception as exc:  # noqa: BLE001 - logged with the repair's id; the repair stands
            log.error("watch: repair %s: Pulsar topic unloads not done: %s", run_id, one_line(exc))
            return
        if not done.rows:
            return
        self.metrics.count_actions(done.rows)
        self.warehouse.write([(ACTIONS, done.rows)])
        left = []
        for o in done.outcomes:
            if o.status == ActionStatus.DONE:
                log.info("watch: repair %s: unloaded Pulsar topic %s", run_id, o.topic)
            else:
                left.append(o)
        for o in left[:TOPICS_NAMED]:
            log.warning(
                "watch: repair %s: Pulsar topic %s still holds stale ledger handles (%s); run: %s",
                run_id,
                o.topic,
                o.error,
                operator_command(o.topic),
            )
        if len(left) > TOPICS_NAMED:
            # A large repair touches thousands of topics: one line for the rest, not one each
            # (each one's error names its own command).
            rest = Counter(o.status for o in left[TOPICS_NAMED:])
            log.warning(
                "watch: repair %s: %d more Pulsar topics still hold stale ledger handles (%s); "
                "replication_actions has a row for each, and `bkaudit listunderreplicated` "
                "lists the commands that unload them",
                run_id,
                len(left) - TOPICS_NAMED,
                ", ".join(f"{n} {status}" for status, n in sorted(rest.items())),
            )

    def _record(self, rows: list[dict[str, Any]], config: RepairConfig, run_id: str) -> None:
        if not rows:
            return
        stamp(rows, config, run_id, Executor.LOCAL)
        self.metrics.count_actions(rows)
        self.no_replica.extend(r for r in rows if r["status"] == ActionStatus.NO_REPLICA)
        self.warehouse.write([(ACTIONS, rows)])
        done = sum(1 for r in rows if r["status"] == ActionStatus.DONE)
        log.info("watch: repair %s: %d actions, %d done", run_id, len(rows), done)


class _FirstCopy:
    """Calls ``then`` once, at the first ledger with a copy done, from whichever thread
    finished it: the first copy of any process, not the first in a share's order."""

    def __init__(self, then: Callable[[], None] | None) -> None:
        self._then = then
        self._lock = threading.Lock()

    def __call__(self, actions: list[dict[str, Any]]) -> None:
        if self._then is None or not any(a["status"] == ActionStatus.DONE for a in actions):
            return
        with self._lock:
            call, self._then = self._then, None
        if call is not None:
            call()
