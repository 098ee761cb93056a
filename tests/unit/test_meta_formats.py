"""LAYOUT, registration data, cookies and under-replication znodes, in BookKeeper's formats
(``LedgerLayout``, ``ZKRegistrationManager``, ``Cookie``, ``ZkLedgerUnderreplicationManager``)."""

from __future__ import annotations

import pytest

from bklib.errors import BookieHandleNotAvailableError, CompatibilityError, CorruptMetadataError
from bklib.meta.formats import (
    DEFAULT_LAYOUT,
    DEFAULT_LAYOUT_DATA,
    UR_LAYOUT_DATA,
    BookieServiceInfo,
    Cookie,
    Endpoint,
    LedgerLayout,
    check_ur_layout,
    decode_auditor_vote,
    decode_check_ctime,
    decode_lock_data,
    decode_service_info,
    decode_ur_ledger,
    encode_auditor_vote,
    encode_check_ctime,
    encode_cookie,
    encode_layout,
    encode_lock_data,
    encode_service_info,
    encode_ur_ledger,
    parse_cookie,
    parse_layout,
    service_info_for,
)
from bklib.meta.paths import FLAT_FACTORY, HIERARCHICAL_FACTORY, LONG_HIERARCHICAL_FACTORY
from bklib.proto.formats_pb2 import BookieServiceInfoFormat, PlacementPolicyCheckFormat

# ---- LAYOUT -------------------------------------------------------------------------------------


def test_default_layout_bytes() -> None:
    assert DEFAULT_LAYOUT_DATA == (
        b"2\norg.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory:1"
    )
    assert encode_layout(DEFAULT_LAYOUT) == DEFAULT_LAYOUT_DATA
    assert parse_layout(DEFAULT_LAYOUT_DATA) == LedgerLayout(2, HIERARCHICAL_FACTORY, 1)


@pytest.mark.parametrize("factory", [HIERARCHICAL_FACTORY, LONG_HIERARCHICAL_FACTORY, FLAT_FACTORY])
def test_layout_round_trip(factory: str) -> None:
    layout = LedgerLayout(2, factory, 1)
    data = encode_layout(layout)
    assert not data.endswith(b"\n")
    assert parse_layout(data) == layout


def test_factory_class_names() -> None:
    assert LONG_HIERARCHICAL_FACTORY == (
        "org.apache.bookkeeper.meta.LongHierarchicalLedgerManagerFactory"
    )
    assert FLAT_FACTORY == "org.apache.bookkeeper.meta.FlatLedgerManagerFactory"


@pytest.mark.parametrize("name", ["hierarchical", "flat"])
def test_version_1_layout_carries_a_type_name(name: str) -> None:
    assert parse_layout(f"1\n{name}:1".encode()) == LedgerLayout(1, name, 1)


def test_layout_trailing_newline_is_tolerated_like_string_split() -> None:
    assert parse_layout(DEFAULT_LAYOUT_DATA + b"\n") == DEFAULT_LAYOUT


@pytest.mark.parametrize("data", [b"3\nX:1", b"0\nX:1", b"-1\nX:1"])
def test_layout_version_out_of_range(data: bytes) -> None:
    with pytest.raises(CompatibilityError, match="LAYOUT format version"):
        parse_layout(data)


@pytest.mark.parametrize(
    "data",
    [b"", b"\n", b"two\nX:1", b"2", b"2\nX", b"2\nX:1:2", b"2\nX:one", b" 2\nX:1", b"\xff"],
)
def test_malformed_layout(data: bytes) -> None:
    with pytest.raises(CorruptMetadataError):
        parse_layout(data)


# ---- bookie registration ------------------------------------------------------------------------


def test_service_info_like_a_real_bookie() -> None:
    info = service_info_for("10.0.0.5", 3181)
    assert info.endpoints == (Endpoint("bookie", 3181, "10.0.0.5", "bookie-rpc"),)
    assert info.properties == {}
    data = encode_service_info(info)
    # endpoints (field 6): id=1 "bookie", port=2 3181, host=3, protocol=4
    inner = b"\x0a\x06bookie" + b"\x10\xed\x18" + b"\x1a\x0810.0.0.5" + b"\x22\x0abookie-rpc"
    assert data == b"\x32" + bytes([len(inner)]) + inner
    assert decode_service_info(data, "10.0.0.5:3181") == info
    assert info.rpc_address() == ("10.0.0.5", 3181)


