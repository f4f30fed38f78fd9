"""The search server's HTTP API (:class:`SearchHandlers`).

Errors are JSON; a server still starting answers ``/search`` with 503 "starting".

Design: docs/design/search-server.md, "The search server"; API: docs/aggregator.md.
"""

from __future__ import annotations

import time
from importlib import resources

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler

from discovery.errors import OverloadedError
from discovery.http import json_error, parse_search_params

from .clusterstatus import ClusterStatus
from .clusterview import PageRequest, ViewQueryError
from .config import SearchServerConfig
from .coverage import late_shards, parse_coverage
from .dashboard import EventStream, QueryStats
from .metrics import QueryOfDeathMetrics
from .parts import ServerParts
from .querydeath import Quarantine, QueryOfDeathGuard, normalise
from .topk import parse_topk_probability

__all__ = ["MAX_K", "SearchHandlers"]

MAX_K = 1000


class SearchHandlers:
    """The aiohttp handlers of one search server, answering from its ``parts``.

    ``/search`` fans a query out (after ``query_guard`` lets it through) and records it
    in ``query_stats``; ``/cluster`` and ``/events`` tell ``status``; ``/metrics``
    exposes ``registry``. Bad parameters raise
    :class:`~discovery.errors.BadRequestError` (400 from the app's JSON middleware).
    """

    def __init__(
        self,
        config: SearchServerConfig,
        parts: ServerParts,
        *,
        status: ClusterStatus,
        events: EventStream,
        query_guard: QueryOfDeathGuard,
        query_stats: QueryStats,
        qod_metrics: QueryOfDeathMetrics,
        registry: CollectorRegistry,
    ) -> None:
        self._config = config
        self._parts = parts
        self._status = status
        self._events = events
        self._query_guard = query_guard
        self._query_stats = query_stats
        self._qod_metrics = qod_metrics
        self._registry = registry

    def routes(self) -> list[web.RouteDef]:
        """The route table, for ``app.add_routes``."""
        return [
            web.get("/search", self.search),
            web.get("/cluster", self.cluster),
            web.get("/", self.dashboard),
            web.get("/events", self._events.handle),
            web.get("/metrics", make_aiohttp_handler(self._registry)),
            web.get("/healthz", self.healthz),
            web.get("/readyz", self.readyz),
        ]

    async def search(self, request: web.Request) -> web.Response:
        # Raises BadRequestError, which json_errors answers with 400 and counts. The
        # same rules as the data servers': a query we forward must never be refused
        # there, since a refusal counts as the data server failing.
        params = parse_search_params(
            request.query,
            max_k=MAX_K,
            default_timeout_ms=self._config.default_timeout_ms,
            max_timeout_ms=self._config.max_timeout_ms,
        )
        query, k, timeout_ms = params.q, params.k, params.timeout_ms
        assert timeout_ms is not None  # asked for with max_timeout_ms
        # The search server's own: never forwarded to a data server.
        policy = parse_coverage(request.query, self._config.coverage)
        # How sure the merged top k must be of being exact (1: every shard asked for k).
        topk_probability = parse_topk_probability(
            request.query.get("topk_probability"), self._config.topk_probability
        )
        fanout = self._parts.fanout
        if self._parts.reader is None or fanout is None:
            return json_error(503, "starting")
        servers = self._parts.routing_list()
        if servers is None:
            return json_error(503, "no live list yet")
        key = normalise(query)
        quarantine = self._query_guard.check(key)
        if quarantine is not None:
            return self._refuse_query_of_death(quarantine)
        try:
            result = await fanout.search(
                servers,
                query,
                k,
                timeout_ms,
                key=key,
                coverage=policy,
                topk_probability=topk_probability,
            )
        except OverloadedError as exc:
            self._query_stats.record_overloaded()
            # Shed at once, before any work: the client may retry, here in a moment or
            # on another search server (a load balancer's cue, as a data server's 429).
            refused = json_error(503, f"overloaded: {exc}")
            refused.headers["Retry-After"] = "1"
            return refused
        shards = result.shards
        # A missing shard is no fault of the query: only the shards asked count; nor is
        # one the coverage policy let go (it chose not to wait, enough having answered).
        self._query_guard.record(
            key,
            shards["total"] - shards.get("missing", 0),
            shards["failed"] + late_shards(result) + shards.get("cut", 0),
        )
        coverage = result.coverage
        if coverage is None:
            self._query_stats.record(result.took_ms, result.partial)
        else:
            # The answer lists the first missing shards; shards.missing counts them all.
            self._query_stats.record(
                result.took_ms,
                result.partial,
                coverage.ratio,
                coverage.missing,
                shards.get("missing", len(coverage.missing)),
            )
        return web.json_response(result.to_dict())

    def _refuse_query_of_death(self, quarantine: Quarantine) -> web.Response:
        """422 at once, with Retry-After: the query is quarantined (see
        :mod:`search_server.querydeath`); no data server is asked."""
        self._qod_metrics.refused.inc()
        now = time.monotonic()
        response = json_error(422, quarantine.message(now))
        response.headers["Retry-After"] = str(quarantine.retry_after(now))
        return response

    async def cluster(self, request: web.Request) -> web.Response:
        try:
            page = PageRequest.from_query(request.query)
        except ViewQueryError as exc:
            return json_error(400, str(exc), parameter=exc.parameter)
        return web.json_response(self._status.cluster_view(page))

    async def dashboard(self, request: web.Request) -> web.Response:
        page = resources.files("search_server").joinpath("dashboard.html").read_text("utf-8")
        return web.Response(text=page, content_type="text/html")

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(self, request: web.Request) -> web.Response:
        reader = self._parts.reader
        draining = self._parts.draining
        ready = reader is not None and reader.current.version > 0 and not draining
        body: dict[str, object] = {
            "ready": ready,
            "version": reader.current.version if reader else 0,
        }
        if draining:
            body["draining"] = True
        return web.json_response(body, status=200 if ready else 503)
