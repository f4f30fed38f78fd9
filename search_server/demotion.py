"""Latency outlier demotion: a replica much slower than its shard's peers gets no
request while a peer is not demoted, except a probe now and then.

"The Tail at Scale" (Dean and Barroso) calls it latency-induced probation: a machine
that answers far slower than its peers is left out of the requests, and is sent a
request now and then so that it is taken back once it is fast again. Relative on
purpose: a busy cluster, where every replica slows together, demotes nobody. Not an
ejection: no failure is counted, no place under the ejection cap is taken, and the
panic threshold does not see it (and a request already out when its replica is
demoted that then times out is no failure either: see
:meth:`Query._abandon <search_server.query.Query._abandon>`). A replica demoted loses
its share of the traffic (capacity), never its answers, its registration or its
shard.

**What is compared.** Not the replicas' response times as they are: a query that is
expensive (a shard's most frequent terms) is expensive on every shard and every
replica, and an EWMA of a few answers swings by several times with the queries it
happened to get (one 8 ms answer among 1 ms ones triples it), so a rule on it demotes
healthy replicas many times a second. Each answer is first divided by the median
response time of the same query's other shards (:meth:`LatencyDemotion.observe`): the
query's cost cancels out, and what is left is how much slower this replica was than
the cluster at that moment. Its EWMA, the replica's *relative slowness*
(:attr:`~search_server.picking.Replica.relative`), stays within 1 to 2.5 for a healthy
replica and is 5 to 10 for one slowed ten times (``bench/bench_dispatch.py``).

:class:`LatencyDemotion` keeps that statistic and narrows a request's candidates;
:class:`~search_server.candidates.Candidates` asks it, and each
:class:`~search_server.query.Query` tells it the times of its shards. Pure choice and
arithmetic on the fan-out's clock: it sends nothing. ``O(peers)`` per request (a
shard's few replicas, or its subset's), ``O(shards log shards)`` per query. Not
thread-safe (the fan-out's event loop).

Design: docs/design/search-server.md, "Latency outlier demotion".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from .metrics import FanOutMetrics
from .picking import EWMA_ALPHA, Replica

__all__ = [
    "DEMOTE_FLOOR",
    "DEMOTE_PROBE_INTERVAL",
    "DEMOTE_RATIO",
    "LatencyDemotion",
    "Timing",
]

#: How many times the relative slowness of its shard's typical replica makes a replica an
#: outlier (``--demote-ratio``; 0: off). A healthy replica's stays within 2.5 times its
#: peers'; one slowed ten times is 5 to 10 times theirs.
DEMOTE_RATIO: Final = 3.0
#: Seconds its response-time EWMA must also be above the typical replica's to be demoted
#: (``--demote-floor-ms``, in milliseconds): replicas differing by a fraction of a
#: millisecond (0.1 and 0.4 ms) are not worth a share of the shard's capacity.
DEMOTE_FLOOR: Final = 0.002
#: Seconds between two probes of a demoted replica (``--demote-probe-interval``): one
#: query's first request, whose answer says what it has become.
DEMOTE_PROBE_INTERVAL: Final = 1.0

#: One sub-request's time in a query, for :meth:`LatencyDemotion.observe`: its replica,
#: its seconds (per request this search server had in flight to it: see ``observe``),
#: whether it is only a lower bound (a request abandoned, or the loser of a hedged pair:
#: its answer would have taken at least that), and whether it was sent while its replica
#: was demoted (a probe, or a retry with no other replica left: news of what it is now).
Timing = tuple[Replica, float, bool, bool]

# Reference times below this (seconds) are taken as this: a guard against dividing by
# nothing, well under any answer's time over a network.
_LEAST_REFERENCE = 1e-6
# A demoted replica is taken back at this share of the limit that demoted it: half the
# ratio, so that an answer a little under the limit does not flap it back and forth, and
# its peers must have slowed to within half its time before they give it back their load.
_RESTORE = 0.5


class LatencyDemotion:
    """Which of a shard's replicas are latency outliers, and the candidates without them.

    A shard's replicas are judged at each of its requests, among its ``peers`` (its
    members, those ejected left out) with at least ``min_samples`` answers of relative
    slowness. The *typical* one is the lower median of those in rotation (not demoted);
    one not demoted whose relative slowness is above ``ratio`` times the typical one's,
    and whose response-time EWMA is more than ``floor`` seconds above the typical one's,
    is *demoted*; a demoted one is taken back once its relative slowness is no more
    than half that limit (hysteresis). At least half of the shard's replicas stay in
    rotation, neither ejected nor demoted: when more are outliers than that allows,
    those already demoted stay so, then the slowest are, and the probes of those kept
    out come four times as often until it settles. ``ratio`` 0 turns demotion off.

    A demoted replica gets no request while a candidate that is not demoted is left,
    but for a *probe* every ``probe_interval`` seconds of the fan-out's clock: a copy of
    one query's first request to its shard, sent beside the request to a replica in
    rotation (a hedge never goes to it; a retry may when nothing else is left). The
    query takes whichever answers first, so a probe never makes a query wait for a
    replica known to be slow (sent as the query's only request, each probe of a replica
    slowed ten times was among the slowest queries: ``bench/bench_dispatch.py``). A
    copy that loses the race is left to answer until its query ends, so that a
    recovered replica's probe is news even when its peer answered first; one still out
    then is cancelled, and tells only that it took at least that long (a lower bound).
    The answer to a request sent while it is demoted replaces its relative slowness
    instead of being folded in (what it was before is stale), so one probe answered as
    fast as its peers takes it back, and one as slow as before keeps it out.

    The state is on each replica (:attr:`Replica.demoted_at`, :attr:`Replica.probed_at`),
    set and cleared as its shard's requests judge it; each demotion, probe and return is
    counted in ``metrics`` (``search_server_fanout_demotions_total{event}``).

    Raises ``ValueError`` for ``ratio`` neither 0 nor above 1, a negative ``floor``,
    ``probe_interval`` not above 0 or ``min_samples`` below 1.
    """

    def __init__(
        self,
        *,
        ratio: float = DEMOTE_RATIO,
        floor: float = DEMOTE_FLOOR,
        probe_interval: float = DEMOTE_PROBE_INTERVAL,
        min_samples: int = 5,
        metrics: FanOutMetrics,
    ) -> None:
        if not (ratio == 0 or ratio > 1):
            raise ValueError(f"ratio must be 0 (off) or above 1, got {ratio}")
        if not floor >= 0:
            raise ValueError(f"floor must be >= 0 seconds, got {floor}")
        if not probe_interval > 0:
            raise ValueError(f"probe_interval must be > 0 seconds, got {probe_interval}")
        if min_samples < 1:
            raise ValueError(f"min_samples must be >= 1, got {min_samples}")
        self._ratio = ratio
        self._floor = floor
        self._probe_interval = probe_interval
        self._min_samples = min_samples
        # Looked up once, not per request.
        self._demoted = metrics.demotions.labels(event="demoted")
        self._probes = metrics.demotions.labels(event="probe")
        self._restored = metrics.demotions.labels(event="restored")

    @property
    def enabled(self) -> bool:
        return self._ratio > 0

    # -- the statistic ----------------------------------------------------------------

    def observe(self, timings: Sequence[Timing]) -> None:
        """Fold one query's sub-request times into their replicas' relative slowness.

        Each answer's time is divided by the median of the other answers' (the lower
        one of an even count), a lower bound's by the median of all answers'. Nothing
        is learned from a query with fewer than two answers: there is no other shard to
        compare with. A lower bound is folded in only when it is above what the
        replica has (as :meth:`Replica.penalize` does), and never starts its record.

        The query passes each time divided by the requests this search server had in
        flight to that replica when it sent this one, this one included: what a
        replica takes when this search server queues requests on it is the pickers'
        business (their queue terms), and counted whole it made two busy replicas take
        turns as "outliers" at 40 % load, each demotion moving the load that made the
        other slow. Divided, a replica searching its requests in turn shows its time per
        request, whatever the queue: ten times its peers' when slowed ten times, even
        with requests piled up on it. A replica busy with other search servers'
        requests is slow from here, and is judged so.
        """
        answers = sorted(seconds for _, seconds, lower, _ in timings if not lower)
        count = len(answers)
        if count < 2:
            return
        # The lower median of the count - 1 others: without an answer above the median
        # position, the one there; without one at or below it, the next (any answer of
        # the same value left out leaves the same others).
        middle = (count - 2) // 2
        below = max(answers[middle], _LEAST_REFERENCE)
        above = max(answers[middle + 1], _LEAST_REFERENCE)
        everyone = max(answers[(count - 1) // 2], _LEAST_REFERENCE)
        split = answers[middle]
        # Inline, not a call per answer: a query of 500 shards does this 500 times.
        for replica, seconds, lower, fresh in timings:
            if lower:
                ratio = seconds / everyone
                if replica.relative_samples and ratio > replica.relative:
                    replica.relative += EWMA_ALPHA * (ratio - replica.relative)
                continue
            ratio = seconds / (below if seconds > split else above)
            if replica.relative_samples == 0 or (fresh and replica.demoted_at is not None):
                # Its first answer, or the answer to a request sent while it was demoted
                # (its probe): what it is now, not a step from what it was when it was
                # demoted. Answers to requests sent before its demotion are folded in.
                replica.relative = ratio
            else:
                replica.relative += EWMA_ALPHA * (ratio - replica.relative)
            replica.relative_samples += 1

    # -- choosing ---------------------------------------------------------------------

    def narrow(
        self,
        candidates: list[Replica],
        peers: Sequence[Replica],
        now: float,
        *,
        seen: float,
        first: bool,
    ) -> tuple[list[Replica], Replica | None]:
        """``candidates`` less those demoted among ``peers`` (the shard's replicas they
        are judged against, those ejected at ``seen`` left out: the shard's members,
        tried ones included, so that a hedge's or a retry's judgement is the first
        request's), and, for a ``first`` request, a demoted candidate whose probe is
        due (None: none is), for the caller to send a copy of the request. The
        candidates are ``candidates`` itself (not a copy) when none of them is
        demoted, the common case.

        Empty when every candidate is demoted: a group whose replica of the shard is
        demoted (the caller fills from the shard), or a retry or hedge with only
        demoted ones left (the caller keeps them: demotion never leaves a shard
        without a candidate). Judging also moves the peers' state: a replica found an
        outlier is demoted (its first probe due ``probe_interval`` later), one no
        longer found so is taken back.
        """
        least = self._min_samples
        ratio = self._ratio
        # The common case in one pass, without a list: no replica demoted, and none
        # more than the ratio above the fastest in rotation (so none above the typical
        # one), or fewer than two to compare.
        judged = 0
        low = high = 0.0
        marked = False
        for replica in peers:
            if replica.relative_samples < least:
                continue
            until = replica.ejected_until
            if until is not None and seen < until:
                continue
            if replica.demoted_at is not None:
                marked = True
                continue
            relative = replica.relative
            if judged == 0:
                low = high = relative
            elif relative < low:
                low = relative
            elif relative > high:
                high = relative
            judged += 1
        if not marked and (judged < 2 or high <= low * ratio):
            return candidates, None
        return self._judge(candidates, peers, now, seen=seen, first=first)

    def _judge(
        self,
        candidates: list[Replica],
        peers: Sequence[Replica],
        now: float,
        *,
        seen: float,
        first: bool,
    ) -> tuple[list[Replica], Replica | None]:
        """:meth:`narrow` past its common case: the peers judged in full."""
        least = self._min_samples
        gap = self._probe_interval
        relatives: list[float] = []
        seconds: list[float] = []
        marked = False
        ejected = 0
        judged = 0
        for replica in peers:
            if replica.is_ejected(seen):
                ejected += 1
            elif replica.relative_samples >= least:
                judged += 1
                if replica.demoted_at is None:
                    relatives.append(replica.relative)
                    seconds.append(replica.seconds)
                else:
                    marked = True
        over: list[Replica] = []
        if judged >= 2 and relatives:
            # Compared with the typical replica in rotation (the lower median of those
            # not demoted), not the fastest: one idle or newly started replica would
            # make its busy peers look like outliers, and demoting them would pile the
            # shard onto it. Not the demoted ones, whose figures are as old as their
            # last probe: a replica slowed while another is demoted would be the
            # median of three, and never an outlier.
            relatives.sort()
            seconds.sort()
            typical = (len(relatives) - 1) // 2
            demote = relatives[typical] * self._ratio
            # Hysteresis (see _RESTORE; the floor is for demoting only).
            keep = demote * _RESTORE
            slow = seconds[typical] + self._floor
            for replica in peers:
                if replica.relative_samples < least or replica.is_ejected(seen):
                    continue
                if replica.demoted_at is None:
                    if replica.relative > demote and replica.seconds > slow:
                        over.append(replica)
                elif replica.relative > keep:
                    over.append(replica)
            # At least half of the shard's replicas stay in rotation, neither ejected nor
            # demoted: demotion never piles the shard onto fewer (those left in take
            # the share of those taken out).
            room = max(0, len(peers) // 2 - ejected)
            if len(over) > room:
                # Those already demoted first, then the slowest: a demotion moves load,
                # and trading places with a peer at each request would move it back and
                # forth. But those kept out may be so on old news (a replica that has
                # recovered, known only from its last probe) while a fresh outlier is
                # left in: their probes are due four times as often until it settles.
                over.sort(key=_demoted_then_slowest)
                del over[room:]
                gap = self._probe_interval / 4
        if not over and not marked:
            return candidates, None
        if marked:
            for replica in peers:
                if (
                    replica.demoted_at is not None
                    and replica not in over
                    and not replica.is_ejected(seen)
                ):
                    # (An ejected one is not judged: it stays as it was.)
                    replica.demoted_at = None
                    self._restored.inc()
        if not over:
            return candidates, None
        for replica in over:
            if replica.demoted_at is None:
                replica.demoted_at = replica.probed_at = now
                self._demoted.inc()
        probe = None
        if first:
            for replica in candidates:
                if replica.demoted_at is not None and replica.probed_at + gap <= now:
                    replica.probed_at = now
                    self._probes.inc()
                    probe = replica
                    break
        return [replica for replica in candidates if replica not in over], probe


def _demoted_then_slowest(replica: Replica) -> tuple[bool, float]:
    return replica.demoted_at is None, -replica.relative
