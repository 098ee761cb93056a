"""Defaults for every ``bkaudit`` command from a YAML file and environment variables.

Precedence, highest first:

1. flags on the command line;
2. ``BKAUDIT_<COMMAND>_<FLAG>`` environment variables (``BKAUDIT_AUDIT_READ_TIMEOUT=10``,
   ``BKAUDIT_REREPLICATE_GRACE_PERIOD=5m``, ``BKAUDIT_REREPLICATE_DRY_RUN=true``);
3. the global environment variables ``BKAUDIT_ZK``, ``BKAUDIT_WAREHOUSE``, ``BKAUDIT_MASTER``,
   ``BKAUDIT_ZK_AUTH``, ``BKAUDIT_LEDGERS_ROOT``, ``BKAUDIT_METADATA_URI``,
   ``BKAUDIT_PASSWORD`` (for every command that has the flag);
4. the command's section of the config file (``audit:``, ``rereplicate:``, ...);
5. the file's ``global:`` section;
6. the parser's built-in default.

The config file is ``--config PATH``, else ``$BKAUDIT_CONFIG``, else ``conf/bkaudit.yaml`` of
this checkout when it exists. Keys are flag names without the dashes (``read-timeout`` or
``read_timeout``). A key the command does not have is an error, so typos do not pass silently.
This module never imports Spark: ``bkaudit sandbox`` and ``bkaudit bookie`` use it too.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from jobs.options.zookeeper import SECRET_DESTS, ConnectionArgsError, resolve_connection

__all__ = [
    "DEFAULT_CONFIG_FILE",
    "GLOBAL_ENV",
    "ConfigError",
    "apply_config",
    "configure_logging",
    "env_var",
    "help_epilog",
    "load_config",
    "parse_with_config",
    "pop_log_format",
    "resolve_config_path",
]

DEFAULT_CONFIG_FILE = Path(__file__).resolve().parents[2] / "conf" / "bkaudit.yaml"
CONFIG_ENV = "BKAUDIT_CONFIG"
GLOBAL_SECTION = "global"
LOGGING_SECTION = "logging"
LOG_FORMAT_ENV = "BKAUDIT_LOG_FORMAT"

GLOBAL_ENV: dict[str, str] = {
    "zk": "BKAUDIT_ZK",
    "warehouse": "BKAUDIT_WAREHOUSE",
    "master": "BKAUDIT_MASTER",
    "zk_auth": "BKAUDIT_ZK_AUTH",
    "ledgers_root": "BKAUDIT_LEDGERS_ROOT",
    "password": "BKAUDIT_PASSWORD",
    "metadata_uri": "BKAUDIT_METADATA_URI",
}
"""Flags every command that has them takes from one environment variable."""

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def help_epilog(command: str) -> str:
    """The ``--help`` epilog of a command: examples, then where defaults come from. Use with
    ``formatter_class=argparse.RawDescriptionHelpFormatter``."""
    from jobs.cli.registry import COMMANDS

    examples = COMMANDS[command].examples if command in COMMANDS else ()
    lines = ["examples:", *(f"  {e}" for e in examples)]
    lines += [
        "",
        "defaults (highest precedence first): flags, "
        f"{env_var(command, '<FLAG>')} (e.g. {env_var(command, 'run-id')}),",
        "  BKAUDIT_ZK / BKAUDIT_WAREHOUSE / BKAUDIT_MASTER / BKAUDIT_ZK_AUTH,",
        f"  the {command}: and global: sections of --config PATH, $BKAUDIT_CONFIG or",
        "  conf/bkaudit.yaml (every flag documented there)",
    ]
    return "\n".join(lines) + "\n"


class ConfigError(ValueError):
    """A config file or environment variable that cannot be applied; names its source."""


def env_var(command: str, dest: str) -> str:
    """The environment variable for one flag: ``BKAUDIT_<COMMAND>_<FLAG>``."""
    return f"BKAUDIT_{command.upper()}_{dest.upper()}".replace("-", "_")


def resolve_config_path(
    config_path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None
) -> Path | None:
    """The config file to read: the argument, else ``$BKAUDIT_CONFIG``, else the checkout's
    ``conf/bkaudit.yaml`` if present, else None. An explicit path that is missing is an error."""
    env = os.environ if env is None else env
    explicit = config_path or env.get(CONFIG_ENV)
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            source = "--config" if config_path else f"${CONFIG_ENV}"
            raise ConfigError(f"config file {path} (from {source}) does not exist")
        return path
    return DEFAULT_CONFIG_FILE if DEFAULT_CONFIG_FILE.is_file() else None


def load_config(path: str | os.PathLike[str] | None) -> dict[str, dict[str, Any]]:
    """Read a config file into ``{section: {dest: value}}`` (keys normalised to dest names)."""
    if path is None:
        return {}
    try:
        # libyaml's loader when PyYAML was built with it: every command reads this file.
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        raw = yaml.load(Path(path).read_text(), Loader=loader) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    out: dict[str, dict[str, Any]] = {}
    for section, values in raw.items():
        if values is None:
            values = {}
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: section {section!r} must be a mapping")
        out[str(section)] = {_dest(k): v for k, v in values.items()}
    return out


def _dest(key: Any) -> str:
    return str(key).lstrip("-").replace("-", "_")


def _flag_actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The parser's optional flags by dest (help, version and positionals excluded)."""
    return {
        a.dest: a
        for a in parser._actions
        if a.option_strings and a.dest not in ("help", "version", "config", argparse.SUPPRESS)
    }


