"""The watch's repair over more than one process (``--repair-processes``, docs/watch.md).

The repair's bookie client and its per-ledger work are one core's worth in one Python process:
at a million ledgers the watch repaired a lost bookie's 44,410 ledgers at 87% of one core while
the other sat half idle (docs/benchmarks.md). The leader keeps one share of the ledgers and
repairs it in its own process, over its own session, at once (the first copy waits for no
process start); each other share goes to a spawned worker process.

A worker's rules (each one why it is safe to act outside the leader's process):

- one store session of its own (its ephemeral ledger locks are its own, as a ``rereplicate``
  worker's: docs/metadata-stores.md);
- before each ledger, the leader's :class:`~jobs.watch.election.LeaderFence` is checked over
  that session: once the leader's member is gone (its session expired, another instance
  leads), no ledger starts;
- no ledger starts either once the leader says stop (its own check before each ledger said
  no: leadership lost, the lost bookies changed, a signal);
- it dies with the leader (``PR_SET_PDEATHSIG``): a SIGKILLed leader leaves no worker behind,
  and the worker's locks go with its session;
- each ledger's action rows go back to the leader as the ledger finishes; the leader records
  them with its own.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import queue
import signal
import time
from collections.abc import Callable, Iterator
from multiprocessing.context import SpawnProcess
from multiprocessing.synchronize import Event
from typing import Any

from bklib.repair.requests import LedgerRequest
from jobs.runs.repair_run import RepairConfig
from jobs.runtime import interrupts
from jobs.runtime.cores import usable_cores
from jobs.runtime.logs import logging_settings, setup_logging
from jobs.runtime.messages import one_line
from jobs.watch.election import LeaderFence

__all__ = ["MIN_LEDGERS_PER_PROCESS", "RepairWorkers", "repair_processes", "split_shares"]

log = logging.getLogger("jobs.watch")

MIN_LEDGERS_PER_PROCESS = 1000
"""Ledgers a share must have for a worker process to be worth its start (a second or two of
imports and a session): below it, the leader repairs alone."""

POLL_EVERY = 0.5
"""Seconds between the leader's checks while only workers still repair."""

_PR_SET_PDEATHSIG = 1


