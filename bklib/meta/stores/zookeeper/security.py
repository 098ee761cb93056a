"""How to reach a secured ZooKeeper: TLS, SASL (DIGEST-MD5 or Kerberos/GSSAPI), digest auth,
and the ACL of every znode we create.

:class:`ZkAccess` is frozen and picklable, so a job hands it to Spark executors inside its
config as it handed the plain ``user:password`` digest string before. Everywhere bklib takes
``auth`` it takes a :data:`ZkAuth`: ``None`` (plaintext, no identity), a ``user:password``
string (ZooKeeper's ``digest`` scheme, as ``addauth digest``) or a :class:`ZkAccess`.

ACLs follow BookKeeper's ``zkEnableSecurity`` (``ZkUtils.getACLs``): when on, every znode is
created with ``CREATOR_ALL_ACL`` (all rights to the identities the session authenticated
as), else with ``OPEN_ACL_UNSAFE``. :attr:`ZkAccess.enable_security` ``None`` means "on with
SASL": a zkEnableSecurity cluster's bookies and brokers log in with SASL (one shared
identity, as Pulsar expects), whereas digest auth cannot be BookKeeper's (its Java clients
have no digest login), so nodes we created as a digest user would be closed to the Java
auditor; give ``enable_security=True`` (``--zk-enable-security true``) to use it anyway, and
False for a SASL cluster running ``zkEnableSecurity=false``.

Sessions with these settings come from :mod:`bklib.meta.stores.zookeeper.client`; this module
only describes them, reads the flags and JAAS files, and probes a TLS port (:func:`probe_tls`).

Flags (the same for the jobs, through :mod:`jobs.options.zookeeper_security`, and the Python bookie)
mirror ZooKeeper's client properties: ``--zk-tls`` (``zookeeper.client.secure``),
``--zk-tls-ca`` (``zookeeper.ssl.trustStore.location``, PEM), ``--zk-tls-cert`` /
``--zk-tls-key`` (``zookeeper.ssl.keyStore.location``, PEM),
``--zk-tls-no-hostname-verification`` (``zookeeper.ssl.hostnameVerification=false``),
``--zk-sasl-jaas-file`` / ``--zk-sasl-jaas-section`` (``java.security.auth.login.config`` and
``zookeeper.sasl.clientconfig``, default ``Client``), ``--zk-sasl-service``
(``zookeeper.sasl.client.username``) and ``--zk-enable-security`` (BookKeeper's
``zkEnableSecurity``). Secrets come only from files (the JAAS file, a key password file).
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import ssl
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from kazoo.security import ACL, CREATOR_ALL_ACL

from bklib.errors import ZKError
from bklib.meta.oxia_security import OxiaAccess
from bklib.meta.stores.zookeeper.connect_string import parse_connect_string

__all__ = [
    "JAAS_DIGEST_MODULE",
    "JAAS_KERBEROS_MODULE",
    "SaslMechanism",
    "ZkAccess",
    "ZkAccessConfigError",
    "ZkAuth",
    "ZkSasl",
    "ZkSecurityError",
    "ZkTls",
    "add_zk_access_arguments",
    "probe_tls",
    "read_jaas_section",
    "read_secret_file",
    "zk_access_from_args",
]

SaslMechanism = Literal["DIGEST-MD5", "GSSAPI"]
JAAS_DIGEST_MODULE = "org.apache.zookeeper.server.auth.DigestLoginModule"
JAAS_KERBEROS_MODULE = "com.sun.security.auth.module.Krb5LoginModule"
DEFAULT_JAAS_SECTION = "Client"
DEFAULT_SASL_SERVICE = "zookeeper"


class ZkAccessConfigError(ValueError):
    """A security flag, JAAS file or key password file that cannot be used (one line)."""


class ZkSecurityError(ZKError):
    """ZooKeeper refused us for a reason retrying cannot fix: an untrusted or mismatching TLS
    certificate, a failed handshake, or rejected SASL credentials."""


@dataclass(frozen=True)
class ZkTls:
    """TLS to ZooKeeper's ``secureClientPort``. Files are PEM; ``ca_file`` None trusts the
    system store; ``cert_file`` (with ``key_file``, or holding the key too) is the client
    certificate for servers with ``ssl.clientAuth=need``."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    key_password: str | None = field(default=None, repr=False)
    verify_hostname: bool = True

    def context(self) -> ssl.SSLContext:
        """The client context of the bulk reader and the handshake probe: kazoo's settings,
        trusting only ``ca_file`` when given."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = self.verify_hostname
        ctx.verify_mode = ssl.CERT_REQUIRED
        if self.ca_file:
            # Only the configured CAs, as ZooKeeper's trust store (kazoo adds the system's).
            ctx.load_verify_locations(self.ca_file)
        else:
            ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
        if self.cert_file:
            # A callable, so an encrypted key without a password fails instead of prompting.
            password = self.key_password or ""
            ctx.load_cert_chain(
                self.cert_file, self.key_file or self.cert_file, password=lambda: password
            )
        return ctx


@dataclass(frozen=True)
class ZkSasl:
    """SASL to ZooKeeper: DIGEST-MD5 with ``username``/``password`` (a JAAS
    ``DigestLoginModule``), or GSSAPI (Kerberos) with the ticket cache, or a ``keytab``
    exported as ``$KRB5_CLIENT_KTNAME``, for ``principal``. ``service`` is the server
    principal's first part (``zookeeper/<host>@REALM``)."""

    mechanism: SaslMechanism = "DIGEST-MD5"
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    principal: str | None = None
    keytab: str | None = None
    service: str = DEFAULT_SASL_SERVICE

    def options(self) -> dict[str, Any]:
        """kazoo's ``sasl_options`` (a fresh dict: kazoo adds keys to it)."""
        if self.mechanism == "DIGEST-MD5":
            return {
                "mechanism": "DIGEST-MD5",
                "service": self.service,
                "username": self.username,
                "password": self.password,
            }
        opts: dict[str, Any] = {"mechanism": "GSSAPI", "service": self.service}
        if self.principal:
            opts["principal"] = self.principal
        return opts

    def describe(self) -> str:
        who = self.username if self.mechanism == "DIGEST-MD5" else self.principal
        return f"SASL {self.mechanism}" + (f" as {who}" if who else "")


