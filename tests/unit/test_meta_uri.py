"""bklib.meta.uri against BookKeeper's and Pulsar's own examples, and jobs.options.zookeeper.

Mirrored from BookKeeper (bookkeeper-server/src/test/java/org/apache/bookkeeper/meta/zk/
ZKMetadataDriverBaseStaticTest.java): testGetZKServersFromServiceUri (``;`` and ``,``
separated servers), testResolveLedgerManagerFactoryNullScheme, ...UnknownScheme,
...UnspecifiedLayout, ...NullLayout, ...Flat, ...Ms (we refuse ms: not a ZooKeeper layout we
read), ...Hierarchical, ...LongHierarchical, ...UnknownLedgerManagerFactory.
From Pulsar (ServiceConfigurationTest.testZookeeperServers / testMetadataStoreUrl):
``metadata-store:zk:zk1:2181/ledgers`` and ``metadata-store:zk1:2181/ledgers``. Pulsar's
driver (``AbstractMetadataDriver``) reads the path as a ZooKeeper chroot and keeps its ledgers
at ``/ledgers`` inside it; tests/pulsar/test_metadata_uri_java.py holds a Java bookie to that.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bklib.meta.uri import (
    InvalidMetadataUri,
    MetadataTarget,
    UnsupportedMetadataUri,
    parse_metadata_uri,
)
from jobs.options.zookeeper import ConnectionArgsError, add_connection_arguments, resolve_connection


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        # testGetZKServersFromServiceUri
        (
            "zk://server1;server2;server3/ledgers",
            MetadataTarget("server1,server2,server3", "/ledgers"),
        ),
        (
            "zk://server1,server2,server3/ledgers",
            MetadataTarget("server1,server2,server3", "/ledgers"),
        ),
        # testResolveLedgerManagerFactory: UnspecifiedLayout, NullLayout, Flat, Hierarchical,
        # LongHierarchical
        ("zk://127.0.0.1/ledgers", MetadataTarget("127.0.0.1", "/ledgers")),
        ("zk+null://127.0.0.1/ledgers", MetadataTarget("127.0.0.1", "/ledgers")),
        ("zk+flat://127.0.0.1/ledgers", MetadataTarget("127.0.0.1", "/ledgers", "flat")),
        (
            "zk+hierarchical://127.0.0.1/ledgers",
            MetadataTarget("127.0.0.1", "/ledgers", "hierarchical"),
        ),
        (
            "zk+longhierarchical://127.0.0.1/ledgers",
            MetadataTarget("127.0.0.1", "/ledgers", "longhierarchical"),
        ),
        # The path is the whole ledgers root: no separate chroot. Scheme case does not matter.
        (
            "ZK+Hierarchical://h1:2181;h2:2181/pulsar/ledgers/",
            MetadataTarget("h1:2181,h2:2181", "/pulsar/ledgers", "hierarchical"),
        ),
        # Pulsar: ServiceConfigurationTest's forms. The path is a chroot, the root /ledgers.
        (
            "metadata-store:zk:zk1:2181/ledgers",
            MetadataTarget("zk1:2181/ledgers", "/ledgers", pulsar_driver=True),
        ),
        (
            "metadata-store:zk1:2181/ledgers",
            MetadataTarget("zk1:2181/ledgers", "/ledgers", pulsar_driver=True),
        ),
        (
            "metadata-store:zk:h1:2181;h2:2181/pulsar",
            MetadataTarget("h1:2181,h2:2181/pulsar", "/ledgers", pulsar_driver=True),
        ),
        (
            "metadata-store:zk:h1:2181/pulsar/",
            MetadataTarget("h1:2181/pulsar", "/ledgers", pulsar_driver=True),
        ),
        ("metadata-store:zk:h1:2181", MetadataTarget("h1:2181", "/ledgers", pulsar_driver=True)),
        ("metadata-store:h1:2181", MetadataTarget("h1:2181", "/ledgers", pulsar_driver=True)),
    ],
)
def test_zookeeper_uris(uri: str, expected: MetadataTarget) -> None:
    assert parse_metadata_uri(uri) == expected


@pytest.mark.parametrize(
    ("uri", "named"),
    [
        ("unknown://127.0.0.1/ledgers", "'unknown'"),  # ...UnknownScheme
        ("zk+unknown://127.0.0.1/ledgers", "'unknown'"),  # ...UnknownLedgerManagerFactory
        ("zk+ms://127.0.0.1/ledgers", "'ms'"),  # ...Ms
        ("etcd://127.0.0.1:2379/ledgers", "'etcd'"),
        ("oxia://oxia:6648/ledgers", "'oxia'"),
        ("metadata-store:etcd:http://e1:2379", "'etcd'"),
        ("metadata-store:rocksdb:/data/meta", "'rocksdb'"),
    ],
)
def test_other_backends_are_refused_by_name(uri: str, named: str) -> None:
    with pytest.raises(UnsupportedMetadataUri) as exc:
        parse_metadata_uri(uri)
    assert uri in str(exc.value) and named in str(exc.value)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize(
    "uri",
    [
        "//127.0.0.1/ledgers",  # ...NullScheme
        "127.0.0.1:2181",
        "zk:/ledgers",  # no authority: getZKServersFromServiceUri refuses it
        "zk:///ledgers",
        "zk://h1:2181",  # no ledgers root
        "zk://h1:2181;;h2:2181/ledgers",
        "metadata-store:zk://h1:2181/pulsar",  # Pulsar: Invalid path string "//h1:2181/pulsar"
    ],
)
def test_malformed_uris(uri: str) -> None:
    with pytest.raises(InvalidMetadataUri):
        parse_metadata_uri(uri)


# ---- jobs.options.zookeeper ----------------------------------------------------------------------


def _parser(required: bool = True, password: bool = False) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--zk", required=required)
    p.add_argument("--ledgers-root", default="/ledgers")
    p.add_argument("--zk-auth", default=None)
    if password:
        p.add_argument("--password", default=None)
    return add_connection_arguments(p)


def _resolve(argv: list[str], **kw: bool) -> argparse.Namespace:
    p = _parser(**kw)
    return resolve_connection(p, p.parse_args(argv), argv)


def test_metadata_uri_sets_zk_and_ledgers_root() -> None:
    args = _resolve(["--metadata-uri", "zk+hierarchical://h1:2181;h2:2181/pulsar/ledgers"])
    assert (args.zk, args.ledgers_root) == ("h1:2181,h2:2181", "/pulsar/ledgers")
    assert _resolve(["--zk", "h:1"]).zk == "h:1"
    args = _resolve(["--metadata-uri", "metadata-store:zk:h1:2181/pulsar"])
    assert (args.zk, args.ledgers_root) == ("h1:2181/pulsar", "/ledgers")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "one of --zk or --metadata-uri is required"),
        (["--zk", "h:1", "--metadata-uri", "zk://h:1/ledgers"], "do not go together"),
        (["--ledgers-root", "/ledgers", "--metadata-uri", "zk://h:1/l"], "drop --ledgers-root"),
        (["--metadata-uri", "etcd://h:2379/ledgers"], "'etcd' is not supported"),
        (["--zk", "h:1", "--zk-auth-file", "/nonexistent/auth"], "/nonexistent/auth"),
    ],
)
def test_usage_errors_are_one_line(argv: list[str], message: str) -> None:
    with pytest.raises(ConnectionArgsError) as exc:
        _resolve(argv)
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_optional_zk_stays_optional() -> None:
    assert _resolve([], required=False).zk is None


def test_secret_files(tmp_path: Path) -> None:
    auth = tmp_path / "auth"
    auth.write_text("bk:s3cret\n")
    pw = tmp_path / "pw"
    pw.write_text("p a:ss\n")
    args = _resolve(
        ["--zk", "h:1", "--zk-auth-file", str(auth), "--password-file", str(pw)], password=True
    )
    assert (args.zk_auth, args.password) == ("bk:s3cret", "p a:ss")
    auth.write_text("no-colon\n")
    with pytest.raises(ConnectionArgsError, match="user:password"):
        _resolve(["--zk", "h:1", "--zk-auth-file", str(auth)])
    with pytest.raises(ConnectionArgsError, match="once"):
        _resolve(["--zk", "h:1", "--zk-auth", "a:b", "--zk-auth-file", str(pw)])
    assert "--password-file" not in _parser().format_help()


@pytest.mark.parametrize(
    ("uri", "locator"),
    [
        ("metadata-store:oxia://oxia:6648/bookkeeper", "oxia://oxia:6648/bookkeeper"),
        ("metadata-store:oxia://oxia:6648", "oxia://oxia:6648/default"),  # Pulsar's default
        ("metadata-store:oxia://10.0.0.5:6648/pulsar/", "oxia://10.0.0.5:6648/pulsar"),
    ],
)
def test_pulsar_oxia_uris_name_a_namespace(uri: str, locator: str) -> None:
    # Pulsar's driver on Oxia: the same /ledgers tree, inside the namespace.
    assert parse_metadata_uri(uri) == MetadataTarget(locator, "/ledgers", pulsar_driver=True)


@pytest.mark.parametrize(
    "uri",
    [
        "metadata-store:oxia://",
        "metadata-store:oxia://h1:6648,h2:6648/ns",
        "metadata-store:oxia://oxia/ns",
        "metadata-store:oxia://oxia:6648/a/b",
    ],
)
def test_bad_oxia_uris_are_one_line(uri: str) -> None:
    with pytest.raises(InvalidMetadataUri) as exc:
        parse_metadata_uri(uri)
    assert uri in str(exc.value) and "\n" not in str(exc.value)
