"""The data server's HTTP API (:class:`DataHandlers`): ``/search``, ``/healthz``,
``/readyz``, ``/metrics`` and the admin endpoints. Errors are JSON; bad parameters raise
:class:`~discovery.errors.BadRequestError` (400 from the app's JSON middleware)."""

from __future__ import annotations

import asyncio
import logging
import time

import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler

from discovery.adminauth import refuse_admin
from discovery.agent.agent import AgentState
from discovery.agent.probes import PROBE_HEADER, PROBE_HEADER_VALUE
from discovery.errors import BadRequestError, ZkConnectionError
from discovery.http import MAX_QUERY_LENGTH, json_error, parse_search_params, read_json_body
from discovery.looplag import LoopLagMonitor
from discovery.zk.expiry import expire_session

from .admission import SearchAdmission
from .config import MAX_TIMEOUT_MS, DataServerConfig
from .faults import Fault, FaultInjector
from .index import MAX_DOCUMENTS, score_bound
from .loadreport import LoadMeter
from .metrics import DataServerMetrics
from .parts import DataServerParts
from .searching import run_search, work_deadline

__all__ = ["MAX_K", "MAX_SCORE", "RETRY_AFTER_S", "DataHandlers"]

log = logging.getLogger(__name__)

MAX_K = 1000
#: No score this data server answers reaches this: the BM25 bound of a query at the length
#: limit (a term and a separator take a character each: at most 512 distinct terms) over
#: an index at its size limit, about 1.8e4. Well within the scores search servers accept
#: (``search_server.merging.MAX_SCORE``, 1e9; docs/contracts.md).
MAX_SCORE = score_bound(MAX_DOCUMENTS, (MAX_QUERY_LENGTH + 1) // 2)
#: ``Retry-After`` of a search refused because the server is full (429), in seconds: the
#: searches in progress are expensive ones (ordinary ones end within one slice) and end
#: within about a second, the data server's default budget.
RETRY_AFTER_S = 1


class DataHandlers:
    """The aiohttp handlers of one data server, answering from its ``parts``.

    ``/search`` runs within its budget, admitted by ``admission`` (a probe always);
    ``faults`` apply to it; ``load`` meters the searches admitted, and every answer
    reports it; ``/metrics`` exposes ``registry``. ``POST /admin/drain``
    sets ``drain_requested``; the other admin endpoints act on the agent. Admin
    requests are refused without the cluster's admin token (when one is set).
    """

    def __init__(
        self,
        config: DataServerConfig,
        parts: DataServerParts,
        *,
        metrics: DataServerMetrics,
        admission: SearchAdmission,
        faults: FaultInjector,
        load: LoadMeter,
        loop_lag: LoopLagMonitor,
        drain_requested: asyncio.Event,
        registry: CollectorRegistry,
    ) -> None:
        self._config = config
        self._parts = parts
        self._metrics = metrics
        self._admission = admission
        self._faults = faults
        self._load = load
        self._loop_lag = loop_lag
        self._drain_requested = drain_requested
        self._registry = registry
        self._admin_token = config.cluster.admin_token

    def routes(self) -> list[web.RouteDef]:
        """The route table, for ``app.add_routes``."""
        return [
            web.get("/search", self.search),
            web.get("/healthz", self.healthz),
            web.get("/readyz", self.readyz),
            web.get("/metrics", make_aiohttp_handler(self._registry)),
            web.post("/admin/drain", self.admin_drain),
            web.post("/admin/offline", self.admin_offline),
            web.post("/admin/online", self.admin_online),
            web.post("/admin/fault", self.admin_fault),
            web.post("/admin/expire-session", self.admin_expire_session),
            web.get("/admin/status", self.admin_status),
        ]

    async def search(self, request: web.Request) -> web.Response:
        """``GET /search?q=&k=&timeout_ms=``: the top k, within the request's budget.

        The search runs in slices that yield to the loop (see :mod:`.searching`); when
        the budget (``timeout_ms`` clamped to ``--max-timeout-ms``, else
        ``--search-timeout-ms``) less its margin runs out it stops and answers with
        the best hits so far and ``"cut": true``. When it ran out before the search
        could start (an injected delay, a long queue): 504 with a JSON error. Bad
        parameters: 400 naming the parameter, first. Then, with
        ``--max-concurrent-searches`` searches in progress: 429 at once (a probe
        is never refused; see :mod:`.admission`). An answer carries this server's
        load (``utilization``, ``qps``, ``eps``: see :mod:`.loadreport`), which counts
        the searches admitted, probes included, and their 5xx answers as errors.
        """
        arrived = time.monotonic()
        started = time.perf_counter()
        try:
            # The same rules as the search server's, which forwards q and k here.
            params = parse_search_params(
                request.query,
                max_k=MAX_K,
                default_timeout_ms=self._config.search_timeout_ms,
                max_timeout_ms=MAX_TIMEOUT_MS,
            )
        except BadRequestError:
            self._metrics.requests.labels(status="400").inc()
            raise  # json_errors answers 400 naming the parameter and counts it
        assert params.timeout_ms is not None
        # Past the search servers' own maximum no query waits for the answer: work no
        # longer than that, rather than refuse a client that asked for more.
        budget_ms = min(params.timeout_ms, self._config.max_timeout_ms)
        # The request waited in this loop, about its current lag, before this handler
        # ran: that time is spent too. Past a search server's deadline the answer helps
        # nobody, and an overloaded server searching for requests already given up
        # stays overloaded after the load has passed (the 504 below is cheap).
        # (Only a lag the monitor counts as one: a few milliseconds late is any busy
        # loop's noise, not a queue.)
        lag = self._loop_lag.last_lag
        deadline = work_deadline(
            arrived - (lag if lag > self._loop_lag.threshold else 0.0), budget_ms
        )
        # A probe is admitted even when the server is full, and not counted against the
        # cap; it still runs here, on the same loop, so a blocked loop still fails it.
        probe = request.headers.get(PROBE_HEADER) == PROBE_HEADER_VALUE
        if not self._admission.try_enter(priority=probe):
            return self._refuse_full()
        if budget_ms < params.timeout_ms:
            self._metrics.clamped.inc()
        load = self._load
        load.enter()
        # An answer of 5xx (or a bug, which the middleware answers 500) counts as an
        # error in the load report; a search its client abandoned does not.
        failed = False
        try:
            if await self._faults.apply():
                failed = True
                return self._count(json_error(500, "injected error"))
            if time.monotonic() >= deadline:
                failed = True
                self._metrics.cut.labels(answer="timeout").inc()
                return self._count(
                    web.json_response(
                        {
                            "error": f"the search's budget of {budget_ms} ms ran "
                            "out before it could start",
                            "timeout_ms": budget_ms,
                        },
                        status=504,
                    )
                )
            index = self._parts.index
            assert index is not None
            outcome = await run_search(
                index.start_search(params.q, params.k),
                deadline,
                on_slice=self._metrics.slice.observe,
            )
            if outcome.cut:
                self._metrics.cut.labels(answer="hits").inc()
            took = time.perf_counter() - started
            report = load.report()
            # took_ms and queue (the other searches in progress here) are the feedback
            # the search servers' adaptive replica selection ranks replicas by; the
            # load report is what their weighted round robin weights replicas by.
            body = orjson.dumps(
                {
                    "hits": [
                        {"id": hit.id, "score": hit.score, "title": hit.title}
                        for hit in outcome.hits
                    ],
                    "shard": self._config.shard,
                    "took_ms": round(took * 1000, 3),
                    "queue": self._admission.total - 1,
                    "cut": outcome.cut,
                    "utilization": report.utilization,
                    "qps": report.qps,
                    "eps": report.eps,
                }
            )
        except Exception:
            failed = True
            raise
        finally:
            self._admission.leave(priority=probe)
            load.leave(error=failed)
        self._metrics.latency.observe(took)
        self._metrics.ok.inc()
        return web.Response(body=body, content_type="application/json")

    def _refuse_full(self) -> web.Response:
        """429 for a search arriving at a full server: at once, no search work done."""
        admission = self._admission
        self._metrics.full.inc()
        return web.json_response(
            {
                "error": f"this data server is full: {admission.in_progress} searches in "
                f"progress, its limit is {admission.limit}; retry later or elsewhere",
                "in_progress": admission.in_progress,
                "limit": admission.limit,
            },
            status=429,
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )

    def _count(self, response: web.Response) -> web.Response:
        self._metrics.requests.labels(status=str(response.status)).inc()
        return response

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(self, request: web.Request) -> web.Response:
        agent = self._parts.agent
        status = agent.status() if agent is not None else None
        ready = self._parts.index is not None and status is not None and status.registered
        body = {"ready": ready, "agent": None if status is None else status.to_dict()}
        return web.json_response(body, status=200 if ready else 503)

    # -- admin -------------------------------------------------------------------

    def refuse_admin(self, request: web.Request) -> web.Response | None:
        """The answer refusing ``request`` the admin API, or None if it may use it.

        The token when set, else loopback with the admin header; never a browser's
        cross-site request (:mod:`discovery.adminauth`).
        """
        return refuse_admin(request, self._admin_token)

    async def admin_drain(self, request: web.Request) -> web.Response:
        if (refused := self.refuse_admin(request)) is not None:
            return refused
        self._drain_requested.set()
        return web.json_response({"status": "draining"}, status=202)

    async def admin_offline(self, request: web.Request) -> web.Response:
        if (refused := self.refuse_admin(request)) is not None:
            return refused
        agent = self._parts.agent
        assert agent is not None
        await agent.atake_offline("admin")
        return web.json_response(agent.status().to_dict())

    async def admin_online(self, request: web.Request) -> web.Response:
        if (refused := self.refuse_admin(request)) is not None:
            return refused
        agent = self._parts.agent
        assert agent is not None
        await agent.abring_online()
        return web.json_response(agent.status().to_dict())

    async def admin_fault(self, request: web.Request) -> web.Response:
        if (refused := self.refuse_admin(request)) is not None:
            return refused
        # Both raise BadRequestError (FaultSpecError is one): json_errors answers 400
        # naming the field and counts it.
        fault = Fault.from_json(await read_json_body(request))
        self._faults.set(fault)
        log.warning("%s: fault set to %s", self._parts.instance_id, fault.to_dict())
        return web.json_response({"fault": fault.to_dict()})

    async def admin_expire_session(self, request: web.Request) -> web.Response:
        """Fault injection for chaos runs: have ZooKeeper expire the agent's session.

        The node vanishes as if the server had been partitioned away past its session
        timeout; the agent must register again on its new session by itself.
        """
        if (refused := self.refuse_admin(request)) is not None:
            return refused
        agent = self._parts.agent
        assert agent is not None
        session = agent.session
        if session is None:
            raise ZkConnectionError("the agent has no ZooKeeper session to expire")
        # On the agent's loop, which owns the session.
        new_session = await agent.call(expire_session(session))
        log.warning("%s: ZooKeeper session expired on request", self._parts.instance_id)
        return web.json_response({"session": f"0x{new_session:x}"})

    async def admin_status(self, request: web.Request) -> web.Response:
        if (refused := self.refuse_admin(request)) is not None:
            return refused
        agent = self._parts.agent
        status = agent.status() if agent is not None else None
        return web.json_response(
            {
                "id": self._parts.instance_id,
                "port": self._parts.port,
                "fault": self._faults.fault.to_dict(),
                "agent": None if status is None else status.to_dict(),
                "serving": status is not None and status.state is AgentState.SERVING,
            }
        )