def test_service_info_round_trip_with_tls_http_and_properties() -> None:
    info = BookieServiceInfo(
        (
            Endpoint("httpserver", 8000, "h", "http"),
            Endpoint("bookie", 3181, "h", "bookie-rpc", ("auth1",), ("tls",)),
        ),
        {"b": "2", "a": "1"},
    )
    data = encode_service_info(info)
    assert decode_service_info(data, "custom-id") == info
    assert info.rpc_address() == ("h", 3181)
    assert service_info_for("h", 1, ["tls"]).endpoints[0].extensions == ("tls",)
    # Deterministic map order: equal values give equal bytes.
    assert encode_service_info(BookieServiceInfo(info.endpoints, {"a": "1", "b": "2"})) == data


def test_service_info_is_not_length_delimited() -> None:
    data = encode_service_info(service_info_for("h", 1))
    msg = BookieServiceInfoFormat()
    msg.ParseFromString(data)
    assert msg.endpoints[0].host == "h"


def test_local_bookkeeper_registration_is_empty() -> None:
    assert encode_service_info(BookieServiceInfo()) == b""


def test_empty_data_is_legacy_host_port() -> None:
    info = decode_service_info(b"", "192.168.1.9:3181")
    assert info.endpoints == (Endpoint("192.168.1.9:3181", 3181, "192.168.1.9", "bookie-rpc"),)
    assert info.rpc_address() == ("192.168.1.9", 3181)


@pytest.mark.parametrize("bookie", ["my-custom-bookie", "host:port", "host:", ":", "h:99999"])
def test_legacy_registration_needs_host_port(bookie: str) -> None:
    with pytest.raises(CorruptMetadataError) as info:
        decode_service_info(b"", bookie)
    assert info.value.bookie == bookie
    assert bookie in str(info.value)


def test_no_rpc_endpoint() -> None:
    with pytest.raises(BookieHandleNotAvailableError):
        BookieServiceInfo((Endpoint("httpserver", 80, "h", "http"),)).rpc_address()


def test_corrupt_registration() -> None:
    with pytest.raises(CorruptMetadataError) as info:
        decode_service_info(b"\x32\x05\x0a", "b:1")
    assert info.value.bookie == "b:1"
    missing_host = BookieServiceInfoFormat()
    missing_host.endpoints.add(id="bookie", port=1, protocol="bookie-rpc")
    with pytest.raises(CorruptMetadataError, match="host"):
        decode_service_info(missing_host.SerializePartialToString(), "b:1")
    # A property that is not UTF-8 (map entry key=\xff value="v").
    with pytest.raises(CorruptMetadataError):
        decode_service_info(b"\x3a\x06\x0a\x01\xff\x12\x01v", "b:1")


# ---- cookies ------------------------------------------------------------------------------------

COOKIE_V5 = (
    b"5\n"
    b'bookieHost: "10.0.0.5:3181"\n'
    b'journalDir: "/data/journal"\n'
    b'ledgerDirs: "1\\t/data/ledgers"\n'
    b'instanceId: "5c0e-uuid"\n'
)


def test_cookie_v5_parses_and_encodes_byte_for_byte() -> None:
    cookie = parse_cookie(COOKIE_V5)
    assert cookie == Cookie(5, "10.0.0.5:3181", ["/data/journal"], ["/data/ledgers"], "5c0e-uuid")
    assert encode_cookie(cookie) == COOKIE_V5


def test_cookie_round_trip_with_many_dirs_and_index_dirs() -> None:
    cookie = Cookie(5, "b-1", ["/j1", "/j2"], ["/l1", "/l2", "/l3"], None, ["/i1"])
    data = encode_cookie(cookie)
    assert data == (
        b"5\n"
        b'bookieHost: "b-1"\n'
        b'journalDir: "/j1,/j2"\n'
        b'ledgerDirs: "3\\t/l1\\t/l2\\t/l3"\n'
        b'indexDirs: "1\\t/i1"\n'
    )
    assert parse_cookie(data) == cookie


