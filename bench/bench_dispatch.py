"""Dispatch policies compared on one recorded trace and one simulated cluster (issue 43).

The real fan-out (``search_server.fanout.FanOut``: its picker, hedging, ejection,
retries, retry budget, warm-up and slow start) runs on a virtual-time event loop
(``bench/simloop.py``) against a simulated cluster of data servers
(``bench/dispatchsim.py``: one worker per replica scheduling its searches round robin in
slices as the real data server does, its admission cap, its budgets, the network's
latency and jitter). Each search's cost is the time the real index took for that query
on that shard, recorded once into a trace (``bench/results/dispatch-trace-<label>.json``;
``--trace FILE`` replays a saved one, so that every policy and every later run sees the
same). Virtual time makes tens of thousands of queries per policy and phase take
seconds, and a run exactly reproducible: same trace, arguments and seed, same figures.

**Cluster**: ``--shards`` (10) x ``--replicas`` (3), ``--docs`` generated documents a
shard; the arrival rate loads the busiest shard's replicas to ``--utilization`` (0.4)
at an even spread; one search server; deadline ``--timeout-ms``.

**Phases**, each run for each policy from a fresh fan-out and a fresh cluster: a
trickle of 20 queries a second (``--settle-rate``) for 35 s of virtual time, then a
warm-up of ``--warmup`` queries at the phase's rate (neither counted), then
``--queries`` measured ones over a window of ``T = queries / rate`` seconds. The
trickle is there because a search server in production has run for long, past its
policy's own time constants, while the warm-up lasts under a second: slow start ramps
every replica new to the fan-out over 30 s, and the ``wrr`` picker uses a replica's
reported load only after a blackout of 10 s (``WrrConfig.blackout``, not shortened
here). Its length is the longest of them at their defaults plus 5 s (``SETTLE_S``), the
same for every policy so that every window follows the same history (longer for a
policy whose own constants were longer). The phases:

* ``baseline``: nothing slowed;
* ``slow``: replica 0 of shard 0 slowed 10x (``--slow-factor``) for the whole window;
* ``turns``: the replicas of shard 0 slowed 10x in turn, one at a time, each for a
  third of the window;
* ``restart``: replica 0 of shard 0 killed at 10 % of the window (its registration
  still listed: it refuses), back at 35 % as a new registration (cold to the fan-out);
* ``slow-shard`` (only when ``--phases`` names it): every replica of shard 0 slowed 10x
  for the whole window, a shard slow everywhere, which no choice of replica helps and
  only the coverage policy can (on 20 shards or more: see ``ours-cov95``).

**Policies** (the same ejection, retries, retry budget, warm-up cap and fixed in-flight
limit for all; the search server's gradient admission is left out, so that no policy's
queries are refused for its latency): ``oracle`` least outstanding of two random
among the replicas the simulation has not slowed or killed (it knows at once what the
others must learn: a floor for reading their figures, not a policy), ``rr`` round
robin (a baseline only), ``p2c``
least outstanding of two random (Envoy's default, whose outlier detection and retries
ours stand in for; no hedging), ``ars`` adaptive replica selection (Elasticsearch's; no
hedging), none of these four with ours' latency outlier demotion; ``ours`` the search
server's defaults (ARS, hedging, slow start, demotion), ``ours-wrr``
the same with the ``wrr`` picker (server-reported load) and ``ours-groups`` with the
replicas registered in groups (replica ``r`` of every shard in group ``r``; skipped,
said so, on a tree whose payload has no group). Run only when ``--policies`` names
them: ``ours-no-hedging`` and ``ours-no-demotion`` (ours with hedging or latency
outlier demotion off, to tell what each does) and
``ours-cov95``, ours with the coverage policy ``CoveragePolicy(min_coverage=0.95)``
(adaptive wait 1, its default; no soft timeout): once 95 % of the corpus has answered,
the rest get as long again as that took. On shards of equal size 95 % of fewer than 20
is every shard, the policy never ends a query early and the run would be ours again:
it is skipped, said so, there.

**Figures** per policy and phase: queries, p50 / p99 / p99.9 latency, share of partial
answers, extra requests ((sub-requests sent - first requests) / first requests; first
requests = the shards each query asked), hedges sent, retries, ejections, the share of
the phases' shard's requests that reached a replica while it was slowed or down, and
p99.9 over the policy's own baseline p99.9 and over ours'; a second table gives the
partial answers: their share, the answers' mean coverage (percent of the corpus) and
their reasons (``adaptive_wait``, ``deadline``, ``overload``, ``cut``...). The JSON adds
hedges won and not sent (``systemic``, ``over_budget``, ``own_lag``, ``shedding``), the
data servers' refusals and cut answers (and those cut by a slowed replica), shard 0's
requests by replica, the queries by replica group, the replicas' utilisation. Goal
(issue 43) for ours, in the phases slow, turns and restart: p99.9 at most 1.2x its
baseline, at most 3 % extra requests; the oracle's ratio is printed beside it, and how
far a row is from it in queries: those slower than 1.2x its baseline's p99.9, against
the 0.1 % (20 of 20,000) a p99.9 within that line allows (a p99.9 at the deadline
hides how far). Writes
``bench/results/dispatch-<label>.json``. Each ``(policy, phase)`` runs in a process of
its own (``--jobs`` at once): virtual time does not depend on how many share the cores.

Usage: ``.venv/bin/python bench/bench_dispatch.py [--quick] [--trace FILE] [--label L]``
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import ROOT, nearest_rank, quick_defaults, write_results
from dispatchsim import (
    ClusterShape,
    SimCluster,
    Trace,
    arrivals,
    best_of,
    group_value,
    payload_has_group,
    record_trace,
)
from simloop import run

from discovery.errors import OverloadedError
from search_server.coverage import CoveragePolicy
from search_server.fanout import FanOut
from search_server.fanoutconfig import FanOutConfig
from search_server.merging import FanOutResult
from search_server.picking import (
    AdaptiveReplicaSelection,
    PowerOfTwoChoices,
    Replica,
    ReplicaPicker,
    make_picker,
)
from search_server.retrybudget import RetryBudget
from search_server.slowstart import SlowStart
from search_server.wrr import WeightedRoundRobin, WrrConfig

RESULTS = ROOT / "bench" / "results"
PHASES = ("baseline", "slow", "turns", "restart", "slow-shard")
#: What a run measures unless ``--phases`` says otherwise: ``slow-shard`` (every replica
#: of a shard slowed) only when named, for the coverage policy on a cluster of 20 shards
#: or more: on fewer, no policy of the run can do anything about it.
DEFAULT_PHASES = ("baseline", "slow", "turns", "restart")
#: The shard whose replicas the phases slow or restart.
SHARD = 0
#: The restart phase: killed at this share of the window, back at the second.
RESTART_AT = (0.10, 0.35)
#: Queries a second of the trickle every policy runs before its warm-up (see _run_phase;
#: ``--settle-rate``).
SETTLE_RATE = 20.0
#: Seconds the trickle runs past the longest of a policy's own time constants.
SETTLE_MARGIN = 5.0
#: The trickle's length for every policy: past the longest time constant any policy of
#: :data:`POLICIES` has at its defaults (slow start's 30 s ramp, the wrr picker's 10 s
#: blackout before a replica's reported load is used), plus :data:`SETTLE_MARGIN`. The
#: same for all, so that every policy's window follows the same history.
SETTLE_S = max(SlowStart().window, WrrConfig().blackout) + SETTLE_MARGIN
#: Issue 43's goal for ours: p99.9 at most this times its no-slow baseline...
GOAL_P999_RATIO = 1.2
#: ... and at most this many extra requests (percent of first requests).
GOAL_EXTRA_PCT = 3.0


class RoundRobin:
    """Each shard's candidates in turn, a counter per shard: blind to load and speed
    (the baseline of the comparison, not a policy to ship)."""

    def __init__(self) -> None:
        self._next: dict[int, int] = {}

    def pick(self, candidates: Sequence[Replica]) -> Replica:
        shard = candidates[0].shard
        turn = self._next.get(shard, 0)
        self._next[shard] = turn + 1
        return candidates[turn % len(candidates)]


class Oracle:
    """Least outstanding of two random among the candidates the simulation has not
    slowed or killed (of all of them when none is left): what a policy that knew at
    once what the others must learn would do. A floor for reading the others' figures,
    not a policy; :attr:`cluster` is set once the cluster is made."""

    def __init__(self, rng: random.Random) -> None:
        self._p2c = PowerOfTwoChoices(rng)
        self.cluster: SimCluster | None = None

    def pick(self, candidates: Sequence[Replica]) -> Replica:
        cluster = self.cluster
        if cluster is None:
            return self._p2c.pick(candidates)
        healthy = [replica for replica in candidates if cluster.healthy(replica.instance)]
        return self._p2c.pick(healthy or candidates)


@dataclass(frozen=True, slots=True)
class Built:
    """What a policy runs with: the fan-out's settings and picker, and whether the
    cluster registers its replicas in groups."""

    config: FanOutConfig
    picker: ReplicaPicker
    groups: bool = False


#: A policy's maker: given the loop's clock and an RNG, what it runs with, or why it
#: cannot run in this tree.
Maker = Callable[[Callable[[], float], random.Random], "Built | str"]


def _no_hedging(picker: ReplicaPicker) -> Built:
    # The generic policies as their systems have them: neither hedging nor latency
    # outlier demotion (ours); the same ejection, retries and limits as ours.
    return Built(FanOutConfig(hedge_ratio=0.0, demote_ratio=0.0), picker)


def _ours(
    picker: ReplicaPicker, *, groups: bool = False, coverage: CoveragePolicy | None = None
) -> Built:
    # The search server's defaults (search_server/config.py): hedging at 5 %, slow start
    # over 30 s; the rest are FanOutConfig's own defaults, which are the server's.
    policy = coverage if coverage is not None else CoveragePolicy()
    return Built(FanOutConfig(slow_start=SlowStart(), coverage=policy), picker, groups)


def time_constants(built: Built) -> dict[str, float]:
    """The seconds a policy takes to see the cluster as a search server that has run
    for long does: slow start's ramp (every replica is new to a fresh fan-out) and the
    wrr picker's blackout (a replica's reported load is used only after it)."""
    constants = {"slow start's ramp": built.config.slow_start.window}
    if isinstance(built.picker, WeightedRoundRobin):
        constants["wrr's blackout"] = built.picker.config.blackout
    return constants


def settle_seconds(built: Built) -> float:
    """How long the trickle before ``built``'s warm-up runs: :data:`SETTLE_S`, or longer
    for a policy whose own time constants are longer than the defaults'."""
    return max(SETTLE_S, max(time_constants(built).values()) + SETTLE_MARGIN)


