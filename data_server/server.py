"""One data server: an in-memory shard behind an aiohttp API, with an embedded agent.

Start-up order is the contract "register only when ready": load and index the
documents, start listening, connect the agent, and only then tell the agent the
server is ready; the agent registers after its first good probe (a real search over
HTTP). Shutdown is the drain: the agent marks the node ``draining`` and keeps it
for the grace period while we keep answering, removes it, then the HTTP server stops
accepting, finishes in-flight requests, and the agent closes its session.

Overload is not failure: a search arriving while ``--max-concurrent-searches`` searches
are in progress is answered at once with 429 and ``Retry-After`` (see
:mod:`.admission`), before any search work; the agent's probes (marked by
:data:`~discovery.agent.probes.PROBE_HEADER`) are never refused for it, so a full
server does not fail its own health check. No search works longer than
``--max-timeout-ms``: a larger ``timeout_ms`` is clamped to it.
"""

from __future__ import annotations

import asyncio
import logging
import time

import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.aiohttp import make_aiohttp_handler

from discovery import __version__
from discovery.adminauth import refuse_admin
from discovery.agent.agent import Agent, AgentState
from discovery.agent.loopthread import LoopThread
from discovery.agent.probes import PROBE_HEADER, PROBE_HEADER_VALUE, SearchProbe
from discovery.errors import BadRequestError, ConfigError, ZkConnectionError
from discovery.http import (
    MAX_QUERY_LENGTH,
    json_app,
    json_error,
    parse_search_params,
    read_json_body,
)
from discovery.httpedge import KEEPALIVE_TIMEOUT, HeaderGuard
from discovery.instance import InstancePayload, InstanceState, ServiceInstance
from discovery.looplag import LoopLagMonitor
from discovery.zk.expiry import expire_session

from .admission import SearchAdmission
from .config import MAX_TIMEOUT_MS, DataServerConfig
from .corpus import Document, generate_documents, load_jsonl, sample_queries
from .faults import Fault, FaultInjector
from .index import InvertedIndex
from .searching import run_search, work_deadline
from .snapshot import IndexSnapshots, SnapshotKey

__all__ = ["MAX_K", "MAX_QUERY_LENGTH", "RETRY_AFTER_S", "DataServer"]

log = logging.getLogger(__name__)

MAX_K = 1000
#: ``Retry-After`` of a search refused because the server is full (429), in seconds: the
#: searches in progress are expensive ones (ordinary ones end within one slice) and end
#: within about a second, the data server's default budget.
RETRY_AFTER_S = 1


class _Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "data_server_search_requests",
            "Search requests, by HTTP status.",
            ["status"],
            registry=registry,
        )
        self.latency = Histogram(
            "data_server_search_seconds",
            "Search latency as served (including injected faults).",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
            registry=registry,
        )
        self.documents = Gauge(
            "data_server_documents", "Documents in this shard.", registry=registry
        )
        self.terms = Gauge("data_server_terms", "Distinct terms in the index.", registry=registry)
        self.index_build_seconds = Gauge(
            "data_server_index_build_seconds",
            "Time it took to load and index the shard (or to load its snapshot).",
            registry=registry,
        )
        self.from_snapshot = Gauge(
            "data_server_index_from_snapshot",
            "1 when the shard's index was loaded from its snapshot (--index-snapshot-dir), "
            "0 when it was built.",
            registry=registry,
        )
        self.cut = Counter(
            "data_server_search_cut",
            "Searches stopped when their budget (timeout_ms, less a safety margin) ran "
            "out: answered with the hits found so far (answer=hits, HTTP 200 with "
            "cut=true), or with HTTP 504 when it ran out before the search could start "
            "(answer=timeout).",
            ["answer"],
            registry=registry,
        )
        self.slice = Histogram(
            "data_server_search_slice_seconds",
            "How long one slice of a search held the event loop.",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1),
            registry=registry,
        )
        self.in_progress = Gauge(
            "data_server_searches_in_progress",
            "Searches in progress that count against --max-concurrent-searches (held by "
            "an injected fault included, the agent's probes not).",
            registry=registry,
        )
        self.limit = Gauge(
            "data_server_max_concurrent_searches",
            "The cap on searches in progress (--max-concurrent-searches); more are "
            "answered with 429.",
            registry=registry,
        )
        self.clamped = Counter(
            "data_server_search_timeout_clamped",
            "Search requests whose timeout_ms exceeded --max-timeout-ms, worked with "
            "that maximum instead.",
            registry=registry,
        )


