"""Where a command runs the engine: ``--executor spark|local|auto``.

``local`` runs :mod:`bklib.audit` and :mod:`bklib.repair` in this process, with no JVM, and
writes the Delta tables through delta-rs. ``spark`` runs the same engine inside Spark tasks.
``auto`` (the default) decides from the size of the work, known before anything is read: the
ledger count from the ledger tree's directory stats (audit, recover) or from the findings to
repair (rereplicate), and the bytes to read or copy from the ledgers' lengths. Below both
thresholds it runs locally; above either, on Spark. The thresholds live in
``conf/bkaudit.yaml`` (``local-max-ledgers``, ``local-max-bytes``).

Without the ``spark`` extra installed, ``auto`` runs locally whatever the size, as long as the
work fits the local memory limit: a slow local run beats an error on a box that never had
Spark. Above the limit it still picks Spark, which then fails with one line naming the extra.

``local`` also has a hard limit: it holds every ledger's metadata in memory, so work whose
estimate exceeds ``local-memory-limit`` (default: half the memory available now) is refused
with one line that suggests ``--executor spark``.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
from dataclasses import dataclass

from bklib.states import Executor
from jobs.options.units import parse_size

__all__ = [
    "BYTES_PER_LEDGER",
    "ExecutorChoice",
    "LocalLimits",
    "LocalTooBigError",
    "add_executor_arguments",
    "choose_executor",
]

log = logging.getLogger(__name__)

BYTES_PER_LEDGER = 3072
"""Memory the local executor needs per ledger (metadata, answers, findings), rounded up: a
lost audit of a million ledgers peaked at 2,513 MB, 2.5 KB a ledger, once its ledgers table
was converted to Arrow in batches (docs/benchmarks.md, "The first million, continued")."""

DEFAULT_LOCAL_MAX_LEDGERS = 1_000_000
"""``auto``'s switch to Spark, for every command: on one 2-core machine the local executor
finished first at every size measured, up to a million ledgers, in under 3 GB: the lost check,
whatif, blastradius and the repair, and since it checks on two processes the sample check too
(1.7 to 6 times faster; docs/executors.md, "Where `auto` switches"). The replicas and deep
checks read through the same checker and processes, and keep the same bound. Above a million
nothing was measured, and the local state keeps growing."""


DEFAULT_LOCAL_MAX_BYTES = 2 * 1024**3


class LocalTooBigError(RuntimeError):
    """``--executor local`` on work above the local executor's memory limit."""


@dataclass(frozen=True)
class LocalLimits:
    """``auto``'s thresholds and ``local``'s hard limit."""

    max_ledgers: int = DEFAULT_LOCAL_MAX_LEDGERS
    max_bytes: int = DEFAULT_LOCAL_MAX_BYTES
    memory_limit: int | None = None
    """Bytes; None is half of the memory available when the command starts."""

    def memory(self) -> int:
        if self.memory_limit is not None:
            return self.memory_limit
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            avail = 8 * 1024**3
        return avail // 2


@dataclass(frozen=True)
class ExecutorChoice:
    """The executor picked, and why (logged, and kept for the tables)."""

    executor: str
    reason: str


def spark_installed() -> bool:
    """True when pyspark can be found (the ``spark`` extra is installed)."""
    try:
        return importlib.util.find_spec("pyspark") is not None
    except ImportError:  # a finder that refuses it: not usable either
        return False


def choose_executor(
    requested: str,
    *,
    ledgers: int,
    work_bytes: int,
    limits: LocalLimits,
    what: str,
    have_spark: bool | None = None,
) -> ExecutorChoice:
    """Pick the executor for ``ledgers`` ledgers and ``work_bytes`` bytes to read or copy.

    ``have_spark`` (default: :func:`spark_installed`) lets ``auto`` fall back to local when
    Spark is not installed. Raises :class:`LocalTooBigError` when ``local`` is requested
    above the memory limit.
    """
    choice = _choose(requested, ledgers=ledgers, work_bytes=work_bytes, limits=limits, what=what)
    if requested != Executor.AUTO or choice.executor != Executor.SPARK:
        return choice
    if have_spark is None:
        have_spark = spark_installed()
    if have_spark or ledgers * BYTES_PER_LEDGER > limits.memory():
        return choice
    return ExecutorChoice(Executor.LOCAL, f"{choice.reason}, but pyspark is not installed")


def _choose(
    requested: str, *, ledgers: int, work_bytes: int, limits: LocalLimits, what: str
) -> ExecutorChoice:
    need = ledgers * BYTES_PER_LEDGER
    if requested == Executor.LOCAL:
        if need > limits.memory():
            raise LocalTooBigError(
                f"{what}: {ledgers} ledgers need about {need / 1e6:.0f} MB, above the local "
                f"executor's limit of {limits.memory() / 1e6:.0f} MB; use --executor spark"
            )
        return ExecutorChoice(Executor.LOCAL, "requested")
    if requested == Executor.SPARK:
        return ExecutorChoice(Executor.SPARK, "requested")
    if ledgers > limits.max_ledgers:
        return ExecutorChoice(
            Executor.SPARK, f"{ledgers} ledgers > local-max-ledgers {limits.max_ledgers}"
        )
    if work_bytes > limits.max_bytes:
        return ExecutorChoice(
            Executor.SPARK, f"{work_bytes} bytes > local-max-bytes {limits.max_bytes}"
        )
    if need > limits.memory():
        return ExecutorChoice(Executor.SPARK, f"{need} bytes of state > local memory limit")
    return ExecutorChoice(
        Executor.LOCAL,
        f"{ledgers} ledgers <= {limits.max_ledgers} and {work_bytes} bytes <= {limits.max_bytes}",
    )


def add_executor_arguments(parser: argparse.ArgumentParser) -> None:
    """``--executor`` and the local limits, for every engine command."""
    parser.add_argument(
        "--executor",
        choices=Executor.ALL,
        default=Executor.AUTO,
        help="where the engine runs: local (in-process, no JVM), spark, or auto (local below "
        "--local-max-ledgers and --local-max-bytes, else spark; default)",
    )
    parser.add_argument(
        "--local-max-ledgers",
        type=int,
        default=None,
        help=f"auto: more ledgers than this run on Spark (default {DEFAULT_LOCAL_MAX_LEDGERS:,})",
    )
    parser.add_argument(
        "--local-max-bytes",
        type=parse_size,
        default=DEFAULT_LOCAL_MAX_BYTES,
        help="auto: more bytes to copy (the repairs) than this run on Spark",
    )
    parser.add_argument(
        "--local-memory-limit",
        type=parse_size,
        default=None,
        help="local: refuse work whose state would exceed this (default: half the free memory)",
    )


def limits_from_args(args: argparse.Namespace) -> LocalLimits:
    """The :class:`LocalLimits` the flags of :func:`add_executor_arguments` describe."""
    given = args.local_max_ledgers
    return LocalLimits(
        max_ledgers=DEFAULT_LOCAL_MAX_LEDGERS if given is None else given,
        max_bytes=args.local_max_bytes,
        memory_limit=args.local_memory_limit,
    )
