"""An unresponsive bookie, end to end: registered and connected, it never answers a read. The
watch's scheduled sample audit meets it, exports what it could not learn
(``bkaudit_unknown_fragments``, and the bookie by name), and the shipped alert rules,
evaluated by promtool on that very scrape, fire BkauditUnknownFindings, while nothing reads
the unknown replicas as missing (no NO_REPLICA)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.audit_helpers import audit_cluster
from tests.integration.test_watch import wait_for, watching
from tests.promtool import run_rule_tests, scraped_series

pytestmark = pytest.mark.integration

TARGET = {"cluster": "c1", "instance": "w1:9464", "job": "bkaudit"}
"""The labels Prometheus would attach to the watch's samples."""


def test_an_unresponsive_bookie_fires_the_unknown_findings_alert(
    tmp_path: Path, zk_chroot: str
) -> None:
    with audit_cluster(tmp_path / "sb", zk_chroot, bookies=3) as c:
        silent = c.bookie_ids[0]
        for _ in range(2):  # every bookie holds every entry: no replacement to repair onto
            c.ledger(c.bookie_ids, 8, wq=3, aq=2)
        c.admin(silent).add_fault("drop", op=["READ_ENTRY", "BATCH_READ_ENTRY"])
        with watching(c.zk, str(tmp_path / "wh"), tmp_path, "w1", "--every", "sample=1h") as w:
            w.wait_role("leader")
            unknown = 'bkaudit_unknown_fragments{check="sample"}'
            wait_for(lambda: w.metrics().get(unknown, 0) > 0, 180, unknown, w)
            status, page = w.get("/metrics")
    assert status == 200
    per_bookie = (
        f'bkaudit_bookie_underreplicated_fragments{{bookie="{silent}",check="sample",'
        'reason="BOOKIE_UNREACHABLE"}'
    )
    assert per_bookie in page, page
    for line in page.splitlines():
        if line.startswith('bkaudit_underreplicated_fragments{check="sample"'):
            assert line.endswith(" 0.0"), line  # unknown is not missing: no severity counted
    out = run_rule_tests(
        tmp_path,
        [
            {
                "interval": "1m",
                "input_series": scraped_series(page, TARGET),
                "alert_rule_test": [
                    {
                        "eval_time": "0m",
                        "alertname": "BkauditUnknownFindings",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "warning",
                                    "cluster": "c1",
                                    "check": "sample",
                                }
                            }
                        ],
                    },
                    {"eval_time": "0m", "alertname": "BkauditNoReplica", "exp_alerts": []},
                ],
            }
        ],
    )
    assert out.returncode == 0, out.stdout + out.stderr
