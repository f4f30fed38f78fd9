"""Weighted round robin by the load the data servers report: the ``wrr`` replica picker.

:class:`WeightedRoundRobin` weights each candidate by the load its data server reported
with its answers (``utilization``, ``qps``, ``eps``, kept on the replica: see
:meth:`~search_server.picking.Replica.report_load`), as gRPC's ``weighted_round_robin``
(proposal A58) and Envoy's client-side weighted round robin with ORCA do, and spreads
the picks in proportion with smooth weighted round robin (nginx's), without a random
draw. :func:`load_weight` is the formula, :class:`WrrConfig` the settings (a bad one
raises :class:`~discovery.errors.ConfigError` naming its flag). Runs on the fan-out's
loop like every picker: fast, not thread-safe, never raises for a non-empty list.

This module sits below :mod:`search_server.picking` (whose ``make_picker`` builds the
picker), so it reads replicas through :class:`LoadReporting`, what it needs of one;
:class:`~search_server.picking.Replica` is one.

Design: docs/design/search-server.md, "Weighted by server-reported load".
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from discovery.errors import ConfigError

__all__ = [
    "FORGET_AFTER",
    "MIN_COST",
    "LoadReporting",
    "WeightedRoundRobin",
    "WrrConfig",
    "load_weight",
]

#: The least denominator of :func:`load_weight`: a report of a tiny but positive cost
#: (another data server's 1e-300) weighs at most ``qps / MIN_COST`` (1e13), so that no
#: sum of weights overflows to infinity.
MIN_COST = 1e-6
#: Seconds after which the picker forgets its state of a replica it was not offered (its
#: place in the round robin and its cached weight; the report stays on the replica):
#: between one and two of these, so that its memory follows the replicas routed to.
FORGET_AFTER = 60.0


@dataclass(frozen=True, slots=True)
class WrrConfig:
    """How :class:`WeightedRoundRobin` weights replicas (docs/design/search-server.md,
    "Weighted by server-reported load").

    ``blackout``: seconds a replica's reports must have been arriving before its weight
    is used (0: at once). ``expiry``: a replica whose last report is older than this many
    seconds has no weight, and its next report starts a new blackout. ``error_penalty``:
    how much errors count against a replica (0: not at all). ``update_period``: seconds
    a replica's weight is kept before it is computed again (0: at every pick). Raises
    :class:`ConfigError` naming the flag (``--wrr-*``) of a value out of range.
    """

    blackout: float = 10.0
    expiry: float = 180.0
    error_penalty: float = 1.0
    update_period: float = 1.0

    def __post_init__(self) -> None:
        if not 0 <= self.blackout < math.inf:
            raise ConfigError(f"--wrr-blackout must be >= 0 seconds, got {self.blackout}")
        if not 0 < self.expiry < math.inf:
            raise ConfigError(f"--wrr-expiry must be > 0 seconds, got {self.expiry}")
        if not 0 <= self.error_penalty < math.inf:
            raise ConfigError(f"--wrr-error-penalty must be >= 0, got {self.error_penalty}")
        if not 0 <= self.update_period < math.inf:
            raise ConfigError(
                f"the weight update period must be >= 0 seconds, got {self.update_period}"
            )


class LoadReporting(Protocol):
    """What :class:`WeightedRoundRobin` reads of a replica: its registered weight and
    the one slow start gives it (``weight``), and its last load report and run (see
    :class:`~search_server.picking.Replica`). It clears ``load_since`` of a replica
    whose report expired."""

    weight: float
    base_weight: int
    load_utilization: float
    load_qps: float
    load_eps: float
    load_at: float | None
    load_since: float | None


_R = TypeVar("_R", bound=LoadReporting)


def load_weight(utilization: float, qps: float, eps: float, error_penalty: float) -> float:
    """A replica's weight by its report: ``qps / (utilization + eps / qps x error_penalty)``.

    0.0 when the report gives none: ``qps`` 0 (it answered nothing of late: nothing to
    judge it by), or a denominator of 0 (``utilization`` 0 and no errors counted, for
    which the formula is infinite: an idle server's report). A replica without a
    weight gets its candidates' mean (see :class:`WeightedRoundRobin`). A denominator
    below :data:`MIN_COST` counts as that.
    """
    if not qps > 0:
        return 0.0
    cost = utilization + eps / qps * error_penalty
    if not cost > 0:
        return 0.0
    return qps / (cost if cost > MIN_COST else MIN_COST)


class _State:
    """The picker's own state of one replica: its place in the round robin
    (``current``), and its weight by its reports (0.0: none) until ``due``."""

    __slots__ = ("current", "due", "weight")

    def __init__(self) -> None:
        self.current = 0.0
        self.weight = 0.0
        self.due = -math.inf


class WeightedRoundRobin:
    """Replicas weighted by the load they report, picked by smooth weighted round robin.

    A replica's weight is :func:`load_weight` of its last report, computed again at most
    every ``update_period`` seconds of ``clock`` (the fan-out's, on which the reports
    are timed). It has none (0.0) without a report, while its reports have been arriving
    for less than ``blackout`` (a new or restarted server's first figures measure a
    cold cache and a window still filling), when its last report is older than
    ``expiry`` (a replica not asked for minutes: what it said then says nothing now;
    its next report starts a new blackout), or when the report gives none (``qps`` 0,
    or ``utilization`` and errors 0). A replica without a weight gets the mean weight
    of the candidates that have one, all the same weight when none has: a data server
    that reports nothing (one in another language, an older version) is treated as a
    typical one. Each weight is then multiplied by the replica's slow-start share
    (``weight / base_weight``), so slow start still ramps a new replica; the registered
    weight is otherwise not used, the reports measure what it stood for.

    Smooth weighted round robin (nginx's) spreads the picks: at each pick, every
    candidate's ``current`` grows by its weight, the largest wins (ties to the first)
    and loses the sum of the weights. Over a fixed set of candidates, each gets its
    share of any run of picks to within one, evenly interleaved, and without a random
    draw. Here the weights of a pick are first divided by their sum, so each pick adds
    shares that sum to 1 and the winner gives back 1: a replica's ``current`` counts
    the picks it is owed. That keeps the state on one scale whatever the reports' (a
    replica's 1,000 answers a second or 5; a change of scale starves nobody), and
    holds when the candidates vary per query (a tried, ejected or other-zone replica
    is not offered): a replica gets the sum of its shares of the picks it was offered,
    within a pick or two. Each keeps its ``current`` across picks it was not offered;
    one not offered for :data:`FORGET_AFTER` seconds or so is forgotten, and starts
    again at 0.

    Never raises for a non-empty list of candidates.
    """

    def __init__(
        self, config: WrrConfig | None = None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = config if config is not None else WrrConfig()
        self._clock = clock
        # Two generations of state: a replica's moves to the new one when it is offered,
        # and what is left in the old one when the next begins is forgotten.
        self._fresh: dict[object, _State] = {}
        self._old: dict[object, _State] = {}
        self._forget_at = -math.inf

    @property
    def tracked(self) -> int:
        """Replicas the picker holds state of (offered within the last one or two
        :data:`FORGET_AFTER`)."""
        return len(self._fresh) + len(self._old)

    def weight(self, replica: LoadReporting, now: float) -> float:
        """``replica``'s weight by its reports at ``now``; 0.0 if it has none (see the
        class). A report found expired ends its run (``load_since`` cleared)."""
        reported = replica.load_at
        if reported is None:
            return 0.0
        config = self.config
        if now - reported > config.expiry:
            replica.load_since = None  # the next report starts a new run, and a blackout
            return 0.0
        since = replica.load_since
        if since is None or now - since < config.blackout:
            return 0.0
        return load_weight(
            replica.load_utilization, replica.load_qps, replica.load_eps, config.error_penalty
        )

    def pick(self, candidates: Sequence[_R]) -> _R:
        if len(candidates) == 1:
            return candidates[0]
        now = self._clock()
        if now >= self._forget_at:
            self._old, self._fresh = self._fresh, {}
            self._forget_at = now + FORGET_AFTER
        states = [self._state(replica) for replica in candidates]
        period = self.config.update_period
        usable = 0
        total = 0.0
        for replica, state in zip(candidates, states, strict=True):
            if now >= state.due:
                state.weight = self.weight(replica, now)
                state.due = now + period
            if state.weight > 0:
                usable += 1
                total += state.weight
        # A replica without a weight has the mean of those that have one (1 when none
        # has: all the same); each then times its slow-start share.
        mean = total / usable if usable else 1.0
        weights = [
            (state.weight if state.weight > 0 else mean) * (replica.weight / replica.base_weight)
            for replica, state in zip(candidates, states, strict=True)
        ]
        # As shares of this pick (summing to 1): the winner gives back 1, so a replica's
        # ``current`` counts the picks it is owed, in the same unit whatever the
        # candidates and whatever the reports' scale.
        unit = 1.0 / sum(weights)
        best = 0
        best_current = -math.inf
        for index, state in enumerate(states):
            current = state.current = state.current + weights[index] * unit
            if current > best_current:
                best, best_current = index, current
        states[best].current -= 1.0
        return candidates[best]

    def _state(self, replica: LoadReporting) -> _State:
        state = self._fresh.get(replica)
        if state is None:
            state = self._old.pop(replica, None)
            if state is None:
                state = _State()
            self._fresh[replica] = state
        return state
