"""A security flag the chosen store cannot apply is refused with one line and exit 2, before
any work: ZooKeeper's TLS, SASL and digest flags with an Oxia store (docs/security.md). No
server runs here because none may be contacted: the refusal comes first (the Oxia address is
a closed port, so a command that tried to connect would fail differently)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bklib.testing.ports import free_port
from jobs.cli.main import main
from jobs.runtime.exit_status import ExitStatus

OXIA = f"oxia://127.0.0.1:{free_port()}/default"


@pytest.mark.parametrize(
    ("command", "flags", "named"),
    [
        ("audit", ["--zk-tls"], "--zk-tls"),
        ("audit", ["--zk-auth", "bk:secret"], "--zk-auth"),
        ("listunderreplicated", ["--live", "--zk-tls", "--zk-tls-ca", "/dev/null"], "--zk-tls-ca"),
        ("rereplicate", ["--zk-enable-security", "true"], "--zk-enable-security"),
        ("whatif", ["--zk-sasl-service", "zk", "--bookie", "b:3181"], "--zk-sasl-service"),
        ("status", ["--zk-auth", "bk:secret"], "--zk-auth"),
        ("watch", ["--zk-tls"], "--zk-tls"),
        ("recover", ["b:3181", "--zk-tls"], "--zk-tls"),
    ],
)
def test_zookeeper_security_flags_with_oxia_are_refused(
    command: str,
    flags: list[str],
    named: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [command, "--zk", OXIA, *flags]
    if command not in ("listunderreplicated", "whatif", "status"):
        argv += ["--warehouse", str(tmp_path / "wh")]
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == ExitStatus.OPERATOR_ERROR
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert named in err[0] and "Oxia" in err[0] and OXIA in err[0]
    assert "secret" not in err[0]
    assert not (tmp_path / "wh").exists()  # nothing was written


def test_the_same_flags_with_oxia_by_metadata_uri_are_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    uri = f"metadata-store:{OXIA}"
    with pytest.raises(SystemExit) as exited:
        main(["listunderreplicated", "--live", "--metadata-uri", uri, "--zk-tls"])
    assert exited.value.code == ExitStatus.OPERATOR_ERROR
    assert "--zk-tls" in capsys.readouterr().err
