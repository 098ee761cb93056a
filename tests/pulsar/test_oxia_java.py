"""Java BookKeeper on Oxia (Pulsar's metadata driver) and bkaudit on the same cluster.

* **Audit and repair.** Java bookies register on Oxia; the Java client writes ledgers over
  protocol v2 (one left open), drawing ids from the same ``/ledgers/idgen`` counter as bkaudit.
  A bookie is killed; ``audit`` (``lost``, ``sample``, ``replicas``) through
  ``--metadata-uri metadata-store:oxia://`` reports exactly the segments that used it;
  ``rereplicate`` repairs them; the Java client reads every entry back; a second audit is clean.
* **Marks and locks shared with Java AutoRecovery.** With replication disabled, the watch marks
  the ledgers of a killed bookie; Java's ``listunderreplicated`` lists exactly those marks, and
  ``bkaudit listunderreplicated --live`` lists the same.
  Then AutoRecoveryMain starts and replication is enabled: the watch and Java's
  ReplicationWorker race over the same marks and locks, and no fragment is copied twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bklib.meta.model import LedgerState
from bklib.meta.underreplication import UnderReplicationManager
from bklib.states import Check, RunStatus
from jobs.tables import delta
from jobs.tables.schema import FRAGMENTS
from tests.cli_helpers import bkaudit, failure
from tests.interop.autorecovery_tools import (
    AUTORECOVERY_RACE_CONF,
    Watch,
    affected_segments,
    assert_each_fragment_copied_once,
    parse_listunderreplicated,
    wait_converged,
    wait_until,
    write_rotating_ledgers,
    write_story_ledgers,
)
from tests.interop.harness import JavaClient
from tests.pulsar.oxia_java import autorecovery, java_client, oxia_java_cluster

pytestmark = [pytest.mark.integration, pytest.mark.pulsar, pytest.mark.timeout(600)]

PWD = b"oxia-java-pwd"
CONVERGE = 120.0
"""A safety bound on the convergence, not a speed assertion."""


@pytest.fixture(scope="module")
def oxia_java_client(
    pulsar_classpath: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[JavaClient]:
    with java_client(pulsar_classpath, tmp_path_factory.mktemp("oxia-java-client")) as client:
        yield client


def _cli(*args: str) -> str:
    proc = bkaudit(*args, timeout=300)
    assert proc.returncode == 0, failure(proc)
    return proc.stdout


def test_java_cluster_on_oxia_audited_and_repaired_by_bkaudit(
    pulsar_classpath: str, oxia_java_client: JavaClient, tmp_path: Path
) -> None:
    jc = oxia_java_client
    with oxia_java_cluster(pulsar_classpath, tmp_path / "cluster") as c:
        j0, j1, j2, j3 = c.java_ids
        # Java's ids and bkaudit's interleaved: one counter for both languages (Oxia's
        # per-key modification count under idgen).
        drawn: list[int] = []

        def draw_one_too(java_id: int) -> None:
            drawn.extend([java_id, c.store.generate_ledger_id()])

        story = write_story_ledgers(
            jc, c.uri, c.java_ids, PWD, v2=True, tag="oxia", after_each=draw_one_too
        )
        assert drawn == sorted(set(drawn)) and drawn[0] >= 1, drawn
        assert c.zk.children("/ledgers/idgen") == []
        assert c.zk.exists("/ledgers/LAYOUT") is None
        data = dict(story.values())
        ids = {name: lid for name, (lid, _) in story.items()}

        c.java[0].kill9()
        wait_until(
            lambda: c.zk.exists(f"/ledgers/available/{j0}") is None,
            30,
            "the victim's Oxia session to expire",
            c.logs,
        )
        expected = {
            (lid, seg.first_entry_id, j0)
            for lid in data
            for seg in c.store.read_ledger(lid).value.segments
            if j0 in seg.ensemble
        }
        assert {lid for lid, _, _ in expected} == {ids[k] for k in ("e3w2", "e3w3", "e2w2", "open")}

        wh = str(tmp_path / "wh")
        for check in (Check.LOST, Check.SAMPLE, Check.REPLICAS):
            _cli(
                "audit", "--metadata-uri", c.uri, "--warehouse", wh, "--check", check,
                "--executor", "local", "--read-timeout", "3", "--connect-timeout", "2",
            )  # fmt: skip
            run = delta.latest_run(wh)
            assert run is not None and run["status"] == RunStatus.COMPLETED, (check, run)
            rows = [r for r in delta.read_rows(wh, FRAGMENTS) if r["run_id"] == run["run_id"]]
            got = {(r["ledger_id"], r["segment_first_entry_id"], r["bookie_id"]) for r in rows}
            assert got == expected, (check, rows, c.logs())
            assert {r["reason"] for r in rows} == {"BOOKIE_LOST"}, (check, rows)
            if check == Check.REPLICAS:
                # DbLedgerStorage has no list-entries: the live bookies were probed.
                assert run["counts"].get("pairs_PROBE_OK", 0) > 0, run["counts"]

        _cli(
            "rereplicate", "--metadata-uri", c.uri, "--warehouse", wh, "--grace-period", "0s",
            "--read-timeout", "3", "--zk-session-timeout", "4s", "--executor", "local",
        )  # fmt: skip
        live = {j1, j2, j3}
        for lid, entries in data.items():
            md = c.store.read_ledger(lid).value
            assert md.state is LedgerState.CLOSED, md
            assert md.last_entry_id == len(entries) - 1, md
            assert md.bookies() <= live, md
            got_entries, reply = jc.read(c.uri, lid, password=PWD, v2=True)
            assert got_entries == entries, lid
            assert reply["metadata"]["state"] == "CLOSED", reply

        _cli(
            "audit", "--metadata-uri", c.uri, "--warehouse", wh, "--check", "replicas",
            "--executor", "local", "--read-timeout", "3", "--connect-timeout", "2",
        )  # fmt: skip
        again = delta.latest_run(wh)
        assert again is not None and again["status"] == RunStatus.COMPLETED
        assert [r for r in delta.read_rows(wh, FRAGMENTS) if r["run_id"] == again["run_id"]] == []


def test_watch_marks_java_lists_them_and_autorecovery_shares_the_locks_on_oxia(
    pulsar_classpath: str, oxia_java_client: JavaClient, tmp_path: Path
) -> None:
    jc = oxia_java_client
    with oxia_java_cluster(pulsar_classpath, tmp_path / "cluster") as c:
        urm = UnderReplicationManager(c.zk, "/ledgers")
        urm.ensure_layout()
        urm.set_lost_bookie_recovery_delay(0)
        urm.disable_replication()
        victim = c.java[0]
        dead = victim.bookie_id
        data = write_rotating_ledgers(jc, c.uri, c.java_ids, PWD, v2=True)
        before = {lid: c.store.read_ledger(lid).value for lid in data}
        affected = affected_segments(before, dead)
        marked = {lid for lid, _ in affected}
        assert len(marked) == 11, before

        wh = str(tmp_path / "wh")
        watch = Watch(c.connect, wh, tmp_path / "watch.log")
        ar = autorecovery(pulsar_classpath, c, AUTORECOVERY_RACE_CONF)

        def logs() -> str:
            return (
                f"--- autorecovery ---\n{ar.log_tail()}\n--- watch ---\n{watch.tail()}\n"
                f"{c.logs(10)}"
            )

        try:
            wait_until(watch.leading, 60, "the watch leader", logs)
            victim.kill9()
            wait_until(
                lambda: c.zk.exists(f"/ledgers/available/{dead}") is None,
                30,
                "the victim's Oxia session to expire",
                logs,
            )
            # Replication is disabled: the watch marks and waits.
            wait_until(
                lambda: {u.ledger_id for u in urm.list_underreplicated()} == marked,
                60,
                "the watch's marks",
                logs,
            )
            listed = c.shell.run("listunderreplicated", "-printmissingreplica").stdout
            assert parse_listunderreplicated(listed) == {lid: {dead} for lid in marked}, listed
            ours = bkaudit("listunderreplicated", "--live", "--zk", c.connect)
            assert ours.returncode == 1, ours.stderr  # 1: some ledgers are marked
            assert parse_listunderreplicated(ours.stdout) == parse_listunderreplicated(listed)

            ar.start()
            wait_until(
                lambda: c.zk.exists("/ledgers/underreplication/leader") is not None,
                60,
                "the Java Auditor (Pulsar's leader key)",
                logs,
            )
            urm.enable_replication()
            took = wait_converged(c, data, dead, CONVERGE, logs)
        finally:
            code = watch.stop()
            ar.stop()
        assert code == 0, watch.tail()
        ours, theirs, fenced = assert_each_fragment_copied_once(
            c, jc, data, before, dead, wh, ar.log_path, PWD, logs, v2=True
        )
        print(
            f"on Oxia: converged in {took:.1f}s after replication was enabled; the watch "
            f"copied {ours} fragments, the Java ReplicationWorker {theirs}; the watch fenced "
            f"{fenced}"
        )
