"""The one exit-status rule of every ``bkaudit`` command (docs/exit-status.md).

- 0: the command did what it meant to, and read everything it meant to read;
- 1: findings, only for commands that say so (``listunderreplicated``, ``rereplicate``, ...);
- 2: an operator error (a flag, a URI, an unreachable store at start, a warehouse refused),
  said in one line before any work;
- 3: an incomplete run: it started but missed something (an unreadable znode, a bookie a check
  needed and could not reach, ledgers not accounted for, an expired session). Never 0, and
  its ``audit_runs`` row is never COMPLETED;
- 130 / 143: interrupted by SIGINT / SIGTERM, as a shell reports a signal.

A run that missed something outranks findings: a listing over an incomplete audit exits 3
even when it lists ledgers, since the ones it could not see may be worse.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from enum import IntEnum

from bklib.states import RunStatus

__all__ = [
    "INCOMPLETE_CAUSES",
    "CommandExits",
    "ExitStatus",
    "for_error",
    "for_run_status",
    "worst",
]


class ExitStatus(IntEnum):
    """A ``bkaudit`` command's exit status."""

    OK = 0
    FINDINGS = 1
    OPERATOR_ERROR = 2
    INCOMPLETE = 3
    INTERRUPTED = 128 + signal.SIGINT
    TERMINATED = 128 + signal.SIGTERM


INCOMPLETE_CAUSES = (
    "an unreadable znode, a bookie a check needed and could not reach, ledgers not accounted "
    "for, or an expired session"
)
"""What makes a run incomplete, as the help texts say it."""

# Which of two statuses a command reports when both apply: an operator error stops before
# work, so it never meets another; an incomplete run outranks its findings.
_RANK = {
    ExitStatus.OK: 0,
    ExitStatus.FINDINGS: 1,
    ExitStatus.INCOMPLETE: 2,
    ExitStatus.OPERATOR_ERROR: 3,
    ExitStatus.INTERRUPTED: 4,
    ExitStatus.TERMINATED: 4,
}


def worst(*statuses: ExitStatus) -> ExitStatus:
    """The status a command exits with when several apply (incomplete outranks findings)."""
    return max(statuses, key=lambda s: _RANK[s], default=ExitStatus.OK)


def for_run_status(status: str, *, findings: bool = False) -> ExitStatus:
    """The exit status of a command whose work is one recorded run of ``status``
    (:class:`bklib.states.RunStatus`): COMPLETED is 0 (1 with ``findings``, for a command that
    reports them by status), anything else (COMPLETED_WITH_ERRORS, FAILED, INTERRUPTED) read
    less than it should have, and is :attr:`ExitStatus.INCOMPLETE`."""
    if status != RunStatus.COMPLETED:
        return ExitStatus.INCOMPLETE
    return ExitStatus.FINDINGS if findings else ExitStatus.OK


def for_error(exc: BaseException) -> ExitStatus:
    """The exit status of a command stopped by ``exc`` after its store session was open: the
    store failing under it (an expired session,
    :class:`~bklib.meta.stores.session_guard.SessionLost`, a connection lost for good, a
    directory it may not list) stopped a run that had started, which is incomplete; any other
    error (a flag, a rack document, a table) is the operator's to fix. A store that cannot be
    reached at all is an operator error before this is asked. A read that missed part of the
    cluster (:class:`~bklib.errors.IncompleteReadError`) is incomplete too."""
    from bklib.errors import IncompleteReadError, ZKError

    missed = isinstance(exc, (ZKError, IncompleteReadError))
    return ExitStatus.INCOMPLETE if missed else ExitStatus.OPERATOR_ERROR


@dataclass(frozen=True)
class CommandExits:
    """What a command's exit statuses mean, from which its help sentence is made."""

    ok: str
    """When it exits 0, e.g. ``"the run completed"``."""
    findings: str | None = None
    """When it exits 1; None for a command that never does."""
    reads_cluster: bool = True
    """Whether it reads the cluster, so that a run of it can be incomplete (exit 3)."""

    def sentence(self) -> str:
        """The help text's last sentence, e.g. ``Exit 0 when done, 1 when ..., 2 on an
        operator error, 3 when the run missed something (...).``"""
        parts = [f"Exit {ExitStatus.OK:d} when {self.ok}"]
        if self.findings is not None:
            parts.append(f"{ExitStatus.FINDINGS:d} when {self.findings}")
        parts.append(f"{ExitStatus.OPERATOR_ERROR:d} on an operator error")
        if self.reads_cluster:
            parts.append(
                f"{ExitStatus.INCOMPLETE:d} when the run missed something ({INCOMPLETE_CAUSES})"
            )
        return ", ".join(parts) + "."

    def allowed(self) -> frozenset[ExitStatus]:
        """Every status this command may exit with."""
        allowed = {
            ExitStatus.OK,
            ExitStatus.OPERATOR_ERROR,
            ExitStatus.INTERRUPTED,
            ExitStatus.TERMINATED,
        }
        if self.findings is not None:
            allowed.add(ExitStatus.FINDINGS)
        if self.reads_cluster:
            allowed.add(ExitStatus.INCOMPLETE)
        return frozenset(allowed)
