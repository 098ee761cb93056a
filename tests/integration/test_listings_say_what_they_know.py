"""The CLI's listings never present the unknown as clean, nor a plan as a failure (issue 47,
item 5): whatif names the audit run it counted (or says it counted none); a dry run is marked
as one in the listing and never reads FAILED; a topic unload nobody asked for is a MANUAL
step whose command the listing prints; a cluster with no rack configured gets no placement
findings unless the user asks; and every command names a bookie's state in the one
vocabulary of :class:`bklib.states.BookieState`.

Real ZooKeeper, Python bookie processes, Delta tables through delta-rs, and the ``bkaudit``
command in a subprocess.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from bklib.meta.model import LedgerMetadata
from bklib.pulsar.unload import operator_command
from bklib.states import ActionKind, ActionStatus, BookieState, Reason
from jobs.tables import delta
from jobs.tables.schema import ACTIONS, FRAGMENTS
from tests.audit_helpers import AuditCluster, audit_cluster, metadata, write_ledger
from tests.cli_helpers import bkaudit, failure

pytestmark = pytest.mark.integration

TOPIC = "persistent://public/default/orders"
RACKS_ZNODE = "/bookies"


def _run(*args: str, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess[str]:
    proc = bkaudit(*args)
    assert proc.returncode in ok, failure(proc)
    return proc


def _lose(c: AuditCluster, bookie: str) -> None:
    c.sandbox.stop_bookie(bookie)
    c.sandbox.wait_unregistered(bookie)


def _audit(c: AuditCluster, wh: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return _run(
        "audit", "--zk", c.zk, "--warehouse", wh, "--check", "lost", "--executor", "local", *extra
    )


def _latest_run_id(wh: str) -> str:
    run = delta.latest_run(wh, None)
    assert run is not None
    return str(run["run_id"])


def _actions(wh: str, run_id: str | None = None) -> list[dict[str, Any]]:
    rows = delta.read_rows(wh, ACTIONS)
    return [r for r in rows if run_id is None or r["run_id"] == run_id]


def _note(listing: str, ledger_id: int) -> str:
    """The detail line under ``ledger_id`` in a listunderreplicated report."""
    lines = listing.splitlines()
    return lines[lines.index(str(ledger_id)) + 1]


def _pulsar_ledger(c: AuditCluster, bookies: list[str], n: int) -> LedgerMetadata:
    lid = c.store.generate_ledger_id()
    md = metadata(lid, [(0, bookies)], wq=2, aq=2, last=n - 1)
    custom = {
        "application": b"pulsar",
        "component": b"managed-ledger",
        "pulsar/managed-ledger": b"public/default/persistent/orders",
    }
    return write_ledger(c.store, c.client, md.replace(custom_metadata=custom), n)


def test_whatif_and_blastradius_name_the_audit_run_they_counted_or_say_none(
    tmp_path: Path, zk_chroot: str
) -> None:
    wh = str(tmp_path / "wh")
    with audit_cluster(tmp_path / "sandbox", zk_chroot, bookies=4) as c:
        b0, b1, b2, _ = c.bookie_ids
        c.ledger([b0, b1, b2], 10, wq=2, aq=2)
        _lose(c, b2)

        # No --warehouse: it says it counted no audit, never "audit None".
        out = _run("whatif", "--zk", c.zk, "--bookie", b0).stdout
        assert "no audit: replicas an audit found missing are not counted" in out, out
        assert "None" not in out, out

        _audit(c, wh)
        run_id = _latest_run_id(wh)
        proc = _run("whatif", "--zk", c.zk, "--bookie", b0, "--warehouse", wh)
        assert f"missing replicas from audit {run_id}: 1 fragments" in proc.stdout, proc.stdout
        assert "no audit" not in proc.stdout and "None" not in proc.stdout + proc.stderr

        # blastradius says the same of the audit it counted, or of none.
        blast = ("blastradius", "--zk", c.zk, "--warehouse", wh, "--executor", "local")
        out = _run(*blast).stdout
        assert out.rstrip().endswith(f"; missing replicas from audit {run_id}"), out
        out = _run(*blast, "--no-findings").stdout
        assert out.rstrip().endswith("; missing replicas from no audit"), out


def test_a_dry_run_is_marked_in_the_listing_and_never_failed(
    tmp_path: Path, zk_chroot: str
) -> None:
    wh = str(tmp_path / "wh")
    with audit_cluster(tmp_path / "sandbox", zk_chroot, bookies=3) as c:
        b0, b1, b2 = c.bookie_ids
        stuck = c.ledger([b0, b1, b2], 12, wq=2, aq=2)  # no writable bookie outside it
        movable = c.ledger([b0, b2], 12, wq=2, aq=2)  # b1 can take b2's place
        _lose(c, b2)
        _audit(c, wh)

        dry = _run(
            "rereplicate", "--zk", c.zk, "--warehouse", wh, "--executor", "local", "--dry-run",
            ok=(1,),  # the plan has a step the real run could not take
        )  # fmt: skip
        assert "FAILED" not in dry.stdout, dry.stdout
        assert "would not be done x1: " in dry.stdout and "(e.g. ledger " in dry.stdout
        run_id = dry.stdout.split()[1].rstrip(":")
        plan = _actions(wh, run_id)
        assert plan and {a["status"] for a in plan} == {ActionStatus.PLANNED}, plan
        blocked = [a for a in plan if a["error"]]
        assert [a["ledger_id"] for a in blocked] == [stuck.ledger_id], plan
        assert blocked[0]["new_bookie"] is None

        listing = _run("listunderreplicated", "--warehouse", wh, ok=(1,)).stdout
        assert "FAILED" not in listing and "repair since" not in listing, listing
        assert f"dry run since: would repair (rereplicate {run_id}, " in _note(
            listing, movable.ledger_id
        ), listing
        note = _note(listing, stuck.ledger_id)
        assert f"dry run since: would not repair: {blocked[0]['error']} (rereplicate {run_id}" in (
            note
        ), listing
        # A dry run repaired nothing: the listing still says both ledgers need work.
        assert "were repaired after this audit" not in listing

        # The real run then repairs what it can; its note is a repair's again.
        real = _run("rereplicate", "--zk", c.zk, "--warehouse", wh, "--executor", "local", ok=(1,))
        assert "FAILED" in real.stdout  # the stuck ledger does fail now, and says so
        listing = _run("listunderreplicated", "--warehouse", wh, ok=(1,)).stdout
        assert "repair since: REPAIRED (rereplicate" in _note(listing, movable.ledger_id)
        assert "repair since: FAILED" in _note(listing, stuck.ledger_id)
        assert "dry run since" not in listing


def test_an_unload_nobody_asked_for_is_a_manual_step_the_listing_names(
    tmp_path: Path, zk_chroot: str
) -> None:
    wh = str(tmp_path / "wh")
    with audit_cluster(tmp_path / "sandbox", zk_chroot, bookies=4) as c:
        b0, b1, b2, _ = c.bookie_ids
        tagged = _pulsar_ledger(c, [b0, b1, b2], 10)
        _lose(c, b2)
        _audit(c, wh)

        out = _run("rereplicate", "--zk", c.zk, "--warehouse", wh, "--executor", "local").stdout
        assert operator_command(TOPIC) in out, out
        assert "FAILED" not in out, out
        unloads = [a for a in _actions(wh) if a["action"] == ActionKind.UNLOAD_TOPIC]
        assert [(a["topic"], a["ledger_id"], a["status"]) for a in unloads] == [
            (TOPIC, tagged.ledger_id, ActionStatus.MANUAL)
        ], unloads
        assert operator_command(TOPIC) in unloads[0]["error"]
        assert ActionStatus.FAILED not in {a["status"] for a in _actions(wh)}

        listing = _run("listunderreplicated", "--warehouse", wh).stdout
        assert f"  {operator_command(TOPIC)}" in listing.splitlines(), listing
        assert "repair since: REPAIRED" in _note(listing, tagged.ledger_id)


def _write_racks(c: AuditCluster, data: bytes) -> None:
    zk = c.store.zk
    if zk.exists(RACKS_ZNODE):
        zk.set(RACKS_ZNODE, data)
    else:
        zk.create(RACKS_ZNODE, data)


def _fragments(wh: str) -> list[dict[str, Any]]:
    """The latest audit run's ``underreplicated_fragments`` rows."""
    run = delta.latest_run(wh, None)
    assert run is not None
    return list(delta.run_fragments_arrow(wh, run).to_pylist())


