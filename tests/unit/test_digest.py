"""Entry/LAC bodies and digests against reference vectors (the JDK classes DigestManager uses)."""

from __future__ import annotations

import struct
import zlib

import crc32c
import pytest

from bklib.digest import (
    LAC_METADATA_LENGTH,
    METADATA_LENGTH,
    CRC32CDigestManager,
    CRC32DigestManager,
    DummyDigestManager,
    EntryView,
    MacDigestManager,
    digest_length,
    digest_manager,
    mac_key,
    master_key,
    parse_entry_header,
)
from bklib.errors import DigestMatchError, IncorrectParameterError
from bklib.meta.model import DigestType

# Reference vector: ledgerId = 1, entryId = 0, lac = -1, length = 5, payload "hello".
HEADER_1_0 = bytes.fromhex("0000000000000001 0000000000000000 ffffffffffffffff 0000000000000005")
VECTOR_DIGESTS = {
    DigestType.CRC32: "0000000030a56872",
    DigestType.CRC32C: "e3a5f74d",
    DigestType.HMAC: "b66e20f9eebddec1e704fc3b96b2ed248b6a5ed9",
    DigestType.DUMMY: "",
}
ALL_TYPES = list(DigestType)
CHECKED_TYPES = [t for t in DigestType if t is not DigestType.DUMMY]


# ---- master key -------------------------------------------------------------------------------


def test_master_key_vectors() -> None:
    assert master_key(b"").hex() == "850bf1071c5e3d8c24235676f8816ae0cbe2f14f"
    assert master_key(b"pwd").hex() == "9c31dcb7214645e06dbf8a67daa6cfcdcd13a611"


def test_mac_key_vector() -> None:
    assert mac_key(b"pwd").hex() == "add528aadda7d5537007946e5789459a188a998f"


def test_master_key_is_20_bytes_and_differs_from_mac_key() -> None:
    assert len(master_key(b"x" * 1000)) == 20
    assert master_key(b"pwd") != mac_key(b"pwd")


# ---- entry vectors ----------------------------------------------------------------------------


@pytest.mark.parametrize("dt", ALL_TYPES, ids=lambda t: t.name)
def test_entry_vector_exact_bytes(dt: DigestType) -> None:
    body = digest_manager(1, dt, b"pwd").package_entry(0, -1, 5, b"hello")
    assert body == HEADER_1_0 + bytes.fromhex(VECTOR_DIGESTS[dt]) + b"hello"
    assert len(body) == METADATA_LENGTH + digest_length(dt) + 5


@pytest.mark.parametrize("dt", ALL_TYPES, ids=lambda t: t.name)
def test_entry_vector_verifies(dt: DigestType) -> None:
    body = HEADER_1_0 + bytes.fromhex(VECTOR_DIGESTS[dt]) + b"hello"
    view = digest_manager(1, dt, b"pwd").verify_entry(body, 0)
    assert view == EntryView(1, 0, -1, 5, view.payload)
    assert bytes(view.payload) == b"hello"


def test_lac_vector_crc32c() -> None:
    body = digest_manager(1, DigestType.CRC32C).package_lac(5)
    assert body == bytes.fromhex("0000000000000001 0000000000000005 83bf58be")
    assert digest_manager(1, DigestType.CRC32C).verify_lac(body) == 5


def test_digest_lengths() -> None:
    assert {t: digest_length(t) for t in DigestType} == {
        DigestType.CRC32: 8,
        DigestType.HMAC: 20,
        DigestType.CRC32C: 4,
        DigestType.DUMMY: 0,
    }
    assert digest_length(3) == 4


def test_factory_types_and_metadata_numbering() -> None:
    assert isinstance(digest_manager(7, 1), CRC32DigestManager)
    assert isinstance(digest_manager(7, 2, b"p"), MacDigestManager)
    assert isinstance(digest_manager(7, 3), CRC32CDigestManager)
    assert isinstance(digest_manager(7, 4), DummyDigestManager)
    assert digest_manager(7, DigestType.CRC32C).ledger_id == 7


@pytest.mark.parametrize("bad", [0, 5, -1, None, "CRC32"])
def test_factory_rejects_unknown_type(bad: object) -> None:
    with pytest.raises(IncorrectParameterError):
        digest_manager(1, bad, b"")  # type: ignore[arg-type]


def test_factory_rejects_negative_ledger() -> None:
    with pytest.raises(IncorrectParameterError):
        digest_manager(-1, DigestType.CRC32C)


# ---- algorithm properties ---------------------------------------------------------------------


