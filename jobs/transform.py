"""Pure transforms of the audit: expected stripes, replica comparison, classification.

Every public function here takes DataFrames and returns a DataFrame; nothing talks to
ZooKeeper or bookies (that is :mod:`jobs.extract`) or writes tables (:mod:`jobs.load`).

Never one row per entry per replica. A segment's entries on the bookie at ensemble index
``i`` form a stripe, the residues ``{i - WQ + 1 .. i} mod E`` (spec §1.1). What a bookie holds
arrives as runs of entry ids. Per (ledger, segment, bookie) the missing entries are the gaps
of the runs trimmed to the stripe, counted with residue arithmetic (:mod:`bklib.quorum`,
:mod:`bklib.availability`). The fewest replicas of any entry comes from a sweep over the
gap boundaries of the segment's bookies: between two boundaries the set of bookies missing
the entries is constant, and only the (at most E) residues present there need counting.
Cost grows with ledgers, segments and gaps, not with entries.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from bklib.availability import EntryRuns
from bklib.quorum import classify_replicas, stripe_count, stripe_first_last

# ---- vocabulary -----------------------------------------------------------------------------

BOOKIE_LOST = "BOOKIE_LOST"
ENTRIES_MISSING = "ENTRIES_MISSING"
BOOKIE_UNREACHABLE = "BOOKIE_UNREACHABLE"
DIGEST_MISMATCH = "DIGEST_MISMATCH"
REASONS = (BOOKIE_LOST, ENTRIES_MISSING, BOOKIE_UNREACHABLE, DIGEST_MISMATCH)

# bookie_entries.status
STATUS_OK = "OK"
STATUS_NO_LEDGER = "NO_LEDGER"
STATUS_UNREACHABLE = "UNREACHABLE"

# bookies.state
WRITABLE = "writable"
READONLY = "readonly"
LOST = "lost"

CHECK_LOST = "lost"
CHECK_REPLICAS = "replicas"
CHECK_DEEP = "deep"
CHECKS = (CHECK_LOST, CHECK_REPLICAS, CHECK_DEEP)

MAX_RANGES_PER_ROW = 100
"""Missing ranges listed per fragment row; the count is always complete."""

# ---- schemas --------------------------------------------------------------------------------

RUN = T.StructType(
    [
        T.StructField("first_entry_id", T.LongType(), False),
        T.StructField("last_entry_id", T.LongType(), False),
    ]
)
RUNS = T.ArrayType(RUN, False)

SEGMENT = T.StructType(
    [
        T.StructField("first_entry_id", T.LongType(), False),
        # None for the last segment of a ledger that is not closed: it ends at the LAC,
        # which the metadata does not hold.
        T.StructField("last_entry_id", T.LongType(), True),
        T.StructField("ensemble", T.ArrayType(T.StringType(), False), False),
    ]
)

LEDGER_SCHEMA = T.StructType(
    [
        T.StructField("ledger_id", T.LongType(), False),
        T.StructField("znode_path", T.StringType(), True),
        T.StructField("znode_version", T.IntegerType(), True),
        T.StructField("state", T.StringType(), True),
        T.StructField("ensemble_size", T.IntegerType(), True),
        T.StructField("write_quorum", T.IntegerType(), True),
        T.StructField("ack_quorum", T.IntegerType(), True),
        T.StructField("last_entry_id", T.LongType(), True),
        T.StructField("length", T.LongType(), True),
        T.StructField("digest_type", T.StringType(), True),
        # Needed to verify HMAC digests in the deep check; never written to a table.
        T.StructField("password", T.BinaryType(), True),
        T.StructField("ctime", T.LongType(), True),
        T.StructField("segments", T.ArrayType(SEGMENT, False), True),
        # A znode that could not be read or parsed: the error, naming the znode.
        T.StructField("error", T.StringType(), True),
    ]
)
"""One row per ledger znode, as :func:`jobs.extract.scan_ledgers_df` produces it."""

BOOKIE_SCHEMA = T.StructType(
    [
        T.StructField("bookie_id", T.StringType(), False),
        T.StructField("state", T.StringType(), False),
        T.StructField("host", T.StringType(), True),
        T.StructField("port", T.IntegerType(), True),
        T.StructField("error", T.StringType(), True),
    ]
)

BOOKIE_ENTRIES_SCHEMA = T.StructType(
    [
        T.StructField("ledger_id", T.LongType(), False),
        T.StructField("bookie_id", T.StringType(), False),
        T.StructField("status", T.StringType(), False),
        # LIST (list-entries RPC), PROBE (reads, the bookie does not list) or READ (deep).
        T.StructField("method", T.StringType(), True),
        # Entry ids the bookie holds, as sorted, merged runs.
        T.StructField("entries", RUNS, True),
        # Held but failing digest verification (deep check); a subset of ``entries``.
        T.StructField("bad_entries", RUNS, True),
        # Ids whose read failed with a timeout or error: neither held nor missing.
        T.StructField("unknown_entries", RUNS, True),
        # The bookie's LAC for a ledger that is not closed (max of explicit and piggybacked).
        T.StructField("lac", T.LongType(), True),
        T.StructField("error", T.StringType(), True),
    ]
)
"""What one bookie holds of one ledger, as :func:`jobs.extract.fetch_bookie_entries` yields."""

FRAGMENT_SCHEMA = T.StructType(
    [
        T.StructField("ledger_id", T.LongType(), False),
        T.StructField("segment_index", T.IntegerType(), False),
        T.StructField("segment_first_entry_id", T.LongType(), False),
        # None when unknown: the open last segment in a metadata-only check.
        T.StructField("segment_last_entry_id", T.LongType(), True),
        T.StructField("bookie_index", T.IntegerType(), False),
        T.StructField("bookie_id", T.StringType(), False),
        T.StructField("reason", T.StringType(), False),
        T.StructField("expected_entries", T.LongType(), True),
        T.StructField("missing_entries", T.LongType(), True),
        T.StructField("missing_ranges", RUNS, True),
        T.StructField("missing_ranges_truncated", T.BooleanType(), True),
        T.StructField("unknown_entries", T.LongType(), True),
        T.StructField("min_replicas", T.IntegerType(), True),
        T.StructField("severity", T.StringType(), True),
        T.StructField("ledger_state", T.StringType(), True),
        T.StructField("ensemble_size", T.IntegerType(), True),
        T.StructField("write_quorum", T.IntegerType(), True),
        T.StructField("ack_quorum", T.IntegerType(), True),
        T.StructField("error", T.StringType(), True),
    ]
)
"""One under-replicated fragment: a (ledger, segment, bookie) and why."""

_FRAGMENT_ARROW = to_arrow_schema(FRAGMENT_SCHEMA)

# ---- pure-Python core (runs on the executors) ---------------------------------------------


def _runs(value: Sequence[dict[str, int]] | None) -> list[tuple[int, int]]:
    return [(r["first_entry_id"], r["last_entry_id"]) for r in value or ()]


def _gap_ranges(
    held: list[tuple[int, int]], idx: int, first: int, last: int, e: int, wq: int
) -> list[tuple[int, int]]:
    """Ranges of ``[first, last]`` with none of ``held``, trimmed to index ``idx``'s stripe
    (each range starts and ends on a missing stripe entry; ranges with none are dropped)."""
    out: list[tuple[int, int]] = []
    cur = first
    for s, t in held:  # sorted and merged
        if t < cur:
            continue
        if s > last:
            break
        if s > cur:
            fl = stripe_first_last(idx, cur, s - 1, e, wq)
            if fl is not None:
                out.append(fl)
        cur = t + 1
        if cur > last:
            return out
    if cur <= last:
        fl = stripe_first_last(idx, cur, last, e, wq)
        if fl is not None:
            out.append(fl)
    return out


def _clip_to_stripe(
    runs: list[tuple[int, int]], idx: int, first: int, last: int, e: int, wq: int
) -> list[tuple[int, int]]:
    out = []
    for s, t in runs:
        a, b = max(s, first), min(t, last)
        if a <= b:
            fl = stripe_first_last(idx, a, b, e, wq)
            if fl is not None:
                out.append(fl)
    return out


def _covers(rep: dict[str, Any], first: int, last: int) -> bool:
    """True if one held run spans ``[first, last]`` and no entry is bad or unknown."""
    if rep["bad_entries"] or rep["unknown_entries"]:
        return False
    for r in rep["entries"] or ():
        if r["first_entry_id"] <= first:
            if r["last_entry_id"] >= last:
                return True
        else:
            return False
    return False


def _count(ranges: Iterable[tuple[int, int]], idx: int, e: int, wq: int) -> int:
    return sum(stripe_count(idx, a, b, e, wq) for a, b in ranges)


def _worst_missing(
    absent: dict[int, list[tuple[int, int]]], e: int, wq: int
) -> tuple[dict[int, int], int]:
    """For each index, the largest number of bookies missing one of the entries it misses
    (its own included), and that largest number over the whole segment.

    ``absent[i]`` are sorted, disjoint ranges where index ``i`` lacks its stripe entries.
    Entry ``x`` counts towards index ``i`` only if ``i`` is in x's write set, i.e.
    ``(i - x) % E < WQ``, so the ranges need not be exact to the stripe.
    """
    points = sorted({p for rs in absent.values() for a, b in rs for p in (a, b + 1)})
    worst = dict.fromkeys(absent, 0)
    seg_worst = 0
    ptr = dict.fromkeys(absent, 0)
    for k in range(len(points) - 1):
        p, q = points[k], points[k + 1] - 1
        group = []
        for i, rs in absent.items():
            j = ptr[i]
            while j < len(rs) and rs[j][1] < p:
                j += 1
            ptr[i] = j
            if j < len(rs) and rs[j][0] <= p:
                group.append(i)
        if not group:
            continue
        residues = range(e) if q - p + 1 >= e else {x % e for x in range(p, q + 1)}
        for r in residues:
            hit = [i for i in group if (i - r) % e < wq]
            c = len(hit)
            if c == 0:
                continue
            seg_worst = max(seg_worst, c)
            for i in hit:
                if c > worst[i]:
                    worst[i] = c
    return worst, seg_worst


def _worst_on_ring(lost: set[int], e: int, wq: int) -> dict[int, int]:
    """Per lost index, the most lost bookies in any write set holding it (all residues):
    how a segment whose entries are unknown or absent is classified."""
    out = {}
    for i in lost:
        best = 0
        for r in range(e):
            if (i - r) % e < wq:
                best = max(best, sum(1 for w in range(wq) if (r + w) % e in lost))
        out[i] = best
    return out


def classify_ledger(
    ledger: dict[str, Any],
    lost_bookies: frozenset[str] | set[str],
    replicas: dict[str, dict[str, Any]] | None,
    lac: int | None = None,
    max_ranges: int = MAX_RANGES_PER_ROW,
) -> list[dict[str, Any]]:
    """The fragment rows of one ledger (FRAGMENT_SCHEMA as dicts); empty when healthy.

    ``ledger`` is a LEDGER_SCHEMA row as a dict. ``replicas`` maps bookie id to its
    BOOKIE_ENTRIES_SCHEMA row, or is None for a metadata-only check, where only lost bookies
    are findings. ``lac`` bounds the last segment of a ledger that is not closed (None:
    unknown, so nothing there is counted missing).
    """
    e, wq, aq = ledger["ensemble_size"], ledger["write_quorum"], ledger["ack_quorum"]
    state = ledger["state"]
    segments = ledger["segments"] or []
    rows: list[dict[str, Any]] = []
    if replicas is None and not any(b in lost_bookies for s in segments for b in s["ensemble"]):
        return rows  # the common case of the metadata-only check, kept cheap
    for si, seg in enumerate(segments):
        first = seg["first_entry_id"]
        last = seg["last_entry_id"]
        if last is None and replicas is not None:
            last = lac  # open/in-recovery ledger: checked up to its LAC
        known = last is not None
        nonempty = known and last >= first
        ens = seg["ensemble"]
        absent: dict[int, list[tuple[int, int]]] = {}
        findings: list[tuple[int, str, dict[str, Any]]] = []
        lost_idx: set[int] = set()
        for i, bookie in enumerate(ens):
            rep = replicas.get(bookie) if replicas is not None else None
            if (
                nonempty
                and rep is not None
                and rep["status"] == STATUS_OK
                and bookie not in lost_bookies
                and _covers(rep, first, last)
            ):
                continue  # the common case: one run spanning the segment, nothing to count
            expected = stripe_count(i, first, last, e, wq) if known else None
            base = {"expected_entries": expected, "bookie": bookie}
            if bookie in lost_bookies:
                lost_idx.add(i)
                if nonempty:
                    absent[i] = [(first, last)]
                findings.append(
                    (i, BOOKIE_LOST, {**base, "missing": expected, "error": "not registered"})
                )
                continue
            if replicas is None or not nonempty or not expected:
                continue
            if rep is None or rep["status"] == STATUS_UNREACHABLE:
                err = rep["error"] if rep is not None else "no answer recorded"
                findings.append(
                    (i, BOOKIE_UNREACHABLE, {**base, "unknown": expected, "error": err})
                )
                continue
            if rep["status"] == STATUS_NO_LEDGER:
                gaps = _gap_ranges([], i, first, last, e, wq)
                absent[i] = gaps
                findings.append(
                    (
                        i,
                        ENTRIES_MISSING,
                        {**base, "missing": expected, "ranges": gaps, "error": rep["error"]},
                    )
                )
                continue
            held = _runs(rep["entries"])
            unknown = _clip_to_stripe(_runs(rep["unknown_entries"]), i, first, last, e, wq)
            if unknown:  # unknown ids are neither held nor missing
                held = list(EntryRuns([*held, *_runs(rep["unknown_entries"])]).runs())
            gaps = _gap_ranges(held, i, first, last, e, wq)
            bad = _clip_to_stripe(_runs(rep["bad_entries"]), i, first, last, e, wq)
            if gaps or bad:
                absent[i] = sorted(EntryRuns([*gaps, *bad]).runs()) if bad else gaps
            if gaps:
                n = _count(gaps, i, e, wq)
                findings.append((i, ENTRIES_MISSING, {**base, "missing": n, "ranges": gaps}))
            if bad:
                n = _count(bad, i, e, wq)
                findings.append((i, DIGEST_MISMATCH, {**base, "missing": n, "ranges": bad}))
            if unknown:
                n = _count(unknown, i, e, wq)
                findings.append(
                    (i, BOOKIE_UNREACHABLE, {**base, "unknown": n, "error": rep["error"]})
                )
        if not findings:
            continue
        worst, _ = _worst_missing(absent, e, wq) if absent else ({}, 0)
        ring = _worst_on_ring(lost_idx, e, wq) if lost_idx else {}
        for i, reason, f in findings:
            if reason == BOOKIE_UNREACHABLE:
                min_rep = None
            elif reason == BOOKIE_LOST and not nonempty:
                # Nothing stored, or the end is unknown: classify as if every residue held
                # entries, since the metadata names a dead bookie either way.
                min_rep = wq - ring[i]
            else:
                min_rep = wq - worst.get(i, 0)
            ranges = f.get("ranges")
            rows.append(
                {
                    "ledger_id": ledger["ledger_id"],
                    "segment_index": si,
                    "segment_first_entry_id": first,
                    "segment_last_entry_id": last,
                    "bookie_index": i,
                    "bookie_id": f["bookie"],
                    "reason": reason,
                    "expected_entries": f["expected_entries"],
                    "missing_entries": f.get("missing"),
                    "missing_ranges": (
                        [{"first_entry_id": a, "last_entry_id": b} for a, b in ranges[:max_ranges]]
                        if ranges is not None
                        else None
                    ),
                    "missing_ranges_truncated": (
                        len(ranges) > max_ranges if ranges is not None else None
                    ),
                    "unknown_entries": f.get("unknown"),
                    "min_replicas": min_rep,
                    "severity": (
                        classify_replicas(min_rep, wq, aq) if min_rep is not None else None
                    ),
                    "ledger_state": state,
                    "ensemble_size": e,
                    "write_quorum": wq,
                    "ack_quorum": aq,
                    "error": f.get("error"),
                }
            )
    return rows


# ---- DataFrame transforms -------------------------------------------------------------------


def healthy_ledgers(ledgers: DataFrame) -> DataFrame:
    """Ledgers whose metadata was read and parsed."""
    return ledgers.filter(F.col("error").isNull())


def metadata_errors(ledgers: DataFrame) -> DataFrame:
    """Znodes that could not be read or parsed: ledger_id, znode_path, error."""
    return ledgers.filter(F.col("error").isNotNull()).select("ledger_id", "znode_path", "error")


def expected_stripes(ledgers: DataFrame, lac: DataFrame | None = None) -> DataFrame:
    """One row per (ledger, segment, ensemble index): the stripe that bookie must hold.

    Columns: ledger_id, ledger_state, ensemble_size, write_quorum, ack_quorum,
    segment_index, segment_first_entry_id, segment_last_entry_id (the LAC bounds an open
    last segment when ``lac`` (ledger_id, lac) is given, else unknown = null),
    bookie_index, bookie_id, expected_entries (null when the end is unknown), and
    stripe_first_entry_id / stripe_last_entry_id (null when the stripe is empty).
    Pure column arithmetic: per residue ``r`` of the stripe, the count of ids in
    ``[first, last]`` congruent to r is ``floor((last - r) / E) - floor((first - 1 - r) / E)``.
    """
    df = healthy_ledgers(ledgers)
    if lac is not None:
        df = df.join(lac.select("ledger_id", "lac"), "ledger_id", "left")
    else:
        df = df.withColumn("lac", F.lit(None).cast("long"))
    seg = df.select(
        "ledger_id",
        F.col("state").alias("ledger_state"),
        "ensemble_size",
        "write_quorum",
        "ack_quorum",
        "lac",
        F.posexplode("segments").alias("segment_index", "segment"),
    )
    seg = seg.select(
        "*",
        F.col("segment.first_entry_id").alias("segment_first_entry_id"),
        F.coalesce(F.col("segment.last_entry_id"), F.col("lac")).alias("segment_last_entry_id"),
        F.posexplode("segment.ensemble").alias("bookie_index", "bookie_id"),
    ).drop("segment", "lac")
    e = F.col("ensemble_size").cast("long")
    first = F.col("segment_first_entry_id")
    last = F.col("segment_last_entry_id")

    def per_residue(k: Any) -> Any:
        r = F.pmod(F.col("bookie_index") - k, e)
        return F.greatest(
            F.lit(0).cast("long"),
            F.floor((last - r) / e) - F.floor((first - 1 - r) / e),
        )

    count = F.aggregate(
        F.sequence(F.lit(0), F.col("write_quorum") - 1),
        F.lit(0).cast("long"),
        lambda acc, k: acc + per_residue(k),
    )
    # First stripe entry at or after `first`: min over residues of first + (r - first) mod E.
    lo = F.array_min(
        F.transform(
            F.sequence(F.lit(0), F.col("write_quorum") - 1),
            lambda k: first + F.pmod(F.pmod(F.col("bookie_index") - k, e) - first, e),
        )
    )
    hi = F.array_max(
        F.transform(
            F.sequence(F.lit(0), F.col("write_quorum") - 1),
            lambda k: last - F.pmod(last - F.pmod(F.col("bookie_index") - k, e), e),
        )
    )
    nonempty = last.isNotNull() & (last >= first) & (count > 0)
    return seg.select(
        "*",
        F.when(last.isNull(), F.lit(None).cast("long"))
        .when(last < first, F.lit(0).cast("long"))
        .otherwise(count)
        .alias("expected_entries"),
        F.when(nonempty, lo).alias("stripe_first_entry_id"),
        F.when(nonempty, hi).alias("stripe_last_entry_id"),
    )


def ledger_lac(bookie_entries: DataFrame) -> DataFrame:
    """(ledger_id, lac): the highest LAC any bookie reported, as a LAC read takes the max."""
    return (
        bookie_entries.filter(F.col("lac").isNotNull())
        .groupBy("ledger_id")
        .agg(F.max("lac").alias("lac"))
    )


def lost_bookie_ids(bookies: DataFrame) -> frozenset[str]:
    """The ids of lost bookies (a small driver-side set; the bookie list is tiny)."""
    return frozenset(r.bookie_id for r in bookies.filter(F.col("state") == LOST).collect())


def find_underreplicated(
    ledgers: DataFrame,
    bookies: DataFrame,
    bookie_entries: DataFrame | None = None,
) -> DataFrame:
    """Every under-replicated fragment (FRAGMENT_SCHEMA).

    With ``bookie_entries`` None this is the metadata-only ``lost`` check: every segment that
    names a lost bookie. Otherwise each bookie's entry list per ledger is compared with the
    stripes it must hold: closed ledgers up to lastEntryId, others up to the LAC the bookies
    reported; entries beyond are ignored and empty ledgers or segments expect nothing. An
    unreachable bookie, or an id whose read failed, yields BOOKIE_UNREACHABLE, never missing.
    """
    lost = lost_bookie_ids(bookies)
    df = healthy_ledgers(ledgers).drop("password")
    with_replicas = bookie_entries is not None
    if bookie_entries is not None:
        grouped = bookie_entries.groupBy("ledger_id").agg(
            F.max("lac").alias("lac"),
            F.collect_list(
                F.struct(
                    "bookie_id", "status", "entries", "bad_entries", "unknown_entries", "error"
                )
            ).alias("replicas"),
        )
        df = df.join(grouped, "ledger_id", "left")

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            out: list[dict[str, Any]] = []
            for row in batch.to_pylist():
                replicas = None
                lac = None
                if with_replicas:
                    replicas = {r["bookie_id"]: r for r in row["replicas"] or ()}
                    lac = row["lac"]
                out.extend(classify_ledger(row, lost, replicas, lac))
            if out:
                yield pa.RecordBatch.from_pylist(out, schema=_FRAGMENT_ARROW)

    return df.mapInArrow(run, FRAGMENT_SCHEMA)


def keep_still_current(fragments: DataFrame, current: DataFrame) -> DataFrame:
    """Drop findings whose ledger changed or vanished after it was scanned.

    ``current`` comes from re-reading the flagged ledgers: (ledger_id, first_entry_id,
    bookie_id, error). A fragment stays if its ledger still exists and its segment still
    names the bookie (a re-replicated or deleted ledger is not a false alarm), or if the
    re-read failed (an error is no evidence the problem went away).
    """
    seg = current.filter(F.col("error").isNull()).select(
        "ledger_id",
        F.col("first_entry_id").alias("segment_first_entry_id"),
        "bookie_id",
    )
    failed = current.filter(F.col("error").isNotNull()).select("ledger_id").distinct()
    keep = fragments.join(
        seg.distinct(), ["ledger_id", "segment_first_entry_id", "bookie_id"], "left_semi"
    )
    keep_failed = fragments.join(failed, "ledger_id", "left_semi")
    return keep.unionByName(keep_failed).distinct()


def flagged_ledger_ids(fragments: DataFrame) -> DataFrame:
    """Distinct ledger ids with at least one finding."""
    return fragments.select("ledger_id").distinct()


def carry_first_detected(
    fragments: DataFrame, previous: DataFrame | None, detected_at: Any
) -> DataFrame:
    """Add ``first_detected_at``: from the previous run's row for the same (ledger, segment,
    bookie) when there is one, else ``detected_at`` (this run's start)."""
    now = F.lit(detected_at).cast("timestamp")
    if previous is None:
        return fragments.withColumn("first_detected_at", now)
    prev = previous.groupBy("ledger_id", "segment_first_entry_id", "bookie_id").agg(
        F.min("first_detected_at").alias("_prev_first")
    )
    return (
        fragments.join(prev, ["ledger_id", "segment_first_entry_id", "bookie_id"], "left")
        .withColumn("first_detected_at", F.coalesce(F.col("_prev_first"), now))
        .drop("_prev_first")
    )


def summarize(fragments: DataFrame) -> dict[str, int]:
    """Counts for the run record: fragments per reason, per severity, ledgers, entries."""
    agg = fragments.agg(
        F.count(F.lit(1)).alias("fragments"),
        F.countDistinct("ledger_id").alias("underreplicated_ledgers"),
        F.coalesce(
            F.sum(F.when(F.col("reason") != BOOKIE_UNREACHABLE, F.col("missing_entries"))),
            F.lit(0),
        ).alias("missing_entries"),
    ).first()
    counts = {k: int(agg[k] or 0) for k in ("fragments", "underreplicated_ledgers")}
    counts["missing_entries"] = int(agg["missing_entries"] or 0)
    for r in fragments.groupBy("reason").count().collect():
        counts[f"reason_{r['reason']}"] = int(r["count"])
    for r in fragments.filter(F.col("severity").isNotNull()).groupBy("severity").count().collect():
        counts[f"severity_{r['severity']}"] = int(r["count"])
    return counts
