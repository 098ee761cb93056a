"""Bad input on Oxia fails closed: one line and exit 2, never a clean audit; a compare-and-set
against a stale ``versionId`` re-reads and re-applies (on both stores)."""

from __future__ import annotations

import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from bklib.meta.model import LedgerMetadata, Segment
from bklib.meta.store import LedgerStore
from bklib.meta.stores import MetadataStore
from bklib.meta.stores.oxia import OXIA_EXTRA_HINT
from bklib.testing.oxiaserver import OxiaServer
from bklib.testing.ports import free_port
from tests.cli_helpers import REPO, bkaudit, one_error_line
from tests.conftest import wipe_oxia

pytestmark = pytest.mark.integration


def _uri(locator: str) -> str:
    return "metadata-store:" + locator


def test_an_unreachable_oxia_is_one_line_and_no_run(tmp_path: Path) -> None:
    uri = f"metadata-store:oxia://127.0.0.1:{free_port()}/default"
    wh = tmp_path / "wh"
    for command in (
        ("audit", "--check", "lost", "--warehouse", str(wh)),
        ("rereplicate", "--warehouse", str(wh)),
        ("status",),
    ):
        proc = bkaudit(*command[:1], "--metadata-uri", uri, *command[1:])
        assert proc.returncode == 2, (command, proc.stdout, proc.stderr)
        line = one_error_line(proc)
        assert "cannot connect to Oxia" in line and uri.split("//")[1].split("/")[0] in line
    assert not (wh / "audit_runs").exists()


def test_a_namespace_without_a_cluster_is_one_line(oxia_server: OxiaServer, tmp_path: Path) -> None:
    wipe_oxia(oxia_server.locator())  # a namespace with no BookKeeper cluster in it
    wh = tmp_path / "wh"
    proc = bkaudit("audit", "--metadata-uri", _uri(oxia_server.locator()), "--warehouse", str(wh))
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    line = one_error_line(proc)
    assert "/ledgers" in line and "cluster" in line.lower()
    assert not (wh / "audit_runs").exists()


def test_without_the_oxia_extra_an_oxia_uri_names_the_extra(oxia_server: OxiaServer) -> None:
    # The client is hidden from this interpreter: `import oxia` fails as without the extra.
    code = (
        "import sys; sys.modules['oxia'] = None\n"
        "from jobs.cli.main import run\n"
        f"sys.argv = ['bkaudit', 'status', '--metadata-uri', {_uri(oxia_server.locator())!r}]\n"
        "sys.exit(run())\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert OXIA_EXTRA_HINT in one_error_line(proc)


def test_compare_and_set_on_a_stale_version_rereads_and_reapplies(
    meta_store: MetadataStore,
) -> None:
    store = LedgerStore(meta_store)
    store.init_cluster()
    md = LedgerMetadata(
        ledger_id=7, ensemble_size=2, write_quorum=2, ack_quorum=2,
        segments=(Segment(0, ("b1:3181", "b2:3181")),), ctoken=1,
        custom_metadata={"a": b"1"},
    )  # fmt: skip
    stale = store.create_ledger(md)
    # Another writer changes the ledger after our read: our version is stale now.
    store.write_ledger(replace(md, custom_metadata={"a": b"1", "other": b"x"}), stale.version)
    calls: list[dict[str, bytes]] = []

    def add_mine(cur: LedgerMetadata) -> LedgerMetadata:
        calls.append(dict(cur.custom_metadata))
        return replace(cur, custom_metadata={**cur.custom_metadata, "mine": b"y"})

    done = store.update_ledger(7, add_mine, current=stale)
    # The first attempt met BADVERSION; the second ran on what the other writer left.
    assert calls == [{"a": b"1"}, {"a": b"1", "other": b"x"}]
    assert dict(done.value.custom_metadata) == {"a": b"1", "other": b"x", "mine": b"y"}
    assert store.read_ledger(7).value.custom_metadata == done.value.custom_metadata


def test_concurrent_updates_are_never_lost(meta_store: MetadataStore) -> None:
    store = LedgerStore(meta_store)
    store.init_cluster()
    md = LedgerMetadata(
        ledger_id=8, ensemble_size=1, write_quorum=1, ack_quorum=1,
        segments=(Segment(0, ("b1:3181",)),), ctoken=1,
    )  # fmt: skip
    store.create_ledger(md)

    def tag(n: int) -> None:
        key = f"t{n}"
        store.update_ledger(
            8, lambda cur: replace(cur, custom_metadata={**cur.custom_metadata, key: b"1"})
        )

    threads = [threading.Thread(target=tag, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert set(store.read_ledger(8).value.custom_metadata) == {f"t{n}" for n in range(6)}


def test_a_namespace_without_a_cluster_repairs_nothing_on_either_executor(
    oxia_server: OxiaServer, tmp_path: Path
) -> None:
    wipe_oxia(oxia_server.locator())
    uri, wh = _uri(oxia_server.locator()), str(tmp_path / "wh")
    for command in (
        ("audit", "--metadata-uri", uri, "--warehouse", wh, "--executor", "spark",
         "--master", "local[1]"),
        ("rereplicate", "--metadata-uri", uri, "--warehouse", wh),
        ("recover", "10.0.0.1:3181", "--metadata-uri", uri, "--warehouse", wh),
    ):  # fmt: skip
        proc = bkaudit(*command)
        assert proc.returncode == 2, (command, proc.stdout, proc.stderr)
        line = one_error_line(proc)
        assert "no BookKeeper cluster" in line and "/ledgers" in line, (command, line)
    assert not (tmp_path / "wh" / "audit_runs").exists()


def test_a_namespace_the_server_does_not_serve_is_one_line(oxia_server: OxiaServer) -> None:
    uri = f"metadata-store:oxia://{oxia_server.address}/typo"
    proc = bkaudit("status", "--metadata-uri", uri)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    line = one_error_line(proc)
    assert oxia_server.address in line and "typo" in line, line


def test_a_scan_of_a_vanished_server_raises_instead_of_listing_nothing(tmp_path: Path) -> None:
    from bklib.meta.stores import StoreUnavailable, open_store

    with OxiaServer(tmp_path / "oxia", shards=3) as server:
        store = open_store(server.locator(), timeout=15)
        try:
            for i in range(5):
                store.create(f"/ledgers/00/0000/L000{i}", b"x", parents=True)
            assert len(list(store.scan_children("/ledgers/00/0000"))) == 5
            assert server.proc is not None
            server.proc.kill()
            server.proc.wait(10)
            with pytest.raises(StoreUnavailable) as err:
                list(store.scan_children("/ledgers/00/0000"))
            assert server.address in str(err.value) and "/ledgers/00/0000" in str(err.value)
        finally:
            store.close()
