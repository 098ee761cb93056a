"""What the watch's metrics say, rendered as Prometheus scrapes them: unknown findings are
counted (never as a severity), per bookie, the version, the schedule, the lost bookies and
the ZooKeeper budget's counters, which neither drop nor count twice while an audit runs
on a share of the budget."""

from __future__ import annotations

import re
import time

from bklib.audit.model import Finding
from bklib.meta.stores.zookeeper.budget import request_budget, shared_budget
from bklib.states import CountKey, Reason, Severity
from bklib.testing.metrics_page import samples
from bklib.version import package_version
from jobs.watch.metrics import WatchMetrics


def _samples(m: WatchMetrics) -> dict[str, float]:
    return samples(m.render().decode())


def _finding(lid: int, bookie: str, reason: str, severity: str | None) -> Finding:
    return Finding(
        ledger_id=lid,
        segment_index=0,
        segment_first_entry_id=0,
        segment_last_entry_id=9,
        bookie_index=0,
        bookie_id=bookie,
        reason=reason,
        severity=severity,
    )


def test_unknown_findings_are_counted_apart_and_per_bookie() -> None:
    m = WatchMetrics()
    findings = [
        _finding(1, "b1:3181", Reason.BOOKIE_UNREACHABLE, None),
        _finding(2, "b1:3181", Reason.BOOKIE_UNREACHABLE, None),
        _finding(3, "b2:3181", Reason.ENTRIES_MISSING, Severity.BELOW_WQ),
        _finding(4, "b3:3181", Reason.PLACEMENT_VIOLATION, None),
    ]
    counts = {
        CountKey.reason(Reason.BOOKIE_UNREACHABLE): 2,
        CountKey.METADATA_ERRORS: 1,
        CountKey.LEDGERS_UNACCOUNTED: 2,
    }
    m.set_unknown("sample", findings, counts)
    s = _samples(m)
    assert s['bkaudit_unknown_fragments{check="sample"}'] == 2
    assert s['bkaudit_unread_ledgers{check="sample"}'] == 3
    per_bookie = "bkaudit_bookie_underreplicated_fragments"
    assert s[f'{per_bookie}{{bookie="b1:3181",check="sample",reason="BOOKIE_UNREACHABLE"}}'] == 2
    assert s[f'{per_bookie}{{bookie="b2:3181",check="sample",reason="ENTRIES_MISSING"}}'] == 1
    assert not [k for k in s if "b3:3181" in k]  # placement is not under-replication
    # The next audit of the check no longer names b1: its series goes, the other check's stay.
    m.set_unknown("lost", findings[:1], {})
    m.set_unknown("sample", findings[2:3], {})
    s = _samples(m)
    assert s['bkaudit_unknown_fragments{check="sample"}'] == 0
    assert s['bkaudit_unread_ledgers{check="sample"}'] == 0
    assert sorted(k for k in s if k.startswith(per_bookie)) == [
        f'{per_bookie}{{bookie="b1:3181",check="lost",reason="BOOKIE_UNREACHABLE"}}',
        f'{per_bookie}{{bookie="b2:3181",check="sample",reason="ENTRIES_MISSING"}}',
    ]


def test_version_schedule_start_and_lost_bookies() -> None:
    before = time.time()
    m = WatchMetrics()
    m.set_schedule({"lost": 86400.0, "sample": 604800.0})
    m.set_lost({"b1:3181": 100.0}, 160.0)  # monotonic: lost a minute ago
    after = time.time()
    s = _samples(m)
    assert s[f'bkaudit_build_info{{version="{package_version()}"}}'] == 1
    assert s['bkaudit_audit_interval_seconds{check="sample"}'] == 604800
    assert before <= s["bkaudit_watch_start_time_seconds"] <= after
    since = s['bkaudit_lost_bookie_since_timestamp_seconds{bookie="b1:3181"}']
    assert before - 60 <= since <= after - 60
    m.set_lost({}, 170.0)  # repaired: no series left
    assert not [k for k in _samples(m) if k.startswith("bkaudit_lost_bookie_since")]


def test_the_zookeeper_budget_counters_hold_across_an_audits_share() -> None:
    m = WatchMetrics()
    start = _samples(m)["bkaudit_zk_requests_total"]
    whole = request_budget()
    for _ in range(3):
        whole.acquire()
    assert _samples(m)["bkaudit_zk_requests_total"] == start + 3
    with shared_budget(2):
        share = request_budget()
        assert share is not whole
        share.acquire()
        share.acquire()
        assert _samples(m)["bkaudit_zk_requests_total"] == start + 5
    # The share's requests were added to the whole: counted once.
    s = _samples(m)
    assert s["bkaudit_zk_requests_total"] == start + 5
    assert s["bkaudit_zk_request_wait_seconds_total"] >= 0
    limit = s["bkaudit_zk_request_rate_limit"]
    assert limit == (whole.rate if whole.rate is not None else float("inf"))
    assert re.search(r"^# TYPE bkaudit_zk_requests_total counter", m.render().decode(), re.M)