def _convert(action: argparse.Action, value: Any, source: str) -> Any:
    """Check and convert one value the way argparse would have converted the flag."""
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise ConfigError(f"{source}: expected true or false, got {value!r}")
    if value is None:
        return None
    if isinstance(value, (list, tuple)) and action.nargs not in (None, "?"):
        return [_convert_one(action, v, source) for v in value]
    return _convert_one(action, value, source)


def _convert_one(action: argparse.Action, value: Any, source: str) -> Any:
    conv = action.type
    if conv is not None and callable(conv):
        try:
            value = conv(value if isinstance(value, str) else str(value))
        except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
            raise ConfigError(f"{source}: invalid value {value!r} for --{action.dest}") from exc
    elif not isinstance(value, str):
        value = str(value)  # flags without a type are strings on the command line too
    if action.choices is not None and value not in action.choices:
        choices = ", ".join(map(str, action.choices))
        raise ConfigError(f"{source}: {value!r} is not one of {choices}")
    return value


def config_values(
    parser: argparse.ArgumentParser,
    command: str,
    config: Mapping[str, Mapping[str, Any]],
    env: Mapping[str, str] | None = None,
    config_name: str = "config",
) -> dict[str, tuple[Any, str]]:
    """The defaults config and environment give ``parser``'s flags: ``{dest: (value, source)}``.

    Raises :class:`ConfigError` for a key of the command's section that the parser lacks.
    """
    env = os.environ if env is None else env
    actions = _flag_actions(parser)
    section = dict(config.get(command, {}))
    unknown = sorted(set(section) - set(actions))
    if unknown:
        raise ConfigError(
            f"{config_name}: section {command!r} has keys that `bkaudit {command}` does not "
            f"take: {', '.join(unknown)}"
        )
    found: dict[str, tuple[Any, str]] = {}
    # Lowest precedence first; later layers overwrite.
    for key, value in config.get(GLOBAL_SECTION, {}).items():
        if key in actions:
            found[key] = (value, f"{config_name}: global.{key}")
    for key, value in section.items():
        found[key] = (value, f"{config_name}: {command}.{key}")
    for key, var in GLOBAL_ENV.items():
        if key in actions and var in env:
            found[key] = (env[var], f"${var}")
    for key in actions:
        var = env_var(command, key)
        if var in env:
            found[key] = (env[var], f"${var}")
    return {k: (_convert(actions[k], v, src), src) for k, (v, src) in found.items()}


