"""whatif and topics on an all-Java cluster: three Java bookies (DbLedgerStorage), ledgers
written by the Java BookKeeper 4.17 client (four JVMs with the client's).

* Topics: the Java client writes Pulsar-shaped custom metadata (``component``,
  ``pulsar/managed-ledger``, ``pulsar/schemaId``); the audit's ``ledgers`` table and whatif's
  output carry the decoded topic.
* whatif agrees with reality: ``bkaudit whatif`` predicts, on the healthy cluster, which
  ledgers one bookie (then two) failing would leave below AQ or with no replica; the bookies
  are then killed and ``bkaudit audit --check lost`` must report exactly those ledgers as
  BELOW_AQ / NO_REPLICA.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bklib.testing.zkserver import ZooKeeperServer
from jobs.tables import delta
from jobs.tables.schema import LEDGERS
from tests.interop.conftest import InteropCluster, build_cluster
from tests.interop.harness import REPO, JavaClient, payloads

pytestmark = pytest.mark.interop

ORDERS = "persistent://acme/orders/created events"
SCHEMA = "persistent://acme/orders/paid"
PULSAR_ML = {
    "application": b"pulsar",
    "component": b"managed-ledger",
    "pulsar/managed-ledger": b"acme/orders/persistent/created%20events",
}
PULSAR_SCHEMA = {"application": b"pulsar", "component": b"schema",
                 "pulsar/schemaId": b"acme/orders/paid"}  # fmt: skip


@pytest.fixture(scope="module")
def cluster(
    bk_classpath: str, zk_server: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[InteropCluster]:
    """Three Java bookies; short ZooKeeper sessions so a killed bookie unregisters fast."""
    base = tmp_path_factory.mktemp("whatif-java")
    with (
        zk_server.private_chroot("whatif-java") as connect,
        build_cluster(
            bk_classpath, connect, base, java=3, init="bklib", bookie_conf={"zkTimeout": 4000}
        ) as c,
    ):
        yield c


def _bkaudit(*args: str, ok: tuple[int, ...] = (0,)) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "jobs.cli", *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode in ok, (args, proc.stdout[-3000:], proc.stderr[-3000:])
    return proc.stdout


def _section(text: str, start: str, stop: str) -> set[int]:
    """Ledger ids listed in whatif's section from the line starting ``start`` to ``stop``."""
    lines = text.splitlines()
    i = next(k for k, x in enumerate(lines) if x.startswith(start))
    out = set()
    for x in lines[i + 1 :]:
        if x.startswith(stop):
            break
        out.add(int(x.split()[1]))
    return out


def _whatif(c: InteropCluster, bookies: list[str], *extra: str) -> tuple[set[int], set[int], str]:
    """(ledgers below AQ, ledgers lost, the output) of ``bkaudit whatif``."""
    out = _bkaudit("whatif", "--zk", c.connect, "--bookie", ",".join(bookies), *extra)
    below = _section(out, "ledgers that would fall below AQ", "ledgers that would have no")
    lost = _section(out, "ledgers that would have no replica", "open ledgers whose writer")
    return below, lost, out


def _audit(c: InteropCluster, wh: str) -> list[dict[str, Any]]:
    _bkaudit("audit", "--zk", c.connect, "--warehouse", wh, "--check", "lost",
             "--executor", "local")  # fmt: skip
    run = delta.latest_run(wh)
    assert run is not None
    return delta.run_fragments(wh, run["run_id"])


def _kill(c: InteropCluster, index: int) -> None:
    bookie = c.java[index]
    bookie.kill9()
    path = f"/ledgers/available/{bookie.bookie_id}"
    deadline = time.monotonic() + 60
    while c.zk.exists(path) and time.monotonic() < deadline:
        time.sleep(0.2)  # waiting for the ZooKeeper session to expire
    assert not c.zk.exists(path)


def _write(c: InteropCluster, client: JavaClient, name: str, bookies: list[str], wq: int,
           aq: int, n: int = 20, close: bool = True, custom: Any = None) -> int:  # fmt: skip
    return client.write(c.uri, payloads(f"whatif-{name}", n, size=200), ensemble=len(bookies),
                        write_quorum=wq, ack_quorum=aq, close=close, bookies=bookies,
                        custom=custom)  # fmt: skip


