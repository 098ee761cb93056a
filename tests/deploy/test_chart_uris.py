"""Every metadata URI the docs, the chart's README, its values, its ``ci/`` values and its
rendered NOTES give for a Pulsar chart's ZooKeeper (``<fullname>-zookeeper``) means what that
release's bookies read: parsed by our own parser (bklib/meta/uri.py), it names the same
ZooKeeper and the same ledgers root as the bookies' ``zk+hierarchical://<fullname>-zookeeper:
2181/ledgers`` (Pulsar chart pulsar-4.7.0, tests/deploy/pulsar_chart_defaults.py). Issue 47
found ``metadata-store:zk:pulsar-zookeeper:2181/ledgers`` in them: a chroot, so /ledgers/ledgers."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from bklib.meta.uri import parse_metadata_uri
from tests.cli_helpers import REPO
from tests.deploy.pulsar_chart_defaults import PORTS, PulsarRelease
from tests.deploy.test_helm_chart import CHART, KUBERNETES, VALUES, helm

_URI = re.compile(r"(?:zk(?:\+[a-z]+)?://|metadata-store:)[^\s`'\"()|,\]]+")
_ZK_FLAG = re.compile(r"metadata\.zk=([^\s`'\",\\]+)")
_PLACEHOLDERS = {"<fullname>": "pulsar", "<release>": "pulsar"}
_LEDGERS_ROOT = yaml.safe_load((CHART / "values.yaml").read_text())["metadata"]["ledgersRoot"]


def _texts() -> dict[str, str]:
    """Every text that may give a release's metadata: docs, the chart's README and values."""
    paths = [*sorted((REPO / "docs").glob("*.md")), CHART / "README.md", CHART / "values.yaml"]
    paths += sorted((CHART / "ci").glob("*.yaml"))
    out = {str(p.relative_to(REPO)): p.read_text() for p in paths}
    for old, new in _PLACEHOLDERS.items():
        out = {k: v.replace(old, new) for k, v in out.items()}
    return out


def _pulsar_release(connect: str) -> PulsarRelease | None:
    """The Pulsar release whose ZooKeeper a connect string names (None: no Pulsar chart's)."""
    host, _, port = connect.split("/", 1)[0].split(",")[0].partition(":")
    if not host.endswith("-zookeeper"):
        return None
    fullname = host.removesuffix("-zookeeper")
    zk = PORTS["zookeeper"]
    assert port in (str(zk["client"]), str(zk["clientTls"])), f"{connect}: no ZooKeeper port"
    return PulsarRelease(release=fullname, tls_zookeeper=port == str(zk["clientTls"]))


def _mismatch(connect: str, ledgers_root: str, where: str) -> str | None:
    """Why (connect, ledgers_root) is not what the bookies of the release it names read."""
    release = _pulsar_release(connect)
    if release is None:
        return None
    bookies = parse_metadata_uri(release.bookies_metadata_uri)
    if (connect, ledgers_root) == (bookies.connect, bookies.ledgers_root):
        return None
    return (
        f"{where}: {connect} ledgers root {ledgers_root}, but the bookies read "
        f"{release.bookies_metadata_uri} ({bookies.connect}, ledgers root {bookies.ledgers_root})"
    )


def _uri_mismatch(uri: str, where: str) -> str | None:
    target = parse_metadata_uri(uri)
    return _mismatch(target.connect, target.ledgers_root, f"{where}: {uri}")


def _found(texts: dict[str, str]) -> list[tuple[str, str, str]]:
    """(where, kind, value): URIs and ``metadata.zk=`` connect strings naming a Pulsar
    chart's ZooKeeper."""
    out = []
    for where, text in texts.items():
        for m in _URI.finditer(text):
            uri = m.group(0).rstrip(".;:")
            if "-zookeeper" in uri:
                out.append((where, "uri", uri))
        for m in _ZK_FLAG.finditer(text):
            out.append((where, "zk", m.group(1)))
    return out


def _notes(tmp_path: Path, values: Path) -> str:
    """NOTES.txt as ``helm install`` prints it (``helm template`` renders no NOTES: a copy of
    the chart renders it as a document)."""
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    notes = (chart / "templates" / "NOTES.txt").read_text()
    indented = "".join("  " + line for line in notes.splitlines(keepends=True))
    (chart / "templates" / "notes.yaml").write_text("kind: Notes\ntext: |\n" + indented)
    proc = subprocess.run(
        [str(helm()), "template", "bk", str(chart), "--namespace", "pulsar", "-f", str(values),
         "--kube-version", KUBERNETES[-1], "--show-only", "templates/notes.yaml"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return str(yaml.safe_load(proc.stdout)["text"])


def test_every_uri_in_the_docs_and_values_is_the_bookies() -> None:
    found = _found(_texts())
    where = {w for w, _, _ in found}
    # the scan sees what it must: the install docs, the chart's README, values and ci values
    assert {"docs/kubernetes.md", "deploy/helm/bkaudit/README.md"} <= where, where
    assert "deploy/helm/bkaudit/values.yaml" in where, where
    assert sum(kind == "uri" for _, kind, _ in found) >= 5, found
    wrong = []
    for w, kind, value in found:
        if kind == "uri":
            wrong.append(_uri_mismatch(value, w))
        else:  # metadata.zk with the chart's default ledgers root
            wrong.append(_mismatch(value, _LEDGERS_ROOT, f"{w}: metadata.zk={value}"))
    assert not [x for x in wrong if x], "\n".join(x for x in wrong if x)


@pytest.mark.parametrize("values", sorted(VALUES))
def test_the_ci_values_give_the_bookies_metadata(values: str) -> None:
    given = yaml.safe_load(VALUES[values].read_text())["metadata"]
    if "zk" in given:
        root = given.get("ledgersRoot", _LEDGERS_ROOT)
        assert _mismatch(given["zk"], root, values) is None
        assert _pulsar_release(given["zk"]) is not None, given
    elif given["metadataUri"].startswith("metadata-store:oxia://"):
        assert parse_metadata_uri(given["metadataUri"]).ledgers_root == "/ledgers"
    else:
        assert _uri_mismatch(given["metadataUri"], values) is None
        assert _pulsar_release(parse_metadata_uri(given["metadataUri"]).connect) is not None


@pytest.mark.parametrize("values", sorted(VALUES))
def test_the_notes_name_the_bookies_uri_and_the_lasting_autorecovery_switch(
    values: str, tmp_path: Path
) -> None:
    notes = _notes(tmp_path, VALUES[values])
    uris = [u.rstrip(".;") for u in _URI.findall(notes)]
    assert uris, notes
    for uri in uris:
        assert _uri_mismatch(uri, "NOTES") is None
    assert "--set components.autorecovery=false" in notes and "scale" not in notes


@pytest.mark.parametrize(
    "uri",
    [
        "metadata-store:zk:pulsar-zookeeper:2181/ledgers",  # issue 47: /ledgers/ledgers
        "zk+hierarchical://pulsar-zookeeper:2181/pulsar/ledgers",
        "metadata-store:zk:prod-pulsar-zookeeper:2281/pulsar",
    ],
)
def test_the_check_can_fail(uri: str) -> None:
    # The same scan and check flag a URI, or a connect string, the bookies do not read.
    texts = {"docs/x.md": f"give `{uri}`", "y.md": "`metadata.zk=pulsar-zookeeper:2181/x`"}
    assert _found(texts) == [("docs/x.md", "uri", uri), ("y.md", "zk", "pulsar-zookeeper:2181/x")]
    wrong = _uri_mismatch(uri, "docs/x.md")
    assert wrong is not None and "but the bookies read zk+hierarchical://" in wrong, wrong
    assert _mismatch("pulsar-zookeeper:2181/x", _LEDGERS_ROOT, "y.md") is not None
