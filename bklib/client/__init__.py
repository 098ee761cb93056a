"""BookKeeper client: bookie connections, and ledger writer / reader / recovery on top of them.

Ledger operations are asyncio coroutines taking a :class:`ClientContext` (metadata store +
bookie pool + placement policy); ``*_blocking`` helpers run them on a
:class:`~bklib.client.pool.SyncBookieClient`'s loop for threads and Spark tasks.
"""

from bklib.client.placement import PlacementPolicy, writable_bookies
from bklib.client.reader import (
    ClientContext,
    LedgerEntry,
    LedgerReader,
    read_entries_blocking,
)
from bklib.client.recovery import (
    LedgerRecovery,
    open_ledger_with_recovery,
    recover_ledger,
    recover_ledger_blocking,
)
from bklib.client.writer import LedgerWriter

__all__ = [
    "ClientContext",
    "LedgerEntry",
    "LedgerReader",
    "LedgerRecovery",
    "LedgerWriter",
    "PlacementPolicy",
    "open_ledger_with_recovery",
    "read_entries_blocking",
    "recover_ledger",
    "recover_ledger_blocking",
    "writable_bookies",
]
