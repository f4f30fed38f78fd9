"""The live dashboard's data: query statistics, the search servers, the event stream.

A ``GET /events`` stream (:class:`EventStream`) ends when its client goes away or the
server shuts down, so it never holds up a shutdown. Runs on the server's event loop;
not thread-safe.

Design: docs/design/search-server.md, "The dashboard".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge

from discovery.errors import DiscoveryError
from discovery.http import json_error
from discovery.instance import ServiceInstance
from discovery.zk.paths import SEARCH_MEMBERS_PATH
from discovery.zk.session import ZkSession

__all__ = ["EventStream", "MemberCache", "QueryStats"]

log = logging.getLogger(__name__)

#: Latency samples kept per second of the window; beyond that, counts stay exact and the
#: percentiles come from the first samples of the second (plenty for a dashboard).
_SAMPLES_PER_SECOND: Final = 2000
#: A write to a dashboard client that takes longer than this ends its stream: a client
#: that does not read must not hold a handler (and the server's shutdown) forever.
_WRITE_TIMEOUT: Final = 5.0


@dataclass(slots=True)
class _Second:
    """The queries of one second of the window."""

    second: int
    queries: int = 0
    partial: int = 0
    overloaded: int = 0
    # The sum and least of the answers' coverage (share of the corpus searched).
    coverage: float = 0.0
    least_coverage: float = 1.0
    latencies_ms: list[float] = field(default_factory=list)


def _percentile(ordered: list[float], fraction: float) -> float:
    """Nearest-rank percentile of a sorted, non-empty list."""
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


class QueryStats:
    """A rolling window of the last ``window`` seconds of queries.

    :meth:`record` is called once per answered query, :meth:`record_overloaded` once
    per query refused by admission control. :meth:`snapshot` gives the rate (answered
    queries per second), p50/p99 latency in ms, the partial share and the answers'
    mean and least coverage over the window (over the time since creation while that
    is shorter, so the first seconds after start-up are not under-reported), and the
    shards the last answer found missing.
    """

    def __init__(
        self, window: float = 10.0, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not window >= 1:
            raise ValueError(f"window must be at least 1 second, got {window!r}")
        self.window = window
        self._clock = clock
        self._started = clock()
        self._seconds: deque[_Second] = deque()
        self.total = 0
        self._missing: Sequence[int] = ()
        self._missing_count = 0

    def _bucket(self) -> _Second:
        second = math.floor(self._clock())
        if not self._seconds or self._seconds[-1].second != second:
            self._seconds.append(_Second(second))
            self._expire(second)
        return self._seconds[-1]

    def _expire(self, now_second: int) -> None:
        oldest = now_second - math.ceil(self.window)
        while self._seconds and self._seconds[0].second < oldest:
            self._seconds.popleft()

    def record(
        self,
        latency_ms: float,
        partial: bool,
        coverage: float = 1.0,
        missing: Sequence[int] = (),
        missing_count: int | None = None,
    ) -> None:
        """One answered query: its fan-out time, whether the answer was partial, the
        share of the corpus it searched and the shards it found ``missing`` (an
        answer lists at most 100; ``missing_count`` is how many there were, if more)."""
        bucket = self._bucket()
        bucket.queries += 1
        self.total += 1
        if partial:
            bucket.partial += 1
        bucket.coverage += coverage
        bucket.least_coverage = min(bucket.least_coverage, coverage)
        self._missing = missing
        self._missing_count = len(missing) if missing_count is None else missing_count
        if len(bucket.latencies_ms) < _SAMPLES_PER_SECOND:
            bucket.latencies_ms.append(latency_ms)

    def record_overloaded(self) -> None:
        """One query refused by admission control (not counted in the rate)."""
        self._bucket().overloaded += 1

    def snapshot(self) -> dict[str, Any]:
        """``{"window_s", "queries", "rate", "p50_ms", "p99_ms", "partial_rate",
        "coverage", "least_coverage", "missing_shards", "missing_count", "overloaded",
        "total"}``; latencies and coverage are ``None`` without queries in the window."""
        now = self._clock()
        # Whole seconds: the current, partly elapsed second counts as a fraction.
        start = now - self.window
        seconds = [s for s in self._seconds if s.second + 1 > start]
        queries = sum(s.queries for s in seconds)
        partial = sum(s.partial for s in seconds)
        covered = sum(s.coverage for s in seconds)
        least = min((s.least_coverage for s in seconds if s.queries), default=None)
        latencies = sorted(x for s in seconds for x in s.latencies_ms)
        span = max(1.0, min(self.window, now - self._started))
        return {
            "window_s": self.window,
            "queries": queries,
            "rate": round(queries / span, 2),
            "p50_ms": round(_percentile(latencies, 0.50), 2) if latencies else None,
            "p99_ms": round(_percentile(latencies, 0.99), 2) if latencies else None,
            "partial_rate": round(partial / queries, 4) if queries else 0.0,
            "coverage": round(covered / queries, 4) if queries else None,
            "least_coverage": round(least, 4) if least is not None else None,
            # At most the first 100: a list for people, the count says the rest.
            "missing_shards": list(self._missing[:100]),
            "missing_count": self._missing_count,
            "overloaded": sum(s.overloaded for s in seconds),
            "total": self.total,
        }


class MemberCache:
    """The search servers registered under ``/search_servers/members``, cached.

    ``session`` returns the server's ZooKeeper session (``None`` before it exists).
    :meth:`get` refreshes when the list is older than ``ttl`` seconds, waiting at most
    ``wait`` seconds for it; a refresh that fails (ZooKeeper unreachable) keeps the
    last list, marked ``stale``.
    """

    def __init__(
        self,
        session: Callable[[], ZkSession | None],
        *,
        ttl: float = 3.0,
        wait: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._session = session
        self._ttl = ttl
        self._wait = wait
        self._clock = clock
        self._members: list[dict[str, Any]] = []
        self._fetched_at: float | None = None
        self.stale = True
        self._refresh: asyncio.Task[None] | None = None

    async def get(self) -> list[dict[str, Any]]:
        """``[{"id", "address", "port"}…]`` sorted by id (the last known list)."""
        fresh = self._fetched_at is not None and self._clock() - self._fetched_at < self._ttl
        if not fresh:
            if self._refresh is None or self._refresh.done():
                self._refresh = asyncio.create_task(self._load(), name="dashboard-members")
            # shield: a snapshot that stops waiting must not cancel the shared refresh.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._refresh), self._wait)
        return [dict(member) for member in self._members]

    async def _load(self) -> None:
        session = self._session()
        if session is None:
            return
        try:
            children = await session.get_children(SEARCH_MEMBERS_PATH)
            results = await asyncio.gather(
                *(session.get(f"{SEARCH_MEMBERS_PATH}/{child}") for child in children),
                return_exceptions=True,
            )
        except DiscoveryError as exc:
            log.debug("dashboard: cannot list search servers: %s", exc)
            self.stale = True
            self._fetched_at = self._clock()  # retry after ttl, not on every snapshot
            return
        members = []
        for child, result in zip(children, results, strict=True):
            if isinstance(result, BaseException):
                continue  # gone between the listing and the read
            member: dict[str, Any] = {"id": child, "address": None, "port": None}
            try:
                instance = ServiceInstance.from_json(result[0])
            except (DiscoveryError, ValueError):
                pass  # listed by id alone
            else:
                member.update(id=instance.id, address=instance.address, port=instance.port)
            members.append(member)
        self._members = sorted(members, key=lambda m: str(m["id"]))
        self._fetched_at = self._clock()
        self.stale = False

    async def aclose(self) -> None:
        task, self._refresh = self._refresh, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


class EventStream:
    """The ``GET /events`` handler: a server-sent event with ``snapshot()`` every
    ``interval`` seconds, until the client leaves or :meth:`close` is called.

    Snapshots are shared: several dashboards open at once cost one snapshot per
    interval, not one each. Beyond ``max_streams`` open streams, a request is answered
    503 at once and counted in ``search_server_dashboard_streams_refused_total`` (on
    ``registry``).
    """

    def __init__(
        self,
        snapshot: Callable[[], Awaitable[dict[str, Any]]],
        *,
        registry: CollectorRegistry,
        interval: float = 1.0,
        max_streams: int = 64,
    ) -> None:
        if max_streams < 1:
            raise ValueError(f"max_streams must be at least 1, got {max_streams}")
        self._snapshot = snapshot
        self._interval = interval
        self.max_streams = max_streams
        self.refused = 0
        self._refused_total = Counter(
            "search_server_dashboard_streams_refused",
            "Dashboard event streams (GET /events) refused with 503: --max-event-streams "
            "were open already.",
            registry=registry,
        )
        Gauge(
            "search_server_dashboard_streams",
            "Dashboard event streams (GET /events) open now.",
            registry=registry,
        ).set_function(lambda: len(self._streams))
        self._closing = asyncio.Event()
        self._streams: set[asyncio.Task[Any]] = set()
        self._cached: tuple[float, bytes] | None = None
        self._building: asyncio.Task[bytes] | None = None

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    async def _data(self) -> bytes:
        now = time.monotonic()
        if self._cached is not None and now - self._cached[0] < self._interval / 2:
            return self._cached[1]
        if self._building is None or self._building.done():
            self._building = asyncio.create_task(self._build(), name="dashboard-snapshot")
        return await asyncio.shield(self._building)

    async def _build(self) -> bytes:
        document = await self._snapshot()
        data = json.dumps(document, separators=(",", ":")).encode()
        self._cached = (time.monotonic(), data)
        return data

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if self._closing.is_set():
            raise web.HTTPServiceUnavailable(reason="shutting down")
        if len(self._streams) >= self.max_streams:
            self.refused += 1
            self._refused_total.inc()
            return json_error(
                503,
                f"too many dashboard streams: {self.max_streams} are open "
                "(--max-event-streams); try again later",
            )
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache, no-store",
                "X-Accel-Buffering": "no",  # no buffering in a reverse proxy
            }
        )
        task = asyncio.current_task()
        assert task is not None
        self._streams.add(task)
        try:
            await response.prepare(request)
            # The browser reconnects 2 s after a dropped stream (server restart).
            await self._write(response, b"retry: 2000\n\n")
            while not self._closing.is_set():
                try:
                    data = await self._data()
                except Exception:
                    # A bug in a snapshot must not end every open dashboard for good.
                    log.exception("dashboard snapshot failed")
                else:
                    await self._write(response, b"data: " + data + b"\n\n")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closing.wait(), self._interval)
        except (ConnectionError, TimeoutError) as exc:
            # ConnectionResetError (aiohttp's ClientConnectionResetError is one): the
            # client went away; TimeoutError: it stopped reading.
            log.debug("dashboard stream ended: %s", type(exc).__name__)
        finally:
            self._streams.discard(task)
        return response

    @staticmethod
    async def _write(response: web.StreamResponse, data: bytes) -> None:
        async with asyncio.timeout(_WRITE_TIMEOUT):
            await response.write(data)

    async def close(self, app: web.Application | None = None) -> None:
        """End every open stream (usable as an ``on_shutdown`` hook); idempotent."""
        self._closing.set()
        streams = list(self._streams)
        if streams:
            # Each handler sees the event within a loop iteration or, mid-write, within
            # the write timeout; wait for them so the runner's cleanup does not.
            await asyncio.wait(streams, timeout=_WRITE_TIMEOUT + 1)
        building, self._building = self._building, None
        if building is not None and not building.done():
            building.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await building