def repair_processes(wanted: int, ledgers: int) -> int:
    """Processes for a repair of ``ledgers`` ledgers: ``wanted`` (``--repair-processes``), or
    for 0 one per usable core while each share has :data:`MIN_LEDGERS_PER_PROCESS`."""
    if wanted > 0:
        return max(1, min(wanted, ledgers))
    return max(1, min(usable_cores(), ledgers // MIN_LEDGERS_PER_PROCESS))


def split_shares(reqs: list[LedgerRequest], processes: int) -> list[list[LedgerRequest]]:
    """``reqs`` in ``processes`` shares by ledger id (as ``rereplicate``'s local processes and
    Spark split them), each in request order; the first is the leader's."""
    return [[r for r in reqs if r.ledger_id % processes == k] for k in range(processes)]


class RepairWorkers:
    """The worker processes of one repair, and the rows they sent back."""

    def __init__(self, config: RepairConfig, shares: list[list[LedgerRequest]], fence: LeaderFence):
        ctx = multiprocessing.get_context("spawn")
        self.stop: Event = ctx.Event()
        self._out: multiprocessing.Queue[tuple[str, int, Any]] = ctx.Queue()
        self._procs: list[SpawnProcess] = []
        self._running: set[int] = set()
        logs = logging_settings()
        for k, share in enumerate(shares):
            p = ctx.Process(
                target=_work,
                args=(k, config, share, fence, self.stop, self._out, os.getpid(), logs),
                name=f"bkaudit-repair-{k + 1}",
                daemon=True,
            )
            p.start()
            self._procs.append(p)
            self._running.add(k)
        started = zip(self._procs, shares, strict=True)
        log.info("watch: repair worker processes started: %s",
                 ", ".join(f"pid {p.pid} ({len(s)} ledgers)" for p, s in started))  # fmt: skip

    def ready(self) -> Iterator[list[dict[str, Any]]]:
        """The ledgers' rows the workers have sent so far, without waiting."""
        while True:
            try:
                msg = self._out.get_nowait()
            except queue.Empty:
                return
            yield from self._take(msg)

    def finish(
        self, proceed: Callable[[], bool], stop_timeout: float
    ) -> Iterator[list[dict[str, Any]]]:
        """Every row until each worker is done. ``proceed`` is asked every
        :data:`POLL_EVERY` seconds meanwhile; once it says no, the workers start no ledger,
        and those still working after ``stop_timeout`` are killed (their ledgers in flight
        are abandoned: their locks go with their sessions, their marks stay)."""
        deadline: float | None = None
        while self._running:
            if deadline is None and not proceed():
                self.stop.set()
                deadline = time.monotonic() + stop_timeout
            if deadline is not None and time.monotonic() > deadline:
                log.warning("watch: repair workers still busy %.0fs after the stop: killed",
                            stop_timeout)  # fmt: skip
                self.close()
                return
            try:
                msg = self._out.get(timeout=POLL_EVERY)
            except queue.Empty:
                self._reap()
                continue
            yield from self._take(msg)

    def _take(self, msg: tuple[str, int, Any]) -> Iterator[list[dict[str, Any]]]:
        kind, k, body = msg
        if kind == "rows":
            yield body
        elif kind == "error":
            log.error("watch: repair worker %d failed: %s; its ledgers not done stay marked for "
                      "the next cycle", k + 1, body)  # fmt: skip
        elif kind == "done":
            self._running.discard(k)

    def _reap(self) -> None:
        """A worker that died without saying so (killed) is done: its ledgers not reported
        stay marked for the next cycle."""
        for k in list(self._running):
            p = self._procs[k]
            if not p.is_alive():
                log.error("watch: repair worker %d (pid %s) ended with exit code %s; its "
                          "ledgers not done stay marked", k + 1, p.pid, p.exitcode)  # fmt: skip
                self._running.discard(k)

    def close(self) -> None:
        """Stop the workers (at once if any still runs) and wait for them."""
        self.stop.set()
        for p in self._procs:
            p.join(timeout=0.1)
            if p.is_alive():
                p.kill()
            p.join()
        self._running.clear()
        self._out.close()


def _die_with(parent: int) -> None:
    """SIGKILL this process when its parent dies (Linux): a killed leader leaves no worker."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the fence still stops it
        return
    if os.getppid() != parent:  # the parent died before the call took effect
        os._exit(1)


def _work(
    k: int,
    config: RepairConfig,
    share: list[LedgerRequest],
    fence: LeaderFence,
    stop: Event,
    out: multiprocessing.Queue[tuple[str, int, Any]],
    parent: int,
    logs: tuple[str, bool, str],
) -> None:
    """A worker process: its share repaired over a session of its own, each ledger's rows sent
    back as it finishes (see the module docstring for when a ledger does not start)."""
    _die_with(parent)
    interrupts.in_repair_worker()
    level, verbose, fmt = logs
    setup_logging(level, verbose=verbose, fmt=fmt)
    from bklib.meta.stores import open_store
    from jobs.runs.repair_partition import repair_partition

    try:
        with open_store(
            config.zk, auth=config.zk_auth, timeout=config.zk_session_timeout
        ) as session:

            def proceed() -> bool:
                return not stop.is_set() and fence.holds(session)

            for rows in repair_partition(config, session, share, proceed):
                if rows:
                    out.put(("rows", k, rows))
    except Exception as exc:  # noqa: BLE001 - reported to the leader, which logs it
        out.put(("error", k, one_line(exc)))
    finally:
        out.put(("done", k, None))
        out.close()
        out.join_thread()