class DataServer:
    """A data server with its agent. ``await start()``, later ``await shutdown()``.

    ``drain_requested`` is set by ``POST /admin/drain``; the owner (the CLI, a fleet)
    reacts by calling :meth:`shutdown`, exactly as on SIGTERM.
    """

    def __init__(
        self,
        config: DataServerConfig,
        *,
        registry: CollectorRegistry | None = None,
        loop_thread: LoopThread | None = None,
        loop_lag: LoopLagMonitor | None = None,
    ) -> None:
        self.config = config
        self.registry = registry if registry is not None else CollectorRegistry()
        self._loop_thread = loop_thread
        # How long a request waits in this loop before its handler runs (it is spent
        # from its budget). A fleet passes the one monitor of its shared loop; alone,
        # the server starts its own with :meth:`start` and stops it at shutdown.
        self._owns_loop_lag = loop_lag is None
        self.loop_lag = (
            loop_lag
            if loop_lag is not None
            else LoopLagMonitor(registry=self.registry, metric="data_server_event_loop_lag_seconds")
        )
        self._metrics = _Metrics(self.registry)
        # The hot path's counter child, looked up once rather than per request.
        self._ok = self._metrics.requests.labels(status="200")
        self._full = self._metrics.requests.labels(status="429")
        # The cap on searches in progress; read by the gauge when scraped.
        self._admission = SearchAdmission(config.max_concurrent_searches)
        self._metrics.in_progress.set_function(lambda: self._admission.in_progress)
        self._metrics.limit.set(config.max_concurrent_searches)
        self.faults = FaultInjector()
        self.drain_requested = asyncio.Event()
        self.index: InvertedIndex | None = None
        self.agent: Agent | None = None
        self.port: int | None = None
        self._runner: web.AppRunner | None = None
        # Bounds the time request headers take to arrive, and the connections waiting.
        self._edge = HeaderGuard(config.http, registry=self.registry)
        self._admin_token = config.cluster.admin_token
        self._stopping = False

    @property
    def instance_id(self) -> str:
        if self.agent is not None:
            return self.agent.instance.id
        return self.config.instance_id or f"ds-{self.config.advertise}-{self.config.port}"

    @property
    def searches_in_progress(self) -> int:
        """Searches in progress that count against ``--max-concurrent-searches`` (the
        agent's probes aside), as the gauge ``data_server_searches_in_progress`` shows."""
        return self._admission.in_progress

    # The name tests used before the admission counted searches.
    _searching = searches_in_progress

    @property
    def url(self) -> str:
        return f"http://{self.config.probe_host}:{self.port}"

    # -- lifecycle ---------------------------------------------------------------

    async def load(self) -> None:
        """Load and index the shard (once).

        Raises:
            ConfigError: the ``--docs-file`` cannot be read or has a bad line.
        """
        if self.index is not None:
            return
        started = time.monotonic()
        # Off the loop, so that a slow load does not stall what else runs on it.
        self.index = await asyncio.to_thread(self._build_index)
        self._metrics.index_build_seconds.set(time.monotonic() - started)
        self._metrics.documents.set(self.index.document_count)
        self._metrics.terms.set(self.index.term_count)

    async def start(self) -> None:
        """Index (unless :meth:`load` did), listen, connect the agent, declare readiness.

        Raises:
            DiscoveryError: ZooKeeper unreachable (the HTTP server is stopped again).
            OSError: the port is taken.
            ConfigError: a bad ``--docs-file``.
        """
        await self.load()
        assert self.index is not None

        runner = web.AppRunner(
            self._make_app(),
            access_log=None,
            handle_signals=False,
            shutdown_timeout=self.config.shutdown_timeout,
            keepalive_timeout=KEEPALIVE_TIMEOUT,
        )
        await runner.setup()
        self._runner = runner
        try:
            self.port = await self._edge.listen(runner, self.config.host, self.config.port)
            self.agent = Agent(
                self._instance(),
                SearchProbe(self.url, sample_queries(20, seed=self.config.seed, variant=1), k=10),
                zk=self.config.zk,
                config=self.config.agent,
                registry=self.registry,
                loop_thread=self._loop_thread,
            )
            await self.agent.astart()
        except BaseException:
            self._edge.close()
            await runner.cleanup()
            raise
        if self._owns_loop_lag:
            self.loop_lag.start()
        self.agent.set_ready()
        log.info(
            "data server %s: %d documents indexed, listening on %s:%d",
            self.instance_id,
            self.index.document_count,
            self.config.host,
            self.port,
        )

    async def shutdown(self, grace: float | None = None) -> None:
        """Drain (see the module doc), stop serving, close the agent. Idempotent."""
        if self._stopping:
            return
        self._stopping = True
        if self.agent is not None:
            await self.agent.adrain(grace)
        # Releases requests hung by a fault, so that they end rather than time out.
        self.faults.set(Fault())
        if self._runner is not None:
            self._edge.close()  # stops accepting, as the runner's sites would
            await self._runner.cleanup()
        if self.agent is not None:
            await self.agent.astop()
        if self._owns_loop_lag:
            await self.loop_lag.aclose()
        log.info("data server %s stopped", self.instance_id)

    def _build_index(self) -> InvertedIndex:
        """The shard's index: from its snapshot when ``--index-snapshot-dir`` holds one
        of the same documents, else built (and then saved there)."""
        config = self.config
        snapshots = key = None
        if config.index_snapshot_dir is not None:
            snapshots = IndexSnapshots(config.index_snapshot_dir)
            try:
                key = (
                    SnapshotKey.from_file(config.docs_file, shard=config.shard, version=__version__)
                    if config.docs_file is not None
                    else SnapshotKey.generated(
                        shard=config.shard, seed=config.seed, docs=config.docs, version=__version__
                    )
                )
            except OSError as exc:
                raise ConfigError(f"--docs-file: {exc}") from exc
            index = snapshots.load(key)
            if index is not None:
                self._metrics.from_snapshot.set(1)
                return index
        documents: list[Document]
        if config.docs_file is not None:
            try:
                documents = load_jsonl(config.docs_file)
            except (OSError, ValueError) as exc:
                raise ConfigError(f"--docs-file: {exc}") from exc
        else:
            documents = generate_documents(config.docs, shard=config.shard, seed=config.seed)
        index = InvertedIndex(documents)
        if snapshots is not None and key is not None:
            snapshots.save(key, index)
        return index

    def _instance(self) -> ServiceInstance:
        config = self.config
        assert self.index is not None
        assert self.port is not None
        return ServiceInstance.create(
            "data_servers",
            config.instance_id or f"ds-{config.advertise}-{self.port}",
            config.advertise,
            self.port,
            InstancePayload(
                shard=config.shard,
                replica=config.replica,
                docs=self.index.document_count,
                version=__version__,
                state=InstanceState.SERVING,
                zone=config.zone,
                weight=config.weight,
            ),
        )

    # -- HTTP --------------------------------------------------------------------

    def _make_app(self) -> web.Application:
        # JSON errors, 4xx counted on our registry; the edge sees each request arrive.
        app = json_app(self.registry, middlewares=[self._edge.middleware])
        app.router.add_get("/search", self.search)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", make_aiohttp_handler(self.registry))
        app.router.add_post("/admin/drain", self.admin_drain)
        app.router.add_post("/admin/offline", self.admin_offline)
        app.router.add_post("/admin/online", self.admin_online)
        app.router.add_post("/admin/fault", self.admin_fault)
        app.router.add_post("/admin/expire-session", self.admin_expire_session)
        app.router.add_get("/admin/status", self.admin_status)
        return app

    async def search(self, request: web.Request) -> web.Response:
        """``GET /search?q=&k=&timeout_ms=``: the top k, within the request's budget.

        The search runs in slices that yield to the loop (see :mod:`.searching`); when
        the budget (``timeout_ms`` clamped to ``--max-timeout-ms``, else
        ``--search-timeout-ms``) less its margin runs out it stops and answers with
        the best hits so far and ``"cut": true``. When it ran out before the search
        could start (an injected delay, a long queue): 504 with a JSON error. Bad
        parameters: 400 naming the parameter, first. Then, with
        ``--max-concurrent-searches`` searches in progress: 429 at once (a probe
        is never refused; see :mod:`.admission`).
        """
        arrived = time.monotonic()
        started = time.perf_counter()
        try:
            # The same rules as the search server's, which forwards q and k here.
            params = parse_search_params(
                request.query,
                max_k=MAX_K,
                default_timeout_ms=self.config.search_timeout_ms,
                max_timeout_ms=MAX_TIMEOUT_MS,
            )
        except BadRequestError:
            self._metrics.requests.labels(status="400").inc()
            raise  # json_errors answers 400 naming the parameter and counts it
        assert params.timeout_ms is not None
        # Past the search servers' own maximum no query waits for the answer: work no
        # longer than that, rather than refuse a client that asked for more.
        budget_ms = min(params.timeout_ms, self.config.max_timeout_ms)
        # The request waited in this loop, about its current lag, before this handler
        # ran: that time is spent too. Past a search server's deadline the answer helps
        # nobody, and an overloaded server searching for requests already given up
        # stays overloaded after the load has passed (the 504 below is cheap).
        # (Only a lag the monitor counts as one: a few milliseconds late is any busy
        # loop's noise, not a queue.)
        lag = self.loop_lag.last_lag
        deadline = work_deadline(
            arrived - (lag if lag > self.loop_lag.threshold else 0.0), budget_ms
        )
        # A probe is admitted even when the server is full, and not counted against the
        # cap; it still runs here, on the same loop, so a blocked loop still fails it.
        probe = request.headers.get(PROBE_HEADER) == PROBE_HEADER_VALUE
        if not self._admission.try_enter(priority=probe):
            return self._refuse_full()
        if budget_ms < params.timeout_ms:
            self._metrics.clamped.inc()
        try:
            if await self.faults.apply():
                return self._count(json_error(500, "injected error"))
            if time.monotonic() >= deadline:
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
            assert self.index is not None
            outcome = await run_search(
                self.index.start_search(params.q, params.k),
                deadline,
                on_slice=self._metrics.slice.observe,
            )
            if outcome.cut:
                self._metrics.cut.labels(answer="hits").inc()
            took = time.perf_counter() - started
            # took_ms and queue (the other searches in progress here) are the feedback
            # the search servers' adaptive replica selection ranks replicas by.
            body = orjson.dumps(
                {
                    "hits": [
                        {"id": hit.id, "score": hit.score, "title": hit.title}
                        for hit in outcome.hits
                    ],
                    "shard": self.config.shard,
                    "took_ms": round(took * 1000, 3),
                    "queue": self._admission.total - 1,
                    "cut": outcome.cut,
                }
            )
        finally:
            self._admission.leave(priority=probe)
        self._metrics.latency.observe(took)
        self._ok.inc()
        return web.Response(body=body, content_type="application/json")

    def _refuse_full(self) -> web.Response:
        """429 for a search arriving at a full server: at once, no search work done."""
        admission = self._admission
        self._full.inc()
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
        status = self.agent.status() if self.agent is not None else None
        ready = self.index is not None and status is not None and status.registered
        body = {"ready": ready, "agent": None if status is None else status.to_dict()}
        return web.json_response(body, status=200 if ready else 503)

    # -- admin -------------------------------------------------------------------

    def _refuse_admin(self, request: web.Request) -> web.Response | None:
        # The token when set, else loopback with the admin header; never a browser's
        # cross-site request (discovery.adminauth).
        return refuse_admin(request, self._admin_token)

    async def admin_drain(self, request: web.Request) -> web.Response:
        if (refused := self._refuse_admin(request)) is not None:
            return refused
        self.drain_requested.set()
        return web.json_response({"status": "draining"}, status=202)

    async def admin_offline(self, request: web.Request) -> web.Response:
        if (refused := self._refuse_admin(request)) is not None:
            return refused
        assert self.agent is not None
        await self.agent.atake_offline("admin")
        return web.json_response(self.agent.status().to_dict())

    async def admin_online(self, request: web.Request) -> web.Response:
        if (refused := self._refuse_admin(request)) is not None:
            return refused
        assert self.agent is not None
        await self.agent.abring_online()
        return web.json_response(self.agent.status().to_dict())

    async def admin_fault(self, request: web.Request) -> web.Response:
        if (refused := self._refuse_admin(request)) is not None:
            return refused
        # Both raise BadRequestError (FaultSpecError is one): json_errors answers 400
        # naming the field and counts it.
        fault = Fault.from_json(await read_json_body(request))
        self.faults.set(fault)
        log.warning("%s: fault set to %s", self.instance_id, fault.to_dict())
        return web.json_response({"fault": fault.to_dict()})

    async def admin_expire_session(self, request: web.Request) -> web.Response:
        """Fault injection for chaos runs: have ZooKeeper expire the agent's session.

        The node vanishes as if the server had been partitioned away past its session
        timeout; the agent must register again on its new session by itself.
        """
        if (refused := self._refuse_admin(request)) is not None:
            return refused
        assert self.agent is not None
        session = self.agent.session
        if session is None:
            raise ZkConnectionError("the agent has no ZooKeeper session to expire")
        # On the agent's loop, which owns the session.
        new_session = await self.agent.call(expire_session(session))
        log.warning("%s: ZooKeeper session expired on request", self.instance_id)
        return web.json_response({"session": f"0x{new_session:x}"})

    async def admin_status(self, request: web.Request) -> web.Response:
        if (refused := self._refuse_admin(request)) is not None:
            return refused
        status = self.agent.status() if self.agent is not None else None
        return web.json_response(
            {
                "id": self.instance_id,
                "port": self.port,
                "fault": self.faults.fault.to_dict(),
                "agent": None if status is None else status.to_dict(),
                "serving": status is not None and status.state is AgentState.SERVING,
            }
        )
