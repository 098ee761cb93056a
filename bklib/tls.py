"""Bookie TLS: settings named after BookKeeper's, SSL contexts for both ends, and the errors.

BookKeeper secures a bookie connection by upgrading it (START_TLS): the client sends a v3
request with operation START_TLS right after connecting, the bookie answers EOK in plaintext,
then both run a TLS handshake on the same socket; v2 (``useV2WireProtocol``) connections are
upgraded the same way before their first v2 request. A bookie without TLS answers EBADREQ.

:class:`TlsSettings` holds what BookKeeper's ``TLSContextFactory`` reads with PEM key and
trust stores, under the same meaning:

* ``tlsCertificatePath`` / ``tlsKeyStore`` (type PEM): this side's certificate chain and key;
  ``tlsKeyStorePasswordPath`` the key's password file, if it is encrypted;
* ``tlsTrustStore`` (type PEM): the CA certificates the peer's certificate must chain to. A
  client always verifies the bookie's certificate (a trust store is required, as in
  BookKeeper); a bookie verifies clients only with ``tlsClientAuthentication``;
* ``tlsClientAuthentication``: on a bookie, require a client certificate (mTLS); on a client,
  present one;
* ``tlsHostnameVerificationEnabled`` (client; off by default, as in BookKeeper): also check
  that the bookie's certificate names the host dialled.

The settings are a frozen dataclass of paths and flags, picklable, so they travel to Spark
executors; each process builds its own :class:`ssl.SSLContext` from them
(:class:`TlsContextSource`, which rebuilds it when a file changes, as BookKeeper refreshes its
certificates).
"""

from __future__ import annotations

import argparse
import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from bklib.errors import BookieHandleNotAvailableError, IncorrectParameterError

__all__ = [
    "PROVIDER_FACTORY_CLASS",
    "BookieTlsError",
    "TlsConfigError",
    "TlsContextSource",
    "TlsHandshakeError",
    "TlsNotConfiguredError",
    "TlsSettings",
    "add_tls_arguments",
    "client_context",
    "describe_ssl_error",
    "server_context",
    "tls_settings_from_args",
]

PROVIDER_FACTORY_CLASS = "org.apache.bookkeeper.tls.TLSContextFactory"
"""BookKeeper's ``tlsProviderFactoryClass`` whose behaviour (PEM files) bklib implements."""

Role = Literal["client", "server"]


class TlsConfigError(IncorrectParameterError):
    """TLS settings that cannot work: a missing or unreadable PEM file, a key that does not
    match its certificate, an unsupported store type. Names the setting and the file."""


class BookieTlsError(BookieHandleNotAvailableError):
    """A bookie connection could not be secured, so nothing was sent on it. The bookie is
    unreachable for this client (never a negative answer about any entry). ``code`` is
    BookKeeper's ``SecurityException``."""

    code = -24


class TlsNotConfiguredError(BookieTlsError):
    """The bookie answered START_TLS with EBADREQ: it has no TLS configured."""


class TlsHandshakeError(BookieTlsError):
    """The TLS handshake failed: expired or untrusted certificate, wrong host name, the
    bookie refused our certificate, or the peer does not speak TLS."""


@dataclass(frozen=True)
class TlsSettings:
    """One side's TLS settings (paths to PEM files and flags); picklable. See the module
    docstring for what each field means on a client and on a bookie."""

    trust_store: str | None = None
    """tlsTrustStore (PEM): CA certificates to verify the peer with."""
    certificate_path: str | None = None
    """tlsCertificatePath: this side's certificate chain (PEM)."""
    key_store: str | None = None
    """tlsKeyStore (PEM): this side's private key."""
    key_store_password_path: str | None = None
    """tlsKeyStorePasswordPath: file holding the private key's password, if it is encrypted."""
    client_authentication: bool = False
    """tlsClientAuthentication: a bookie requires client certificates; a client presents one."""
    hostname_verification: bool = False
    """tlsHostnameVerificationEnabled (client only): the certificate must name the host."""
    handshake_timeout: float = 10.0
    """startTLSTimeoutSecs: bound of the START_TLS answer and of the handshake."""

    def files(self) -> tuple[str, ...]:
        """Every file the settings name (their changes rebuild a :class:`TlsContextSource`)."""
        return tuple(
            p
            for p in (
                self.trust_store,
                self.certificate_path,
                self.key_store,
                self.key_store_password_path,
            )
            if p
        )

    def describe(self) -> str:
        """One line for logs: what is checked, never a secret."""
        parts = [f"trust {self.trust_store or '-'}"]
        if self.certificate_path:
            parts.append(f"cert {self.certificate_path}")
        if self.client_authentication:
            parts.append("client authentication")
        if self.hostname_verification:
            parts.append("hostname verification")
        return ", ".join(parts)


