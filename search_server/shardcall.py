"""One shard's part of one query: its sub-requests (:class:`Attempt`) and its answer.

A :class:`ShardCall` keeps the state (replicas tried, requests out and their place in
their replicas' ``outstanding``, the answer or why there is none); its
:class:`~search_server.query.Query` decides what to send, and
:func:`~search_server.merging.merge` reads it. Not thread-safe (the query's loop).

Design: docs/design/search-server.md, "The fan-out".
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from .groups import Group
from .httpclient import Response
from .merging import FailureReason, Ranked, ShardOutcome
from .picking import Replica
from .shardrouting import ShardRoute

__all__ = ["Attempt", "Cancellable", "ShardCall"]


class Cancellable(Protocol):
    """A callback scheduled to run later, that may be called off (a loop's
    :class:`asyncio.TimerHandle`)."""

    def cancel(self) -> None: ...


class Attempt:
    """One sub-request of a shard call: to which replica, since when (the query's
    timer), whether it is a hedge or a half-open probe, whether its replica was demoted
    as a latency outlier when it was sent (and whether it is that replica's probe, a
    ``copy`` of the shard's first request), how many of this search server's requests
    its replica then had in flight with it (``share``: this one included), and the
    replica group it is counted in flight for (set by :meth:`ShardCall.sent`)."""

    __slots__ = (
        "copy",
        "demoted",
        "future",
        "group",
        "hedge",
        "probe",
        "replica",
        "share",
        "started",
    )

    def __init__(
        self,
        replica: Replica,
        future: asyncio.Future[Response],
        started: float,
        hedge: bool,
        probe: bool = False,
        *,
        demoted: bool = False,
        share: int = 1,
        copy: bool = False,
    ) -> None:
        self.replica = replica
        self.future = future
        self.started = started
        self.hedge = hedge
        # Sent to an ejected replica because its shard had no other: an answer ends
        # the ejection (see Query._next_attempt).
        self.probe = probe
        self.demoted = demoted
        self.share = share
        self.copy = copy
        # The group whose requests in flight count this one (None: its replica has no
        # group): the one charged, even if the replica's group changes meanwhile.
        self.group: Group | None = None


class ShardCall:
    """The progress of one shard within one query. ``docs_cap`` is the most the
    shard's documents count for in the answer's coverage (None: no cap; see
    :data:`~search_server.expectedshards.DOCS_CAP_MULTIPLE`); ``group`` the replica
    group the query's first requests go to (None: no group)."""

    __slots__ = (
        "answered_by",
        "asked",
        "attempts",
        "copies",
        "cut",
        "docs",
        "docs_cap",
        "done",
        "group",
        "groups",
        "hedge_backoff",
        "hedge_timer",
        "hits",
        "outcome",
        "panic",
        "probe_copy",
        "reason",
        "replicas",
        "routable",
        "route",
        "shard",
        "shard_docs",
        "subset",
        "tried",
    )

    def __init__(
        self, route: ShardRoute, docs_cap: int | None = None, group: Group | None = None
    ) -> None:
        # Kept for a second request to the shard in this query (see again).
        self.route = route
        self.shard = route.shard
        # The replicas this search server routes the shard to: its subset's members
        # (all of the shard's routable replicas when it has no subset). Shared with
        # other queries: never modified.
        self.replicas = route.members
        self.subset = route.subset
        # The query's group and the shard's replicas by group (None: no group here).
        self.group = group
        self.groups = route.groups
        # One replica's claim counts for at most the cap (every answer's coverage).
        self.docs_cap = docs_cap
        self.shard_docs = route.docs if docs_cap is None else min(route.docs, docs_cap)
        # The hits its requests ask for (k' <= k; the query sets it before sending: it
        # depends on every shard's documents).
        self.asked = 0
        # How many routable replicas the shard has (not only its subset's members): the
        # base of the panic threshold.
        self.routable = len(route.replicas)
        # The shard's routing ignores ejections for this query (ReplicaHealth.panicking).
        self.panic = False
        # What the replica that answered holds (coverage).
        self.docs = 0
        # Why the shard failed, if it does: a failure, unless it had no replica at all
        # or its replicas refused for overload.
        self.reason: FailureReason = "error"
        self.tried: list[Replica] = []
        self.attempts: list[Attempt] = []
        self.hits: list[Ranked] | None = None
        # The replica whose answer is the shard's (None until one answers).
        self.answered_by: Replica | None = None
        # The answer was cut short by the data server at the request's budget.
        self.cut = False
        # Until a replica answers: what the last attempt did ("failed" if none could be made).
        self.outcome: ShardOutcome = "failed"
        self.done = False
        self.hedge_timer: Cancellable | None = None
        # How long to wait before offering a hedge refused for the budget again.
        self.hedge_backoff = 0.0
        # A demoted replica due its probe: sent a copy of the first request beside it
        # (search_server.demotion), then None.
        self.probe_copy: Replica | None = None
        # Probes' copies that lost the race, still out: left to answer until the query
        # ends, when they are dropped (see answered, drop_copies).
        self.copies: list[Attempt] = []

    def sent(self, attempt: Attempt) -> None:
        """``attempt`` is out: its replica is tried, and has one more request out."""
        replica = attempt.replica
        self.tried.append(replica)
        replica.outstanding += 1
        replica.sent += 1
        groups = self.groups
        if groups is not None and replica.group is not None:
            # Its group's load, which the next queries' choice of a group reads.
            attempt.group = groups.table.sent(replica)
        self.attempts.append(attempt)

    def returned(self, attempt: Attempt) -> None:
        """``attempt`` came back (answer or error): no longer out."""
        if attempt in self.attempts:
            self.attempts.remove(attempt)
        else:
            self.copies.remove(attempt)  # a probe's copy, after the shard's answer
        attempt.replica.outstanding -= 1
        if attempt.group is not None:
            attempt.group.outstanding -= 1

    def answered(
        self, replica: Replica, hits: list[Ranked], docs: int, cut: bool, now: float
    ) -> None:
        """``replica``, holding ``docs``, answered with ``hits``: the shard's answer. The
        requests still out are the slower of a hedged pair: each is cancelled, and its
        replica charged with the time it has had (``now``, the query's timer); but a
        probe's copy is left to answer (:attr:`copies`), its time being the probe's
        news."""
        self.hits, self.outcome = hits, "ok"
        self.answered_by = replica
        cap = self.docs_cap
        self.docs = docs if cap is None else min(docs, cap)
        self.cut = cut
        for loser in self.attempts:
            if loser.copy:
                self.copies.append(loser)
                continue
            loser.replica.outstanding -= 1
            if loser.group is not None:
                loser.group.outstanding -= 1
            loser.replica.penalize(now - loser.started)
            loser.future.cancel()
        self.attempts.clear()

    def again(self, asked: int) -> ShardCall:
        """A new call of this shard in the same query, whose requests ask for ``asked``
        hits: a second round of the top ``k`` once this one has answered (see
        :meth:`Query._second_round <search_server.query.Query._second_round>`). The same
        replicas and coverage cap, no group, nothing tried; this call keeps its answer."""
        call = ShardCall(self.route, self.docs_cap)
        call.asked = asked
        return call

    def end(self) -> None:
        """The shard's part of the query is over: no hedge is offered any more."""
        self.done = True
        if self.hedge_timer is not None:
            self.hedge_timer.cancel()
            self.hedge_timer = None

    def drop_copies(self) -> list[Attempt]:
        """Cancel the probes' copies still out after the shard's answer (the query is
        over): those dropped, for the caller to charge."""
        dropped, self.copies = self.copies, []
        return _cancelled(dropped)

    def drop(self) -> list[Attempt]:
        """Cancel the requests still out (at the deadline, or the query cancelled):
        the attempts dropped, for the caller to charge."""
        dropped, self.attempts = self.attempts, []
        return _cancelled(dropped)


def _cancelled(attempts: list[Attempt]) -> list[Attempt]:
    """``attempts``, each no longer counted in flight and its request cancelled."""
    for attempt in attempts:
        attempt.replica.outstanding -= 1
        if attempt.group is not None:
            attempt.group.outstanding -= 1
        attempt.future.cancel()
    return attempts