@dataclass(frozen=True)
class ZkAccess:
    """Everything a ZooKeeper connection needs besides the connect string. Secret fields are
    left out of ``repr``; :meth:`secrets` lists them for log redaction."""

    digest: str | None = field(default=None, repr=False)
    sasl: ZkSasl | None = None
    tls: ZkTls | None = None
    enable_security: bool | None = None

    @classmethod
    def of(cls, auth: ZkAuth) -> ZkAccess:
        """Any accepted ``auth`` value as a ZkAccess (a string is digest ``user:password``)."""
        if isinstance(auth, ZkAccess):
            return auth
        if isinstance(auth, OxiaAccess):  # Oxia's settings: nothing for ZooKeeper
            return cls()
        return cls(digest=auth or None)

    @property
    def secure_acls(self) -> bool:
        """BookKeeper's ``zkEnableSecurity``: create znodes with CREATOR_ALL ACLs. Unset, it
        is on with SASL (how zkEnableSecurity clusters authenticate) and off with digest
        alone: Java bookies and auditors cannot log in with digest, so a digest-owned mark
        or lock would lock them out."""
        return bool(self.sasl) if self.enable_security is None else self.enable_security

    def acl(self) -> list[ACL] | None:
        """The ACL for znodes we create: CREATOR_ALL, or None (kazoo's OPEN_ACL_UNSAFE)."""
        return list(CREATOR_ALL_ACL) if self.secure_acls else None

    def secrets(self) -> tuple[str, ...]:
        """Every secret value this access holds (passwords, and the digest string)."""
        out: list[str] = []
        if self.digest:
            out += [self.digest, self.digest.partition(":")[2]]
        if self.sasl and self.sasl.password:
            out.append(self.sasl.password)
        if self.tls and self.tls.key_password:
            out.append(self.tls.key_password)
        return tuple(s for s in out if s)

    def describe(self) -> str:
        """What this access does, for logs and errors (no secrets)."""
        parts = []
        if self.tls:
            parts.append("TLS" + ("" if self.tls.verify_hostname else " (no hostname check)"))
        if self.sasl:
            parts.append(self.sasl.describe())
        if self.digest:
            parts.append(f"digest as {self.digest.partition(':')[0]}")
        parts.append("CREATOR_ALL ACLs" if self.secure_acls else "open ACLs")
        return ", ".join(parts)

    def kazoo_kwargs(self) -> dict[str, Any]:
        """KazooClient keyword arguments for this access."""
        kw: dict[str, Any] = {
            "auth_data": [("digest", self.digest)] if self.digest else None,
            "default_acl": self.acl(),
        }
        if self.sasl is not None:
            kw["sasl_options"] = self.sasl.options()
        if self.tls is not None:
            kw.update(
                use_ssl=True,
                ca=self.tls.ca_file,
                certfile=self.tls.cert_file,
                # kazoo loads a client certificate only with both; one PEM may hold both.
                keyfile=self.tls.key_file or self.tls.cert_file,
                keyfile_password=self.tls.key_password,
                verify_certs=True,
                check_hostname=self.tls.verify_hostname,
            )
        return kw


