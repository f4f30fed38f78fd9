"""Fan a query out to one replica of every shard, under one deadline, and merge the hits.

This is the part of the search server the whole product exists for: with a static list,
one dead or hung data server made every query wait for it, requests piled up and the
site fell over. Discovery keeps dead servers out of the list within a session timeout
and sick ones within a few probes; the fan-out bounds what is left over:

* **One deadline per query.** Everything runs under a single ``asyncio.timeout``; each
  request gets the *remaining* budget, and at the deadline every unanswered shard is
  reported as ``timed_out`` and its request cancelled. A hung data server costs a query
  at most its deadline, never more.
* **Replica choice** by a :class:`~search_server.picking.ReplicaPicker`, by default
  power of two choices on outstanding requests (two random replicas, the less busy one
  wins). The picker is told when each request starts and how it ended.
* **Retry on failure** (connection error, non-200, bad JSON) to another replica of the
  shard while time remains, each replica at most once per query.
* **Outlier ejection.** A data server that failed or timed out ``eject_after`` times in a
  row is skipped for ``eject_cooldown`` seconds, as long as no more than
  ``max_ejected_share`` of the servers (at least one) are ejected at once. This covers
  the seconds before its agent takes it offline, and failures the agent cannot see (a
  network partition between search and data servers only); without it every query
  would pay a full timeout for that server in the meantime. The cap keeps a moment of
  trouble on our side (a CPU stall) from ejecting everything at once.
* **Admission control.** At most ``max_in_flight`` queries at once; the next one is
  refused at once with :class:`OverloadedError` rather than queued, so that a slow cluster
  cannot make requests pile up on the search server (the original outage).

Everything here runs on the caller's event loop and is not thread-safe.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
from prometheus_client import CollectorRegistry

from discovery.errors import OverloadedError
from discovery.instance import ServiceInstance

from .metrics import FanOutMetrics
from .picking import Outcome, PowerOfTwoChoices, ReplicaPicker, target_key

__all__ = ["FanOut", "FanOutResult"]

log = logging.getLogger(__name__)

_ShardOutcome = Literal["ok", "failed", "timed_out"]


class _BadAnswer(ValueError):
    """A data server answered, but not with a usable search result."""


@dataclass(frozen=True, slots=True)
class FanOutResult:
    """The merged answer of one query, in the shape of the search server's ``/search``.

    ``shards`` has the integer keys ``total``, ``ok``, ``failed`` and ``timed_out``;
    ``partial`` is true when any shard failed or timed out, i.e. ``hits`` may miss
    documents of those shards. ``took_ms`` is the fan-out's wall time.
    """

    hits: list[dict[str, Any]]
    shards: dict[str, int]
    partial: bool
    took_ms: float

    def to_dict(self) -> dict[str, Any]:
        """The brief's response body, as fresh JSON-ready objects."""
        return {
            "hits": [dict(hit) for hit in self.hits],
            "shards": dict(self.shards),
            "partial": self.partial,
            "took_ms": self.took_ms,
        }


@dataclass(slots=True)
class _Health:
    """Consecutive failures of one data server, and its ejection if any."""

    instance_id: str
    failures: int = 0
    ejected_until: float | None = None

    def is_ejected(self, now: float) -> bool:
        return self.ejected_until is not None and now < self.ejected_until


@dataclass(slots=True)
class _ShardCall:
    """The progress of one shard within one query."""

    shard: int
    replicas: list[ServiceInstance]
    tried: set[str] = field(default_factory=set)
    # The replica whose request is in flight: at the deadline it is charged a timeout.
    current: ServiceInstance | None = None
    hits: list[dict[str, Any]] | None = None
    # Until a replica answers: what the last attempt did ("failed" if none could be made).
    outcome: _ShardOutcome = "failed"


def _url(instance: ServiceInstance) -> str:
    host = instance.address
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 literal
    return f"http://{host}:{instance.port}/search"


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _parse_hits(body: Any, shard: int, k: int) -> list[dict[str, Any]]:
    """Validate a data server's answer; return its hits annotated with ``shard``.

    Raises:
        _BadAnswer: not the data server's ``{"hits":[{"id","score",…}],"shard":n}``.
    """
    if not isinstance(body, dict):
        raise _BadAnswer("answer is not a JSON object")
    raw_hits = body.get("hits")
    if not isinstance(raw_hits, list):
        raise _BadAnswer("answer has no 'hits' list")
    if "shard" in body and body["shard"] != shard:
        # A stale registration whose port now belongs to a server of another shard:
        # merging its hits would return another shard's documents twice.
        raise _BadAnswer(f"answered for shard {body['shard']!r}, registered for shard {shard}")
    hits: list[dict[str, Any]] = []
    for hit in raw_hits[:k]:
        if not isinstance(hit, dict):
            raise _BadAnswer("a hit is not a JSON object")
        hit_id, score = hit.get("id"), hit.get("score")
        if not isinstance(hit_id, str):
            raise _BadAnswer(f"a hit's 'id' is not a string: {hit_id!r}")
        if (
            isinstance(score, bool)
            or not isinstance(score, int | float)
            or not math.isfinite(score)
        ):
            raise _BadAnswer(f"hit {hit_id!r} has no finite 'score': {score!r}")
        hits.append({**hit, "shard": shard})
    return hits


