"""The shipped alerting rules, evaluated by Prometheus's own engine (``promtool test rules``)
over synthetic series: each alert fires when it should and stays silent when it should not.

Every case has a standby instance (``bkaudit_watch_leader`` 0) keeping stale values, which
must never fire a cluster alert, and a second cluster, which must keep its own label."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.cli_helpers import REPO
from tests.promtool import ALERTS, check_rules, run_rule_tests, series

LEADER = {"cluster": "c1", "instance": "w1:9464", "job": "bkaudit"}
STANDBY = {**LEADER, "instance": "w2:9464"}
HOUR, DAY = 3600, 86400


def _on(base: dict[str, str], **labels: str) -> dict[str, str]:
    return {**base, **labels}


def _fires(alert: str, at: str, *labels: dict[str, str]) -> dict[str, Any]:
    return {"eval_time": at, "alertname": alert, "exp_alerts": [{"exp_labels": x} for x in labels]}


def _run(tmp_path: Path, *groups: dict[str, Any]) -> None:
    out = run_rule_tests(tmp_path, groups)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_shipped_rules_and_their_templates_check() -> None:
    out = check_rules()
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_chart_ships_the_same_files_as_deploy_monitoring() -> None:
    # One source: deploy/monitoring links to the chart's files (the chart cannot read
    # outside its directory), so the two can never differ.
    for name in ("bkaudit-alerts.yaml", "bkaudit-dashboard.json"):
        link = REPO / "deploy" / "monitoring" / name
        assert link.is_symlink(), f"{link} must link to the chart's copy"
        assert link.resolve() == (REPO / "deploy" / "helm" / "bkaudit" / "files" / name).resolve()


def test_unknown_findings_and_unread_ledgers_fire_from_the_leader_only(tmp_path: Path) -> None:
    other = {"cluster": "c2", "instance": "w3:9464", "job": "bkaudit"}
    _run(
        tmp_path,
        {
            "interval": "1m",
            "input_series": [
                series("bkaudit_watch_leader", LEADER, "1x30"),
                series("bkaudit_watch_leader", STANDBY, "0x30"),
                series("bkaudit_watch_leader", other, "1x30"),
                # the leader's sample audit meets a bookie that does not answer at 10m
                series("bkaudit_unknown_fragments", _on(LEADER, check="sample"), "0x9 4x20"),
                series("bkaudit_unknown_fragments", _on(LEADER, check="lost"), "0x30"),
                # a standby's stale figure, and another cluster with nothing unknown
                series("bkaudit_unknown_fragments", _on(STANDBY, check="sample"), "7x30"),
                series("bkaudit_unknown_fragments", _on(other, check="sample"), "0x30"),
                series("bkaudit_unread_ledgers", _on(LEADER, check="lost"), "0x19 2x10"),
                series("bkaudit_unread_ledgers", _on(STANDBY, check="lost"), "3x30"),
            ],
            "alert_rule_test": [
                _fires("BkauditUnknownFindings", "5m"),
                _fires(
                    "BkauditUnknownFindings",
                    "15m",
                    {"severity": "warning", "cluster": "c1", "check": "sample"},
                ),
                _fires("BkauditUnreadLedgers", "15m"),
                _fires(
                    "BkauditUnreadLedgers",
                    "25m",
                    {"severity": "warning", "cluster": "c1", "check": "lost"},
                ),
            ],
        },
    )


def test_a_stale_audit_fires_also_when_none_ever_finished(tmp_path: Path) -> None:
    def cluster(name: str) -> dict[str, str]:
        return {"cluster": name, "instance": f"{name}:9464", "job": "bkaudit"}

    never, restarted, stale, fresh = (cluster(n) for n in ("never", "restarted", "stale", "fresh"))
    inputs = []
    for c in (never, restarted, stale, fresh):
        inputs += [
            series("bkaudit_watch_leader", c, "1x60"),
            series("bkaudit_audit_interval_seconds", _on(c, check="lost"), f"{DAY}x60"),
            series("bkaudit_audit_interval_seconds", _on(c, check="sample"), f"{7 * DAY}x60"),
        ]
    inputs += [
        # up since 0, no audit ever finished
        series("bkaudit_watch_start_time_seconds", never, "0x60"),
        # no audit ever finished either, but its only instance started at 47h
        series("bkaudit_watch_start_time_seconds", restarted, f"{47 * HOUR}x60"),
        # the last lost audit finished at 1h; a sample audit of a check no longer scheduled
        series("bkaudit_watch_start_time_seconds", stale, "0x60"),
        series("bkaudit_last_audit_timestamp_seconds", _on(stale, check="lost"), f"{HOUR}x60"),
        # audits every hour
        series("bkaudit_watch_start_time_seconds", fresh, "0x60"),
        series("bkaudit_last_audit_timestamp_seconds", _on(fresh, check="lost"), f"0+{HOUR}x60"),
        series("bkaudit_last_audit_timestamp_seconds", _on(fresh, check="deep"), "0x60"),
    ]
    warn = {"severity": "warning", "check": "lost"}
    _run(
        tmp_path,
        {
            "interval": "1h",
            "input_series": inputs,
            "alert_rule_test": [
                _fires("BkauditAuditStale", "47h"),
                _fires("BkauditAuditStale", "49h", {**warn, "cluster": "never"}),
                _fires(
                    "BkauditAuditStale",
                    "50h",
                    {**warn, "cluster": "never"},
                    {**warn, "cluster": "stale"},
                ),
            ],
        },
    )


def test_time_to_repair_alerts(tmp_path: Path) -> None:
    other = {"cluster": "c2", "instance": "w3:9464", "job": "bkaudit"}
    third = {"cluster": "c3", "instance": "w4:9464", "job": "bkaudit"}
    bucket = "bkaudit_time_to_repair_seconds_bucket"
    _run(
        tmp_path,
        {
            "interval": "1h",
            "input_series": [
                series("bkaudit_watch_leader", LEADER, "1x12"),
                series("bkaudit_watch_leader", STANDBY, "0x12"),
                series("bkaudit_watch_leader", other, "1x12"),
                # lost at 0, delay 1h: overdue past 7h
                series(
                    "bkaudit_lost_bookie_since_timestamp_seconds",
                    _on(LEADER, bookie="b1:3181"),
                    "0x12",
                ),
                series("bkaudit_lost_bookie_recovery_delay_seconds", LEADER, f"{HOUR}x12"),
                # a standby's stale view of a bookie long repaired
                series(
                    "bkaudit_lost_bookie_since_timestamp_seconds",
                    _on(STANDBY, bookie="b2:3181"),
                    "0x12",
                ),
                series("bkaudit_lost_bookie_recovery_delay_seconds", STANDBY, "0x12"),
                # c1 finished a repair at 3h that took over 6 h, c2 one that did not; the
                # le values as prometheus_client writes them (c1) and Prometheus 3 stores them
                series("bkaudit_time_to_repair_seconds_count", LEADER, "0 0 0 1x9"),
                series(bucket, _on(LEADER, le="21600.0"), "0x12"),
                series("bkaudit_time_to_repair_seconds_count", other, "0 0 0 1x9"),
                series(bucket, _on(other, le="21600"), "0 0 0 1x9"),
                # a slow one in c3, its le as Prometheus 3 stores it
                series("bkaudit_time_to_repair_seconds_count", third, "0 0 0 1x9"),
                series(bucket, _on(third, le="21600"), "0x12"),
            ],
            "alert_rule_test": [
                _fires("BkauditRepairOverdue", "7h"),
                _fires(
                    "BkauditRepairOverdue",
                    "8h",
                    {
                        "severity": "warning",
                        "cluster": "c1",
                        "instance": "w1:9464",
                        "bookie": "b1:3181",
                    },
                ),
                _fires("BkauditSlowRepairs", "2h"),
                _fires(
                    "BkauditSlowRepairs",
                    "5h",
                    {"severity": "info", "cluster": "c1"},
                    {"severity": "info", "cluster": "c3"},
                ),
            ],
        },
    )


def test_no_replica_fires_from_the_leader_only(tmp_path: Path) -> None:
    ledgers = "bkaudit_underreplicated_ledgers"
    _run(
        tmp_path,
        {
            "interval": "1m",
            "input_series": [
                series("bkaudit_watch_leader", LEADER, "1x10"),
                series("bkaudit_watch_leader", STANDBY, "0x10"),
                series(ledgers, _on(LEADER, check="lost", severity="NO_REPLICA"), "0x4 2x5"),
                series(ledgers, _on(STANDBY, check="lost", severity="NO_REPLICA"), "9x10"),
            ],
            "alert_rule_test": [
                _fires("BkauditNoReplica", "2m"),
                _fires(
                    "BkauditNoReplica",
                    "6m",
                    {"severity": "critical", "cluster": "c1", "check": "lost"},
                ),
            ],
        },
    )


def test_any_index_difference_fires_and_a_restart_does_not(tmp_path: Path) -> None:
    other = {"cluster": "c2", "instance": "w3:9464", "job": "bkaudit"}
    diffs = "bkaudit_index_differences_total"
    _run(
        tmp_path,
        {
            "interval": "1h",
            "input_series": [
                series("bkaudit_watch_leader", LEADER, "1x30"),
                series("bkaudit_watch_leader", STANDBY, "0x30"),
                series("bkaudit_watch_leader", other, "1x30"),
                # the leader's reconciliation at 2h finds one ledger wrong
                series(diffs, LEADER, "0 0 1x28"),
                series(diffs, STANDBY, "0x30"),
                # c2's watch restarts at 3h: its counter resets, with no new difference
                series(diffs, other, "2x2 0x27"),
            ],
            "alert_rule_test": [
                _fires("BkauditIndexDiffersFromScan", "1h"),
                _fires(
                    "BkauditIndexDiffersFromScan",
                    "3h",
                    {"severity": "warning", "cluster": "c1"},
                ),
                _fires(
                    "BkauditIndexDiffersFromScan",
                    "23h",
                    {"severity": "warning", "cluster": "c1"},
                ),
                # a day after the difference, out of the window
                _fires("BkauditIndexDiffersFromScan", "26h"),
            ],
        },
    )


def test_a_stale_index_fires_from_the_leader_after_15_minutes(tmp_path: Path) -> None:
    other = {"cluster": "c2", "instance": "w3:9464", "job": "bkaudit"}
    stale = "bkaudit_index_stale"
    _run(
        tmp_path,
        {
            "interval": "1m",
            "input_series": [
                series("bkaudit_watch_leader", LEADER, "1x50"),
                series("bkaudit_watch_leader", STANDBY, "0x50"),
                series("bkaudit_watch_leader", other, "1x50"),
                # a 10-minute take-over scan builds it; stale again from 21m, never rebuilt
                series(stale, LEADER, "1x9 0x10 1x30"),
                # a standby keeps no index: always stale
                series(stale, STANDBY, "1x50"),
                # c2's take-over builds it in 12 minutes
                series(stale, other, "1x11 0x38"),
            ],
            "alert_rule_test": [
                _fires("BkauditIndexStale", "15m"),
                _fires("BkauditIndexStale", "30m"),
                _fires("BkauditIndexStale", "36m", {"severity": "warning", "cluster": "c1"}),
            ],
        },
    )


def test_a_slow_reaction_to_a_loss_fires_past_the_delay(tmp_path: Path) -> None:
    def cluster(name: str) -> dict[str, str]:
        return {"cluster": name, "instance": f"{name}:9464", "job": "bkaudit"}

    fast, slow = cluster("fast"), cluster("slow")
    count, total = "bkaudit_loss_reaction_seconds_count", "bkaudit_loss_reaction_seconds_sum"
    delay = "bkaudit_lost_bookie_recovery_delay_seconds"

    def loss(c: dict[str, str], seconds: int, stage: str = "marked") -> list[dict[str, str]]:
        """One loss at 20m, ``stage`` reached ``seconds`` after the registration went."""
        return [
            series(count, _on(c, stage=stage), "0 0 1x160"),
            series(total, _on(c, stage=stage), f"0 0 {seconds}x160"),
        ]

    inputs = [
        series("bkaudit_watch_leader", STANDBY, "0x162"),
        # a standby's stale delay must not hide the leader's 0
        series(delay, STANDBY, "3600x162"),
        # c1: no delay, marked in 90 s
        *loss(LEADER, 90),
        # a 300 s delay: marked 30 s past it, the first copy much later (not alerted on)
        *loss(fast, 330),
        *loss(fast, 3000, "first_copy"),
        # a 300 s delay: marked 100 s past it
        *loss(slow, 400),
    ]
    inputs += [series("bkaudit_watch_leader", LEADER, "1x162"), series(delay, LEADER, "0x162")]
    for c in (fast, slow):
        inputs += [series("bkaudit_watch_leader", c, "1x162"), series(delay, c, "300x162")]
    _run(
        tmp_path,
        {
            "interval": "10m",
            "input_series": inputs,
            "alert_rule_test": [
                _fires("BkauditSlowLossReaction", "10m"),
                _fires(
                    "BkauditSlowLossReaction",
                    "1h",
                    {"severity": "info", "cluster": "c1"},
                    {"severity": "info", "cluster": "slow"},
                ),
                # a day after the loss, out of the window
                _fires("BkauditSlowLossReaction", "26h"),
            ],
        },
    )


@pytest.mark.parametrize("wrong", ["silent", "other cluster"])
def test_a_wrong_expectation_fails(tmp_path: Path, wrong: str) -> None:
    # The harness can fail: promtool reports an alert that fires when the test says it
    # does not, or with other labels.
    expected = [] if wrong == "silent" else [{"severity": "warning", "cluster": "c9"}]
    out = run_rule_tests(
        tmp_path,
        [
            {
                "interval": "1m",
                "input_series": [
                    series("bkaudit_watch_leader", LEADER, "1x10"),
                    series("bkaudit_unknown_fragments", _on(LEADER, check="sample"), "3x10"),
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "5m",
                        "alertname": "BkauditUnknownFindings",
                        "exp_alerts": [{"exp_labels": x} for x in expected],
                    }
                ],
            }
        ],
    )
    assert out.returncode != 0
    assert "BkauditUnknownFindings" in out.stdout + out.stderr
    assert ALERTS.exists()
