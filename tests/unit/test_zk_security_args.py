"""ZooKeeper TLS / SASL / ACL flags: resolution into ``args.zk_auth``, JAAS files, the
zkEnableSecurity default, secrets kept out of reprs and logs, and the bookie's flags."""

from __future__ import annotations

import argparse
import datetime
import logging
import pickle
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from kazoo.security import CREATOR_ALL_ACL

from bklib.bookie.main import build_parser as bookie_parser
from bklib.bookie.main import config_from_args
from bklib.meta.stores.zookeeper.security import (
    ZkAccess,
    ZkAccessConfigError,
    ZkSasl,
    ZkTls,
    read_jaas_section,
)
from jobs.options.zookeeper import ConnectionArgsError, add_connection_arguments, resolve_connection
from jobs.options.zookeeper_security import ZK_SECURITY_DESTS

SECRET = "pw-Unit-5e2b"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--zk", required=True)
    p.add_argument("--zk-auth", default=None)
    p.add_argument("--ledgers-root", default="/ledgers")
    return add_connection_arguments(p)


def _resolve(*argv: str) -> argparse.Namespace:
    p = _parser()
    return resolve_connection(p, p.parse_args(list(argv)), list(argv))


@pytest.fixture(scope="module")
def pem(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A self-signed certificate with its key, as separate files and as one file."""
    d = tmp_path_factory.mktemp("pem")
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "unit")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    (d / "cert.pem").write_bytes(cert_pem)
    (d / "key.pem").write_bytes(key_pem)
    (d / "both.pem").write_bytes(key_pem + cert_pem)
    (d / "garbage.pem").write_text("not a certificate\n")
    return {p.stem: p for p in d.iterdir()}


def _jaas(tmp_path: Path, body: str, name: str = "client.jaas") -> Path:
    path = tmp_path / name
    path.write_text(body)
    return path


DIGEST_JAAS = f"""
/* what a Pulsar bookie's -Djava.security.auth.login.config holds */
Server {{
  org.apache.zookeeper.server.auth.DigestLoginModule required
  user_bookkeeper="server-side";
}};
// the client side
Client {{
  org.apache.zookeeper.server.auth.DigestLoginModule required
  username="bookkeeper"
  password="{SECRET}";
}};
"""


def test_without_security_flags_zk_auth_stays_the_digest_string() -> None:
    args = _resolve("--zk", "h:2181", "--zk-auth", "bk:pw")
    assert args.zk_auth == "bk:pw"
    assert _resolve("--zk", "h:2181").zk_auth is None


def test_tls_flags_give_a_zk_access_carrying_the_digest_too(pem: dict[str, Path]) -> None:
    args = _resolve(
        "--zk", "h:2281", "--zk-auth", "bk:pw", "--zk-tls", "--zk-tls-ca", str(pem["cert"]),
        "--zk-tls-cert", str(pem["cert"]), "--zk-tls-key", str(pem["key"]),
    )  # fmt: skip
    access = args.zk_auth
    assert isinstance(access, ZkAccess)
    assert access.digest == "bk:pw" and access.sasl is None
    assert access.tls == ZkTls(
        ca_file=str(pem["cert"]), cert_file=str(pem["cert"]), key_file=str(pem["key"])
    )
    kw = access.kazoo_kwargs()
    assert kw["use_ssl"] and kw["check_hostname"] and kw["verify_certs"]
    assert kw["auth_data"] == [("digest", "bk:pw")]
    # auto: digest alone is not BookKeeper's identity (Java has no digest login): open ACLs
    assert kw["default_acl"] is None


def test_one_pem_file_may_hold_certificate_and_key(pem: dict[str, Path]) -> None:
    access = _resolve("--zk", "h", "--zk-tls", "--zk-tls-cert", str(pem["both"])).zk_auth
    assert isinstance(access, ZkAccess) and access.tls is not None
    assert access.kazoo_kwargs()["keyfile"] == str(pem["both"])  # kazoo wants both set
    assert access.kazoo_kwargs()["default_acl"] is None  # TLS alone: no identity, open ACLs


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--zk-tls-ca", "{cert}"], "--zk-tls-ca needs --zk-tls"),
        (["--zk-tls-no-hostname-verification"], "needs --zk-tls"),
        (["--zk-tls", "--zk-tls-ca", "/nonexistent/ca.pem"], "no such readable file"),
        (["--zk-tls", "--zk-tls-key", "{key}"], "--zk-tls-key needs --zk-tls-cert"),
        (["--zk-tls", "--zk-tls-ca", "{garbage}"], "cannot load the certificates"),
        (["--zk-enable-security", "true"], "needs an identity"),
        (["--zk-sasl-jaas-file", "/nonexistent.jaas"], "cannot read"),
    ],
)
def test_bad_flags_are_one_line_usage_errors(
    argv: list[str], message: str, pem: dict[str, Path]
) -> None:
    argv = [a.format(cert=pem["cert"], key=pem["key"], garbage=pem["garbage"]) for a in argv]
    with pytest.raises(ConnectionArgsError, match=message) as exc:
        _resolve("--zk", "h:2181", *argv)
    assert "\n" not in str(exc.value)


def test_jaas_digest_login_gives_sasl_digest_md5_and_stays_out_of_reprs_and_logs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    jaas = _jaas(tmp_path, DIGEST_JAAS)
    # kazoo.client by name: an earlier CLI logging setup may have raised that logger's level.
    with caplog.at_level(logging.DEBUG), caplog.at_level(logging.DEBUG, logger="kazoo.client"):
        args = _resolve("--zk", "h:2181", "--zk-sasl-jaas-file", str(jaas))
        access = args.zk_auth
        assert access == ZkAccess(sasl=ZkSasl("DIGEST-MD5", username="bookkeeper", password=SECRET))
        assert access.secure_acls  # auto: SASL is an identity
        assert SECRET in access.secrets()
        assert SECRET not in repr(access) and SECRET not in repr(args)
        assert SECRET not in access.describe()
        logging.getLogger("kazoo.client").debug("SASL password %s", SECRET)
    assert "SASL password ***" in caplog.text and SECRET not in caplog.text


def test_jaas_kerberos_login_gives_gssapi_with_principal_and_keytab(tmp_path: Path) -> None:
    jaas = _jaas(
        tmp_path,
        """ZkClient {
          com.sun.security.auth.module.Krb5LoginModule required
          useKeyTab=true
          keyTab="/etc/security/keytabs/bookkeeper.keytab"
          storeKey=true
          useTicketCache=false
          principal="bookkeeper/bk1.example.com@EXAMPLE.COM";
        };""",
    )
    args = _resolve(
        "--zk", "h:2181", "--zk-sasl-jaas-file", str(jaas), "--zk-sasl-jaas-section", "ZkClient",
        "--zk-sasl-service", "zk",
    )  # fmt: skip
    sasl = args.zk_auth.sasl
    assert sasl == ZkSasl(
        "GSSAPI",
        principal="bookkeeper/bk1.example.com@EXAMPLE.COM",
        keytab="/etc/security/keytabs/bookkeeper.keytab",
        service="zk",
    )
    assert sasl.options() == {
        "mechanism": "GSSAPI",
        "service": "zk",
        "principal": "bookkeeper/bk1.example.com@EXAMPLE.COM",
    }


def test_jaas_errors_name_the_file_and_what_is_there(tmp_path: Path) -> None:
    jaas = _jaas(tmp_path, DIGEST_JAAS)
    with pytest.raises(ZkAccessConfigError, match=r"no 'Other' section \(has: Client, Server\)"):
        read_jaas_section(str(jaas), "Other")
    broken = _jaas(tmp_path, "Client { org.Foo required a=", "broken.jaas")
    with pytest.raises(ZkAccessConfigError, match=r"broken\.jaas: not a JAAS file"):
        read_jaas_section(str(broken))
    other = _jaas(tmp_path, 'Client { com.example.Login required x="1"; };', "other.jaas")
    with pytest.raises(ZkAccessConfigError, match=r"uses com\.example\.Login"):
        read_jaas_section(str(other))
    quoted = _jaas(
        tmp_path,
        "Client { org.apache.zookeeper.server.auth.DigestLoginModule required\n"
        ' username="u" password="a \\"quoted\\" {pass};word"; };',
        "quoted.jaas",
    )
    assert read_jaas_section(str(quoted)).password == 'a "quoted" {pass};word'


def test_enable_security_false_keeps_open_acls_with_sasl(tmp_path: Path) -> None:
    jaas = _jaas(tmp_path, DIGEST_JAAS)
    off = _resolve("--zk", "h", "--zk-sasl-jaas-file", str(jaas), "--zk-enable-security", "false")
    assert not off.zk_auth.secure_acls and off.zk_auth.acl() is None
    on = _resolve("--zk", "h", "--zk-auth", "a:b", "--zk-enable-security", "true").zk_auth
    assert on == ZkAccess(digest="a:b", enable_security=True)
    assert on.acl() == list(CREATOR_ALL_ACL)
    assert not ZkAccess.of("a:b").secure_acls and not ZkAccess.of(None).secure_acls


def test_zk_access_pickles_for_spark_executors(pem: dict[str, Path]) -> None:
    access = ZkAccess(
        digest="bk:pw",
        sasl=ZkSasl(username="u", password=SECRET),
        tls=ZkTls(ca_file=str(pem["cert"]), key_password="kp"),
        enable_security=True,
    )
    assert pickle.loads(pickle.dumps(access)) == access
    assert set(access.secrets()) == {"bk:pw", "pw", SECRET, "kp"}


def test_the_flags_added_are_the_documented_dests() -> None:
    before = {a.dest for a in argparse.ArgumentParser()._actions}
    added = {a.dest for a in _parser()._actions} - before
    zk_flags = {d for d in added if d.startswith("zk_")} - {"zk_auth", "zk_auth_file", "zk_rate"}
    assert zk_flags == ZK_SECURITY_DESTS


def test_the_bookie_takes_the_same_flags(tmp_path: Path, pem: dict[str, Path]) -> None:
    jaas = _jaas(tmp_path, DIGEST_JAAS)
    args = bookie_parser().parse_args(
        ["--zk", "h:2281", "--port", "0", "--data-dir", str(tmp_path / "d"), "--zk-tls",
         "--zk-tls-ca", str(pem["cert"]), "--zk-sasl-jaas-file", str(jaas)]
    )  # fmt: skip
    config = config_from_args(args)
    assert config.zk_auth == ZkAccess(
        sasl=ZkSasl(username="bookkeeper", password=SECRET), tls=ZkTls(ca_file=str(pem["cert"]))
    )
    plain = bookie_parser().parse_args(["--zk", "h", "--port", "0", "--data-dir", "d"])
    assert config_from_args(plain).zk_auth is None