class FanOut:
    """Fans queries out to the data servers and merges their hits.

    ``http`` is the application's session; its connector pools keep-alive connections
    (size ``limit_per_host`` for the expected concurrency), so a query costs no
    connection set-up. The fan-out never closes it.

    ``clock`` times ejections only (tests may advance it); deadlines use the event
    loop's clock, which is what ``asyncio.timeout`` enforces. ``picker`` chooses among a
    shard's replicas (default :class:`~search_server.picking.PowerOfTwoChoices` on
    ``rng``, which makes the choice reproducible). Metrics go to ``registry`` (a fresh
    one if ``None``).

    Raises ``ValueError`` for a limit below 1 or a negative cool-down.
    """

    def __init__(
        self,
        http: aiohttp.ClientSession,
        *,
        max_in_flight: int = 256,
        eject_after: int = 3,
        eject_cooldown: float = 10.0,
        max_ejected_share: float = 0.5,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        picker: ReplicaPicker | None = None,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        if eject_after < 1:
            raise ValueError(f"eject_after must be >= 1, got {eject_after}")
        if not eject_cooldown >= 0:
            raise ValueError(f"eject_cooldown must be >= 0 seconds, got {eject_cooldown}")
        if not 0 <= max_ejected_share <= 1:
            raise ValueError(f"max_ejected_share must be in 0..1, got {max_ejected_share}")
        self._http = http
        self._max_in_flight = max_in_flight
        self._eject_after = eject_after
        self._eject_cooldown = eject_cooldown
        self._max_ejected_share = max_ejected_share
        # Routable data servers in the last list we fanned out to: the base of the cap.
        self._known = 0
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = FanOutMetrics(self.registry)
        self._clock = clock
        self.picker: ReplicaPicker = picker if picker is not None else PowerOfTwoChoices(rng)
        self._in_flight = 0
        # Only data servers that failed lately have an entry (a success removes it), so
        # this stays small; entries of servers gone from the list are pruned.
        self._health: dict[str, _Health] = {}
        self._next_prune = clock()

    @property
    def in_flight(self) -> int:
        """Queries currently admitted and not finished."""
        return self._in_flight

    @property
    def max_in_flight(self) -> int:
        return self._max_in_flight

    def ejected(self) -> set[str]:
        """Instance ids of the data servers currently ejected (skipped) by this fan-out."""
        now = self._clock()
        return {h.instance_id for h in self._health.values() if h.is_ejected(now)}

    async def search(
        self, servers: Sequence[ServiceInstance], query: str, k: int, timeout_ms: int
    ) -> FanOutResult:
        """Search every shard of ``servers`` for ``query``; merge the top ``k`` hits.

        ``servers`` is the live list; instances that are not ``routable`` (draining,
        disabled) are ignored. Returns within ``timeout_ms`` (plus the time to cancel
        the outstanding requests, a loop iteration): shards that failed or had no answer
        by then are counted in the result, which is then ``partial``; they never raise.

        Raises:
            OverloadedError: ``max_in_flight`` queries are already running (raised before
                anything is sent; the query is not queued).
            ValueError: ``k`` or ``timeout_ms`` below 1.
        """
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if timeout_ms < 1:
            raise ValueError(f"timeout_ms must be >= 1, got {timeout_ms}")
        # No await before this check and the increment: admission is atomic on the loop.
        if self._in_flight >= self._max_in_flight:
            self.metrics.queries.labels(outcome="overloaded").inc()
            raise OverloadedError(
                f"{self._in_flight} queries in flight, the limit is {self._max_in_flight}"
            )
        self._in_flight += 1
        self.metrics.in_flight.inc()
        try:
            return await self._fan_out(servers, query, k, timeout_ms)
        finally:
            self._in_flight -= 1
            self.metrics.in_flight.dec()

    async def _fan_out(
        self, servers: Sequence[ServiceInstance], query: str, k: int, timeout_ms: int
    ) -> FanOutResult:
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + timeout_ms / 1000
        by_shard: dict[int, list[ServiceInstance]] = {}
        for instance in servers:
            if instance.routable:
                by_shard.setdefault(instance.payload.shard, []).append(instance)
        self._prune(by_shard)
        self._known = sum(len(replicas) for replicas in by_shard.values())
        calls = [_ShardCall(shard, replicas) for shard, replicas in sorted(by_shard.items())]
        tasks = {
            asyncio.create_task(
                self._call_shard(call, query, k, deadline), name=f"fanout-shard-{call.shard}"
            ): call
            for call in calls
        }
        deadline_passed = False
        try:
            if tasks:
                async with asyncio.timeout_at(deadline):
                    await asyncio.wait(list(tasks))
        except TimeoutError:
            # Only our own deadline: asyncio.timeout raises TimeoutError for nothing else.
            deadline_passed = True
        finally:
            pending = [task for task in tasks if not task.done()]
            for task in pending:
                task.cancel()
            if pending:
                # Cancelling an aiohttp request closes its connection at once; waiting
                # for it keeps the outstanding-request counts exact.
                await asyncio.gather(*pending, return_exceptions=True)
        if deadline_passed:
            # A cancellation of the whole query from outside (client gone) is no fault of
            # the data servers and charges nothing; only our deadline does.
            for task in pending:
                call = tasks[task]
                if call.hits is not None:
                    continue  # answered in the very loop iteration of the deadline
                call.outcome = "timed_out"
                # Still set only if the request did not end by itself: when aiohttp's own
                # timeout fires in the same iteration as ours, the shard task has already
                # charged the timeout, and it must not count twice towards ejection.
                if call.current is not None:
                    stuck, call.current = call.current, None
                    self._record_failure(stuck, "timeout", "no answer by the query deadline")
        for task, call in tasks.items():
            if task.cancelled():
                continue
            if (exc := task.exception()) is not None:
                # A bug, not a data server's fault; the shard is failed, the query goes on.
                log.error("fan-out to shard %d failed", call.shard, exc_info=exc)
                call.hits, call.outcome = None, "failed"
        return self._merge(calls, k, (loop.time() - started) * 1000)

    def _merge(self, calls: list[_ShardCall], k: int, took_ms: float) -> FanOutResult:
        answered = [call.hits for call in calls if call.hits is not None]
        timed_out = sum(1 for call in calls if call.hits is None and call.outcome == "timed_out")
        failed = len(calls) - len(answered) - timed_out
        # Each shard's hits are already its top k: the top k overall are among them.
        hits = heapq.nsmallest(
            k,
            (hit for shard_hits in answered for hit in shard_hits),
            key=lambda hit: (-hit["score"], hit["id"]),
        )
        partial = failed + timed_out > 0
        self.metrics.queries.labels(outcome="partial" if partial else "complete").inc()
        self.metrics.query_seconds.observe(took_ms / 1000)
        if partial:
            log.debug(
                "partial answer: %d of %d shards failed, %d timed out",
                failed,
                len(calls),
                timed_out,
            )
        return FanOutResult(
            hits=hits,
            shards={
                "total": len(calls),
                "ok": len(answered),
                "failed": failed,
                "timed_out": timed_out,
            },
            partial=partial,
            took_ms=round(took_ms, 3),
        )

    async def _call_shard(self, call: _ShardCall, query: str, k: int, deadline: float) -> None:
        """Ask replicas of one shard until one answers, time runs out, or none is left.

        Leaves the answer or the reason for none in ``call``; never raises except when
        cancelled (at the deadline).
        """
        loop = asyncio.get_running_loop()
        while True:
            now = self._clock()
            candidates = [
                replica
                for replica in call.replicas
                if target_key(replica) not in call.tried and not self._is_ejected(replica, now)
            ]
            if not candidates:
                return
            instance = self.picker.pick(candidates)
            if call.tried:
                self.metrics.retries.inc()
            call.tried.add(target_key(instance))
            call.current = instance
            try:
                hits = await self._request(instance, call.shard, query, k, deadline)
            except TimeoutError:
                # aiohttp's own timeout (the remaining budget) fired just before ours.
                call.current, call.outcome = None, "timed_out"
                self._record_failure(instance, "timeout", "no answer within the budget")
            except (aiohttp.ClientError, ValueError, OSError) as exc:
                # ValueError: undecodable JSON or a _BadAnswer.
                call.current, call.outcome = None, "failed"
                self._record_failure(instance, "error", _describe(exc))
            else:
                call.current, call.hits, call.outcome = None, hits, "ok"
                self._record_success(instance)
                return
            if deadline - loop.time() <= 0:
                return

    async def _request(
        self, instance: ServiceInstance, shard: int, query: str, k: int, deadline: float
    ) -> list[dict[str, Any]]:
        """One ``GET /search`` with the remaining budget; the validated, annotated hits.

        Raises:
            TimeoutError: no answer within the budget (or none left).
            aiohttp.ClientError, OSError: connection failed or broke.
            ValueError: non-200 status, not JSON, or not a search answer.
        """
        loop = asyncio.get_running_loop()
        started = loop.time()
        remaining = deadline - started
        if remaining <= 0:
            raise TimeoutError
        self.picker.started(instance)
        outcome: Outcome = "failed"
        try:
            async with self._http.get(
                _url(instance),
                params={"q": query, "k": str(k)},
                timeout=aiohttp.ClientTimeout(total=remaining),
            ) as response:
                if response.status != 200:
                    raise _BadAnswer(f"HTTP {response.status}")
                # content_type=None: judge the body, not the header.
                body = await response.json(content_type=None)
            hits = _parse_hits(body, shard, k)
            outcome = "ok"
        except TimeoutError:
            outcome = "timed_out"
            raise
        except asyncio.CancelledError:
            # Cancelled at the query's deadline is a timeout for the picker's ranking;
            # cancelled before it, the query ended for another reason.
            outcome = "timed_out" if loop.time() >= deadline else "cancelled"
            raise
        finally:
            self.picker.finished(instance, outcome, loop.time() - started)
        return hits

    def _is_ejected(self, instance: ServiceInstance, now: float) -> bool:
        health = self._health.get(target_key(instance))
        return health is not None and health.is_ejected(now)

    def _record_failure(self, instance: ServiceInstance, result: str, detail: str) -> None:
        self.metrics.shard_requests.labels(result=result).inc()
        key = target_key(instance)
        health = self._health.get(key)
        if health is None:
            health = self._health[key] = _Health(instance.id)
        health.failures += 1
        now = self._clock()
        # After a cool-down the count is still at the limit: one more failure re-ejects.
        # Failures of requests sent before the ejection do not extend it.
        if (
            health.failures >= self._eject_after
            and not health.is_ejected(now)
            and not self._ejection_cap_reached(now)
        ):
            health.ejected_until = now + self._eject_cooldown
            self.metrics.ejections.inc()
            log.warning(
                "ejecting data server %s (%s:%d, shard %d) for %.1fs after %d consecutive "
                "failures; last: %s",
                instance.id,
                instance.address,
                instance.port,
                instance.payload.shard,
                self._eject_cooldown,
                health.failures,
                detail,
            )
        else:
            log.debug(
                "data server %s (%s:%d) %s: %s",
                instance.id,
                instance.address,
                instance.port,
                result,
                detail,
            )

    def _ejection_cap_reached(self, now: float) -> bool:
        # When many servers fail at once the cause is more likely on our side (a CPU
        # stall, a network blip) than theirs; ejecting them all would turn a slow moment
        # into empty answers. Discovery still removes servers that are really down.
        ejected = sum(1 for h in self._health.values() if h.is_ejected(now))
        if ejected + 1 > max(1, int(self._max_ejected_share * self._known)):
            log.warning(
                "not ejecting more data servers: %d of %d already ejected (cap %.0f%%)",
                ejected,
                self._known,
                self._max_ejected_share * 100,
            )
            return True
        return False

    def _record_success(self, instance: ServiceInstance) -> None:
        self.metrics.shard_requests.labels(result="ok").inc()
        key = target_key(instance)
        health = self._health.get(key)
        if health is None:
            return
        if health.is_ejected(self._clock()):
            # A request sent before the ejection: it resets the count but the ejection
            # runs its course, so that a flapping server does not bounce straight back.
            health.failures = 0
            return
        if health.ejected_until is not None:
            log.info("data server %s answers again after its ejection", instance.id)
        del self._health[key]

    def _prune(self, by_shard: dict[int, list[ServiceInstance]]) -> None:
        """Forget the health of servers that left the list (at most once per cool-down).

        Data servers that fail usually leave the list soon after (their agent takes
        them offline) and may come back on another port: without this, a long-running
        search server would keep their entries forever. Current ejections are kept.
        """
        now = self._clock()
        if now < self._next_prune or not self._health:
            return
        self._next_prune = now + max(self._eject_cooldown, 1.0)
        present = {target_key(instance) for replicas in by_shard.values() for instance in replicas}
        for key in [
            key
            for key, health in self._health.items()
            if key not in present and not health.is_ejected(now)
        ]:
            del self._health[key]
