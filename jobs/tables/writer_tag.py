"""Which bkaudit command made a commit, in the commit itself.

Several writers commit to the same tables (the watch, the audits, ``rereplicate``,
``maintain``); each delta-rs commit carries ``bkaudit.command`` in its ``commitInfo``, so a
table's history (``DESCRIBE HISTORY``, ``DeltaTable.history()``) says who wrote what when two
of them raced (docs/tables.md, "Object storage").
"""

from __future__ import annotations

__all__ = ["COMMAND_KEY", "commit_metadata", "name_writer"]

COMMAND_KEY = "bkaudit.command"
"""The commitInfo key naming the command."""

_command = "bkaudit"


def name_writer(command: str) -> None:
    """Name this process's commits after ``command`` (``bkaudit audit`` names ``audit``)."""
    global _command
    _command = command


def commit_metadata() -> dict[str, str]:
    """The custom commit metadata of this process's commits."""
    return {COMMAND_KEY: _command}
