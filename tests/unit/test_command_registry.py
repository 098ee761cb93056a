"""The command registry (jobs/cli/registry.py) is the one place a command is declared:
``bkaudit --help``, every ``bkaudit COMMAND --help``, the README's command table and the
executor flags agree with it."""

from __future__ import annotations

import contextlib
import io
import re

import pytest

from jobs.cli.main import command_parser, main
from jobs.cli.registry import COMMANDS
from tests.cli_helpers import REPO


def _words(text: str) -> str:
    return " ".join(text.split())


def _help(*argv: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exc:
        main([*argv, "--help"])
    assert exc.value.code == 0
    return out.getvalue()


def test_top_level_help_lists_exactly_the_registered_commands() -> None:
    text = _help()
    listed = re.findall(r"^    (\S+)", text.split("positional arguments:")[1], re.M)
    assert listed == list(COMMANDS)
    words = _words(text)
    for cmd in COMMANDS.values():
        assert _words(f"{cmd.name} {cmd.summary}") in words, cmd.name
        assert cmd.examples[0] in text  # the epilog shows each command's first example


@pytest.mark.parametrize("name", [n for n, c in COMMANDS.items() if not c.own_parser])
def test_command_help_is_the_registry_entry(name: str) -> None:
    cmd = COMMANDS[name]
    text = _help(name)
    assert text.startswith(f"usage: bkaudit {name} ")
    assert _words(cmd.description) in _words(text)
    for example in cmd.examples:
        assert f"\n  {example}\n" in text, example
    assert "--config PATH" in text


def test_bookie_help_is_the_bookie_parser() -> None:
    assert "usage: python -m bklib.bookie" in _help("bookie")


def test_every_description_ends_with_its_exit_statuses() -> None:
    for cmd in COMMANDS.values():
        if not cmd.own_parser:
            assert re.search(r"[Ee]xit 0", cmd.description), cmd.name


@pytest.mark.parametrize("name", [n for n, c in COMMANDS.items() if not c.own_parser])
def test_spark_flag_matches_the_executor_flag(name: str) -> None:
    cmd = COMMANDS[name]
    flags = {a.dest for a in command_parser(cmd)._actions}
    # demo runs its audit on the default executor: it may start Spark without the flag.
    assert cmd.spark == ("executor" in flags or name == "demo"), name


def test_readme_command_table_names_every_command_and_no_other() -> None:
    readme = (REPO / "README.md").read_text()
    table = readme.split("## Commands", 1)[1].split("\n\n", 2)[1]
    named = set(re.findall(r"^\| `bkaudit ([a-z]+)", table, re.M))
    assert named == set(COMMANDS)
