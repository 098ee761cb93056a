"""Every ``bkaudit`` command, declared once: its name, one-line help, description, examples,
where its flags and run function live, and whether it may start Spark.

``bkaudit --help``, each ``bkaudit COMMAND --help``, the per-command sections of
``conf/bkaudit.yaml`` and the README's command table are checked against this table
(``tests/unit/test_command_registry.py``), so they cannot drift apart. Nothing here imports a
command's module: ``bkaudit bookie`` and ``bkaudit sandbox`` never import Spark.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from jobs.runtime.exit_status import CommandExits

__all__ = ["COMMANDS", "Command", "command"]

AddArguments = Callable[[argparse.ArgumentParser], object]
Runner = Callable[[argparse.Namespace], int]


@dataclass(frozen=True)
class Command:
    """One ``bkaudit`` command."""

    name: str
    summary: str
    """One line, in ``bkaudit --help``."""
    about: str
    """What the command does: the top of ``bkaudit NAME --help``."""
    exits: CommandExits
    """What its exit statuses mean (:mod:`jobs.runtime.exit_status`, the one rule)."""
    examples: tuple[str, ...]
    module: str
    """The module holding ``add_arguments`` and ``run``."""
    add_arguments: str
    """``f(parser)``: adds the command's flags (its ``conf/bkaudit.yaml`` section's keys)."""
    run: str
    """``f(args) -> exit status``."""
    spark: bool = False
    """Whether the command may start Spark (``--executor spark|auto``): needs ``bkaudit[spark]``."""
    own_parser: bool = False
    """The command parses its own argv (``run(argv)``): no config section, no ``--help`` here."""

    @property
    def description(self) -> str:
        """The paragraph at the top of ``bkaudit NAME --help``, ending with the exit statuses."""
        return f"{self.about} {self.exits.sentence()}"

    def load(self) -> tuple[AddArguments, Runner]:
        """Import the command's module and return its flag and run functions."""
        module = importlib.import_module(self.module)
        return (
            cast(AddArguments, getattr(module, self.add_arguments)),
            cast(Runner, getattr(module, self.run)),
        )

    def argv_runner(self) -> Callable[[list[str]], int]:
        """``run(argv)`` of a command that parses its own argv (:attr:`own_parser`)."""
        return cast(
            Callable[[list[str]], int], getattr(importlib.import_module(self.module), self.run)
        )


_REPAIR_EXITS = CommandExits(ok="done", findings="ledgers need another run")

