"""jobs.commands.listing (``bkaudit listunderreplicated``) on the real warehouse, written by
Spark and read through delta-rs: the listing, its exit codes, one-line errors, and a command
line that never imports pyspark."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bklib.states import Severity
from jobs.commands.listing import list_underreplicated
from jobs.tables.schema import AUDIT_RUNS
from tests.report.conftest import REPO, ReportWarehouse

pytestmark = pytest.mark.integration


def _listing(warehouse: str, **kwargs: str) -> tuple[int, str]:
    out = io.StringIO()
    code = list_underreplicated(warehouse, out=out, **kwargs)
    return code, out.getvalue()


def test_lists_every_finding_of_the_latest_run(report_warehouse: ReportWarehouse) -> None:
    wh = report_warehouse
    code, text = _listing(wh.path)
    assert code == 1
    lines = text.splitlines()
    assert lines[0].startswith(f"audit run {wh.latest_run}: check lost, ")
    ledgers = [int(line) for line in lines if line.isdigit()]
    assert ledgers == sorted(wh.expected)
    details = [line for line in lines if line.startswith("\tMissingReplica : ")]
    assert len(details) == len(wh.expected)
    assert all(line.startswith(f"\tMissingReplica : {wh.victim}  ") for line in details)
    for lid, (missing, sev) in wh.expected.items():
        detail = details[ledgers.index(lid)]
        assert f"  {sev} (min replicas " in detail
        assert (f"  {missing} entries" in detail) == (missing is not None)
    worst = min((s for _, s in wh.expected.values()), key=Severity.ORDER.__getitem__)
    assert lines[-2] == (
        f"{len(wh.expected)} under-replicated ledgers, {len(wh.expected)} fragments, "
        f"0 unreadable znodes; worst severity {worst}"
    )
    # The fixture's repair run after the audit: two ledgers repaired, two still waiting.
    assert lines[-1] == (
        f"2 of these ledgers were repaired after this audit and {len(wh.expected) - 2} still "
        "need work; run `bkaudit audit` for a current report"
    )
    since = {lid: details[ledgers.index(lid)].split("repair since: ")[-1] for lid in ledgers}
    assert since[wh.below_aq].startswith("REPAIRED (rereplicate ")
    assert since[wh.below_wq].startswith("REPAIRED (rereplicate ")
    assert since[wh.no_replica].startswith("NO_REPLICA: entries 1, 3, 5 exist on no bookie")
    assert since[wh.open_ledger].startswith("WAITING_GRACE: open; grace period 30s not over")


def test_filters_and_older_runs(report_warehouse: ReportWarehouse) -> None:
    wh = report_warehouse
    code, text = _listing(wh.path, missing_replica=wh.victim)
    assert code == 1 and [int(x) for x in text.splitlines() if x.isdigit()] == sorted(wh.expected)
    code, text = _listing(wh.path, missing_replica=wh.replacement)
    assert code == 0 and text.splitlines()[-1] == "no under-replicated ledgers"
    code, text = _listing(wh.path, run_id=wh.runs[0])  # before the bookie stopped
    assert code == 0 and text.startswith(f"audit run {wh.runs[0]}: ")


@pytest.mark.parametrize("case", ["no-warehouse", "empty-warehouse", "unknown-run", "protocol"])
def test_errors_are_one_line_and_exit_2(
    case: str,
    report_warehouse: ReportWarehouse,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    warehouse, run_id, expect = str(tmp_path / "none"), None, "no warehouse at"
    if case == "empty-warehouse":
        warehouse, expect = str(tmp_path), "no completed audit run in"
    elif case == "unknown-run":
        warehouse, run_id, expect = report_warehouse.path, "no-such-run", "no run no-such-run"
    elif case == "protocol":
        # A copy of the warehouse whose audit_runs needs a reader feature delta-rs lacks.
        warehouse = str(tmp_path / "wh")
        shutil.copytree(report_warehouse.path, warehouse)
        log = Path(warehouse) / AUDIT_RUNS / "_delta_log"
        version = max(int(p.stem) for p in log.glob("*.json")) + 1
        feature = ["deletionVectors"]
        (log / f"{version:020d}.json").write_text(
            json.dumps(
                {
                    "protocol": {
                        "minReaderVersion": 3,
                        "minWriterVersion": 7,
                        "readerFeatures": feature,
                        "writerFeatures": feature,
                    }
                }
            )
            + "\n"
        )
        expect = f"Delta table {warehouse}/{AUDIT_RUNS} uses a protocol"
    out = io.StringIO()
    assert list_underreplicated(warehouse, run_id=run_id, out=out) == 2
    assert out.getvalue() == ""
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("listunderreplicated: "), err
    assert expect in err


def test_command_line_reads_without_pyspark(report_warehouse: ReportWarehouse) -> None:
    wh = report_warehouse
    proc = subprocess.run(
        [
            sys.executable,
            "-X",
            "importtime",
            "-m",
            "jobs.cli",
            "listunderreplicated",
            "--warehouse",
            wh.path,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert [int(x) for x in proc.stdout.splitlines() if x.isdigit()] == sorted(wh.expected)
    imported = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()]
    assert "jobs.tables.delta" in imported
    assert not [m for m in imported if m.split(".")[0] in ("pyspark", "py4j")]
