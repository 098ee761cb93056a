"""Can the warehouse take a run? Asked before a command reads the cluster, answered in one line.

Without it a warehouse that is a file, a read-only directory or an object store without
credentials failed only when the run was written, after the whole scan (and a read-only one
with delta-rs's runtime panicking on its way out). :func:`probe_warehouse` checks:

- a directory (a path or ``file://``): that neither it nor a parent is a file, and that a file
  can be created in it (or in its nearest existing parent, where the run will create it);
- S3 (``s3://``, ``s3a://``): that the bucket exists and the AWS chain's credentials may
  list it, write a key under the prefix and delete it, and that the store honours a
  conditional create (``If-None-Match: *`` refused on an existing key): every writer's commit
  relies on it, and a store that ignores it could let two writers overwrite each other's
  commits (docs/tables.md, "Object storage");
- another object store (``gs://``, ``abfss://``, ...): that delta-rs can list it, with the
  credentials and endpoint of the process's environment, retried twice at most (delta-rs's
  default is ten retries over three minutes).

Nothing here reads a table; :func:`jobs.tables.delta.check_writable` runs this, then checks
each existing table's protocol. docs/operations.md, "Wrong addresses".
"""

from __future__ import annotations

import os
import tempfile
import threading

from jobs.tables.error_text import delta_rs_cause
from jobs.tables.object_store import is_s3
from jobs.tables.warehouse_errors import WarehouseUnreachable, WarehouseUnusable

__all__ = ["WarehouseUnreachable", "WarehouseUnusable", "probe_warehouse"]

PROBE_STORAGE_OPTIONS = {"max_retries": "2", "retry_timeout": "10s"}
"""object_store's retry limits for the probe's one listing."""

_probed: set[str] = set()
_probed_lock = threading.Lock()


def probe_warehouse(warehouse: str) -> None:
    """Raise :class:`WarehouseUnusable` when ``warehouse`` cannot be written (a directory)
    or reached (an object store); once per process for a warehouse that passed."""
    with _probed_lock:
        if warehouse in _probed:
            return
    if "://" not in warehouse or warehouse.startswith("file://"):
        _probe_directory(warehouse)
    elif is_s3(warehouse):
        from jobs.tables.s3_probe import probe_s3

        probe_s3(warehouse)
    else:
        _probe_object_store(warehouse)
    with _probed_lock:
        _probed.add(warehouse)


def _probe_directory(warehouse: str) -> None:
    path = os.path.abspath(warehouse.removeprefix("file://"))
    existing = path
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        what = "is a file" if existing == path else f"is under {existing}, a file"
        raise WarehouseUnusable(f"warehouse {path} {what}, not a directory")
    try:
        fd, probe = tempfile.mkstemp(prefix=".bkaudit-probe-", dir=existing)
    except OSError as exc:
        where = "" if existing == path else f" (its parent {existing} cannot take it)"
        raise WarehouseUnusable(
            f"warehouse {path} is not writable{where}: {exc.strerror or exc}"
        ) from None
    os.close(fd)
    os.unlink(probe)


def _probe_object_store(warehouse: str) -> None:
    from deltalake import DeltaTable

    try:
        DeltaTable.is_deltatable(warehouse, storage_options=dict(PROBE_STORAGE_OPTIONS))
    except Exception as exc:  # noqa: BLE001 - delta-rs raises OSError, DeltaError, ...
        raise WarehouseUnusable(
            f"warehouse {warehouse} cannot be reached: {delta_rs_cause(exc)}"
        ) from None
