"""The ``bkaudit`` command line: the top-level parser and dispatch. Commands are declared in
:mod:`jobs.cli.registry`; each parses its own flags (with config-file and environment
defaults) and imports only what it needs, so the bookie, the sandbox and the metadata tools
run without Spark."""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Sequence

from jobs.cli.registry import COMMANDS, Command
from jobs.runtime import interrupts

__all__ = ["build_parser", "command_main", "command_parser", "main", "run", "run_command"]


def top_level_epilog() -> str:
    """``bkaudit --help``'s examples: the first of each command's."""
    return "examples:\n" + "".join(f"  {c.examples[0]}\n" for c in COMMANDS.values())


class _PrintVersion(argparse.Action):
    """``--version``: one line, ``bkaudit X.Y.Z`` (:mod:`bklib.version`), then exit 0. The
    package metadata is read only when asked, not on every command's start."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        from bklib.version import __version__

        print(f"bkaudit {__version__}")
        parser.exit(0)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser: global flags and one sub-command per registered command. Each
    command's own flags are parsed by :func:`run_command`."""
    parser = argparse.ArgumentParser(
        prog="bkaudit",
        description="Audit and repair Apache BookKeeper clusters.",
        epilog=top_level_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "-v", "--verbose", "--debug", action="store_true", help="debug logging, with tracebacks"
    )
    parser.add_argument("--version", action=_PrintVersion, help="print bkaudit's version and exit")
    parser.add_argument(
        "--log-format",
        choices=["text", "json"],
        default=None,
        help="log lines as text, or one JSON object per line for schedulers "
        "(default: $BKAUDIT_LOG_FORMAT, else text); also accepted after the command",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for cmd in COMMANDS.values():
        sub.add_parser(cmd.name, help=cmd.summary, description=cmd.description, add_help=False)
    return parser


def command_parser(cmd: Command) -> argparse.ArgumentParser:
    """``bkaudit NAME``'s parser: the command's flags, its description and the examples
    epilog (config-file and environment defaults are applied when it parses)."""
    from jobs.cli.config import help_epilog

    add_arguments, _ = cmd.load()
    parser = argparse.ArgumentParser(
        prog=f"bkaudit {cmd.name}",
        description=textwrap.fill(cmd.description, width=79, break_on_hyphens=False),
        epilog=help_epilog(cmd.name),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    return parser


def run_command(cmd: Command, argv: Sequence[str]) -> int:
    """Parse ``argv`` with the command's parser (config file and environment applied) and run
    it. A bad flag, config key or variable exits 2 with one line."""
    from jobs.cli.config import parse_with_config

    if cmd.own_parser:
        return cmd.argv_runner()(list(argv))
    _, runner = cmd.load()
    return int(runner(parse_with_config(command_parser(cmd), cmd.name, argv)) or 0)


def command_main(name: str, argv: Sequence[str] | None = None) -> int:
    """``python -m jobs.commands.NAME ...``: the command as ``bkaudit NAME`` runs it, with its
    logging set up from the config file."""
    from jobs.cli.config import config_path_from_argv, configure_logging

    argv = list(sys.argv[1:] if argv is None else argv)
    configure_logging(False, config_path_from_argv(argv))
    return run_command(COMMANDS[name], argv)


def main(argv: Sequence[str] | None = None) -> int:
    """``bkaudit [-v] [--log-format F] COMMAND ...``; returns the exit status."""
    from jobs.cli.config import config_path_from_argv, configure_logging, pop_log_format
    from jobs.runtime.exit_status import ExitStatus
    from jobs.runtime.messages import one_line, spark_missing
    from jobs.tables.writer_tag import name_writer

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command != "watch":  # watch parses its own --log-format
        args.log_format = pop_log_format(rest) or args.log_format
        if args.log_format not in (None, "text", "json"):
            parser.error(f"--log-format {args.log_format}: use text or json")
    configure_logging(args.verbose, config_path_from_argv(argv), log_format=args.log_format)
    if args.command is None:
        parser.print_help()
        return ExitStatus.OPERATOR_ERROR
    interrupts.name_command(args.command)
    name_writer(args.command)

    def body() -> int:
        try:
            return run_command(COMMANDS[args.command], rest)
        except ModuleNotFoundError as exc:
            if not spark_missing(exc):
                raise
            # `pip install bkaudit` has no pyspark: one line naming the extra, not a traceback.
            print(f"bkaudit {args.command}: {one_line(exc)}", file=sys.stderr)
            return ExitStatus.OPERATOR_ERROR

    # SIGINT or SIGTERM: one line and 128 + the signal, whatever the command was doing (the
    # watch's clean stop on SIGTERM is its 0: docs/exit-status.md).
    return interrupts.answered(body, sigterm_is_clean=args.command == "watch")


def run() -> int:
    """The ``bkaudit`` command in a process of its own: :func:`main` without pandas
    (:mod:`jobs.runtime.pandas_free`)."""
    from jobs.runtime.pandas_free import decline_pandas

    decline_pandas()
    interrupts.install()  # SIGINT and SIGTERM: one line, 130 / 143, the run recorded
    return main()


if __name__ == "__main__":
    sys.exit(run())
