"""Where the metadata is and the secrets to read it, for every command that takes ``--zk``.

:func:`add_connection_arguments` adds ``--metadata-uri`` (BookKeeper's ``metadataServiceUri``,
parsed by :mod:`bklib.meta.uri`), ``--zk-auth-file`` and, where the command has
``--password``, ``--password-file``. :func:`resolve_connection` runs once after parsing
(:func:`jobs.cli.config.parse_with_config`) and leaves the rest of the job the plain
``args.zk``, ``args.ledgers_root``, ``args.zk_auth`` and ``args.password`` it always read.
Secrets may also come from ``$BKAUDIT_ZK_AUTH`` and ``$BKAUDIT_PASSWORD``; they are never
logged nor shown in ``--help``. ZooKeeper TLS and SASL (``--zk-tls*``, ``--zk-sasl-jaas-file``,
``--zk-enable-security``) come from :mod:`jobs.options.zookeeper_security`; with any of them
``args.zk_auth`` becomes a :class:`bklib.meta.stores.zookeeper.security.ZkAccess`. Oxia's TLS
and token (``--oxia-tls*``, ``--oxia-token-file``) come from :mod:`jobs.options.oxia_security`
and make it a :class:`bklib.meta.oxia_security.OxiaAccess`.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence

from bklib.meta.stores import is_oxia
from bklib.meta.stores.zookeeper import security as zk_security
from bklib.meta.stores.zookeeper.budget import DEFAULT_REQUEST_RATE, set_request_rate
from bklib.meta.stores.zookeeper.connect_string import (
    CONNECT_STRING_FORMS,
    ConnectStringError,
    parse_connect_string,
)
from bklib.meta.uri import METADATA_URI_FORMS, InvalidMetadataUri, parse_metadata_uri
from bklib.states import DEFAULT_LEDGERS_ROOT
from jobs.options.oxia_security import (
    OxiaSecurityArgsError,
    add_oxia_security_arguments,
    resolve_oxia_security,
)
from jobs.options.tls import TLS_DEST, TlsConfigError, add_tls_arguments, tls_from_args
from jobs.options.units import parse_duration, parse_request_rate
from jobs.options.warehouse import WAREHOUSE_HELP, WarehouseUriError, check_warehouse_uri
from jobs.options.zookeeper_security import (
    ZkSecurityArgsError,
    add_zk_security_arguments,
    refuse_on_other_stores,
    resolve_zk_security,
    zk_security_given,
)

__all__ = [
    "SECRET_DESTS",
    "ConnectionArgsError",
    "add_connection_arguments",
    "add_session_timeout_argument",
    "forget_redactions",
    "read_secret_file",
    "redact_in_logs",
    "resolve_connection",
]

SECRET_DESTS = frozenset({"zk_auth", "password"})
"""Flags whose values are secrets: kept out of help texts and logs."""

_ZK_REQUIRED = "_bkaudit_zk_required"

ZK_HELP = f"ZooKeeper connect string, {CONNECT_STRING_FORMS}"
"""``--zk``'s help text, set here for every command that has the flag."""


class ConnectionArgsError(ValueError):
    """A one-line usage error (exit 2) about --metadata-uri, --zk or a secret file."""


def _action(parser: argparse.ArgumentParser, dest: str) -> argparse.Action | None:
    return next((a for a in parser._actions if a.dest == dest and a.option_strings), None)


