"""``sample``: BookKeeper's ``LedgerChecker`` as the Auditor's ``checkAllLedgers`` runs it."""

from __future__ import annotations

from bklib.audit.checks.bookies import BookieCheck
from bklib.states import Check

__all__ = ["SampleCheck"]


class SampleCheck(BookieCheck):
    """The first and last entry of each fragment on each bookie, plus a percentage of it,
    read and digest-verified. Reads single entries, so it learns no capabilities."""

    name = Check.SAMPLE
    summary = (
        "BookKeeper's LedgerChecker (first and last entry of each fragment on each bookie, "
        "plus --verify-percentage)"
    )
    asks = (
        "the first and last entry each bookie holds in each fragment, plus "
        "`--verify-percentage` of the fragment picked at random, read and digest-verified "
        "(BookKeeper's `LedgerChecker`, which the Auditor's `checkAllLedgers` runs)"
    )
    finds = (
        "lost bookies; a missing or corrupt first or last entry; middle entries only if the "
        "sample reaches them"
    )
    misses = "**a deleted middle entry** outside the sample, exactly as Java's check can"
    cost = "2 reads per (fragment, bookie) at 0%"
    samples = True
    verifies_digests = True