def test_topics_from_the_java_client(
    cluster: InteropCluster, java_client: JavaClient, tmp_path: Path
) -> None:
    c = cluster
    j0, j1, j2 = c.java_ids
    orders = _write(c, java_client, "topic-orders", [j0, j1], 2, 2, custom=PULSAR_ML)
    schema = _write(c, java_client, "topic-schema", [j1, j2], 2, 2, custom=PULSAR_SCHEMA)
    plain = _write(c, java_client, "no-topic", [j0, j2], 2, 1, custom={"application": b"demo"})

    wh = str(tmp_path / "wh")
    _bkaudit("audit", "--zk", c.connect, "--warehouse", wh, "--check", "lost",
             "--executor", "local")  # fmt: skip
    rows = {r["ledger_id"]: r for r in delta.read_rows(wh, LEDGERS)}
    assert (rows[orders]["topic"], rows[orders]["component"]) == (ORDERS, "managed-ledger")
    assert (rows[schema]["topic"], rows[schema]["component"]) == (SCHEMA, "schema")
    assert (rows[plain]["topic"], rows[plain]["component"]) == (None, None)

    below, _, out = _whatif(c, [j1])
    assert {orders, schema} <= below
    assert f"ledger {orders}  CLOSED  20 entries below AQ  topic {ORDERS}" in out, out
    assert f"ledger {schema}  CLOSED  20 entries below AQ  topic {SCHEMA}" in out, out
    assert f"  {ORDERS}: 1 ledgers below AQ, 0 lost (0 entries), 0 writers blocked" in out, out


@pytest.mark.timeout(900)
def test_whatif_agrees_with_the_audit_after_the_kill(
    cluster: InteropCluster, java_client: JavaClient, tmp_path: Path
) -> None:
    c = cluster
    j0, j1, j2 = c.java_ids
    layouts = {
        # j0 alone: one replica left of two (below AQ)
        "e2": ([j0, j1], 2, 2, 20, True),
        # residues 0 and 2 keep one replica; with j1 too, residue 0 keeps none
        "e3w2": ([j0, j1, j2], 2, 2, 20, True),
        # WQ=1: j0's entries have no other copy (lost)
        "wq1": ([j0, j2], 1, 1, 20, True),
        # two of three left: AQ holds for j0 alone, not with j1
        "e3w3": ([j0, j1, j2], 3, 2, 20, True),
        # AQ=1 keeps one copy: j0 alone harms nothing; with j1 the entries are lost
        "aq1": ([j1, j0], 2, 1, 20, True),
        # not on j0; below AQ with j1
        "j1j2": ([j1, j2], 2, 2, 20, True),
        # an open ledger (the Java writer keeps it open): judged on every residue
        "open": ([j0, j2], 2, 2, 12, False),
    }
    ids = {
        name: _write(c, java_client, name, bookies, wq, aq, n, close)
        for name, (bookies, wq, aq, n, close) in layouts.items()
    }
    # with a topic: whatif names it
    ids["topic"] = _write(c, java_client, "topic", [j2, j0], 2, 2, custom=PULSAR_ML)
    mine = set(ids.values())
    on_j1 = {ids[k] for k, v in layouts.items() if j1 in v[0]}

    # ---- predictions on the healthy cluster ------------------------------------------------
    below1, lost1, out1 = _whatif(c, [j0])
    below2, lost2, out2 = _whatif(c, [j0, j1])
    assert "verdict: UNSAFE" in out1 and "verdict: UNSAFE" in out2
    assert ORDERS in out1
    below1, lost1, below2, lost2 = (s & mine for s in (below1, lost1, below2, lost2))
    assert below1 == {ids[k] for k in ("e2", "e3w2", "wq1", "open", "topic")}, out1
    assert lost1 == {ids["wq1"]}, out1
    assert below2 == mine, out2
    assert lost2 == {ids[k] for k in ("e2", "e3w2", "wq1", "aq1")}, out2

    def audited(frags: list[dict[str, Any]]) -> tuple[set[int], set[int]]:
        frags = [f for f in frags if f["ledger_id"] in mine]
        below = {f["ledger_id"] for f in frags if f["severity"] in ("BELOW_AQ", "NO_REPLICA")}
        lost = {f["ledger_id"] for f in frags if f["severity"] == "NO_REPLICA"}
        return below, lost

    wh = str(tmp_path / "wh")
    # ---- reality: j0 dies ------------------------------------------------------------------
    _kill(c, 0)
    assert audited(_audit(c, wh)) == (below1, lost1)
    # j0 already lost (not registered): failing j1 next harms the ledgers j1 holds exactly as
    # the two-bookie prediction said (the others are j0's doing, not j1's).
    below, lost, _ = _whatif(c, [j1], "--warehouse", wh)
    assert (below & mine, lost & mine) == (below2 & on_j1, lost2 & on_j1)

    # ---- reality: j1 dies too --------------------------------------------------------------
    _kill(c, 1)
    assert audited(_audit(c, wh)) == (below2, lost2)