ZkAuth = str | ZkAccess | OxiaAccess | None
"""What bklib accepts as ``auth``: None, digest ``user:password``, or a :class:`ZkAccess`; on an
Oxia store the :class:`~bklib.meta.oxia_security.OxiaAccess` of ``--oxia-tls*`` travels in the
same slot (the ZooKeeper flags being refused there), and means nothing to ZooKeeper."""


# ---- the TLS handshake ---------------------------------------------------------------------


_TLS_PROBED: set[tuple[str, ZkTls]] = set()
"""(hosts, TLS settings) that passed a handshake in this process: probed once, not per
client."""


def probe_tls(hosts: str, tls: ZkTls, timeout: float = 10.0) -> None:
    """Handshake with the servers of ``hosts`` until one succeeds. Raises
    :class:`ZkSecurityError` when every reachable server failed the handshake (an untrusted
    certificate, a plaintext port): kazoo would retry those until its timeout. Servers that
    cannot be reached are left to kazoo."""
    if (hosts, tls) in _TLS_PROBED:
        return
    servers = parse_connect_string(hosts).servers
    try:
        ctx = tls.context()
    except (OSError, ValueError) as exc:
        raise ZkSecurityError(f"ZooKeeper TLS settings unusable: {_ssl_reason(exc)}") from None
    failure: str | None = None
    for host, port in servers:
        try:
            raw = socket.create_connection((host, port), timeout=timeout)
        except OSError:
            continue
        try:
            with ctx.wrap_socket(raw, server_hostname=host):
                _TLS_PROBED.add((hosts, tls))
                return
        except (ssl.SSLError, ssl.CertificateError) as exc:
            failure = failure or f"{host}:{port}: {_ssl_reason(exc)}"
        except TimeoutError:  # slow, not wrong: kazoo's retries decide
            continue
        except OSError as exc:  # reset during the handshake: a plaintext or TLS-only mismatch
            failure = failure or f"{host}:{port}: TLS handshake failed: {exc}"
        finally:
            raw.close()
    if failure is not None:
        raise ZkSecurityError(f"ZooKeeper TLS handshake failed at {failure}")


def _ssl_reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"certificate not trusted: {exc.verify_message}"
    reason = getattr(exc, "reason", None)
    return str(reason or exc).strip() or type(exc).__name__


