"""Fan a query out to one replica of every shard, under one deadline: one query's
orchestration.

This is the part of the search server the whole product exists for: with a static list,
one dead or hung data server made every query wait for it, requests piled up and the
site fell over. Discovery keeps dead servers out of the list within a session timeout
and sick ones within a few probes; the fan-out bounds what is left over:

* **One deadline per query.** At the deadline every unanswered shard is reported as
  ``timed_out`` and its requests are abandoned (their connections closed). A hung data
  server costs a query at most its deadline, never more. Each sub-request carries what
  is left of it (``timeout_ms``, taken when it is sent, so a retry or a hedge carries
  less): the data server stops its search in time and answers with what it found,
  marked ``cut``, which counts as an answer but makes the result ``partial``.
* **Replica choice** by a :class:`~search_server.picking.ReplicaPicker` (by default
  adaptive replica selection) among the shard's candidates: routable, not ejected, not
  yet tried by this query, in the search server's own ``zone`` when a usable replica
  is there (other zones otherwise), and **warmed up**: a replica with fewer than
  ``warmup_samples`` answers from this search server gets one request at a time, as
  Finagle's probation does, so that a replica that has just joined is not sent a flood
  before anyone knows its speed; and its share **ramps** over a window (slow start,
  :mod:`.slowstart`) from a tenth of its weight.
* **Hedged requests**: one more request to another replica when a shard's request is
  out longer than its replicas' recent p95, within a budget of ``hedge_ratio`` of the
  sub-requests (:mod:`.hedging` says when, and keeps the budget). The budget is kept
  for stragglers (see :meth:`FanOut._hedge`): no hedge while fewer than half of the
  query's shards have answered, nor while more are still out than outliers make (the
  data servers are slow together), none to a replica whose p95 is above the time
  waited, and a refused one is offered again later.
* **Retry on failure** (connection error, non-200, bad JSON) to another replica of the
  shard while time remains, each replica at most once per query.
* **One retry budget** for both (:mod:`.retrybudget`): retries and hedges together
  are at most a share of the first requests plus a small steady rate, so a shard whose
  replicas all fail gets about one request per query, not one per replica.
* **Subsets.** A search server routes each shard to a stable subset of its replicas
  (:mod:`.subsetting`, at least ``size`` of them, spread evenly over the search
  servers by their :attr:`FanOut.position`), so that it holds connections to and
  learns about a few replicas per shard, not all; an ejected member, or every member
  tried, is stood in for by the replicas after the subset on its ring.
* **Draining replicas are a last resort.** A draining data server gets no request while
  a routable replica of its shard is left to try, but once every one has been tried
  (a hedge or a retry) or is ejected (a first request too), a request may go to one of
  the shard's draining replicas (:meth:`~search_server.routing.RoutingTable.reserve`),
  before any half-open probe of an ejected one: it answers until its grace ends, and
  while one replica of a pair drains, a slow answer from the other, or its ejection,
  would otherwise cost the shard.
* **Outlier ejection.** A data server that failed or timed out ``eject_after`` times in a
  row is skipped for ``eject_cooldown`` seconds, under a cap of ``max_ejected_share``;
  when every replica of a shard is ejected, one of them gets a half-open probe every
  ``probe_interval`` seconds (:mod:`.ejection` decides both). A query that wakes more
  than ``stall_grace`` (0.1 s) after its deadline charges no one with its timeouts: its
  own loop was stalled, and it cannot tell whose lateness it saw.
* **Admission control.** At most ``max_in_flight`` queries at once; the next one is
  refused at once with :class:`OverloadedError` rather than queued, so that a slow cluster
  cannot make requests pile up on the search server (the original outage). One query
  (by the key the caller gives) holds at most a share of that limit while others ask
  (:mod:`.queryshare`): a storm of one query cannot take it all.

**Cost.** A 100-shard query is 100 sub-requests, and their cost on the search server's
CPU bounds its queries per second. So the common path has no task per sub-request: the
client's future for each one ends in a callback (:meth:`_on_answer`) that records the
answer and, for the last shard, wakes the query; the query's request line is encoded
once; the routing table (replicas by shard) follows the live list change by change
(:mod:`.routing`); hits are validated in place and only the merged top ``k`` are copied
with their shard (:mod:`.merging`).

Everything here runs on the caller's event loop and is not thread-safe.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Mapping
from urllib.parse import urlencode

import orjson
from prometheus_client import CollectorRegistry

from discovery.address import NetworkPolicy
from discovery.errors import OverloadedError
from discovery.instance import ServiceInstance
from discovery.livelist.model import LiveListChange
from discovery.looplag import LoopLagMonitor

from .admission import ConcurrencyLimit, FixedLimit
from .ejection import OutlierEjection
from .hedging import HedgePolicy
from .httpclient import HttpClient, Response, SubrequestClient, SubrequestError
from .merging import (
    BadAnswer,
    FailureReason,
    FanOutResult,
    Ranked,
    ShardOutcome,
    feedback,
    merge,
    ranked_hits,
)
from .metrics import FanOutMetrics
from .picking import (
    AdaptiveReplicaSelection,
    LatencyWindow,
    Replica,
    ReplicaPicker,
    target_key,
)
from .queryshare import QueryShare
from .retrybudget import ExtraRequest, RetryBudget
from .routing import RoutingTable
from .slowstart import Ramps, SlowStart
from .subsetting import DeterministicAperture, Position, Subset, Subsetter

# FanOutResult is what FanOut.search returns: importable with it.
__all__ = ["FanOut", "FanOutResult"]

log = logging.getLogger(__name__)


class _Attempt:
    """One sub-request of a shard call: to which replica, since when, and whether it
    is a hedge."""

    __slots__ = ("future", "hedge", "probe", "replica", "started")

    def __init__(
        self,
        replica: Replica,
        future: asyncio.Future[Response],
        started: float,
        hedge: bool,
        probe: bool = False,
    ) -> None:
        self.replica = replica
        self.future = future
        self.started = started
        self.hedge = hedge
        # Sent to an ejected replica because its shard had no other: an answer ends
        # the ejection (see FanOut._next_attempt).
        self.probe = probe


class _ShardRoute:
    """How this search server routes one shard, made when the shard's replica list (by
    identity) or the search server's position changes, and shared by the queries until
    then: its subset, its members, and the documents it holds."""

    __slots__ = ("docs", "members", "position", "replicas", "subset")

    def __init__(self, replicas: list[Replica], position: Position, subsetter: Subsetter) -> None:
        self.replicas = replicas
        self.position = position
        made = subsetter.subset(replicas, position)
        # None: no subset (the shard is small, or this search server covers it all).
        self.subset: Subset | None = None if made.whole else made
        # The replicas the shard's first requests go to (never modified).
        self.members: list[Replica] = replicas if made.whole else list(made.members)
        # The most any replica holds: the shard's documents, for coverage.
        self.docs = max((r.instance.payload.docs for r in replicas), default=0)


class _ShardCall:
    """The progress of one shard within one query."""

    __slots__ = (
        "attempts",
        "cut",
        "docs",
        "done",
        "hedge_backoff",
        "hedge_timer",
        "hits",
        "outcome",
        "panic",
        "reason",
        "replicas",
        "routable",
        "shard",
        "shard_docs",
        "subset",
        "tried",
    )

    def __init__(self, shard: int, route: _ShardRoute) -> None:
        self.shard = shard
        # The replicas this search server routes the shard to: its subset's members
        # (all of the shard's routable replicas when it has no subset). Shared with
        # other queries: never modified.
        self.replicas = route.members
        self.subset = route.subset
        self.shard_docs = route.docs
        # How many routable replicas the shard has (not only its subset's members): the
        # base of the panic threshold.
        self.routable = len(route.replicas)
        # The shard's routing ignores ejections for this query (see FanOut._panicking).
        self.panic = False
        # What the replica that answered holds (coverage).
        self.docs = 0
        # Why the shard failed, if it does: a failure, unless it had no replica at all
        # or its replicas refused for overload.
        self.reason: FailureReason = "error"
        self.tried: list[Replica] = []
        self.attempts: list[_Attempt] = []
        self.hits: list[Ranked] | None = None
        # The answer was cut short by the data server at the request's budget.
        self.cut = False
        # Until a replica answers: what the last attempt did ("failed" if none could be made).
        self.outcome: ShardOutcome = "failed"
        self.done = False
        self.hedge_timer: asyncio.TimerHandle | None = None
        # How long to wait before offering a hedge refused for the budget again.
        self.hedge_backoff = 0.0


class _Query:
    """One query in flight: its calls, its request line, and the future it waits on.

    ``target`` ends in ``timeout_ms=``: each attempt appends what is left of the
    deadline when it is sent.
    """

    __slots__ = (
        "deadline",
        "deferred",
        "k",
        "loop",
        "open_calls",
        "service",
        "started",
        "target",
        "total",
        "waiter",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        target: bytes,
        k: int,
        started: float,
        deadline: float,
    ) -> None:
        self.loop = loop
        self.started = started
        self.target = target
        self.k = k
        self.deadline = deadline
        self.open_calls = 0
        self.total = 0
        # Calls whose hedge came due while most shards were still out (see _hedge).
        self.deferred: list[_ShardCall] = []
        self.waiter: asyncio.Future[None] = loop.create_future()
        # The longest search time a data server reported for this query (at most the
        # time its answer took): what of the query's latency was work, not queueing.
        self.service = 0.0


# A data server's answers that say it is overloaded rather than broken: full (429), not
# taking requests now (503), or its budget spent before the search could start (504: the
# request waited in its queue that long). A refusal, not a failure: never a step towards
# ejection (see FanOut._on_answer).
_OVERLOAD_STATUSES = frozenset({429, 503, 504})
#: Seconds a replica that answered "overloaded" gets no first request while its shard has
#: another candidate (``FanOut(overload_backoff=...)``): its ``Retry-After`` says a
#: second; half of that, since the others may fill up too.
OVERLOAD_BACKOFF = 0.5
#: Share of a shard's routable replicas that must be left un-ejected for its routing to
#: heed ejections (``FanOut(panic_threshold=...)``, Envoy's healthy panic threshold and
#: its default): below it, the shard routes to all of them (see FanOut._panicking).
PANIC_THRESHOLD = 0.5
# Late shards a query may have for their timeouts to still be blamed on their replicas
# (or a tenth of its shards, if more): more are a slow machine's, not outliers.
_OUTLIERS = 2
# Seconds over which the data servers that timed out (in any query) are counted: more of
# them than outliers make is a busy machine, not slow replicas (FanOut._blame).
_TIMEOUT_WINDOW = 1.0


class _Blame(enum.Enum):
    """What a timeout at a query's deadline is charged with (FanOut._blame)."""

    NONE = "none"  # nothing: the lateness may be ours or everyone's
    LATENCY = "latency"  # its replica's latency only: slow, but no step towards ejection
    FULL = "full"  # its latency and a failure: a step towards ejection


