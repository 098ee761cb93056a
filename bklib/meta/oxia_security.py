"""How to reach a secured Oxia: TLS (server-verified, optionally mutual) and a bearer token.

Oxia's server (``oxia server``, v0.14) secures its public port with ``--tls-cert-file`` /
``--tls-key-file`` (``--tls-trusted-ca-file`` and ``--tls-client-auth`` for client
certificates) and authenticates every call with ``--auth-provider-name oidc``: the
``authorization: Bearer <JWT>`` gRPC metadata, verified against the issuers of
``--auth-provider-params`` (``allowedIssueURLs``, ``allowedAudiences``, ``userNameClaim``).
Pulsar's ``OxiaMetadataStoreProvider`` talks to the same port. :class:`OxiaAccess` describes
what our client sends; it is frozen and picklable, so it travels to helper processes and
Spark executors in the ``auth`` slot that carries a ZooKeeper :class:`ZkAccess` on ZooKeeper
(:data:`bklib.meta.stores.zookeeper.security.ZkAuth`).

Flags (the jobs through :mod:`jobs.options.oxia_security`, and the Python bookie):
``--oxia-tls``, ``--oxia-tls-ca PEM``, ``--oxia-tls-cert PEM`` / ``--oxia-tls-key PEM``,
``--oxia-tls-server-name NAME`` and ``--oxia-token-file PATH`` (or ``$BKAUDIT_OXIA_TOKEN``).
The token is never a flag value and never logged; it is sent only over TLS.

This module is a leaf (standard library only): the ZooKeeper security module names it in
``ZkAuth`` without importing the stores package.
"""

from __future__ import annotations

import argparse
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "OXIA_SECURITY_DESTS",
    "TOKEN_ENV",
    "OxiaAccess",
    "OxiaAccessConfigError",
    "OxiaTls",
    "add_oxia_access_arguments",
    "oxia_access_from_args",
    "oxia_security_given",
]

TOKEN_ENV = "BKAUDIT_OXIA_TOKEN"
"""The environment variable a token may come from instead of ``--oxia-token-file``."""

OXIA_SECURITY_DESTS = (
    "oxia_tls",
    "oxia_tls_ca",
    "oxia_tls_cert",
    "oxia_tls_key",
    "oxia_tls_server_name",
    "oxia_token_file",
)
"""The dests :func:`add_oxia_access_arguments` adds (config keys, with dashes)."""


class OxiaAccessConfigError(ValueError):
    """An Oxia security flag, certificate or token file that cannot be used (one line)."""


