"""The registry of check kinds: the one place a check is declared.

``audit --check``'s choices and help, the watch's ``--every``, the Airflow DAG's ``check``
Param, conf/bkaudit.yaml's ``check:`` comment and docs/checks.md's table all come from
:data:`CHECKS` (through :mod:`bklib.audit.checks.render`), in its order.
"""

from __future__ import annotations

from bklib.audit.checks.base import AuditCheck
from bklib.audit.checks.deep import DeepCheck
from bklib.audit.checks.lost import LostCheck
from bklib.audit.checks.pulsar import PulsarCrossCheck
from bklib.audit.checks.replicas import ReplicasCheck
from bklib.audit.checks.sample import SampleCheck
from bklib.states import Check

__all__ = [
    "CHECKS",
    "DEFAULT_CHECK",
    "check",
    "names",
    "register",
    "replication_names",
    "unregister",
]

CHECKS: dict[str, AuditCheck] = {}
"""Every check kind by name, cheapest first (the order every listing shows)."""

DEFAULT_CHECK = Check.REPLICAS
"""What ``audit --check`` runs unless told (the DAG's default too)."""


def register(kind: AuditCheck) -> AuditCheck:
    """Add ``kind`` to the registry (after the others); its name must be new."""
    if kind.name in CHECKS:
        raise ValueError(f"check {kind.name!r} is already registered")
    CHECKS[kind.name] = kind
    return kind


def unregister(name: str) -> None:
    """Remove the check ``name`` (a test's throwaway kind)."""
    del CHECKS[name]


def check(name: str) -> AuditCheck:
    """The check kind called ``name``; ValueError naming the known ones otherwise."""
    try:
        return CHECKS[name]
    except KeyError:
        raise ValueError(f"unknown check {name!r}; use one of {', '.join(CHECKS)}") from None


def names() -> tuple[str, ...]:
    """Every check's name: what ``audit --check`` takes."""
    return tuple(CHECKS)


def replication_names() -> tuple[str, ...]:
    """The checks of BookKeeper's replication, written to ``audit_runs``: what the watch
    schedules and the DAG runs."""
    return tuple(n for n, k in CHECKS.items() if k.replication)


for _kind in (LostCheck(), SampleCheck(), ReplicasCheck(), DeepCheck(), PulsarCrossCheck()):
    register(_kind)