#: The coverage policy ``ours-cov95`` runs with: 95 % of the corpus, then the rest have
#: as long again as the coverage took (adaptive_wait 1, its default), no soft timeout.
COV95 = CoveragePolicy(min_coverage=0.95, soft_timeout=0.0, adaptive_wait=1.0)


def coverage_meaningless(built: Built, shards: int) -> str | None:
    """Why ``built``'s coverage policy cannot end a query early on ``shards`` shards of
    equal size (its minimum is every shard), or None when it can, or has none."""
    policy = built.config.coverage
    if not policy.active or (shards - 1) / shards + 1e-9 >= policy.min_coverage:
        return None
    needed = math.ceil(1 / (1 - policy.min_coverage) - 1e-9)
    return (
        f"meaningless on {shards} shards: {policy.min_coverage:.0%} of them is every shard, "
        f"so the coverage policy never ends a query early (ours exactly); it needs "
        f"{needed} shards or more"
    )


def _wrr(clock: Callable[[], float], rng: random.Random) -> Built | str:
    # On the fan-out's clock: the picker times the reports' blackout and expiry on it.
    return _ours(make_picker("wrr", rng, clock=clock))


def _groups(clock: Callable[[], float], rng: random.Random) -> Built | str:
    if not payload_has_group():
        return "pending: InstancePayload has no group field (groups are not in this tree)"
    return _ours(AdaptiveReplicaSelection(rng=rng), groups=True)


