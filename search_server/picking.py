"""Which replica of a shard gets a query's request: the picker seam of the fan-out.

:class:`AdaptiveReplicaSelection` is the default, :class:`PowerOfTwoChoices` and
:class:`~search_server.wrr.WeightedRoundRobin` (by the load the data servers report,
in :mod:`search_server.wrr`) the others; :func:`make_picker` builds the one
``--picker`` names. Another policy is a new class passed as ``FanOut(picker=...)``,
``SearchServer(config, picker=...)`` or ``search_server.cli.main(picker=...)``. A picker
runs on the fan-out's event loop for every sub-request: it must be fast, is not
thread-safe, and must never raise for a non-empty list of candidates.

Design: docs/design/search-server.md, "The replica picker".
"""

from __future__ import annotations

import random
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from discovery.instance import ServiceInstance

from .httpclient import Endpoint
from .wrr import WeightedRoundRobin, WrrConfig

__all__ = [
    "AdaptiveReplicaSelection",
    "LatencyWindow",
    "PowerOfTwoChoices",
    "Prior",
    "Replica",
    "ReplicaPicker",
    "make_picker",
    "target_key",
]

#: Weight of the newest sample in the EWMAs (Elasticsearch's ARS uses the same).
EWMA_ALPHA = 0.3

#: The response time and service time (seconds) a replica without samples is ranked
#: with by :class:`AdaptiveReplicaSelection` (see :meth:`~AdaptiveReplicaSelection.prior`).
Prior = tuple[float, float]


def target_key(instance: ServiceInstance) -> str:
    """What the fan-out keys a replica's load and health by.

    The id alone is not enough: a data server restarted on another port (or a second
    server misconfigured with the same id) is a different target with its own health.
    Nor is the address: a server its agent took offline and admitted again (after
    ``rise`` good probes) registers anew, and must not stay ejected for what it did
    before it left.
    """
    return f"{instance.id}@{instance.address}:{instance.port}/{instance.registration_time_utc}"


