"""The watch hands its flags to the audits and repairs it runs."""

from __future__ import annotations

import argparse

import pytest

from jobs.commands.watch import add_watch_arguments, watch_config
from jobs.watch.config import audit_config, repair_config

REQUIRED = ["--zk", "127.0.0.1:2181", "--warehouse", "/tmp/wh"]


def parse(*extra: str) -> argparse.Namespace:
    return add_watch_arguments(argparse.ArgumentParser()).parse_args([*REQUIRED, *extra])


def test_bookie_protocol_defaults_to_v2_for_audits_and_repairs() -> None:
    cfg = watch_config(parse(), None)
    assert cfg.bookie_protocol == "v2"
    assert audit_config(cfg, "sample").fetch.bookie_protocol == "v2"
    assert repair_config(cfg, "run-1").settings.bookie_protocol == "v2"


def test_bookie_protocol_v3_reaches_the_audits_and_the_repairs() -> None:
    cfg = watch_config(parse("--bookie-protocol", "v3", "--ledgers-in-flight", "4"), None)
    audit = audit_config(cfg, "sample")
    assert audit.check == "sample"
    assert audit.fetch.bookie_protocol == "v3"
    repair = repair_config(cfg, "run-1")
    assert repair.audit_run_id == "run-1"
    assert repair.settings.bookie_protocol == "v3"
    assert repair.local_processes == 1
    assert repair.ledgers_in_flight == 4
    assert repair.settings.marked_before  # the watch marks first: no create tried per ledger


def test_an_unknown_protocol_is_an_operator_error() -> None:
    with pytest.raises(SystemExit) as exc:
        parse("--bookie-protocol", "v4")
    assert exc.value.code == 2