def _load_chain(ctx: ssl.SSLContext, settings: TlsSettings, who: str) -> None:
    cert, key = settings.certificate_path, settings.key_store
    if not cert:
        raise TlsConfigError(f"{who} needs tlsCertificatePath (its PEM certificate chain)")
    if not key:
        raise TlsConfigError(f"{who} needs tlsKeyStore (the PEM private key of {cert})")
    password: str | None = None
    if settings.key_store_password_path:
        password = _read(settings.key_store_password_path, "tlsKeyStorePasswordPath").rstrip("\r\n")
    for path, name in ((cert, "tlsCertificatePath"), (key, "tlsKeyStore")):
        _readable(path, name)
    try:
        ctx.load_cert_chain(cert, key, password)
    except ssl.SSLError as exc:
        raise TlsConfigError(
            f"cannot load certificate {cert} with key {key}: {exc.reason or exc} (not PEM, "
            "a key that does not match the certificate, or a wrong key password)"
        ) from None


def _load_trust(ctx: ssl.SSLContext, path: str) -> None:
    _readable(path, "tlsTrustStore")
    try:
        ctx.load_verify_locations(cafile=path)
    except ssl.SSLError as exc:
        raise TlsConfigError(
            f"tlsTrustStore {path}: no PEM CA certificate in it ({exc.reason or exc})"
        ) from None


def _readable(path: str, name: str) -> None:
    if not os.access(path, os.R_OK) or not Path(path).is_file():
        raise TlsConfigError(f"{name} {path}: not a readable file")