_COMMANDS = (
    Command(
        name="bookie",
        summary="run one Python bookie",
        about="Run one BookKeeper 4.17-compatible Python bookie. All arguments go to "
        "`python -m bklib.bookie` (see --help there).",
        exits=CommandExits(ok="stopped by SIGTERM", reads_cluster=False),
        examples=("bkaudit bookie --zk 127.0.0.1:2181 --port 3181 --data-dir /var/lib/bookie",),
        module="bklib.bookie.main",
        add_arguments="",
        run="main",
        own_parser=True,
    ),
    Command(
        name="audit",
        summary="audit a cluster into Delta tables (--check lost|sample|replicas|deep|pulsar)",
        about="Write one audit run of the cluster to the Delta tables under --warehouse.",
        exits=CommandExits(ok="the run completed and read everything (findings or not)"),
        examples=(
            "bkaudit audit --zk zk1:2181/pulsar --warehouse /data/bkaudit --check replicas",
            "bkaudit audit --check lost          # zk and warehouse from conf/bkaudit.yaml",
            "bkaudit audit --check pulsar --metadata-uri metadata-store:zk:zk1:2181 --warehouse W",
            "BKAUDIT_AUDIT_CHECK=deep bkaudit audit --zk 127.0.0.1:2181 --warehouse /tmp/wh",
            "spark-submit jobs/audit.py --zk zk1:2181 --warehouse s3a://ops/bkaudit",
        ),
        module="jobs.commands.audit",
        add_arguments="add_audit_arguments",
        run="run_audit",
        spark=True,
    ),
    Command(
        name="listunderreplicated",
        summary="print the latest audit report",
        about="Print the latest audit report, like BookKeeper's shell command. Over an "
        "incomplete audit run its first line says so.",
        exits=CommandExits(
            ok="nothing is under-replicated", findings="under-replicated ledgers are listed"
        ),
        examples=(
            "bkaudit listunderreplicated --warehouse /data/bkaudit",
            "bkaudit listunderreplicated --missing-replica 10.0.0.7:3181 || echo findings",
            "bkaudit listunderreplicated --live --zk zk1:2181/pulsar --count-only",
        ),
        module="jobs.commands.listing",
        add_arguments="add_list_arguments",
        run="run_listunderreplicated",
    ),
    Command(
        name="rereplicate",
        summary="repair what the latest audit found",
        about="Repair what the latest audit found: fence open ledgers past the grace "
        "period, copy missing entries to replacement bookies, swap them into the metadata by "
        "compare-and-set.",
        exits=_REPAIR_EXITS,
        examples=(
            "bkaudit rereplicate --zk zk1:2181 --warehouse /data/bkaudit --dry-run",
            "bkaudit rereplicate --grace-period 5m --rate 20MiB",
            "bkaudit rereplicate --run-id 20260101T000000Z-1a2b3c4d   # repair that audit's "
            "findings",
            "bkaudit rereplicate --fix-placement --dry-run   # rack moves for PLACEMENT_VIOLATION",
            "spark-submit jobs/rereplicate.py --zk zk1:2181 --warehouse s3a://ops/bkaudit",
        ),
        module="jobs.commands.repair",
        add_arguments="add_rereplicate_arguments",
        run="run_rereplicate",
        spark=True,
    ),
    Command(
        name="recover",
        summary="re-replicate everything on given bookies",
        about="Manual bookie recovery: re-replicate every fragment of every ledger that "
        "uses the given bookies (open ledgers are fenced at once, as BookKeeper does).",
        exits=_REPAIR_EXITS,
        examples=(
            "bkaudit recover 10.0.0.7:3181 --zk zk1:2181 --warehouse /data/bkaudit --dry-run",
            "bkaudit recover 10.0.0.7:3181,10.0.0.8:3181 --target 10.0.0.9:3181",
        ),
        module="jobs.commands.repair",
        add_arguments="add_recover_arguments",
        run="run_recover",
        spark=True,
    ),
    Command(
        name="decommission",
        summary="recover a stopped bookie, verify",
        about="Decommission a stopped bookie: recover it, verify no ensemble names it any "
        "more, then delete its cookie.",
        exits=_REPAIR_EXITS,
        examples=(
            "bkaudit decommission 10.0.0.7:3181 --zk zk1:2181 --warehouse /data/bkaudit",
            "bkaudit decommission 10.0.0.7:3181 --keep-cookie --dry-run",
        ),
        module="jobs.commands.repair",
        add_arguments="add_decommission_arguments",
        run="run_decommission",
        spark=True,
    ),
    Command(
        name="report",
        summary="write a self-contained HTML report",
        about="Write a self-contained HTML report (charts, stuck ledgers, latest findings).",
        exits=CommandExits(ok="written", reads_cluster=False),
        examples=(
            "bkaudit report --warehouse /data/bkaudit --out report.html",
            "bkaudit report --warehouse s3a://ops/bkaudit --out /tmp/r.html --runs 90",
            "bkaudit report --run-id 20260101T000000Z-1a2b3c4d --runs 90 --out old.html",
        ),
        module="jobs.commands.report",
        add_arguments="add_report_arguments",
        run="run_report",
    ),
    Command(
        name="whatif",
        summary="may these bookies (or this rack) stop now?",
        about="What fails if the given bookies, or every bookie of a rack, fail next: "
        "ledgers and entries below AQ, data lost, open ledgers whose writer could not replace "
        "them, and their topics. Prints SAFE or UNSAFE.",
        exits=CommandExits(
            ok="SAFE (without --exit-code: when the report was printed)",
            findings="UNSAFE, with --exit-code",
        ),
        examples=(
            "bkaudit whatif --zk zk1:2181/pulsar --bookie 10.0.0.7:3181 --exit-code",
            "bkaudit whatif --zk zk1:2181/pulsar --rack /rack-a --warehouse /data/bkaudit",
        ),
        module="jobs.commands.whatif",
        add_arguments="add_whatif_arguments",
        run="run_whatif",
    ),
    Command(
        name="blastradius",
        summary="blast radius of every bookie and rack into Delta",
        about="Compute what each bookie and each rack failing alone would do, in one "
        "pass, into the blast_radius table.",
        exits=CommandExits(ok="written"),
        examples=(
            "bkaudit blastradius --zk zk1:2181/pulsar --warehouse /data/bkaudit",
            "bkaudit blastradius --executor spark --zk zk1:2181 --warehouse s3a://ops/bkaudit",
        ),
        module="jobs.commands.blastradius",
        add_arguments="add_blastradius_arguments",
        run="run_blastradius",
        spark=True,
    ),
    Command(
        name="triage",
        summary="why each NO_REPLICA or stuck ledger cannot be repaired",
        about="Classify each unrecoverable ledger of the latest audit (write quorum 1, "
        "deleted, entries lost on every replica, no replacement bookie) with its topic and "
        "age, into the triage table.",
        exits=CommandExits(ok="there is nothing to triage", findings="ledgers were triaged"),
        examples=(
            "bkaudit triage --warehouse /data/bkaudit --zk zk1:2181/pulsar",
            "bkaudit triage --warehouse /data/bkaudit       # from the audit's own rows",
        ),
        module="jobs.commands.triage",
        add_arguments="add_triage_arguments",
        run="run_triage",
    ),
    Command(
        name="watch",
        summary="run continuously: repair lost bookies, audit on a schedule, export metrics",
        about="Run until SIGTERM: elect a leader among instances, react to lost bookies "
        "after lostBookieRecoveryDelay (audit, mark, repair, re-audit into the Delta tables), "
        "run periodic audits, and serve Prometheus metrics, /healthz and /readyz (red after "
        "a cycle whose audit missed something).",
        exits=CommandExits(ok="stopped by SIGTERM", reads_cluster=False),
        examples=(
            "bkaudit watch --zk zk1:2181/pulsar --warehouse /data/bkaudit --metrics-port 9464",
            "bkaudit watch --every lost=1h,sample=24h --lost-bookie-recovery-delay 60s "
            "--log-format json",
        ),
        module="jobs.commands.watch",
        add_arguments="add_watch_arguments",
        run="run_watch",
    ),
    Command(
        name="status",
        summary="bookies (each asked), marks, watch leader, Java Auditor, last audits",
        about="One screen of cluster state: writable, readonly, unreachable (registered, no "
        "answer within --probe-timeout) and lost bookies, under-replicated ledgers from "
        "BookKeeper's marks, the watch leader, the Java Auditor, the disable flag and the age of "
        "each check's last audit.",
        exits=CommandExits(
            ok="nothing is marked, lost or unreachable",
            findings="ledgers are marked or a bookie is lost or unreachable",
        ),
        examples=(
            "bkaudit status --zk zk1:2181/pulsar --warehouse /data/bkaudit",
            "bkaudit status --zk zk1:2181/pulsar --format json",
        ),
        module="jobs.commands.status",
        add_arguments="add_status_arguments",
        run="run_status",
    ),
    Command(
        name="orphans",
        summary="delete ledgers Pulsar no longer lists",
        about="Delete orphan ledgers: ledgers whose Pulsar owner (managed ledger, "
        "cursor, schema) no longer lists them, older than --older-than, found by two reads "
        "--delay apart that agree. Every deletion is recorded in replication_actions.",
        exits=CommandExits(
            ok="all agreed orphans were deleted", findings="some agreed orphans were not"
        ),
        examples=(
            "bkaudit orphans delete --metadata-uri metadata-store:zk:zk1:2181 "
            "--warehouse /data/bkaudit --older-than 7d --dry-run",
            "bkaudit orphans delete --zk zk1:2181 --warehouse /data/bkaudit --older-than 14d",
        ),
        module="jobs.commands.orphans",
        add_arguments="add_orphans_arguments",
        run="run_orphans",
    ),
    Command(
        name="maintain",
        summary="delete old runs, compact, vacuum, migrate the Delta tables",
        about="Keep the Delta tables healthy: delete runs older than --keep (keeping the "
        "latest run of each check and every run with open findings), compact small files, "
        "vacuum; --migrate relays old tables out by run_date.",
        exits=CommandExits(ok="done", reads_cluster=False),
        examples=(
            "bkaudit maintain --warehouse /data/bkaudit --keep 30d --dry-run",
            "bkaudit maintain --warehouse /data/bkaudit --migrate      # once, after upgrading",
            "bkaudit maintain --warehouse s3a://ops/bkaudit --keep 90d",
        ),
        module="jobs.commands.maintain",
        add_arguments="add_maintain_arguments",
        run="run_maintain",
    ),
    Command(
        name="sandbox",
        summary="start, stop or inspect a local cluster",
        about="A local cluster on loopback: a real ZooKeeper (or Oxia, with --metadata "
        "oxia) and N Python bookies, kept running after the command returns. State lives in "
        "--dir.",
        exits=CommandExits(ok="done", reads_cluster=False),
        examples=(
            "bkaudit sandbox up --bookies 5 --dir sandbox-data",
            "bkaudit sandbox up --metadata oxia --dir sandbox-oxia",
            "bkaudit sandbox status",
            "bkaudit sandbox down",
        ),
        module="jobs.commands.sandbox",
        add_arguments="add_sandbox_arguments",
        run="run_sandbox",
    ),
    Command(
        name="demo",
        summary="run the whole story on a throw-away sandbox",
        about="Start a sandbox, write a workload, lose a bookie, find what is "
        "under-replicated, repair it, re-audit, read everything back, and clean up.",
        exits=CommandExits(
            ok="every step behaved as expected",
            findings="a step did not",
            reads_cluster=False,
        ),
        examples=("bkaudit demo", "bkaudit demo --ledgers 1000 --bookies 7 --dir /tmp/demo"),
        module="jobs.commands.demo",
        add_arguments="add_demo_arguments",
        run="run_demo",
        spark=True,
    ),
)

COMMANDS: dict[str, Command] = {c.name: c for c in _COMMANDS}
"""Every command by name, in the order ``bkaudit --help`` lists them."""


def command(name: str) -> Command:
    """The command called ``name``; KeyError when there is none."""
    return COMMANDS[name]
