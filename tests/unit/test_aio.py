"""cancel_and_wait: a task whose library swallows one cancellation still ends."""

from __future__ import annotations

import asyncio

from discovery.aio import cancel_and_wait
from tests.support import waited


async def test_a_task_that_swallows_a_cancellation_is_cancelled_again_until_it_ends() -> None:
    swallowed = 0
    swallowing = asyncio.Event()

    async def like_redis_py() -> None:
        # What redis-py has been seen to do: absorb the CancelledError that lands in a
        # command and carry on with the caller's loop.
        nonlocal swallowed
        while True:
            try:
                swallowing.set()
                await asyncio.Event().wait()  # a command waiting for its reply
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed += 1

    task = asyncio.create_task(like_redis_py())
    await waited(swallowing.wait(), "the task running", timeout=5)
    await waited(cancel_and_wait([task], nudge=0.05), "cancel_and_wait", timeout=5)
    assert task.cancelled()
    assert swallowed == 1


async def test_tasks_that_end_at_once_or_already_ended_are_fine() -> None:
    async def nothing() -> None:
        return None

    done = asyncio.create_task(nothing())
    await done
    running = asyncio.create_task(asyncio.Event().wait())  # runs until cancelled
    await waited(cancel_and_wait([done, running]), "cancel_and_wait", timeout=5)
    assert running.cancelled()
    assert not done.cancelled()
