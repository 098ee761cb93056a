"""bklib.cancellation: a task waiting for cancelled children is still cancellable itself."""

from __future__ import annotations

import asyncio

import pytest

from bklib.cancellation import cancel_and_wait, wait_unwound


def test_cancelling_a_task_awaiting_cancelled_children_still_cancels_it() -> None:
    async def main() -> None:
        release = asyncio.Event()

        async def slow_to_unwind() -> None:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                await release.wait()
                raise

        child = asyncio.create_task(slow_to_unwind())
        await asyncio.sleep(0)

        async def parent() -> str:
            await cancel_and_wait([child])
            return "ran on after its own cancellation"

        p = asyncio.create_task(parent())
        await asyncio.sleep(0.01)
        p.cancel()  # while it waits for the child
        await asyncio.sleep(0.01)
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await p
        await asyncio.sleep(0)
        assert child.cancelled()

    asyncio.run(main())


def test_children_failures_are_collected_and_the_caller_is_skipped() -> None:
    async def main() -> None:
        async def fails() -> None:
            raise RuntimeError("boom")

        t = asyncio.create_task(fails())
        await asyncio.sleep(0)
        me = asyncio.current_task()
        assert me is not None
        await wait_unwound([t, me])  # neither raises nor waits for itself
        assert isinstance(t.exception(), RuntimeError)

    asyncio.run(main())
