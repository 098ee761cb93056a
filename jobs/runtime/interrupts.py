"""SIGINT and SIGTERM: one road for every ``bkaudit`` command (docs/exit-status.md).

A signal is an answer, not a crash: the command stops, records what it did (an audit's run as
:attr:`~bklib.states.RunStatus.INTERRUPTED`, a repair's finished ledgers' actions), prints one
line on stderr and exits 128 + the signal (130 for SIGINT, 143 for SIGTERM:
:class:`~jobs.runtime.exit_status.ExitStatus`). :func:`install` sets the handler once, for
every command (:func:`jobs.cli.main.run`); it also makes ``bkaudit`` PID 1 material, since the
kernel drops a signal that PID 1 has no handler for.

Two ways to stop, chosen by what the main thread is doing when the signal comes:

- at once (the default): the handler raises :class:`Interrupted` in the main thread. Reading
  (a scan, a check, a probe) can stop anywhere: ``finally`` blocks close sessions and helper
  processes, and the run's recorder turns the exception into an INTERRUPTED row. It is a
  :class:`BaseException`, as :class:`KeyboardInterrupt` is, so ``except Exception`` blocks that
  record a failure do not take it for one.
- draining (:func:`draining`, the repairs and the watch): the handler only sets the flag, so
  no ledger starts after it (:func:`stop_requested`); the ledgers in flight finish, their rows
  are written, and the caller raises at its next :func:`checkpoint`. Past the scope's
  ``stop_timeout`` the process leaves at once (:func:`exit_now`): locks are ephemeral and go
  with the session.

A second signal leaves at once too, as many CLIs do: still one line, still 128 + the first
signal. Either way no child is left behind: multiprocessing children are terminated and the
callbacks given to :func:`at_exit_now` (a sandbox's ZooKeeper and bookies) run first.

Worker processes (a repair's, the audit's helper) ignore SIGINT (:func:`in_child`): a Ctrl-C
reaches the whole process group, and the parent decides how its children stop.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType

from jobs.runtime.exit_status import ExitStatus

__all__ = [
    "DEFAULT_STOP_TIMEOUT",
    "Drain",
    "Interrupted",
    "answered",
    "at_exit_now",
    "at_once",
    "checkpoint",
    "draining",
    "exit_line",
    "exit_now",
    "in_child",
    "in_repair_worker",
    "install",
    "name_command",
    "note",
    "print_exit_line",
    "received",
    "signal_of",
    "stop_requested",
    "take_back",
]

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM)

DEFAULT_STOP_TIMEOUT = 10.0
"""How long work in flight may finish after a signal (the repairs' ``--stop-timeout``)."""


class Interrupted(BaseException):
    """The command was stopped by ``signum`` (raised in the main thread)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"interrupted ({signal.Signals(signum).name})")

    @property
    def exit_status(self) -> ExitStatus:
        """130 for SIGINT, 143 for SIGTERM."""
        return ExitStatus(128 + self.signum)


class _State:
    """The process's one record of the signal it received and what the command recorded."""

    def __init__(self) -> None:
        self.command = "bkaudit"
        self.signum: int | None = None
        self.drains: list[Drain | None] = []
        """The scopes in force, innermost last; None is :func:`at_once`'s."""
        self.notes: list[str] = []
        self.printed = False
        self.exit_now_callbacks: list[Callable[[], object]] = []
        self.on_first: list[Callable[[], object]] = []
        """Run on a first signal that stops at once (Spark's ``cancelAllJobs``)."""
        self.installed = False
        self.lock = threading.RLock()


_state = _State()


def install(command: str = "bkaudit") -> None:
    """Handle SIGINT and SIGTERM in this process as this module says (main thread only)."""
    _state.command = command
    _state.installed = True
    for sig in SIGNALS:
        signal.signal(sig, _on_signal)


def take_back(on_signal: Callable[[], object]) -> None:
    """Where :func:`install` ran, handle SIGINT here again after a library took it (PySpark's
    SparkContext sets a handler of its own), and run ``on_signal`` (its ``cancelAllJobs``) on
    a first signal that stops at once: one road still, and a second Ctrl-C still leaves at
    once."""
    if not _state.installed or threading.current_thread() is not threading.main_thread():
        return
    _state.on_first.append(on_signal)
    signal.signal(signal.SIGINT, _on_signal)


def name_command(command: str) -> None:
    """The name the one line starts with (``audit: interrupted (SIGINT); ...``)."""
    _state.command = command


def received() -> int | None:
    """The first signal this process received, or None."""
    return _state.signum


def stop_requested() -> bool:
    """Whether a signal asked this process to stop: start no new work."""
    return _state.signum is not None


def checkpoint() -> None:
    """Raise :class:`Interrupted` if a signal asked to stop (a point where stopping is safe)."""
    if _state.signum is not None:
        raise Interrupted(_state.signum)


def signal_of(exc: BaseException) -> int | None:
    """The signal ``exc`` stands for: :class:`Interrupted`'s, SIGINT for a
    :class:`KeyboardInterrupt` (PySpark's own SIGINT handler raises one), else None."""
    if isinstance(exc, Interrupted):
        return exc.signum
    if isinstance(exc, KeyboardInterrupt):
        return signal.SIGINT
    return None


def note(text: str) -> None:
    """What the interrupted command recorded, for its line (``run R recorded as
    INTERRUPTED``)."""
    with _state.lock:
        _state.notes.append(text)


def exit_line(signum: int, extra: str | None = None) -> str:
    """The one line an interrupted command prints."""
    parts = [f"{_state.command}: interrupted ({signal.Signals(signum).name})", *_state.notes]
    if extra:
        parts.append(extra)
    return "; ".join(parts)


def print_exit_line(signum: int, extra: str | None = None) -> None:
    """Print :func:`exit_line` on stderr, once per process."""
    with _state.lock:
        if _state.printed:
            return
        _state.printed = True
        print(exit_line(signum, extra), file=sys.stderr, flush=True)


def at_exit_now(callback: Callable[[], object]) -> Callable[[], None]:
    """Run ``callback`` before :func:`exit_now` leaves (stop processes this one started that
    are not multiprocessing children); returns a function that unregisters it."""
    with _state.lock:
        _state.exit_now_callbacks.append(callback)

    def remove() -> None:
        with _state.lock, contextlib.suppress(ValueError):
            _state.exit_now_callbacks.remove(callback)

    return remove


def exit_now(extra: str) -> None:
    """Leave at once with 128 + the first signal: run the :func:`at_exit_now` callbacks,
    terminate multiprocessing children, print the one line. ``finally`` blocks do not run."""
    signum = _state.signum or signal.SIGINT
    with _state.lock:
        callbacks = list(reversed(_state.exit_now_callbacks))
    for cb in callbacks:
        try:
            cb()
        except Exception as exc:  # noqa: BLE001 - leaving anyway; the others still run
            log.warning("while exiting at once: %s: %s", type(exc).__name__, exc)
    for child in multiprocessing.active_children():
        child.kill()
    print_exit_line(signum, extra)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    os._exit(128 + signum)


def answered(body: Callable[[], int], *, sigterm_is_clean: bool = False) -> int:
    """Run a command's ``body`` and return its exit status; a signal that stopped it (an
    :class:`Interrupted`, or PySpark's :class:`KeyboardInterrupt`) is one line and 128 + the
    signal. Fail closed: a command that was signalled never exits as if it had finished,
    unless SIGTERM is its clean stop (``sigterm_is_clean``: the watch's 0)."""
    try:
        status = body()
    except (Interrupted, KeyboardInterrupt) as exc:
        signum = signal_of(exc) or signal.SIGINT
        print_exit_line(signum)
        return ExitStatus(128 + signum)
    got = _state.signum
    if got is not None and not (sigterm_is_clean and got == signal.SIGTERM):
        print_exit_line(got)
        return ExitStatus(128 + got)
    return status


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    name = signal.Signals(signum).name
    if _state.signum is not None:
        exit_now(f"stopped at once by a second {name}")
    _state.signum = signum
    drain = _state.drains[-1] if _state.drains else None
    if drain is None:
        for cb in _state.on_first:  # stopping at once: Spark's jobs too (draining lets them end)
            try:
                cb()
            except Exception as exc:  # noqa: BLE001 - the signal still takes effect
                log.warning("on %s: %s: %s", name, type(exc).__name__, exc)
        raise Interrupted(signum)
    log.info("%s received: no new work starts; the work in flight may finish", name)
    drain.begin(signum)


class Drain:
    """A :func:`draining` scope: what a signal does while it is active."""

    def __init__(
        self,
        stop_timeout: float,
        on_stop: Callable[[], object] | None,
        on_deadline: Callable[[], object] | None,
    ) -> None:
        self.stop_timeout = stop_timeout
        self.on_stop = on_stop
        self.on_deadline = on_deadline
        self.stopping = threading.Event()
        self._timer: threading.Timer | None = None

    def proceed(self) -> bool:
        """Whether new work may start (no signal yet)."""
        return not stop_requested()

    def begin(self, signum: int) -> None:
        """The signal came: stop starting work, and give the work in flight its time."""
        self.stopping.set()
        if self.on_stop is not None:
            self.on_stop()
        self._timer = threading.Timer(self.stop_timeout, self._deadline)
        self._timer.daemon = True
        self._timer.start()

    def _deadline(self) -> None:
        if self.on_deadline is not None:
            try:
                self.on_deadline()
            except Exception as exc:  # noqa: BLE001 - leaving anyway
                log.warning("while abandoning the work in flight: %s: %s", type(exc).__name__, exc)
        exit_now(
            f"the work in flight was abandoned after --stop-timeout {self.stop_timeout:g}s "
            "(its locks go with the session)"
        )

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


@contextlib.contextmanager
def draining(
    stop_timeout: float,
    *,
    on_stop: Callable[[], object] | None = None,
    on_deadline: Callable[[], object] | None = None,
) -> Iterator[Drain]:
    """Within this scope a signal does not raise: it sets the flag (:func:`stop_requested`),
    calls ``on_stop`` (in the main thread, from the handler: keep it short), and gives the work
    in flight ``stop_timeout`` seconds; then ``on_deadline`` runs (from a timer thread: record
    what is finished) and the process leaves at once. A signal that came before the scope
    raised already; the caller :func:`checkpoint` s once its rows are written."""
    drain = Drain(stop_timeout, on_stop, on_deadline)
    if _state.signum is not None:  # received before, by a handler that did not raise
        drain.stopping.set()
    _state.drains.append(drain)
    try:
        yield drain
    finally:
        _state.drains.remove(drain)
        drain.close()


@contextlib.contextmanager
def at_once() -> Iterator[None]:
    """Within this scope a signal raises :class:`Interrupted` at once, even inside a
    :func:`draining` one: for read-only work (the watch's audits) that may stop anywhere."""
    _state.drains.append(None)
    try:
        checkpoint()  # a signal that came before did not raise: it does now
        yield
    finally:
        _state.drains.pop()


def in_child() -> None:
    """In a worker process: ignore SIGINT (the parent decides how its children stop)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _worker_stop(signum: int, _frame: FrameType | None) -> None:
    _state.signum = signum


def in_repair_worker() -> None:
    """In a repair's worker process: ignore SIGINT, and take SIGTERM (from the parent) as
    "start no new ledger": those in flight finish and their rows go back to the parent."""
    in_child()
    signal.signal(signal.SIGTERM, _worker_stop)


def _reset_for_tests() -> None:
    """Forget the signal and notes (unit tests run commands in one process)."""
    global _state
    _state = _State()