def test_crc32_is_unsigned_zlib_crc_over_everything_but_the_digest() -> None:
    payload = bytes(range(256)) * 9
    body = digest_manager(9, DigestType.CRC32).package_entry(3, 2, 9999, payload)
    header = body[:32]
    (value,) = struct.unpack(">Q", body[32:40])
    assert value == zlib.crc32(header + payload)
    assert body[32:36] == b"\0\0\0\0"  # upper half of the long is always zero


def test_crc32c_chains_header_then_payload() -> None:
    payload = b"x" * 10_000
    body = digest_manager(9, DigestType.CRC32C).package_entry(3, 2, 10_000, payload)
    assert body[32:36] == struct.pack(">I", crc32c.crc32c(body[:32] + payload))


def test_empty_payload_roundtrip_all_types() -> None:
    for dt in ALL_TYPES:
        dm = digest_manager(4, dt, b"secret")
        body = dm.package_entry(0, -1, 0, b"")
        assert len(body) == METADATA_LENGTH + dm.digest_length
        view = dm.verify_entry(body, 0)
        assert bytes(view.payload) == b""
        assert (view.ledger_id, view.entry_id, view.lac, view.length) == (4, 0, -1, 0)


@pytest.mark.parametrize("dt", ALL_TYPES, ids=lambda t: t.name)
def test_roundtrip_with_buffer_types(dt: DigestType) -> None:
    dm = digest_manager(123456789012, dt, b"pw")
    body = dm.package_entry(42, 41, 1 << 40, memoryview(b"payload-bytes"))
    for buf in (body, bytearray(body), memoryview(body)):
        view = dm.verify_entry(buf, 42)
        assert (view.ledger_id, view.entry_id, view.lac, view.length) == (
            123456789012,
            42,
            41,
            1 << 40,
        )
        assert view.payload == b"payload-bytes"


def test_payload_is_zero_copy_view() -> None:
    dm = digest_manager(1, DigestType.CRC32C)
    body = bytearray(dm.package_entry(0, -1, 3, b"abc"))
    view = dm.verify_entry(body, 0)
    assert isinstance(view.payload, memoryview)
    body[-1] = ord("z")  # the view shares the buffer
    assert bytes(view.payload) == b"abz"


def test_entry_view_is_frozen() -> None:
    view = digest_manager(1, DigestType.DUMMY).verify_entry(HEADER_1_0 + b"hello", 0)
    with pytest.raises(AttributeError):
        view.entry_id = 3  # type: ignore[misc]


def test_package_entry_rejects_out_of_range_fields() -> None:
    dm = digest_manager(1, DigestType.CRC32C)
    with pytest.raises(IncorrectParameterError):
        dm.package_entry(1 << 63, -1, 0, b"")


# ---- tamper detection -------------------------------------------------------------------------


@pytest.mark.parametrize("dt", CHECKED_TYPES, ids=lambda t: t.name)
def test_every_single_byte_flip_is_detected(dt: DigestType) -> None:
    dm = digest_manager(1, dt, b"pwd")
    body = dm.package_entry(0, -1, 5, b"hello")
    for pos in range(len(body)):
        for bit in (0x01, 0x80):
            tampered = bytearray(body)
            tampered[pos] ^= bit
            with pytest.raises(DigestMatchError) as info:
                dm.verify_entry(bytes(tampered), 0)
            assert info.value.ledger_id == 1


@pytest.mark.parametrize("dt", CHECKED_TYPES, ids=lambda t: t.name)
def test_appended_byte_is_detected(dt: DigestType) -> None:
    dm = digest_manager(1, dt, b"pwd")
    with pytest.raises(DigestMatchError):
        dm.verify_entry(dm.package_entry(0, -1, 5, b"hello") + b"!", 0)


def test_dummy_detects_header_ids_but_not_payload_changes() -> None:
    dm = digest_manager(1, DigestType.DUMMY)
    body = dm.package_entry(0, -1, 5, b"hello")
    assert bytes(dm.verify_entry(body[:-1] + b"O", 0).payload) == b"hellO"
    with pytest.raises(DigestMatchError):
        dm.verify_entry(digest_manager(2, DigestType.DUMMY).package_entry(0, -1, 5, b"x"), 0)


def test_hmac_wrong_password_is_detected() -> None:
    body = digest_manager(1, DigestType.HMAC, b"right").package_entry(0, -1, 5, b"hello")
    with pytest.raises(DigestMatchError):
        digest_manager(1, DigestType.HMAC, b"wrong").verify_entry(body, 0)