POLICIES: dict[str, tuple[str, Maker]] = {
    "oracle": (
        "knows which replica is slowed or down (a floor, not a policy), no hedging",
        lambda c, r: _no_hedging(Oracle(r)),
    ),
    "rr": ("round robin, no hedging (a baseline)", lambda c, r: _no_hedging(RoundRobin())),
    "p2c": (
        "least outstanding of two random (Envoy's default), no hedging",
        lambda c, r: _no_hedging(PowerOfTwoChoices(r)),
    ),
    "ars": (
        "adaptive replica selection (Elasticsearch's), no hedging",
        lambda c, r: _no_hedging(AdaptiveReplicaSelection(rng=r)),
    ),
    "ours": (
        "the search server's defaults: ARS, hedging, slow start",
        lambda c, r: _ours(AdaptiveReplicaSelection(rng=r)),
    ),
    "ours-wrr": ("ours with the wrr picker (server-reported load)", _wrr),
    "ours-groups": ("ours with the replicas registered in groups", _groups),
    "ours-no-hedging": (
        "ours with hedging off (a diagnostic: what hedging does to ours)",
        lambda c, r: Built(
            FanOutConfig(hedge_ratio=0.0, slow_start=SlowStart()), AdaptiveReplicaSelection(rng=r)
        ),
    ),
    "ours-no-demotion": (
        "ours with latency outlier demotion off (a diagnostic: what demotion does to ours)",
        lambda c, r: Built(
            FanOutConfig(slow_start=SlowStart(), demote_ratio=0.0), AdaptiveReplicaSelection(rng=r)
        ),
    ),
    "ours-cov95": (
        "ours with the coverage policy: 95 % minimum coverage, adaptive wait 1, no soft "
        "timeout (needs 20 shards or more)",
        lambda c, r: _ours(AdaptiveReplicaSelection(rng=r), coverage=COV95),
    ),
}
#: What a run compares unless ``--policies`` says otherwise: every policy but the
#: diagnostic ones and the coverage policy's (which needs a cluster of 20 shards).
DEFAULT_POLICIES = ("oracle", "rr", "p2c", "ars", "ours", "ours-wrr", "ours-groups")


@dataclass(slots=True)
class Tally:
    """The measured queries of one run."""

    latencies_ms: list[float] = field(default_factory=list)
    partial: int = 0
    # Partial answers by reason (coverage.degraded: deadline, overload, error, cut...;
    # an answer may have several).
    reasons: Counter[str] = field(default_factory=Counter)
    refused: int = 0
    first_requests: int = 0
    # The sum of the answers' coverage (Coverage.ratio: the share of the corpus's
    # documents their shards hold, cut ones included; 1 without a coverage).
    coverage: float = 0.0

    def add(self, result: FanOutResult, latency_ms: float) -> None:
        self.latencies_ms.append(latency_ms)
        self.coverage += 1.0 if result.coverage is None else result.coverage.ratio
        if result.partial:
            self.partial += 1
            if result.coverage is not None:
                self.reasons.update(result.coverage.degraded)
        shards = result.shards
        self.first_requests += shards["total"] - shards.get("missing", 0)


#: What a run counts besides its queries: the requests that reached the replicas of the
#: shard the phases slow or restart, and of them those that reached one while it was
#: slowed or down; the fan-out's hedges (sent, won, and not sent: ``systemic`` when more
#: of the query's shards were out than outliers make, ``over_budget`` when the budgets
#: were spent, ``own_lag`` and ``shedding``), retries and ejections; the data servers'
#: refusals (429 full, 504 out of budget) and answers cut at their budget, and of those
#: the ones cut by a replica while it was slowed.
COUNTERS = (
    "shard_requests",
    "to_faulty",
    "hedges",
    "hedges_won",
    "hedges_systemic",
    "hedges_over_budget",
    "hedges_own_lag",
    "hedges_shedding",
    "retries",
    "ejections",
    "server_refusals",
    "server_cut",
    "faulty_cut",
)