# ---- JAAS ------------------------------------------------------------------------------------

_JAAS_TOKEN = re.compile(r'\s*(?:"((?:[^"\\]|\\.)*)"|([{};=])|([^\s{};="]+))')


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"(?m)^\s*(//|#).*$", " ", text)


_JaasToken = tuple[str, bool]
"""A token of a JAAS file: ``(text, quoted)``."""
_JaasModule = tuple[str, dict[str, str]]
"""A login module entry of a JAAS section: ``(module class, options)``."""


def read_jaas_section(path: str, section: str = DEFAULT_JAAS_SECTION) -> ZkSasl:
    """The SASL settings of ``section`` (ZooKeeper's default: ``Client``) of a JAAS login
    file: a ``DigestLoginModule`` (``username``, ``password``) gives DIGEST-MD5, a
    ``Krb5LoginModule`` (``principal``, ``keyTab``) GSSAPI. Raises ZkAccessConfigError."""
    text = _read_jaas_file(path)
    sections = _jaas_sections(path, _jaas_tokens(path, _strip_comments(text)))
    if section not in sections:
        raise ZkAccessConfigError(
            f"--zk-sasl-jaas-file {path}: no {section!r} section "
            f"(has: {', '.join(sorted(sections)) or 'none'})"
        )
    module, opts = sections[section]
    return _jaas_sasl(path, section, module, opts)


def _read_jaas_file(path: str) -> str:
    """The text of the JAAS file at ``path``; ZkAccessConfigError if it cannot be read."""
    try:
        return Path(path).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise ZkAccessConfigError(f"--zk-sasl-jaas-file {path}: cannot read: {reason}") from None


def _jaas_tokens(path: str, text: str) -> list[_JaasToken]:
    """The tokens of a JAAS file's ``text`` (comments stripped); ZkAccessConfigError at
    anything that is not a token."""
    tokens: list[_JaasToken] = []
    pos = 0
    while pos < len(text):
        m = _JAAS_TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            if text[pos:].strip():
                raise ZkAccessConfigError(f"--zk-sasl-jaas-file {path}: not a JAAS file")
            break
        pos = m.end()
        if m.group(1) is not None:
            tokens.append((m.group(1).replace('\\"', '"').replace("\\\\", "\\"), True))
        else:
            tokens.append((m.group(2) or m.group(3), False))
    return tokens


def _jaas_sections(path: str, tokens: list[_JaasToken]) -> dict[str, _JaasModule]:
    """Each non-empty section's first login module, by section name (a later section of the
    same name wins); ZkAccessConfigError if the tokens are not JAAS syntax."""
    sections: dict[str, _JaasModule] = {}
    i = 0
    try:
        while i < len(tokens):
            name, first, i = _jaas_section(tokens, i)
            if first is not None:
                sections[name] = first
    except IndexError:
        raise ZkAccessConfigError(f"--zk-sasl-jaas-file {path}: not a JAAS file") from None
    return sections


def _jaas_section(tokens: list[_JaasToken], i: int) -> tuple[str, _JaasModule | None, int]:
    """The section starting at ``tokens[i]``: its name, its first login module (None: it has
    none) and where the next section starts. IndexError if it is malformed."""
    name = tokens[i][0]
    if tokens[i + 1] != ("{", False):
        raise IndexError
    i += 2
    first: _JaasModule | None = None
    while tokens[i] != ("}", False):
        entry, i = _jaas_module(tokens, i)
        first = first or entry
    i += 1
    if i < len(tokens) and tokens[i] == (";", False):
        i += 1
    return name, first, i


