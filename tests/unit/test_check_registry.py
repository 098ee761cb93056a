"""The check registry (bklib/audit/checks/registry.py) is the one place a check kind is
declared: a kind registered there, and nothing else, is listed by ``audit --check`` (choices and
help), the Airflow DAG's ``check`` Param, the watch's ``--every``, conf/bkaudit.yaml's comment
and docs/checks.md's table; and the shipped files are exactly the renderings of the real
registry."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import pytest

from bklib.audit import engine
from bklib.audit.checks import (
    CHECKS,
    DEFAULT_CHECK,
    AuditCheck,
    check,
    names,
    register,
    render,
    replication_names,
    unregister,
)
from bklib.audit.checks.bookies import BookieCheck
from bklib.audit.model import LedgerView
from jobs.cli.main import main
from jobs.commands.audit import add_audit_arguments
from jobs.watch.decide import Schedule, parse_every
from tests.cli_helpers import REPO


def _words(text: str) -> str:
    return " ".join(text.split())


def _support() -> ModuleType:
    """airflow_dags/bkaudit_support.py, which the DAG takes its ``check`` Param from."""
    sys.path.insert(0, str(REPO / "airflow_dags"))
    try:
        return importlib.import_module("bkaudit_support")
    finally:
        sys.path.remove(str(REPO / "airflow_dags"))


def _check_action(parser: argparse.ArgumentParser) -> argparse.Action:
    return next(a for a in parser._actions if a.dest == "check")


def _audit_help() -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main(["audit", "--help"])
    return out.getvalue()


class Throwaway(AuditCheck):
    """A check kind that exists only in this test."""

    name = "throwaway"
    summary = "a check registered by tests/unit/test_check_registry.py alone"
    asks = "the throwaway question"
    finds = "throwaway findings"
    misses = "everything else"
    cost = "nothing at all"
    seen: ClassVar[list[int]] = []

    def check_ledgers(
        self, ledgers: Any, lost: frozenset[str], **_: Any
    ) -> Iterator[tuple[LedgerView, list[Any], list[Any]]]:
        for ledger in ledgers:
            self.seen.append(ledger.ledger_id)
            yield ledger, [], []


class ThrowawayOwnTables(Throwaway):
    """Not a replication check: like ``pulsar``, it keeps tables of its own."""

    name = "throwaway-own"
    replication = False


@pytest.fixture
def throwaway() -> Iterator[tuple[AuditCheck, AuditCheck]]:
    kinds = (register(Throwaway()), register(ThrowawayOwnTables()))
    try:
        yield kinds
    finally:
        for kind in kinds:
            unregister(kind.name)


# ---- one registration reaches every listing -----------------------------------------------------


def test_a_registered_check_is_listed_everywhere(
    throwaway: tuple[AuditCheck, AuditCheck],
) -> None:
    kind, own = throwaway
    # audit --check: choices and help
    action = _check_action(add_audit_arguments(argparse.ArgumentParser()))
    assert action.choices is not None
    assert list(action.choices)[-2:] == [kind.name, own.name]
    assert action.help == render.help_text()
    help_words = _words(_audit_help())
    for k in throwaway:
        assert _words(f"{k.name}: {k.summary}") in help_words
    # The DAG's Param: replication checks only
    param = _support().check_param()
    assert kind.name in param["enum"] and own.name not in param["enum"]
    assert f"{kind.name}: {kind.summary}" in param["description"]
    assert own.name not in param["description"]
    # The watch schedules replication checks only
    assert parse_every(f"lost=1h,{kind.name}=2h") == {"lost": 3600.0, kind.name: 7200.0}
    with pytest.raises(ValueError, match=kind.name):
        parse_every(f"{own.name}=1h")
    assert Schedule({kind.name: 1.0, "lost": 1.0}).due(10.0) == ["lost", kind.name]
    # conf/bkaudit.yaml's comment and docs/checks.md's table
    comment = _words(" ".join(line.split("#", 1)[1] for line in render.config_lines()))
    for k in throwaway:
        assert _words(f"{k.name}: {k.summary}") in comment
        row = f"| `{k.name}` | {k.asks} | {k.finds} | {k.misses} | {k.cost} |"
        assert row in render.markdown_table().splitlines()
    # The engine runs the kind itself
    views = [LedgerView(ledger_id=7)]
    assert [v.ledger_id for v, _, _ in engine.check_ledgers(views, frozenset(), kind.name)] == [7]
    assert Throwaway.seen == [7]


def test_registered_kinds_come_last_and_names_are_unique(throwaway: tuple[AuditCheck, ...]) -> None:
    assert names()[-2:] == tuple(k.name for k in throwaway)
    with pytest.raises(ValueError, match="already registered"):
        register(Throwaway())


# ---- the real registry -------------------------------------------------------------------------


def test_names_are_the_stored_values() -> None:
    # audit_runs.check holds these strings: a kind may never rename its check.
    assert names() == ("lost", "sample", "replicas", "deep", "pulsar")
    assert replication_names() == ("lost", "sample", "replicas", "deep")
    assert DEFAULT_CHECK == "replicas"
    for name, kind in CHECKS.items():
        assert kind.name == name and check(name) is kind
    with pytest.raises(ValueError, match="lost, sample, replicas, deep, pulsar"):
        check("nope")


def test_the_kinds_say_what_the_string_branches_said() -> None:
    """What engine.py, checker.py and the executors used to decide from the string."""
    reading = {n for n, k in CHECKS.items() if k.reads_entries}
    assert reading == {"sample", "replicas", "deep"}
    assert {n for n, k in CHECKS.items() if k.learns_capabilities} == {"replicas", "deep"}
    assert {n for n, k in CHECKS.items() if k.ask_list} == {"replicas"}
    bookie = {n: k for n, k in CHECKS.items() if isinstance(k, BookieCheck)}
    assert set(bookie) == reading
    assert {n for n, k in bookie.items() if k.samples} == {"sample"}
    assert {n for n, k in bookie.items() if k.verifies_digests} == {"sample", "deep"}
    assert engine.learns_capabilities("deep") and not engine.learns_capabilities("sample")


def test_checks_that_read_need_a_client_and_pulsar_checks_no_ledger() -> None:
    views = [LedgerView(ledger_id=1)]
    with pytest.raises(ValueError, match="needs a bookie client"):
        list(engine.check_ledgers(views, frozenset(), "replicas"))
    with pytest.raises(ValueError, match="pulsar"):
        list(engine.check_ledgers(views, frozenset(), "pulsar"))
    with pytest.raises(ValueError, match="unknown check"):
        list(engine.check_ledgers(views, frozenset(), "nope"))


def test_cli_check_flag_is_the_registry() -> None:
    action = _check_action(add_audit_arguments(argparse.ArgumentParser()))
    assert tuple(action.choices or ()) == names()
    assert action.default == DEFAULT_CHECK
    assert action.help == render.help_text()
    assert _words(render.help_text()) in _words(_audit_help())


def test_dag_check_param_is_the_registry() -> None:
    assert _support().check_param() == {
        "default": DEFAULT_CHECK,
        "enum": list(replication_names()),
        "description": render.dag_description(),
    }


def _config_check_lines(path: Path) -> list[str]:
    """The ``check:`` key of conf/bkaudit.yaml's ``audit`` section and its comment lines."""
    lines = path.read_text().splitlines()
    start = lines.index("audit:") + 1
    first = next(i for i in range(start, len(lines)) if lines[i].startswith("  check:"))
    pad = " " * render.CONFIG_COMMENT_COLUMN + "#"
    end = first + 1
    while end < len(lines) and lines[end].startswith(pad):
        end += 1
    return lines[first:end]


def test_shipped_config_comment_is_the_rendering() -> None:
    expected = render.config_lines()
    assert _config_check_lines(REPO / "conf" / "bkaudit.yaml") == expected, (
        "conf/bkaudit.yaml's check: key must read:\n" + "\n".join(expected)
    )


def _doc_table(path: Path) -> str:
    text = path.read_text()
    start = text.index("| check | asks the bookies |")
    return text[start : text.index("\n\n", start) + 1]


def test_docs_table_is_the_rendering() -> None:
    expected = render.markdown_table()
    assert _doc_table(REPO / "docs" / "checks.md") == expected, (
        "docs/checks.md's table must read:\n" + expected
    )


def test_the_registry_needs_only_the_standard_library() -> None:
    """The Airflow worker imports it (through airflow_dags/bkaudit_support.py) without
    bkaudit's dependencies."""
    code = (
        "import sys; import bklib.audit.checks, bklib.audit.checks.render; "
        "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    ).stdout.split()
    foreign = {m for m in out if m not in sys.stdlib_module_names and not m.startswith("_")}
    assert foreign <= {"bklib"}, foreign
