"""The record of one audit run (a row of ``audit_runs``), written by either executor."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from bklib.states import Executor, RunStatus

__all__ = ["RunRecord", "new_run_id"]


def new_run_id(started: datetime | None = None) -> str:
    """A run id that sorts by time: ``20261123T101500Z-1a2b3c4d``."""
    started = started or datetime.now(timezone.utc)
    return f"{started:%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:8]}"


@dataclass
class RunRecord:
    """One row of ``audit_runs``. ``audit_runs`` gets it last, once every other row of the run
    is committed, so a row that is there describes a finished run."""

    run_id: str
    started_at: datetime
    zk: str
    check: str
    status: str = RunStatus.FAILED
    finished_at: datetime | None = None
    counts: dict[str, int] = field(default_factory=dict)
    error: str | None = None
    executor: str = Executor.SPARK

    def as_row(self) -> dict[str, Any]:
        row = dict(self.__dict__)
        row["counts"] = {k: int(v) for k, v in self.counts.items()}
        return row
