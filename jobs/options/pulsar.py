"""The ``--pulsar-admin-*`` flags of the repair commands (docs/pulsar.md): a broker's admin
API, its token and TLS files, and how fast topics are unloaded after a repair."""

from __future__ import annotations

import argparse

from bklib.pulsar.admin import AdminSettings, PulsarAdmin

__all__ = ["add_pulsar_admin_arguments", "admin_settings"]


def add_pulsar_admin_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The ``--pulsar-admin-*`` flags of the repair commands."""
    parser.add_argument(
        "--pulsar-admin-url",
        default=None,
        help="a Pulsar broker's admin API (http(s)://HOST:8080): after the repair, unload the "
        "topics whose ledgers changed, so brokers drop stale ledger handles",
    )
    parser.add_argument(
        "--pulsar-token-file",
        default=None,
        help="file holding a JWT for the admin API (Pulsar's token authentication)",
    )
    parser.add_argument("--pulsar-tls-ca", default=None, help="CA (PEM) of an https admin API")
    parser.add_argument(
        "--pulsar-tls-cert", default=None, help="client certificate (PEM) for admin API mTLS"
    )
    parser.add_argument("--pulsar-tls-key", default=None, help="its private key (PEM)")
    parser.add_argument(
        "--unload-rate",
        type=float,
        default=2.0,
        help="topic unloads per second at most (each makes the topic's clients reconnect)",
    )
    return parser


def admin_settings(args: argparse.Namespace) -> AdminSettings | None:
    """The admin API settings the flags give (None without ``--pulsar-admin-url``), checked
    now (the URL, the token file, the TLS files): a repair never starts with flags that
    would only fail after it. Raises ValueError or OSError with a one-line reason."""
    url = getattr(args, "pulsar_admin_url", None)
    if not url:
        return None
    token = None
    token_file = getattr(args, "pulsar_token_file", None)
    if token_file:
        from jobs.options.zookeeper import read_secret_file

        token = read_secret_file(token_file, "--pulsar-token-file").strip()
    settings = AdminSettings(
        url=url,
        token=token,
        tls_ca=getattr(args, "pulsar_tls_ca", None),
        tls_cert=getattr(args, "pulsar_tls_cert", None),
        tls_key=getattr(args, "pulsar_tls_key", None),
    )
    PulsarAdmin(settings)  # builds the TLS context: unreadable files fail here
    return settings
