"""Every list of checks, rendered from the registry: ``audit --check``'s help, the Airflow
DAG's ``check`` Param, conf/bkaudit.yaml's ``check:`` comment and docs/checks.md's table.
Tests hold the shipped files to these renderings (tests/unit/test_check_registry.py)."""

from __future__ import annotations

import textwrap
from collections.abc import Iterable

from bklib.audit.checks.base import AuditCheck
from bklib.audit.checks.registry import CHECKS, DEFAULT_CHECK

__all__ = [
    "CONFIG_COMMENT_COLUMN",
    "CONFIG_WIDTH",
    "config_lines",
    "dag_description",
    "help_text",
    "markdown_table",
    "summary_text",
]

CONFIG_COMMENT_COLUMN = 24
"""Where conf/bkaudit.yaml's comments start."""
CONFIG_WIDTH = 100
"""The longest line the rendering writes into conf/bkaudit.yaml."""


def summary_text(kinds: Iterable[AuditCheck], default: str | None = None) -> str:
    """``name: summary; name: summary`` for ``kinds``, the ``default`` one marked."""
    return "; ".join(
        f"{k.name}: {k.summary}{' (default)' if k.name == default else ''}" for k in kinds
    )


def help_text() -> str:
    """``audit --check``'s help: every check."""
    return summary_text(CHECKS.values(), DEFAULT_CHECK)


def dag_description() -> str:
    """The DAG's ``check`` Param: the replication checks (its audit and repair use
    ``audit_runs``)."""
    return summary_text(k for k in CHECKS.values() if k.replication)


def config_lines(value: str = DEFAULT_CHECK) -> list[str]:
    """The ``check:`` key of conf/bkaudit.yaml's ``audit`` section, with its comment listing
    every check, wrapped at :data:`CONFIG_WIDTH`."""
    head = f"  check: {value}".ljust(CONFIG_COMMENT_COLUMN)
    text = summary_text(CHECKS.values())
    wrapped = textwrap.wrap(text, CONFIG_WIDTH - CONFIG_COMMENT_COLUMN - 2, break_on_hyphens=False)
    pad = " " * CONFIG_COMMENT_COLUMN
    return [f"{head if i == 0 else pad}# {line}" for i, line in enumerate(wrapped)]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_table() -> str:
    """docs/checks.md's table: what each check asks the bookies, finds, misses and costs."""
    rows = [
        "| check | asks the bookies | finds | misses | cost |",
        "|---|---|---|---|---|",
    ]
    for k in CHECKS.values():
        cells = (f"`{k.name}`", k.asks, k.finds, k.misses, k.cost)
        rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(rows) + "\n"