def _read(path: str, name: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TlsConfigError(f"{name} {path}: cannot read: {exc}") from None


def client_context(settings: TlsSettings) -> ssl.SSLContext:
    """The client side's context: the bookie's certificate must chain to ``trust_store``
    (host name checked only with ``hostname_verification``); our certificate is presented
    when one is configured, and must be with ``client_authentication``."""
    if not settings.trust_store:
        raise TlsConfigError(
            "a TLS client needs tlsTrustStore: the PEM CA certificates that signed the "
            "bookies' certificates"
        )
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = settings.hostname_verification
    ctx.verify_mode = ssl.CERT_REQUIRED
    _load_trust(ctx, settings.trust_store)
    if settings.client_authentication or settings.certificate_path or settings.key_store:
        _load_chain(ctx, settings, "a TLS client with tlsClientAuthentication")
    return ctx


def server_context(settings: TlsSettings) -> ssl.SSLContext:
    """The bookie side's context: our certificate and key; with ``client_authentication``,
    a client certificate chaining to ``trust_store`` is required."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(ctx, settings, "a TLS bookie")
    if settings.client_authentication:
        if not settings.trust_store:
            raise TlsConfigError(
                "tlsClientAuthentication needs tlsTrustStore: the PEM CA certificates "
                "that signed the clients' certificates"
            )
        _load_trust(ctx, settings.trust_store)
        ctx.verify_mode = ssl.CERT_REQUIRED
    else:
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


class TlsContextSource:
    """An SSL context built from settings on first use and rebuilt when one of the files
    changes (Pulsar's Helm chart rewrites them in place every few minutes). Not picklable;
    one per pool or bookie."""

    def __init__(self, settings: TlsSettings, role: Role) -> None:
        self.settings = settings
        self.role: Role = role
        self._ctx: ssl.SSLContext | None = None
        self._stamp: tuple[tuple[float, int], ...] | None = None

    def _files_stamp(self) -> tuple[tuple[float, int], ...]:
        out = []
        for path in self.settings.files():
            try:
                st = os.stat(path)
                out.append((st.st_mtime, st.st_size))
            except OSError:
                out.append((-1.0, -1))
        return tuple(out)

    def get(self) -> ssl.SSLContext:
        """The current context; raises :class:`TlsConfigError` if it cannot be built."""
        stamp = self._files_stamp()
        if self._ctx is None or stamp != self._stamp:
            build = client_context if self.role == "client" else server_context
            self._ctx = build(self.settings)
            self._stamp = stamp
        return self._ctx


def describe_ssl_error(exc: BaseException, *, role: Role = "client") -> str:
    """What a failed handshake means, in words an operator can act on."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        why = exc.verify_message or str(exc)
        peer = "bookie's" if role == "client" else "client's"
        if "expired" in why or "not yet valid" in why:
            return f"the {peer} certificate is not valid now ({why})"
        if "hostname" in why.lower() or "ip address mismatch" in why.lower():
            return f"the {peer} certificate does not name the host dialled ({why})"
        return f"the {peer} certificate is not trusted by tlsTrustStore ({why})"
    if isinstance(exc, ssl.SSLError):
        reason = (exc.reason or str(exc)).lower().replace("_", " ")
        if "alert" in reason and role == "client":
            if "certificate required" in reason or "handshake failure" in reason:
                return f"the bookie requires a client certificate we did not present ({reason})"
            if "certificate" in reason or "unknown ca" in reason:
                return f"the bookie refused our client certificate ({reason})"
        if "wrong version number" in reason or "record layer failure" in reason:
            return f"the peer does not speak TLS ({reason})"
        return f"TLS error: {reason}"
    if isinstance(exc, (ConnectionResetError, BrokenPipeError)):
        return "the peer closed the connection during the TLS handshake"
    if isinstance(exc, TimeoutError):
        return "the TLS handshake did not finish in time"
    return f"{type(exc).__name__}: {exc}"


# ---- command-line flags, named after BookKeeper's configuration keys ---------------------------

_STORE_TYPES = ("PEM",)


def add_tls_arguments(parser: argparse.ArgumentParser, *, role: Role) -> argparse.ArgumentParser:
    """Add BookKeeper's TLS keys as flags (``tlsKeyStore`` -> ``--tls-key-store``). TLS is
    on when ``--tls-provider-factory-class`` is set, as in BookKeeper."""
    who = "bookie" if role == "server" else "client"
    g = parser.add_argument_group(
        "bookie TLS",
        "BookKeeper's TLS keys (tlsProviderFactoryClass, tlsCertificatePath, tlsKeyStore, ...) "
        "with PEM files; see docs/security.md",
    )
    g.add_argument(
        "--tls-provider-factory-class",
        default=None,
        metavar="CLASS",
        help=f"turn bookie TLS on: {PROVIDER_FACTORY_CLASS} (or TLSContextFactory)",
    )
    g.add_argument(
        "--tls-certificate-path",
        default=None,
        metavar="PEM",
        help=f"the {who}'s certificate chain"
        + (" (presented with --tls-client-authentication)" if role == "client" else ""),
    )
    g.add_argument(
        "--tls-key-store", default=None, metavar="PEM", help=f"the {who}'s private key (PEM)"
    )
    g.add_argument("--tls-key-store-type", default="PEM", help="type of --tls-key-store (PEM only)")
    g.add_argument(
        "--tls-key-store-password-path",
        default=None,
        metavar="PATH",
        help="file holding the private key's password (encrypted keys)",
    )
    g.add_argument(
        "--tls-trust-store",
        default=None,
        metavar="PEM",
        help="CA certificates that sign the "
        + ("bookies' certificates (required)" if role == "client" else "clients' certificates"),
    )
    g.add_argument(
        "--tls-trust-store-type", default="PEM", help="type of --tls-trust-store (PEM only)"
    )
    g.add_argument(
        "--tls-client-authentication",
        action="store_true",
        help="require client certificates (mTLS)"
        if role == "server"
        else "present our certificate to the bookies (mTLS)",
    )
    if role == "client":
        g.add_argument(
            "--tls-hostname-verification-enabled",
            action="store_true",
            help="also check that a bookie's certificate names its host (off, as in BookKeeper)",
        )
    return parser


_PATH_FLAGS = (
    ("tls_certificate_path", "--tls-certificate-path"),
    ("tls_key_store", "--tls-key-store"),
    ("tls_key_store_password_path", "--tls-key-store-password-path"),
    ("tls_trust_store", "--tls-trust-store"),
)


def tls_settings_from_args(args: argparse.Namespace, *, role: Role) -> TlsSettings | None:
    """The settings the flags of :func:`add_tls_arguments` describe (None: TLS off), checked
    by building the context once. Raises :class:`TlsConfigError` with a one-line reason."""
    provider = getattr(args, "tls_provider_factory_class", None)
    given = [flag for dest, flag in _PATH_FLAGS if getattr(args, dest, None)]
    if getattr(args, "tls_client_authentication", False):
        given.append("--tls-client-authentication")
    if getattr(args, "tls_hostname_verification_enabled", False):
        given.append("--tls-hostname-verification-enabled")
    if not provider:
        if given:
            raise TlsConfigError(
                f"{', '.join(given)} given but bookie TLS is off: set "
                f"--tls-provider-factory-class {PROVIDER_FACTORY_CLASS}"
            )
        return None
    if provider not in (PROVIDER_FACTORY_CLASS, "TLSContextFactory"):
        raise TlsConfigError(
            f"--tls-provider-factory-class {provider}: only BookKeeper's "
            f"{PROVIDER_FACTORY_CLASS} (PEM files) is supported"
        )
    for dest, key in (
        ("tls_key_store_type", "--tls-key-store-type"),
        ("tls_trust_store_type", "--tls-trust-store-type"),
    ):
        kind = str(getattr(args, dest, "PEM") or "PEM")
        if kind.upper() not in _STORE_TYPES:
            raise TlsConfigError(
                f"{key} {kind}: only PEM files are supported (convert a JKS or PKCS12 store "
                "with keytool -importkeystore and openssl pkcs12)"
            )
    settings = TlsSettings(
        trust_store=getattr(args, "tls_trust_store", None),
        certificate_path=getattr(args, "tls_certificate_path", None),
        key_store=getattr(args, "tls_key_store", None),
        key_store_password_path=getattr(args, "tls_key_store_password_path", None),
        client_authentication=bool(getattr(args, "tls_client_authentication", False)),
        hostname_verification=bool(getattr(args, "tls_hostname_verification_enabled", False)),
    )
    TlsContextSource(settings, role).get()  # fail now, on the command line, not per bookie
    return settings
