"""Where the outcome of a request to a bookie lands: :class:`Pending` (a request awaiting its
reply), :class:`Outcome` (an asyncio future or a :class:`RequestGroup` slot) and
:class:`RequestExpired` (its deadline passed). The deadline timer and the reply matching are
:mod:`bklib.client.transport`'s and the protocols'."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["Outcome", "Pending", "RequestExpired", "RequestGroup"]


class Outcome(Protocol):
    """Where a request's reply, deadline or failure lands: an asyncio future, or one
    :class:`RequestGroup` slot. The first outcome set is the one kept."""

    def done(self) -> bool: ...

    def set_result(self, result: Any, /) -> None: ...

    def set_exception(self, exception: type | BaseException, /) -> None: ...


@dataclass
class Pending:
    """One request awaiting its reply: where its outcome goes, and the ledger and entry every
    error about it names. Protocols subclass it to remember what the reply must match."""

    future: Outcome
    ledger_id: int | None
    entry_id: int | None


_UNSET: Any = object()
_ABANDONED: Any = object()


class RequestGroup:
    """The outcomes of several requests sent together, awaited as one future.

    A request of its own costs its sender a task, a chain of coroutines and a future; a probe
    reading a few hundred thousand entries one by one spent most of its CPU there. A group's
    requests are registered, timed and failed one by one, as any request is (each slot is an
    :class:`Outcome`), so a reply, an expired deadline or a lost connection settles exactly
    its own slot; :attr:`future` completes when every slot is settled.
    """

    __slots__ = ("future", "left", "outcomes")

    def __init__(self, n: int) -> None:
        self.future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.outcomes: list[Any] = [_UNSET] * n
        self.left = n
        if n == 0:
            self.future.set_result(None)

    def slot(self, index: int) -> _Slot:
        """The :class:`Outcome` of request ``index``."""
        return _Slot(self, index)

    def abandon(self) -> None:
        """Close the slots still open: the sender gave up on them (cancelled, or failed while
        sending), so the deadline queue may drop them at once, as it drops a cancelled
        future."""
        outcomes = self.outcomes
        for i, out in enumerate(outcomes):
            if out is _UNSET:
                outcomes[i] = _ABANDONED
        self.left = 0

    def _settle(self, index: int, outcome: Any) -> None:
        if self.outcomes[index] is not _UNSET:
            return
        self.outcomes[index] = outcome
        self.left -= 1
        if self.left == 0 and not self.future.done():
            self.future.set_result(None)


class _Slot:
    """One request's place in a :class:`RequestGroup`; an exception is stored as its outcome."""

    __slots__ = ("group", "index")

    def __init__(self, group: RequestGroup, index: int) -> None:
        self.group = group
        self.index = index

    def done(self) -> bool:
        return self.group.outcomes[self.index] is not _UNSET

    def set_result(self, result: Any, /) -> None:
        self.group._settle(self.index, result)

    def set_exception(self, exception: type | BaseException, /) -> None:
        self.group._settle(self.index, exception)


class RequestExpired(Exception):
    """A request's deadline passed before its response arrived. Set on the request's future by
    the deadline timer; the sender turns it into BKTimeoutError naming the operation."""
