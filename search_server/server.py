"""One search server: election, the leader's publishing, the live list, the fan-out.

Every search server

* registers ``/search_servers/members/<id>`` (EPHEMERAL) for status and dashboards;
* joins the election (unless ``--no-leader-eligible``); while it leads, it watches
  ``/data_servers`` and publishes the live list (:class:`~discovery.leader.LeaderDuty`)
  to its live-list store, by default Redis with the publishing credentials
  (:class:`~discovery.livelist.redis.RedisLiveStore`); a leader that Redis refuses
  (credentials, ACL) resigns and stays out of the election for
  ``--leader-retry-pause`` seconds;
* follows the live list in the store (a :class:`~discovery.livelist.LiveListFollower`),
  the leader included, and routes queries with it;
* fans ``GET /search`` out to one live replica per shard under a deadline
  (:class:`~search_server.fanout.FanOut`).

Start-up listens first (so the id can default to the real port), then connects.
Shutdown (SIGTERM) drains: ``/readyz`` fails at once, the election is left (a successor
takes over while we still answer), queries are answered for ``--drain-grace`` seconds
more, then the listener closes and the queries in flight finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from importlib import resources
from typing import Any, Final

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler

from discovery import __version__
from discovery.address import NetworkPolicy
from discovery.errors import OverloadedError, RedisAccessError
from discovery.http import MAX_QUERY_LENGTH, json_app, json_error, parse_search_params
from discovery.httpedge import KEEPALIVE_TIMEOUT, HeaderGuard
from discovery.instance import InstancePayload, InstanceState, ServiceInstance
from discovery.leader import LeaderDuty
from discovery.livelist.model import LiveList, LiveListFollower, LiveListStore
from discovery.livelist.redis.store import RedisLiveStore
from discovery.looplag import LoopLagMonitor
from discovery.zk.acl import SEARCH_SERVER_ACCESS, check_access
from discovery.zk.election import LeaderElection, Leadership
from discovery.zk.paths import SEARCH_ELECTION_PATH, SEARCH_MEMBERS_PATH
from discovery.zk.registration import Registration
from discovery.zk.session import ZkSession

from .clusterview import ClusterViews, PageRequest, ViewQueryError
from .config import SearchServerConfig
from .dashboard import EventStream, MemberCache, QueryStats
from .fanout import FanOut
from .followroutes import FollowRoutes
from .heap import HeapFreezer
from .httpclient import HttpClient
from .metrics import QueryOfDeathMetrics
from .peers import Peers
from .picking import ReplicaPicker, make_picker
from .querydeath import Quarantine, QueryOfDeathGuard, normalise
from .retrybudget import RetryBudget
from .subsetting import DeterministicAperture
from .zkfallback import ZkFallback

__all__ = ["MAX_K", "MAX_QUERY_LENGTH", "SearchServer"]

log = logging.getLogger(__name__)

MAX_K = 1000


class SearchServer:
    """A search server. ``await start()``, later ``await shutdown()``.

    ``store`` is where the live list is published and read; by default a
    :class:`~discovery.livelist.redis.RedisLiveStore` on ``config.cluster`` that the server
    opens and closes itself, with the heartbeat TTL and reconcile interval of ``config``
    (a store passed in brings its own and stays the caller's to close). ``picker``
    chooses a replica per shard for the fan-out (default: the one ``config.picker``
    names, :class:`~search_server.picking.AdaptiveReplicaSelection` unless ``--picker
    p2c``); ``search_server.cli.main(picker=...)`` runs a search server with one of
    your own. Metrics go to ``registry`` (a fresh one if None).
    """

    def __init__(
        self,
        config: SearchServerConfig,
        *,
        registry: CollectorRegistry | None = None,
        store: LiveListStore | None = None,
        picker: ReplicaPicker | None = None,
    ) -> None:
        self.config = config
        self.registry = registry if registry is not None else CollectorRegistry()
        self._store = store
        self._picker = picker
        self.port: int | None = None
        self.server_id = config.server_id or ""
        self._runner: web.AppRunner | None = None
        self._stack = contextlib.AsyncExitStack()
        self.session: ZkSession | None = None
        self.election: LeaderElection | None = None
        self.reader: LiveListFollower | None = None
        self.fanout: FanOut | None = None
        self._fallback: ZkFallback | None = None
        self._routes: FollowRoutes | None = None
        self._duty: LeaderDuty | None = None
        # Re-joins the election after a leader resigned because Redis refused it.
        self._rejoin: asyncio.Task[None] | None = None
        #: Terms given up because Redis refused the publishing credentials or ACL.
        self.leader_refusals = 0
        self._stopped = False
        # The dashboard: queries of the last seconds, the search servers, the stream.
        self.query_stats = QueryStats()
        # /cluster and the dashboard: summary, problems and pages of the routing list.
        self._views = ClusterViews(self._describe)
        self._members = MemberCache(lambda: self.session)
        self._events = EventStream(
            self.dashboard_snapshot, registry=self.registry, max_streams=config.max_event_streams
        )
        # Bounds the time request headers take to arrive, and the connections waiting.
        self._edge = HeaderGuard(config.http, registry=self.registry)
        #: Refuses queries that fail on many shards every time (``--qod-*``).
        self.query_guard = QueryOfDeathGuard(
            config.query_of_death, clock=time.monotonic, on_quarantine=self._quarantined
        )
        self._qod_metrics = QueryOfDeathMetrics(self.registry)
        self._qod_metrics.quarantined.set_function(lambda: self.query_guard.quarantined)

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.config.host in ("0.0.0.0", "") else self.config.host
        return f"http://{host}:{self.port}"

    @property
    def routed(self) -> LiveList:
        """The live list the fan-out's routing table has followed last (empty before
        the first): a change is routed with once it shows here."""
        return self._routes.current if self._routes is not None else LiveList.EMPTY

    @property
    def is_leader(self) -> bool:
        return self.election is not None and self.election.is_leader

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        """Listen, connect to ZooKeeper and Redis, join the election.

        Raises:
            DiscoveryError: ZooKeeper unreachable (everything started is stopped again).
            OSError: the port is taken.
        """
        config = self.config
        runner = web.AppRunner(
            self._make_app(),
            access_log=None,
            handle_signals=False,
            # In-flight queries end by their deadline; nothing else is worth waiting
            # for (aiohttp's default would wait a minute for a stuck handler).
            shutdown_timeout=config.max_timeout_ms / 1000 + 1.0,
            keepalive_timeout=KEEPALIVE_TIMEOUT,
        )
        await runner.setup()
        self._runner = runner
        try:
            self.port = await self._edge.listen(runner, config.host, config.port)
            self.server_id = config.server_id or f"ss-{config.advertise}-{self.port}"
            await self._connect()
        except BaseException:
            await self.shutdown()
            raise
        log.info("search server %s listening on %s:%d", self.server_id, config.host, self.port)

    async def _connect(self) -> None:
        config, stack = self.config, self._stack
        self.session = await stack.enter_async_context(
            ZkSession.from_config(config.zk, registry=self.registry)
        )
        # A wrong --zk-auth password or a missing grant fails start-up, naming the cause.
        await check_access(self.session, SEARCH_SERVER_ACCESS)
        # Store outages are survivable (the follower keeps the last list), so a store
        # that cannot be reached yet is not a start-up failure. Refused credentials are
        # no start-up failure either: the follower logs them and keeps trying, since an
        # operator may fix the ACL on the Redis side without restarting us.
        store = self._store
        if store is None:
            # The leader publishes with credentials of its own (by default the reading
            # ones), so a cluster can give the other search servers a user that cannot
            # write. The publishing client connects only once we lead.
            store = RedisLiveStore.from_config(
                config.cluster,
                read_only=not config.leader_eligible,
                heartbeat_ttl=config.heartbeat_ttl,
                reconcile_interval=config.reconcile_interval,
                registry=self.registry,
            )
            stack.push_async_callback(store.aclose)
        self.reader = await stack.enter_async_context(store.follower())
        # The fan-out's client keeps keep-alive connections to the data servers (no
        # connection set-up on the query path), bounds their answers and connects to
        # a name only where --allowed-networks admits what it resolves to.
        client = HttpClient(max_body=config.max_answer_bytes, networks=config.allowed_networks)
        stack.push_async_callback(client.aclose)
        # How far behind this server's own loop is: its lateness is never blamed on a
        # data server (a timeout while it lagged charges no replica, sends no hedge).
        loop_lag = await stack.enter_async_context(LoopLagMonitor(registry=self.registry))
        self.fanout = FanOut(
            client,
            max_in_flight=config.max_in_flight,
            eject_after=config.eject_after,
            eject_cooldown=config.eject_cooldown,
            max_ejected_share=config.max_ejected_percent / 100,
            panic_threshold=config.panic_percent / 100,
            admission=config.concurrency_limit(),
            query_share=config.query_share(),
            loop_lag=loop_lag,
            registry=self.registry,
            picker=self._picker if self._picker is not None else make_picker(config.picker),
            zone=config.zone,
            hedge_ratio=config.hedge_percent / 100,
            networks=config.allowed_networks,
            retry_budget=RetryBudget(
                config.retry_budget_percent / 100,
                config.retry_budget_per_second,
                burst=max(100.0, 10 * config.retry_budget_per_second + 1),
            ),
            subsetter=DeterministicAperture(config.subset_size),
            shards=config.shards,
            slow_start=config.slow_start,
        )
        stack.push_async_callback(self.fanout.aclose)
        self._routes = await stack.enter_async_context(
            FollowRoutes(self.reader, self.fanout, self._views)
        )
        await stack.enter_async_context(
            Registration(self.session, self._member_instance(), base_path=SEARCH_MEMBERS_PATH)
        )
        if config.leader_eligible:
            self._duty = LeaderDuty(
                self.session,
                store,
                self.server_id,
                heartbeat_interval=config.heartbeat_interval,
                registry=self.registry,
                mass_loss=config.mass_loss,
                # Readers see the heartbeat run out after its TTL: by then a leader that
                # cannot write hands over, to a search server that perhaps can.
                store_grace=config.heartbeat_ttl,
                admit=_admission(config.allowed_networks),
                fence_recheck_max=config.fence_recheck_max,
            )
        await stack.enter_async_context(Peers(self.session, self.server_id, self.fanout))
        # The live list and routing table of a large fleet out of full collections.
        await stack.enter_async_context(
            HeapFreezer(above=config.heap_freeze_above, registry=self.registry)
        )
        if config.zk_fallback_after is not None:
            fallback = ZkFallback(self.session, self.reader, config.zk_fallback_after)
            await stack.enter_async_context(fallback)
            self._fallback = fallback
        if self._duty is None:
            log.info(
                "search server %s is not leader-eligible: it reads the live list and never "
                "joins the election",
                self.server_id,
            )
            return
        # Entered last, so left first on shutdown: a successor can take over while
        # this server still answers queries.
        self.election = await stack.enter_async_context(self._new_election())

    def _new_election(self) -> LeaderElection:
        assert self.session is not None
        return LeaderElection(self.session, SEARCH_ELECTION_PATH, self.server_id, self._lead)

    async def _lead(self, leadership: Leadership) -> None:
        """One term of leadership; if Redis refuses to let us publish, resign for a while.

        Refused credentials or a missing ACL permission do not pass by retrying, and a
        leader that kept its term would hold the election while publishing nothing. So
        the term ends at once (a search server whose credentials work can take over),
        we stay out of the election for ``leader_retry_pause`` seconds (time for an
        operator to fix the ACL, and no hot loop of winning and failing) and then
        contend again.
        """
        duty = self._duty
        assert duty is not None
        try:
            await duty(leadership)
        except RedisAccessError as exc:
            self.leader_refusals += 1
            log.error(
                "leader %s (epoch %d): Redis refused to let it publish the live list: %s. "
                "Resigning; contending again in %g s (fix the publishing credentials, "
                "--redis-publish-username/--redis-publish-password, or the Redis ACL; "
                "a server that must not publish should run with --no-leader-eligible)",
                self.server_id,
                leadership.epoch,
                exc,
                self.config.leader_retry_pause,
            )
            if self._rejoin is None or self._rejoin.done():
                self._rejoin = asyncio.create_task(
                    self._rejoin_election_later(), name=f"rejoin-election:{self.server_id}"
                )

    async def _rejoin_election_later(self) -> None:
        """Leave the election now and join it again after ``leader_retry_pause``."""
        try:
            election = self.election
            if election is not None:
                # Deletes our election node at once, so another contender leads meanwhile.
                await election.aclose()
            # A back-off between attempts, not a synchronisation: nothing signals that
            # the operator has fixed the credentials.
            await asyncio.sleep(self.config.leader_retry_pause)
            if self._stopped:
                return
            election = self._new_election()
            await election.start()
            self.election = election
            log.info("search server %s contends for leadership again", self.server_id)
        except Exception:
            # Not fatal for the server: it keeps reading and serving, only never leads.
            log.exception("search server %s could not re-join the election", self.server_id)

    async def shutdown(self, grace: float = 0.0) -> None:
        """Drain, leave the election, stop serving, close everything. Idempotent.

        The graceful stop of a rolling restart (SIGTERM: ``--drain-grace``): ``/readyz``
        answers 503 at once, so a load balancer takes this server out; leadership is
        handed over meanwhile; queries are still answered for ``grace`` seconds (those
        a load balancer sends before its health check notices); then the server stops
        accepting connections and finishes the queries in flight (their fan-out still
        needs the HTTP pool) before the rest is closed.
        """
        if self._stopped:
            return
        self._stopped = True
        loop = asyncio.get_running_loop()
        draining_since = loop.time()
        if grace > 0:
            log.info("search server %s draining (grace %g s)", self.server_id, grace)
        if self._rejoin is not None:
            self._rejoin.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._rejoin
        if self.election is not None:
            await self.election.aclose()
        # A deadline, not a synchronisation: how long the load balancer may still send.
        await asyncio.sleep(max(0.0, draining_since + grace - loop.time()))
        if self._runner is not None:
            self._edge.close()  # stops accepting, as the runner's sites would
            await self._runner.cleanup()  # its on_shutdown ends the dashboard streams
        await self._stack.aclose()
        await self._members.aclose()
        log.info("search server %s stopped", self.server_id)

    def _member_instance(self) -> ServiceInstance:
        assert self.port is not None
        return ServiceInstance.create(
            "search_servers",
            self.server_id,
            self.config.advertise,
            self.port,
            InstancePayload(
                shard=0, replica=0, docs=0, version=__version__, state=InstanceState.SERVING
            ),
        )

    # -- HTTP --------------------------------------------------------------------

    def _make_app(self) -> web.Application:
        # JSON errors, 4xx counted on our registry; the edge sees each request arrive.
        app = json_app(self.registry, middlewares=[self._edge.middleware])
        app.router.add_get("/search", self.search)
        app.router.add_get("/cluster", self.cluster)
        app.router.add_get("/", self.dashboard)
        app.router.add_get("/events", self._events.handle)
        app.router.add_get("/metrics", make_aiohttp_handler(self.registry))
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        # Open dashboard streams end first, so the runner's cleanup never waits for them.
        app.on_shutdown.append(self._events.close)
        return app

    async def search(self, request: web.Request) -> web.Response:
        # Raises BadRequestError, which json_errors answers with 400 and counts. The
        # same rules as the data servers': a query we forward must never be refused
        # there, since a refusal counts as the data server failing.
        params = parse_search_params(
            request.query,
            max_k=MAX_K,
            default_timeout_ms=self.config.default_timeout_ms,
            max_timeout_ms=self.config.max_timeout_ms,
        )
        query, k, timeout_ms = params.q, params.k, params.timeout_ms
        assert timeout_ms is not None  # asked for with max_timeout_ms
        if self.reader is None or self.fanout is None:
            return json_error(503, "starting")
        servers = self._routing_list()
        if servers is None:
            return json_error(503, "no live list yet")
        key = normalise(query)
        quarantine = self.query_guard.check(key)
        if quarantine is not None:
            return self._refuse_query_of_death(quarantine)
        try:
            result = await self.fanout.search(servers, query, k, timeout_ms, key=key)
        except OverloadedError as exc:
            self.query_stats.record_overloaded()
            # Shed at once, before any work: the client may retry, here in a moment or
            # on another search server (a load balancer's cue, as a data server's 429).
            refused = json_error(503, f"overloaded: {exc}")
            refused.headers["Retry-After"] = "1"
            return refused
        shards = result.shards
        # A missing shard is no fault of the query: only the shards asked count.
        self.query_guard.record(
            key,
            shards["total"] - shards.get("missing", 0),
            shards["failed"] + shards["timed_out"] + shards.get("cut", 0),
        )
        coverage = result.coverage
        if coverage is None:
            self.query_stats.record(result.took_ms, result.partial)
        else:
            self.query_stats.record(
                result.took_ms, result.partial, coverage.ratio, coverage.missing
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

    def _quarantined(self, key: str, quarantine: Quarantine) -> None:
        self._qod_metrics.quarantines.inc()
        log.warning(
            "query of death: refusing %r for %.0f s (%d strikes; the last failed on %d of "
            "%d shards)",
            key[:120],
            quarantine.until - time.monotonic(),
            quarantine.strikes,
            quarantine.bad_shards,
            quarantine.total_shards,
        )

    def _routing_list(self) -> Mapping[str, ServiceInstance] | None:
        """The servers to route with: the live list, or the ZooKeeper fallback's view.

        The same (immutable) mapping until the list changes, so that the fan-out keeps
        its routing table between queries: the list the table was moved to change by
        change (:class:`FollowRoutes`), or else (for the moment before it has one) the
        follower's, for which the fan-out builds its table in full.
        """
        if self._fallback is not None and self._fallback.active:
            return self._fallback.members
        if self._routes is not None and self._routes.current.version > 0:
            return self._routes.current.servers
        if self.reader is None or self.reader.current.version == 0:
            return None
        return self.reader.current.servers

    async def cluster(self, request: web.Request) -> web.Response:
        try:
            page = PageRequest.from_query(request.query)
        except ViewQueryError as exc:
            return json_error(400, str(exc), parameter=exc.parameter)
        return web.json_response(self.cluster_view(page))

    def _describe(self, instance: ServiceInstance, ejected: bool) -> dict[str, Any]:
        """A server's entry on a ``/cluster`` page: its registration and what this
        search server's fan-out learned of it (nothing before it routed to it)."""
        payload = instance.payload
        entry: dict[str, Any] = {
            "id": instance.id,
            "address": instance.address,
            "port": instance.port,
            "shard": payload.shard,
            "replica": payload.replica,
            "zone": payload.zone,
            "weight": payload.weight,
            "state": payload.state.value,
            "enabled": instance.enabled,
            "ejected": ejected,
        }
        if payload.reason:  # why it is draining or in maintenance
            entry["reason"] = payload.reason
        replica = self.fanout.replica(instance) if self.fanout is not None else None
        if replica is not None:
            entry["sent"] = replica.sent  # hedges included
            entry["answers"] = replica.samples
            entry["in_flight"] = replica.outstanding
            entry["latency_ms"] = round(replica.seconds * 1000, 3)
        return entry

    def cluster_view(
        self, page: PageRequest | None = None, *, grid: bool = False
    ) -> dict[str, Any]:
        """What ``GET /cluster`` answers: whose list this server routes with, its
        summary and problems, and one ``page`` of its servers (every server of a
        cluster of up to 1,000; :mod:`search_server.clusterview`)."""
        reader = self.reader
        live = reader.current if reader is not None else None
        fanout = self.fanout
        ejected = fanout.ejected() if fanout is not None else set()
        expected = fanout.expected_shards if fanout is not None else ()
        brake = self._duty.brake_status() if self._duty is not None else None
        view = {
            "self": self.server_id,
            "is_leader": self.is_leader,
            "leader": live.leader if live is not None else None,
            "epoch": live.epoch if live is not None else 0,
            "version": live.version if live is not None else 0,
            "published_at": live.published_at if live is not None else None,
            "applied_at_ms": (
                round(reader.applied_at * 1000, 3)
                if reader is not None and reader.applied_at is not None
                else None
            ),
            "age_ms": round(reader.age() * 1000) if reader is not None else None,
            "redis_connected": reader.connected if reader is not None else False,
            "source": "zookeeper"
            if self._fallback is not None and self._fallback.active
            else "redis",
            "now_ms": int(time.time() * 1000),
            # Only the leader runs the brake: null on the other search servers.
            "mass_loss_brake": brake.to_dict() if brake is not None else None,
            # True while this leader holds its term over an epoch no leader can hold.
            "fence_poisoned": self._duty is not None and self._duty.fence_poisoned,
            # Which slice of each shard's replicas this server routes to (subsetting).
            "subsets": {
                "size": self.config.subset_size,
                "rank": fanout.position.rank if fanout is not None else 0,
                "count": fanout.position.count if fanout is not None else 1,
            },
        }
        view.update(
            self._views.view(
                self._routing_list() or {}, ejected, expected, page or PageRequest(), grid=grid
            )
        )
        return view

    async def dashboard(self, request: web.Request) -> web.Response:
        page = resources.files("search_server").joinpath("dashboard.html").read_text("utf-8")
        return web.Response(text=page, content_type="text/html")

    async def dashboard_snapshot(self) -> dict[str, Any]:
        """One event of ``GET /events``: :meth:`cluster_view` plus ``cluster``,
        ``stale_after_ms``, ``search_servers`` (leader and self marked) and ``stats``."""
        # A summary, the shard grid, the problems and at most a page of servers: the
        # same few hundred KB at 50,000 data servers as at 500.
        view = self.cluster_view(PageRequest(limit=_DASHBOARD_SERVERS), grid=True)
        members = await self._members.get()
        for member in members:
            member["leader"] = member["id"] == view["leader"]
            member["self"] = member["id"] == self.server_id
        view["cluster"] = self.config.cluster.cluster
        # The list's age is reset by events and by the reconciler: with a quiet leader
        # it grows to reconcile_interval while all is well. Beyond that, it is stale.
        view["stale_after_ms"] = round(max(5.0, self.config.reconcile_interval + 5.0) * 1000)
        view["search_servers"] = members
        view["search_servers_stale"] = self._members.stale
        view["stats"] = self.query_stats.snapshot()
        return view

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(self, request: web.Request) -> web.Response:
        reader = self.reader
        draining = self._stopped
        ready = reader is not None and reader.current.version > 0 and not draining
        body: dict[str, object] = {
            "ready": ready,
            "version": reader.current.version if reader else 0,
        }
        if draining:
            body["draining"] = True
        return web.json_response(body, status=200 if ready else 503)


#: Servers the dashboard shows as tiles; a larger cluster is shown as a grid of shards
#: (each shard's replicas a click away, ``GET /cluster?shard=N``).
_DASHBOARD_SERVERS: Final = 200


def _admission(networks: NetworkPolicy) -> Callable[[ServiceInstance], str | None] | None:
    """The leader's rule for ``--allowed-networks``: an IP address outside them is skipped
    and counted as ``not_allowed`` (a name is judged where it is resolved: the fan-out)."""
    if not networks.narrows:
        return None

    def admit(instance: ServiceInstance) -> str | None:
        problem = networks.problem(instance.address)
        return None if problem is None else f"not_allowed: {problem}"

    return admit