@dataclass(frozen=True)
class OxiaTls:
    """TLS to Oxia's public port. Files are PEM; ``ca_file`` None trusts the system store;
    ``cert_file`` with ``key_file`` is the client certificate for a server started with
    ``--tls-client-auth``; ``server_name`` is the name the server's certificate must carry
    when it is not the host of the address (as Oxia's ``--peer-tls-server-name``)."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_name: str | None = None

    def read(self) -> tuple[bytes | None, bytes | None, bytes | None]:
        """(CA certificates, client key, client certificate chain) as gRPC takes them."""

        def load(path: str | None) -> bytes | None:
            return Path(path).read_bytes() if path else None

        return load(self.ca_file), load(self.key_file), load(self.cert_file)


@dataclass(frozen=True)
class OxiaAccess:
    """Everything an Oxia connection needs besides its address. ``token`` is the value read
    when the flags were resolved (what an executor without the file uses); ``token_file``,
    when given, is re-read when it changes, so a rotated token (a Kubernetes projected
    service-account token) is picked up by long-lived processes."""

    tls: OxiaTls | None = None
    token: str | None = field(default=None, repr=False)
    token_file: str | None = None

    def secrets(self) -> tuple[str, ...]:
        """Every secret value this access holds (the token)."""
        return (self.token,) if self.token else ()

    def describe(self) -> str:
        """What this access does, for logs and errors (no secrets)."""
        parts = []
        if self.tls is not None:
            parts.append("TLS" + (" with a client certificate" if self.tls.cert_file else ""))
        if self.token is not None:
            parts.append("a bearer token")
        return ", ".join(parts) or "plain text"

    def current_token(self) -> str | None:
        """The token to send now: the file's text when it is readable (re-read when its
        modification time changes), else the value read at start."""
        if self.token_file is None:
            return self.token
        return _TOKEN_FILES.read(self.token_file, self.token)


class _TokenFiles:
    """The last text read from each token file, keyed by path and modification time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[float, str]] = {}

    def read(self, path: str, fallback: str | None) -> str | None:
        try:
            mtime = os.stat(path).st_mtime
        except OSError:
            return fallback  # an executor without the file: the value from the driver
        with self._lock:
            seen = self._seen.get(path)
        if seen is not None and seen[0] == mtime:
            return seen[1]
        try:
            text = _token_text(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            return fallback
        if not text:
            return fallback  # caught mid-rotation: keep the last good token
        with self._lock:
            self._seen[path] = (mtime, text)
        return text


_TOKEN_FILES = _TokenFiles()


def _token_text(text: str) -> str:
    return text.strip()


def add_oxia_access_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the Oxia TLS and token flags (see the module docstring) in their own help group,
    once; returns ``parser``."""
    if any(a.dest == "oxia_tls" for a in parser._actions):
        return parser
    group = parser.add_argument_group(
        "Oxia TLS and authentication",
        "for metadata-store:oxia://; the token only from a file or $" + TOKEN_ENV
        + "; see docs/security.md",
    )  # fmt: skip
    group.add_argument(
        "--oxia-tls",
        action="store_true",
        help="connect to Oxia's public port with TLS (oxia server --tls-cert-file)",
    )
    group.add_argument(
        "--oxia-tls-ca",
        default=None,
        metavar="PEM",
        help="CA certificates trusted for Oxia's certificate; default: the system store",
    )
    group.add_argument(
        "--oxia-tls-cert",
        default=None,
        metavar="PEM",
        help="client certificate, for a server with --tls-client-auth (needs --oxia-tls-key)",
    )
    group.add_argument(
        "--oxia-tls-key", default=None, metavar="PEM", help="private key of --oxia-tls-cert"
    )
    group.add_argument(
        "--oxia-tls-server-name",
        default=None,
        metavar="NAME",
        help="the name Oxia's certificate must carry, when not the host of the URI",
    )
    group.add_argument(
        "--oxia-token-file",
        default=None,
        metavar="PATH",
        help="file holding the bearer token (a JWT) for Oxia's oidc authentication "
        f"(or ${TOKEN_ENV}); re-read when it changes; needs --oxia-tls",
    )
    return parser


def _readable(path: str | None, flag: str) -> str | None:
    if path is None:
        return None
    p = Path(path).expanduser()
    if not p.is_file() or not os.access(p, os.R_OK):
        raise OxiaAccessConfigError(f"{flag} {path}: no such readable file")
    return str(p)


def oxia_security_given(args: argparse.Namespace) -> list[str]:
    """The Oxia flags ``args`` sets (and ``$BKAUDIT_OXIA_TOKEN`` when set), as flags: what a
    store other than Oxia has to refuse."""
    given = [
        "--" + dest.replace("_", "-") for dest in OXIA_SECURITY_DESTS if getattr(args, dest, None)
    ]
    if hasattr(args, "oxia_tls") and os.environ.get(TOKEN_ENV):
        given.append("$" + TOKEN_ENV)
    return given


def oxia_access_from_args(args: argparse.Namespace) -> OxiaAccess | None:
    """The :class:`OxiaAccess` the flags of :func:`add_oxia_access_arguments` describe; None
    without any. Raises :class:`OxiaAccessConfigError` (one line)."""
    use_tls = bool(getattr(args, "oxia_tls", False))
    tls_flags = {
        "--oxia-tls-ca": getattr(args, "oxia_tls_ca", None),
        "--oxia-tls-cert": getattr(args, "oxia_tls_cert", None),
        "--oxia-tls-key": getattr(args, "oxia_tls_key", None),
        "--oxia-tls-server-name": getattr(args, "oxia_tls_server_name", None),
    }
    given = [flag for flag, value in tls_flags.items() if value]
    if given and not use_tls:
        raise OxiaAccessConfigError(f"{given[0]} needs --oxia-tls")
    token_file = getattr(args, "oxia_token_file", None)
    env_token = os.environ.get(TOKEN_ENV)
    if token_file and env_token:
        raise OxiaAccessConfigError(
            f"give the Oxia token once: --oxia-token-file or ${TOKEN_ENV}, not both"
        )
    token: str | None = None
    if token_file:
        path = _readable(token_file, "--oxia-token-file")
        assert path is not None
        try:
            token = _token_text(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            raise OxiaAccessConfigError(
                f"--oxia-token-file {token_file}: cannot read: {exc}"
            ) from None
        if not token:
            raise OxiaAccessConfigError(f"--oxia-token-file {token_file}: the file is empty")
        token_file = path
    elif env_token:
        token = _token_text(env_token)
    if token is not None and not use_tls:
        source = "--oxia-token-file" if token_file else f"${TOKEN_ENV}"
        raise OxiaAccessConfigError(
            f"{source}: a token is sent to Oxia only over TLS; add --oxia-tls"
        )
    if not use_tls:
        return None
    cert = _readable(tls_flags["--oxia-tls-cert"], "--oxia-tls-cert")
    key = _readable(tls_flags["--oxia-tls-key"], "--oxia-tls-key")
    if bool(cert) != bool(key):
        raise OxiaAccessConfigError("--oxia-tls-cert and --oxia-tls-key go together")
    tls = OxiaTls(
        ca_file=_readable(tls_flags["--oxia-tls-ca"], "--oxia-tls-ca"),
        cert_file=cert,
        key_file=key,
        server_name=tls_flags["--oxia-tls-server-name"],
    )
    return OxiaAccess(tls=tls, token=token, token_file=token_file or None)
