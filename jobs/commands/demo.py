"""``bkaudit demo``: the operator's story on a throw-away sandbox.

Start ZooKeeper and Python bookies, write a realistic workload through the real writer, lose a
bookie (kill -9), run the Spark audit (metadata ``lost`` check, then the entry-level
``replicas`` check), show the report, repair with ``rereplicate`` (open ledgers fenced and
closed, missing replicas copied, metadata swapped by CAS), re-audit to show zero findings,
read every acknowledged entry back from the new ensembles, and stop everything.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import io
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bklib.client.pool import BookieClientPool
from bklib.client.reader import ClientContext, LedgerReader
from bklib.client.recovery import recover_ledger
from bklib.meta.store import LedgerStore
from bklib.meta.stores import open_store
from bklib.testing.sandbox import Sandbox
from bklib.testing.workload import PASSWORD, WrittenLedger, write_ledgers
from jobs.options.units import parse_duration
from jobs.options.warehouse import WAREHOUSE_HELP, check_warehouse_uri
from jobs.runtime import interrupts
from jobs.runtime.exit_status import ExitStatus
from jobs.runtime.messages import SPARK_EXTRA

log = logging.getLogger(__name__)

DEMO_SHAPES = ((2, 2, 2), (3, 2, 2), (3, 3, 2), (4, 3, 2), (5, 3, 2))


def _step(n: int, total: int, text: str) -> None:
    print(f"\n== [{n}/{total}] {text}", flush=True)


def _table(rows: list[tuple[object, ...]], header: tuple[str, ...]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    for row in (header, tuple("-" * w for w in widths), *rows):
        print("  " + "  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=False)))


def _busiest_bookie(zk_connect: str, written: list[WrittenLedger]) -> str:
    zk = open_store(zk_connect)
    try:
        store = LedgerStore(zk)
        count: collections.Counter[str] = collections.Counter()
        for w in written:
            for seg in store.read_ledger(w.ledger_id).value.segments:
                count.update(seg.ensemble)
        return count.most_common(1)[0][0]
    finally:
        zk.close()


async def _read_back(zk_connect: str, written: list[WrittenLedger]) -> tuple[int, int, int]:
    """Close every ledger still open by fencing recovery (as a reader taking it over would),
    then read every entry up to lastEntryId with digests verified. Returns (entries read,
    entries the workload had acknowledged, ledgers read)."""
    zk = open_store(zk_connect)
    entries = 0
    try:
        async with BookieClientPool(zk) as pool:
            ctx = ClientContext(LedgerStore(zk), pool)
            for w in written:
                reader = await LedgerReader.open(ctx, w.ledger_id, password=PASSWORD)
                if not reader.metadata.is_closed:
                    await recover_ledger(ctx, w.ledger_id, password=PASSWORD)
                    reader = await LedgerReader.open(ctx, w.ledger_id, password=PASSWORD)
                last = reader.metadata.last_entry_id
                if last + 1 != w.entries:
                    print(f"  ledger {w.ledger_id}: {last + 1} entries, {w.entries} acknowledged")
                if last >= 0:
                    entries += len(await reader.read_entries(0, last))
    finally:
        zk.close()
    return entries, sum(w.entries for w in written), len(written)


class _DemoFormatter(logging.Formatter):
    """Log records as indented lines under the step they belong to; the level only when it
    is a warning or worse (a demo reads as a story, not as a log file)."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if record.levelno >= logging.WARNING:
            return f"  {record.levelname} {record.name}: {text}"
        return f"  {text}"


def _demo_logging() -> None:
    """Indented message-only log lines, unless ``-v`` or ``--log-format json`` asked for the
    full records."""
    from jobs.runtime.logs import BarAwareHandler, is_verbose, log_format

    if is_verbose() or log_format() != "text":
        return
    for h in logging.getLogger().handlers:
        if isinstance(h, BarAwareHandler):
            h.setFormatter(_DemoFormatter("%(message)s"))
    # The sandbox's start-up lines repeat what step 1 prints.
    logging.getLogger("bklib.testing").setLevel(logging.WARNING)


