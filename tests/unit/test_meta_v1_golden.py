"""Metadata format v1 writes against golden bytes from BookKeeper's own serializer.

The files under ``data/metadata`` were written by ``LedgerMetadataSerDe.serialize`` (BookKeeper
4.17.3; ``data/metadata/README.md`` has the command). bklib must decode each to the metadata the
Java program built and encode that metadata back to the very same bytes, as BookKeeper does
when it rewrites a v1 ledger (it keeps ``metadataFormatVersion``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bklib.errors import CompatibilityError
from bklib.meta import LedgerMetadata, LedgerState, Segment, decode_metadata, encode_metadata

DATA = Path(__file__).parent / "data" / "metadata"

A1, A2, A3, A4 = "10.0.0.1:3181", "10.0.0.2:3181", "10.0.0.3:3181", "10.0.0.4:3181"
L1, L2, L3 = "127.0.0.1:3181", "127.0.0.1:3182", "127.0.0.1:3183"


def v1(
    ledger_id: int, e: int, wq: int, segments: list[tuple[int, tuple[str, ...]]], **kw: object
) -> LedgerMetadata:
    """v1 metadata as bklib decodes it: AQ = WQ, no password, digest type or stored ctime."""
    return LedgerMetadata(
        ledger_id=ledger_id,
        ensemble_size=e,
        write_quorum=wq,
        ack_quorum=wq,
        segments=tuple(Segment(k, v) for k, v in segments),
        digest_type=None,
        password=None,
        format_version=1,
        **kw,  # type: ignore[arg-type]
    )


# The metadata MetadataTool.goldenV1 built for each file.
GOLDEN = {
    "ledger-v1-closed-3-segments.bin": v1(
        4242,
        3,
        2,
        [(0, (A1, A2, A3)), (17, (A1, A4, A3)), (1000, ("bookie-5.example:3181", A4, A3))],
        state=LedgerState.CLOSED,
        last_entry_id=1234,
        length=98765,
    ),
    "ledger-v1-open-2-segments.bin": v1(7, 2, 2, [(0, (L1, L2)), (5, (L3, L2))]),
    "ledger-v1-in-recovery.bin": v1(
        99, 4, 3, [(0, ("b1:1", "b2:2", "b3:3", "b4:4"))], state=LedgerState.IN_RECOVERY
    ),
    "ledger-v1-closed-empty.bin": v1(
        1, 1, 1, [(0, (L1,))], state=LedgerState.CLOSED, last_entry_id=-1, length=0
    ),
}


def test_every_golden_file_is_covered() -> None:
    assert sorted(p.name for p in DATA.glob("*.bin")) == sorted(GOLDEN)


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_bklib_writes_bookkeepers_v1_bytes(name: str) -> None:
    golden = (DATA / name).read_bytes()
    md = GOLDEN[name]
    assert encode_metadata(md) == golden
    assert decode_metadata(golden, md.ledger_id) == md


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_a_decoded_v1_ledger_is_rewritten_as_v1(name: str) -> None:
    # What the repair CAS and close do: decode, transform, encode. The version stays 1.
    md = decode_metadata((DATA / name).read_bytes(), GOLDEN[name].ledger_id, znode_ctime_ms=9)
    assert md.ctime == 9 and not md.store_ctime
    assert encode_metadata(md) == (DATA / name).read_bytes()


def test_repair_rewrite_of_a_v1_ledger() -> None:
    md = GOLDEN["ledger-v1-closed-3-segments.bin"]
    new = md.with_bookies_replaced(17, {A4: "10.0.0.9:3181"})
    data = encode_metadata(new)
    assert data == (DATA / "ledger-v1-closed-3-segments.bin").read_bytes().replace(
        b"17\t10.0.0.1:3181\t10.0.0.4:3181", b"17\t10.0.0.1:3181\t10.0.0.9:3181"
    )
    assert decode_metadata(data, md.ledger_id) == new


def test_closing_an_open_v1_ledger() -> None:
    md = GOLDEN["ledger-v1-open-2-segments.bin"].closed(last_entry_id=9, length=1000)
    golden = (DATA / "ledger-v1-open-2-segments.bin").read_bytes()
    # The length line (third) becomes 1000 and the CLOSED line follows the last segment.
    head, _, rest = golden.partition(b"\n2\n2\n0\n")
    assert encode_metadata(md) == head + b"\n2\n2\n1000\n" + rest + b"9\tCLOSED"
    assert decode_metadata(encode_metadata(md), 7) == md


@pytest.mark.parametrize(
    ("change", "word"),
    [
        ({"ack_quorum": 1}, "ack quorum"),
        ({"password": b"pw", "digest_type": 3}, "password"),
        ({"ctime": 5, "store_ctime": True}, "ctime"),
        ({"custom_metadata": {"k": b"v"}}, "custom metadata"),
        ({"ctoken": 7}, "cToken"),
    ],
)
def test_v1_refuses_what_it_cannot_store(change: dict[str, object], word: str) -> None:
    md = GOLDEN["ledger-v1-open-2-segments.bin"].replace(**change)
    with pytest.raises(CompatibilityError, match=word) as info:
        encode_metadata(md)
    assert info.value.ledger_id == 7
