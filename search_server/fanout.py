"""Fan a query out to one replica of every shard, under one deadline (:class:`FanOut`).

The fan-out keeps what outlives a query; each query's own state and steps are a
:class:`~search_server.query.Query`. A hung data server costs a query at most its
deadline; a query over the in-flight limit is refused at once, never queued. Runs on
the caller's event loop; not thread-safe.

Design: docs/design/search-server.md, "The fan-out".
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Collection, Iterable, Mapping

from prometheus_client import CollectorRegistry

from discovery.address import NetworkPolicy
from discovery.errors import OverloadedError
from discovery.instance import ServiceInstance
from discovery.livelist.model import LiveListChange
from discovery.looplag import LoopLagMonitor

from .admission import ConcurrencyLimit, FixedLimit
from .blame import OwnLoad, TimeoutBlame
from .candidates import Candidates
from .coverage import CoveragePolicy, late_shards
from .demotion import LatencyDemotion
from .ejection import OutlierEjection
from .fanoutconfig import OVERLOAD_BACKOFF, PANIC_THRESHOLD, STALL_GRACE, FanOutConfig
from .groups import GroupTable
from .hedging import HedgePolicy
from .httpclient import HttpClient, SubrequestClient
from .merging import FanOutResult
from .metrics import FanOutMetrics
from .picking import AdaptiveReplicaSelection, Replica, ReplicaPicker
from .query import Query, QueryContext, Timer
from .queryshare import QueryShare
from .replicahealth import ReplicaHealth
from .retrybudget import RetryBudget
from .shardrouting import ShardRouting
from .slowstart import Ramps
from .subsetting import DeterministicAperture, Position, Subsetter

# FanOutResult is what FanOut.search returns: importable with it; the constants are the
# defaults of FanOutConfig's fields of those names.
__all__ = [
    "OVERLOAD_BACKOFF",
    "PANIC_THRESHOLD",
    "STALL_GRACE",
    "FanOut",
    "FanOutConfig",
    "FanOutResult",
    "Timer",
]


class FanOut:
    """Fans queries out to the data servers and merges their hits.

    ``config`` holds the settings (:class:`~search_server.fanoutconfig.FanOutConfig`,
    its defaults if ``None``); the rest are collaborators. ``client`` sends the
    sub-requests (default: an :class:`~search_server.httpclient.HttpClient` of the
    fan-out's own, closed by :meth:`aclose`; a client passed in stays the caller's to
    close). ``clock`` times ejections, backoffs and slow start (tests may advance it);
    ``timer`` the queries' deadlines and hedges (default: the running event loop; a
    test may pass its own to fire them without waiting). ``picker`` chooses among a
    shard's candidates (default :class:`~search_server.picking.AdaptiveReplicaSelection`;
    read at each query's start). ``retry_budget`` is what retries and hedges together
    draw on (default: a :class:`~search_server.retrybudget.RetryBudget` of 10 % of first
    requests plus 10 a second, on ``clock``). ``subsetter`` chooses the replicas of a shard this
    search server routes to, given its :attr:`position` among the search servers
    (default: a :class:`~search_server.subsetting.DeterministicAperture` of 8; at the
    default position, one search server of one, every replica). ``rng`` flips the
    coins of subsets' edge replicas. ``loop_lag`` tells this server's own lateness,
    never blamed on a data server. ``admission`` is the in-flight limit (default:
    ``config.max_in_flight``, fixed) and ``query_share`` how much of it the queries of
    one key may hold (default: a :class:`~search_server.queryshare.QueryShare` of half;
    only for queries given a key). Metrics go to ``registry`` (a fresh one if ``None``).

    Raises ``ValueError`` for ejection or hedging settings out of range (the config
    checks the others when it is made).
    """

    def __init__(
        self,
        client: SubrequestClient | None = None,
        *,
        config: FanOutConfig | None = None,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
        timer: Timer | None = None,
        picker: ReplicaPicker | None = None,
        retry_budget: RetryBudget | None = None,
        subsetter: Subsetter | None = None,
        rng: random.Random | None = None,
        loop_lag: LoopLagMonitor | None = None,
        admission: ConcurrencyLimit | None = None,
        query_share: QueryShare | None = None,
    ) -> None:
        self.config = config = config if config is not None else FanOutConfig()
        ejection = OutlierEjection(
            eject_after=config.eject_after,
            eject_cooldown=config.eject_cooldown,
            max_ejected_share=config.max_ejected_share,
            probe_interval=config.probe_interval,
        )
        hedging = HedgePolicy(config.hedge_ratio, config.hedge_burst)
        self._owns_client = client is None
        self._client: SubrequestClient = client if client is not None else HttpClient()
        # How many queries may be in flight now (never more than max_in_flight): by
        # default the fixed max_in_flight; the search server passes a GradientLimit.
        self._admission: ConcurrencyLimit = (
            admission if admission is not None else FixedLimit(config.max_in_flight)
        )
        # How much of the limit one query (by the key given to search) may hold.
        self._query_share = query_share if query_share is not None else QueryShare()
        self._in_flight = 0
        self._clock = clock
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = metrics = FanOutMetrics(self.registry)
        metrics.admission_limit.set(self._admission.limit)
        self.picker: ReplicaPicker = picker if picker is not None else AdaptiveReplicaSelection()
        self.retry_budget = retry_budget if retry_budget is not None else RetryBudget(clock=clock)
        self._routing = routing = ShardRouting(
            clock=clock,
            networks=config.networks,
            subsetter=subsetter if subsetter is not None else DeterministicAperture(),
            ramps=Ramps(config.slow_start),
            metrics=metrics,
            shards=config.shards,
            forget_missing_shard_after=config.forget_missing_shard_after,
            min_group_coverage=config.min_group_coverage,
        )
        self._health = health = ReplicaHealth(
            ejection,
            clock=clock,
            metrics=metrics,
            answered=lambda: routing.answered,
            panic_threshold=config.panic_threshold,
            overload_backoff=config.overload_backoff,
            # A replica group's coverage counts its replicas not ejected.
            on_ejection=routing.groups.ejection_changed,
        )
        self._own = own = OwnLoad(clock, loop_lag)
        demotion = LatencyDemotion(
            ratio=config.demote_ratio,
            floor=config.demote_floor,
            probe_interval=config.demote_probe_interval,
            # Judged once warmed up: the first answers of a cold connection say little
            # of a replica's speed.
            min_samples=max(1, config.warmup_samples),
            metrics=metrics,
        )
        self._queries = QueryContext(
            client=self._client,
            candidates=Candidates(
                routing,
                health,
                zone=config.zone,
                warmup=config.warmup_samples,
                rng=rng if rng is not None else random.Random(),
                demotion=demotion,
            ),
            health=health,
            blame=TimeoutBlame(
                own,
                clock=clock,
                metrics=metrics,
                routable=lambda: routing.routable,
                stall_grace=config.stall_grace,
            ),
            own=own,
            hedging=hedging,
            retry_budget=self.retry_budget,
            metrics=metrics,
            clock=clock,
            timer=timer,
            demotion=demotion if demotion.enabled else None,
        )

    async def aclose(self) -> None:
        """Close the sub-request client if the fan-out made it."""
        if self._owns_client:
            await self._client.aclose()

    @property
    def in_flight(self) -> int:
        """Queries currently admitted and not finished."""
        return self._in_flight

    @property
    def max_in_flight(self) -> int:
        return self.config.max_in_flight

    @property
    def zone(self) -> str | None:
        """This search server's zone (``config.zone``)."""
        return self.config.zone

    @property
    def networks(self) -> NetworkPolicy:
        """The networks data servers are routed to in (``config.networks``)."""
        return self.config.networks

    @property
    def admission(self) -> ConcurrencyLimit:
        """The in-flight limit this fan-out admits queries under."""
        return self._admission

    @property
    def routing(self) -> ShardRouting:
        """This fan-out's routing: its table, its shards' subsets, the expected shards."""
        return self._routing

    def replica(self, instance: ServiceInstance) -> Replica | None:
        """What this fan-out knows of ``instance`` (``None`` before it routed to it)."""
        return self._routing.replica(instance)

    @property
    def expected_shards(self) -> Collection[int]:
        """The shards this fan-out expects an answer from: ``shards`` (0 to N-1) given
        at construction and every shard it has routed to since. A shard among them with
        no replica left is *missing* from an answer, never dropped from its total."""
        return self._routing.expected_shards

    def groups(self) -> GroupTable:
        """The replica groups as of now (coverage and rotation judged afresh, the
        routes of shards changed since the last query made: ``O(shards)``)."""
        return self._routing.refresh_groups()

    def ejected(self) -> set[str]:
        """Instance ids of the data servers currently ejected (skipped) by this fan-out."""
        return {r.instance.id for r in self._health.ejected()}

    def follow(self, change: LiveListChange) -> None:
        """Move the routing table along ``change`` of the live list (see
        :class:`~search_server.routing.RoutingTable`): by its delta, O(servers of the
        shards it touches), when the table holds ``change.previous``. A later
        :meth:`search` of ``change.current.servers`` then routes with it as it is.
        """
        self._routing.follow(change)

    @property
    def position(self) -> Position:
        """This search server's place among the search servers, which its subsets
        follow (one of one until :meth:`set_position`)."""
        return self._routing.position

    def set_position(self, position: Position) -> None:
        """Route with the subsets of ``position`` from the next query on (each shard's
        subset is made again at its next query; queries in flight keep theirs)."""
        self._routing.set_position(position)

    async def search(
        self,
        servers: Iterable[ServiceInstance] | Mapping[str, ServiceInstance],
        query: str,
        k: int,
        timeout_ms: int,
        *,
        key: str | None = None,
        coverage: CoveragePolicy | None = None,
        topk_probability: float | None = None,
    ) -> FanOutResult:
        """Search every shard of ``servers`` for ``query``; merge the top ``k`` hits.

        ``servers`` is the live list (instances, or a mapping of ids to instances);
        instances that are not ``routable`` (draining, disabled, in maintenance) get no
        first request (a draining one may get a request of last resort once its shard's
        routable replicas have all been tried or are ejected: docs/design/search-server.md,
        "Replicas: picked, draining as a last resort"). Passing the same object again (an
        unchanged live list) reuses the routing table built for it, so do not mutate it
        in between. Returns within ``timeout_ms`` (plus a loop iteration): shards that
        failed or had no answer by then are counted in the result, which is then
        ``partial``; they never raise.
        ``key`` (the query's normalised terms) puts it under the query share
        (:mod:`.queryshare`): queries of one key hold at most a share of the limit while
        others ask. ``coverage`` is the query's coverage policy (None: ``config.coverage``):
        once enough of the corpus has answered, it may stop waiting for the rest before
        the deadline (:mod:`.coverage`). ``topk_probability`` (None:
        ``config.topk_probability``) is how sure the merged top ``k`` must be of being
        exact: each shard is asked for fewer hits than ``k`` as it allows (:mod:`.topk`;
        1: ``k`` of every shard, exact); with ``config.topk_second_round`` the shards
        that may have left a hit out are asked again for ``k`` while time is left.

        Raises:
            OverloadedError: the in-flight limit is reached, or ``key``'s share of it
                (raised before anything is sent; the query is not queued).
            ValueError: ``k`` or ``timeout_ms`` below 1, or ``topk_probability`` outside
                (0, 1].
        """
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if timeout_ms < 1:
            raise ValueError(f"timeout_ms must be >= 1, got {timeout_ms}")
        if topk_probability is None:
            topk_probability = self.config.topk_probability
        elif not 0 < topk_probability <= 1:
            raise ValueError(f"topk_probability must be > 0 and <= 1, got {topk_probability}")
        # No await before this check and the increment: admission is atomic on the loop.
        limit = min(self._admission.limit, self.config.max_in_flight)
        share = self._query_share
        if key is not None and not share.admits(key, limit, self._clock()):
            # Not the server's overload (no hedging pause): one query asked too often.
            self.metrics.queries.labels(outcome="overloaded").inc()
            self.metrics.shed_share.inc()
            raise OverloadedError(
                f"this query already has {share.held(key)} of the {limit} queries in "
                "flight, its share while others ask"
            )
        if self._in_flight >= limit:
            self.metrics.queries.labels(outcome="overloaded").inc()
            self._own.shed()
            raise OverloadedError(f"{self._in_flight} queries in flight, the limit is {limit}")
        self._in_flight += 1
        in_flight = self._in_flight
        self.metrics.in_flight.inc()
        if key is not None:
            share.acquire(key)
        try:
            result, unqueued = await self._fan_out(
                servers, query, k, timeout_ms, coverage, topk_probability
            )
        finally:
            self._in_flight -= 1
            self.metrics.in_flight.dec()
            if key is not None:
                share.release(key)
        dropped = self._dropped(result)
        if self._tells_the_load(result, dropped):
            self._admission.on_sample(
                self._clock(), self._latency(result, unqueued), in_flight, dropped
            )
        self.metrics.admission_limit.set(self._admission.limit)
        return result

    async def _fan_out(
        self,
        servers: Iterable[ServiceInstance] | Mapping[str, ServiceInstance],
        query: str,
        k: int,
        timeout_ms: int,
        coverage: CoveragePolicy | None,
        topk_probability: float,
    ) -> tuple[FanOutResult, float]:
        """Run one admitted query; its result and what of its time was no sign of the
        load: the longest search a data server reported for it, how long its coverage
        policy waited for shards it then let go, and how long its second round of the top
        ``k`` took (see :meth:`_latency`)."""
        one = Query(
            self._queries,
            self.picker,
            query=query,
            k=k,
            timeout_ms=timeout_ms,
            coverage=coverage if coverage is not None else self.config.coverage,
            topk_probability=topk_probability,
            topk_second_round=self.config.topk_second_round,
        )
        routing = self._routing
        table = routing.table_for(servers)
        # Now, not after the wait: the table follows the live list in place meanwhile,
        # and a shard that leaves it during the query is already counted in the query.
        routes = routing.routes(table)
        missing = routing.missing(table)
        docs_cap = routing.docs_cap
        # One replica group for the query's first requests (None: no group), O(groups).
        group = routing.groups.choose(missing, docs_cap)
        result = await one.run(routes, missing, docs_cap=docs_cap, group=group)
        return result, one.service + one.lingered + one.asked_again

    @staticmethod
    def _tells_the_load(result: FanOutResult, dropped: bool) -> bool:
        """Whether a query's latency is a sample of this cluster's queueing. Not when a
        data server cut it at its budget (an expensive query: its time and refusals are
        its own cost; counted, a storm of them drove the limit down and refused
        everyone's ordinary queries), nor when a few of its shards were late and the
        rest on time (it waited for the deadline because of one slow or starting
        server, which no limit cures: counted, each such query halved the limit, and
        three of them at start-up refused queries at 20 a second). A query the coverage
        policy ended is a sample (``deadline`` is not among its reasons): the load shows
        in how long its shards took to reach the coverage, which is what
        :meth:`_latency` then counts."""
        coverage = result.coverage
        if coverage is None:
            return True
        if "cut" in coverage.degraded:
            return False
        return dropped or "deadline" not in coverage.degraded

    def _latency(self, result: FanOutResult, unqueued: float) -> float:
        """What a query's latency tells the admission: the time it spent waiting, not
        working. Its fan-out's time less ``unqueued``: the longest search a data server
        reported for it (an expensive query is slow by its own cost: counted whole, a
        storm of them drove the limit down and refused everyone's ordinary queries; what
        overload adds is queueing) and the time its coverage policy waited for shards it
        then let go (a wait the policy chose, in proportion to the time the others took:
        counted, a straggler in every query of a large cluster would double each
        sample), and the time its second round of the top ``k`` took (the query's own
        cost, as a data server's search time is: a second request to a few shards the
        query chose to make once every shard had answered; counted, each such query
        would be a sample of up to twice its latency, and at a low ``topk_probability``
        most queries have one), plus how far behind this server's own loop is (a
        request waits that long before its fan-out starts)."""
        return max(0.0, result.took_ms / 1000 - unqueued) + self._own.lag

    @staticmethod
    def _dropped(result: FanOutResult) -> bool:
        """The query came back partial because the system was too slow: a quarter of the
        shards asked (at least two) late or refused, with a deadline or an overload
        among the reasons. One bad data server's shard is not the admission's business:
        no limit would cure it. Shards the coverage policy let go are not late (it
        chose not to wait for them, with enough of the corpus in): never a drop."""
        coverage = result.coverage
        if coverage is None or not (
            "deadline" in coverage.degraded or "overload" in coverage.degraded
        ):
            return False
        shards = result.shards
        late = late_shards(result) + shards["failed"]
        asked = shards["total"] - shards.get("missing", 0)
        return late >= max(2, asked / 4)