def _listing(warehouse: str, ledgers_shown: int = 3) -> int:
    """``listunderreplicated`` of the latest run, cut to its first ``ledgers_shown`` ledgers
    and its summary line (the full listing has two lines per ledger); returns its exit code."""
    from jobs.commands.listing import list_underreplicated

    buf = io.StringIO()
    rc = list_underreplicated(warehouse, out=buf)
    lines = buf.getvalue().rstrip("\n").splitlines()
    # Java's format: a header, then per ledger its id on one line and its replicas indented.
    starts = [i for i, x in enumerate(lines[1:-1], 1) if not x.startswith(("\t", " "))]
    if len(starts) <= ledgers_shown:
        print("\n".join(lines))
        return rc
    print("\n".join(lines[: starts[ledgers_shown]]))
    print(
        f"\t... {len(starts) - ledgers_shown} more ledgers (the full list: "
        f"bkaudit listunderreplicated --warehouse {warehouse})"
    )
    print(lines[-1])
    return rc


SPARK_MISSING_NOTE = f" (pyspark is not installed: {SPARK_EXTRA} for Spark)"


def _spark_installed() -> bool:
    """Whether the spark extra is installed (the demo then shows the Spark executor too)."""
    import importlib.util

    try:
        return importlib.util.find_spec("pyspark") is not None
    except ModuleNotFoundError:  # an import hook that refuses it: not installed for us
        return False


def _stop_spark() -> None:
    """Stop the SparkSession step 5 started, if any (without importing Spark otherwise)."""
    if "pyspark" in sys.modules:
        from pyspark.sql import SparkSession

        active = SparkSession.getActiveSession()
        if active is not None:
            active.stop()


def add_demo_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The demo's flags."""
    parser.add_argument(
        "--dir", default=None, help="keep the sandbox data here (default: a temp dir)"
    )
    # Not dest "warehouse": $BKAUDIT_WAREHOUSE and a config's global warehouse name the
    # operator's real tables, which a throw-away sandbox's runs must not join.
    parser.add_argument(
        "--warehouse",
        dest="demo_warehouse",
        type=check_warehouse_uri,
        default=None,
        help=f"{WAREHOUSE_HELP} (default: a directory in the sandbox's)",
    )
    parser.add_argument("--bookies", type=int, default=5)
    parser.add_argument("--ledgers", type=int, default=200)
    parser.add_argument(
        "--grace-period",
        type=parse_duration,
        default=0.0,
        help="rereplicate's grace period for open ledgers (e.g. 0s, 30s)",
    )
    return parser


def run_demo(args: argparse.Namespace) -> int:
    """Run the whole story; returns 0 when every step behaved as expected."""
    from jobs.commands.sandbox import prepare_zookeeper

    missing = prepare_zookeeper()
    if missing is not None:
        print(f"demo: {missing}", file=sys.stderr)
        return ExitStatus.OPERATOR_ERROR
    # Tables and step lines in order with the log lines when the output is a pipe or a file.
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)
    _demo_logging()
    total = 9
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="bkaudit-demo-"))
    warehouse = args.demo_warehouse or str(base / "warehouse")
    t_start = time.monotonic()

    _step(1, total, f"sandbox: ZooKeeper + {args.bookies} Python bookies under {base}")
    sb = Sandbox(base / "cluster", num_bookies=args.bookies)
    # Ctrl-C stops the sandbox on the way out (the with below); a second one, which leaves at
    # once (jobs.runtime.interrupts), kills its processes first: none is left behind.
    forget = interrupts.at_exit_now(lambda: _kill_sandbox(sb))
    try:
        return _story(args, sb, base, warehouse, total, t_start)
    except (interrupts.Interrupted, KeyboardInterrupt):
        if not args.dir:  # nothing to look at in a throw-away sandbox stopped half-way
            shutil.rmtree(base, ignore_errors=True)
        raise
    finally:
        forget()


def _kill_sandbox(sb: Sandbox) -> None:
    """SIGKILL every process of ``sb`` still running (the process leaves at once)."""
    procs = [b.proc for b in sb.bookies] + [sb.zk_server.proc if sb.zk_server else None]
    for proc in procs:
        if proc is not None and proc.poll() is None:
            proc.kill()


