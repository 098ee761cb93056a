"""Why a warehouse cannot take a run: the errors of :mod:`jobs.tables.warehouse_probe` and
:mod:`jobs.tables.s3_probe`, each one line naming the warehouse."""

from __future__ import annotations

__all__ = ["WarehouseUnreachable", "WarehouseUnusable"]


class WarehouseUnusable(RuntimeError):
    """The warehouse cannot take a run (one line naming it and why)."""


class WarehouseUnreachable(WarehouseUnusable):
    """The warehouse's store did not answer (refused, unresolvable, timed out): an outage,
    which the watch rides out by spooling, not a configuration to fix."""
