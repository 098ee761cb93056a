"""The S3 credentials never leave the AWS environment (docs/tables.md, "Object storage"): a
whole story on an S3 warehouse, verbose, with each engine (an audit in-process and on Spark,
a repair, the watch, the listing, the HTML report, maintain), and then a scan for the secret
key, and the access key id, in every output line, every process argument seen while the
commands ran (their children too: Spark's JVM, its Python workers), every object in the
bucket (tables, logs, data files) and the report."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from bklib.testing.s3server import S3Server
from jobs.tables.schema import AUDIT_RUNS
from tests.audit_helpers import audit_cluster
from tests.cli_helpers import REPO
from tests.integration.test_watch import ledgers, repaired, rows, wait_for, watching
from tests.objectstore.conftest import aws_env, use_aws_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

SECRET = "bkaudit-S3-secret-7f3a9c1e5d"
ACCESS_KEY = "bkaudit-s3-key-42b8"


def _run(
    argv: list[str], env: dict[str, str], argvs: list[str]
) -> subprocess.CompletedProcess[str]:
    """``bkaudit ARGV`` to its end, noting the command line of it and of every process it
    starts (sampled every 50 ms) in ``argvs``."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobs.cli", "-v", *argv], cwd=REPO, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    me = psutil.Process(proc.pid)
    out: list[str] = []
    import threading

    reader = threading.Thread(target=lambda: out.append(proc.communicate(timeout=600)[0] or ""))
    reader.start()
    while proc.poll() is None:
        with contextlib.suppress(psutil.Error):
            for p in [me, *me.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    argvs.append(" ".join(p.cmdline()))
        time.sleep(0.05)
    reader.join(60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, "".join(out), "")


def _leaks(text: str) -> list[str]:
    return [s for s in (SECRET, ACCESS_KEY) if s in text]


def test_no_credential_in_any_output_argument_table_or_report(
    tmp_path: Path, zk_chroot: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    argvs: list[str] = []
    outputs: list[str] = []
    with S3Server(tmp_path / "s3", access_key=ACCESS_KEY, secret_key=SECRET) as s3:
        env = aws_env(s3)
        use_aws_env(monkeypatch, env)
        wh = s3.make_bucket("secrets") + "/wh"
        with audit_cluster(tmp_path / "sb", zk_chroot, bookies=4) as c:
            victim = c.bookie_ids[3]
            ids = [md.ledger_id for md in ledgers(c, victim, n=2, entries=5)]
            c.sandbox.kill_bookie(victim)
            c.sandbox.wait_unregistered(victim)
            for argv in (
                ["audit", "--zk", c.zk, "--warehouse", wh, "--check", "lost"],
                ["audit", "--zk", c.zk, "--warehouse", wh, "--check", "lost",
                 "--executor", "spark"],
                ["rereplicate", "--zk", c.zk, "--warehouse", wh, "--grace-period", "0s"],
                ["listunderreplicated", "--warehouse", wh],
                ["report", "--warehouse", wh, "--out", str(tmp_path / "report.html")],
                ["maintain", "--warehouse", wh],
            ):  # fmt: skip
                proc = _run(argv, env, argvs)
                outputs.append(proc.stdout)
                assert proc.returncode in (0, 1), (argv, proc.stdout[-3000:])
            assert repaired(c, ids, victim)
            before = len(rows(wh, AUDIT_RUNS))
            with watching(c.zk, wh, tmp_path, "w1") as w:
                w.wait_role("leader")
                wait_for(lambda: len(rows(wh, AUDIT_RUNS)) > before, 60, "its audit's row", w)
                me = psutil.Process(w.proc.pid)
                argvs += [" ".join(p.cmdline()) for p in [me, *me.children(recursive=True)]]
            outputs.append(w.log.read_text(errors="replace"))
        objects = [p for p in s3.buckets.joinpath("secrets").rglob("*") if p.is_file()]
    assert len(argvs) > 10 and any("java" in a for a in argvs), argvs[:5]  # Spark's JVM seen
    assert any("_delta_log" in str(p) for p in objects) and any(
        p.suffix == ".parquet" for p in objects
    )
    report = (tmp_path / "report.html").read_text()
    for where, text in (
        ("output", "\n".join(outputs)),
        ("a process argument", "\n".join(argvs)),
        ("the HTML report", report),
        *((f"object {p}", p.read_bytes().decode("latin-1")) for p in objects),
    ):
        assert not _leaks(text), f"a credential in {where}"
    assert "s3://secrets/wh" in "\n".join(outputs)  # the scan read what the commands said
