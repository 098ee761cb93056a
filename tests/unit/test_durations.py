"""One duration parser for every flag: milliseconds to weeks, in the repair, watch, Pulsar
and maintain commands alike."""

from __future__ import annotations

import argparse

import pytest

from jobs.commands.maintain import add_maintain_arguments
from jobs.commands.repair import add_repair_arguments
from jobs.options.units import parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("500ms", 0.5), ("30", 30), ("30s", 30), ("5m", 300), ("2h", 7200), ("1d", 86400),
     ("2w", 1_209_600), ("1.5D", 129_600)],
)  # fmt: skip
def test_units(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5y", "1 day", "-1s", "d"])
def test_bad_durations_say_how(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="bad duration"):
        parse_duration(text)


def test_grace_period_and_keep_take_days() -> None:
    repair = add_repair_arguments(argparse.ArgumentParser())
    args = repair.parse_args(["--zk", "h:1", "--warehouse", "w", "--grace-period", "1d"])
    assert args.grace_period == 86400
    keep = add_maintain_arguments(argparse.ArgumentParser())
    assert keep.parse_args(["--warehouse", "w", "--keep", "36h"]).keep == 129_600
    assert keep.parse_args(["--warehouse", "w"]).keep == 30 * 86400
