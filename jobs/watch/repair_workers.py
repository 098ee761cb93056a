"""The watch's repair over more than one process (``--repair-processes``, docs/watch.md).

The repair's bookie client and its per-ledger work are one core's worth in one Python process:
at a million ledgers the watch repaired a lost bookie's 44,410 ledgers at 87% of one core while
the other sat half idle (docs/benchmarks.md). The leader keeps one share of the ledgers and
repairs it in its own process, over its own session, at once (its first copy waits for no
process start); each other share goes to a spawned worker process.

A worker's rules (each one why it is safe to act outside the leader's process):

- one store session of its own (its ephemeral ledger locks are its own, as a ``rereplicate``
  worker's: docs/metadata-stores.md), within its share of the ZooKeeper request budget;
- before each ledger, the leader's :class:`~jobs.watch.election.LeaderFence` is checked over
  that session: once the leader's member is gone (its session expired, another instance
  leads), or cannot be read, no ledger starts;
- a supervising thread in the leader asks the leader's own check (leadership, the lost
  bookies unchanged, no signal) every :data:`POLL_EVERY` seconds, and once it says no, tells
  each worker to stop over its pipe: no ledger starts there either, those in flight finish
  (a SIGTERM to the worker, as systemd sends the whole group, does the same:
  :func:`~jobs.runtime.interrupts.in_repair_worker`);
- it dies with the leader (``PR_SET_PDEATHSIG``): a SIGKILLed leader leaves no worker behind,
  and the worker's locks go with its session;
- each ledger's action rows go back to the leader over a pipe of the worker's own as the
  ledger finishes; the leader records them with its own. A worker that dies mid-message is
  an end of file on that pipe, never a hang.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection, wait
from multiprocessing.context import SpawnProcess
from typing import Any

from bklib.meta.stores import StoreUnavailable
from bklib.meta.stores.zookeeper.budget import set_request_rate
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
"""Seconds between the supervising thread's checks of the leader's right to go on."""

_PR_SET_PDEATHSIG = 1
_STOP = "stop"

Rows = list[dict[str, Any]]


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


class _Worker:
    """One worker process, its end of the pipe, and its share until it is sent."""

    def __init__(self, number: int, proc: SpawnProcess, conn: Connection, share: list[Any]):
        self.number = number
        self.proc = proc
        self.conn = conn
        self.share: list[LedgerRequest] | None = share
        self.open = True
        self.sending = threading.Lock()
        """Held to send: the share (the supervising thread) before any stop (either thread)."""


class RepairWorkers:
    """The worker processes of one repair, supervised by a thread of the leader's.

    ``proceed`` is the leader's own check (asked from the supervising thread, as it is from
    the repair's threads); ``stop_timeout``: how long workers told to stop may take before
    they are killed (their ledgers in flight abandoned: locks go with their sessions, marks
    stay)."""

    def __init__(
        self,
        config: RepairConfig,
        shares: list[list[LedgerRequest]],
        fence: LeaderFence,
        proceed: Callable[[], bool],
        stop_timeout: float,
        zk_rate: float | None = None,
    ) -> None:
        self.proceed = proceed
        self.stop_timeout = stop_timeout
        self.failed: list[str] = []
        """Why a worker failed or died, one line each (its ledgers not done stay marked)."""
        self._rows: queue.Queue[Rows] = queue.Queue()
        self._workers: list[_Worker] = []
        self._stopped_at: float | None = None
        ctx = multiprocessing.get_context("spawn")
        args = (config, fence, os.getpid(), logging_settings(), zk_rate)
        try:
            for k, share in enumerate(shares, start=1):
                if not share:
                    continue
                mine, theirs = ctx.Pipe()
                proc = ctx.Process(target=_work, args=(k, theirs, *args),
                                   name=f"bkaudit-repair-{k}", daemon=True)  # fmt: skip
                proc.start()
                theirs.close()  # the worker's end is the worker's: its death is our EOF
                self._workers.append(_Worker(k, proc, mine, share))
        except BaseException:
            self._kill()
            raise
        log.info("watch: repair worker processes started: %s",
                 ", ".join(f"pid {w.proc.pid} ({len(w.share or ())} ledgers)"
                           for w in self._workers))  # fmt: skip
        self._thread = threading.Thread(target=self._supervise, name="repair-workers", daemon=True)
        self._thread.start()

    # ---- the leader's thread -------------------------------------------------------------------

    def ready(self) -> Iterator[Rows]:
        """The ledgers' rows the workers have sent so far, without waiting."""
        while True:
            try:
                yield self._rows.get_nowait()
            except queue.Empty:
                return

    def finish(self) -> Iterator[Rows]:
        """Every row until each worker is done (or was killed past the stop timeout)."""
        while self._thread.is_alive():
            with contextlib.suppress(queue.Empty):
                yield self._rows.get(timeout=POLL_EVERY)
        yield from self.ready()

    def close(self) -> Iterator[Rows]:
        """Stop the workers (those still busy after the stop timeout are killed) and return
        the rows they sent meanwhile: the leader records them even when its own share
        failed."""
        self.stop()
        yield from self.finish()

    def stop(self) -> None:
        """Tell every worker to start no ledger (those in flight finish)."""
        if self._stopped_at is None:
            self._stopped_at = time.monotonic()
        for w in self._workers:
            with w.sending, contextlib.suppress(OSError):
                if w.open and w.share is None:  # one not given its share yet gets none
                    w.conn.send(_STOP)

    # ---- the supervising thread ----------------------------------------------------------------

    def _supervise(self) -> None:
        try:
            if not self._may_go_on():
                self.stop()
            for w in self._workers:
                self._send_share(w)
            while any(w.open for w in self._workers):
                if self._stopped_at is None and not self._may_go_on():
                    self.stop()
                stopped = self._stopped_at
                if stopped is not None and time.monotonic() > stopped + self.stop_timeout:
                    log.warning("watch: repair workers still busy %.0fs after the stop: killed",
                                self.stop_timeout)  # fmt: skip
                    self._kill()
                for conn in wait([w.conn for w in self._workers if w.open], POLL_EVERY):
                    assert isinstance(conn, Connection)
                    self._receive(next(w for w in self._workers if w.conn is conn))
        except Exception as exc:  # noqa: BLE001 - the workers go; the leader records what came
            # Counted as a failure: the ledgers not reported stay marked, and the term's
            # later repairs run in the leader's process.
            self.failed.append(f"the repair workers' supervisor failed: {one_line(exc)}")
            log.error("watch: %s; killing the workers", self.failed[-1])
            self._kill()
        finally:
            for w in self._workers:
                w.proc.join(timeout=5)
                w.conn.close()

    def _may_go_on(self) -> bool:
        try:
            return self.proceed() and not interrupts.stop_requested()
        except Exception as exc:  # noqa: BLE001 - unknown: stop (fails closed)
            log.warning("watch: repair: cannot tell whether to go on (%s): stopping the workers",
                        one_line(exc))  # fmt: skip
            return False

    def _send_share(self, w: _Worker) -> None:
        """Hand the worker its share (after its start, so a large share does not hold up the
        leader's own ledgers while the worker's interpreter starts); none once told to stop."""
        with w.sending:
            try:
                w.conn.send(w.share if self._stopped_at is None else [])
            except OSError as exc:
                self._ended(w, f"died before taking its share ({one_line(exc)})")
            w.share = None

    def _receive(self, w: _Worker) -> None:
        try:
            kind, body = w.conn.recv()
        except (EOFError, OSError):
            w.proc.join(timeout=5)
            if w.open:
                self._ended(w, f"ended with exit code {w.proc.exitcode} before saying it was done")
            return
        if kind == "rows":
            self._rows.put(body)
        elif kind == "error":
            self._ended(w, f"failed: {body}")
        elif kind == "done":
            w.open = False

    def _ended(self, w: _Worker, why: str) -> None:
        w.open = False
        line = f"repair worker {w.number} (pid {w.proc.pid}) {why}"
        self.failed.append(line)
        log.error("watch: %s; its ledgers not done stay marked", line)

    def _kill(self) -> None:
        for w in self._workers:
            if w.proc.is_alive():
                w.proc.kill()
            w.proc.join(timeout=5)
            w.open = False


