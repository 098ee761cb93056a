"""The ``bkaudit`` command line. Each command imports only what it needs, so the bookie,
the sandbox and the metadata tools run without Spark."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

DEFAULT_SANDBOX_DIR = Path("sandbox-data")

EPILOG = """examples:
  bkaudit sandbox up --bookies 5          # ZooKeeper + 5 Python bookies on loopback
  bkaudit sandbox status
  bkaudit bookie --zk 127.0.0.1:2181 --port 3181 --data-dir /var/lib/bookie
  bkaudit audit --zk 127.0.0.1:2181 --warehouse /data/bkaudit --check replicas
  bkaudit listunderreplicated --warehouse /data/bkaudit --missing-replica 10.0.0.7:3181
  bkaudit rereplicate --zk 127.0.0.1:2181 --warehouse /data/bkaudit --grace-period 30s
  bkaudit recover 10.0.0.7:3181 --zk 127.0.0.1:2181 --warehouse /data/bkaudit --dry-run
  bkaudit decommission 10.0.0.7:3181 --zk 127.0.0.1:2181 --warehouse /data/bkaudit
  bkaudit demo                            # the whole story on a throw-away sandbox
  bkaudit sandbox down
"""


def _cmd_bookie(args: argparse.Namespace) -> int:
    from bklib.bookie.main import main as bookie_main

    return bookie_main(args.rest)


def _cmd_sandbox(args: argparse.Namespace) -> int:
    from bklib.sandbox import Sandbox, SandboxError, detached_status, stop_detached

    base = Path(args.dir)
    try:
        if args.action == "up":
            if (base / "sandbox.json").exists():
                print(f"a sandbox is already recorded in {base}; run `bkaudit sandbox down` first")
                return 2
            sb = Sandbox(base, num_bookies=args.bookies, detach=True, fault_injection=args.faults)
            try:
                sb.start()
            except Exception:
                sb.stop()
                raise
            sb.save_state()
            print(f"ZooKeeper  {sb.zk_connect}")
            for b in sb.bookies:
                print(f"bookie     {b.bookie_id}  data {b.data_dir}  log {b.log_path}")
            print(f"use: --zk {sb.zk_connect}")
        elif args.action == "down":
            stopped = stop_detached(base)
            print("stopped: " + (", ".join(stopped) or "nothing was running"))
        else:
            st = detached_status(base)
            print(f"ZooKeeper  {st['zk']}  {'serving' if st['zk_serving'] else 'DOWN'}")
            for b in st["bookies"]:  # type: ignore[union-attr]
                alive = "running" if b["alive"] else "STOPPED"
                print(f"bookie     {b['id']:<22} {alive:<8} registered: {b['registered']}")
    except SandboxError as exc:
        print(f"sandbox: {exc}", file=sys.stderr)
        return 2
    return 0


def _cmd_audit(args: argparse.Namespace) -> int:
    from jobs.audit import add_audit_arguments, run_audit
    from jobs.config import help_epilog, parse_with_config

    parser = argparse.ArgumentParser(
        prog="bkaudit audit",
        description="Write one audit run of the cluster to the Delta tables under --warehouse.",
        epilog=help_epilog("audit"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return run_audit(parse_with_config(add_audit_arguments(parser), "audit", args.rest))


def _cmd_listunderreplicated(args: argparse.Namespace) -> int:
    from jobs.config import help_epilog, parse_with_config
    from jobs.report import add_list_arguments, run_listunderreplicated

    parser = argparse.ArgumentParser(
        prog="bkaudit listunderreplicated",
        description="Print the latest audit report, like BookKeeper's shell command. "
        "Exit 0 when clean, 1 when findings exist, 2 on error.",
        epilog=help_epilog("listunderreplicated"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parsed = parse_with_config(add_list_arguments(parser), "listunderreplicated", args.rest)
    return run_listunderreplicated(parsed)


def _cmd_report(args: argparse.Namespace) -> int:
    from jobs.config import help_epilog, parse_with_config
    from jobs.html_report import add_report_arguments, run_report

    parser = argparse.ArgumentParser(
        prog="bkaudit report",
        description="Write a self-contained HTML report (charts, stuck ledgers, latest "
        "findings). Exit 0 when written, 2 on error.",
        epilog=help_epilog("report"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return run_report(parse_with_config(add_report_arguments(parser), "report", args.rest))


def _repair_command(mode: str) -> Callable[[argparse.Namespace], int]:
    descriptions = {
        "rereplicate": "Repair what the latest audit found: fence open ledgers past the grace "
        "period, copy missing entries to replacement bookies, swap them into the metadata by "
        "compare-and-set. Exit 0 when done, 1 when ledgers need another run, 2 on error.",
        "recover": "Manual bookie recovery: re-replicate every fragment of every ledger that "
        "uses the given bookies (open ledgers are fenced at once, as BookKeeper does).",
        "decommission": "Decommission a stopped bookie: recover it, verify no ensemble names "
        "it any more, then delete its cookie.",
    }

    def run(args: argparse.Namespace) -> int:
        from jobs import rereplicate
        from jobs.config import help_epilog, parse_with_config

        parser = argparse.ArgumentParser(
            prog=f"bkaudit {mode}",
            description=descriptions[mode],
            epilog=help_epilog(mode),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        rereplicate.add_repair_arguments(parser, mode)
        return int(rereplicate.RUNNERS[mode](parse_with_config(parser, mode, args.rest)))

    return run


def _cmd_demo(args: argparse.Namespace) -> int:
    from jobs.demo import run_demo

    return run_demo(args)


def build_parser(config_path: str | None = None) -> argparse.ArgumentParser:
    """The top-level parser; ``sandbox`` and ``demo`` take their defaults from the config
    file and environment too (the Spark commands apply them in their own parsers)."""
    from jobs.config import apply_config, help_epilog

    parser = argparse.ArgumentParser(
        prog="bkaudit",
        description="Audit and repair Apache BookKeeper clusters.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser(
        "bookie",
        help="run one Python bookie",
        description="Run one BookKeeper 4.17-compatible Python bookie. "
        "All arguments go to `python -m bklib.bookie` (see --help there).",
        add_help=False,
    )
    p.set_defaults(func=_cmd_bookie, passthrough=True)

    # Spark commands parse their own flags, so `bkaudit bookie` never imports Spark.
    for name, func, text in (
        ("audit", _cmd_audit, "audit a cluster into Delta tables (--check lost|replicas|deep)"),
        ("listunderreplicated", _cmd_listunderreplicated, "print the latest audit report"),
        ("rereplicate", _repair_command("rereplicate"), "repair what the latest audit found"),
        ("recover", _repair_command("recover"), "re-replicate everything on given bookies"),
        ("decommission", _repair_command("decommission"), "recover a stopped bookie, verify"),
        ("report", _cmd_report, "write a self-contained HTML report"),
    ):
        p = sub.add_parser(name, help=text, add_help=False)
        p.set_defaults(func=func, passthrough=True)

    p = sub.add_parser(
        "sandbox",
        help="start, stop or inspect a local cluster",
        description="A local cluster on loopback: a real ZooKeeper and N Python bookies, kept "
        "running after the command returns. State lives in --dir.",
    )
    p.add_argument("action", choices=["up", "down", "status"])
    p.add_argument("--dir", default=str(DEFAULT_SANDBOX_DIR), help="data and state directory")
    p.add_argument("--bookies", type=int, default=5, help="number of bookies (up)")
    p.add_argument(
        "--faults", action="store_true", help="enable the bookies' fault-injection admin port"
    )
    p.set_defaults(func=_cmd_sandbox)
    p.epilog = help_epilog("sandbox")
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    apply_config(p, "sandbox", config_path)

    p = sub.add_parser(
        "demo",
        help="run the whole story on a throw-away sandbox",
        description="Start a sandbox, write a workload, lose a bookie, find what is "
        "under-replicated, repair it, re-audit, read everything back, and clean up.",
    )
    p.add_argument("--dir", default=None, help="keep the sandbox data here (default: a temp dir)")
    p.add_argument("--bookies", type=int, default=5)
    p.add_argument("--ledgers", type=int, default=200)
    p.add_argument(
        "--grace-period", default="0s", help="rereplicate's grace period for open ledgers"
    )
    p.set_defaults(func=_cmd_demo)
    p.epilog = help_epilog("demo")
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    apply_config(p, "demo", config_path)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from jobs.config import ConfigError, config_path_from_argv, configure_logging

    argv = list(sys.argv[1:] if argv is None else argv)
    config_path = config_path_from_argv(argv)
    try:
        parser = build_parser(config_path)
    except ConfigError as exc:
        print(f"bkaudit: {exc}", file=sys.stderr)
        return 2
    # Spark commands and bookie hand their flags to their own parsers.
    args, rest = parser.parse_known_args(argv)
    if rest and not getattr(args, "passthrough", False):
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    args.rest = rest
    configure_logging(args.verbose, config_path)
    if args.command is None:
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