def add_connection_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``--metadata-uri``, ``--zk-auth-file`` (and ``--password-file``) to a parser that
    has ``--zk``; ``--zk`` stops being required by argparse (one of the two is required)."""
    zk = _action(parser, "zk")
    if zk is None or _action(parser, "metadata_uri") is not None:
        return parser
    setattr(parser, _ZK_REQUIRED, bool(zk.required))
    zk.required = False
    if zk.help is None or zk.help.startswith("ZooKeeper connect string, "):
        zk.help = ZK_HELP  # the forms from their one definition; other wordings stay
    warehouse = _action(parser, "warehouse")
    if warehouse is not None and warehouse.help and warehouse.help.startswith("directory or"):
        warehouse.help = WAREHOUSE_HELP
    parser.add_argument(
        "--metadata-uri",
        default=None,
        help=f"BookKeeper's metadataServiceUri instead of --zk/--ledgers-root: "
        f"{METADATA_URI_FORMS}",
    )
    parser.add_argument(
        "--zk-auth-file",
        default=None,
        metavar="PATH",
        help="file holding the ZooKeeper digest auth user:password (or $BKAUDIT_ZK_AUTH)",
    )
    parser.add_argument(
        "--zk-rate",
        type=parse_request_rate,
        default=DEFAULT_REQUEST_RATE,
        metavar="N",
        help="most ZooKeeper requests per second this run sends, all of them counted (scan, "
        f"marks, locks, compare-and-set, watch; shared by Spark's tasks); 0: unlimited "
        f"(default {DEFAULT_REQUEST_RATE:g}, docs/zookeeper-budget.md)",
    )
    add_zk_security_arguments(parser)  # --zk-tls*, --zk-sasl-jaas-file, --zk-enable-security
    add_oxia_security_arguments(parser)  # --oxia-tls*, --oxia-token-file
    add_tls_arguments(parser)  # bookie TLS: --tls-provider-factory-class, --tls-trust-store, ...
    if _action(parser, "password") is not None:
        parser.add_argument(
            "--password-file",
            default=None,
            metavar="PATH",
            help="file holding the ledger password (or $BKAUDIT_PASSWORD)",
        )
    return parser


def add_session_timeout_argument(
    parser: argparse.ArgumentParser, *, default: float, effect: str
) -> None:
    """``--zk-session-timeout`` for a command that holds ZooKeeper sessions; ``effect`` says
    what the timeout decides for that command."""
    parser.add_argument(
        "--zk-session-timeout",
        type=parse_duration,
        default=default,
        help=f"ZooKeeper session timeout: {effect} (default {default:g}s)",
    )


def read_secret_file(path: str, flag: str) -> str:
    """The file's text without its trailing line break; a one-line error when unreadable."""
    return zk_security.read_secret_file(path, flag, ConnectionArgsError)


class _Redact(logging.Filter):
    """Replace secrets in log records (kazoo logs its Auth request at DEBUG, ``-v``)."""

    def __init__(self, secrets: Sequence[str]) -> None:
        super().__init__()
        self.secrets = [s for s in secrets if s]

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if any(s in text for s in self.secrets):
            for s in self.secrets:
                text = text.replace(s, "***")
            record.msg, record.args = text, ()
        return True


def redact_in_logs(*secrets: str | None) -> None:
    """Keep ``secrets`` out of every log line: on the root handlers and kazoo's logger."""
    redact = _Redact([s for s in secrets if s])
    if not redact.secrets:
        return
    for handler in logging.getLogger().handlers:
        handler.addFilter(redact)
    logging.getLogger("kazoo.client").addFilter(redact)


def forget_redactions() -> None:
    """Remove what :func:`redact_in_logs` installed: for a process that runs several commands
    (a test session, a notebook), so that one command's secrets do not mask the next one's
    log lines."""
    for target in (*logging.getLogger().handlers, logging.getLogger("kazoo.client")):
        for f in [f for f in target.filters if isinstance(f, _Redact)]:
            target.removeFilter(f)