def _counters(fanout: FanOut, cluster: SimCluster) -> dict[str, float]:
    """The values of :data:`COUNTERS` now."""

    def counter(name: str, **labels: str) -> float:
        value = fanout.registry.get_sample_value(f"search_server_fanout_{name}_total", labels)
        return value or 0.0

    processes = cluster.processes
    shard = [server for server in processes if server.shard == SHARD]
    return {
        "shard_requests": sum(server.requests for server in shard),
        "to_faulty": sum(server.faulty_requests for server in shard),
        "hedges": counter("hedges", result="sent"),
        "hedges_won": counter("hedges", result="won"),
        "hedges_systemic": counter("hedges", result="systemic"),
        "hedges_over_budget": counter("hedges", result="over_budget"),
        "hedges_own_lag": counter("hedges", result="own_lag"),
        "hedges_shedding": counter("hedges", result="shedding"),
        "retries": counter("retries"),
        "ejections": counter("ejections"),
        "server_refusals": sum(server.refused for server in processes),
        "server_cut": sum(server.cut for server in processes),
        "faulty_cut": sum(server.faulty_cut for server in processes),
    }


def _shard_spread(cluster: SimCluster) -> list[int]:
    """The requests that reached each replica of the phases' shard (its processes, a
    restart's included), by replica number."""
    spread = [0] * cluster.shape.replicas
    for server in cluster.processes:
        if server.shard == SHARD:
            spread[server.instance.payload.replica] += server.requests
    return spread


def _group_queries(fanout: FanOut, replicas: int) -> dict[str, int]:
    """Queries whose first requests went to each replica group so far (none without
    groups): group ``r`` holds replica ``r`` of every shard."""
    counts: dict[str, int] = {}
    if not payload_has_group():
        return counts
    for replica in range(replicas):
        name = str(group_value(replica))
        value = fanout.registry.get_sample_value(
            "search_server_fanout_group_queries_total", {"group": name}
        )
        if value:
            counts[name] = int(value)
    return counts


def _schedule(
    loop: asyncio.AbstractEventLoop,
    cluster: SimCluster,
    phase: str,
    t0: float,
    window: float,
    slow_factor: float,
    replicas: int,
) -> list[str]:
    """Schedule ``phase``'s events on ``loop`` from ``t0``; what they are, in words."""
    events: list[str] = []
    if phase == "slow":
        loop.call_at(t0, cluster.slow, SHARD, 0, slow_factor)
        events.append(f"0 s: shard {SHARD} replica 0 slowed {slow_factor:g}x to the end")
    elif phase == "turns":
        turn = window / replicas
        for replica in range(replicas):
            at = t0 + replica * turn
            if replica:
                loop.call_at(at, cluster.slow, SHARD, replica - 1, 1.0)
            loop.call_at(at, cluster.slow, SHARD, replica, slow_factor)
            events.append(
                f"{replica * turn:.1f} s: shard {SHARD} replica {replica} slowed "
                f"{slow_factor:g}x for {turn:.1f} s"
            )
        loop.call_at(t0 + window, cluster.slow, SHARD, replicas - 1, 1.0)
    elif phase == "slow-shard":
        for replica in range(replicas):
            loop.call_at(t0, cluster.slow, SHARD, replica, slow_factor)
        events.append(f"0 s: every replica of shard {SHARD} slowed {slow_factor:g}x to the end")
    elif phase == "restart":
        down, up = (share * window for share in RESTART_AT)
        loop.call_at(t0 + down, cluster.kill, SHARD, 0)
        loop.call_at(t0 + up, cluster.restart, SHARD, 0)
        events.append(
            f"{down:.1f} s: shard {SHARD} replica 0 killed (still listed, refusing); "
            f"{up:.1f} s: back as a new registration ({up - down:.1f} s down)"
        )
    return events


async def _drive(
    fanout: FanOut,
    cluster: SimCluster,
    trace: Trace,
    schedule: Iterable[tuple[float, int]],
    start: float,
    *,
    k: int,
    timeout_ms: int,
    tally: Tally | None,
) -> None:
    """Send the queries of ``schedule`` at their times from ``start`` (open loop: each
    its own task, whatever the others do) and wait for the last; count them in
    ``tally`` if given."""
    loop = asyncio.get_running_loop()
    pending: set[asyncio.Task[None]] = set()

    async def one(query: str) -> None:
        sent = loop.time()
        try:
            # The live list as it is when the query starts (a restart replaces it).
            result = await fanout.search(cluster.live, query, k, timeout_ms)
        except OverloadedError:
            if tally is not None:
                tally.refused += 1
            return
        if tally is not None:
            tally.add(result, (loop.time() - sent) * 1000)

    for at, index in schedule:
        delay = start + at - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        task = loop.create_task(one(trace.queries[index]))
        pending.add(task)
        task.add_done_callback(pending.discard)
    while pending:
        await asyncio.gather(*pending)


