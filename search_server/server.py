"""One search server: the wiring and the life cycle of its parts.

:class:`SearchServer` listens first, then connects (ZooKeeper, the live-list store and
its follower, the fan-out, its membership node, the election); on stop it drains
(``/readyz`` fails at once, the election is left, queries are answered for
``--drain-grace``, then the queries in flight finish). The HTTP API is :mod:`.handlers`,
the election :mod:`.leadership`.

Design: docs/design/search-server.md, "The search server".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from discovery import __version__
from discovery.http import MAX_QUERY_LENGTH, json_app
from discovery.httpedge import KEEPALIVE_TIMEOUT, HeaderGuard
from discovery.instance import InstancePayload, InstanceState, ServiceInstance
from discovery.livelist.model import LiveList, LiveListFollower, LiveListStore
from discovery.livelist.open import open_store
from discovery.looplag import LoopLagMonitor
from discovery.zk.acl import SEARCH_SERVER_ACCESS, check_access
from discovery.zk.election import LeaderElection
from discovery.zk.paths import SEARCH_MEMBERS_PATH
from discovery.zk.registration import Registration
from discovery.zk.session import ZkSession

from .clusterstatus import ClusterStatus
from .clusterview import PageRequest
from .config import SearchServerConfig
from .dashboard import EventStream, MemberCache, QueryStats
from .fanout import FanOut, FanOutConfig
from .followroutes import FollowRoutes
from .handlers import MAX_K, SearchHandlers
from .heap import HeapFreezer
from .httpclient import HttpClient
from .leadership import LeaderRole
from .metrics import QueryOfDeathMetrics
from .parts import ServerParts
from .peers import Peers
from .picking import ReplicaPicker, make_picker
from .querydeath import Quarantine, QueryOfDeathGuard
from .retrybudget import RetryBudget
from .subsetting import DeterministicAperture
from .zkfallback import ZkFallback

__all__ = ["MAX_K", "MAX_QUERY_LENGTH", "SearchServer"]

log = logging.getLogger(__name__)


class SearchServer:
    """A search server. ``await start()``, later ``await shutdown()``.

    ``store`` is where the live list is published and read; by default the store
    ``config.cluster``'s URL names (:func:`~discovery.livelist.open_store`), which the
    server opens and closes itself, with the heartbeat TTL and reconcile interval of
    ``config`` (a store passed in brings its own and stays the caller's to close). ``picker``
    chooses a replica per shard for the fan-out (default: the one ``config.picker``
    names, :class:`~search_server.picking.AdaptiveReplicaSelection` unless ``--picker
    p2c`` or ``wrr``); ``search_server.cli.main(picker=...)`` runs a search server with one of
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
        # What start-up builds, shared with the handlers (they answer "starting" till then).
        self._parts = ServerParts(config.server_id or "")
        self._runner: web.AppRunner | None = None
        self._stack = contextlib.AsyncExitStack()
        self.session: ZkSession | None = None
        # The dashboard: queries of the last seconds, the search servers, the stream.
        self.query_stats = QueryStats()
        self._members = MemberCache(lambda: self.session)
        self._status = ClusterStatus(
            config, self._parts, members=self._members, query_stats=self.query_stats
        )
        self._events = EventStream(
            self._status.dashboard_snapshot,
            registry=self.registry,
            max_streams=config.max_event_streams,
        )
        # Bounds the time request headers take to arrive, and the connections waiting.
        self._edge = HeaderGuard(config.http, registry=self.registry)
        #: Refuses queries that fail on many shards every time (``--qod-*``).
        self.query_guard = QueryOfDeathGuard(
            config.query_of_death, clock=time.monotonic, on_quarantine=self._quarantined
        )
        self._qod_metrics = QueryOfDeathMetrics(self.registry)
        self._qod_metrics.quarantined.set_function(lambda: self.query_guard.quarantined)
        self._handlers = SearchHandlers(
            config,
            self._parts,
            status=self._status,
            events=self._events,
            query_guard=self.query_guard,
            query_stats=self.query_stats,
            qod_metrics=self._qod_metrics,
            registry=self.registry,
        )

    # The id, the follower and the fan-out are kept in the parts the handlers share;
    # start-up sets them here as it builds them.

    @property
    def server_id(self) -> str:
        return self._parts.server_id

    @server_id.setter
    def server_id(self, server_id: str) -> None:
        self._parts.server_id = server_id

    @property
    def reader(self) -> LiveListFollower | None:
        return self._parts.reader

    @reader.setter
    def reader(self, reader: LiveListFollower | None) -> None:
        self._parts.reader = reader

    @property
    def fanout(self) -> FanOut | None:
        return self._parts.fanout

    @fanout.setter
    def fanout(self, fanout: FanOut | None) -> None:
        self._parts.fanout = fanout

    @property
    def election(self) -> LeaderElection | None:
        """The election this server takes part in (None if it is not leader-eligible)."""
        leader = self._parts.leader
        return leader.election if leader is not None else None

    @property
    def leader_refusals(self) -> int:
        """Terms given up because the store refused the publishing credentials or ACL."""
        leader = self._parts.leader
        return leader.refusals if leader is not None else 0

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.config.host in ("0.0.0.0", "") else self.config.host
        return f"http://{host}:{self.port}"

    @property
    def routed(self) -> LiveList:
        """The live list the fan-out's routing table has followed last (empty before
        the first): a change is routed with once it shows here."""
        return self._parts.routed

    @property
    def is_leader(self) -> bool:
        return self._parts.is_leader

    def cluster_view(
        self, page: PageRequest | None = None, *, grid: bool = False
    ) -> dict[str, Any]:
        """What ``GET /cluster`` answers (see :class:`~search_server.clusterstatus.
        ClusterStatus`)."""
        return self._status.cluster_view(page, grid=grid)

    async def dashboard_snapshot(self) -> dict[str, Any]:
        """One event of ``GET /events`` (see :class:`~search_server.clusterstatus.
        ClusterStatus`)."""
        return await self._status.dashboard_snapshot()

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        """Listen, connect to ZooKeeper and the live-list store, join the election.

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
        # operator may fix the ACL on the store's side without restarting us.
        store = self._store
        if store is None:
            # The leader publishes with credentials of its own (by default the reading
            # ones), so a cluster can give the other search servers a user that cannot
            # write. The publishing client connects only once we lead.
            store = open_store(
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
        # a name only where --allowed-networks admits what it resolves to (and to
        # loopback only if this server listens there: config.data_networks).
        client = HttpClient(max_body=config.max_answer_bytes, networks=config.data_networks)
        stack.push_async_callback(client.aclose)
        # How far behind this server's own loop is: its lateness is never blamed on a
        # data server (a timeout while it lagged charges no replica, sends no hedge).
        loop_lag = await stack.enter_async_context(LoopLagMonitor(registry=self.registry))
        # The fan-out's clock, which the picker must share: --picker wrr judges the age
        # of the load reports the fan-out times on it.
        clock = time.monotonic
        picker = self._picker
        if picker is None:
            picker = make_picker(config.picker, clock=clock, wrr=config.wrr)
        self.fanout = FanOut(
            client,
            config=FanOutConfig(
                max_in_flight=config.max_in_flight,
                eject_after=config.eject_after,
                eject_cooldown=config.eject_cooldown,
                max_ejected_share=config.max_ejected_percent / 100,
                panic_threshold=config.panic_percent / 100,
                min_group_coverage=config.min_group_coverage_percent / 100,
                demote_ratio=config.demote_ratio,
                demote_floor=config.demote_floor_ms / 1000,
                demote_probe_interval=config.demote_probe_interval,
                zone=config.zone,
                hedge_ratio=config.hedge_percent / 100,
                topk_probability=config.topk_probability,
                topk_second_round=config.topk_second_round,
                networks=config.data_networks,
                shards=config.shards,
                forget_missing_shard_after=config.forget_missing_shard_after,
                slow_start=config.slow_start,
                coverage=config.coverage,
            ),
            admission=config.concurrency_limit(),
            query_share=config.query_share(),
            loop_lag=loop_lag,
            registry=self.registry,
            clock=clock,
            picker=picker,
            retry_budget=RetryBudget(
                config.retry_budget_percent / 100,
                config.retry_budget_per_second,
                burst=max(100.0, 10 * config.retry_budget_per_second + 1),
            ),
            subsetter=DeterministicAperture(config.subset_size),
        )
        stack.push_async_callback(self.fanout.aclose)
        self._parts.routes = await stack.enter_async_context(
            FollowRoutes(self.reader, self.fanout, self._status.views)
        )
        await stack.enter_async_context(
            Registration(self.session, self._member_instance(), base_path=SEARCH_MEMBERS_PATH)
        )
        if config.leader_eligible:
            self._parts.leader = LeaderRole.from_config(
                config, self.session, store, self.server_id, registry=self.registry
            )
        await stack.enter_async_context(Peers(self.session, self.server_id, self.fanout))
        # The live list and routing table of a large fleet out of full collections.
        await stack.enter_async_context(
            HeapFreezer(above=config.heap_freeze_above, registry=self.registry)
        )
        if config.zk_fallback_after is not None:
            fallback = ZkFallback(
                self.session,
                self.reader,
                config.zk_fallback_after,
                allow_persistent_members=config.allow_persistent_members,
            )
            await stack.enter_async_context(fallback)
            self._parts.fallback = fallback
        if self._parts.leader is None:
            log.info(
                "search server %s is not leader-eligible: it reads the live list and never "
                "joins the election",
                self.server_id,
            )
            return
        # Entered last, so left first on shutdown: a successor can take over while
        # this server still answers queries.
        await stack.enter_async_context(self._parts.leader)

    async def shutdown(self, grace: float = 0.0) -> None:
        """Drain, leave the election, stop serving, close everything. Idempotent.

        The graceful stop of a rolling restart (SIGTERM: ``--drain-grace``): ``/readyz``
        answers 503 at once, so a load balancer takes this server out; leadership is
        handed over meanwhile; queries are still answered for ``grace`` seconds (those
        a load balancer sends before its health check notices); then the server stops
        accepting connections and finishes the queries in flight (their fan-out still
        needs the HTTP pool) before the rest is closed.
        """
        if self._parts.draining:
            return
        self._parts.draining = True
        loop = asyncio.get_running_loop()
        draining_since = loop.time()
        if grace > 0:
            log.info("search server %s draining (grace %g s)", self.server_id, grace)
        if self._parts.leader is not None:
            await self._parts.leader.leave()
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

    def _make_app(self) -> web.Application:
        # JSON errors, 4xx counted on our registry; the edge sees each request arrive.
        app = json_app(self.registry, middlewares=[self._edge.middleware])
        app.add_routes(self._handlers.routes())
        # Open dashboard streams end first, so the runner's cleanup never waits for them.
        app.on_shutdown.append(self._events.close)
        return app

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
