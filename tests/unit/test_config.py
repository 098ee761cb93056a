"""jobs.cli.config: config file, environment and flags, in that order of precedence, applied to
the real command parsers (audit, listunderreplicated, report, sandbox, demo)."""

from __future__ import annotations

import argparse
import functools
import logging
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from jobs.cli.config import (
    DEFAULT_CONFIG_FILE,
    ConfigError,
    apply_config,
    configure_logging,
    env_var,
    help_epilog,
    load_config,
    parse_with_config,
)
from jobs.cli.main import command_parser
from jobs.cli.registry import COMMANDS
from jobs.commands.audit import add_audit_arguments


def audit_parser() -> argparse.ArgumentParser:
    return add_audit_arguments(argparse.ArgumentParser(prog="bkaudit audit"))


def write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def test_precedence_file_global_then_section_then_env_then_flags(tmp_path: Path) -> None:
    cfg = write(
        tmp_path / "c.yaml",
        {
            "global": {"zk": "file-global:2181", "warehouse": "/wh-file", "ledgers-root": "/g"},
            "audit": {"zk": "file-audit:2181", "check": "lost", "read_timeout": 7},
        },
    )
    p = audit_parser()
    apply_config(p, "audit", cfg, env={})
    a = p.parse_args([])
    assert (a.zk, a.warehouse, a.check, a.read_timeout) == (
        "file-audit:2181",
        "/wh-file",
        "lost",
        7.0,
    )
    assert a.ledgers_root == "/g"
    assert a.connect_timeout == 5.0  # untouched: built-in default

    env = {"BKAUDIT_ZK": "env-global:2181", "BKAUDIT_AUDIT_CHECK": "deep"}
    p = audit_parser()
    apply_config(p, "audit", cfg, env=env)
    a = p.parse_args([])
    assert (a.zk, a.check) == ("env-global:2181", "deep")

    env["BKAUDIT_AUDIT_ZK"] = "env-audit:2181"  # command variable beats the global one
    p = audit_parser()
    apply_config(p, "audit", cfg, env=env)
    assert p.parse_args([]).zk == "env-audit:2181"

    p = audit_parser()
    apply_config(p, "audit", cfg, env=env)
    a = p.parse_args(["--zk", "flag:2181", "--check", "replicas"])
    assert (a.zk, a.check, a.warehouse) == ("flag:2181", "replicas", "/wh-file")


def test_required_flags_stay_required_unless_config_supplies_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = write(tmp_path / "empty.yaml", {"global": {"zk": None}})
    with pytest.raises(SystemExit) as exit_:  # --zk (or --metadata-uri) still required
        parse_with_config(
            audit_parser(), "audit", ["--config", str(empty), "--warehouse", "/w"], env={}
        )
    assert exit_.value.code == 2
    assert capsys.readouterr().err == "audit: one of --zk or --metadata-uri is required\n"
    p = audit_parser()
    apply_config(p, "audit", empty, env={})
    with pytest.raises(SystemExit):
        p.parse_args(["--zk", "z:1"])  # --warehouse still required
    p = audit_parser()
    apply_config(p, "audit", empty, env={"BKAUDIT_ZK": "z:1", "BKAUDIT_WAREHOUSE": "/w"})
    a = p.parse_args([])
    assert (a.zk, a.warehouse) == ("z:1", "/w")


def test_environment_values_are_converted_like_flags(tmp_path: Path) -> None:
    cfg = write(tmp_path / "c.yaml", {})
    env = {
        env_var("audit", "read-timeout"): "2.5",
        env_var("audit", "scan_in_flight"): "17",
        env_var("audit", "no-reread"): "yes",
        "BKAUDIT_ZK": "z:1",
        "BKAUDIT_WAREHOUSE": "/w",
    }
    assert env_var("audit", "read-timeout") == "BKAUDIT_AUDIT_READ_TIMEOUT"
    p = audit_parser()
    apply_config(p, "audit", cfg, env=env)
    a = p.parse_args([])
    assert (a.read_timeout, a.scan_in_flight, a.no_reread) == (2.5, 17, True)
    env[env_var("audit", "no_reread")] = "off"
    p = audit_parser()
    apply_config(p, "audit", cfg, env=env)
    assert p.parse_args([]).no_reread is False


@pytest.mark.parametrize(
    ("data", "env", "message"),
    [
        ({"audit": {"chek": "lost"}}, {}, "chek"),  # typo in the file
        ({"audit": {"check": "everything"}}, {}, "not one of"),
        ({}, {"BKAUDIT_AUDIT_CHECK": "everything"}, "BKAUDIT_AUDIT_CHECK"),
        ({}, {"BKAUDIT_AUDIT_READ_TIMEOUT": "soon"}, "BKAUDIT_AUDIT_READ_TIMEOUT"),
        ({}, {"BKAUDIT_AUDIT_NO_REREAD": "maybe"}, "true or false"),
        ({"audit": "lost"}, {}, "must be a mapping"),
    ],
)
def test_bad_values_name_their_source(
    tmp_path: Path, data: dict, env: dict[str, str], message: str
) -> None:
    cfg = write(tmp_path / "c.yaml", data)
    with pytest.raises(ConfigError, match=message):
        apply_config(audit_parser(), "audit", cfg, env=env)