async def _run_phase(
    trace: Trace,
    shape: ClusterShape,
    built: Built,
    phase: str,
    args: argparse.Namespace,
    rate: float,
) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    seed = args.seed
    cluster = SimCluster(loop, trace, shape, rng=random.Random(f"net:{seed}:{phase}"))
    if isinstance(built.picker, Oracle):
        built.picker.cluster = cluster
    clock = loop.time
    fanout = FanOut(
        cluster,
        config=built.config,
        clock=clock,
        timer=loop,
        picker=built.picker,
        # The search server's budget (10 % of first requests, 10 a second, burst 100), on
        # the simulation's clock: FanOut's default one reads the real clock.
        retry_budget=RetryBudget(0.1, 10.0, burst=100.0, clock=clock),
        rng=random.Random(f"fanout:{seed}"),
    )
    # A search server in production has run for long: its policy's own time constants
    # have passed. To every replica a fresh fan-out is new: slow start ramps them all
    # (30 s), and the wrr picker uses a replica's reported load only after its blackout
    # (10 s), well past the warm-up's second. So every policy first gets a trickle of
    # queries past the longest of them (settle_seconds: the same for every policy of
    # this bench), then its warm-up at the phase's rate: the window sees replicas at
    # their full weight and weighted by their reports (a restarted one ramping anew).
    settle = settle_seconds(built)
    trickle = arrivals(
        trace, round(args.settle_rate * settle), args.settle_rate, seed + 2, replay=False
    )
    await _drive(fanout, cluster, trace, trickle, loop.time(), k=args.k,
                 timeout_ms=args.timeout_ms, tally=None)  # fmt: skip
    await asyncio.sleep(max(0.0, settle - loop.time()) + 1.0)
    warmup = arrivals(trace, args.warmup, rate, seed + 1, replay=False)
    await _drive(fanout, cluster, trace, warmup, loop.time(), k=args.k,
                 timeout_ms=args.timeout_ms, tally=None)  # fmt: skip
    # Every warm-up query has returned (each by its deadline): a gap of one deadline
    # more, then the window, so the counters below are the window's alone.
    await asyncio.sleep(args.timeout_ms / 1000)
    t0 = loop.time()
    window = args.queries / rate
    events = _schedule(loop, cluster, phase, t0, window, args.slow_factor, shape.replicas)
    sent0 = cluster.sent
    before = _counters(fanout, cluster)
    spread0 = _shard_spread(cluster)
    groups0 = _group_queries(fanout, shape.replicas)
    busy0 = cluster.busy()
    tally = Tally()
    measured = arrivals(trace, args.queries, rate, seed, replay=True)
    await _drive(fanout, cluster, trace, measured, t0, k=args.k, timeout_ms=args.timeout_ms,
                 tally=tally)  # fmt: skip
    elapsed = loop.time() - t0
    after = _counters(fanout, cluster)
    spread = [now - then for now, then in zip(_shard_spread(cluster), spread0, strict=True)]
    groups = _group_queries(fanout, shape.replicas)
    sent = cluster.sent - sent0
    lat = tally.latencies_ms
    first = tally.first_requests
    busy_now = cluster.busy()
    busy = [(seconds - busy0[key]) / elapsed for key, seconds in busy_now.items()]
    shard_busy = {
        replica: (seconds - busy0[(shard, replica)]) / elapsed
        for (shard, replica), seconds in busy_now.items()
        if shard == SHARD
    }
    await fanout.aclose()
    return {
        "queries": len(lat),
        "refused": tally.refused,
        "p50_ms": round(nearest_rank(lat, 0.5), 3),
        "p99_ms": round(nearest_rank(lat, 0.99), 3),
        "p999_ms": round(nearest_rank(lat, 0.999), 3),
        "max_ms": round(max(lat), 3),
        # Every latency, until the queries over the goal's line are counted (over_goal):
        # not written.
        "latencies_ms": lat,
        "partial_share": round(tally.partial / len(lat), 5),
        "partial_reasons": dict(sorted(tally.reasons.items())),
        "mean_coverage_pct": round(100 * tally.coverage / len(lat), 3),
        "first_requests": first,
        "sub_requests": sent,
        "extra_requests_pct": round(100 * (sent - first) / first, 3),
        **{name: int(after[name] - before[name]) for name in COUNTERS},
        "to_faulty_pct": round(
            100
            * (after["to_faulty"] - before["to_faulty"])
            / max(1.0, after["shard_requests"] - before["shard_requests"]),
            3,
        ),
        # The phases' shard's requests by replica number (replica 0 is the one the slow
        # and restart phases slow or kill), and the queries by replica group.
        "shard_requests_by_replica": spread,
        "group_queries": {
            name: count - groups0.get(name, 0) for name, count in sorted(groups.items())
        },
        "window_s": round(elapsed, 3),
        "settle_s": round(settle, 3),
        "replica_utilization": {
            "mean": round(sum(busy) / len(busy), 3),
            "max": round(max(busy), 3),
            "slowed_shard": [round(shard_busy[r], 3) for r in range(shape.replicas)],
        },
        "events": events,
    }


