"""The one exit-status rule (jobs/runtime/exit_status.py): its ranking, its mapping from a
run's status, every command's help sentence, and no command module returning a bare number."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from bklib.audit.completeness import incomplete_reasons, run_status, shortfall
from bklib.states import CountKey, Reason, RunStatus
from jobs.cli.registry import COMMANDS
from jobs.runtime.exit_status import (
    INCOMPLETE_CAUSES,
    CommandExits,
    ExitStatus,
    for_run_status,
    worst,
)
from tests.cli_helpers import REPO


def test_the_numbers_are_the_documented_ones() -> None:
    assert [int(s) for s in ExitStatus] == [0, 1, 2, 3, 130, 143]


def test_only_a_completed_run_exits_zero() -> None:
    assert for_run_status(RunStatus.COMPLETED) is ExitStatus.OK
    assert for_run_status(RunStatus.COMPLETED, findings=True) is ExitStatus.FINDINGS
    for status in (RunStatus.COMPLETED_WITH_ERRORS, RunStatus.FAILED, "INTERRUPTED"):
        assert for_run_status(status) is ExitStatus.INCOMPLETE
        assert for_run_status(status, findings=True) is ExitStatus.INCOMPLETE


def test_incomplete_outranks_findings_and_ok() -> None:
    assert worst() is ExitStatus.OK
    assert worst(ExitStatus.OK, ExitStatus.FINDINGS) is ExitStatus.FINDINGS
    assert worst(ExitStatus.FINDINGS, ExitStatus.INCOMPLETE) is ExitStatus.INCOMPLETE
    assert worst(ExitStatus.INCOMPLETE, ExitStatus.FINDINGS) is ExitStatus.INCOMPLETE
    assert worst(ExitStatus.INCOMPLETE, ExitStatus.OPERATOR_ERROR) is ExitStatus.OPERATOR_ERROR


@pytest.mark.parametrize(
    ("counts", "missed"),
    [
        ({}, {}),
        ({CountKey.LEDGERS: 10, CountKey.FRAGMENTS: 3}, {}),
        ({CountKey.METADATA_ERRORS: 2}, {"unreadable znodes": 2}),
        (
            {CountKey.reason(Reason.BOOKIE_UNREACHABLE): 44},
            {"fragments on unreachable bookies": 44},
        ),
        ({CountKey.LEDGERS_UNACCOUNTED: 5}, {"ledgers not accounted for": 5}),
    ],
)
def test_a_run_that_missed_anything_is_not_completed(
    counts: dict[str, int], missed: dict[str, int]
) -> None:
    assert shortfall(counts) == missed
    assert run_status(counts) == (
        RunStatus.COMPLETED_WITH_ERRORS if missed else RunStatus.COMPLETED
    )
    words = incomplete_reasons(counts)
    for what, n in missed.items():
        assert f"{n} {what}" in words
    if not missed:
        assert words == "the run failed part-way"


def test_the_help_sentence_says_every_status_the_command_may_exit_with() -> None:
    reads = CommandExits(ok="done", findings="ledgers need another run")
    assert reads.sentence() == (
        "Exit 0 when done, 1 when ledgers need another run, 2 on an operator error, "
        f"3 when the run missed something ({INCOMPLETE_CAUSES})."
    )
    assert ExitStatus.INCOMPLETE in reads.allowed()
    local = CommandExits(ok="written", reads_cluster=False)
    assert local.sentence() == "Exit 0 when written, 2 on an operator error."
    assert ExitStatus.FINDINGS not in local.allowed()
    assert ExitStatus.INCOMPLETE not in local.allowed()


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_command_help_ends_with_its_rule(name: str) -> None:
    cmd = COMMANDS[name]
    assert cmd.description.endswith(cmd.exits.sentence())
    assert "Exit" not in cmd.about, "the exit statuses come from CommandExits only"


# A command's status is one of ExitStatus's names, never a number typed in a module: the
# number and its meaning then cannot drift apart (a `return 1` for an incomplete run was how
# `audit` came to exit 0 on COMPLETED_WITH_ERRORS).
_COMMAND_MODULES = sorted({c.module for c in COMMANDS.values() if c.module.startswith("jobs.")})
_RUN_MODULES = ["jobs.runs.pulsar_check", "jobs.runs.repair_run"]


def _bare_exit_numbers(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    found = []
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        returns = ast.unparse(fn.returns) if fn.returns else ""
        if "int" not in returns and "ExitStatus" not in returns:
            continue
        for node in ast.walk(fn):
            value = node.value if isinstance(node, ast.Return) else None
            if isinstance(value, ast.Tuple) and value.elts:
                value = value.elts[0]
            if isinstance(value, ast.IfExp):
                values: list[ast.expr] = [value.body, value.orelse]
            else:
                values = [value] if value is not None else []
            for v in values:
                if isinstance(v, ast.Constant) and isinstance(v.value, int):
                    found.append(f"{path.name}:{node.lineno} {fn.name} returns {v.value}")
    return found


@pytest.mark.parametrize("module", _COMMAND_MODULES + _RUN_MODULES)
def test_no_command_returns_a_bare_number(module: str) -> None:
    path = REPO / (module.replace(".", "/") + ".py")
    assert _bare_exit_numbers(path) == []


def test_the_bare_number_check_finds_one(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "def run(args) -> int:\n    if args:\n        return 2\n    return 1 if args else 0\n"
    )
    assert len(_bare_exit_numbers(bad)) == 3
