"""Metadata fuzz: over a thousand corrupted ledger znodes, in a real ZooKeeper and in a real
Oxia (the same keys and bytes, as Pulsar's Oxia driver stores them), audited with the local
executor; both stores must give the same error rows. Every znode that does not decode must
become an error row naming its path (never a silently dropped ledger), every one that does must
be audited, and the repair must refuse to touch a ledger it cannot parse.

The inputs come from ``$BKAUDIT_FUZZ_SEED`` (printed on failure); ``decode_metadata`` is the
oracle for which payloads decode.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from google.protobuf import text_format

from bklib.client.operations import ClientConfig
from bklib.client.pool import SyncBookieClient
from bklib.errors import CorruptMetadataError
from bklib.meta.cluster import MetadataDriver
from bklib.meta.model import DigestType, LedgerMetadata, LedgerState, Segment
from bklib.meta.paths import SHORT_ID_LIMIT, ledger_path
from bklib.meta.serde import HEADER_PREFIX, decode_metadata, encode_metadata, metadata_header
from bklib.meta.store import LedgerStore
from bklib.meta.stores import is_oxia, open_store
from bklib.meta.underreplication import UnderReplicationManager
from bklib.proto.formats_pb2 import LedgerMetadataFormat
from bklib.repair.requests import LedgerRequest
from bklib.repair.worker import LedgerRepairer, RepairSettings
from bklib.states import DEFAULT_LEDGERS_ROOT, ActionStatus, RunStatus
from jobs.commands.audit import add_audit_arguments, run_audit
from jobs.commands.repair import add_repair_arguments, run_recover
from jobs.runtime.exit_status import ExitStatus
from jobs.tables import delta

pytestmark = pytest.mark.integration

DEFAULT_SEED = 20_240_611
SEED = int(os.environ.get("BKAUDIT_FUZZ_SEED", DEFAULT_SEED))
N_CORRUPT = 1_100
N_VALID = 50
ROOT = DEFAULT_LEDGERS_ROOT
# Fake bookies: none is registered, so the lost check names every one of them.
BOOKIES = [f"10.0.{i // 4}.{i % 4 + 1}:3181" for i in range(10)]

# ---- valid metadata ---------------------------------------------------------------------------


def random_metadata(rng: random.Random, ledger_id: int = 1) -> LedgerMetadata:
    """Valid metadata in format v2 or v3 (the two the serde writes), varied in every field."""
    e = rng.randint(1, 5)
    wq = rng.randint(1, e)
    aq = rng.randint(1, wq)
    first, segments = 0, []
    for _ in range(rng.randint(1, 4)):
        segments.append(Segment(first, tuple(rng.sample(BOOKIES, e))))
        first += rng.randint(1, 1_000)
    state = rng.choice(list(LedgerState))
    closed = state == LedgerState.CLOSED
    digest = rng.choice(list(DigestType))
    with_ctime = rng.random() < 0.5
    return LedgerMetadata(
        ledger_id=ledger_id,
        ensemble_size=e,
        write_quorum=wq,
        ack_quorum=aq,
        segments=tuple(segments),
        state=state,
        last_entry_id=first + rng.randint(-1, 500) if closed else -1,
        length=rng.randint(0, 2**40) if closed else 0,
        digest_type=digest,
        password=rng.randbytes(rng.choice([0, 4, 20])),
        ctime=rng.randint(1, 2**41) if with_ctime else None,
        store_ctime=with_ctime,
        custom_metadata={f"k{i}": rng.randbytes(3) for i in range(rng.randint(0, 2))},
        ctoken=rng.randint(0, 2**62),
        format_version=rng.choice([2, 3]),
    )


def to_proto(md: LedgerMetadata) -> LedgerMetadataFormat:
    """``md`` as the message the serde would write (v3 form), to be mutated freely."""
    data = encode_metadata(md.replace(format_version=3))
    msg = LedgerMetadataFormat()
    msg.ParseFromString(_v3_body(data))
    return msg


def _v3_body(data: bytes) -> bytes:
    pos = len(metadata_header(3))
    size, pos = read_varint(data, pos)
    return data[pos : pos + size]


# ---- wire helpers -----------------------------------------------------------------------------


def varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # negatives as protobuf writes them: 10 bytes, sign-extended
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        if not n:
            out.append(b)
            return bytes(out)
        out.append(b | 0x80)


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = data[pos]
        value |= (b & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if not b & 0x80:
            return value, pos


def field_varint(num: int, value: int) -> bytes:
    return varint(num << 3) + varint(value)


def field_bytes(num: int, value: bytes) -> bytes:
    return varint(num << 3 | 2) + varint(len(value)) + value


def v3(body: bytes, size: int | None = None) -> bytes:
    return metadata_header(3) + varint(len(body) if size is None else size) + body


def v2(msg: LedgerMetadataFormat) -> bytes:
    return metadata_header(2) + text_format.MessageToString(msg, as_utf8=False).encode()


def serialize(msg: LedgerMetadataFormat, rng: random.Random) -> bytes:
    """A possibly invalid message as v3 or v2 (partial: required fields may be missing)."""
    if rng.random() < 0.7:
        return v3(msg.SerializePartialToString())
    return v2(msg)


def field_boundaries(body: bytes) -> list[int]:
    """Offsets of every top-level and segment field start/end and tag/length/value split."""
    cuts: set[int] = set()

    def walk(start: int, end: int, nested: bool) -> None:
        pos = start
        while pos < end:
            cuts.add(pos)
            key, p = read_varint(body, pos)
            cuts.add(p)
            wire = key & 7
            if wire == 0:
                _, p = read_varint(body, p)
            elif wire == 2:
                n, p = read_varint(body, p)
                cuts.add(p)
                if key >> 3 == 6 and not nested:
                    walk(p, p + n, True)
                p += n
            else:
                raise AssertionError(f"unexpected wire type {wire}")
            pos = p
        cuts.add(end)

    walk(0, len(body), False)
    return sorted(cuts)


# ---- corruptions ------------------------------------------------------------------------------
# Each takes the rng and a valid metadata and returns znode bytes, most of them undecodable.

Corruption = Callable[[random.Random, LedgerMetadata], bytes]


def bit_flips(rng: random.Random, md: LedgerMetadata) -> bytes:
    data = bytearray(encode_metadata(md))
    for _ in range(rng.choice([1, 1, 1, 2, 3, 8])):
        i = rng.randrange(len(data) * 8)
        data[i // 8] ^= 1 << (i % 8)
    return bytes(data)


def byte_overwrite(rng: random.Random, md: LedgerMetadata) -> bytes:
    data = bytearray(encode_metadata(md))
    for _ in range(rng.randint(1, 4)):
        data[rng.randrange(len(data))] = rng.choice([0x00, 0xFF, 0x80, 0x7F, 0x0A, 0x09, 0x22])
    return bytes(data)


def truncate_at_boundary(rng: random.Random, md: LedgerMetadata) -> bytes:
    data = encode_metadata(md)
    head = len(metadata_header(md.format_version))
    cuts = [0, 1, len(HEADER_PREFIX) - 1, len(HEADER_PREFIX), head - 1, head]
    if md.format_version == 3:
        body = _v3_body(data)
        start = len(data) - len(body)
        cuts += list(range(head, start + 1))  # inside and after the length prefix
        cuts += [start + c for c in field_boundaries(body)]
    else:
        cuts += [i for i, b in enumerate(data) if b in b'\n{}:" ']
    return data[: rng.choice([c for c in cuts if c < len(data)])]


def truncate_and_fix_length(rng: random.Random, md: LedgerMetadata) -> bytes:
    """A v3 body cut at a field boundary, the length prefix rewritten to match: a well-formed
    prefix of the message (fields missing, or a partial segment)."""
    body = to_proto(md).SerializeToString()
    cut = rng.choice(field_boundaries(body)[:-1])
    return v3(body[:cut])


def truncate_anywhere(rng: random.Random, md: LedgerMetadata) -> bytes:
    data = encode_metadata(md)
    return data[: rng.randrange(len(data))]


def wrong_version_header(rng: random.Random, md: LedgerMetadata) -> bytes:
    body = encode_metadata(md)[len(metadata_header(md.format_version)) :]
    version = rng.choice(
        [b"0", b"4", b"-1", b"+3", b"03", b" 3", b"3 ", b"99", b"2147483648", b"1" * 12, b"",
         b"abc", b"\xff", b"3\r", b"1", b"2" if md.format_version == 3 else b"3"]
    )  # fmt: skip
    prefix = rng.choice(
        [HEADER_PREFIX, HEADER_PREFIX.lower(), HEADER_PREFIX[:-1] + b" ", HEADER_PREFIX[1:],
         b"BookieMetadataFormatVersion:", HEADER_PREFIX[:-1]]
    )  # fmt: skip
    newline = rng.choice([b"\n", b"\n", b"", b"\r\n", b"\n\n"])
    return prefix + version + newline + body


def swapped_format(rng: random.Random, md: LedgerMetadata) -> bytes:
    """A v3 body under a v2 header, or the reverse, or under a v1 header."""
    data = encode_metadata(md)
    body = data[len(metadata_header(md.format_version)) :]
    other = rng.choice([1, 2 if md.format_version == 3 else 3])
    return metadata_header(other) + body


def bogus_ensemble(rng: random.Random, md: LedgerMetadata) -> bytes:
    msg = to_proto(md)
    seg = rng.choice(msg.segment)
    kind = rng.randrange(7)
    if kind == 0:
        del seg.ensembleMember[:]
    elif kind == 1:
        seg.ensembleMember[-1] = seg.ensembleMember[0]  # duplicate (E=1: unchanged)
    elif kind == 2:
        seg.ensembleMember.append(rng.choice(BOOKIES))  # wrong size
    elif kind == 3:
        del seg.ensembleMember[-1]
    elif kind == 4:
        bad = rng.choice(["", "readonly", "READONLY", "a b:3181", "host/x:1", "h\t1", "é:3181",
                          "x" * 300, "\x00", "{}:1", "10.0.0.1:3181,10.0.0.2:3181"])  # fmt: skip
        seg.ensembleMember[rng.randrange(len(seg.ensembleMember))] = bad
    elif kind == 5:
        del msg.segment[:]  # no ensembles at all
    else:
        msg.ensembleSize = rng.choice([0, -1, msg.ensembleSize + 1, 2**31 - 1])
    return serialize(msg, rng)


def bad_segment_keys(rng: random.Random, md: LedgerMetadata) -> bytes:
    msg = to_proto(md)
    kind = rng.randrange(4)
    if kind == 0 or len(msg.segment) < 2:
        msg.segment[0].firstEntryId = rng.choice([-1, -2, -(2**63)])
        if len(msg.segment) > 1 and rng.random() < 0.5:
            msg.segment[1].firstEntryId = -(2**63)
    elif kind == 1:
        a, b = rng.sample(range(len(msg.segment)), 2)
        fa, fb = msg.segment[a].firstEntryId, msg.segment[b].firstEntryId
        msg.segment[a].firstEntryId, msg.segment[b].firstEntryId = fb, fa
    elif kind == 2:
        msg.segment[-1].firstEntryId = msg.segment[-2].firstEntryId  # duplicate key
    else:
        msg.segment[-1].firstEntryId = 2**63 - 1
        msg.segment.add().CopyFrom(msg.segment[0])  # key 0 after the largest
    return serialize(msg, rng)


def bad_numbers(rng: random.Random, md: LedgerMetadata) -> bytes:
    """Quorums, lengths and entry ids at and past their limits."""
    msg = to_proto(md)
    name = rng.choice(["quorumSize", "ackQuorumSize", "ensembleSize", "length", "lastEntryId",
                       "ctime", "cToken"])  # fmt: skip
    limit = 2**31 if name in ("quorumSize", "ackQuorumSize", "ensembleSize") else 2**63
    setattr(msg, name, rng.choice([0, -1, -2, limit // 2, limit - 2, limit - 1, -limit]))
    if rng.random() < 0.5:
        msg.state = LedgerMetadataFormat.CLOSED
    return serialize(msg, rng)


def huge_length_prefix(rng: random.Random, md: LedgerMetadata) -> bytes:
    body = to_proto(md).SerializeToString()
    prefix = rng.choice(
        [varint(2**31 - 1), varint(2**31), varint(2**32 + len(body)), varint(-1),
         varint(len(body) + 1), b"\xff" * 10, b"\xff" * 11, b"\x80" * 9 + b"\x01",
         b"\x80" * 10 + b"\x00", b"\x80", b""]
    )  # fmt: skip
    return metadata_header(3) + prefix + body


def huge_field_varints(rng: random.Random, md: LedgerMetadata) -> bytes:
    """Hand-built fields whose varints or lengths are oversized, overlong or unterminated."""
    body = to_proto(md).SerializeToString()
    num = rng.choice([1, 2, 3, 4, 5, 7, 9, 10, 12, 6, 8, 11, 99, 536_870_911])
    bad = rng.choice(
        [varint(num << 3) + b"\xff" * 9 + b"\x7f",  # 64 bits set
         varint(num << 3) + b"\xff" * 10 + b"\x01",  # 11-byte varint
         varint(num << 3) + b"\x80" * 10,  # unterminated
         varint(num << 3 | 2) + varint(2**31 - 1) + b"x",  # length past the end
         varint(num << 3 | 2) + varint(2**64 - 1),
         varint(num << 3 | 2) + b"\x05ab",
         varint(num << 3 | 1) + b"\x01\x02",  # fixed64 cut short
         varint(num << 3 | 3),  # start group, never ended
         varint(num << 3 | 4),  # end group without a start
         varint(num << 3 | 6) + b"\x00",  # wire type 6 does not exist
         b"\x00\x00",  # field number 0
         b"\xff" * 10]
    )  # fmt: skip
    where = rng.choice([0, len(body)])
    return v3(body[:where] + bad + body[where:])


def wrong_wire_type(rng: random.Random, md: LedgerMetadata) -> bytes:
    """A known field sent with another wire type (bytes for an int, an int for a segment)."""
    body = to_proto(md).SerializeToString()
    num = rng.choice([1, 2, 3, 5, 6, 8, 11])
    extra = field_bytes(num, b"\x08\x01") if num not in (6, 8, 11) else field_varint(num, 1)
    return v3(rng.choice([extra + body, body + extra]))


def unknown_enum(rng: random.Random, md: LedgerMetadata) -> bytes:
    """State or digest type out of the enum: proto2 keeps it as an unknown field."""
    msg = to_proto(md)
    body = msg.SerializeToString()
    field = rng.choice([5, 7])
    value = rng.choice([0, 4, 5, 127, 2**31 - 1, -1])
    if field == 5:
        msg.ClearField("state")
        body = msg.SerializePartialToString()
    return v3(body + field_varint(field, value))


def missing_required(rng: random.Random, md: LedgerMetadata) -> bytes:
    """Valid-looking protobuf with required fields left out."""
    msg = to_proto(md)
    names = ["quorumSize", "ensembleSize", "length", "state", "segment.firstEntryId"]
    for name in rng.sample(names, rng.randint(1, 2)):
        if name == "segment.firstEntryId":
            rng.choice(msg.segment).ClearField("firstEntryId")
        else:
            msg.ClearField(name)
    return serialize(msg, rng)


def custom_metadata(rng: random.Random, md: LedgerMetadata) -> bytes:
    msg = to_proto(md)
    kind = rng.randrange(3)
    if kind == 0:
        msg.customMetadata.add(key="dup", value=b"1")
        msg.customMetadata.add(key="dup", value=b"2")
        return serialize(msg, rng)
    body = msg.SerializeToString()
    if kind == 1:  # a key that is not UTF-8
        return v3(body + field_bytes(11, field_bytes(1, b"\xff\xfe") + field_bytes(2, b"v")))
    return v3(body + field_bytes(11, b"\x0a\x7f"))  # entry with a truncated key


def garbage_bytes(rng: random.Random, md: LedgerMetadata) -> bytes:
    junk = rng.randbytes(rng.randint(0, 200))
    return rng.choice(
        [junk, metadata_header(3) + junk, metadata_header(2) + junk, metadata_header(1) + junk,
         metadata_header(3) + varint(len(junk)) + junk, HEADER_PREFIX + junk]
    )  # fmt: skip


def garbage_text(rng: random.Random, md: LedgerMetadata) -> bytes:
    """v2 text with a damaged token, or v1 lines that are not numbers."""
    if rng.random() < 0.5:
        text = encode_metadata(md.replace(format_version=2))
        lines = text.split(b"\n")
        i = rng.randrange(1, len(lines))
        lines[i] = rng.choice([b"}", b"{", b"segment {", b'ensembleMember: "x', b"state: 9",
                               b"quorumSize: 1e3", b"bogus: 1", b"length: 99999999999999999999",
                               b"[ext]: 1", b"password: \"\\xzz\"", lines[i][::-1]])  # fmt: skip
        return b"\n".join(lines)
    lines = [b"2", b"3", b"0", b"0\t" + b"\t".join(b.encode() for b in BOOKIES[:3])]
    i = rng.randrange(len(lines))
    lines[i] = rng.choice([b"x", b"", b"9999999999999999999999", b"1.5", b"0", b"-1\tCLOSED",
                           b"\t", b"0\t" + BOOKIES[0].encode()])  # fmt: skip
    return metadata_header(1) + b"\n".join(lines) + rng.choice([b"", b"\n"])


def tiny(rng: random.Random, md: LedgerMetadata) -> bytes:
    return rng.choice(
        [b"", b"\n", b"\x00", metadata_header(3), metadata_header(2), metadata_header(1),
         metadata_header(3) + b"\x00", metadata_header(2) + b"{}", metadata_header(3)[:-1]]
    )  # fmt: skip


def trailing_junk(rng: random.Random, md: LedgerMetadata) -> bytes:
    """Bytes after the payload: ignored after a v3 message, fatal in v2 text unless they
    happen to parse."""
    return encode_metadata(md) + rng.randbytes(rng.randint(1, 16))


CORRUPTIONS: list[Corruption] = [
    bit_flips,
    bit_flips,
    bit_flips,
    byte_overwrite,
    truncate_at_boundary,
    truncate_at_boundary,
    truncate_and_fix_length,
    truncate_anywhere,
    wrong_version_header,
    swapped_format,
    bogus_ensemble,
    bogus_ensemble,
    bad_segment_keys,
    bad_numbers,
    huge_length_prefix,
    huge_field_varints,
    wrong_wire_type,
    unknown_enum,
    missing_required,
    missing_required,
    custom_metadata,
    garbage_bytes,
    garbage_text,
    tiny,
    trailing_junk,
]


@dataclass(frozen=True)
class Case:
    ledger_id: int
    kind: str
    data: bytes
    error: str | None
    """The oracle's verdict: None when ``decode_metadata`` accepts the payload."""


