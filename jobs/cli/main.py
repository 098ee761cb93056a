"""The ``bkaudit`` command line. Each command imports only what it needs, so the bookie,
the sandbox and the metadata tools run without Spark."""

from __future__ import annotations

import argparse
import functools
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
  bkaudit whatif --zk 127.0.0.1:2181 --bookie 10.0.0.7:3181 --exit-code
  bkaudit blastradius --zk 127.0.0.1:2181 --warehouse /data/bkaudit
  bkaudit triage --warehouse /data/bkaudit --zk 127.0.0.1:2181
  bkaudit demo                            # the whole story on a throw-away sandbox
  bkaudit sandbox down
"""


def _cmd_bookie(args: argparse.Namespace) -> int:
    from bklib.bookie.main import main as bookie_main

    return bookie_main(args.rest)


def _cmd_sandbox(args: argparse.Namespace) -> int:
    from bklib.testing.sandbox import Sandbox, SandboxError, detached_status, stop_detached

    base = Path(args.dir)
    try:
        if args.action == "up":
            if (base / "sandbox.json").exists():
                print(f"a sandbox is already recorded in {base}; run `bkaudit sandbox down` first")
                return 2
            sb = Sandbox(
                base,
                num_bookies=args.bookies,
                detach=True,
                fault_injection=args.faults,
                tls=args.tls,
            )
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
            if sb.client_tls is not None:
                from bklib.testing.sandbox import client_tls_flags

                print("bookie TLS: add " + " ".join(client_tls_flags(sb.client_tls)))
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


JobParts = tuple[Callable[[argparse.ArgumentParser], object], Callable[[argparse.Namespace], int]]


def _spark_command(
    name: str, description: str, load: Callable[[], JobParts]
) -> Callable[[argparse.Namespace], int]:
    """A passthrough command whose flags are parsed by its job module's own parser (with
    config-file and environment defaults). ``load`` imports the job only when it runs, so
    ``bkaudit bookie`` and ``sandbox`` never import Spark."""

    def run(args: argparse.Namespace) -> int:
        from jobs.cli.config import help_epilog, parse_with_config

        add_arguments, runner = load()
        parser = argparse.ArgumentParser(
            prog=f"bkaudit {name}",
            description=description,
            epilog=help_epilog(name),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        add_arguments(parser)
        return int(runner(parse_with_config(parser, name, args.rest)))

    return run


def _audit_job() -> JobParts:
    from jobs.commands.audit import add_audit_arguments, run_audit

    return add_audit_arguments, run_audit


def _list_job() -> JobParts:
    from jobs.commands.listing import add_list_arguments, run_listunderreplicated

    return add_list_arguments, run_listunderreplicated


def _report_job() -> JobParts:
    from jobs.reports.html import add_report_arguments, run_report

    return add_report_arguments, run_report


def _repair_job(mode: str) -> Callable[[], JobParts]:
    def load() -> JobParts:
        from jobs.commands import repair as rereplicate

        return functools.partial(rereplicate.add_repair_arguments, mode=mode), (
            rereplicate.RUNNERS[mode]
        )

    return load


def _whatif_job() -> JobParts:
    from jobs.commands.whatif import add_whatif_arguments, run_whatif

    return add_whatif_arguments, run_whatif


def _blast_job() -> JobParts:
    from jobs.commands.whatif import add_blastradius_arguments, run_blastradius

    return add_blastradius_arguments, run_blastradius


def _triage_job() -> JobParts:
    from jobs.commands.triage import add_triage_arguments, run_triage

    return add_triage_arguments, run_triage


SPARK_COMMANDS: dict[str, tuple[str, str, Callable[[], JobParts]]] = {
    "audit": (
        "audit a cluster into Delta tables (--check lost|sample|replicas|deep|pulsar)",
        "Write one audit run of the cluster to the Delta tables under --warehouse.",
        _audit_job,
    ),
    "listunderreplicated": (
        "print the latest audit report",
        "Print the latest audit report, like BookKeeper's shell command. "
        "Exit 0 when clean, 1 when findings exist, 2 on error.",
        _list_job,
    ),
    "rereplicate": (
        "repair what the latest audit found",
        "Repair what the latest audit found: fence open ledgers past the grace period, copy "
        "missing entries to replacement bookies, swap them into the metadata by "
        "compare-and-set. Exit 0 when done, 1 when ledgers need another run, 2 on error.",
        _repair_job("rereplicate"),
    ),
    "recover": (
        "re-replicate everything on given bookies",
        "Manual bookie recovery: re-replicate every fragment of every ledger that uses the "
        "given bookies (open ledgers are fenced at once, as BookKeeper does).",
        _repair_job("recover"),
    ),
    "decommission": (
        "recover a stopped bookie, verify",
        "Decommission a stopped bookie: recover it, verify no ensemble names it any more, "
        "then delete its cookie.",
        _repair_job("decommission"),
    ),
    "report": (
        "write a self-contained HTML report",
        "Write a self-contained HTML report (charts, stuck ledgers, latest findings). "
        "Exit 0 when written, 2 on error.",
        _report_job,
    ),
    "whatif": (
        "may these bookies (or this rack) stop now?",
        "What fails if the given bookies, or every bookie of a rack, fail next: ledgers and "
        "entries below AQ, data lost, open ledgers whose writer could not replace them, and "
        "their topics. Prints SAFE or UNSAFE; with --exit-code exit 0 SAFE, 1 UNSAFE; 2 on error.",
        _whatif_job,
    ),
    "blastradius": (
        "blast radius of every bookie and rack into Delta",
        "Compute what each bookie and each rack failing alone would do, in one pass, into the "
        "blast_radius table. Exit 0 when written, 2 on error.",
        _blast_job,
    ),
    "triage": (
        "why each NO_REPLICA or stuck ledger cannot be repaired",
        "Classify each unrecoverable ledger of the latest audit (write quorum 1, deleted, "
        "entries lost on every replica, no replacement bookie) with its topic and age, into "
        "the triage table. Exit 0 nothing to triage, 1 ledgers triaged, 2 on error.",
        _triage_job,
    ),
}


def _watch_job() -> JobParts:
    from jobs.commands.watch import add_watch_arguments, run_watch

    return add_watch_arguments, run_watch


def _status_job() -> JobParts:
    from jobs.commands.watch import add_status_arguments, run_status

    return add_status_arguments, run_status


# The continuous service and the one-screen status (docs/watch.md); no Spark either.
SPARK_COMMANDS["watch"] = (
    "run continuously: repair lost bookies, audit on a schedule, export metrics",
    "Run until SIGTERM: elect a leader among instances, react to lost bookies after "
    "lostBookieRecoveryDelay (audit, mark, repair, re-audit into the Delta tables), run "
    "periodic audits, and serve Prometheus metrics, /healthz and /readyz. Exit 0 on SIGTERM, "
    "2 when it cannot start.",
    _watch_job,
)
SPARK_COMMANDS["status"] = (
    "bookies, marks, watch leader, Java Auditor, last audits",
    "One screen of cluster state: writable, readonly and down bookies, under-replicated "
    "ledgers from BookKeeper's marks, the watch leader, the Java Auditor, the disable flag and "
    "the age of each check's last audit. Exit 0 nothing marked or down, 1 otherwise, 2 error.",
    _status_job,
)


def _maintain_job() -> JobParts:
    from jobs.commands.maintain import add_maintain_arguments, run_maintain

    return add_maintain_arguments, run_maintain


def _orphans_job() -> JobParts:
    from jobs.commands.orphans import add_orphans_arguments, run_orphans

    return add_orphans_arguments, run_orphans


# Pulsar's unlisted ledgers (docs/pulsar.md); metadata only, no Spark.
SPARK_COMMANDS["orphans"] = (
    "delete ledgers Pulsar no longer lists",
    "Delete orphan ledgers: ledgers whose Pulsar owner (managed ledger, cursor, schema) no "
    "longer lists them, older than --older-than, found by two reads --delay apart that agree. "
    "Every deletion is recorded in replication_actions. Exit 0 when all agreed orphans were "
    "deleted, 1 when some were not, 2 on error.",
    _orphans_job,
)


# Delta table upkeep (docs/tables.md); delta-rs, no Spark.
SPARK_COMMANDS["maintain"] = (
    "delete old runs, compact, vacuum, migrate the Delta tables",
    "Keep the Delta tables healthy: delete runs older than --keep (keeping the latest run of "
    "each check and every run with open findings), compact small files, vacuum; --migrate "
    "relays old tables out by run_date. Exit 0 when done, 2 on error.",
    _maintain_job,
)


def _cmd_demo(args: argparse.Namespace) -> int:
    from jobs.commands.demo import run_demo

    return run_demo(args)


def build_parser(config_path: str | None = None) -> argparse.ArgumentParser:
    """The top-level parser; ``sandbox`` and ``demo`` take their defaults from the config
    file and environment too (the Spark commands apply them in their own parsers)."""
    from jobs.cli.config import apply_config, help_epilog

    parser = argparse.ArgumentParser(
        prog="bkaudit",
        description="Audit and repair Apache BookKeeper clusters.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "-v", "--verbose", "--debug", action="store_true", help="debug logging, with tracebacks"
    )
    parser.add_argument(
        "--log-format",
        choices=["text", "json"],
        default=None,
        help="log lines as text, or one JSON object per line for schedulers "
        "(default: $BKAUDIT_LOG_FORMAT, else text); also accepted after the command",
    )
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
    for name, (short, description, load) in SPARK_COMMANDS.items():
        p = sub.add_parser(name, help=short, add_help=False)
        p.set_defaults(func=_spark_command(name, description, load), passthrough=True)

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
    p.add_argument(
        "--tls",
        action="store_true",
        help="bookies serve TLS only (START_TLS), with a test CA and certificates under DIR/tls",
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
    from jobs.cli.config import (
        ConfigError,
        config_path_from_argv,
        configure_logging,
        pop_log_format,
    )
    from jobs.runtime.messages import one_line, spark_missing

    argv = list(sys.argv[1:] if argv is None else argv)
    config_path = config_path_from_argv(argv)
    try:
        parser = build_parser(config_path)
    except ConfigError as exc:
        print(f"bkaudit: {exc}", file=sys.stderr)
        return 2
    # Spark commands and bookie hand their flags to their own parsers.
    args, rest = parser.parse_known_args(argv)
    if args.command != "watch":  # watch parses its own --log-format
        args.log_format = pop_log_format(rest) or args.log_format
        if args.log_format not in (None, "text", "json"):
            parser.error(f"--log-format {args.log_format}: use text or json")
    if rest and not getattr(args, "passthrough", False):
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    args.rest = rest
    configure_logging(args.verbose, config_path, log_format=args.log_format)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except ModuleNotFoundError as exc:
        if not spark_missing(exc):
            raise
        # `pip install bkaudit` has no pyspark: one line naming the extra, not a traceback.
        print(f"bkaudit {args.command}: {one_line(exc)}", file=sys.stderr)
        return 2


def run() -> int:
    """The ``bkaudit`` command in a process of its own: :func:`main` without pandas
    (:mod:`jobs.runtime.pandas_free`)."""
    from jobs.runtime.pandas_free import decline_pandas

    decline_pandas()
    return main()


if __name__ == "__main__":
    sys.exit(run())