def run_policy_phase(
    trace: Trace,
    shape: ClusterShape,
    name: str,
    phase: str,
    args: argparse.Namespace,
    rate: float,
) -> dict[str, Any] | str:
    """One policy's run of one phase on a virtual-time loop of its own: its figures, or
    why the policy cannot run in this tree."""

    # The fan-out logs each ejection and panic at warning: the figures count them.
    logging.getLogger("search_server").setLevel(logging.ERROR)

    async def main() -> dict[str, Any] | str:
        loop = asyncio.get_running_loop()
        built = POLICIES[name][1](loop.time, random.Random(f"picker:{args.seed}"))
        if isinstance(built, str):
            return built
        own = ClusterShape(**{**shape_fields(shape), "groups": built.groups})
        return await _run_phase(trace, own, built, phase, args, rate)

    return run(main())


def run_all(
    trace: Trace,
    shape: ClusterShape,
    runs: list[tuple[str, str]],
    args: argparse.Namespace,
    rate: float,
) -> dict[tuple[str, str], dict[str, Any]]:
    """Every ``(policy, phase)`` of ``runs``, on ``args.jobs`` processes: each run is on
    virtual time, so its figures do not depend on how many share the machine's cores."""
    results: dict[tuple[str, str], dict[str, Any]] = {}
    wall = time.monotonic()

    def done(name: str, phase: str, figures: dict[str, Any] | str) -> None:
        if isinstance(figures, str):  # a maker that worked before cannot fail now
            raise RuntimeError(f"{name}: {figures}")
        results[(name, phase)] = figures
        print(
            f"  {name:<11} {phase:<10} p50 {figures['p50_ms']:7.2f}  p99 "
            f"{figures['p99_ms']:7.2f}  p99.9 {figures['p999_ms']:7.2f} ms  partial "
            f"{100 * figures['partial_share']:5.2f} %  extra "
            f"{figures['extra_requests_pct']:6.2f} %  ({time.monotonic() - wall:.0f} s)",
            flush=True,
        )

    if args.jobs <= 1:
        for name, phase in runs:
            done(name, phase, run_policy_phase(trace, shape, name, phase, args, rate))
        return results
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        started = {
            pool.submit(run_policy_phase, trace, shape, name, phase, args, rate): (name, phase)
            for name, phase in runs
        }
        for future in as_completed(started):
            done(*started[future], future.result())
    return results


def shape_fields(shape: ClusterShape) -> dict[str, Any]:
    return {name: getattr(shape, name) for name in shape.__slots__}


