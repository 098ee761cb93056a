"""How the watch splits a repair over processes (jobs/watch/repair_workers.py) and the count
flag that sets it (``--repair-processes``)."""

from __future__ import annotations

import argparse

import pytest

from bklib.repair.requests import LedgerRequest
from jobs.options.units import parse_count
from jobs.watch import repair_workers
from jobs.watch.config import WatchConfig, repair_config
from jobs.watch.repair_workers import MIN_LEDGERS_PER_PROCESS, repair_processes, split_shares


def test_auto_gives_a_process_per_core_only_to_a_repair_large_enough(monkeypatch) -> None:
    monkeypatch.setattr(repair_workers, "usable_cores", lambda: 2)
    assert repair_processes(0, 10) == 1
    assert repair_processes(0, 2 * MIN_LEDGERS_PER_PROCESS - 1) == 1
    assert repair_processes(0, 2 * MIN_LEDGERS_PER_PROCESS) == 2
    assert repair_processes(0, 100 * MIN_LEDGERS_PER_PROCESS) == 2  # never above the cores
    assert repair_processes(3, 100) == 3  # asked for: given, however small the repair
    assert repair_processes(4, 2) == 2  # but never a process without a ledger
    assert repair_processes(1, 10**6) == 1


def test_shares_are_by_ledger_id_in_request_order_and_cover_every_request() -> None:
    reqs = [LedgerRequest(lid, verify_mark=True) for lid in (9, 2, 7, 4, 3, 10, 5)]
    shares = split_shares(reqs, 3)
    assert [[r.ledger_id for r in s] for s in shares] == [[9, 3], [7, 4, 10], [2, 5]]
    assert sorted(r.ledger_id for s in shares for r in s) == sorted(r.ledger_id for r in reqs)
    assert split_shares(reqs, 1) == [reqs]


def test_the_rate_bounds_the_whole_repair_whatever_the_processes() -> None:
    cfg = WatchConfig(zk="z:2181", warehouse="/wh", rate=60e6)
    assert repair_config(cfg, None).settings.rate == 60e6
    assert repair_config(cfg, None, 3).settings.rate == 20e6
    unlimited = WatchConfig(zk="z:2181", warehouse="/wh", rate=None)
    assert repair_config(unlimited, None, 2).settings.rate is None


def test_a_count_is_a_whole_number_from_zero() -> None:
    assert parse_count("0") == 0 and parse_count(" 4 ") == 4
    for bad in ("-1", "two", "1.5", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="bad count"):
            parse_count(bad)
