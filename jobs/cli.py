"""The ``bkaudit`` command line. Each command imports only what it needs, so the bookie and
the metadata tools run without Spark."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bkaudit",
        description="Audit and repair Apache BookKeeper clusters.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_subparsers(dest="command", metavar="COMMAND")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.command is None:
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