@pytest.mark.parametrize("dt", CHECKED_TYPES, ids=lambda t: t.name)
def test_wrong_digest_type_is_detected(dt: DigestType) -> None:
    body = digest_manager(1, dt, b"p").package_entry(0, -1, 5, b"hello")
    for other in CHECKED_TYPES:
        if other is not dt:
            with pytest.raises(DigestMatchError):
                digest_manager(1, other, b"p").verify_entry(body, 0)


@pytest.mark.parametrize("dt", ALL_TYPES, ids=lambda t: t.name)
def test_wrong_ledger_id(dt: DigestType) -> None:
    # A valid body of ledger 2 (digest correct) handed to ledger 1's reader.
    body = digest_manager(2, dt, b"p").package_entry(0, -1, 5, b"hello")
    with pytest.raises(DigestMatchError) as info:
        digest_manager(1, dt, b"p").verify_entry(body, 0)
    assert info.value.ledger_id == 1
    assert "ledger 1" in str(info.value)
    assert "ledger id 2" in str(info.value)


@pytest.mark.parametrize("dt", ALL_TYPES, ids=lambda t: t.name)
def test_wrong_entry_id_unless_skipped(dt: DigestType) -> None:
    dm = digest_manager(1, dt, b"p")
    body = dm.package_entry(7, 6, 40, b"hello")
    with pytest.raises(DigestMatchError) as info:
        dm.verify_entry(body, 8)
    assert info.value.entry_id == 8
    assert "ledger 1" in str(info.value) and "entry 8" in str(info.value)
    # entry_id None (reads of entry -1 / LAC): the bookie returns whatever its last entry is.
    view = dm.verify_entry(body, None)
    assert (view.entry_id, view.lac, view.length) == (7, 6, 40)


@pytest.mark.parametrize("dt", ALL_TYPES, ids=lambda t: t.name)
def test_short_body(dt: DigestType) -> None:
    dm = digest_manager(1, dt, b"p")
    body = dm.package_entry(0, -1, 0, b"")
    for cut in range(len(body)):
        with pytest.raises(DigestMatchError) as info:
            dm.verify_entry(body[:cut], 0)
        assert "shorter" in str(info.value)
        assert info.value.entry_id == 0


# ---- LAC bodies -------------------------------------------------------------------------------


@pytest.mark.parametrize("dt", ALL_TYPES, ids=lambda t: t.name)
def test_lac_roundtrip_and_layout(dt: DigestType) -> None:
    dm = digest_manager(77, dt, b"pw")
    for lac in (-1, 0, 5, (1 << 63) - 1):
        body = dm.package_lac(lac)
        assert len(body) == LAC_METADATA_LENGTH + dm.digest_length
        assert body[:16] == struct.pack(">qq", 77, lac)
        assert dm.verify_lac(body) == lac


@pytest.mark.parametrize("dt", CHECKED_TYPES, ids=lambda t: t.name)
def test_lac_tamper_short_and_foreign_ledger(dt: DigestType) -> None:
    dm = digest_manager(77, dt, b"pw")
    body = dm.package_lac(9)
    for pos in range(len(body)):
        tampered = bytearray(body)
        tampered[pos] ^= 0x10
        with pytest.raises(DigestMatchError):
            dm.verify_lac(bytes(tampered))
    with pytest.raises(DigestMatchError):
        dm.verify_lac(body[:-1])
    with pytest.raises(DigestMatchError) as info:
        dm.verify_lac(digest_manager(78, dt, b"pw").package_lac(9))
    assert info.value.ledger_id == 77


def test_lac_trailing_bytes_ignored_like_java() -> None:
    dm = digest_manager(3, DigestType.CRC32C)
    assert dm.verify_lac(dm.package_lac(11) + b"\0\0") == 11


def test_dummy_lac_checks_ledger_and_length() -> None:
    dm = digest_manager(3, DigestType.DUMMY)
    assert dm.package_lac(4) == struct.pack(">qq", 3, 4)
    with pytest.raises(DigestMatchError):
        dm.verify_lac(struct.pack(">qq", 4, 4))
    with pytest.raises(DigestMatchError):
        dm.verify_lac(b"\0" * 15)


# ---- header parsing ---------------------------------------------------------------------------


def test_parse_entry_header_does_not_verify() -> None:
    body = HEADER_1_0 + b"garbage digest and payload"
    assert parse_entry_header(body) == (1, 0, -1, 5)
    assert parse_entry_header(memoryview(HEADER_1_0)) == (1, 0, -1, 5)
    assert digest_manager(1, DigestType.CRC32).parse_entry_header(body) == (1, 0, -1, 5)


def test_parse_entry_header_short() -> None:
    with pytest.raises(IncorrectParameterError):
        parse_entry_header(HEADER_1_0[:31])
