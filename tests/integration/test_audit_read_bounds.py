"""The replica check's per-bookie bounds on a real sandbox: probes of many (ledger, bookie)
pairs run at once, yet no bookie ever has more than ``reads_in_flight`` entries outstanding
from one checker, and none is read faster than ``read_rate`` bytes/s (plus the limiter's one
second of budget). The answers are the same as an unbounded check's."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest

from bklib.audit.checker import CheckSettings
from bklib.audit.engine import check_ledgers
from bklib.audit.model import LedgerView
from bklib.client.pool import BookieClientPool
from bklib.errors import BKError
from bklib.meta.model import LedgerMetadata
from bklib.states import Check, ReplicaStatus
from tests.audit_helpers import AuditCluster, audit_cluster

pytestmark = pytest.mark.integration

LEDGERS = 24
ENTRIES = 120


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, zk_server: Any
) -> Iterator[tuple[AuditCluster, list[LedgerMetadata]]]:
    base = tmp_path_factory.mktemp("audit-bounds")
    with zk_server.private_chroot() as hosts, audit_cluster(base, hosts, bookies=3) as c:
        ens = c.bookie_ids
        yield c, [c.ledger(ens, ENTRIES, wq=2, aq=2) for _ in range(LEDGERS)]


class _Meter:
    """Wraps the pool's entry reads: entries outstanding per bookie (and at most, over the
    run), bytes answered per bookie, and the most requests outstanding at once overall."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.outstanding: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()
        self.total_peak = 0
        self.bytes: Counter[str] = Counter()
        counts: tuple[tuple[str, Callable[[tuple[Any, ...]], int]], ...] = (
            ("read", lambda a: 1),
            ("batch_read", lambda a: a[3]),
            ("read_many", lambda a: len(a[1])),
        )
        for name, count_of in counts:
            monkeypatch.setattr(
                BookieClientPool, name, self._wrap(getattr(BookieClientPool, name), count_of)
            )

    def _wrap(
        self, method: Callable[..., Awaitable[Any]], count_of: Callable[[tuple[Any, ...]], int]
    ) -> Callable[..., Awaitable[Any]]:
        meter = self

        async def wrapped(pool: BookieClientPool, *args: Any, **kw: Any) -> Any:
            bookie, n = args[0], count_of(args)
            meter.outstanding[bookie] += n
            meter.peak[bookie] = max(meter.peak[bookie], meter.outstanding[bookie])
            meter.total_peak = max(meter.total_peak, sum(meter.outstanding.values()))
            try:
                res = await method(pool, *args, **kw)
            finally:
                meter.outstanding[bookie] -= n
            answers = res if isinstance(res, list) else [res]
            # A batch answers bodies, a request group a ReadResult or an error per read.
            bodies = [
                a if isinstance(a, bytes) else a.body for a in answers if not isinstance(a, BKError)
            ]
            meter.bytes[bookie] += sum(len(b) for b in bodies)
            return res

        return wrapped


def _check(
    c: AuditCluster,
    mds: list[LedgerMetadata],
    settings: CheckSettings,
    check: str = Check.DEEP,
) -> dict[Any, Any]:
    views = [LedgerView.from_metadata(md, f"/ledgers/L{md.ledger_id}", 0) for md in mds]
    out: dict[Any, Any] = defaultdict(dict)
    for ledger, reports, findings in check_ledgers(
        views, frozenset(), check, client=c.client, settings=settings
    ):
        assert findings == [], findings
        for r in reports:
            out[ledger.ledger_id][r.bookie_id] = (r.status, r.entries, r.bad_entries)
    return out


@pytest.mark.parametrize(
    ("check", "batched", "bound"),
    [(Check.DEEP, True, 3), (Check.DEEP, False, 4), (Check.SAMPLE, False, 4)],
    ids=["batch-reads", "request-groups", "sampled-across-ledgers"],
)
def test_each_bookie_keeps_its_reads_in_flight_bound_while_probes_overlap(
    cluster: tuple[AuditCluster, list[LedgerMetadata]],
    monkeypatch: pytest.MonkeyPatch,
    check: str,
    batched: bool,
    bound: int,
) -> None:
    c, mds = cluster
    batching = frozenset(c.bookie_ids) if batched else frozenset()
    # The sample reads a third of each fragment besides its ends, the same picks each time.
    base = CheckSettings(batch_read=batching, verify_percentage=33.0, sample_seed=5)
    unbounded = _check(c, mds, base, check)
    meter = _Meter(monkeypatch)
    bounded = _check(c, mds, replace(base, reads_in_flight=bound), check)
    assert bounded == unbounded
    assert all(v[0] == ReplicaStatus.OK for per in bounded.values() for v in per.values())
    assert set(meter.peak) == set(c.bookie_ids)
    assert max(meter.peak.values()) <= bound, meter.peak
    # Several bookies (or ledgers) were being read at the same moment.
    assert meter.total_peak > bound, meter.total_peak


def test_read_rate_caps_the_bytes_read_from_each_bookie(
    cluster: tuple[AuditCluster, list[LedgerMetadata]], monkeypatch: pytest.MonkeyPatch
) -> None:
    c, mds = cluster
    meter = _Meter(monkeypatch)
    rate = 30_000.0
    t = time.monotonic()
    _check(c, mds, CheckSettings(batch_read=frozenset(c.bookie_ids), read_rate=rate))
    elapsed = time.monotonic() - t
    # Unthrottled, this reads each bookie's share in well under a second.
    assert min(meter.bytes.values()) > 3 * rate, meter.bytes
    for bookie, nbytes in meter.bytes.items():
        # The bucket starts with one second of budget; the last answer is charged after it
        # arrives, so one batch (64 small entries here) may overshoot.
        assert nbytes <= rate * (elapsed + 1) + 64 * 200, (bookie, nbytes, elapsed)
