"""The steady query load of a chaos run, and invariant 1: no query outlives its deadline.

Open loop. A query whose search server the harness killed or paused meanwhile is counted
``disturbed``, not judged; one in flight across a graceful stop is judged.

Development: docs/development.md, "The chaos run" (invariant 1).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from dataclasses import dataclass, field

import aiohttp

from .cluster import ChaosCluster, Member
from .observer import Observer
from .watch import Answer, missing_shards

__all__ = ["LoadGenerator", "LoadStats", "LoopLag", "cpu_jiffies"]

log = logging.getLogger(__name__)

SLACK_MS = 50.0
#: The width of :attr:`LoadStats.timeline`'s intervals, in seconds.
TIMELINE_BUCKET_S = 10
_WORDS = ("alpha", "river", "stone", "light", "garden", "winter", "signal", "market", "harbor")


@dataclass
class LoadStats:
    sent: int = 0
    complete: int = 0
    partial: int = 0
    failed: int = 0
    disturbed: int = 0
    over_deadline: int = 0
    #: Of partial answers: shards whose replicas all failed, or ran out of time.
    shards_failed: int = 0
    shards_timed_out: int = 0
    #: Of partial answers: shards whose data server stopped its search at the budget.
    shards_cut: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    #: fault kind (or "between faults") -> outcome -> count, by when the query was sent.
    by_fault: dict[str, dict[str, int]] = field(default_factory=dict)
    max_ms_by_fault: dict[str, float] = field(default_factory=dict)
    #: Start of a :data:`TIMELINE_BUCKET_S` interval (wall clock, s) -> outcome -> count,
    #: by when the query was sent: the soak plot's queries over time.
    timeline: dict[int, dict[str, int]] = field(default_factory=dict)

    def count_in_timeline(self, sent_at: float, outcome: str) -> None:
        bucket = int(sent_at // TIMELINE_BUCKET_S) * TIMELINE_BUCKET_S
        counts = self.timeline.setdefault(bucket, {"complete": 0, "partial": 0, "failed": 0})
        counts[outcome] += 1

    @property
    def max_ms(self) -> float:
        return max(self.latencies_ms, default=0.0)

    def percentile(self, p: float) -> float:
        if not self.latencies_ms:
            return 0.0
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


class LoopLag:
    """How late this process's own event loop wakes up: a late harness inflates the
    latency it measures, and the report must be able to tell that from a slow server."""

    def __init__(self, interval: float = 0.02) -> None:
        self._interval = interval
        self._samples: list[tuple[float, float]] = []  # (monotonic time, lag ms)
        # (monotonic time, CPU jiffies in all, of which stolen by the hypervisor)
        self._cpu: list[tuple[float, int, int]] = []

    async def run(self) -> None:
        ticks = 0
        while True:
            before = time.monotonic()
            await asyncio.sleep(self._interval)
            after = time.monotonic()
            self._samples.append((after, (after - before - self._interval) * 1000))
            if ticks % 10 == 0 and (cpu := cpu_jiffies()) is not None:
                self._cpu.append((after, *cpu))
            ticks += 1
            if len(self._samples) > 20_000:
                del self._samples[:10_000]
            if len(self._cpu) > 4_000:
                del self._cpu[:2_000]

    def worst_since(self, since: float) -> float:
        return max((lag for at, lag in self._samples if at >= since), default=0.0)

    def steal_since(self, since: float) -> float:
        """Share of CPU time the hypervisor took from this VM since ``since`` (0..1)."""
        window = [sample for sample in self._cpu if sample[0] >= since - 0.25]
        if len(window) < 2:
            return 0.0
        total = window[-1][1] - window[0][1]
        stolen = window[-1][2] - window[0][2]
        return stolen / total if total > 0 else 0.0


def _hit_ids(hits: object) -> tuple[str, ...]:
    """The string ids of a search result's ``hits`` (anything else is left out)."""
    if not isinstance(hits, list):
        return ()
    return tuple(
        hit["id"] for hit in hits if isinstance(hit, dict) and isinstance(hit.get("id"), str)
    )


