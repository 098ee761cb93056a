"""Oxia TLS and token flags for every command that takes ``--zk`` / ``--metadata-uri``.

The flags themselves are :func:`bklib.meta.oxia_security.add_oxia_access_arguments`, shared
with the Python bookie (``bkaudit bookie``):

====================================  ===========================================================
flag / config key                      Oxia server flag it answers
====================================  ===========================================================
``--oxia-tls`` / ``oxia-tls``          ``--tls-cert-file`` / ``--tls-key-file`` (public port)
``--oxia-tls-ca PEM``                  the CA that signed the server's ``--tls-cert-file``
``--oxia-tls-cert`` / ``-key PEM``     ``--tls-trusted-ca-file`` with ``--tls-client-auth``
``--oxia-tls-server-name NAME``        (the name in the server's certificate; Oxia's own
                                       ``--peer-tls-server-name``)
``--oxia-token-file PATH``             ``--auth-provider-name oidc`` (or ``$BKAUDIT_OXIA_TOKEN``)
====================================  ===========================================================

:func:`resolve_oxia_security` runs after parsing (from
:func:`jobs.options.zookeeper.resolve_connection`), once ``args.zk`` holds the store's
locator: on Oxia it puts the picklable :class:`~bklib.meta.oxia_security.OxiaAccess` in
``args.zk_auth``, the slot every job already hands to ``open_store`` on the driver, in helper
processes and in Spark tasks (ZooKeeper's flags are refused on Oxia, so the slot is free);
on ZooKeeper any of these flags is refused, never dropped.
"""

from __future__ import annotations

import argparse

from bklib.meta.oxia_security import (
    OXIA_SECURITY_DESTS,
    OxiaAccess,
    OxiaAccessConfigError,
    add_oxia_access_arguments,
    oxia_access_from_args,
    oxia_security_given,
)

__all__ = [
    "OXIA_SECURITY_DESTS",
    "OxiaSecurityArgsError",
    "add_oxia_security_arguments",
    "resolve_oxia_security",
]


class OxiaSecurityArgsError(ValueError):
    """A one-line usage error (exit 2) about the Oxia security flags."""


def add_oxia_security_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the Oxia TLS and token flags to ``parser`` (once)."""
    return add_oxia_access_arguments(parser)


def resolve_oxia_security(args: argparse.Namespace, locator: str) -> tuple[str, ...]:
    """On an Oxia ``locator``, set ``args.zk_auth`` to the
    :class:`~bklib.meta.oxia_security.OxiaAccess` the flags describe (left alone without
    any); on another store refuse them. Returns the secrets to keep out of logs. Raises
    :class:`OxiaSecurityArgsError`."""
    from bklib.meta.stores import is_oxia

    if not hasattr(args, "oxia_tls"):
        return ()
    resolved = getattr(args, "zk_auth", None)
    if isinstance(resolved, OxiaAccess):  # resolved already (a parser reused)
        return resolved.secrets()
    given = oxia_security_given(args)
    if not is_oxia(locator):
        if given:
            raise OxiaSecurityArgsError(
                f"{', '.join(given)} secure Oxia only and cannot be applied to the ZooKeeper "
                f"store {locator}; drop them (docs/security.md)"
            )
        return ()
    try:
        access = oxia_access_from_args(args)
    except OxiaAccessConfigError as exc:
        raise OxiaSecurityArgsError(str(exc)) from None
    if access is None:
        return ()
    args.zk_auth = access
    return access.secrets()
