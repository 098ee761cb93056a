"""``--bookie-protocol``: the wire protocol a command's entry reads (and copies) speak."""

from __future__ import annotations

import argparse

from bklib.client.pool import DEFAULT_BOOKIE_PROTOCOL, WIRE_PROTOCOLS

__all__ = ["add_bookie_protocol_argument"]


def add_bookie_protocol_argument(parser: argparse.ArgumentParser, *, what: str) -> None:
    """Add ``--bookie-protocol`` to ``parser``; ``what`` names the requests it governs."""
    parser.add_argument(
        "--bookie-protocol",
        choices=WIRE_PROTOCOLS,
        default=DEFAULT_BOOKIE_PROTOCOL,
        help=f"wire protocol of {what}: v2 (what Pulsar's brokers speak, less CPU per read on "
        f"both sides; batch reads from 4.17+ bookies; default {DEFAULT_BOOKIE_PROTOCOL}) or v3 "
        "(one protobuf request per entry)",
    )
