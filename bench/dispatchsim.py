"""The dispatch benchmark's world: a recorded trace of real searches, and a simulated
cluster of data servers that answers the real fan-out in virtual time.

:class:`Trace` is what ``bench/bench_dispatch.py`` replays for every policy: query texts
with Poisson arrival times and, for each query and shard, the time the real index took
to search it (:func:`record_trace` builds the shards as the data servers do and times
each search with ``time.perf_counter``). :class:`SimCluster` is a
:class:`~search_server.httpclient.SubrequestClient`: each ``get`` is a future resolved
on the (virtual-time) loop after the replica's network, queueing and service time,
with a body a real data server would send. Nothing here reads the real clock except
:func:`record_trace`; the same trace, parameters and seed give the same run.

**A replica** is one data server: one worker (the real one searches on one event
loop), scheduling its searches **round robin in slices** of ``slice_s`` of work (0.5 ms,
``data_server.searching.SLICE_WORK``), which is how the real one runs: ``run_search``
steps a search by a bounded slice and yields to the loop, whose ready queue is FIFO,
so the searches in progress and the handlers of new requests take turns slice by
slice. A search shorter than a slice (most of them) runs whole in its turn, as under
FIFO; longer ones share the worker, as under processor sharing: neither pure model
is the real server, round robin with its quantum is. A search costs its traced time
plus ``overhead_s`` (the HTTP server's own work per request, charged with its first
slice), times the replica's multiplier (1, or 10 when slowed: a slice takes ten times
as long, as on a machine starved of CPU). As the real handler does
(``data_server/handlers.py``): at most ``max_searches`` in progress (more: 429 at
once), a search stops at ``work_deadline`` of the budget its request carries
(``timeout_ms``, counted from its arrival: the real server counts its loop's lag) and
answers what it has, ``"cut": true``; one whose budget ran out before it could start
gets 504. A request abandoned by the search server is not cancelled on the replica
(aiohttp does not cancel a handler when its client goes): it keeps its place and
its work. ``took_ms`` is from the handler's start to the answer, ``queue`` the other
searches in progress; ``utilization`` (time-average of the searches in progress over
the last second), ``qps`` and ``eps`` (answers and errors in the last second) are
computed from the replica's own history.

**The network** adds ``net_s`` plus an exponential jitter of mean ``jitter_s`` each
way. **A killed replica** fails what it had in progress as a closed connection would
(after one way), and refuses new requests, as a connect to a closed port does, after
a round trip; :meth:`SimCluster.restart` brings it back as a new process with a new
registration (a new registration time: a new target to the fan-out, cold).
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import unquote_plus

import orjson

from data_server.corpus import generate_documents, sample_queries
from data_server.index import InvertedIndex
from data_server.searching import SLICE_WORK, work_deadline
from discovery.instance import InstancePayload, InstanceState, ServiceInstance
from search_server.httpclient import Endpoint, Response, SubrequestError

__all__ = [
    "ClusterShape",
    "SimCluster",
    "SimServer",
    "Trace",
    "arrivals",
    "best_of",
    "record_trace",
]

#: The query generator's variant ``data-server loadgen`` sends (``data_server/loadgen.py``).
LOADGEN_VARIANT = 11
#: The data server's cap of searches in progress (``--max-concurrent-searches``).
MAX_SEARCHES = 8
#: Its largest budget (``--max-timeout-ms``): a request asking more works no longer.
MAX_BUDGET_MS = 10_000
#: Registration times start here (milliseconds since the epoch), plus the virtual time.
EPOCH_MS = 1_700_000_000_000


# -- the trace ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Trace:
    """Queries, their Poisson arrival times at ``rate`` a second (seconds from the
    trace's start) and each query's search time on each shard (seconds; ``costs[i][s]``
    for ``queries[i]`` on shard ``s``), with how they were recorded (``meta``)."""

    queries: list[str]
    arrival_s: list[float]
    costs: list[list[float]]
    rate: float
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def shards(self) -> int:
        return len(self.costs[0])

    def shard_means(self) -> list[float]:
        """Each shard's mean search time over the trace's queries (seconds)."""
        count = len(self.costs)
        return [sum(row[s] for row in self.costs) / count for s in range(self.shards)]

    def save(self, path: Path) -> None:
        """Write the trace as JSON (times in milliseconds, rounded to the microsecond)."""
        record = {
            "trace": "dispatch",
            "meta": self.meta,
            "rate": self.rate,
            "queries": self.queries,
            "arrival_s": [round(t, 6) for t in self.arrival_s],
            "cost_ms": [[round(c * 1000, 3) for c in row] for row in self.costs],
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, separators=(",", ":")) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> Trace:
        """A trace :meth:`save` wrote. Raises ``ValueError`` for a file that is not one
        (``OSError`` from reading it propagates)."""
        record = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(record, dict) or record.get("trace") != "dispatch":
            raise ValueError(f"{path}: not a dispatch trace")
        queries, arrival, cost = record["queries"], record["arrival_s"], record["cost_ms"]
        if not queries or not len(queries) == len(arrival) == len(cost):
            raise ValueError(f"{path}: queries, arrival_s and cost_ms differ in length")
        if len({len(row) for row in cost}) != 1:
            raise ValueError(f"{path}: the queries' cost_ms have different numbers of shards")
        return cls(
            queries=[str(q) for q in queries],
            arrival_s=[float(t) for t in arrival],
            costs=[[float(c) / 1000 for c in row] for row in cost],
            rate=float(record["rate"]),
            meta=dict(record.get("meta", {})),
        )


#: The clocks a trace's searches can be timed with: the search's own CPU time (its
#: thread's: what it costs a data server with a core to itself, whatever else this
#: machine runs meanwhile), or the time that passed (``time.perf_counter``, which counts
#: the time other processes held the core too).
SEARCH_CLOCKS: dict[str, Callable[[], float]] = {
    "thread": time.thread_time,
    "wall": time.perf_counter,
}


def _time_search(
    index: InvertedIndex, query: str, k: int, clock: Callable[[], float] = time.thread_time
) -> float:
    """Seconds the real search of ``query`` takes on ``index`` by ``clock``, stepped by
    slices as the data server's ``run_search`` steps it (without its yields)."""
    started = clock()
    search = index.start_search(query, k)
    while not search.step(SLICE_WORK):
        pass
    search.hits()
    return clock() - started


def record_trace(
    *,
    shards: int,
    docs: int,
    queries: int,
    k: int,
    repeats: int,
    rate: Callable[[list[float]], float],
    seed: int = 0,
    clock: str = "thread",
    log: Callable[[str], None] = print,
) -> Trace:
    """Record a trace from the real index: ``shards`` shards of ``docs`` generated
    documents each (``generate_documents`` with ``seed``, as ``data-server --docs``
    builds them), ``queries`` query texts from the generator ``data-server loadgen``
    uses, each searched for ``k`` hits on every shard ``repeats`` times (in passes over
    all the queries, so that a burst of load on the machine hits one pass, not every
    repeat of a query) and the least time kept, by ``clock`` (a name of
    :data:`SEARCH_CLOCKS`). ``rate`` turns the shards' mean search times into the
    arrival rate the trace is stated at. One shard's index is held at a time.

    Why the thread's CPU time by default: on this 2-core machine shared with other
    work (load 3.4), the least of three ``perf_counter`` timings still read one shard's
    mean search 1.8 times and its p99 1.5 times what its CPU time was; the CPU time
    read within 10 % of a quiet run's.
    """
    timer = SEARCH_CLOCKS[clock]
    texts = sample_queries(queries, seed=seed, variant=LOADGEN_VARIANT)
    unique = list(dict.fromkeys(texts))
    best: dict[str, list[float]] = {q: [math.inf] * shards for q in unique}
    started = time.perf_counter()
    for shard in range(shards):
        index = InvertedIndex(generate_documents(docs, shard=shard, seed=seed))
        for _ in range(repeats):
            for query in unique:
                row = best[query]
                row[shard] = min(row[shard], _time_search(index, query, k, timer))
        del index
        log(
            f"  trace: shard {shard + 1}/{shards} timed "
            f"({time.perf_counter() - started:.0f} s so far)"
        )
    costs = [list(best[q]) for q in texts]
    count = len(costs)
    means = [sum(row[s] for row in costs) / count for s in range(shards)]
    stated = rate(means)
    rng = random.Random(f"dispatch-trace:{seed}")
    arrival: list[float] = []
    now = 0.0
    for _ in texts:
        now += rng.expovariate(stated)
        arrival.append(now)
    return Trace(
        queries=texts,
        arrival_s=arrival,
        costs=costs,
        rate=stated,
        meta={
            "shards": shards,
            "docs_per_shard": docs,
            "queries": queries,
            "unique_queries": len(unique),
            "k": k,
            "repeats": repeats,
            "search_clock": clock,
            "seed": seed,
            "loadgen_variant": LOADGEN_VARIANT,
            "slice_work": SLICE_WORK,
            "recorded_s": round(time.perf_counter() - started, 1),
        },
    )


#: What recordings must share to be one trace's timings (see :func:`best_of`).
_SAME_RECORDING = ("docs_per_shard", "queries", "k", "search_clock", "seed", "loadgen_variant")


def best_of(traces: list[Trace], rate: Callable[[list[float]], float]) -> Trace:
    """One trace of the least time of each search over ``traces``, recordings of the
    same queries on the same shards (the same generator, documents, seed, ``k`` and
    clock): the best of all their repeats, as :func:`record_trace` keeps the best of
    its own. Why: a recording times each shard's repeats back to back, in some ten
    seconds, and a burst of load on this machine that lasts them inflates that shard
    even by the thread's CPU time (a busy sibling hyperthread slows it); two recordings
    at different times are rarely hit on the same shard. ``rate`` states the trace's
    arrival rate from its shards' means, as in :func:`record_trace`; the arrival times
    are the first trace's, scaled to it. ``meta`` keeps each recording's shard means.
    Raises ``ValueError`` for traces that are not recordings of the same searches.
    """
    if not traces:
        raise ValueError("no trace to take the best of")
    first = traces[0]
    for other in traces[1:]:
        if other.queries != first.queries or other.shards != first.shards:
            raise ValueError("the traces do not hold the same queries on the same shards")
        for key in _SAME_RECORDING:
            if other.meta.get(key) != first.meta.get(key):
                raise ValueError(f"the traces were recorded with different {key}")
    costs = [
        [min(values) for values in zip(*rows, strict=True)]
        for rows in zip(*(trace.costs for trace in traces), strict=True)
    ]
    count = len(costs)
    means = [sum(row[s] for row in costs) / count for s in range(first.shards)]
    stated = rate(means)
    return Trace(
        queries=list(first.queries),
        arrival_s=[t * first.rate / stated for t in first.arrival_s],
        costs=costs,
        rate=stated,
        meta={
            **first.meta,
            "repeats": sum(int(trace.meta.get("repeats", 1)) for trace in traces),
            "recordings": len(traces),
            "recorded_s": round(sum(float(t.meta.get("recorded_s", 0)) for t in traces), 1),
            "recordings_shard_mean_ms": [
                [round(1000 * m, 3) for m in trace.shard_means()] for trace in traces
            ],
        },
    )


def arrivals(
    trace: Trace, count: int, rate: float, seed: int, *, replay: bool
) -> Iterator[tuple[float, int]]:
    """``count`` arrivals ``(seconds from the start, index of a trace query)``: with
    ``replay``, the trace's own arrival times (scaled to ``rate``) for its length, then
    its queries again in order with fresh Poisson arrivals at ``rate`` from a
    ``random.Random`` seeded with ``seed``; without, fresh arrivals from the start."""
    rng = random.Random(f"dispatch-arrivals:{seed}")
    scale = trace.rate / rate
    length = len(trace.queries)
    now = 0.0
    for i in range(count):
        if replay and i < length:
            now = trace.arrival_s[i] * scale
        else:
            now += rng.expovariate(rate)
        yield now, i % length


# -- the simulated cluster ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClusterShape:
    """The simulated cluster: ``shards`` x ``replicas`` data servers and their model
    (see the module doc for each figure's meaning; times in seconds)."""

    shards: int
    replicas: int
    docs: int
    overhead_s: float = 50e-6
    slice_s: float = 0.5e-3
    net_s: float = 100e-6
    jitter_s: float = 50e-6
    max_searches: int = MAX_SEARCHES
    groups: bool = False


@dataclass(slots=True, eq=False)
class _Job:
    """One request on a replica: what it asks and where its answer goes."""

    future: asyncio.Future[Response]
    query: str
    k: int
    budget_ms: int
    arrived: float
    work: float  # seconds of work left at multiplier 1
    started: float | None = None
    deadline: float = 0.0
    slice_work: float = 0.0  # the work of the slice now running


class _Window:
    """Events of the last second: their count (``qps``, ``eps``)."""

    __slots__ = ("_times",)

    def __init__(self) -> None:
        self._times: deque[float] = deque()

    def add(self, now: float) -> None:
        self._times.append(now)

    def rate(self, now: float) -> float:
        times = self._times
        while times and times[0] <= now - 1.0:
            times.popleft()
        return float(len(times))


class _Level:
    """The time-average of a level (searches in progress) over the last second, from
    its running integral: O(1) per change and per reading, amortised."""

    __slots__ = ("_area", "_born", "_history", "_last", "level")

    def __init__(self, now: float) -> None:
        self.level = 0
        self._area = 0.0  # the integral from birth to _last
        self._last = now
        self._born = now
        # (time of a change, the integral at it, the level after it)
        self._history: deque[tuple[float, float, int]] = deque([(now, 0.0, 0)])

    def change(self, now: float, by: int) -> None:
        self._area += self.level * (now - self._last)
        self._last = now
        self.level += by
        self._history.append((now, self._area, self.level))

    def average(self, now: float) -> float:
        """The level's time-average over the last second (over the replica's life when
        it is younger)."""
        start = max(now - 1.0, self._born)
        if now <= start:
            return float(self.level)
        history = self._history
        while len(history) > 1 and history[1][0] <= start:
            history.popleft()
        at, area, level = history[0]
        before = area + level * (start - at)
        area_now = self._area + self.level * (now - self._last)
        return (area_now - before) / (now - start)


class SimServer:
    """One data server process of the simulated cluster (see the module doc): its queue,
    its worker, its history. A restart makes a new one."""

    def __init__(
        self,
        cluster: SimCluster,
        instance: ServiceInstance,
        multiplier: float,
    ) -> None:
        self.cluster = cluster
        self.instance = instance
        self.shard = instance.payload.shard
        self.multiplier = multiplier
        self.up = True
        now = cluster.loop.time()
        self._ready: deque[_Job] = deque()
        self._running: _Job | None = None
        self._in_progress: set[_Job] = set()
        self._level = _Level(now)
        self._answers = _Window()
        self._errors = _Window()
        # What it did, for the benchmark's figures.
        self.requests = 0  # that reached it, up or down
        # Of them, those that reached it while it was slowed, or down (refused).
        self.faulty_requests = 0
        self.busy = 0.0  # seconds its worker worked
        self.answered = 0
        self.cut = 0
        self.faulty_cut = 0  # of them, cut while it was slowed
        self.refused = 0

    # -- requests in -------------------------------------------------------------------

    def arrive(self, job: _Job) -> None:
        """A request reaches the server (after its way over the network)."""
        self.requests += 1
        if not self.up:
            self.faulty_requests += 1
            self.cluster.fail_later(job.future, "refused", one_way=True)
            return
        if self.multiplier > 1.0:
            self.faulty_requests += 1
        self._ready.append(job)
        if self._running is None:
            self._next()

    def _next(self) -> None:
        """Give the worker to the next job of the ready queue, if any."""
        loop = self.cluster.loop
        while self._ready:
            job = self._ready.popleft()
            now = loop.time()
            if job.started is None:
                # The handler's first turn: admission, then the budget, as handlers.py.
                if len(self._in_progress) >= self.cluster.shape.max_searches:
                    self._answer_error(job, 429)
                    continue
                if now >= job.deadline:
                    self._answer_error(job, 504)
                    continue
                job.started = now
                self._in_progress.add(job)
                self._level.change(now, 1)
                first = self.cluster.shape.overhead_s
            else:
                if now >= job.deadline:
                    # Back from its yield past the deadline: stops with what it has.
                    self._answer(job, cut=True)
                    continue
                first = 0.0
            job.slice_work = min(job.work, self.cluster.shape.slice_s)
            self._running = job
            busy = (first + job.slice_work) * self.multiplier
            self.busy += busy
            loop.call_at(now + busy, self._slice_done, job)
            return
        self._running = None

    def _slice_done(self, job: _Job) -> None:
        self._running = None
        if not self.up:
            return  # killed meanwhile: its requests failed then
        job.work -= job.slice_work
        now = self.cluster.loop.time()
        if job.work <= 1e-12:
            self._answer(job, cut=False)
        elif now >= job.deadline:
            self._answer(job, cut=True)
        else:
            self._ready.append(job)  # yields to the loop: to the back of the queue
        self._next()

    # -- answers out -------------------------------------------------------------------

    def _answer(self, job: _Job, *, cut: bool) -> None:
        loop = self.cluster.loop
        now = loop.time()
        started = job.started if job.started is not None else now
        self._in_progress.discard(job)
        self._answers.add(now)
        self.answered += 1
        if cut:
            self.cut += 1
            if self.multiplier > 1.0:
                self.faulty_cut += 1
        shard = self.shard
        body = {
            "hits": self.cluster.hits(job.query, shard, job.k),
            "shard": shard,
            "took_ms": round((now - started) * 1000, 3),
            # The others in progress: this one is still counted until it leaves.
            "queue": len(self._in_progress),
            "cut": cut,
            "utilization": round(self._level.average(now), 3),
            "qps": self._answers.rate(now),
            "eps": self._errors.rate(now),
        }
        self._level.change(now, -1)
        self.cluster.deliver(job.future, (200, orjson.dumps(body)))

    def _answer_error(self, job: _Job, status: int) -> None:
        now = self.cluster.loop.time()
        self._errors.add(now)
        self.refused += 1
        if status == 429:
            body: dict[str, Any] = {
                "error": f"this data server is full: {len(self._in_progress)} searches in "
                f"progress, its limit is {self.cluster.shape.max_searches}; retry later "
                "or elsewhere",
                "in_progress": len(self._in_progress),
                "limit": self.cluster.shape.max_searches,
            }
        else:
            body = {
                "error": f"the search's budget of {job.budget_ms} ms ran out before it could start",
                "timeout_ms": job.budget_ms,
            }
        self.cluster.deliver(job.future, (status, orjson.dumps(body)))

    def kill(self) -> None:
        """The process dies: what it has in progress or queued fails as its connections
        close; it refuses from now on."""
        self.up = False
        jobs = list(self._ready)
        if self._running is not None:
            jobs.append(self._running)
        jobs.extend(self._in_progress)
        for job in dict.fromkeys(jobs):
            self.cluster.fail_later(job.future, "closed", one_way=True)
        self._ready.clear()
        self._in_progress.clear()
        self._running = None


class SimCluster:
    """The simulated data servers of ``shape`` on ``loop``, answering the searches of
    ``trace``; a :class:`~search_server.httpclient.SubrequestClient` for a real
    :class:`~search_server.fanout.FanOut`. ``rng`` draws the network's jitter.

    :attr:`live` is the live list a search server would route with (a new tuple at
    each change, as the routing table expects); :attr:`sent` counts sub-requests.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        trace: Trace,
        shape: ClusterShape,
        *,
        rng: random.Random,
    ) -> None:
        if trace.shards < shape.shards:
            raise ValueError(f"the trace has {trace.shards} shards, the cluster {shape.shards}")
        self.loop = loop
        self.shape = shape
        self._rng = rng
        self._costs = {q: row for q, row in zip(trace.queries, trace.costs, strict=True)}
        self._query_ids = {q: i for i, q in enumerate(dict.fromkeys(trace.queries))}
        self._servers: dict[tuple[str, int], SimServer] = {}
        self._slots: dict[tuple[int, int], SimServer] = {}
        self._processes: list[SimServer] = []
        for shard in range(shape.shards):
            for replica in range(shape.replicas):
                self._start(shard, replica, multiplier=1.0)
        self.live: tuple[ServiceInstance, ...] = tuple(s.instance for s in self._slots.values())
        self.sent = 0
        self._hits: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
        # A query's target without its timeout_ms (the fan-out's prefix): (q, k).
        self._parsed: dict[bytes, tuple[str, int]] = {}

    # -- the cluster's life --------------------------------------------------------------

    def _instance(self, shard: int, replica: int) -> ServiceInstance:
        payload: dict[str, Any] = {
            "shard": shard,
            "replica": replica,
            "docs": self.shape.docs,
            "version": "sim",
            "state": InstanceState.SERVING,
        }
        if self.shape.groups:
            payload["group"] = group_value(replica)
        return ServiceInstance.create(
            "data_servers",
            f"ds-{shard}-{replica}",
            f"10.{shard // 256}.{shard % 256}.{replica + 1}",
            9001,
            InstancePayload(**payload),
            clock=lambda: EPOCH_MS / 1000 + self.loop.time(),
        )

    def _start(self, shard: int, replica: int, *, multiplier: float) -> SimServer:
        instance = self._instance(shard, replica)
        server = SimServer(self, instance, multiplier)
        self._servers[(instance.address, instance.port)] = server
        self._slots[(shard, replica)] = server
        self._processes.append(server)
        return server

    @property
    def processes(self) -> tuple[SimServer, ...]:
        """Every data server process started, the restarted ones' old and new."""
        return tuple(self._processes)

    def busy(self) -> dict[tuple[int, int], float]:
        """Seconds each replica's workers (its processes, a restart's included) worked."""
        busy = dict.fromkeys(self._slots, 0.0)
        for server in self._processes:
            payload = server.instance.payload
            busy[(payload.shard, payload.replica)] += server.busy
        return busy

    def healthy(self, instance: ServiceInstance) -> bool:
        """Whether the process at ``instance``'s address is up and not slowed (what the
        fan-out has to learn, for a reference policy that knows it)."""
        server = self._servers.get((instance.address, instance.port))
        return server is not None and server.up and server.multiplier <= 1.0

    def server(self, shard: int, replica: int) -> SimServer:
        """The process now serving replica ``replica`` of ``shard``."""
        return self._slots[(shard, replica)]

    def slow(self, shard: int, replica: int, multiplier: float) -> None:
        """Its slices take ``multiplier`` times their work from now on (1: normal)."""
        self._slots[(shard, replica)].multiplier = multiplier

    def kill(self, shard: int, replica: int) -> None:
        """The process dies; its registration stays listed (its session has not
        expired yet), so the fan-out still sends to it and is refused."""
        self._slots[(shard, replica)].kill()

    def restart(self, shard: int, replica: int) -> None:
        """A new process registers anew (a new registration time: a new target to the
        fan-out) and replaces the old registration in :attr:`live`."""
        old = self._slots[(shard, replica)]
        new = self._start(shard, replica, multiplier=old.multiplier)
        self.live = tuple(new.instance if i is old.instance else i for i in self.live)

    # -- SubrequestClient ----------------------------------------------------------------

    def get(
        self, endpoint: Endpoint, target: bytes, max_body: int | None = None
    ) -> asyncio.Future[Response]:
        """Send the search ``target`` to the replica at ``endpoint``: a future of
        ``(status, body)``, or failing with ``SubrequestError`` as the real client's."""
        self.sent += 1
        future: asyncio.Future[Response] = self.loop.create_future()
        server = self._servers.get((endpoint.host, endpoint.port))
        if server is None:
            future.set_exception(SubrequestError(f"cannot connect to {endpoint.where}: no host"))
            return future
        prefix, _, budget_ms = target.rpartition(b"&timeout_ms=")
        parsed = self._parsed.get(prefix)
        if parsed is None:
            parsed = self._parsed[prefix] = _parse(prefix)
        query, k = parsed
        budget = min(int(budget_ms), MAX_BUDGET_MS)
        now = self.loop.time()
        arrive_at = now + self._one_way()
        work = self._costs[query][server.shard]
        job = _Job(future, query, k, budget, arrive_at, work)
        job.deadline = work_deadline(arrive_at, budget)
        self.loop.call_at(arrive_at, _arrive, self, endpoint, job)
        return future

    async def aclose(self) -> None:
        """Nothing to close: no connections."""

    # -- the network -------------------------------------------------------------------

    def _one_way(self) -> float:
        jitter = self.shape.jitter_s
        return self.shape.net_s + (self._rng.expovariate(1.0 / jitter) if jitter > 0 else 0.0)

    def deliver(self, future: asyncio.Future[Response], response: Response) -> None:
        """Send ``response`` back: it arrives one way later, unless abandoned."""
        self.loop.call_at(self.loop.time() + self._one_way(), _resolve, future, response)

    def fail_later(self, future: asyncio.Future[Response], why: str, *, one_way: bool) -> None:
        """Fail ``future`` as the real client does when the connection is ``closed``
        under a request or ``refused`` (the reset comes back one way later)."""
        message = "closed the connection" if why == "closed" else "cannot connect: refused"
        error = SubrequestError(f"simulated data server {message}")
        self.loop.call_at(self.loop.time() + self._one_way(), _fail, future, error)

    def hits(self, query: str, shard: int, k: int) -> list[dict[str, Any]]:
        """``k`` hits of a data server's answer to ``query`` (ids and scores made up,
        the same for the same query: the search's work is what the trace holds)."""
        key = (query, shard, k)
        cached = self._hits.get(key)
        if cached is None:
            number = self._query_ids.get(query, 0)
            cached = self._hits[key] = [
                {
                    "id": f"s{shard}-{(number * 7919 + i * 104729) % 1_000_003}",
                    "score": round(12.0 / (1 + i) + shard * 1e-4, 6),
                    "title": f"Hit {i} of {query[:40]}",
                }
                for i in range(k)
            ]
        return cached


def group_value(replica: int) -> Any:
    """The payload's ``group`` for replica ``replica`` (replica ``r`` of every shard is
    in group ``r``: each group a full copy), in the type the payload's field declares."""
    for f in fields(InstancePayload):
        if f.name == "group":
            return replica if "int" in str(f.type) else f"g{replica}"
    raise ValueError("this InstancePayload has no group field")


def payload_has_group() -> bool:
    """Whether replicas can be registered in groups (``InstancePayload.group``)."""
    return any(f.name == "group" for f in fields(InstancePayload))


def _parse(prefix: bytes) -> tuple[str, int]:
    """``(q, k)`` of a fan-out's ``/search?q=..&k=..`` (its target less ``timeout_ms``).
    Raises ``ValueError`` for one that lacks either (a bug of the benchmark)."""
    _, _, params = prefix.partition(b"?")
    query: str | None = None
    k: int | None = None
    for part in params.split(b"&"):
        name, _, value = part.partition(b"=")
        if name == b"q":
            query = unquote_plus(value.decode("ascii"))
        elif name == b"k":
            k = int(value)
    if query is None or k is None:
        raise ValueError(f"not a fan-out's search target: {prefix!r}")
    return query, k


def _arrive(cluster: SimCluster, endpoint: Endpoint, job: _Job) -> None:
    # The process at the address now (a restart may have replaced the one sent to).
    cluster._servers[(endpoint.host, endpoint.port)].arrive(job)


def _resolve(future: asyncio.Future[Response], response: Response) -> None:
    if not future.done():
        future.set_result(response)


def _fail(future: asyncio.Future[Response], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
