"""Run one search on the event loop in bounded slices, and stop it at its deadline.

Between slices of about half a millisecond :func:`run_search` hands the GIL over and
yields to the loop; at the deadline it stops with the best hits so far, marked cut.
:func:`work_deadline` keeps a margin of the budget for the answer. Nothing raises.

Design: docs/design/data-server.md, "Searching in slices".
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from .index import Hit, IncrementalSearch

__all__ = [
    "MARGIN_SHARE",
    "MIN_MARGIN",
    "SLICE_WORK",
    "SearchOutcome",
    "run_search",
    "work_deadline",
]

#: Work units of one slice: about 0.5 ms of CPython on the machine the benchmarks ran on
#: (a unit is about one posting read, 0.25 us); see bench/bench_worst_case.py for the
#: longest slice measured.
SLICE_WORK: Final = 2048
#: Share of a request's budget kept back for encoding, sending and merging its answer.
MARGIN_SHARE: Final = 0.1
#: The least margin, in seconds.
MIN_MARGIN: Final = 0.005


def work_deadline(arrived: float, budget_ms: int) -> float:
    """When a search that arrived at ``arrived`` (seconds, the loop's clock) with a
    budget of ``budget_ms`` must stop working: the budget less its margin (see the
    module doc)."""
    budget = budget_ms / 1000
    margin = min(budget / 2, max(MIN_MARGIN, MARGIN_SHARE * budget))
    return arrived + budget - margin


@dataclass(frozen=True, slots=True)
class SearchOutcome:
    """What :func:`run_search` found: the ``hits`` (the top k, or the best found so far
    when ``cut``), how many slices it took and the longest of them, in seconds."""

    hits: list[Hit]
    cut: bool
    slices: int
    longest_slice: float


async def run_search(
    search: IncrementalSearch,
    deadline: float,
    *,
    slice_work: int = SLICE_WORK,
    clock: Callable[[], float] = time.monotonic,
    on_slice: Callable[[float], None] | None = None,
    hand_over_gil: bool = True,
) -> SearchOutcome:
    """Step ``search`` to its end, yielding to the loop between slices, or stop it once
    ``clock()`` reaches ``deadline`` (checked after each slice and after each yield).

    The first slice always runs (the caller checks the deadline before starting).
    ``on_slice`` is called with each slice's duration (a metric's ``observe``).
    ``hand_over_gil=False`` leaves out the release of the GIL between slices, only to
    measure what it is for (bench/bench_worst_case.py).
    """
    slices = 0
    longest = 0.0
    while True:
        started = clock()
        done = search.step(slice_work)
        ended = clock()
        elapsed = ended - started
        slices += 1
        if elapsed > longest:
            longest = elapsed
        if on_slice is not None:
            on_slice(elapsed)
        if done:
            return SearchOutcome(search.hits(), False, slices, longest)
        if ended >= deadline:
            break
        if hand_over_gil:
            # Hands the GIL to a thread waiting for it (see the module doc), then the
            # loop to what else is ready.
            time.sleep(0)  # noqa: ASYNC251 - a zero sleep, to release the GIL
        await asyncio.sleep(0)
        if clock() >= deadline:
            break
    return SearchOutcome(search.hits(), True, slices, longest)
