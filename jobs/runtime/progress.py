"""Progress of the long steps (the metadata scan, the bookie probes, the copy): a tqdm bar with
an ETA when stderr is a terminal, plain periodic log lines otherwise (cron, Airflow, a pipe),
so a scheduler's log shows how far a run got without a line per ledger.

``BKAUDIT_PROGRESS=bar|lines|off`` overrides the choice. JSON logs (``--log-format json``)
always get lines: a bar's carriage returns would corrupt one-object-per-line output.

The Spark executor's tasks report through :class:`SparkProgress`, which polls the driver's
status tracker instead of Spark's own console progress bar (hidden unless ``--verbose``).
Nothing here imports Spark.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from jobs.runtime.logs import bar_closed, bar_opened, bars_active, log_format

__all__ = ["EVERY", "HEARTBEAT", "Progress", "SparkProgress", "bars_active", "mode", "track"]

EVERY = 5.0
"""Seconds between two plain progress lines, when the count moved."""

HEARTBEAT = 60.0
"""Seconds after which a line comes even when the count has not moved (a stuck step shows)."""

MODE_ENV = "BKAUDIT_PROGRESS"

T = TypeVar("T")


def mode() -> str:
    """``bar``, ``lines`` or ``off``: the environment's choice, else a bar on a terminal."""
    wanted = os.environ.get(MODE_ENV, "").strip().lower()
    if wanted in ("bar", "lines", "off"):
        return "lines" if wanted == "bar" and log_format() == "json" else wanted
    if log_format() == "json":
        return "lines"
    isatty = getattr(sys.stderr, "isatty", None)
    return "bar" if isatty is not None and isatty() else "lines"


def _eta(done: int, total: int | None, elapsed: float) -> str:
    if not total or done <= 0 or done >= total:
        return "unknown" if done <= 0 else "0s"
    return f"{elapsed / done * (total - done):.0f}s"


class Progress:
    """Counts work done against a total (None when unknown); a context manager.

    On a terminal it draws a tqdm bar on stderr that disappears when the step ends (the step's
    own summary line says how it went); otherwise it logs ``what: done/total unit, rate,
    elapsed, ETA`` to ``logger`` at most every ``every`` seconds while the count moves, every
    :data:`HEARTBEAT` seconds while it does not, and none for a step that ends sooner. One
    thread updates it.
    """

    def __init__(
        self,
        what: str,
        total: int | None,
        *,
        unit: str = "ledgers",
        logger: logging.Logger | None = None,
        every: float = EVERY,
    ) -> None:
        self.what, self.total, self.unit = what, total, unit
        self.log = logger or logging.getLogger("jobs.runtime.progress")
        self.every = every
        self.done = self._last_done = 0
        self.t0 = self._last = time.monotonic()
        self.mode = mode()
        self._bar: Any = None
        if self.mode == "bar":
            from tqdm import tqdm

            bar_opened()
            self._bar = tqdm(
                total=total,
                desc=what,
                unit=f" {unit}",
                file=sys.stderr,
                leave=False,
                dynamic_ncols=True,
                mininterval=0.5,
                smoothing=0.1,
            )

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def advance(self, n: int = 1) -> None:
        """``n`` more units done."""
        self.update_to(self.done + n)

    def update_to(self, done: int, total: int | None = None) -> None:
        """Set the count (and the total, when it grew: a Spark job's stages appear as it runs)."""
        if total is not None and total != self.total:
            self.total = total
            if self._bar is not None:
                self._bar.total = total
                self._bar.refresh()
        step, self.done = done - self.done, done
        if self._bar is not None:
            if step:
                self._bar.update(step)
            return
        if self.mode != "lines":
            return
        now = time.monotonic()
        since = now - self._last
        moved = done != self._last_done
        if (self.total is None or done < self.total) and (
            (moved and since >= self.every) or since >= max(self.every, HEARTBEAT)
        ):
            self._last, self._last_done = now, done
            self._line(now - self.t0)

    def _line(self, elapsed: float) -> None:
        of = f"/{self.total}" if self.total is not None else ""
        if self.done <= 0:  # no rate, no ETA yet: say how long it has been waiting
            self.log.info("%s: 0%s %s, %.0fs elapsed", self.what, of, self.unit, elapsed)
            return
        self.log.info(
            "%s: %d%s %s, %.1f/s, %.0fs elapsed, ETA %s",
            self.what,
            self.done,
            of,
            self.unit,
            self.done / elapsed,
            elapsed,
            _eta(self.done, self.total, elapsed),
        )

    def close(self) -> None:
        """Remove the bar (idempotent)."""
        if self._bar is None:
            return
        bar, self._bar = self._bar, None
        bar.close()
        bar_closed()


