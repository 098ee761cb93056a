"""The kinds of audit check, one class each (:mod:`bklib.audit.checks.base`), and their
registry (:mod:`bklib.audit.checks.registry`), from which every list of checks is derived
(:mod:`bklib.audit.checks.render`). Adding a check is one module and one line in the registry
(docs/checks.md, "Adding a check")."""

from __future__ import annotations

from bklib.audit.checks.base import AuditCheck
from bklib.audit.checks.registry import (
    CHECKS,
    DEFAULT_CHECK,
    check,
    names,
    register,
    replication_names,
    unregister,
)

__all__ = [
    "CHECKS",
    "DEFAULT_CHECK",
    "AuditCheck",
    "check",
    "names",
    "register",
    "replication_names",
    "unregister",
]
