"""One worker's share of a repair run: a store session, a bookie client over it and a
:class:`~bklib.repair.worker.LedgerRepairer` over a list of ledgers, a few at a time.

Written once for every executor: a Spark task runs it over its partition, the local executor
runs it in this process or in several spawned processes. Nothing here imports Spark.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from bklib.repair.requests import LedgerRequest
from jobs.runtime import interrupts

if TYPE_CHECKING:
    from bklib.meta.stores import MetadataStore
    from jobs.runs.repair_run import RepairConfig

__all__ = ["repair_partition", "repair_partition_rows", "worker_partition"]


def repair_partition(
    config: RepairConfig,
    session: MetadataStore,
    requests: Iterable[LedgerRequest],
    proceed: Callable[[], bool] | None = None,
    finished: Callable[[list[dict[str, Any]]], None] | None = None,
) -> Iterator[list[dict[str, Any]]]:
    """Repair ``requests`` over the process's store ``session`` with
    ``config.ledgers_in_flight`` ledgers at a time; yields each ledger's action rows as it
    finishes, in request order. The bookie client resolves addresses over the same session.

    ``proceed``, if given, is asked before each ledger starts, as is whether a signal asked
    the process to stop (:mod:`jobs.runtime.interrupts`): once either says no, the ledgers
    not yet started yield no rows (those in flight finish). A ledger starts as soon as any
    other finishes, so one slow ledger (an open one being fenced) holds up no batch.
    ``finished`` is called with each ledger's rows from the thread that repaired it, as
    soon as it is done (in the order they finish)."""
    from bklib.client.operations import run_client_config
    from bklib.client.pool import SyncBookieClient
    from bklib.meta.racks import RackDocument, load_racks_file, read_racks, read_racks_strict
    from bklib.meta.store import LedgerStore
    from bklib.repair.worker import LedgerRepairer

    reqs = list(requests)
    if not reqs:
        return
    with SyncBookieClient(
        session,
        ledgers_root=config.ledgers_root,
        config=run_client_config(read_timeout=config.read_timeout, tls=config.tls),
    ) as client:
        # --fix-placement reads racks strictly (a broken document is an error naming it);
        # other repairs only prefer racks, so a broken document leaves them rack-unaware.
        document: RackDocument | None = None
        if config.racks_file:
            document = load_racks_file(config.racks_file)
        elif config.fix_placement:
            document = read_racks_strict(session, config.racks_znode)
        repairer = LedgerRepairer(
            LedgerStore(session, config.ledgers_root),
            client,
            config.settings,
            racks=dict(document.racks) if document else read_racks(session, config.racks_znode),
            rack_document=document,
        )
        with concurrent.futures.ThreadPoolExecutor(
            max(1, config.ledgers_in_flight), thread_name_prefix="repair"
        ) as pool:

            def one(req: LedgerRequest) -> list[dict[str, Any]]:
                # After SIGINT or SIGTERM no ledger starts; those in flight finish.
                if interrupts.stop_requested() or (proceed is not None and not proceed()):
                    return []
                rows = [a.as_row() for a in repairer.repair(req)]
                if finished is not None:
                    finished(rows)
                return rows

            try:
                yield from pool.map(one, reqs)
            finally:
                repairer.finish()


def worker_partition(
    config: RepairConfig, requests: Iterable[LedgerRequest], stop_path: str | None = None
) -> Iterator[list[dict[str, Any]]]:
    """:func:`repair_partition` in a worker of its own (a spawned process, a Spark task): the
    worker opens its one store session here. Its ephemeral locks must be its own, so a worker
    never shares its parent's session. With ``stop_path`` (a Spark task, whose driver a signal
    cannot reach it through), no ledger starts once the driver wrote its stop marker there
    (:mod:`jobs.runs.stop_marker`)."""
    from bklib.meta.stores import open_store
    from jobs.runs.stop_marker import stopped_by

    reqs = list(requests)
    if not reqs:
        return
    with open_store(config.zk, auth=config.zk_auth, timeout=config.zk_session_timeout) as session:
        proceed = None if stop_path is None else (lambda: not stopped_by(session, stop_path))
        yield from repair_partition(config, session, reqs, proceed)


def repair_partition_rows(
    config: RepairConfig, requests: list[LedgerRequest]
) -> list[dict[str, Any]]:
    """:func:`worker_partition` flattened: what a spawned worker process returns."""
    return [row for rows in worker_partition(config, requests) for row in rows]