def apply_config(
    parser: argparse.ArgumentParser,
    command: str,
    config_path: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
) -> None:
    """Set ``parser``'s defaults from the config file and the environment.

    A flag declared ``required=True`` stops being required when config or environment gives
    it a value (an empty value does not count). Adds ``--config PATH`` to the parser, so it
    shows in ``--help`` and parses. Each flag's help names where its default came from.
    """
    env = os.environ if env is None else env
    path = resolve_config_path(config_path, env)
    config = load_config(path)
    values = config_values(parser, command, config, env, str(path) if path else "config")
    actions = _flag_actions(parser)
    for dest, (value, source) in values.items():
        action = actions[dest]
        builtin = parser.get_default(dest)
        parser.set_defaults(**{dest: value})
        action.default = value
        if action.required and value not in (None, ""):
            action.required = False
        if action.help is not argparse.SUPPRESS and value != builtin:
            # %% because argparse %-formats help strings. A secret's value is never shown.
            shown = "set" if dest in SECRET_DESTS else f"{str(value).replace('%', '%%')}"
            note = f"[default {shown} from {source}]"
            action.help = f"{action.help} {note}" if action.help else note
    if "config" not in {a.dest for a in parser._actions}:
        parser.add_argument(
            "--config",
            metavar="PATH",
            default=str(path) if path else None,
            help=f"YAML config file (default: ${CONFIG_ENV}, else conf/bkaudit.yaml)",
        )


def config_path_from_argv(argv: Sequence[str]) -> str | None:
    """The value of ``--config PATH`` / ``--config=PATH`` in ``argv``, if given."""
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return None


def pop_log_format(argv: list[str]) -> str | None:
    """Remove ``--log-format X`` / ``--log-format=X`` from ``argv`` (the command's own parser
    does not know the flag) and return the last X given, or None."""
    found = None
    i = 0
    while i < len(argv):
        if argv[i] == "--log-format" and i + 1 < len(argv):
            found = argv[i + 1]
            del argv[i : i + 2]
        elif argv[i].startswith("--log-format="):
            found = argv.pop(i).split("=", 1)[1]
        else:
            i += 1
    return found


def parse_with_config(
    parser: argparse.ArgumentParser,
    command: str,
    argv: Sequence[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
) -> argparse.Namespace:
    """Apply config and environment to ``parser`` (``--config`` taken from ``argv``), then
    parse ``argv``. A bad config file or variable is a usage error (exit 2) naming its source."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        apply_config(parser, command, config_path_from_argv(argv), env=env)
    except ConfigError as exc:
        parser.error(str(exc))
    args = parser.parse_args(argv)
    try:
        return resolve_connection(parser, args, argv)
    except ConnectionArgsError as exc:  # one line, exit 2 (no usage block)
        print(f"{command}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def configure_logging(
    verbose: bool = False,
    config_path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    log_format: str | None = None,
) -> None:
    """Python logging for the jobs from the file's ``logging:`` section (level, format,
    log-format, quiet loggers). ``$BKAUDIT_LOG_LEVEL`` and ``verbose`` (DEBUG) override the
    level; ``log_format`` (``--log-format``), else ``$BKAUDIT_LOG_FORMAT``, else the section's
    ``log-format`` picks ``text`` or ``json`` (one object per line, for schedulers). The JVM
    side logs through ``conf/log4j2.properties``."""
    from jobs.runtime.logs import DEFAULT_TEXT_FORMAT, LOG_FORMATS, setup_logging

    env = os.environ if env is None else env
    try:
        section = load_config(resolve_config_path(config_path, env)).get(LOGGING_SECTION, {})
    except ConfigError:
        section = {}  # logging must come up even when the file is broken; the parser reports
    level = str(env.get("BKAUDIT_LOG_LEVEL") or section.get("level", "INFO"))
    style = str(log_format or env.get(LOG_FORMAT_ENV) or section.get("log_format") or "text")
    if style.lower() not in LOG_FORMATS:
        # A typo in a scheduler's environment must not cost the run its logs.
        print(f"bkaudit: log format {style!r} is not text or json; using text", file=sys.stderr)
        style = "text"
    setup_logging(
        level,
        verbose=verbose,
        fmt=style.lower(),
        text_format=str(section.get("format", DEFAULT_TEXT_FORMAT)),
        quiet=list(section.get("quiet", ["kazoo", "py4j"])),
    )
