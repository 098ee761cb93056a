"""The placement rule (bklib.audit.placement) against examples from BookKeeper's own tests.

Mirrored, with the same bookies, racks and expected adherence:

* ``TestRackawareEnsemblePlacementPolicy.testIsEnsembleAdheringToPlacementPolicy``
* ``TestRackawareEnsemblePlacementPolicy.testReplaceToAdherePlacementPolicy``,
  ``...WithNoMoreRackBookie`` and ``...WithUnknowBookie`` (the inputs FAIL; bkaudit's
  one-move-at-a-time fix reaches MEETS_STRICT with no more moved replicas than BookKeeper's
  expected result changes, or finds no move where BookKeeper returns FAIL)
* ``TestZoneawareEnsemblePlacementPolicy.testIsEnsembleAdheringToPlacementPolicy``

plus Pulsar's isolation groups (``IsolatedBookieEnsemblePlacementPolicy``) and the strict rack
document parse.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from bklib.audit.model import LedgerView
from bklib.audit.placement import (
    DEFAULT_FAULT_DOMAIN,
    ENSEMBLE_PLACEMENT_POLICY_CONFIG,
    ISOLATED_POLICY_CLASS,
    Adherence,
    IsolationGroups,
    IsolationPolicyError,
    PlacementRule,
    best_moves,
    check_ensemble,
    isolation_excluded,
    isolation_groups,
    placement_findings,
    rack_resolver,
)
from bklib.meta.racks import (
    DEFAULT_RACK,
    RacksFormatError,
    load_racks_file,
    parse_racks,
    parse_racks_strict,
)
from bklib.repair.requests import requests_from_findings
from bklib.states import Reason
from tests.audit_helpers import metadata

RACK = PlacementRule()
ENFORCED = PlacementRule(enforce_min_racks_per_write_quorum=True)


def addr(n: int) -> str:
    return f"127.0.0.{n}:3181"


def adherence(
    ensemble: Sequence[str],
    wq: int,
    racks: Mapping[str, str],
    rule: PlacementRule = RACK,
    known: Sequence[str] | None = None,
) -> str:
    return check_ensemble(
        ensemble, wq, rule, rack_resolver(racks, rule.default_location, known)
    ).adherence


# ---- RackawareEnsemblePlacementPolicyImpl.isEnsembleAdheringToPlacementPolicy --------------------


def test_rackaware_is_ensemble_adhering_bookkeeper_example() -> None:
    # testIsEnsembleAdheringToPlacementPolicy: addr1..addr4 are known (writable); addr5 and
    # addr6 are not, so they add no rack.
    a1, a2, a3, a4, a5, a6 = (addr(n) for n in range(2, 8))
    racks = {
        a1: "/default-region/default-rack",
        a2: "/default-region/r2",
        a3: "/default-region/r2",
        a4: "/default-region/r3",
        a5: "/default-region/r3",
        a6: "/default-region/r3",
    }
    known = [a1, a2, a3, a4]
    assert adherence([], 3, racks, known=known) == Adherence.FAIL
    # E=2 < WQ=3: the write set wraps (a1, a2, a1): two racks.
    assert adherence([a1, a2], 3, racks, known=known) == Adherence.MEETS_STRICT
    assert adherence([a1, a2, a3], 3, racks, known=known) == Adherence.MEETS_STRICT
    assert adherence([a4, a5, a6], 3, racks, known=known) == Adherence.FAIL


def test_rackaware_min_racks_is_capped_at_the_write_quorum_and_configurable() -> None:
    racks = {"a": "/r1", "b": "/r1", "c": "/r2"}
    assert adherence(["a", "b"], 1, racks) == Adherence.MEETS_STRICT  # min(WQ=1, 2) = 1
    assert adherence(["a", "b"], 2, racks) == Adherence.FAIL
    three = PlacementRule(min_racks_per_write_quorum=3)
    assert adherence(["a", "b", "c"], 3, racks, three) == Adherence.FAIL
    assert adherence(["a", "c"], 2, racks, three) == Adherence.MEETS_STRICT  # capped at WQ


def test_rackaware_enforce_refuses_the_default_rack() -> None:
    racks = {"a": "/r1"}  # b has no rack: the default rack, a rack of its own
    assert adherence(["a", "b"], 2, racks) == Adherence.MEETS_STRICT
    assert adherence(["a", "b"], 2, racks, ENFORCED) == Adherence.FAIL
    assert check_ensemble(["a", "b"], 2, RACK, rack_resolver(racks)).set_racks[0] == (
        DEFAULT_RACK,
        "/r1",
    )


def test_failing_write_sets_are_listed_and_the_suspect_is_stable() -> None:
    racks = {"a": "/r1", "b": "/r1", "c": "/r1", "d": "/r2"}
    verdict = check_ensemble(["a", "b", "c", "d"], 2, RACK, rack_resolver(racks))
    assert verdict.adherence == Adherence.FAIL
    assert verdict.failing == (0, 1)  # (a,b) and (b,c); (c,d) and (d,a) span two racks
    assert verdict.suspect == 1  # b is in both failing write sets
    assert "2 of 4 write sets" in verdict.detail and "minNumRacksPerWriteQuorum=2" in verdict.detail


# ---- the fix, against replaceToAdherePlacementPolicy's cases -------------------------------------


def _replace_to_adhere_cluster(n: int) -> dict[str, str]:
    """testReplaceToAdherePlacementPolicy*: 127.0.0.1..3 on r1, 4..6 on r2, 7..9 on r3."""
    return {addr(i): f"/default-region/r{(i - 1) // 3 + 1}" for i in range(1, n + 1)}


def _fix(
    ensemble: Sequence[str],
    wq: int,
    racks: Mapping[str, str],
    rule: PlacementRule,
    candidates: Sequence[str],
    known: Sequence[str] | None = None,
) -> tuple[list[str], int]:
    """Apply the best single move until the ensemble adheres or none helps (as the repair does,
    taking the first of the best moves); returns the ensemble and how many replicas moved."""
    resolve = rack_resolver(racks, rule.default_location, known)
    current, moved = list(ensemble), 0
    for _ in range(len(ensemble)):
        moves = best_moves(current, wq, rule, resolve, candidates)
        if not moves:
            break
        m = moves[0]
        assert current[m.index] == m.old and m.after.score > m.before.score
        current[m.index] = m.new
        moved += 1
    return current, moved


@pytest.mark.parametrize(
    ("given", "bookkeeper_changes"),
    [
        ([1, 4, 7, 2, 5, 8, 9], 1),  # BookKeeper: ... addr9 -> addr6
        ([6, 4, 7, 2, 5, 8, 3], 1),  # BookKeeper: addr4 -> addr1
        ([1, 2, 3, 4, 5, 6, 7], 2),  # BookKeeper: index 1 -> r3, index 4 -> r1/r3
        ([1, 2, 4, 5, 7, 8, 9], 3),  # minimum: {0,1}, {2,3} and {4,5,6} each need a move
    ],
)
def test_replace_to_adhere_placement_policy_cases(
    given: list[int], bookkeeper_changes: int
) -> None:
    racks = _replace_to_adhere_cluster(9)
    ensemble = [addr(i) for i in given]
    assert adherence(ensemble, 2, racks, ENFORCED) == Adherence.FAIL
    fixed, moved = _fix(ensemble, 2, racks, ENFORCED, list(racks))
    assert adherence(fixed, 2, racks, ENFORCED) == Adherence.MEETS_STRICT
    assert moved <= bookkeeper_changes
    assert len(set(fixed)) == len(fixed)


def test_bookkeepers_own_answer_is_among_the_best_single_moves() -> None:
    # testReplaceToAdherePlacementPolicy's first case: BookKeeper replaces addr9 by addr6.
    racks = _replace_to_adhere_cluster(9)
    ensemble = [addr(i) for i in (1, 4, 7, 2, 5, 8, 9)]
    moves = best_moves(ensemble, 2, ENFORCED, rack_resolver(racks), list(racks))
    assert (6, addr(9), addr(6)) in {(m.index, m.old, m.new) for m in moves}
    assert all(m.after.adherence == Adherence.MEETS_STRICT for m in moves)


def test_replace_to_adhere_with_no_more_rack_bookie_finds_no_move() -> None:
    # testReplaceToAdherePlacementPolicyWithNoMoreRackBookie: E=3, WQ=2 over two racks can
    # never adhere (three write sets in a cycle); BookKeeper returns FAIL and an empty list.
    racks = _replace_to_adhere_cluster(6)
    ensemble = [addr(1), addr(2), addr(4)]
    assert adherence(ensemble, 2, racks, ENFORCED) == Adherence.FAIL
    assert best_moves(ensemble, 2, ENFORCED, rack_resolver(racks), list(racks)) == []


def test_replace_to_adhere_with_unknown_bookies() -> None:
    # testReplaceToAdherePlacementPolicyWithUnknowBookie: 127.0.0.10 and .11 are not known to
    # the policy (no rack counted); the fix replaces them and reaches MEETS_STRICT.
    racks = _replace_to_adhere_cluster(6)
    known = list(racks)
    ensemble = ["127.0.0.10:3181", "127.0.0.11:3181", addr(3), addr(4), addr(5), addr(6)]
    assert adherence(ensemble, 2, racks, ENFORCED, known) == Adherence.FAIL
    fixed, moved = _fix(ensemble, 2, racks, ENFORCED, known, known)
    assert adherence(fixed, 2, racks, ENFORCED, known) == Adherence.MEETS_STRICT
    assert not {"127.0.0.10:3181", "127.0.0.11:3181"} & set(fixed)
    assert moved == 3  # BookKeeper's expected answer changes three positions too


def test_one_rack_only_has_no_fix() -> None:
    racks = {"a": "/r1", "b": "/r1", "c": "/r1", "d": "/r1"}
    assert best_moves(["a", "b", "c"], 3, RACK, rack_resolver(racks), ["d"]) == []


# ---- ZoneawareEnsemblePlacementPolicyImpl --------------------------------------------------------


def test_zoneaware_is_ensemble_adhering_bookkeeper_example() -> None:
    # testIsEnsembleAdheringToPlacementPolicy (zone-aware): min zones 2, desired 3.
    zone = PlacementRule(policy="zoneaware")
    loc = {
        1: "/zone1/ud1",
        2: "/zone1/ud2",
        3: "/zone1/ud2",
        4: "/zone2/ud1",
        5: "/zone2/ud2",
        6: "/zone2/ud2",
        7: "/zone3/ud1",
        8: "/zone3/ud2",
        9: "/zone3/ud2",
        10: DEFAULT_FAULT_DOMAIN,
    }
    racks = {addr(n): r for n, r in loc.items()}

    def verdict(ns: Sequence[int], wq: int) -> str:
        return adherence([addr(n) for n in ns], wq, racks, zone)

    assert verdict([], 3) == Adherence.FAIL
    assert verdict([1, 2, 3], 3) == Adherence.FAIL  # one zone
    assert verdict([1, 2, 4], 3) == Adherence.MEETS_SOFT  # min zones, not desired
    assert verdict([1, 4, 7], 3) == Adherence.MEETS_STRICT
    assert verdict([1, 4], 2) == Adherence.FAIL  # WQ must exceed minNumZonesPerWriteQuorum
    assert verdict([2, 3, 4], 3) == Adherence.FAIL  # zone1 twice, one upgrade domain
    assert verdict([1, 4, 7, 10], 4) == Adherence.FAIL  # default fault domain
    assert verdict([1, 4, 7, 8, 9], 5) == Adherence.MEETS_STRICT


def test_zoneaware_ensemble_must_be_a_multiple_of_the_write_quorum() -> None:
    zone = PlacementRule(policy="zoneaware")
    racks = {addr(n): f"/zone{n}/ud1" for n in range(1, 5)}
    v = check_ensemble([addr(n) for n in range(1, 5)], 3, zone, rack_resolver(racks))
    assert v.adherence == Adherence.FAIL and "not a multiple" in v.detail


# ---- the audit's findings ------------------------------------------------------------------------


def test_findings_only_for_closed_ledgers_one_per_failing_segment() -> None:
    racks = {"a:1": "/r1", "b:1": "/r1", "c:1": "/r1", "d:1": "/r2"}
    resolve = rack_resolver(racks)
    md = metadata(7, [(0, ["a:1", "b:1", "c:1"]), (10, ["a:1", "d:1", "c:1"])], wq=3, aq=2, last=19)
    checked, found = placement_findings(LedgerView.from_metadata(md), RACK, resolve)
    assert checked == 2
    assert [(f.segment_first_entry_id, f.reason) for f in found] == [
        (0, Reason.PLACEMENT_VIOLATION)
    ]
    f = found[0]
    assert f.bookie_id in {"a:1", "b:1", "c:1"} and f.expected_entries == 10
    assert f.severity is None and "write sets" in (f.error or "")
    open_md = metadata(8, [(0, ["a:1", "b:1", "c:1"])], wq=3, aq=2, last=None)
    assert placement_findings(LedgerView.from_metadata(open_md), RACK, resolve) == (0, [])


def test_plain_rereplicate_skips_placement_findings_and_fix_placement_takes_only_them() -> None:
    rows = [
        {"ledger_id": 1, "segment_first_entry_id": 0, "bookie_id": "a", "reason": "BOOKIE_LOST"},
        {
            "ledger_id": 2,
            "segment_first_entry_id": 5,
            "bookie_id": "b",
            "reason": Reason.PLACEMENT_VIOLATION,
        },
    ]
    plain = requests_from_findings(rows)
    assert [r.ledger_id for r in plain] == [1] and not plain[0].placement_segments
    fix = requests_from_findings(rows, fix_placement=True)
    assert [(r.ledger_id, r.placement_segments, r.all_bad) for r in fix] == [
        (2, frozenset({5}), set())
    ]


# ---- Pulsar's isolation groups -------------------------------------------------------------------


def _custom(props: Mapping[str, object], cls: str = ISOLATED_POLICY_CLASS) -> dict[str, bytes]:
    doc = {"policyClass": cls, "properties": props}
    return {ENSEMBLE_PLACEMENT_POLICY_CONFIG: json.dumps(doc).encode()}


def test_isolation_groups_from_custom_metadata() -> None:
    assert isolation_groups({}) is None
    g = isolation_groups(
        _custom({"isolationBookieGroups": "g1,g2", "secondaryIsolationBookieGroups": "g3"})
    )
    assert g == IsolationGroups(frozenset({"g1", "g2"}), frozenset({"g3"}))
    with pytest.raises(IsolationPolicyError, match="not JSON"):
        isolation_groups({ENSEMBLE_PLACEMENT_POLICY_CONFIG: b"{nope"})
    with pytest.raises(IsolationPolicyError, match="does not implement"):
        isolation_groups(_custom({}, cls="com.example.MyPolicy"))


def test_isolation_excluded_follows_pulsars_blacklist() -> None:
    doc = {"g1": frozenset({"a", "b", "c"}), "g2": frozenset({"d"}), "g3": frozenset({"e"})}
    writable = ["a", "b", "c", "d", "e", "x"]  # x is in no group
    primary = IsolationGroups(frozenset({"g1"}), frozenset({"g2"}))
    assert isolation_excluded(primary, doc, writable, 3) == {"d", "e", "x"}
    # Primary short of E: the secondary group is allowed too.
    assert isolation_excluded(primary, doc, writable, 4) == {"e", "x"}
    # Still short: ungrouped bookies too, never another group's.
    assert isolation_excluded(primary, doc, writable, 5) == {"e"}
    assert isolation_excluded(IsolationGroups(frozenset({"*"})), doc, writable, 3) == frozenset()
    assert isolation_excluded(None, doc, writable, 3) == frozenset()
    assert isolation_excluded(primary, {}, writable, 3) == frozenset()


# ---- the rack document ---------------------------------------------------------------------------


def test_strict_parse_normalizes_racks_and_keeps_groups() -> None:
    data = json.dumps(
        {
            "default": {"a:1": {"rack": "rack-a", "hostname": "a"}, "b:1": {"rack": "/rack-b"}},
            "iso": {"c:1": {"rack": "  "}, "d:1": {}},
        }
    ).encode()
    doc = parse_racks_strict(data, "/bookies")
    assert doc.racks == {"a:1": "/rack-a", "b:1": "/rack-b"}  # blank rack: no rack
    assert doc.groups == {"default": {"a:1", "b:1"}, "iso": {"c:1", "d:1"}}
    assert parse_racks_strict(b"", "/bookies").racks == {}


@pytest.mark.parametrize(
    "data",
    [b"not json", b"[1, 2]", b'{"g": ["a"]}', b'{"g": {"a:1": "r1"}}', b'{"a:1": "r1"}'],
)
def test_strict_parse_refuses_other_documents_naming_the_znode(data: bytes) -> None:
    with pytest.raises(RacksFormatError, match="/custom/racks"):
        parse_racks_strict(data, "/custom/racks")
    assert isinstance(parse_racks(data), dict)  # the tolerant parse is unchanged


def test_racks_file_flat_yaml_or_pulsar_json(tmp_path: Path) -> None:
    flat = tmp_path / "racks.yaml"
    flat.write_text("10.0.0.1:3181: rack-a\n10.0.0.2:3181: /rack-b\n")
    assert load_racks_file(flat).racks == {"10.0.0.1:3181": "/rack-a", "10.0.0.2:3181": "/rack-b"}
    pulsar = tmp_path / "racks.json"
    pulsar.write_text(json.dumps({"default": {"10.0.0.1:3181": {"rack": "r1"}}}))
    assert load_racks_file(pulsar).racks == {"10.0.0.1:3181": "/r1"}
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(RacksFormatError, match=str(bad)):
        load_racks_file(bad)