def _placement_rows(wh: str) -> list[dict[str, Any]]:
    return [f for f in _fragments(wh) if f["reason"] == Reason.PLACEMENT_VIOLATION]


def test_no_placement_findings_without_a_rack_configuration_unless_asked(
    tmp_path: Path, zk_chroot: str
) -> None:
    wh = str(tmp_path / "wh")
    with audit_cluster(tmp_path / "sandbox", zk_chroot, bookies=4) as c:
        b0, b1, b2, b3 = c.bookie_ids
        one_rack = c.ledger([b0, b1, b2], 10, wq=2, aq=2)
        c.ledger([b1, b3], 10, wq=2, aq=2)  # across the racks below
        # What Pulsar's initialize-cluster-metadata leaves on every cluster: no rack at all.
        _write_racks(c, b"{}")
        _lose(c, b3)

        proc = _audit(c, wh)
        assert "placement" not in proc.stdout, proc.stdout
        assert "names no rack" in proc.stderr, proc.stderr
        assert _placement_rows(wh) == []
        assert {f["reason"] for f in _fragments(wh)} == {Reason.BOOKIE_LOST}

        # Asked for by the flag: every write set is on the one unknown rack, and says so.
        proc = _audit(c, wh, "--placement", "on")
        assert "placement violations" in proc.stdout, proc.stdout
        assert len(_placement_rows(wh)) == 2

        # A rack document that names racks is a rack configuration: checked as before.
        racks = {b0: "rack-a", b1: "rack-a", b2: "rack-a", b3: "rack-b"}
        doc = {"default": {b: {"rack": r, "hostname": "localhost"} for b, r in racks.items()}}
        _write_racks(c, json.dumps(doc).encode())
        proc = _audit(c, wh)
        assert "1 placement violations" in proc.stdout, proc.stdout
        assert [f["ledger_id"] for f in _placement_rows(wh)] == [one_rack.ledger_id]

        # And --placement off never checks, whatever the document says.
        proc = _audit(c, wh, "--placement", "off")
        assert _placement_rows(wh) == [] and "placement" not in proc.stdout


