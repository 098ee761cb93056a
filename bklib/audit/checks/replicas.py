"""``replicas``: each bookie's entry list against the stripes it must hold."""

from __future__ import annotations

from bklib.audit.checks.bookies import BookieCheck
from bklib.states import Check

__all__ = ["ReplicasCheck"]


class ReplicasCheck(BookieCheck):
    """One GET_LIST_OF_ENTRIES_OF_LEDGER per (ledger, bookie), or probe reads where a bookie
    does not list (Java's DbLedgerStorage): the run first learns which bookies list."""

    name = Check.REPLICAS
    summary = "compare bookie entry lists (probe reads where a bookie does not list)"
    asks = (
        "one GET_LIST_OF_ENTRIES_OF_LEDGER per (ledger, bookie); bookies that do not answer it "
        "(Java DbLedgerStorage) are read entry by entry, in v2 batch reads where the bookie "
        "serves them"
    )
    finds = "every missing entry, exactly"
    misses = "a corrupt entry that is still present"
    cost = (
        "one request per (ledger, bookie), or one batch read per run of consecutive entries "
        "the bookie holds"
    )
    learns_capabilities = True
    ask_list = True