def _jaas_module(tokens: list[_JaasToken], i: int) -> tuple[_JaasModule, int]:
    """The login module entry starting at ``tokens[i]`` (class, control flag, ``key=value``
    options, ``;``) and where the next one starts. IndexError if it is malformed."""
    module, i = tokens[i][0], i + 2  # module class, control flag
    opts: dict[str, str] = {}
    while tokens[i] != (";", False):
        key, eq, value = tokens[i][0], tokens[i + 1], tokens[i + 2][0]
        if eq != ("=", False):
            raise IndexError
        opts[key] = value
        i += 3
    return (module, opts), i + 1


def _jaas_sasl(path: str, section: str, module: str, opts: dict[str, str]) -> ZkSasl:
    """The SASL settings a section's login module gives: DIGEST-MD5 (needs username and
    password) or GSSAPI; ZkAccessConfigError for any other module."""
    if module == JAAS_DIGEST_MODULE or module.endswith(".DigestLoginModule"):
        if not opts.get("username") or "password" not in opts:
            raise ZkAccessConfigError(
                f"--zk-sasl-jaas-file {path}: section {section} needs username and password"
            )
        return ZkSasl("DIGEST-MD5", username=opts["username"], password=opts["password"])
    if module == JAAS_KERBEROS_MODULE or module.endswith("Krb5LoginModule"):
        keytab = opts.get("keyTab") if opts.get("useKeyTab", "false").lower() == "true" else None
        return ZkSasl("GSSAPI", principal=opts.get("principal"), keytab=keytab)
    raise ZkAccessConfigError(
        f"--zk-sasl-jaas-file {path}: section {section} uses {module}; supported: "
        "DigestLoginModule (DIGEST-MD5) and Krb5LoginModule (GSSAPI)"
    )


# ---- flags -----------------------------------------------------------------------------------

ENABLE_SECURITY_CHOICES = ("auto", "true", "false")


