"""Bookie TLS flags for every command that takes ``--zk``, named after BookKeeper's keys.

``--tls-provider-factory-class`` (``tlsProviderFactoryClass``) turns TLS on; the PEM files
come from ``--tls-trust-store`` (``tlsTrustStore``/``clientTrustStore``: the CA, required),
and for mTLS ``--tls-certificate-path`` (``tlsCertificatePath``) and ``--tls-key-store``
(``tlsKeyStore``/``clientKeyStore``) with ``--tls-client-authentication``.
``--tls-hostname-verification-enabled`` is BookKeeper's ``tlsHostnameVerificationEnabled``.
:func:`jobs.options.zookeeper.resolve_connection` turns them into ``args.bookie_tls`` (a picklable
:class:`~bklib.tls.TlsSettings`, or None) once, and every job hands that to its bookie
clients, on the driver and the executors.
"""

from __future__ import annotations

import argparse

from bklib.tls import TlsConfigError, TlsSettings
from bklib.tls import add_tls_arguments as _add_tls_arguments
from bklib.tls import tls_settings_from_args as _settings

__all__ = ["TLS_DEST", "TlsConfigError", "add_tls_arguments", "tls_from_args"]

TLS_DEST = "bookie_tls"
"""The attribute of the parsed arguments holding the resolved settings."""


def add_tls_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the client-side bookie TLS flags (once) to ``parser``."""
    if any(a.dest == "tls_provider_factory_class" for a in parser._actions):
        return parser
    return _add_tls_arguments(parser, role="client")


def tls_from_args(args: argparse.Namespace) -> TlsSettings | None:
    """The client TLS settings the flags describe (None: TLS off), checked now by building
    the SSL context once; raises :class:`~bklib.tls.TlsConfigError` with a one-line reason."""
    return _settings(args, role="client")