def git(*argv: str) -> str:
    """git's answer, or "" where there is no git or no checkout (the Python 3.13 root
    runs the tiny bench on a copy of the tree without git): the record then says so
    rather than the run failing."""
    try:
        return subprocess.run(
            ["git", *argv], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def stated_rate(
    utilization: float, replicas: int, overhead_s: float
) -> Callable[[list[float]], float]:
    """The arrival rate at which the busiest shard's replicas are ``utilization`` busy
    when its queries are spread evenly over its ``replicas``."""

    def rate(shard_means: list[float]) -> float:
        return utilization * replicas / (max(shard_means) + overhead_s)

    return rate


def table(rows: list[dict[str, Any]]) -> list[str]:
    """The Markdown table of ``rows`` (as docs/BENCHMARKS.md shows it)."""
    lines = [
        "| policy | phase | queries | p50 ms | p99 ms | p99.9 ms | partial | extra req | "
        "hedges | retries | ejections | to slowed/down | p99.9 / own base | "
        "p99.9 / ours' base |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if "skipped" in row:
            lines.append(f"| {row['policy']} | all | {row['skipped']} |" + " |" * 11)
            continue
        faulty = "-" if row["phase"] == "baseline" else f"{row['to_faulty_pct']:.2f} %"
        lines.append(
            f"| {row['policy']} | {row['phase']} | {row['queries']:,} | {row['p50_ms']:.2f} | "
            f"{row['p99_ms']:.2f} | {row['p999_ms']:.2f} | {100 * row['partial_share']:.2f} % | "
            f"{row['extra_requests_pct']:.2f} % | {row['hedges']:,} | {row['retries']:,} | "
            f"{row['ejections']} | {faulty} | {_ratio(row['p999_vs_own_baseline'])} | "
            f"{_ratio(row['p999_vs_ours_baseline'])} |"
        )
    return lines


#: The reasons of partial answers :func:`partial_table` gives a column of their own;
#: the others are summed in its last.
REASON_COLUMNS = ("adaptive_wait", "deadline", "overload", "cut")


def partial_table(rows: list[dict[str, Any]]) -> list[str]:
    """The Markdown table of ``rows``' partial answers: their share, the answers' mean
    coverage and the partial answers by reason (an answer may have several)."""
    lines = [
        "| policy | phase | p50 ms | p99 ms | p99.9 ms | partial | mean coverage | "
        + " | ".join(REASON_COLUMNS)
        + " | other reasons |",
        "|---|---|---|---|---|---|---|" + "---|" * (len(REASON_COLUMNS) + 1),
    ]
    for row in rows:
        if "skipped" in row:
            continue
        reasons = row["partial_reasons"]
        other = sum(n for reason, n in reasons.items() if reason not in REASON_COLUMNS)
        lines.append(
            f"| {row['policy']} | {row['phase']} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} | "
            f"{row['p999_ms']:.2f} | {100 * row['partial_share']:.2f} % | "
            f"{row['mean_coverage_pct']:.2f} % | "
            + " | ".join(f"{reasons.get(reason, 0):,}" for reason in REASON_COLUMNS)
            + f" | {other:,} |"
        )
    return lines


def over_goal(row: dict[str, Any], baseline_p999_ms: float) -> dict[str, Any]:
    """How far ``row`` is from the goal's p99.9 in queries: those slower than
    :data:`GOAL_P999_RATIO` times its baseline's p99.9 (``over_goal_queries``), against
    those a p99.9 within it allows (``over_goal_allowed``: the queries above the
    p99.9's rank)."""
    line = GOAL_P999_RATIO * baseline_p999_ms
    latencies: list[float] = row["latencies_ms"]
    queries = row["queries"]
    return {
        "goal_line_ms": round(line, 3),
        "over_goal_queries": sum(1 for ms in latencies if ms > line),
        "over_goal_allowed": queries - math.ceil(0.999 * queries),
    }


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--quick", action="store_true", help="a small run (under a minute)")
    add("--trace", type=Path, help="replay this saved trace instead of recording one")
    add("--record-only", action="store_true", help="record the trace, write it and stop")
    add(
        "--best-of",
        nargs="+",
        type=Path,
        metavar="TRACE",
        help="write the least time of each search over these recorded traces as the trace "
        "of --label, and stop",
    )
    add("--label", help="suffix of the result files [full, or quick with --quick]")
    add("--out-dir", type=Path, default=RESULTS, help="where the JSON goes [bench/results]")
    add(
        "--policies",
        default=",".join(DEFAULT_POLICIES),
        help=f"comma-separated, of {', '.join(POLICIES)} [all but the diagnostic ones "
        "(ours-no-hedging, ours-no-demotion) and ours-cov95]",
    )
    add(
        "--phases",
        default=",".join(DEFAULT_PHASES),
        help=f"comma-separated, of {', '.join(PHASES)} [all but slow-shard]",
    )
    add("--shards", type=int, default=10)
    add("--replicas", type=int, default=3)
    add("--docs", type=int, help="documents per shard [50000; quick 5000]")
    add("--trace-queries", type=int, help="queries recorded in the trace [2000; quick 200]")
    add("--repeats", type=int, help="timings of each search, the least kept [3; quick 2]")
    add(
        "--search-clock",
        choices=("thread", "wall"),
        default="thread",
        help="time the trace's searches by the thread's CPU time or perf_counter [thread]",
    )
    add("--queries", type=int, help="measured queries per phase [20000; quick 1500]")
    add("--warmup", type=int, help="warm-up queries per phase, not counted [1000; quick 300]")
    add("--utilization", type=float, default=0.4, help="of the busiest shard's replicas [0.4]")
    add("--timeout-ms", type=int, default=30, help="the queries' deadline [30]")
    add("--k", type=int, default=10, help="hits asked per query [10]")
    add("--slow-factor", type=float, default=10.0, help="a slowed replica's multiplier [10]")
    add("--overhead-us", type=float, default=50.0, help="a data server's work per request [50]")
    add("--net-us", type=float, default=100.0, help="one way's fixed latency [100]")
    add("--jitter-us", type=float, default=50.0, help="one way's mean exponential jitter [50]")
    add(
        "--settle-rate",
        type=float,
        default=SETTLE_RATE,
        help="queries a second of the trickle before each warm-up, which runs past the "
        f"policies' time constants ({SETTLE_S:g} s) [{SETTLE_RATE:g}]",
    )
    add("--seed", type=int, default=1)
    add(
        "--jobs",
        type=int,
        default=min(4, os.cpu_count() or 1),
        help="processes running the policies' phases at once [the CPUs, at most 4]",
    )
    args = parser.parse_args()
    quick_defaults(
        args,
        args.quick,
        label=("full", "quick"),
        docs=(50_000, 5_000),
        trace_queries=(2_000, 200),
        repeats=(3, 2),
        queries=(20_000, 1_500),
        warmup=(1_000, 300),
    )
    policies = [p for p in args.policies.split(",") if p]
    phases = [p for p in args.phases.split(",") if p]
    unknown = [p for p in policies if p not in POLICIES] + [p for p in phases if p not in PHASES]
    if unknown:
        parser.error(f"unknown policies or phases: {', '.join(unknown)}")
    if "baseline" not in phases:
        phases.insert(0, "baseline")  # every ratio is to a baseline of the same run
    started = time.monotonic()
    overhead = args.overhead_us / 1e6
    rate_of = stated_rate(args.utilization, args.replicas, overhead)
    if args.best_of:
        best = best_of([Trace.load(path) for path in args.best_of], rate_of)
        trace_path = args.out_dir / f"dispatch-trace-{args.label}.json"
        best.save(trace_path)
        said = ", ".join(f"{1000 * m:.3f}" for m in best.shard_means())
        print(f"wrote {trace_path}: the best of {len(args.best_of)} traces; shard means {said} ms")
        return 0
    if args.trace is not None:
        trace = Trace.load(args.trace)
        print(f"trace: {args.trace} ({len(trace.queries)} queries x {trace.shards} shards)")
        trace_path = args.trace
    else:
        print(
            f"recording a trace: {args.shards} shards x {args.docs:,} documents, "
            f"{args.trace_queries} queries, best of {args.repeats} by the "
            f"{'thread CPU time' if args.search_clock == 'thread' else 'wall clock'}",
            flush=True,
        )
        trace = record_trace(
            shards=args.shards,
            docs=args.docs,
            queries=args.trace_queries,
            k=args.k,
            repeats=args.repeats,
            rate=rate_of,
            seed=0,
            clock=args.search_clock,
        )
        trace_path = args.out_dir / f"dispatch-trace-{args.label}.json"
        trace.save(trace_path)
        print(f"wrote {trace_path}")
        # As saved (rounded to the microsecond): a replay of the file is this run.
        trace = Trace.load(trace_path)
        if args.record_only:
            return 0
    if trace.shards < args.shards:
        parser.error(f"the trace has {trace.shards} shards, fewer than --shards {args.shards}")
    docs = int(trace.meta.get("docs_per_shard", args.docs))
    shape = ClusterShape(
        shards=args.shards,
        replicas=args.replicas,
        docs=docs,
        overhead_s=overhead,
        net_s=args.net_us / 1e6,
        jitter_s=args.jitter_us / 1e6,
    )
    means = trace.shard_means()[: args.shards]
    rate = rate_of(means)
    window = args.queries / rate
    print(
        f"cluster: {args.shards} shards x {args.replicas} replicas; search cost per shard "
        f"(mean) {1000 * min(means):.3f}-{1000 * max(means):.3f} ms + {args.overhead_us:g} us "
        f"per request; rate {rate:.0f} q/s (busiest shard's replicas {args.utilization:.0%} "
        f"busy); deadline {args.timeout_ms} ms; window {window:.1f} s of virtual time per "
        "phase",
        flush=True,
    )
    skipped: dict[str, str] = {}
    for name in policies:
        built = POLICIES[name][1](time.monotonic, random.Random(0))
        why = built if isinstance(built, str) else coverage_meaningless(built, args.shards)
        if why is not None:
            skipped[name] = why
            print(f"  {name}: skipped, {why}", flush=True)
    runs = [(name, phase) for name in policies if name not in skipped for phase in phases]
    figures = run_all(trace, shape, runs, args, rate)
    rows: list[dict[str, Any]] = []
    for name in policies:
        if name in skipped:
            rows.append({"policy": name, "skipped": skipped[name]})
            continue
        rows.extend({"policy": name, "phase": phase, **figures[(name, phase)]} for phase in phases)
    baselines = {row["policy"]: row["p999_ms"] for row in rows if row.get("phase") == "baseline"}
    ours_base = baselines.get("ours")
    for row in rows:
        if "skipped" in row:
            continue
        own = baselines.get(row["policy"])
        row["p999_vs_own_baseline"] = round(row["p999_ms"] / own, 3) if own else None
        row["p999_vs_ours_baseline"] = round(row["p999_ms"] / ours_base, 3) if ours_base else None
        if own:
            row.update(over_goal(row, own))
        del row["latencies_ms"]
    oracle = {
        row["phase"]: row["p999_vs_own_baseline"] for row in rows if row["policy"] == "oracle"
    }
    goal = [
        {
            "policy": row["policy"],
            "phase": row["phase"],
            "p999_ratio": row["p999_vs_own_baseline"],
            "oracle_p999_ratio": oracle.get(row["phase"]),
            "extra_requests_pct": row["extra_requests_pct"],
            "over_goal_queries": row.get("over_goal_queries"),
            "over_goal_allowed": row.get("over_goal_allowed"),
            "met": row["p999_vs_own_baseline"] is not None
            and row["p999_vs_own_baseline"] <= GOAL_P999_RATIO
            and row["extra_requests_pct"] <= GOAL_EXTRA_PCT,
        }
        for row in rows
        # The goal's phases: one replica slowed or restarted (not slow-shard, a shard slow
        # on every replica, which no choice of replica can help).
        if row["policy"].startswith("ours") and row.get("phase") in DEFAULT_PHASES[1:]
    ]
    print()
    print("\n".join(table(rows)))
    print()
    print("\n".join(partial_table(rows)))
    print()
    for check in goal:
        floor = check["oracle_p999_ratio"]
        beside = "" if floor is None else f"; the oracle: {floor}x"
        print(
            f"goal ({check['policy']}, {check['phase']}): p99.9 {check['p999_ratio']}x its "
            f"baseline (<= {GOAL_P999_RATIO}{beside}; {check['over_goal_queries']} queries "
            f"over the line, {check['over_goal_allowed']} allowed), extra requests "
            f"{check['extra_requests_pct']} % (<= {GOAL_EXTRA_PCT:g}): "
            f"{'met' if check['met'] else 'MISSED'}"
        )
    write_results(
        args.out_dir / f"dispatch-{args.label}.json",
        "dispatch",
        {
            key: str(value) if isinstance(value, Path) else value
            for key, value in vars(args).items()
        },
        commit=git("rev-parse", "HEAD") or "unknown",
        uncommitted_changes=git("status", "--porcelain", "--untracked-files=no").splitlines(),
        trace={"file": str(trace_path), "rate": trace.rate, **trace.meta},
        setup={
            "cluster": shape_fields(shape),
            "rate_qps": round(rate, 1),
            "window_s": round(window, 3),
            "shard_mean_cost_ms": [round(1000 * m, 4) for m in means],
            "restart_at": RESTART_AT,
            "slowed_shard": SHARD,
            "settle_s": SETTLE_S,
            "settle_rate": args.settle_rate,
        },
        policies={name: POLICIES[name][0] for name in policies},
        skipped=skipped,
        rows=rows,
        goal=goal,
        wall_s=round(time.monotonic() - started, 1),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