def add_zk_access_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ZooKeeper TLS, SASL and ACL flags (see the module docstring), in their own
    help group; returns ``parser``."""
    group = parser.add_argument_group(
        "ZooKeeper TLS, SASL and ACLs",
        "named after ZooKeeper's client properties; secrets only from files; see docs/security.md",
    )
    group.add_argument(
        "--zk-tls",
        action="store_true",
        help="connect to ZooKeeper's secureClientPort with TLS (zookeeper.client.secure)",
    )
    group.add_argument(
        "--zk-tls-ca",
        default=None,
        metavar="PEM",
        help="CA certificates trusted for ZooKeeper (zookeeper.ssl.trustStore.location); "
        "default: the system store",
    )
    group.add_argument(
        "--zk-tls-cert",
        default=None,
        metavar="PEM",
        help="client certificate for ZooKeeper (zookeeper.ssl.keyStore.location); may also "
        "hold the key",
    )
    group.add_argument(
        "--zk-tls-key", default=None, metavar="PEM", help="private key of --zk-tls-cert"
    )
    group.add_argument(
        "--zk-tls-key-password-file",
        default=None,
        metavar="PATH",
        help="file holding the password of an encrypted --zk-tls-key",
    )
    group.add_argument(
        "--zk-tls-no-hostname-verification",
        action="store_true",
        help="do not check ZooKeeper's certificate names the host "
        "(zookeeper.ssl.hostnameVerification=false)",
    )
    group.add_argument(
        "--zk-sasl-jaas-file",
        default=None,
        metavar="PATH",
        help="JAAS login file for ZooKeeper SASL (java.security.auth.login.config): "
        "DigestLoginModule (DIGEST-MD5) or Krb5LoginModule (Kerberos)",
    )
    group.add_argument(
        "--zk-sasl-jaas-section",
        default=DEFAULT_JAAS_SECTION,
        metavar="NAME",
        help="section of --zk-sasl-jaas-file (zookeeper.sasl.clientconfig)",
    )
    group.add_argument(
        "--zk-sasl-service",
        default=DEFAULT_SASL_SERVICE,
        metavar="NAME",
        help="ZooKeeper's Kerberos service name (zookeeper.sasl.client.username)",
    )
    group.add_argument(
        "--zk-enable-security",
        default="auto",
        choices=ENABLE_SECURITY_CHOICES,
        help="create znodes with CREATOR_ALL ACLs, as BookKeeper's zkEnableSecurity; "
        "auto: with SASL (digest alone: false)",
    )
    return parser


def read_secret_file(path: str, flag: str, error: type[Exception] = ZkAccessConfigError) -> str:
    """A secret file's text without its trailing line break; unreadable, ``error`` with one
    line naming the flag and the path (the operator gave both)."""
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise error(f"{flag} {path}: cannot read: {reason}") from None
    return text.rstrip("\r\n")


def _readable(path: str | None, flag: str) -> str | None:
    if path is None:
        return None
    p = Path(path).expanduser()
    if not p.is_file() or not os.access(p, os.R_OK):
        raise ZkAccessConfigError(f"{flag} {path}: no such readable file")
    return str(p)


def zk_access_from_args(args: argparse.Namespace, digest: str | None = None) -> ZkAuth:
    """The :data:`ZkAuth` the flags of :func:`add_zk_access_arguments` describe, with
    ``digest`` (``user:password``) added. Without any security flag this is ``digest``
    itself, as before. Raises :class:`ZkAccessConfigError`."""
    tls_flags = {
        "--zk-tls-ca": getattr(args, "zk_tls_ca", None),
        "--zk-tls-cert": getattr(args, "zk_tls_cert", None),
        "--zk-tls-key": getattr(args, "zk_tls_key", None),
        "--zk-tls-key-password-file": getattr(args, "zk_tls_key_password_file", None),
    }
    no_verify = bool(getattr(args, "zk_tls_no_hostname_verification", False))
    use_tls = bool(getattr(args, "zk_tls", False))
    given = [f for f, v in tls_flags.items() if v] + (
        ["--zk-tls-no-hostname-verification"] if no_verify else []
    )
    if given and not use_tls:
        raise ZkAccessConfigError(f"{given[0]} needs --zk-tls")
    tls: ZkTls | None = None
    if use_tls:
        cert = _readable(tls_flags["--zk-tls-cert"], "--zk-tls-cert")
        key = _readable(tls_flags["--zk-tls-key"], "--zk-tls-key")
        if key and not cert:
            raise ZkAccessConfigError("--zk-tls-key needs --zk-tls-cert")
        pw_file = tls_flags["--zk-tls-key-password-file"]
        key_password = read_secret_file(pw_file, "--zk-tls-key-password-file") if pw_file else None
        tls = ZkTls(
            ca_file=_readable(tls_flags["--zk-tls-ca"], "--zk-tls-ca"),
            cert_file=cert,
            key_file=key,
            key_password=key_password,
            verify_hostname=not no_verify,
        )
        try:
            tls.context()
        except (OSError, ValueError) as exc:
            raise ZkAccessConfigError(
                f"--zk-tls: cannot load the certificates: {_ssl_reason(exc)}"
            ) from None
    sasl: ZkSasl | None = None
    jaas = getattr(args, "zk_sasl_jaas_file", None)
    if jaas:
        sasl = read_jaas_section(jaas, getattr(args, "zk_sasl_jaas_section", DEFAULT_JAAS_SECTION))
        sasl = replace(sasl, service=getattr(args, "zk_sasl_service", DEFAULT_SASL_SERVICE))
    choice = getattr(args, "zk_enable_security", "auto") or "auto"
    enable = None if choice == "auto" else choice == "true"
    if enable and not (sasl or digest or (tls and tls.cert_file)):
        raise ZkAccessConfigError(
            "--zk-enable-security true needs an identity for CREATOR_ALL ACLs: "
            "--zk-sasl-jaas-file, --zk-auth-file or a --zk-tls-cert"
        )
    if tls is None and sasl is None and enable is None:
        return digest
    return ZkAccess(digest=digest or None, sasl=sasl, tls=tls, enable_security=enable)
