"""bench/simloop.py: asyncio's loop on virtual time, which the dispatch benchmark runs the
real fan-out on. Time moves only between iterations, and jumps to the next timer."""

from __future__ import annotations

import asyncio
import time

import pytest

from bench.simloop import SimulationDeadlock, VirtualTimeLoop, run


@pytest.mark.timeout(10)
def test_an_hour_of_sleep_passes_in_virtual_time() -> None:
    # Waiting for real would take the hour: the timeout fails the test long before.
    async def sleep_an_hour() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        await asyncio.sleep(3600)  # ok-sleep: virtual time, the subject of the test
        return start, loop.time()

    start, end = run(sleep_an_hour(), start=100.0)
    assert (start, end) == (100.0, 3700.0)


def test_timers_fire_in_the_order_of_their_times_and_ties_in_the_order_scheduled() -> None:
    fired: list[tuple[str, float]] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        for label, delay in (("c", 0.3), ("a", 0.1), ("b1", 0.2), ("b2", 0.2), ("late", 5.0)):
            loop.call_later(delay, lambda label=label: fired.append((label, loop.time())))
        loop.call_at(5.0, done.set_result, None)
        await done

    run(main())
    assert fired == [("a", 0.1), ("b1", 0.2), ("b2", 0.2), ("c", 0.3), ("late", 5.0)]


def test_tasks_interleave_at_their_own_times() -> None:
    steps: list[tuple[str, int, float]] = []

    async def worker(name: str, period: float) -> None:
        loop = asyncio.get_running_loop()
        for step in range(3):
            steps.append((name, step, loop.time()))
            await asyncio.sleep(period)  # ok-sleep: virtual time

    async def main() -> None:
        await asyncio.gather(worker("slow", 1.0), worker("fast", 0.4))

    run(main())
    assert steps == [
        ("slow", 0, 0.0),
        ("fast", 0, 0.0),
        ("fast", 1, 0.4),
        ("fast", 2, 0.8),
        ("slow", 1, 1.0),
        ("slow", 2, 2.0),
    ]


def test_ready_tasks_take_turns_without_time_passing() -> None:
    turns: list[tuple[str, float]] = []

    async def yielder(name: str) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(2):
            turns.append((name, loop.time()))
            await asyncio.sleep(0)  # ok-sleep: one loop turn, no time passes

    async def main() -> None:
        await asyncio.gather(yielder("a"), yielder("b"))

    run(main(), start=7.0)
    assert turns == [("a", 7.0), ("b", 7.0), ("a", 7.0), ("b", 7.0)]


def test_time_stands_still_while_a_callback_works() -> None:
    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        before = loop.time()
        deadline = time.perf_counter() + 0.01
        while time.perf_counter() < deadline:  # real work, no await
            pass
        return before, loop.time()

    before, after = run(main())
    assert before == after == 0.0


def test_a_timeout_expires_at_its_virtual_deadline() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        never: asyncio.Future[None] = loop.create_future()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(1.5):
                await never
        return loop.time()

    assert run(main()) == 1.5


def test_a_task_waiting_for_nothing_scheduled_is_a_deadlock() -> None:
    async def main() -> None:
        await asyncio.get_running_loop().create_future()

    with pytest.raises(SimulationDeadlock, match="nothing is ready"):
        run(main())


def test_the_loop_is_a_loop_of_its_own_and_closes() -> None:
    loop = VirtualTimeLoop(start=2.0)
    try:
        # ok-sleep: virtual time
        assert loop.run_until_complete(asyncio.sleep(3, result="slept")) == "slept"
        assert loop.time() == 5.0
    finally:
        loop.close()
    assert loop.is_closed()