OTHER_WORDS = re.compile(
    r"\b(down|dead|alive|offline|read-only|unregistered|missing bookies?|failed bookies?)\b",
    re.IGNORECASE,
)
"""Words for a bookie's state that are not :class:`BookieState`'s."""


def test_every_command_names_bookie_states_in_the_one_vocabulary(
    tmp_path: Path, zk_chroot: str
) -> None:
    wh = str(tmp_path / "wh")
    with audit_cluster(tmp_path / "sandbox", zk_chroot, bookies=4) as c:
        b0, b1, b2, b3 = c.bookie_ids
        c.ledger([b0, b1, b2], 10, wq=2, aq=2)
        c.ledger([b0, b2], 10, wq=1, aq=1)  # write quorum one: triage has something to say
        c.ledger([b1, b3], 10, wq=2, aq=2)
        _lose(c, b2)
        z = ("--zk", c.zk)

        outputs = {
            "audit": _audit(c, wh),
            "status": _run("status", *z, "--warehouse", wh, ok=(1,)),
            "whatif": _run("whatif", *z, "--bookie", b0, "--warehouse", wh),
            "blastradius": _run("blastradius", *z, "--warehouse", wh, "--executor", "local"),
            "listunderreplicated": _run("listunderreplicated", "--warehouse", wh, ok=(1,)),
            "recover": _run(
                "recover", b2, *z, "--warehouse", wh, "--executor", "local", "--dry-run", ok=(0, 1)
            ),
            "triage": _run("triage", *z, "--warehouse", wh, ok=(0, 1)),
            "decommission": _run("decommission", b3, *z, "--warehouse", wh, ok=(2,)),
        }
        for name, proc in outputs.items():
            text = proc.stdout + proc.stderr
            assert not OTHER_WORDS.search(text), (name, OTHER_WORDS.search(text), text)

        # Where they name a state, it is the vocabulary's word.
        assert f"1 {BookieState.LOST}" in outputs["status"].stdout
        assert (
            f"bookies: 3 {BookieState.WRITABLE}, 0 {BookieState.READONLY}, 1 {BookieState.LOST}"
            in (outputs["audit"].stderr)
        ), outputs["audit"].stderr
        assert f"already {BookieState.LOST}: {b2}" in outputs["whatif"].stdout
        assert f"bookie {b3} is {BookieState.WRITABLE} (registered): stop it first" in (
            outputs["decommission"].stderr
        )
        # The audit's findings name the lost bookie as lost, nowhere as something else.
        frags = delta.read_rows(wh, FRAGMENTS)
        assert {f["bookie_id"] for f in frags} == {b2}
        assert {f["reason"] for f in frags} == {Reason.BOOKIE_LOST}