def oracle(data: bytes, ledger_id: int) -> str | None:
    try:
        decode_metadata(data, ledger_id)
    except CorruptMetadataError as exc:
        return exc.reason
    return None


def generate(seed: int) -> list[Case]:
    rng = random.Random(seed)
    n = N_CORRUPT + N_VALID
    # Mostly short (hierarchical) ids in a few leaf dirs, some past 2^31 (long layout).
    ids = rng.sample(range(1, 60_000), n - 20) + [
        SHORT_ID_LIMIT + rng.randrange(2**40) for _ in range(20)
    ]
    rng.shuffle(ids)
    cases = []
    for i, lid in enumerate(ids):
        md = random_metadata(rng, lid)
        if i < N_VALID:
            kind, data = "valid", encode_metadata(md)
        else:
            corrupt = CORRUPTIONS[i % len(CORRUPTIONS)]
            kind, data = corrupt.__name__, corrupt(rng, md)
        cases.append(Case(lid, kind, data, oracle(data, lid)))
    return cases


# ---- the test ---------------------------------------------------------------------------------


def write_znodes(hosts: str, cases: list[Case]) -> None:
    with open_store(hosts, timeout=15) as zk:
        driver = MetadataDriver.PULSAR if is_oxia(hosts) else MetadataDriver.BOOKKEEPER
        LedgerStore(zk, ROOT).init_cluster(driver=driver)
        paths = [ledger_path(ROOT, c.ledger_id) for c in cases]
        for parent in sorted({p.rsplit("/", 1)[0] for p in paths}):
            zk.ensure_path(parent)
        for p, c in zip(paths, cases, strict=True):
            zk.create(p, c.data)


