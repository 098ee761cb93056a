"""What each bookie can answer, learnt once per audit run before the check.

Java bookies on DbLedgerStorage never answer GET_LIST_OF_ENTRIES_OF_LEDGER (no reply at all),
and only BookKeeper 4.17+ serves the v2 BATCH_READ. Asking each bookie once, with a short
timeout, on a ledger it holds, lets every check task go straight to the right method: a task
no longer pays a read timeout per bookie to find out (docs/executors.md).

Fail closed: a bookie that cannot be reached at all is "unknown" for both questions (None),
and the check then asks it as if it could list (and learns the answer itself).
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from bklib.audit.model import LedgerView
from bklib.client.pool import BookieClientPool, SyncBookieClient
from bklib.client.transport import ConnectionLostError
from bklib.errors import BKError, BKTimeoutError, NoSuchEntryError, NoSuchLedgerError
from bklib.tls import BookieTlsError

__all__ = ["BookieCapabilities", "ProbeCandidates", "learn_capabilities", "probe_targets"]

log = logging.getLogger(__name__)

DEFAULT_PROBE_TIMEOUT = 2.0
"""Seconds a bookie gets to answer a capability probe (a healthy bookie answers in ms)."""

_ANSWERED = (NoSuchEntryError, NoSuchLedgerError)


@dataclass(frozen=True)
class BookieCapabilities:
    """What one bookie answered: True / False, or None when it could not be asked."""

    bookie_id: str
    list_entries: bool | None
    batch_read: bool | None
    error: str | None = None


@dataclass(frozen=True)
class ProbeCandidates:
    """Per bookie, the lowest id of a readable closed ledger naming it and of any other readable
    ledger naming it: what :func:`probe_targets` picks from. Two halves of a scan merge with
    :meth:`plus` into what one pass over every view gives."""

    closed: dict[str, int]
    other: dict[str, int]

    @classmethod
    def of(cls, ledgers: Iterable[LedgerView]) -> ProbeCandidates:
        """The candidates among ``ledgers``."""
        closed: dict[str, int] = {}
        other: dict[str, int] = {}
        for v in ledgers:
            if not v.ok:
                continue
            into = closed if v.is_closed else other
            for b in v.bookies():
                if v.ledger_id < into.get(b, v.ledger_id + 1):
                    into[b] = v.ledger_id
        return cls(closed, other)

    def plus(self, more: ProbeCandidates) -> ProbeCandidates:
        """Both sets of candidates, the lower id kept for each bookie."""

        def lowest(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
            out = dict(a)
            for k, v in b.items():
                out[k] = min(v, out.get(k, v))
            return out

        return ProbeCandidates(lowest(self.closed, more.closed), lowest(self.other, more.other))

    def targets(self, bookies: Iterable[str]) -> dict[str, int]:
        """For each of ``bookies`` that has a candidate, its ledger (closed ones preferred:
        their entries are there to read)."""
        return {
            b: self.closed.get(b, self.other.get(b, -1))
            for b in set(bookies)
            if b in self.closed or b in self.other
        }


def probe_targets(ledgers: Iterable[LedgerView], bookies: Iterable[str]) -> dict[str, int]:
    """For each of ``bookies``, the lowest id of a readable ledger whose ensembles name it
    (closed ledgers preferred: their entries are there to read)."""
    return ProbeCandidates.of(ledgers).targets(bookies)


def learn_capabilities(
    client: SyncBookieClient,
    targets: Mapping[str, int],
    timeout: float = DEFAULT_PROBE_TIMEOUT,
    *,
    ask_list: bool = True,
) -> dict[str, BookieCapabilities]:
    """Ask every bookie of ``targets`` (bookie -> a ledger it holds), all at once: can it
    list a ledger's entries (unless ``ask_list`` is False: a check that reads entries anyway
    need not pay the timeout), and does it serve a v2 batch read? A timeout or a closed
    connection on a bookie that answered the other question means "no"."""

    def ask(bookie: str, coro: Any) -> concurrent.futures.Future[Any]:
        return client.submit(lambda pool: coro(pool, bookie))

    async def list_op(pool: BookieClientPool, bookie: str) -> Any:
        return await pool.list_entries(bookie, targets[bookie], timeout=timeout)

    async def batch_op(pool: BookieClientPool, bookie: str) -> Any:
        return await pool.batch_read(bookie, targets[bookie], 0, 1, 0, timeout=timeout)

    futs = {b: (ask(b, list_op) if ask_list else None, ask(b, batch_op)) for b in sorted(targets)}
    out: dict[str, BookieCapabilities] = {}
    for b, (lf, bf) in futs.items():
        listed, list_err = _outcome(lf, timeout) if lf is not None else (None, None)
        batched, batch_err = _outcome(bf, timeout)
        reachable = listed is not None or batched is not None
        caps = BookieCapabilities(
            b,
            list_entries=listed if reachable else None,
            batch_read=batched if reachable else None,
            error=None if reachable else (list_err or batch_err),
        )
        if not reachable:
            log.warning("bookie %s: capability probe got no answer (%s)", b, caps.error)
        else:
            log.info(
                "bookie %s: list-entries %s, v2 batch read %s",
                b,
                {True: "yes", False: "no", None: "not asked"}[caps.list_entries],
                "yes" if caps.batch_read else "no",
            )
        out[b] = caps
    return out


def _outcome(fut: concurrent.futures.Future[Any], timeout: float) -> tuple[bool | None, str | None]:
    """True: answered (a NoSuchEntry is an answer); False: timed out or the bookie closed the
    connection on this request; None: could not connect."""
    try:
        fut.result(timeout + 5.0)
        return True, None
    except _ANSWERED:
        return True, None
    except BKTimeoutError as exc:
        return False, str(exc)
    except concurrent.futures.TimeoutError:
        fut.cancel()
        return False, "no answer"
    except BKError as exc:
        # A bookie that refuses the request closes the connection (a 4.16 bookie on
        # BATCH_READ); one we never reached looks the same here, so the caller compares the
        # two questions' outcomes.
        # A TLS failure (BookieTlsError) is not a refusal of this request either.
        refused = isinstance(exc, ConnectionLostError) and not isinstance(exc, BookieTlsError)
        return (False if refused else None), str(exc)
    except OSError as exc:
        return None, str(exc)