def _given(argv: Sequence[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in argv)


def resolve_connection(
    parser: argparse.ArgumentParser, args: argparse.Namespace, argv: Sequence[str]
) -> argparse.Namespace:
    """Turn ``--metadata-uri`` and the secret files into ``zk``, ``ledgers_root``,
    ``zk_auth`` and ``password`` on ``args``; refuse a ``--zk`` or ``--warehouse`` typo in
    one line naming the accepted forms. Raises :class:`ConnectionArgsError`."""
    _check_warehouse(args)
    if not hasattr(parser, _ZK_REQUIRED):
        return args
    _read_secret_flags(args)
    zk_auth: str | None = getattr(args, "zk_auth", None)
    redact_in_logs(
        zk_auth, zk_auth.partition(":")[2] if zk_auth else None, getattr(args, "password", None)
    )
    # Refused before anything else is read or checked: a ZooKeeper-only flag on Oxia.
    zk_only = zk_security_given(parser, args)
    _apply_metadata_uri(parser, args, argv)
    _check_zk(args)
    try:
        refuse_on_other_stores(args.zk or "", zk_only)
        redact_in_logs(*resolve_zk_security(args))  # args.zk_auth: a ZkAccess with any flag
        # On Oxia args.zk_auth becomes an OxiaAccess; on ZooKeeper the Oxia flags are refused.
        redact_in_logs(*resolve_oxia_security(args, args.zk or ""))
    except (ZkSecurityArgsError, OxiaSecurityArgsError) as exc:
        raise ConnectionArgsError(str(exc)) from None
    try:  # bookie TLS flags: args.bookie_tls, a TlsSettings or None
        setattr(args, TLS_DEST, tls_from_args(args))
    except TlsConfigError as exc:
        raise ConnectionArgsError(exc.reason) from None
    if not is_oxia(args.zk or ""):  # the budget is ZooKeeper's (docs/zookeeper-budget.md)
        set_request_rate(getattr(args, "zk_rate", DEFAULT_REQUEST_RATE))
    return args


def _check_warehouse(args: argparse.Namespace) -> None:
    warehouse = getattr(args, "warehouse", None)
    if warehouse is not None:
        try:
            check_warehouse_uri(str(warehouse))
        except WarehouseUriError as exc:
            raise ConnectionArgsError(str(exc)) from None


def _check_zk(args: argparse.Namespace) -> None:
    """A ``--zk`` that is no connect string, refused before anything connects."""
    zk = getattr(args, "zk", None)
    if not zk or is_oxia(zk) or getattr(args, "metadata_uri", None):
        return
    try:
        parse_connect_string(zk)
    except ConnectStringError as exc:
        raise ConnectionArgsError(f"--zk: {exc}; give {CONNECT_STRING_FORMS}") from None


def _read_secret_flags(args: argparse.Namespace) -> None:
    """``--zk-auth-file`` and ``--password-file`` into ``zk_auth`` and ``password``, each
    given once."""
    auth_file = getattr(args, "zk_auth_file", None)
    if auth_file:
        if getattr(args, "zk_auth", None):
            raise ConnectionArgsError(
                "give the ZooKeeper auth once: --zk-auth ($BKAUDIT_ZK_AUTH) or --zk-auth-file"
            )
        auth = read_secret_file(auth_file, "--zk-auth-file").strip()
        user, sep, _ = auth.partition(":")
        if not sep or not user or "\n" in auth:
            raise ConnectionArgsError(
                f"--zk-auth-file {auth_file}: expected one line user:password"
            )
        args.zk_auth = auth
    password_file = getattr(args, "password_file", None)
    if password_file:
        if getattr(args, "password", None) is not None:
            raise ConnectionArgsError(
                "give the ledger password once: --password ($BKAUDIT_PASSWORD) or --password-file"
            )
        args.password = read_secret_file(password_file, "--password-file")


def _apply_metadata_uri(
    parser: argparse.ArgumentParser, args: argparse.Namespace, argv: Sequence[str]
) -> None:
    """``--metadata-uri`` into ``zk`` and ``ledgers_root``; or check ``--zk`` was given."""
    uri = getattr(args, "metadata_uri", None)
    if uri:
        root = getattr(args, "ledgers_root", DEFAULT_LEDGERS_ROOT)
        if args.zk or _given(argv, "--zk"):
            raise ConnectionArgsError("--metadata-uri and --zk do not go together; give one")
        if _given(argv, "--ledgers-root") or root not in (None, DEFAULT_LEDGERS_ROOT):
            raise ConnectionArgsError("--metadata-uri names the ledgers root; drop --ledgers-root")
        try:
            target = parse_metadata_uri(uri)
        except InvalidMetadataUri as exc:
            raise ConnectionArgsError(str(exc)) from None
        args.zk = target.connect
        args.ledgers_root = target.ledgers_root
    elif getattr(parser, _ZK_REQUIRED) and not args.zk:
        raise ConnectionArgsError("one of --zk or --metadata-uri is required")
