"""The main story with its warehouse on S3 (the real S3-compatible server): ``bkaudit demo
--warehouse s3://...`` audits (in-process and on Spark), repairs and audits again, and every
reader then reads the same tables from S3: ``listunderreplicated``, ``report`` (the HTML page),
the notebook (its own Spark session) and the Airflow DAG's branch task (delta-rs in Airflow's
own virtualenv)."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from bklib.states import RunStatus
from bklib.testing.s3server import S3Server
from jobs.tables import delta
from jobs.tables.runs import RunRecord
from jobs.tables.schema import ACTIONS, AUDIT_RUNS
from tests.airflow.test_dag import dag_run, run_checker
from tests.cli_helpers import REPO, bkaudit, failure
from tests.integration.test_demo import OUTCOME
from tests.objectstore.conftest import aws_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1500)]

NOTEBOOK = REPO / "notebooks" / "underreplication.ipynb"


def test_the_demo_story_on_s3_and_every_reader_of_it(
    tmp_path: Path, s3_env: S3Server, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    wh = f"{bucket}/bkaudit"
    env = aws_env(s3_env, BKAUDIT_PROGRESS="off")
    demo = subprocess.run(
        [sys.executable, "-m", "jobs.cli", "demo", "--ledgers", "40", "--warehouse", wh,
         "--dir", str(tmp_path / "demo")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert demo.returncode == 0, (demo.stdout[-4000:], demo.stderr[-4000:])
    assert OUTCOME in demo.stdout and f"Delta tables kept in {wh}" in demo.stdout
    runs = delta.read_rows(wh, AUDIT_RUNS)
    # lost (local), replicas (Spark), replicas again (local): all three on S3
    assert len(runs) == 3 and {r["status"] for r in runs} == {RunStatus.COMPLETED}
    assert len(delta.read_rows(wh, ACTIONS)) > 0

    listing = bkaudit("listunderreplicated", "--warehouse", wh, env=env)
    assert listing.returncode == 0, failure(listing)
    latest = max(runs, key=lambda r: r["started_at"])
    assert latest["run_id"] in listing.stdout and "no under-replicated ledgers" in listing.stdout

    html = tmp_path / "report.html"
    report = bkaudit("report", "--warehouse", wh, "--out", str(html), env=env)
    assert report.returncode == 0, failure(report)
    page = html.read_text()
    assert all(r["run_id"] in page for r in runs)

    monkeypatch.setenv("BKAUDIT_WAREHOUSE", wh)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    text = "\n".join(
        str(out.get("text", "")) + str(out.get("data", {}).get("text/plain", ""))
        for cell in nb.cells if cell.cell_type == "code" for out in cell.get("outputs", [])
    )  # fmt: skip
    errors = [
        out.get("evalue") for cell in nb.cells if cell.cell_type == "code"
        for out in cell.get("outputs", []) if out.output_type == "error"
    ]  # fmt: skip
    assert not errors, errors
    assert latest["run_id"] in text, text[-3000:]

    # The DAG's branch task, in Airflow's virtualenv, finds its own run among the demo's.
    when = datetime(2026, 12, 1, 3, tzinfo=timezone.utc)
    mine = RunRecord(f"airflow-{when:%Y%m%dT%H%M%S}-audit-t1", when, "zk:2181", "lost",
                     RunStatus.COMPLETED)  # fmt: skip
    mine.finished_at, mine.counts = when, {"fragments": 0}
    delta.append_rows(wh, AUDIT_RUNS, [mine.as_row()])
    aws = {k: v for k, v in env.items() if k.startswith("AWS_")}
    out = run_checker(
        tmp_path, {"conf": {"warehouse": wh}, "branch": [dag_run(when)]},
        BKAUDIT_ZK="zk:2181", BKAUDIT_WAREHOUSE=wh, **aws,
    )  # fmt: skip
    assert out["branch"] == [{"branch": "no_findings", "pushed": {"audit_run_id": mine.run_id}}]