@dataclass(slots=True, eq=False)
class Replica:
    """One data server as this search server routes to it, and what it learned of it.

    The fan-out keeps the same object for a target (:func:`target_key`) across live-list
    versions, so its statistics survive changes of the list. ``seconds``, ``service``
    and ``queue`` are EWMAs (weight :data:`EWMA_ALPHA`) of the response time this search
    server saw, the search time the data server reported (``took_ms``) and the requests
    it reported in flight (``queue``); ``samples`` counts the answers behind them and
    ``sent`` the requests sent (hedges included). ``relative`` is an EWMA of its
    response time over that of the same query's other shards (``relative_samples``
    answers behind it), and ``demoted_at`` when it was demoted as a latency outlier
    (None: it is not; ``probed_at`` its last probe since): see
    :mod:`search_server.demotion`.

    ``base_weight`` is the registered weight (the payload's, 1-1000) and ``weight`` the
    one the pickers use: the same, except while the replica is in slow start
    (``ramp_start`` is then when its ramp began, on the fan-out's clock), when
    :class:`~search_server.slowstart.SlowStart` moves it from ``min_weight`` of
    ``base_weight`` up to ``base_weight``. A float, since a share of a small weight
    is not a whole number (and must not round to 0: the pickers divide by it).

    ``load_utilization``, ``load_qps`` and ``load_eps`` are the load the data server
    reported with its last answer that carried a sane report (``utilization``, ``qps``,
    ``eps``; see :func:`~search_server.merging.load_report`), ``load_at`` when it came
    (the fan-out's clock; None: never), and ``load_since`` when its current run of
    reports began: set by the first report, and cleared by
    :class:`~search_server.wrr.WeightedRoundRobin` when it finds the last one older than
    its expiry, so that the next report starts a new run (and a new blackout). Five
    fields, no history: one of these per data server, tens of thousands of them.
    """

    key: str
    instance: ServiceInstance
    endpoint: Endpoint
    shard: int
    zone: str | None
    group: str | None
    weight: float
    base_weight: int
    outstanding: int = 0
    sent: int = 0
    samples: int = 0
    seconds: float = 0.0
    service: float = 0.0
    queue: float = 0.0
    failures: int = 0
    ejected_until: float | None = None
    # While ejected with no other usable replica in its shard: no probe before this
    # (the fan-out's clock; see OutlierEjection.probe).
    next_probe: float = 0.0
    # Adaptive selection's discount of this replica's rank, for the picks it lost since
    # its last answer (see AdaptiveReplicaSelection); the EWMAs themselves stay true.
    discount: float = 1.0
    # Its recent response times, for the fan-out's hedging (made at its first answer).
    window: LatencyWindow | None = None
    # Its relative slowness (search_server.demotion): an EWMA of its response time over
    # that of the same query's other shards, and the answers behind it.
    relative: float = 0.0
    relative_samples: int = 0
    # When it was demoted as a latency outlier among its shard's replicas (the fan-out's
    # clock; None: it is not), and when it was last probed (or demoted) since.
    demoted_at: float | None = None
    probed_at: float = 0.0
    # When its slow start began (None: not ramping; see search_server.slowstart).
    ramp_start: float | None = None
    # Its last load report and its run (see the class's docstring; search_server.wrr).
    load_utilization: float = 0.0
    load_qps: float = 0.0
    load_eps: float = 0.0
    load_at: float | None = None
    load_since: float | None = None

    @classmethod
    def of(cls, instance: ServiceInstance) -> Replica:
        payload = instance.payload
        return cls(
            key=target_key(instance),
            instance=instance,
            endpoint=Endpoint.of(instance.address, instance.port),
            shard=payload.shard,
            zone=payload.zone,
            group=payload.group,
            weight=float(payload.weight),
            base_weight=payload.weight,
        )

    def reweigh(self, base_weight: int) -> None:
        """The registered weight is now ``base_weight`` (a new payload): ``weight``
        follows at once, at the same share of it while the replica ramps (its next
        refresh by :class:`~search_server.slowstart.SlowStart` sets it exactly)."""
        if self.ramp_start is None:
            self.weight = float(base_weight)
        elif base_weight != self.base_weight:
            self.weight = self.weight * base_weight / self.base_weight
        self.base_weight = base_weight

    def is_ejected(self, now: float) -> bool:
        return self.ejected_until is not None and now < self.ejected_until

    def observe(self, seconds: float, service: float | None, queue: float | None) -> None:
        """Fold in one answer: its response time and the data server's feedback, if any."""
        if self.samples == 0:
            self.seconds = seconds
            self.service = seconds if service is None else service
            self.queue = 0.0 if queue is None else queue
        else:
            self.seconds += EWMA_ALPHA * (seconds - self.seconds)
            if service is not None:
                self.service += EWMA_ALPHA * (service - self.service)
            if queue is not None:
                self.queue += EWMA_ALPHA * (queue - self.queue)
        self.samples += 1
        self.discount = 1.0

    def report_load(self, utilization: float, qps: float, eps: float, now: float) -> None:
        """Keep the load the data server reported with an answer that arrived at ``now``
        (sane values, as :func:`~search_server.merging.load_report` returns them); the
        first report of a run starts it (``load_since``)."""
        self.load_utilization = utilization
        self.load_qps = qps
        self.load_eps = eps
        self.load_at = now
        if self.load_since is None:
            self.load_since = now

    def penalize(self, seconds: float) -> None:
        """Fold in a request that got no answer after ``seconds`` (failed, timed out, or
        beaten by a hedge): its response time was at least that."""
        if seconds > self.seconds:
            self.seconds += EWMA_ALPHA * (seconds - self.seconds)
        # News of it, as an answer would be: the discount for lost picks starts over.
        self.discount = 1.0


class LatencyWindow:
    """A replica's recent response times, their median and 95th percentile.

    A ring of the last ``size`` samples; the percentile is recomputed every ``every``
    samples (sorting on every answer would cost more than the answer). ``None`` until
    ``min_samples`` answers: no hedging on a guess.
    """

    __slots__ = ("_every", "_min", "_next", "_p50", "_p95", "_ring", "_since", "_size")

    def __init__(self, size: int = 64, every: int = 16, min_samples: int = 16) -> None:
        # An array of doubles, not a list of float objects: one per replica routed to.
        self._ring = array("d")
        self._next = 0
        self._every = every
        self._since = 0
        self._min = min_samples
        self._p50: float | None = None
        self._p95: float | None = None
        self._size = size

    def add(self, seconds: float) -> None:
        ring = self._ring
        if len(ring) < self._size:
            ring.append(seconds)
        else:
            ring[self._next] = seconds
            self._next = (self._next + 1) % self._size
        self._since += 1
        if self._since >= self._every and len(ring) >= self._min:
            self._since = 0
            ordered = sorted(ring)
            self._p50 = ordered[len(ordered) // 2]
            self._p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]

    @property
    def p50(self) -> float | None:
        return self._p50

    @property
    def p95(self) -> float | None:
        return self._p95


