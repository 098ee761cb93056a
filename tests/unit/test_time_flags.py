"""Every time flag of every command takes a duration (``5s``, ``500ms``, ``2m``): one parser,
jobs/options/units.py's, so ``audit --read-timeout 5s`` works as ``rereplicate``'s does."""

from __future__ import annotations

import re

import pytest

from jobs.cli.main import command_parser
from jobs.cli.registry import COMMANDS
from jobs.options.units import parse_duration

_TIME_WORDS = re.compile(r"timeout|delay|interval|period|older_than|grace|every|_age\b|^age|wait")
_NOT_TIME = {"every"}  # watch's --every is check=duration pairs, parsed by its own rule


def _time_flags() -> list[tuple[str, str]]:
    flags = []
    for cmd in COMMANDS.values():
        if cmd.own_parser:
            continue
        for action in command_parser(cmd)._actions:
            timed = action.option_strings and _TIME_WORDS.search(action.dest)
            if timed and action.dest not in _NOT_TIME and action.nargs != 0:
                flags.append((cmd.name, action.option_strings[-1]))
    return flags


def test_the_search_finds_the_known_ones() -> None:
    found = set(_time_flags())
    assert ("audit", "--read-timeout") in found
    assert ("rereplicate", "--grace-period") in found


@pytest.mark.parametrize(("command", "flag"), _time_flags())
def test_every_time_flag_takes_a_duration(command: str, flag: str) -> None:
    parser = command_parser(COMMANDS[command])
    action = next(a for a in parser._actions if flag in a.option_strings)
    assert action.type is parse_duration, f"bkaudit {command} {flag}: type {action.type}"