def track(
    items: Iterable[T],
    total: int | None,
    what: str,
    *,
    unit: str = "ledgers",
    logger: logging.Logger | None = None,
    every: float = EVERY,
) -> Iterator[T]:
    """Pass ``items`` through, counting one unit per item (see :class:`Progress`)."""
    with Progress(what, total, unit=unit, logger=logger, every=every) as p:
        for item in items:
            yield item
            p.advance(1)


class SparkProgress:
    """Progress of Spark tasks, from the driver's status tracker: a bar on a terminal,
    periodic lines otherwise. A context manager around the action(s) it watches.

    With ``group`` it counts every task of that job group's jobs (one repair: one job, so the
    ETA holds). Without, it follows the active stages, starting afresh when they change (an
    audit is a chain of short jobs; a total over all of them is not known in advance).
    ``ledgers``, when given, is named next to ``what``.
    """

    def __init__(
        self,
        spark: Any,
        what: str,
        *,
        group: str | None = None,
        ledgers: int | None = None,
        logger: logging.Logger | None = None,
        every: float = EVERY,
    ) -> None:
        self.tracker = spark.sparkContext.statusTracker()
        self.group = group
        self.what = what if ledgers is None else f"{what} ({ledgers} ledgers)"
        self.log, self.every = logger, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bkaudit-progress", daemon=True)
        self._progress: Progress | None = None
        self._key: object = None
        self._seen: dict[int, tuple[int, int]] = {}

    def __enter__(self) -> SparkProgress:
        if mode() != "off":
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        if self._progress is not None:
            self._progress.close()

    def poll(self) -> tuple[object, str, int, int]:
        """(what is being counted, its label, tasks completed, tasks known)."""
        if self.group is not None:
            for job in self.tracker.getJobIdsForGroup(self.group):
                info = self.tracker.getJobInfo(job)
                for sid in info.stageIds if info else ():
                    st = self.tracker.getStageInfo(sid)
                    if st is not None:
                        self._seen[sid] = (st.numCompletedTasks, st.numTasks)
            done = sum(d for d, _ in self._seen.values())
            return self.group, self.what, done, sum(t for _, t in self._seen.values())
        stages = tuple(sorted(self.tracker.getActiveStageIds()))
        infos = [st for st in map(self.tracker.getStageInfo, stages) if st is not None]
        label = f"{self.what}, Spark stage {', '.join(map(str, stages))}"
        done = sum(st.numCompletedTasks for st in infos)
        return stages, label, done, sum(st.numTasks for st in infos)

    def _loop(self) -> None:
        # A bar redraws often; plain lines come at Progress's own pace.
        interval = 0.5 if mode() == "bar" else min(1.0, self.every)
        while not self._stop.wait(interval):
            try:
                key, label, done, total = self.poll()
            except Exception:  # noqa: BLE001 - advisory only; the job's own errors surface elsewhere
                continue
            if not total:
                continue
            if key != self._key or self._progress is None:
                if self._progress is not None:
                    self._progress.close()
                self._key = key
                self._progress = Progress(
                    label, total, unit="tasks", logger=self.log, every=self.every
                )
            self._progress.update_to(done, total)
