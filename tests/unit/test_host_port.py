"""One host:port rule: listing registrations (``bklib.states.parse_host_port``) and deriving a
bookie's address from an empty registration (``bklib.meta.formats.decode_service_info``)
agree on every id, the bracketed IPv6 form and Java's ``Integer.parseInt`` forms included."""

from __future__ import annotations

import pytest

from bklib.errors import CorruptMetadataError
from bklib.meta.formats import decode_service_info
from bklib.states import parse_host_port

IDS = {
    "10.0.0.7:3181": ("10.0.0.7", 3181),
    "[::1]:3181": ("::1", 3181),
    "a:+3181": ("a", 3181),  # Integer.parseInt takes a sign
    "bookie-1.ns.svc:3181:extra": ("bookie-1.ns.svc", 3181),  # first two parts, as Java
    "a:-1": None,
    "a:99999": None,
    "a:31 81": None,
    "[::1]3181": None,
    "my-custom-bookie": None,
    "host:": None,
    ":3181": None,
}


def _derived(bookie: str) -> tuple[str, int] | None:
    try:
        return decode_service_info(b"", bookie).rpc_address()
    except CorruptMetadataError:
        return None


@pytest.mark.parametrize(("bookie", "expected"), sorted(IDS.items()))
def test_every_reader_of_a_bookie_id_agrees(bookie: str, expected: tuple[str, int] | None) -> None:
    assert parse_host_port(bookie) == expected
    assert _derived(bookie) == expected