@runtime_checkable
class ReplicaPicker(Protocol):
    """Chooses one replica of a shard for a request."""

    def pick(self, candidates: Sequence[Replica]) -> Replica:
        """One of ``candidates`` (never empty) for the next request."""
        ...


class PowerOfTwoChoices:
    """Two random candidates; the one with fewer requests outstanding from this search
    server per unit of weight wins, ties to the first.

    Nearly as good as "least busy" and, unlike it, it does not send every search
    server's next request to the same replica at once ("The Power of Two Choices in
    Randomized Load Balancing", Mitzenmacher). ``rng`` makes the choice reproducible.
    """

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng if rng is not None else random.Random()

    def pick(self, candidates: Sequence[Replica]) -> Replica:
        if len(candidates) == 1:
            return candidates[0]
        first, second = self._rng.sample(candidates, 2)
        # (outstanding + 1) / weight, compared without dividing.
        if (first.outstanding + 1) * second.weight <= (second.outstanding + 1) * first.weight:
            return first
        return second


class AdaptiveReplicaSelection:
    """The candidate of lowest C3 rank, divided by its weight: of all the candidates
    when there are at most ``rank_all`` of them (a shard's few copies, as Elasticsearch
    ranks them), else of two drawn at random (the power of two choices).

    ``rank = R - S + q̂³ · S`` with ``R`` the response-time EWMA, ``S`` the reported
    service-time EWMA (``R`` when the data server reports none) and
    ``q̂ = 1 + outstanding x clients + reported queue``. ``clients`` is the number of
    search servers sending to the same data servers (C3's concurrency compensation;
    set it as it changes with :attr:`clients`).

    Why two at random above ``rank_all``: among a subset's tens of members of equal
    speed, the lowest of all ranks is the luckiest sample (a response-time EWMA that
    missed a cold connection, a quiet moment), and it kept winning: in
    ``bench/bench_fleet_scale.py`` (three search servers, 34 members each) one place in
    each subset got 9 to 23 times its fair share. Of two drawn at random, any one
    replica wins at most about ``2/n`` of the picks however good it looks, and the
    worse of the two still never wins (Finagle pairs its aperture with the same
    choice). With 2 to ``rank_all`` candidates every one is ranked, so a slow copy
    of a small shard is never picked while a faster one is there.

    **A replica without samples** (no answer and no penalty yet: new, restarted, back
    from offline) is ranked with a *prior*: the median ``R`` and median ``S`` of the
    candidates that have samples (of the other drawn one, when two are drawn), with
    its own requests in flight in ``q̂`` and its own weight and discount, as if it
    were a typical replica of its shard. It used to rank first (rank 0), whatever it
    had in flight: every request until its first answer went to it (the flood of a new
    node that Elasticsearch's adaptive selection has, elastic/elasticsearch#147579),
    which only the fan-out's warm-up cap held to one at a time. Why the statistics and
    not a typical *rank*: a rank holds its replica's load (``outstanding``, the
    reported queue), and borrowing the others' load would ignore the newcomer's own,
    so it would keep winning ties until it answered; with its own ``q̂`` each request
    sent to it makes it look busier, as for any replica. Why the median: one sick
    candidate (a penalized response time ten times the others') drags a mean with it,
    not a median, and a new replica is assumed to be like most of its shard, not like
    the average of a healthy and a sick one (of two, the median is their mean). Only
    when no candidate has samples does it rank first, as nothing is known of any.
    A replica that has only failed or timed out so far ranks by what that cost (its
    penalized response time), not by the prior.

    The rank of every candidate not chosen decays a little (``decay``, through
    :attr:`Replica.discount`, reset by its next answer), as Elasticsearch adjusts the
    statistics of the nodes it did not pick: a replica that was slow once, or a new
    one whose prior ranks it below the best, is tried again after a while rather than
    starved of the samples that would show what it is. The EWMAs are left true, for
    the fan-out's other uses (hedge targets). ``rng`` makes the draws reproducible.

    Raises ``ValueError`` for ``clients`` below 1, ``decay`` outside ``[0, 1)`` or
    ``rank_all`` below 2.
    """

    def __init__(
        self,
        *,
        clients: int = 1,
        decay: float = 0.02,
        rank_all: int = 4,
        rng: random.Random | None = None,
    ) -> None:
        if clients < 1:
            raise ValueError(f"clients must be >= 1, got {clients}")
        if not 0 <= decay < 1:
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        if rank_all < 2:
            raise ValueError(f"rank_all must be >= 2, got {rank_all}")
        self.clients = clients
        self.rank_all = rank_all
        self._keep = 1.0 - decay
        self._rng = rng if rng is not None else random.Random()

    def rank(self, replica: Replica, prior: Prior | None = None) -> float:
        """The replica's C3 rank per unit of weight (lower is better).

        ``prior`` (see :meth:`prior`) stands in for the statistics of a replica without
        samples; without one, such a replica ranks 0.0, first.
        """
        if replica.samples == 0:
            if replica.seconds != 0.0:
                # It has only failed or timed out so far: it ranks by what that cost
                # (penalize() raised its response time), neither first nor typical: a
                # peer that never answers (a trickle, a hang) was otherwise picked
                # first again after every ejection, each time costing a hedge or the
                # shard.
                return replica.seconds * replica.discount / replica.weight
            if prior is None:
                return 0.0  # nothing known of any candidate: tried at once
            seconds, service = prior
        else:
            seconds, service = replica.seconds, replica.service
        q_hat = 1.0 + replica.outstanding * self.clients + replica.queue
        rank = seconds - service + q_hat * q_hat * q_hat * service
        return rank * replica.discount / replica.weight

    @staticmethod
    def prior(candidates: Sequence[Replica]) -> Prior | None:
        """The ``(R, S)`` a replica without samples is ranked with among ``candidates``:
        the medians of the response-time and service-time EWMAs of those with samples;
        None if none has any."""
        seconds = [r.seconds for r in candidates if r.samples]
        if not seconds:
            return None
        service = [r.service for r in candidates if r.samples]
        return _median(seconds), _median(service)

    def pick(self, candidates: Sequence[Replica]) -> Replica:
        count = len(candidates)
        if count == 1:
            return candidates[0]
        rank = self.rank
        if count > self.rank_all:
            first = self._rng.randrange(count)
            second = self._rng.randrange(count - 1)
            a, b = candidates[first], candidates[second + (second >= first)]
            if a.samples and b.samples:
                best = a if rank(a) <= rank(b) else b
            else:
                # A replica without samples is ranked as if it were like the other one.
                rank_a = rank(a, (b.seconds, b.service)) if b.samples else rank(a)
                rank_b = rank(b, (a.seconds, a.service)) if a.samples else rank(b)
                best = a if rank_a <= rank_b else b
        else:
            best = min(candidates, key=rank)
            # Without a prior, a replica without samples ranks 0.0 and so wins: only
            # then is it worth ranking them again with one (the common path pays one
            # check, not a scan).
            if best.samples == 0 and best.seconds == 0.0:
                prior = self.prior(candidates)
                if prior is not None:
                    best = min(candidates, key=lambda replica: rank(replica, prior))
        keep = self._keep
        for replica in candidates:
            if replica is not best:
                replica.discount *= keep
        return best


def _median(values: list[float]) -> float:
    """The median of ``values`` (not empty; sorted in place): few, so sorting is cheap."""
    values.sort()
    middle = len(values) // 2
    if len(values) % 2:
        return values[middle]
    return (values[middle - 1] + values[middle]) / 2


def make_picker(
    name: str,
    rng: random.Random | None = None,
    *,
    clock: Callable[[], float] = time.monotonic,
    wrr: WrrConfig | None = None,
) -> ReplicaPicker:
    """The picker ``--picker`` names: ``ars``, ``p2c`` or ``wrr``.

    ``rng`` makes the draws of ``ars`` and ``p2c`` reproducible. ``clock`` must be the
    fan-out's: ``wrr`` judges the age of the load reports the fan-out times on it;
    ``wrr`` holds its settings (default ones if None). Raises ``ValueError`` for
    another name.
    """
    if name == "ars":
        return AdaptiveReplicaSelection(rng=rng)
    if name == "p2c":
        return PowerOfTwoChoices(rng)
    if name == "wrr":
        return WeightedRoundRobin(wrr, clock=clock)
    raise ValueError(f"unknown picker {name!r}: ars, p2c or wrr")