def cpu_jiffies() -> tuple[int, int] | None:
    """(all jiffies, stolen jiffies) of the machine, from ``/proc/stat``; None elsewhere."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    values = [int(v) for v in fields[1:9]]
    return sum(values), values[7] if len(values) > 7 else 0


class LoadGenerator:
    """``start()`` / ``aclose()``; the figures are in :attr:`stats`."""

    def __init__(
        self, cluster: ChaosCluster, observer: Observer, *, rate: float, deadline_ms: int, seed: int
    ) -> None:
        self._cluster = cluster
        self._observer = observer
        self._rate = rate
        self._deadline_ms = deadline_ms
        self._rng = random.Random(seed)
        self.stats = LoadStats()
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._in_flight: set[asyncio.Task[None]] = set()
        self.lag = LoopLag()
        self._lag_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        # Own pool: the harness's admin calls must not queue behind queries.
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, limit_per_host=32),
            timeout=aiohttp.ClientTimeout(total=self._deadline_ms / 1000 + 10),
        )
        self._task = asyncio.create_task(self._run(), name="chaos:load")
        self._lag_task = asyncio.create_task(self.lag.run(), name="chaos:loop-lag")

    async def aclose(self) -> None:
        for task in (self._task, self._lag_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        # Let the queries in flight finish: they are judged too.
        if self._in_flight:
            await asyncio.wait(self._in_flight, timeout=self._deadline_ms / 1000 + 10)
        for task in self._in_flight:
            task.cancel()
        if self._session is not None:
            await self._session.close()

    async def settle(self, timeout: float) -> None:
        """Wait (up to ``timeout`` s) until the queries in flight now have ended and
        been counted."""
        pending = set(self._in_flight)
        if pending:
            await asyncio.wait(pending, timeout=timeout)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            next_at += self._rng.expovariate(self._rate)
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            targets = [
                m for m in self._cluster.search.values() if m.running and m.ready and not m.paused
            ]
            if not targets:
                continue
            member = self._rng.choice(targets)
            self._launch(member, " ".join(self._rng.sample(_WORDS, 2)))

    def _launch(self, member: Member, query: str) -> None:
        """Send ``query`` to ``member`` in a task of its own.

        The member's state is noted here, when it is chosen, not when the task first
        runs: a pause or kill in between (a fault's step can run first) would otherwise
        be part of the noted state, and a query held by a stopped search server judged
        as the system's (the soak once counted a 6 s "query" that way).
        """
        task = asyncio.create_task(
            self._query(member, query, member.disturbances, member.process, member.graceful_stops),
            name="chaos:query",
        )
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)

    async def _query(
        self,
        member: Member,
        query: str,
        disturbances: int,
        process: asyncio.subprocess.Process | None,
        graceful_stops: int,
    ) -> None:
        assert self._session is not None
        stats = self.stats
        stats.sent += 1
        fault = self._observer.fault
        # A query sent during a hostile fault is judged by that fault's invariants.
        watch = self._observer.hostile
        params = {"q": query, "timeout_ms": str(self._deadline_ms)}
        sent_at = time.time()
        started = time.monotonic()
        outcome = "failed"
        took_ms: float | None = None
        status: int | None = None
        missing: int | None = None
        detail = ""
        hit_ids: tuple[str, ...] = ()
        try:
            async with self._session.get(f"{member.url}/search", params=params) as response:
                status = response.status
                raw = await response.read()
                if status == 200:
                    body = json.loads(raw)
                    outcome = "partial" if body.get("partial") else "complete"
                    took_ms = body.get("took_ms")
                    shards = body.get("shards") or {}
                    stats.shards_failed += int(shards.get("failed", 0))
                    stats.shards_timed_out += int(shards.get("timed_out", 0))
                    stats.shards_cut += int(shards.get("cut", 0))
                    missing = missing_shards(shards)
                    hit_ids = _hit_ids(body.get("hits"))
                    detail = f"shards {json.dumps(shards, sort_keys=True)}"
                else:
                    detail = raw[:200].decode("utf-8", "replace")
        except (aiohttp.ClientError, TimeoutError, ValueError, AttributeError) as exc:
            outcome = "failed"
            missing = None
            detail = detail or f"{type(exc).__name__}: {exc}"[:200]
        elapsed_ms = (time.monotonic() - started) * 1000
        # A process replaced without a kill or a graceful stop (one that died on its own
        # and was started again) disturbed the query too; one replaced after a graceful
        # stop had to finish it first.
        replaced = member.process is not process and member.graceful_stops == graceful_stops
        disturbed = member.paused or member.disturbances != disturbances or replaced
        if disturbed:
            stats.disturbed += 1
            return
        if watch is not None:
            answer = Answer(
                started, member.name, outcome, missing, elapsed_ms, status, detail, hit_ids
            )
            for invariant, problem in watch.answer(answer):
                self._observer.violate(invariant, problem)
        setattr(stats, outcome, getattr(stats, outcome) + 1)
        stats.latencies_ms.append(elapsed_ms)
        counts = stats.by_fault.setdefault(fault, {"complete": 0, "partial": 0, "failed": 0})
        counts[outcome] += 1
        stats.count_in_timeline(sent_at, outcome)
        stats.max_ms_by_fault[fault] = max(stats.max_ms_by_fault.get(fault, 0.0), elapsed_ms)
        if elapsed_ms > self._deadline_ms + SLACK_MS:
            stats.over_deadline += 1
            self._observer.violate(
                "query within deadline + 50 ms",
                f"a query to {member.name} took {elapsed_ms:.0f} ms "
                f"(deadline {self._deadline_ms} ms, outcome {outcome}, the search server's "
                f"own took_ms {took_ms}, harness loop lag {self.lag.worst_since(started):.0f} ms, "
                f"CPU stolen by the hypervisor {self.lag.steal_since(started) * 100:.0f}%)",
            )
