"""Run one search on the event loop in bounded slices, and stop it at its deadline.

A search of a shard's most frequent terms reads hundreds of thousands of postings.
Run in one piece on the data server's event loop it would hold the loop for as long:
``/healthz``, the agent's own probe (a search over HTTP) and every other search would
wait behind it, and the search would go on long after the search server that asked for
it has given up. So :func:`run_search` drives an :class:`~data_server.index.
IncrementalSearch` a slice of ``slice_work`` units at a time (about half a millisecond
of CPython, see ``SLICE_WORK``), yields to the loop between slices (``asyncio.sleep(0)``:
whatever else is ready runs, and the loop polls its sockets), and stops at the deadline
with the best hits found so far, marked as cut. A search that finishes within its first
slice (every ordinary query) never yields at all.

**The other threads.** The agent probes its server from a thread of its own, over HTTP,
and each step of a request there needs the GIL back. While a search keeps the loop's
thread busy, a thread waiting for the GIL gets it only when the busy one releases it
(at the latest after the interpreter's switch interval, 5 ms): a probe made of some
twenty such steps took 100 ms and more with slices of 2 ms (the agent's limit is
0.5 s, 0.25 s in the tests). The loop's own thread releases the GIL at every poll of
its sockets but takes it straight back, and a waiter that sees the GIL change hands
does not ask for it again: a thread that wakes every millisecond was measured up to
460 ms late. Short slices and an explicit release of the GIL between them
(``time.sleep(0)``) bring that to a few milliseconds and a probe to a few tens, for
some of the worst-case searches' throughput (bench/bench_worst_case.py: 72 of them in
5 s on one loop, 84 without the release, on a shared machine).

**The budget and its margin.** A request carries its remaining budget (``timeout_ms``,
measured by the search server when it sent the request), or gets the server's default.
:func:`work_deadline` turns it into the time to stop working: the budget from the
request's arrival, less a safety margin, because the answer still has to be encoded,
sent and merged before the search server's own deadline, and because a deadline is
only looked at between slices (the slice running when it passes, and the slices of
the other searches ready before ours, run to their end). The margin is a tenth of the
budget, at least ``MIN_MARGIN`` (5 ms: a slice or two and a loopback round trip), and
never more than half the budget, so that even a request with a budget of a few
milliseconds gets its first slice. The time the request spent on the network and in
the server's queue before it arrived is not known (the clocks of two machines are not
compared), as with gRPC's propagated deadlines; the margin also covers a little of it.

Failure behaviour: none of its own; a step never raises (see ``IncrementalSearch``).
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