def _story(
    args: argparse.Namespace, sb: Sandbox, base: Path, warehouse: str, total: int, t_start: float
) -> int:
    """Steps 1 to 9 on ``sb`` (started here, stopped on the way out, whatever happens)."""
    from jobs.commands.audit import add_audit_arguments, run_audit
    from jobs.commands.repair import add_repair_arguments, run_rereplicate

    with sb:
        print(f"  ZooKeeper {sb.zk_connect}; bookies {', '.join(sb.bookie_ids)}")

        _step(2, total, f"workload: {args.ledgers} ledgers through the bklib writer")
        t = time.monotonic()
        # Ensembles up to one bookie fewer than the cluster, so every ledger stays repairable
        # after one loss (a 5-bookie ensemble on 4 live bookies cannot be, in BookKeeper too).
        shapes = tuple(s for s in DEMO_SHAPES if s[0] < args.bookies) or DEMO_SHAPES[:1]
        written = asyncio.run(write_ledgers(sb.zk_connect, args.ledgers, shapes=shapes))
        by_shape: dict[tuple[tuple[int, int, int], str], list[WrittenLedger]] = {}
        for w in written:
            by_shape.setdefault((w.shape, "CLOSED" if w.closed else "OPEN"), []).append(w)
        _table(
            [
                (f"{e}/{wq}/{aq}", state, len(ws), sum(x.entries for x in ws))
                for ((e, wq, aq), state), ws in sorted(by_shape.items())
            ],
            ("E/WQ/AQ", "state", "ledgers", "entries"),
        )
        print(f"  written in {time.monotonic() - t:.1f}s")

        victim = _busiest_bookie(sb.zk_connect, written)
        _step(3, total, f"lose a bookie: kill -9 {victim} (the one in most ensembles)")
        sb.kill_bookie(victim)
        waited = sb.wait_unregistered(victim)
        print(f"  its registration expired after {waited:.1f}s; its data is gone for the audit")

        try:
            # The same engine twice: in this process (no JVM), then inside Spark tasks; both
            # append to the same Delta tables. Without the spark extra, both run here.
            spark = "spark" if _spark_installed() else "local"
            for n, check, executor in ((4, "lost", "local"), (5, "replicas", spark)):
                note = SPARK_MISSING_NOTE if n == 5 and spark == "local" else ""
                _step(n, total, f"bkaudit audit --check {check} --executor {executor}{note}")
                ns = add_audit_arguments(argparse.ArgumentParser()).parse_args(
                    [
                        *("--zk", sb.zk_connect, "--warehouse", warehouse),
                        *("--check", check, "--executor", executor),
                    ]
                )
                rc = run_audit(ns)
                if rc != 0:
                    print(f"  audit exited with {rc}")
                    return rc
            _step(6, total, "bkaudit listunderreplicated (latest run)")
            findings = _listing(warehouse)

            _step(
                7,
                total,
                f"bkaudit rereplicate --grace-period {args.grace_period:g}s (executor auto: "
                "in-process at this size; the demo's open ledgers have dead writers)",
            )
            ns = add_repair_arguments(argparse.ArgumentParser()).parse_args(
                [
                    *("--zk", sb.zk_connect, "--warehouse", warehouse),
                    *("--grace-period", f"{args.grace_period:g}s"),
                ]
            )
            repaired = run_rereplicate(ns)
            for _ in range(3):  # WAITING_GRACE: wait the grace period out, as a schedule would
                if repaired != ExitStatus.FINDINGS:
                    break
                time.sleep(ns.grace_period + 1)
                repaired = run_rereplicate(ns)

            _step(8, total, "bkaudit audit --check replicas again, then listunderreplicated")
            ns = add_audit_arguments(argparse.ArgumentParser()).parse_args(
                ["--zk", sb.zk_connect, "--warehouse", warehouse, "--check", "replicas"]
            )
            run_audit(ns)
            after = _listing(warehouse)
        finally:
            _stop_spark()

        _step(9, total, "fence and close what is still open, then read every entry back")
        entries, acked, ledgers = asyncio.run(_read_back(sb.zk_connect, written))
        print(
            f"  {entries} entries read of {acked} acknowledged by the workload, "
            f"{ledgers} ledgers, every digest verified"
        )
    kept = f"Delta tables kept in {warehouse}" if args.dir else "rerun with --dir to keep them"
    ok = findings == 1 and repaired == 0 and after == 0 and entries == acked
    outcome = "findings reported, repaired, re-audit clean, every entry read"
    print(
        f"\ndemo finished in {time.monotonic() - t_start:.0f}s: "
        f"{outcome if ok else 'UNEXPECTED OUTCOME'} ({kept})."
    )
    if not args.dir:
        shutil.rmtree(base, ignore_errors=True)
    return ExitStatus.OK if ok else ExitStatus.FINDINGS
