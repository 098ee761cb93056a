"""``--executor auto``: which work runs where, and the local executor's hard limit."""

from __future__ import annotations

import argparse

import pytest

from bklib.states import Executor
from jobs.options.units import parse_size
from jobs.runs.executor import (
    BYTES_PER_LEDGER,
    LocalLimits,
    LocalTooBigError,
    add_executor_arguments,
    choose_executor,
    limits_from_args,
)

LIMITS = LocalLimits(max_ledgers=1000, max_bytes=10_000_000, memory_limit=100 * BYTES_PER_LEDGER)


@pytest.mark.parametrize(
    ("ledgers", "work_bytes", "want"),
    [
        (0, 0, Executor.LOCAL),
        (99, 10_000_000, Executor.LOCAL),
        (101, 0, Executor.SPARK),  # state above the memory limit
        (50, 10_000_001, Executor.SPARK),  # more bytes than local-max-bytes
    ],
)
def test_auto_picks_local_below_every_limit(ledgers: int, work_bytes: int, want: str) -> None:
    got = choose_executor(
        Executor.AUTO,
        ledgers=ledgers,
        work_bytes=work_bytes,
        limits=LIMITS,
        what="audit",
        have_spark=True,
    )
    assert got.executor == want and got.reason


def test_auto_without_spark_runs_locally_while_the_work_fits_in_memory() -> None:
    def pick(ledgers: int, work_bytes: int, have_spark: bool) -> str:
        return choose_executor(
            Executor.AUTO,
            ledgers=ledgers,
            work_bytes=work_bytes,
            limits=LIMITS,
            what="audit",
            have_spark=have_spark,
        ).executor

    # Above local-max-bytes: Spark when it is there, local when it is not.
    assert pick(50, 10_000_001, True) == Executor.SPARK
    got = choose_executor(
        Executor.AUTO, ledgers=50, work_bytes=10_000_001, limits=LIMITS, what="x", have_spark=False
    )
    assert got.executor == Executor.LOCAL and "pyspark is not installed" in got.reason
    # Above the memory limit local cannot hold the state: Spark, which then names the extra.
    assert pick(101, 0, False) == Executor.SPARK
    # A requested executor is never second-guessed.
    spark = choose_executor(
        Executor.SPARK, ledgers=1, work_bytes=0, limits=LIMITS, what="x", have_spark=False
    )
    assert spark.executor == Executor.SPARK


def test_auto_above_max_ledgers_is_spark() -> None:
    limits = LocalLimits(max_ledgers=10, max_bytes=10**12, memory_limit=10**12)
    got = choose_executor(
        Executor.AUTO, ledgers=11, work_bytes=0, limits=limits, what="audit", have_spark=True
    )
    assert got.executor == Executor.SPARK and "local-max-ledgers" in got.reason


def test_requested_executor_wins_but_local_has_a_hard_limit() -> None:
    spark = choose_executor(Executor.SPARK, ledgers=1, work_bytes=0, limits=LIMITS, what="x")
    assert spark.executor == Executor.SPARK
    local = choose_executor(Executor.LOCAL, ledgers=100, work_bytes=10**15, limits=LIMITS, what="x")
    assert local.executor == Executor.LOCAL
    with pytest.raises(LocalTooBigError, match=r"101 ledgers.*use --executor spark"):
        choose_executor(Executor.LOCAL, ledgers=101, work_bytes=0, limits=LIMITS, what="audit")


def test_parse_size() -> None:
    assert parse_size("2GiB") == 2 * 1024**3
    assert parse_size("500MB") == 500_000_000
    assert parse_size("100KB") == 100_000
    assert parse_size("1000") == 1000
    for bad in ("lots", "-1MB", "1XB"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_size(bad)


@pytest.mark.parametrize(
    ("argv", "want"),
    [
        ([], 1_000_000),  # local finished first up to a million, for every check and repair
        (["--local-max-ledgers", "7"], 7),  # the flag wins
    ],
)
def test_local_max_ledgers_is_a_million_unless_the_flag_says(argv: list[str], want: int) -> None:
    parser = argparse.ArgumentParser()
    add_executor_arguments(parser)
    limits = limits_from_args(parser.parse_args(argv))
    assert limits.max_ledgers == want
    memory = LocalLimits(want, limits.max_bytes, memory_limit=2 * want * BYTES_PER_LEDGER)
    assert (
        choose_executor(
            Executor.AUTO, ledgers=want, work_bytes=0, limits=memory, what="audit", have_spark=True
        ).executor
        == Executor.LOCAL
    )
    assert (
        choose_executor(
            Executor.AUTO,
            ledgers=want + 1,
            work_bytes=0,
            limits=memory,
            what="audit",
            have_spark=True,
        ).executor
        == Executor.SPARK
    )
