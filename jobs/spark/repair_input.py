"""Pure DataFrame transforms feeding the repair: the columns of the findings that become
requests (:func:`bklib.repair.requests.requests_from_findings` groups them), and the ledgers
naming given bookies (recover, decommission)."""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame
from pyspark.sql import functions as F


def finding_keys(fragments: DataFrame) -> DataFrame:
    """The columns of ``underreplicated_fragments`` that
    :func:`bklib.repair.requests.requests_from_findings` groups into requests."""
    return fragments.select(
        F.col("ledger_id").cast("long").alias("ledger_id"),
        F.col("segment_first_entry_id").cast("long").alias("segment_first_entry_id"),
        "bookie_id",
        "reason",
        "first_detected_at",
    )


def ledgers_with_bookies(ledgers: DataFrame, bookies: Sequence[str]) -> DataFrame:
    """Manual recover: (ledger_id, named) for every readable ledger whose metadata names any
    of ``bookies`` (``named``: every bookie its segments name)."""
    wanted = F.array(*[F.lit(b) for b in bookies])
    named = F.array_distinct(F.flatten(F.transform("segments", lambda s: s["ensemble"])))
    return (
        ledgers.where(F.col("error").isNull())
        .withColumn("named", named)
        .where(F.arrays_overlap("named", wanted))
        .select(F.col("ledger_id").cast("long").alias("ledger_id"), "named")
    )
