"""ZooKeeper TLS, SASL and ACL flags for every command that takes ``--zk``.

The flags themselves are :func:`bklib.meta.stores.zookeeper.security.add_zk_access_arguments`,
shared with the Python bookie (``bkaudit bookie``) so both read a secured cluster the same way:

==========================================  ==================================================
flag / config key                            ZooKeeper / BookKeeper equivalent
==========================================  ==================================================
``--zk-tls`` / ``zk-tls``                    ``zookeeper.client.secure=true``
``--zk-tls-ca PEM``                          ``zookeeper.ssl.trustStore.location`` (PEM)
``--zk-tls-cert PEM`` / ``--zk-tls-key``     ``zookeeper.ssl.keyStore.location`` (PEM)
``--zk-tls-key-password-file PATH``          ``zookeeper.ssl.keyStore.password``
``--zk-tls-no-hostname-verification``        ``zookeeper.ssl.hostnameVerification=false``
``--zk-sasl-jaas-file PATH``                 ``-Djava.security.auth.login.config``
``--zk-sasl-jaas-section NAME``              ``zookeeper.sasl.clientconfig`` (``Client``)
``--zk-sasl-service NAME``                   ``zookeeper.sasl.client.username``
``--zk-enable-security auto|true|false``     BookKeeper's ``zkEnableSecurity``
==========================================  ==================================================

:func:`resolve_zk_security` runs after parsing (from
:func:`jobs.options.zookeeper.resolve_connection`) and turns them, with the digest
``--zk-auth`` already resolved, into ``args.zk_auth``: the digest string as before when no
flag is given, else a picklable :class:`~bklib.meta.stores.zookeeper.ZkAccess` that the jobs
hand on unchanged to the driver's and the executors' connections. Secrets (the SASL password
in the JAAS file, the key password) are read from files only and returned for log redaction.
"""

from __future__ import annotations

import argparse

from bklib.meta.stores.zookeeper.security import (
    ZkAccess,
    ZkAccessConfigError,
    add_zk_access_arguments,
    zk_access_from_args,
)

__all__ = [
    "ZK_SECURITY_DESTS",
    "ZkSecurityArgsError",
    "add_zk_security_arguments",
    "refuse_on_other_stores",
    "resolve_zk_security",
    "zk_security_given",
]

ZK_SECURITY_DESTS = frozenset(
    {
        "zk_tls",
        "zk_tls_ca",
        "zk_tls_cert",
        "zk_tls_key",
        "zk_tls_key_password_file",
        "zk_tls_no_hostname_verification",
        "zk_sasl_jaas_file",
        "zk_sasl_jaas_section",
        "zk_sasl_service",
        "zk_enable_security",
    }
)
"""The dests :func:`add_zk_security_arguments` adds (config keys, with dashes)."""


class ZkSecurityArgsError(ValueError):
    """A one-line usage error (exit 2) about the ZooKeeper security flags."""


def add_zk_security_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ZooKeeper TLS / SASL / ACL flags to ``parser`` (once)."""
    if any(a.dest == "zk_tls" for a in parser._actions):
        return parser
    return add_zk_access_arguments(parser)


def resolve_zk_security(args: argparse.Namespace) -> tuple[str, ...]:
    """Replace ``args.zk_auth`` (a digest ``user:password`` or None) by the
    :data:`~bklib.meta.stores.zookeeper.security.ZkAuth` the flags describe; returns the secrets to
    keep out of logs. Raises :class:`ZkSecurityArgsError`."""
    if not hasattr(args, "zk_tls"):
        return ()
    digest = getattr(args, "zk_auth", None)
    if isinstance(digest, ZkAccess):  # resolved already (a parser reused)
        return digest.secrets()
    try:
        auth = zk_access_from_args(args, digest=digest or None)
    except ZkAccessConfigError as exc:
        raise ZkSecurityArgsError(str(exc)) from None
    args.zk_auth = auth
    return ZkAccess.of(auth).secrets()


def zk_security_given(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The ZooKeeper-only security flags ``args`` sets away from their defaults (``--zk-auth``
    and its file or variable included), as flags: what a store other than ZooKeeper would
    have to refuse."""
    given = [
        "--" + dest.replace("_", "-")
        for dest in sorted(ZK_SECURITY_DESTS)
        if hasattr(args, dest) and getattr(args, dest) != parser.get_default(dest)
    ]
    if getattr(args, "zk_auth", None):
        given.insert(0, "--zk-auth")
    return given


def refuse_on_other_stores(locator: str, given: list[str]) -> None:
    """A flag that cannot be applied is refused, never dropped: ZooKeeper's TLS, SASL and
    digest flags on a store that is not ZooKeeper (Oxia) raise :class:`ZkSecurityArgsError`,
    so a user who asked for TLS never gets plain text unawares."""
    from bklib.meta.stores import is_oxia

    if given and is_oxia(locator):
        raise ZkSecurityArgsError(
            f"{', '.join(given)} secure ZooKeeper only and cannot be applied to the Oxia "
            f"store {locator}; drop them (docs/security.md)"
        )
