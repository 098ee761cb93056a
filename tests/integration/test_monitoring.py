"""The shipped Grafana dashboard and Prometheus rules (deploy/monitoring) parse as PromQL, cover
what an operator must be told, and name only metrics a running ``bkaudit watch`` exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml

from tests.audit_helpers import audit_cluster
from tests.cli_helpers import REPO
from tests.integration.test_watch import wait_for, watching
from tests.promtool import run_rule_tests, scraped_series

pytestmark = pytest.mark.integration

MONITORING = REPO / "deploy" / "monitoring"
_METRIC = re.compile(r"\b(bkaudit_[a-z_]+)\b")
_SELECTOR = re.compile(r"\b(bkaudit_[a-z_]+)\{([^}]*)\}")
_TARGET_LABELS = {"cluster", "instance", "job"}
"""Labels Prometheus attaches to every series it scrapes (``cluster`` by a relabelling or an
external label, docs/monitoring.md), not the watch."""
_TYPE_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
}


def _rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load((MONITORING / "bkaudit-alerts.yaml").read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def _panel_exprs() -> list[str]:
    doc = json.loads((MONITORING / "bkaudit-dashboard.json").read_text())
    return [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]


def test_every_expression_is_promql_and_every_rule_is_complete() -> None:
    rules = _rules()
    assert rules
    for rule in rules:
        promql_parser.parse(rule["expr"])
        assert re.fullmatch(r"Bkaudit[A-Za-z]+", rule["alert"])
        assert rule["labels"]["severity"] in ("critical", "warning", "info")
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
    for expr in _panel_exprs():
        promql_parser.parse(expr)


def _alerting_on(metric: str, selector: str = "") -> list[str]:
    return [r["alert"] for r in _rules() if metric in r["expr"] and selector in r["expr"]]


def test_the_rules_cover_what_an_operator_must_be_told() -> None:
    assert _alerting_on("bkaudit_underreplicated_ledgers", 'severity="NO_REPLICA"')
    assert [r for r in _rules() if "bkaudit_underreplicated_ledgers" in r["expr"] and r.get("for")]
    # unknown is neither present nor missing: its own alerts
    assert _alerting_on("bkaudit_unknown_fragments")
    assert _alerting_on("bkaudit_unread_ledgers")
    # stale audits, by the watch's own schedule, also when none ever finished
    (stale,) = _alerting_on("bkaudit_last_audit_timestamp_seconds", "bkaudit_audit_interval")
    assert stale in _alerting_on("bkaudit_watch_start_time_seconds")
    # time to repair, running and done
    assert _alerting_on("bkaudit_lost_bookie_since_timestamp_seconds")
    assert _alerting_on("bkaudit_time_to_repair_seconds_bucket")
    assert _alerting_on("bkaudit_watch_leader")
    assert _alerting_on("bkaudit_repair_actions_total", 'status="FAILED"')
    assert _alerting_on("bkaudit_spooled_rows")
    assert _alerting_on("bkaudit_zk_session_losses_total")
    # the bookie index: any reconciliation difference (a bug), a stale index on the leader,
    # and a slow reaction to a loss (its marks), the delay taken off
    assert _alerting_on("bkaudit_index_differences_total")
    (stale_index,) = _alerting_on("bkaudit_index_stale", "bkaudit_watch_leader == 1")
    assert stale_index in [r["alert"] for r in _rules() if r.get("for")]
    (slow,) = _alerting_on("bkaudit_loss_reaction_seconds", 'stage="marked"')
    assert slow in _alerting_on("bkaudit_lost_bookie_recovery_delay_seconds")


_GROUPING = re.compile(r"\b(?:by|on)\s*\(([^)]*)\)")


def test_every_rule_keeps_the_cluster_and_every_panel_selects_it() -> None:
    # One Prometheus, several clusters: the rules never mix them (every grouping keeps
    # `cluster`), and the dashboard shows the clusters its variable selects.
    for rule in _rules():
        for group in _GROUPING.findall(rule["expr"]):
            assert "cluster" in group, (rule["alert"], group)
        # an aggregation without `by` would merge the clusters
        assert not re.search(r"\b(?:max|min|sum|avg|count)\s*\(", rule["expr"]), rule["alert"]
    doc = json.loads((MONITORING / "bkaudit-dashboard.json").read_text())
    assert "cluster" in [v["name"] for v in doc["templating"]["list"]]
    for expr in _panel_exprs():
        selectors = re.findall(r"\bbkaudit_[a-z_]+(\{[^}]*\})?", expr)
        assert selectors and all('cluster=~"$cluster"' in s for s in selectors), expr


def _exported(text: str) -> tuple[set[str], set[str], dict[str, set[str]]]:
    """(families, sample names, label names seen per sample name) of a /metrics page."""
    families: set[str] = set()
    names: set[str] = set()
    labels: dict[str, set[str]] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split()
            # the text format names a counter's family with its _total already
            family = family.removesuffix("_total") if kind == "counter" else family
            if family.endswith("_created"):  # a counter's or histogram's start time
                names.add(family)
                continue
            families.add(family)
            names.update(family + s for s in _TYPE_SUFFIXES[kind])
        elif line and not line.startswith("#"):
            name, _, rest = line.partition("{")
            if rest:
                labels.setdefault(name, set()).update(re.findall(r'(\w+)="', rest))
    return families, names, labels


def test_the_dashboard_and_rules_name_only_what_a_running_watch_exports(
    tmp_path: Path, zk_chroot: str
) -> None:
    with (
        audit_cluster(tmp_path / "sb", zk_chroot, bookies=3) as c,
        watching(c.zk, str(tmp_path / "wh"), tmp_path, "w1") as w,
    ):
        w.wait_role("leader")
        status, page = w.get("/metrics")
    assert status == 200
    families, names, labels = _exported(page)
    assert {f for f in families if f.startswith("bkaudit_")}, page
    exprs = [r["expr"] for r in _rules()] + _panel_exprs()
    named = {m for e in exprs for m in _METRIC.findall(e)}
    assert named - names == set(), f"not exported by the watch: {sorted(named - names)}"
    for expr in exprs:
        for metric, matchers in _SELECTOR.findall(expr):
            used = set(re.findall(r"(\w+)\s*=~?", matchers)) - _TARGET_LABELS
            if metric in labels:  # labelled samples present: their label names must match
                assert used <= labels[metric], (expr, labels[metric])
    # ...and the dashboard shows every family the watch exports.
    shown = {m for e in _panel_exprs() for m in _METRIC.findall(e)}
    unshown = {f for f in families if f.startswith("bkaudit_")} - {
        re.sub(r"_(total|bucket|sum|count|created)$", "", m) for m in shown
    }
    assert not unshown, f"exported but on no dashboard panel: {sorted(unshown)}"


def test_the_index_alerts_read_a_running_watchs_scrape(tmp_path: Path, zk_chroot: str) -> None:
    # promtool on a real leader's page, held 20 minutes: a built index fires nothing; the
    # same page with the index stale fires BkauditIndexStale, for the leader's cluster.
    target = {"cluster": "c1", "instance": "w1:9464", "job": "bkaudit"}
    with audit_cluster(tmp_path / "sb", zk_chroot, bookies=3) as c:
        for _ in range(2):
            c.ledger(c.bookie_ids, 4, wq=3, aq=2)
        with watching(c.zk, str(tmp_path / "wh"), tmp_path, "w1") as w:
            w.wait_role("leader")
            stale = "bkaudit_index_stale"
            wait_for(lambda: w.metrics().get(stale) == 0, 60, "the take-over's index", w)
            status, page = w.get("/metrics")
    assert status == 200
    assert "\nbkaudit_index_ledgers 2.0\n" in page, page  # built from this cluster's scan
    held = scraped_series(page, target, samples=21)
    index_alerts = ("BkauditIndexDiffersFromScan", "BkauditIndexStale", "BkauditSlowLossReaction")
    flipped = [
        {**s, "values": " ".join(["1"] * 21)} if s["series"].startswith(stale + "{") else s
        for s in held
    ]
    assert flipped != held
    out = run_rule_tests(
        tmp_path,
        [
            {
                "interval": "1m",
                "input_series": held,
                "alert_rule_test": [
                    {"eval_time": "20m", "alertname": a, "exp_alerts": []} for a in index_alerts
                ],
            },
            {
                "interval": "1m",
                "input_series": flipped,
                "alert_rule_test": [
                    {"eval_time": "10m", "alertname": "BkauditIndexStale", "exp_alerts": []},
                    {
                        "eval_time": "20m",
                        "alertname": "BkauditIndexStale",
                        "exp_alerts": [{"exp_labels": {"severity": "warning", "cluster": "c1"}}],
                    },
                ],
            },
        ],
    )
    assert out.returncode == 0, out.stdout + out.stderr
