"""Cancelling child tasks without swallowing our own cancellation.

``with suppress(BaseException): await child`` after ``child.cancel()`` also swallows the
``CancelledError`` thrown into the *awaiting* task when it is cancelled itself meanwhile: that
task then runs on as if never cancelled. Gathering the children with ``return_exceptions=True``
collects their outcomes, while a cancellation of the awaiting task still propagates.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

__all__ = ["cancel_and_wait", "wait_unwound"]


async def wait_unwound(tasks: Iterable[asyncio.Future[Any]]) -> None:
    """Wait until each of ``tasks`` has finished, whatever it raised. The calling task, if
    among them, is skipped (it cannot wait for itself). Raises ``CancelledError`` only when
    the calling task itself is cancelled while waiting."""
    me = asyncio.current_task()
    children = [t for t in tasks if t is not me]
    if children:
        await asyncio.gather(*children, return_exceptions=True)


async def cancel_and_wait(tasks: Iterable[asyncio.Future[Any]]) -> None:
    """Cancel ``tasks`` (all but the calling task) and :func:`wait_unwound` for them."""
    me = asyncio.current_task()
    children = [t for t in tasks if t is not me]
    for t in children:
        t.cancel()
    await wait_unwound(children)