def test_metadata_fuzz(
    store_locator: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    try:
        fuzz(SEED, store_locator, tmp_path, caplog)
    except BaseException:
        print(f"metadata fuzz failed with BKAUDIT_FUZZ_SEED={SEED}")
        raise


def fuzz(seed: int, zk_chroot: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    t0 = time.monotonic()
    cases = generate(seed)
    by_id = {c.ledger_id: c for c in cases}
    assert len(by_id) == len(cases)
    bad = {c.ledger_id for c in cases if c.error is not None}
    assert sum(c.kind != "valid" for c in cases) >= 1_000
    assert all(c.error is None for c in cases if c.kind == "valid")
    assert len(bad) >= 800, f"too few undecodable inputs ({len(bad)}), seed {seed}"
    write_znodes(zk_chroot, cases)

    # ---- the audit reports exactly the znodes the serde rejects, each by path ----
    wh = str(tmp_path / "wh")
    argv = ["--zk", zk_chroot, "--warehouse", wh, "--check", "lost", "--executor", "local"]
    args = add_audit_arguments(argparse.ArgumentParser()).parse_args(argv)
    with caplog.at_level(logging.ERROR), contextlib.redirect_stdout(io.StringIO()):
        assert run_audit(args) == ExitStatus.INCOMPLETE, f"seed {seed}"  # unreadable znodes
    run = delta.latest_run(wh)
    assert run is not None
    assert run["status"] == RunStatus.COMPLETED_WITH_ERRORS
    rows = [r for r in delta.read_rows(wh, "ledgers") if r["run_id"] == run["run_id"]]
    assert sorted(r["ledger_id"] for r in rows) == sorted(by_id), f"seed {seed}"
    errors = {r["ledger_id"]: r for r in rows if r["error"] is not None}
    assert set(errors) == bad, f"seed {seed}: " + "; ".join(
        f"ledger {lid} ({by_id[lid].kind}): oracle {by_id[lid].error!r}, "
        f"audit {errors[lid]['error'] if lid in errors else None!r}"
        for lid in sorted(set(errors) ^ bad)[:10]
    )
    for lid, row in errors.items():
        path = ledger_path(ROOT, lid)
        assert row["znode_path"] == path
        assert f"znode {path}" in row["error"], f"seed {seed}: {row['error']}"
    for row in rows:
        case = by_id[row["ledger_id"]]
        if case.error is None:
            md = decode_metadata(case.data, case.ledger_id)
            assert (row["state"], row["ensemble_size"]) == (md.state.name, md.ensemble_size)
    assert run["counts"]["metadata_errors"] == len(errors)
    crashes = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not crashes, f"seed {seed}: {crashes[0].getMessage()}"

    # ---- the repair refuses to touch what it cannot parse, and says so ----
    corrupt = sorted(bad)[:5]
    zk = open_store(zk_chroot, timeout=15)
    try:
        before = {lid: zk.get(ledger_path(ROOT, lid)) for lid in corrupt}
        valid_md = next(decode_metadata(c.data, c.ledger_id) for c in cases if c.error is None)
        bookie = valid_md.segments[0].ensemble[0]
        argv = [bookie, "--zk", zk_chroot, "--warehouse", wh, "--executor", "local", "--dry-run"]
        rargs = add_repair_arguments(argparse.ArgumentParser(), "recover").parse_args(argv)
        out = io.StringIO()
        caplog.clear()
        with caplog.at_level(logging.WARNING), contextlib.redirect_stdout(out):
            code = run_recover(rargs)
        # Fail closed: an unparsable ledger may name the bookie, so the run is incomplete (3)
        # and says which ledgers it could not read; they get no action (nothing is known of
        # their ensembles), and the scan's log names each one.
        assert code == ExitStatus.INCOMPLETE, out.getvalue()
        assert f"{len(bad)} ledgers could not be read and may still name {bookie}" in out.getvalue()
        assert f"ledger {min(bad)}: " in out.getvalue()
        actions = delta.read_rows(wh, "replication_actions")
        assert actions and not {a["ledger_id"] for a in actions} & bad
        logged = "\n".join(r.getMessage() for r in caplog.records)
        for lid in corrupt:
            assert f"corrupt metadata at {ledger_path(ROOT, lid)}" in logged

        store = LedgerStore(zk, ROOT)
        with SyncBookieClient(zk, config=ClientConfig(read_timeout=2.0)) as client:
            repairer = LedgerRepairer(store, client, RepairSettings(grace_period=0, rate=None))
            for lid in corrupt:
                (act,) = repairer.repair(LedgerRequest(lid, frozenset({bookie})))
                path = ledger_path(ROOT, lid)
                assert act.status in (ActionStatus.FAILED, ActionStatus.SKIPPED)
                assert act.error is not None and f"znode {path}" in act.error, act.error
                assert act.error.startswith("CorruptMetadataError"), act.error
        for lid in corrupt:
            assert zk.get(ledger_path(ROOT, lid)) == before[lid], f"ledger {lid} was touched"
            assert UnderReplicationManager(zk, ROOT).get(lid) is None
    finally:
        zk.close()
    print(f"metadata fuzz on {zk_chroot}: {time.monotonic() - t0:.0f}s")