def _die_with(parent: int) -> None:
    """SIGKILL this process when its parent dies (Linux): a killed leader leaves no worker."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
            log.warning("repair worker: no death signal (errno %d): only the leader's fence "
                        "stops it", ctypes.get_errno())  # fmt: skip
    except (OSError, AttributeError):  # not Linux: the fence still stops it
        return
    if os.getppid() != parent:  # the parent died before the call took effect
        os._exit(1)


def _listen(conn: Connection, told: threading.Event) -> None:
    """The worker's ear: the leader's stop, or its end of the pipe closing (it died)."""
    try:
        while conn.recv() != _STOP:
            pass
    except (EOFError, OSError):
        pass
    told.set()


def _work(
    k: int,
    conn: Connection,
    config: RepairConfig,
    fence: LeaderFence,
    parent: int,
    logs: tuple[str, bool, str],
    zk_rate: float | None,
) -> None:
    """A worker process: its share repaired over a session of its own, each ledger's rows sent
    back as it finishes (see the module docstring for when a ledger does not start)."""
    _die_with(parent)
    interrupts.in_repair_worker()
    level, verbose, fmt = logs
    setup_logging(level, verbose=verbose, fmt=fmt)
    set_request_rate(zk_rate)
    from bklib.meta.stores import open_store
    from jobs.runs.repair_partition import repair_partition

    try:
        share: list[LedgerRequest] = conn.recv()
        told = threading.Event()
        threading.Thread(target=_listen, args=(conn, told), name="stop", daemon=True).start()
        with open_store(
            config.zk, auth=config.zk_auth, timeout=config.zk_session_timeout
        ) as session:

            def proceed() -> bool:
                if told.is_set():
                    return False
                try:
                    return fence.holds(session)
                except StoreUnavailable:  # unknown leadership: no ledger starts
                    return False

            for rows in repair_partition(config, session, share, proceed):
                if rows:
                    conn.send(("rows", rows))
        conn.send(("done", None))
    except Exception as exc:  # noqa: BLE001 - reported to the leader, which logs it
        with contextlib.suppress(OSError):
            conn.send(("error", one_line(exc)))
    finally:
        conn.close()