# Seconds after a query was refused for the in-flight limit during which no hedge is
# sent (FanOut._hedge).
_SHED_HEDGE_PAUSE = 1.0
# Seconds between two log lines saying that shards route in panic.
_PANIC_LOG_INTERVAL = 10.0
# Distinct unroutable targets whose exclusion is remembered as logged.
_MAX_LOGGED_SKIPS = 1024
#: How late past its deadline a query may wake and still charge the replicas it waited
#: for with a timeout (``FanOut(stall_grace=...)``). Later, the search server's own loop
#: was stalled: on a busy 2-core machine the container runtime starves every container
#: for 0.1-0.3 s when one stops, and the replicas of a whole fleet "timed out" together
#: and were ejected, so their shards failed at once for a while after the stall passed.
STALL_GRACE = 0.1


class FanOut:
    """Fans queries out to the data servers and merges their hits.

    ``client`` sends the sub-requests (default: an :class:`~search_server.httpclient.
    HttpClient` of the fan-out's own, closed by :meth:`aclose`; a client passed in stays
    the caller's to close).

    ``clock`` times ejections only (tests may advance it); deadlines and hedges use the
    event loop's clock. ``picker`` chooses among a shard's candidates (default
    :class:`~search_server.picking.AdaptiveReplicaSelection`). ``zone`` is this search
    server's zone: replicas there are preferred while the shard has a usable one.
    ``hedge_ratio`` caps hedges as a share of sub-requests (0 turns hedging off).
    ``retry_budget`` is what retries and hedges together draw on (default: a
    :class:`~search_server.retrybudget.RetryBudget` of 10 % of first requests plus 10 a
    second). ``subsetter`` chooses the replicas of a shard this search server routes
    to, given its :attr:`position` among the search servers (default: a
    :class:`~search_server.subsetting.DeterministicAperture` of 8; at the default
    position, one search server of one, every replica). ``rng`` flips the coins of
    subsets' edge replicas. ``shards`` is how many shards (0 to ``shards - 1``) the
    cluster has (``--shards``), beside those it has routed to: a shard with no replica
    to send to is then reported missing, never dropped from the total. ``networks``
    (``--allowed-networks``) leaves data servers at IP addresses outside it out of the
    routing table; any other failure to make one server's replica leaves that server
    out too, never fails the table (both counted in
    ``search_server_fanout_unroutable_total``). ``admission`` is the in-flight limit
    (default: ``max_in_flight``, fixed) and ``query_share`` how much of it the queries
    of one key may hold (default: a :class:`~search_server.queryshare.QueryShare` of
    half; only for queries given a key).
    Metrics go to ``registry`` (a fresh one if ``None``).

    Raises ``ValueError`` for a limit below 1, a negative cool-down or a ratio out of
    range.
    """

    def __init__(
        self,
        client: SubrequestClient | None = None,
        *,
        max_in_flight: int = 256,
        eject_after: int = 3,
        eject_cooldown: float = 10.0,
        max_ejected_share: float = 0.5,
        probe_interval: float = 1.0,
        stall_grace: float = STALL_GRACE,
        hedge_ratio: float = 0.05,
        hedge_burst: float = 100.0,
        warmup_samples: int = 5,
        zone: str | None = None,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
        picker: ReplicaPicker | None = None,
        networks: NetworkPolicy | None = None,
        retry_budget: RetryBudget | None = None,
        subsetter: Subsetter | None = None,
        rng: random.Random | None = None,
        shards: int = 0,
        panic_threshold: float = PANIC_THRESHOLD,
        overload_backoff: float = OVERLOAD_BACKOFF,
        loop_lag: LoopLagMonitor | None = None,
        admission: ConcurrencyLimit | None = None,
        query_share: QueryShare | None = None,
        slow_start: SlowStart | None = None,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        if shards < 0:
            raise ValueError(f"shards must be >= 0, got {shards}")
        self._ejection = OutlierEjection(
            eject_after=eject_after,
            eject_cooldown=eject_cooldown,
            max_ejected_share=max_ejected_share,
            probe_interval=probe_interval,
        )
        if warmup_samples < 0:
            raise ValueError(f"warmup_samples must be >= 0, got {warmup_samples}")
        if not stall_grace > 0:
            raise ValueError(f"stall_grace must be > 0 seconds, got {stall_grace}")
        if not 0 <= panic_threshold <= 1:
            raise ValueError(f"panic_threshold must be in 0..1, got {panic_threshold}")
        if not overload_backoff >= 0:
            raise ValueError(f"overload_backoff must be >= 0 seconds, got {overload_backoff}")
        self._panic_threshold = panic_threshold
        self._overload_backoff = overload_backoff
        # Replicas that answered "overloaded", until when (the fan-out's clock): kept
        # here, not on the Replica, and nearly always empty.
        self._overloaded: dict[Replica, float] = {}
        self._panic_logged_at = -_PANIC_LOG_INTERVAL
        self._panic_shards: set[int] = set()
        self._loop_lag = loop_lag
        # How many queries may be in flight now (never more than max_in_flight): by
        # default the fixed max_in_flight; the search server passes a GradientLimit.
        self._admission: ConcurrencyLimit = (
            admission if admission is not None else FixedLimit(max_in_flight)
        )
        # How much of the limit one query (by the key given to search) may hold.
        self._query_share = query_share if query_share is not None else QueryShare()
        # When a query was last refused for the limit (the fan-out's clock): hedges
        # stop for a while, since a hedge is load a shedding server cannot spare.
        self._shed_at = -math.inf
        # The replicas that timed out within the last _TIMEOUT_WINDOW, in any query, and
        # when (the fan-out's clock), oldest first: how widespread lateness is now.
        # Pruned at each query's deadline that finds shards late, so a few may linger
        # while none is late (a replica that left the list among them, until then).
        self._timed_out: dict[Replica, float] = {}
        self._owns_client = client is None
        self._client: SubrequestClient = client if client is not None else HttpClient()
        self._max_in_flight = max_in_flight
        self._stall_grace = stall_grace
        self._hedging = HedgePolicy(hedge_ratio, hedge_burst)
        self.retry_budget = retry_budget if retry_budget is not None else RetryBudget()
        self._subsetter: Subsetter = subsetter if subsetter is not None else DeterministicAperture()
        self._position = Position()
        # Each shard's route, for the replica list (by identity) and position it was
        # made for: made again only when either changes, never per query.
        self._shard_routes: dict[int, _ShardRoute] = {}
        # Every shard the cluster has, as far as this search server knows: ``shards``
        # and every shard it has routed to since it started; with the last count of
        # documents seen of each (for the coverage of a shard gone missing).
        self._expected_shards: dict[int, int | None] = dict.fromkeys(range(shards))
        self._rng = rng if rng is not None else random.Random()
        self._warmup = warmup_samples
        self.zone = zone
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = FanOutMetrics(self.registry)
        self.metrics.admission_limit.set(self._admission.limit)
        self._clock = clock
        self.picker: ReplicaPicker = picker if picker is not None else AdaptiveReplicaSelection()
        self._in_flight = 0
        self.networks = networks if networks is not None else NetworkPolicy()
        # Replicas in slow start (none when it is off, as by default here).
        self._ramps = Ramps(slow_start if slow_start is not None else SlowStart(window=0.0))
        # Replicas by shard for the last list fanned out to or followed.
        self._routes = RoutingTable(
            clock,
            admit=self._admit if self.networks.narrows else None,
            on_skip=self._skipped,
            on_new=self._new_replica,
        )
        # Targets whose exclusion was logged (bounded): one line each, not one per list.
        self._logged_skips: OrderedDict[str, None] = OrderedDict()
        # Counts of shard-request results since the last flush into the metrics:
        # a prometheus counter increment takes a lock, once per query is plenty.
        self._pending_ok = 0

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
        return self._max_in_flight

    def replica(self, instance: ServiceInstance) -> Replica | None:
        """What this fan-out knows of ``instance`` (``None`` before it routed to it)."""
        return self._routes.replica(target_key(instance))

    @property
    def expected_shards(self) -> Collection[int]:
        """The shards this fan-out expects an answer from: ``shards`` (0 to N-1) given
        at construction and every shard it has routed to since. A shard among them with
        no replica left is *missing* from an answer, never dropped from its total."""
        return self._expected_shards.keys()

    def ejected(self) -> set[str]:
        """Instance ids of the data servers currently ejected (skipped) by this fan-out."""
        return {r.instance.id for r in self._ejection.ejected(self._clock())}

    async def search(
        self,
        servers: Iterable[ServiceInstance] | Mapping[str, ServiceInstance],
        query: str,
        k: int,
        timeout_ms: int,
        *,
        key: str | None = None,
    ) -> FanOutResult:
        """Search every shard of ``servers`` for ``query``; merge the top ``k`` hits.

        ``servers`` is the live list (instances, or a mapping of ids to instances);
        instances that are not ``routable`` (draining, disabled, in maintenance) get no
        first request (a draining one may get a request of last resort once its shard's
        routable replicas have all been tried or are ejected: see the module's
        docstring). Passing the same object again (an unchanged live list) reuses the
        routing table built for it, so do not mutate it in between. Returns within
        ``timeout_ms`` (plus a loop iteration): shards that failed or had no answer by
        then are counted in the result, which is then ``partial``; they never raise.
        ``key`` (the query's normalised terms) puts it under the query share
        (:mod:`.queryshare`): queries of one key hold at most a share of the limit while
        others ask.

        Raises:
            OverloadedError: the in-flight limit is reached, or ``key``'s share of it
                (raised before anything is sent; the query is not queued).
            ValueError: ``k`` or ``timeout_ms`` below 1.
        """
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if timeout_ms < 1:
            raise ValueError(f"timeout_ms must be >= 1, got {timeout_ms}")
        # No await before this check and the increment: admission is atomic on the loop.
        limit = min(self._admission.limit, self._max_in_flight)
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
            self._shed_at = self._clock()
            raise OverloadedError(f"{self._in_flight} queries in flight, the limit is {limit}")
        self._in_flight += 1
        in_flight = self._in_flight
        self.metrics.in_flight.inc()
        if key is not None:
            share.acquire(key)
        try:
            result, service = await self._fan_out(servers, query, k, timeout_ms)
        finally:
            self._in_flight -= 1
            self.metrics.in_flight.dec()
            if key is not None:
                share.release(key)
        dropped = self._dropped(result)
        if self._tells_the_load(result, dropped):
            self._admission.on_sample(
                self._clock(), self._latency(result, service), in_flight, dropped
            )
        self.metrics.admission_limit.set(self._admission.limit)
        return result

    @staticmethod
    def _tells_the_load(result: FanOutResult, dropped: bool) -> bool:
        """Whether a query's latency is a sample of this cluster's queueing. Not when a
        data server cut it at its budget (an expensive query: its time and refusals are
        its own cost; counted, a storm of them drove the limit down and refused
        everyone's ordinary queries), nor when a few of its shards were late and the
        rest on time (it waited for the deadline because of one slow or starting
        server, which no limit cures: counted, each such query halved the limit, and
        three of them at start-up refused queries at 20 a second)."""
        coverage = result.coverage
        if coverage is None:
            return True
        if "cut" in coverage.degraded:
            return False
        return dropped or "deadline" not in coverage.degraded

    def _latency(self, result: FanOutResult, service: float) -> float:
        """What a query's latency tells the admission: the time it spent waiting, not
        working. Its fan-out's time less the longest search a data server reported for
        it (an expensive query is slow by its own cost: counted whole, a storm of them
        drove the limit down and refused everyone's ordinary queries; what overload adds
        is queueing), plus how far behind this server's own loop is (a request waits
        that long before its fan-out starts)."""
        lag = self._loop_lag.last_lag if self._loop_lag is not None else 0.0
        return max(0.0, result.took_ms / 1000 - service) + lag

    @staticmethod
    def _dropped(result: FanOutResult) -> bool:
        """The query came back partial because the system was too slow: a quarter of the
        shards asked (at least two) late or refused, with a deadline or an overload
        among the reasons. One bad data server's shard is not the admission's business:
        no limit would cure it."""
        coverage = result.coverage
        if coverage is None or not (
            "deadline" in coverage.degraded or "overload" in coverage.degraded
        ):
            return False
        shards = result.shards
        late = shards["timed_out"] + shards["failed"]
        asked = shards["total"] - shards.get("missing", 0)
        return late >= max(2, asked / 4)

    @property
    def admission(self) -> ConcurrencyLimit:
        """The in-flight limit this fan-out admits queries under."""
        return self._admission

    # -- routing table ----------------------------------------------------------------

    def _admit(self, instance: ServiceInstance) -> str | None:
        problem = self.networks.problem(instance.address)
        return None if problem is None else f"not_allowed: {problem}"

    def _new_replica(self, replica: Replica) -> None:
        """A target new to this fan-out: its weight ramps (slow start)."""
        self._ramps.add(replica, self._clock())
        self.metrics.slow_start.set(len(self._ramps))

    def _skipped(self, instance: ServiceInstance, problem: str) -> None:
        """A listed server left out of the routing table: counted, logged once."""
        why = "not_allowed" if problem.startswith("not_allowed:") else "error"
        self.metrics.unroutable.labels(why=why).inc()
        key = target_key(instance)
        if key in self._logged_skips:
            return
        self._logged_skips[key] = None
        if len(self._logged_skips) > _MAX_LOGGED_SKIPS:
            self._logged_skips.popitem(last=False)
        log.warning(
            "not routing to data server %s (%s:%d, shard %d): %s",
            instance.id,
            instance.address,
            instance.port,
            instance.payload.shard,
            problem,
        )

    def follow(self, change: LiveListChange) -> None:
        """Move the routing table along ``change`` of the live list (see
        :class:`~search_server.routing.RoutingTable`): by its delta, O(servers of the
        shards it touches), when the table holds ``change.previous``. A later
        :meth:`search` of ``change.current.servers`` then routes with it as it is.
        """
        kind = self._routes.follow(change)
        if kind != "none":
            self.metrics.routing_updates.labels(kind=kind).inc()

    @property
    def position(self) -> Position:
        """This search server's place among the search servers, which its subsets
        follow (one of one until :meth:`set_position`)."""
        return self._position

    def set_position(self, position: Position) -> None:
        """Route with the subsets of ``position`` from the next query on (each shard's
        subset is made again at its next query; queries in flight keep theirs)."""
        if position != self._position:
            self._position = position

    def _route_of(self, shard: int, replicas: list[Replica]) -> _ShardRoute:
        """The shard's route for a query: the one made before, unless the shard's list
        or the position has changed since."""
        route = self._shard_routes.get(shard)
        if route is None or route.replicas is not replicas or route.position is not self._position:
            route = _ShardRoute(replicas, self._position, self._subsetter)
            self._shard_routes[shard] = route
            self._expected_shards[shard] = route.docs
        return route

    def _missing(self, table: list[tuple[int, list[Replica]]]) -> list[tuple[int, int]]:
        """The shards expected but not in ``table`` (no replica to send to), with their
        last known documents, or an average shard's for one never seen. O(1) while
        every expected shard is in the table."""
        expected = self._expected_shards
        if len(expected) == len(table):
            return []  # the table's shards are all expected: the same set
        present = {shard for shard, _ in table}
        known = [docs for docs in expected.values() if docs is not None]
        average = sum(known) // len(known) if known else 0
        return [
            (shard, average if docs is None else docs)
            for shard, docs in expected.items()
            if shard not in present
        ]

    def _routing_table(
        self, servers: Iterable[ServiceInstance] | Mapping[str, ServiceInstance]
    ) -> list[tuple[int, list[Replica]]]:
        if servers is not self._routes.source:
            self._routes.load(servers)  # O(servers): a list not followed change by change
            self.metrics.routing_updates.labels(kind="full").inc()
        return self._routes.table

    # -- one query --------------------------------------------------------------------

    async def _fan_out(
        self,
        servers: Iterable[ServiceInstance] | Mapping[str, ServiceInstance],
        query: str,
        k: int,
        timeout_ms: int,
    ) -> tuple[FanOutResult, float]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        table = self._routing_table(servers)
        if self._ramps.refresh(self._clock()):  # at most every 0.1 s, while any ramps
            self.metrics.slow_start.set(len(self._ramps))
        target = ("/search?" + urlencode({"q": query, "k": k}) + "&timeout_ms=").encode("ascii")
        q = _Query(loop, target, k, started, started + timeout_ms / 1000)
        if len(self._shard_routes) > len(table):
            # Shards have left the table: forget their routes (and their replicas).
            present = {shard for shard, _ in table}
            self._shard_routes = {s: r for s, r in self._shard_routes.items() if s in present}
        route_of = self._route_of
        calls = [_ShardCall(shard, route_of(shard, replicas)) for shard, replicas in table]
        # Now, not after the wait: the table follows the live list in place meanwhile,
        # and a shard that leaves it during the query is already counted in ``calls``.
        missing = self._missing(table)
        self._hedging.budget.deposit(len(calls))
        self.retry_budget.deposit(len(calls))
        q.open_calls = q.total = len(calls)
        for call in calls:
            if not self._next_attempt(q, call):
                call.reason = "no_replica"
                self._finish(q, call)  # every replica ejected: failed at once
        deadline_timer = loop.call_at(q.deadline, _wake, q.waiter)
        try:
            if q.open_calls > 0:
                await q.waiter
        finally:
            deadline_timer.cancel()
            # At the deadline (or when the query itself is cancelled, the client gone):
            # abandon what is still in flight.
            now = loop.time()
            timed_out = now >= q.deadline
            blame = self._blame(q, now, calls) if timed_out else _Blame.NONE
            for call in calls:
                if not call.done:
                    self._abandon(q, call, timed_out, blame=blame)
        self._flush_metrics()
        took_ms = (loop.time() - started) * 1000
        result = merge(calls, k, took_ms, missing)
        self._count_query(result, took_ms)
        return result, q.service

    def _candidates(self, call: _ShardCall, now: float) -> list[Replica]:
        """The shard's replicas a request may go to now: its routable ones not yet
        tried nor ejected (within its subset, with spares for the ejected and the tried,
        see :meth:`~search_server.subsetting.Subset.candidates`), or, when none is left,
        its draining ones (a last resort)."""
        tried = call.tried
        # In panic the shard's ejections are not heeded: judged at a time past them all.
        seen = math.inf if call.panic else now
        if call.subset is None:
            usable = [r for r in call.replicas if r not in tried and not r.is_ejected(seen)]
        else:
            usable = call.subset.candidates(tried, seen, self._rng)
        if not usable:
            reserve = self._routes.reserve(call.shard)
            return [r for r in reserve if r not in tried and not r.is_ejected(seen)]
        if len(usable) > 1:
            if self._overloaded:
                usable = self._not_overloaded(usable, now) or usable
            zone = self.zone
            if zone is not None:
                local = [r for r in usable if r.zone == zone]
                if local:
                    usable = local
            if self._warmup:
                warm = self._warmup
                ready = [r for r in usable if r.samples >= warm or r.outstanding == 0]
                if not ready:
                    # All still warming up and busy: the least busy ones, so that a
                    # picker ranking the unknown first cannot pile onto one of them.
                    fewest = min(r.outstanding for r in usable)
                    ready = [r for r in usable if r.outstanding == fewest]
                usable = ready
        return usable

    def _next_attempt(self, q: _Query, call: _ShardCall, *, retry: bool = False) -> bool:
        """Send the shard's first request or a ``retry``; False if no replica is left,
        or, for a retry, the retry budget is spent (or, after an overload refusal, every
        replica left has refused too: a retry would only add to the overload)."""
        clock_now = self._clock()
        if not call.tried and self._panic_threshold > 0:
            call.panic = self._panicking(call, clock_now)
        candidates = self._candidates(call, clock_now)
        if candidates and retry and call.reason == "overload" and self._overloaded:
            candidates = self._not_overloaded(candidates, clock_now)
            if not candidates:
                return False
        if not candidates:
            probe = self._ejection.probe(call.replicas, call.tried, clock_now)
            if probe is None or (retry and not self._spend("retry")):
                return False
            self._send(q, call, probe, hedge=False, probe=True)
            return True
        if retry and not self._spend("retry"):
            return False
        now = q.loop.time()
        primary = self.picker.pick(candidates)
        if self._last_resort(call, primary):
            self.metrics.last_resort.inc()
        # In panic, a request to an ejected replica is also its probe: an answer ends
        # its ejection.
        self._send(
            q, call, primary, hedge=False, probe=call.panic and primary.is_ejected(clock_now)
        )
        if (
            self._hedging.enabled
            and call.hedge_timer is None
            and (len(call.replicas) > 1 or self._routes.reserve(call.shard))
        ):
            self._hedge_in(q, call, now, self._hedging.delay(call.replicas, primary))
        return True

    def _panicking(self, call: _ShardCall, now: float) -> bool:
        """Whether the shard routes in panic for this query: fewer than
        ``panic_threshold`` of its routable replicas are left un-ejected. Then its
        ejections are not heeded: the load is spread over all of them, as Envoy does
        below its healthy panic threshold, rather than piled onto the few left (which a
        busy minute would then eject in turn). O(1) while none of the shard's replicas is
        ejected."""
        routable = call.routable
        if routable < 2:
            # A shard's only replica has no share to protect: routing to it while it is
            # ejected would make every query wait for it if it hangs, the outage this
            # product exists to end. Its half-open probe ends the ejection within a
            # second of its answering again.
            return False
        ejected = self._ejection.ejected_in(call.shard, now)
        if ejected == 0:
            return False
        if routable - min(ejected, routable) >= self._panic_threshold * routable:
            return False
        self.metrics.panic.labels(scope="shard").inc()
        self._panic_shards.add(call.shard)
        if now - self._panic_logged_at >= _PANIC_LOG_INTERVAL:
            shards = sorted(self._panic_shards)
            log.warning(
                "routing %d shard(s) in panic (fewer than %.0f%% of their replicas left "
                "un-ejected): their ejections are not heeded, the load goes to all their "
                "replicas; shards %s%s",
                len(shards),
                self._panic_threshold * 100,
                ", ".join(map(str, shards[:10])),
                "..." if len(shards) > 10 else "",
            )
            self._panic_logged_at = now
            self._panic_shards.clear()
        return True

    def _not_overloaded(self, replicas: list[Replica], now: float) -> list[Replica]:
        """``replicas`` less those that answered "overloaded" less than
        ``overload_backoff`` ago (forgetting those whose backoff is over)."""
        overloaded = self._overloaded
        left = []
        for replica in replicas:
            until = overloaded.get(replica)
            if until is None:
                left.append(replica)
            elif until <= now:
                del overloaded[replica]
                left.append(replica)
        return left

    def _spend(self, kind: ExtraRequest) -> bool:
        """Take an extra request from the retry budget; count it if refused."""
        if self.retry_budget.withdraw(kind):
            return True
        self.metrics.budget_refused.labels(kind=kind).inc()
        return False

    def _last_resort(self, call: _ShardCall, replica: Replica) -> bool:
        """``replica`` is one of the shard's draining ones (usually none: O(1))."""
        return replica in self._routes.reserve(call.shard)

    def _hedge_in(self, q: _Query, call: _ShardCall, now: float, delay: float | None) -> None:
        """Offer the shard a hedge ``delay`` after ``now``, if that is before the deadline
        (never when no latency window tells a ``delay``)."""
        if delay is not None and now + delay < q.deadline:
            call.hedge_timer = q.loop.call_at(now + delay, self._hedge, q, call)

    def _send(
        self, q: _Query, call: _ShardCall, replica: Replica, *, hedge: bool, probe: bool = False
    ) -> None:
        call.tried.append(replica)
        replica.outstanding += 1
        replica.sent += 1
        now = q.loop.time()
        # The budget left, in whole milliseconds (rounded down, so the data server's
        # deadline never falls after ours); at least 1, the least timeout_ms there is.
        budget_ms = max(1, int((q.deadline - now) * 1000))
        future = self._client.get(replica.endpoint, b"%b%d" % (q.target, budget_ms))
        attempt = _Attempt(replica, future, now, hedge, probe)
        call.attempts.append(attempt)
        future.add_done_callback(lambda f: self._on_answer(q, call, attempt))

    def _hedge(self, q: _Query, call: _ShardCall) -> None:
        """The shard's request is out longer than another replica's recent p95: one more
        request, to a replica that would usually have answered by now, if the budget
        allows.

        Not while fewer than half of the query's shards have answered: then the whole
        query is late (a stall here, a busy machine), not this shard, and hedges would
        spend the budget without gaining anything; nor, after, while more of them are
        still out than outliers make (more than two and a tenth): the slowness is
        everyone's, and hedges would add to it. The hedge is offered again the
        fastest other replica's usual spread (p95 - p50) after half have answered, if
        the shard is still out then. One refused for the budget is offered again a p95
        later, then two, four... until the deadline: the longer a shard is out, the
        likelier it is a straggler rather than the usual tail.
        """
        call.hedge_timer = None
        if call.done or not call.attempts:
            return
        if q.total >= 4 and 2 * (q.total - q.open_calls) < q.total:
            q.deferred.append(call)
            return
        if q.open_calls > max(_OUTLIERS, q.total // 10):
            # More shards out than outliers make (the rule that blames no replica for a
            # timeout): the data servers are slow together, a busy machine or a cluster
            # at its knee, and a hedge is one more request to one of them. Sent anyway,
            # a burst of them was where the overload benchmark's stalls at the knee began.
            self.metrics.hedges.labels(result="systemic").inc()
            return
        started = call.attempts[0].started
        if self._clock() - self._shed_at < _SHED_HEDGE_PAUSE:
            # This search server is refusing queries for want of capacity: a hedge
            # would take it from the queries it admitted.
            self.metrics.hedges.labels(result="shedding").inc()
            return
        if self._loop_lag is not None and self._loop_lag.lagged_since(started):
            # Our own loop fell behind while the request was out: its answer may be
            # waiting in the socket, and a hedge would add load to a machine that has
            # none to spare.
            self.metrics.hedges.labels(result="own_lag").inc()
            return
        now = q.loop.time()
        waited = now - started
        clock_now = self._clock()
        # A replica whose p95 is above what we waited would not beat the request out,
        # and one that has just refused for overload would only refuse again: when no
        # other is left, the slowness is the whole shard's and a hedge cannot help.
        candidates = [
            r
            for r in self._candidates(call, clock_now)
            if r.window is None or r.window.p95 is None or r.window.p95 <= waited
        ]
        if candidates and self._overloaded:
            candidates = self._not_overloaded(candidates, clock_now)
        if not candidates:
            return
        if not (self._hedging.budget.available and self._spend("hedge")):
            self.metrics.hedges.labels(result="over_budget").inc()
            backoff = self._hedging.backoff(
                call.replicas, call.attempts[0].replica, call.hedge_backoff
            )
            if backoff is not None:
                call.hedge_backoff = backoff
                self._hedge_in(q, call, now, backoff)
            return
        self._hedging.budget.withdraw()
        hedge = self.picker.pick(candidates)
        if self._last_resort(call, hedge):
            self.metrics.last_resort.inc()
        self._send(q, call, hedge, hedge=True, probe=call.panic and hedge.is_ejected(clock_now))
        self.metrics.hedges.labels(result="sent").inc()

    def _on_answer(self, q: _Query, call: _ShardCall, attempt: _Attempt) -> None:
        future = attempt.future
        if future.cancelled() or call.done:
            return  # abandoned by us; accounted for where it was abandoned
        call.attempts.remove(attempt)
        replica = attempt.replica
        replica.outstanding -= 1
        elapsed = q.loop.time() - attempt.started
        exc = future.exception()
        overloaded = False
        try:
            if exc is not None:
                raise exc
            status, body = future.result()
            if status != 200:
                overloaded = status in _OVERLOAD_STATUSES
                raise BadAnswer(f"HTTP {status}")
            decoded = orjson.loads(body)
            hits = ranked_hits(decoded, call.shard, q.k)
        except (SubrequestError, ValueError) as error:
            # ValueError: a BadAnswer or undecodable JSON (orjson.JSONDecodeError).
            if overloaded:
                # A refusal, not a failure: the replica said at once that it is full.
                # No step towards ejection and no latency penalty (a busy minute must
                # cost capacity, never replicas); it gets no first request for a moment
                # while its shard has another.
                self._overloaded[replica] = self._clock() + self._overload_backoff
                self.metrics.shard_requests.labels(result="overload").inc()
            else:
                replica.penalize(elapsed)
                self._record_failure(replica, "error", _describe(error))
            call.outcome = "failed"
            call.reason = "overload" if overloaded else "error"
            if call.attempts:
                return  # a hedge is still out; its answer decides
            if q.loop.time() < q.deadline and self._next_attempt(q, call, retry=True):
                self.metrics.retries.inc()
                return
            self._finish(q, call)
            return
        except Exception as error:  # a client bug must not hang the query
            log.error("sub-request to %s failed", replica.instance.id, exc_info=error)
            call.outcome = "failed"
            if not call.attempts:
                self._finish(q, call)
            return
        service, queue = feedback(decoded)
        replica.observe(elapsed, service, queue)
        if service is not None and service > q.service:
            q.service = min(service, elapsed)
        window = replica.window
        if window is None:
            window = replica.window = LatencyWindow()
        window.add(elapsed)
        self._hedging.observe(elapsed)
        self._pending_ok += 1
        self._ejection.record_success(replica, self._clock(), probe=attempt.probe)
        call.hits, call.outcome = hits, "ok"
        call.docs = replica.instance.payload.docs
        call.cut = decoded.get("cut") is True
        if attempt.hedge:
            self.metrics.hedges.labels(result="won").inc()
        now = q.loop.time()
        for loser in call.attempts:
            # The slower of a hedged pair: no answer after all the time it has had.
            loser.replica.outstanding -= 1
            loser.replica.penalize(now - loser.started)
            loser.future.cancel()
        call.attempts.clear()
        self._finish(q, call)

    def _finish(self, q: _Query, call: _ShardCall) -> None:
        call.done = True
        if call.hedge_timer is not None:
            call.hedge_timer.cancel()
            call.hedge_timer = None
        q.open_calls -= 1
        if q.open_calls == 0:
            _wake(q.waiter)
        elif q.deferred and 2 * (q.total - q.open_calls) >= q.total:
            # Half have answered: the query's median is now. A deferred shard is a
            # straggler if it is still out its usual spread (p95 - p50) later.
            deferred, q.deferred = q.deferred, []
            now = q.loop.time()
            for late in deferred:
                if late.done or not late.attempts:
                    continue
                spread = self._hedging.spread(late.replicas, late.attempts[0].replica)
                self._hedge_in(q, late, now, spread)

    def _blame(self, q: _Query, now: float, calls: list[_ShardCall]) -> _Blame:
        """Whether the requests still out at ``q``'s deadline may be charged to their
        replicas as timeouts (their latency, their run of failures towards ejection).

        Not when the lateness may be ours or everyone's: woken more than
        ``stall_grace`` past the deadline (this search server was not running at it); its
        loop lagged while the query was out (an answer may have sat in a socket unread);
        it refused queries for its in-flight limit meanwhile or within a second before
        (it was at its capacity); more of the query's shards were late than outliers
        make (more than two, and more than a tenth of them: a busy machine or a stalled
        process of many data servers, not a slow replica); or, over all queries, more
        data servers than that (a tenth of the routable ones) timed out within the last
        second. The last is the same rule across queries: on a machine short of CPU
        each query has a shard or two late, a different one each time, so every query
        looked like one outlier, and a replica that happened to be late in three
        queries running was ejected (bench_overload, two CPU hogs: 25 timeouts charged
        to 21 data servers in 0.66 s). Widespread timeouts still count in their
        replicas' latency (:attr:`_Blame.LATENCY`): each was late among shards that
        answered, and the pickers may route around it (a fleet still warming up after a
        start), but none is a step towards ejection. A timeout is charged in full only
        when it is an outlier of a query that otherwise went on time, at a moment when
        the other replicas answer on time.
        """
        widespread = self._note_timeouts(calls)
        if now - q.deadline > self._stall_grace:
            why = "stall"
        elif self._loop_lag is not None and self._loop_lag.lagged_since(q.started):
            why = "lag"
        elif self._clock() - self._shed_at <= now - q.started + _SHED_HEDGE_PAUSE:
            # Refusing queries for its limit while this one ran (or just before): the
            # search server was at its capacity, and a late shard is the load's.
            why = "shedding"
        elif q.open_calls > max(_OUTLIERS, q.total // 10):
            why = "systemic"
        elif widespread > max(_OUTLIERS, self._routes.routable // 10):
            why = "widespread"
        else:
            return _Blame.FULL
        self.metrics.unblamed.labels(why=why).inc(q.open_calls)
        return _Blame.LATENCY if why == "widespread" else _Blame.NONE

    def _note_timeouts(self, calls: list[_ShardCall]) -> int:
        """Remember the replicas of ``calls`` still out at their query's deadline; how
        many replicas timed out within the last ``_TIMEOUT_WINDOW`` (these included).

        Amortised O(1) per timeout: the dict is in the order of the last timeout of
        each replica, so the expired ones are at its front."""
        now = self._clock()
        timed_out = self._timed_out
        for call in calls:
            if not call.done:
                for attempt in call.attempts:
                    # Moved to the end: the order stays that of the last timeout.
                    timed_out.pop(attempt.replica, None)
                    timed_out[attempt.replica] = now
        horizon = now - _TIMEOUT_WINDOW
        while timed_out:
            oldest = next(iter(timed_out))
            if timed_out[oldest] > horizon:
                break
            del timed_out[oldest]
        return len(timed_out)

    def _abandon(self, q: _Query, call: _ShardCall, timed_out: bool, *, blame: _Blame) -> None:
        """End a call still open at the deadline (``timed_out``) or at a cancellation.

        A timeout counts against its replicas as ``blame`` says (see :meth:`_blame`):
        their latency, and with it their run of failures towards ejection, or
        nothing (when the query woke up too late to tell their lateness from its own)."""
        call.done = True
        if call.hedge_timer is not None:
            call.hedge_timer.cancel()
            call.hedge_timer = None
        if timed_out:
            call.outcome = "timed_out"
        now = q.loop.time()
        for attempt in call.attempts:
            replica = attempt.replica
            replica.outstanding -= 1
            attempt.future.cancel()
            if not timed_out:
                continue
            if blame is not _Blame.NONE:
                replica.penalize(now - attempt.started)
            if blame is _Blame.FULL:
                self._record_failure(replica, "timeout", "no answer by the query deadline")
            else:
                self.metrics.shard_requests.labels(result="timeout").inc()
        call.attempts.clear()

    # -- health and metrics -----------------------------------------------------------

    def _flush_metrics(self) -> None:
        if self._pending_ok:
            self.metrics.shard_requests.labels(result="ok").inc(self._pending_ok)
            self._pending_ok = 0

    def _count_query(self, result: FanOutResult, took_ms: float) -> None:
        self.metrics.queries.labels(outcome="partial" if result.partial else "complete").inc()
        self.metrics.query_seconds.observe(took_ms / 1000)
        coverage = result.coverage
        if coverage is not None:
            self.metrics.coverage.observe(coverage.ratio)
            for reason in coverage.degraded:
                self.metrics.degraded.labels(reason=reason).inc()
        if result.partial:
            shards = result.shards
            log.debug(
                "partial answer: %d of %d shards failed, %d timed out, %d cut",
                shards["failed"],
                shards["total"],
                shards["timed_out"],
                shards["cut"],
            )

    def _record_failure(self, replica: Replica, result: str, detail: str) -> None:
        self.metrics.shard_requests.labels(result=result).inc()
        routable = self._routes.routable
        ejection = self._ejection
        capped = ejection.capped
        if ejection.record_failure(replica, self._clock(), routable=routable, detail=detail):
            self.metrics.ejections.inc()
            return
        if ejection.capped != capped:
            self.metrics.panic.labels(scope="cluster").inc()
        instance = replica.instance
        log.debug(
            "data server %s (%s:%d) %s: %s",
            instance.id,
            instance.address,
            instance.port,
            result,
            detail,
        )


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
