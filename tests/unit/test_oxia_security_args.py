"""Oxia's TLS and token flags (docs/security.md): on a ZooKeeper store refused with one line
and exit 2 before any work, never dropped; on Oxia resolved into a picklable OxiaAccess in the
``zk_auth`` slot every job hands to ``open_store``; a token only from a file or
``$BKAUDIT_OXIA_TOKEN``, only over TLS, never in a message. No server runs here: each refusal
comes before any connection (the addresses are closed ports)."""

from __future__ import annotations

import argparse
import os
import pickle
from pathlib import Path

import pytest

from bklib.meta.oxia_security import TOKEN_ENV, OxiaAccess, OxiaTls
from bklib.testing.ports import free_port
from jobs.cli.main import main
from jobs.options.zookeeper import add_connection_arguments, resolve_connection
from jobs.runtime.exit_status import ExitStatus

OXIA = f"oxia://127.0.0.1:{free_port()}/default"
ZK = f"127.0.0.1:{free_port()}/chroot"
TOKEN = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJia2F1ZGl0In0.c2VjcmV0LXNpZ25hdHVyZQ"


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == ExitStatus.OPERATOR_ERROR
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert TOKEN not in err[0]
    return err[0]


@pytest.mark.parametrize(
    ("command", "flags", "named"),
    [
        ("audit", ["--oxia-tls"], "--oxia-tls"),
        ("listunderreplicated", ["--live", "--oxia-tls", "--oxia-tls-ca", "/dev/null"], "-ca"),
        ("rereplicate", ["--oxia-token-file", "/dev/null"], "--oxia-token-file"),
        ("status", ["--oxia-tls", "--oxia-tls-server-name", "oxia"], "--oxia-tls-server-name"),
        ("watch", ["--oxia-tls"], "--oxia-tls"),
        ("whatif", ["--oxia-tls", "--bookie", "b:3181"], "--oxia-tls"),
    ],
)
def test_oxia_flags_with_zookeeper_are_refused(
    command: str,
    flags: list[str],
    named: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [command, "--zk", ZK, *flags]
    if command not in ("listunderreplicated", "whatif", "status"):
        argv += ["--warehouse", str(tmp_path / "wh")]
    line = _refused(argv, capsys)
    assert named in line and "Oxia only" in line and ZK in line and "ZooKeeper" in line
    assert not (tmp_path / "wh").exists()  # nothing was written


def test_a_token_in_the_environment_with_zookeeper_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    line = _refused(["status", "--zk", ZK], capsys)
    assert f"${TOKEN_ENV}" in line and "Oxia only" in line


def test_zookeeper_flags_on_oxia_are_still_refused(capsys: pytest.CaptureFixture[str]) -> None:
    line = _refused(["status", "--zk", OXIA, "--zk-tls", "--oxia-tls"], capsys)
    assert "--zk-tls" in line and "Oxia store" in line


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--oxia-tls-ca", "/dev/null"], "--oxia-tls-ca needs --oxia-tls"),
        (["--oxia-tls", "--oxia-tls-ca", "/nonexistent.pem"], "no such readable file"),
        (["--oxia-tls", "--oxia-tls-cert", "FILE"], "go together"),
    ],
)
def test_unusable_oxia_flags_are_one_line(
    flags: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "cert.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    flags = [str(tmp_path / "cert.pem") if f == "FILE" else f for f in flags]
    assert says in _refused(["status", "--zk", OXIA, *flags], capsys)


def test_a_token_is_never_sent_without_tls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    line = _refused(["status", "--zk", OXIA, "--oxia-token-file", str(token)], capsys)
    assert "only over TLS" in line and "--oxia-tls" in line
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    assert "only over TLS" in _refused(["status", "--zk", OXIA], capsys)
    # Both sources at once: which one would win is not guessed.
    line = _refused(["status", "--zk", OXIA, "--oxia-tls", "--oxia-token-file", str(token)], capsys)
    assert "once" in line


def _resolve(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--zk", required=True)
    add_connection_arguments(parser)
    args = parser.parse_args(argv)
    return resolve_connection(parser, args, argv)


def test_on_oxia_the_flags_become_a_picklable_access_without_the_token_in_its_repr(
    tmp_path: Path,
) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    args = _resolve(
        [
            "--metadata-uri", f"metadata-store:{OXIA}", "--oxia-tls", "--oxia-tls-ca", str(ca),
            "--oxia-tls-server-name", "oxia.pulsar.svc", "--oxia-token-file", str(token),
        ]
    )  # fmt: skip
    access = args.zk_auth
    assert isinstance(access, OxiaAccess)
    assert access.tls == OxiaTls(ca_file=str(ca), server_name="oxia.pulsar.svc")
    assert access.token == TOKEN and access.token_file == str(token)
    assert TOKEN not in repr(access) and TOKEN not in access.describe()
    assert pickle.loads(pickle.dumps(access)) == access  # what Spark tasks receive


def test_a_rotated_token_file_is_followed_and_a_missing_one_falls_back(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first")
    access = OxiaAccess(tls=OxiaTls(), token="first", token_file=str(token))
    assert access.current_token() == "first"
    token.write_text("second\n")
    os.utime(token, (1, 1))  # a new modification time, as a Secret update makes
    assert access.current_token() == "second"
    token.unlink()  # an executor without the file: the value read on the driver
    assert access.current_token() == "first"


def test_plain_oxia_keeps_no_access(tmp_path: Path) -> None:
    assert _resolve(["--zk", OXIA]).zk_auth is None
    assert _resolve(["--zk", OXIA, "--oxia-tls"]).zk_auth == OxiaAccess(tls=OxiaTls())