def test_cookie_text_in_any_order_with_empty_instance_id() -> None:
    data = b' 5 \r\nledgerDirs: "2\\t/a\\t/b" instanceId: "" journalDir: "/j"\nbookieHost: "x:1"'
    assert parse_cookie(data) == Cookie(5, "x:1", ["/j"], ["/a", "/b"], None, None)


def test_legacy_layout_3_cookie() -> None:
    data = b"3\n10.0.0.5:3181\n/data/journal\n1\t/data/ledgers\n"
    assert parse_cookie(data) == Cookie(3, "10.0.0.5:3181", ["/data/journal"], ["/data/ledgers"])


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"five\n",
        b'5\nbookieHost: "x:1"\n',  # journalDir and ledgerDirs are required
        b"5\nnot a proto\n",
        b"3\nonly-bookie\n",
    ],
)
def test_corrupt_cookie(data: bytes) -> None:
    with pytest.raises(CorruptMetadataError):
        parse_cookie(data)


def test_too_old_cookie() -> None:
    with pytest.raises(CompatibilityError):
        parse_cookie(b"2\nx:1\n/j\n1\t/l\n")


# ---- under-replication --------------------------------------------------------------------------


def test_underreplicated_mark_encodes_and_decodes_byte_for_byte() -> None:
    data = b'replica: "10.0.0.7:3181"\nctime: 1732000000000\n'
    assert encode_ur_ledger(["10.0.0.7:3181"], 1_732_000_000_000) == data
    assert decode_ur_ledger(data) == (["10.0.0.7:3181"], 1_732_000_000_000)


def test_ur_without_ctime_and_several_replicas() -> None:
    data = encode_ur_ledger(("a:1", "b:2"), None)
    assert data == b'replica: "a:1"\nreplica: "b:2"\n'
    assert decode_ur_ledger(data) == (["a:1", "b:2"], None)
    assert decode_ur_ledger(b"") == ([], None)


@pytest.mark.parametrize("data", [b"replica: a:1\n", b"ctime: soon\n", b"\xff"])
def test_corrupt_ur(data: bytes) -> None:
    with pytest.raises(CorruptMetadataError):
        decode_ur_ledger(data)


def test_lock_data_and_auditor_vote() -> None:
    assert encode_lock_data("worker-host") == b'bookieId: "worker-host"\n'
    assert decode_lock_data(b'bookieId: "worker-host"\n') == "worker-host"
    assert decode_lock_data(b"") == ""
    assert encode_auditor_vote("10.0.0.5:3181") == b'bookieId: "10.0.0.5:3181"\n'
    assert decode_auditor_vote(encode_auditor_vote("10.0.0.5:3181")) == "10.0.0.5:3181"
    with pytest.raises(CorruptMetadataError):
        decode_auditor_vote(b"vote for me")


def test_ur_layout() -> None:
    assert UR_LAYOUT_DATA == b'type: "BASIC"\nversion: 1\n'
    check_ur_layout(UR_LAYOUT_DATA)
    check_ur_layout(b'version: 1 type: "BASIC"')


@pytest.mark.parametrize(
    "data",
    [b'type: "FANCY"\nversion: 1\n', b'type: "BASIC"\nversion: 2\n', b'type: "BASIC"\n', b"junk"],
)
def test_incompatible_ur_layout(data: bytes) -> None:
    with pytest.raises(CompatibilityError):
        check_ur_layout(data)


def test_check_ctime_binary() -> None:
    data = encode_check_ctime(1_732_000_000_000)
    assert data[0] == 0x08 and len(data) == 7
    assert decode_check_ctime(data) == 1_732_000_000_000
    # The three ctime formats share one wire form.
    other = PlacementPolicyCheckFormat()
    other.ParseFromString(data)
    assert other.placementPolicyCheckCTime == 1_732_000_000_000
    assert decode_check_ctime(b"") == -1
    with pytest.raises(CorruptMetadataError):
        decode_check_ctime(b"\x08")
