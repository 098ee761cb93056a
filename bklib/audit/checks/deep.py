"""``deep``: every expected replica read and its digest verified."""

from __future__ import annotations

from bklib.audit.checks.bookies import BookieCheck
from bklib.states import Check

__all__ = ["DeepCheck"]


class DeepCheck(BookieCheck):
    """Every entry each bookie must hold, read and digest-verified: the run first learns
    which bookies serve batch reads."""

    name = Check.DEEP
    summary = "read every replica and verify its digest"
    asks = "every entry each bookie must hold, read and digest-verified (batch reads where served)"
    finds = "every missing or corrupt entry"
    misses = "nothing"
    cost = "every replica of every entry is read"
    learns_capabilities = True
    verifies_digests = True
