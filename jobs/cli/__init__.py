"""The ``bkaudit`` command line: argument parsing, config files, the demo."""

from jobs.cli.main import build_parser, main, run

__all__ = ["build_parser", "main", "run"]