def test_config_path_from_flag_env_and_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a_cfg = write(tmp_path / "a.yaml", {"global": {"warehouse": "/from-a", "zk": "a:1"}})
    b_cfg = write(tmp_path / "b.yaml", {"global": {"warehouse": "/from-b", "zk": "b:1"}})
    env = {"BKAUDIT_CONFIG": str(b_cfg)}
    args = parse_with_config(audit_parser(), "audit", ["--config", str(a_cfg)], env=env)
    assert (args.warehouse, args.config) == ("/from-a", str(a_cfg))
    args = parse_with_config(audit_parser(), "audit", [f"--config={a_cfg}"], env=env)
    assert args.warehouse == "/from-a"
    args = parse_with_config(audit_parser(), "audit", [], env=env)
    assert args.warehouse == "/from-b"
    # Neither: the checkout's conf/bkaudit.yaml, which sets no zk, so --zk is required again.
    args = parse_with_config(audit_parser(), "audit", ["--zk", "z:1", "--warehouse", "/w"], env={})
    assert args.config == str(DEFAULT_CONFIG_FILE)
    with pytest.raises(SystemExit):
        parse_with_config(audit_parser(), "audit", ["--config", str(tmp_path / "nope.yaml")])
    assert "does not exist" in capsys.readouterr().err


def test_help_names_where_a_changed_default_came_from(tmp_path: Path) -> None:
    cfg = write(tmp_path / "c.yaml", {"audit": {"check": "lost", "read-timeout": 5.0}})
    p = audit_parser()
    apply_config(p, "audit", cfg, env={"BKAUDIT_AUDIT_CONNECT_TIMEOUT": "9"})
    text = " ".join(p.format_help().split())
    # (the tmp path may be wrapped at its hyphens, so it is not matched whole)
    assert "[default lost from " in text and "audit.check]" in text
    assert "[default 9.0 from $BKAUDIT_AUDIT_CONNECT_TIMEOUT]" in text
    assert "audit.read_timeout" not in text  # same as the built-in default: no note
    assert "--config PATH" in text


# ---- conf/bkaudit.yaml documents every flag ----------------------------------------------------


# Every command that takes a config section, with the parser `bkaudit COMMAND` builds.
PARSERS: dict[str, Callable[[], argparse.ArgumentParser]] = {
    c.name: functools.partial(command_parser, c) for c in COMMANDS.values() if not c.own_parser
}


@pytest.mark.parametrize("command", sorted(PARSERS))
def test_shipped_config_lists_every_flag_with_its_builtin_default(command: str) -> None:
    config = load_config(DEFAULT_CONFIG_FILE)
    parser = PARSERS[command]()
    flags = {
        a.dest: a.default
        for a in parser._actions
        if a.option_strings and a.dest not in ("help", "config")
    }
    documented = {**{k: v for k, v in config["global"].items() if k in flags}, **config[command]}
    assert set(documented) == set(flags), f"conf/bkaudit.yaml {command}: keys differ from flags"
    # Values equal the built-in defaults once converted the way the flag converts them
    # ("30s" -> 30.0): applying the shipped file changes nothing.
    applied = PARSERS[command]()
    apply_config(applied, command, DEFAULT_CONFIG_FILE, env={})
    assert {d: applied.get_default(d) for d in flags} == flags


def test_shipped_config_has_a_section_per_command() -> None:
    config = load_config(DEFAULT_CONFIG_FILE)
    assert set(config) == {"global", "logging", *PARSERS}


def test_logging_section_level_and_quiet_loggers(tmp_path: Path) -> None:
    cfg = write(tmp_path / "c.yaml", {"logging": {"level": "warning", "quiet": ["bk.test.noisy"]}})
    root = logging.getLogger()
    noisy = logging.getLogger("bk.test.noisy")
    saved = root.level, noisy.level
    try:
        configure_logging(config_path=cfg, env={})
        assert (root.level, noisy.level) == (logging.WARNING, logging.WARNING)
        configure_logging(config_path=cfg, env={"BKAUDIT_LOG_LEVEL": "ERROR"})
        assert root.level == logging.ERROR
        noisy.setLevel(logging.NOTSET)
        configure_logging(verbose=True, config_path=cfg, env={})
        assert (root.level, noisy.level) == (logging.DEBUG, logging.NOTSET)  # -v: all of it
    finally:
        root.setLevel(saved[0])
        noisy.setLevel(saved[1])


@pytest.mark.parametrize("command", sorted(PARSERS))
def test_every_command_has_help_examples(command: str) -> None:
    text = help_epilog(command)
    assert text.startswith("examples:\n  ")
    assert f"bkaudit {command}" in text or f"jobs/{command}" in text
    assert env_var(command, "<FLAG>") in text and "conf/bkaudit.yaml" in text
    parser = argparse.ArgumentParser(
        prog=f"bkaudit {command}", epilog=text, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    assert "\n  bkaudit" in parser.format_help() or command == "audit"


def test_audit_read_rate_reaches_the_check_settings() -> None:
    import argparse

    from jobs.commands.audit import add_audit_arguments
    from jobs.runs.audit_run import DEFAULT_READ_RATE, AuditConfig

    def settings(*extra: str) -> object:
        parser = add_audit_arguments(argparse.ArgumentParser())
        args = parser.parse_args(["--zk", "z:2181", "--warehouse", "/w", *extra])
        return AuditConfig.from_args(args).fetch.read_rate

    assert settings() == DEFAULT_READ_RATE == 100e6
    assert settings("--read-rate", "20MiB") == 20 * 1024**2
    assert settings("--read-rate", "0") is None  # unlimited
