"""One query's fan-out: its shard calls, retries, hedges and deadline, the second round
of its top ``k``, and its answer.

A :class:`Query` is made by :meth:`FanOut.search <search_server.fanout.FanOut.search>`
for each admitted query and run once; what outlives it (replica choice, ejection,
budgets, metrics) it reaches through its :class:`QueryContext`. Answers arrive in
callbacks, not a task per sub-request. Runs on the caller's event loop; not thread-safe.

Design: docs/design/search-server.md, "The fan-out".
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVarTuple, Unpack
from urllib.parse import urlencode

import orjson

from .blame import OUTLIERS, SHED_HEDGE_PAUSE, Blame, OwnLoad, TimeoutBlame
from .candidates import Candidates
from .coverage import CoveragePolicy, CoverageWait, EndRule
from .demotion import LatencyDemotion, Timing
from .expectedshards import list_missing_capped
from .groups import Group
from .hedging import SIBLING_RATIO, HedgePolicy
from .httpclient import SubrequestClient, SubrequestError
from .merging import (
    BadAnswer,
    FanOutResult,
    answer_bytes,
    feedback,
    load_report,
    merge,
    ranked_hits,
)
from .metrics import FanOutMetrics
from .picking import LatencyWindow, Replica, ReplicaPicker
from .replicahealth import ReplicaHealth
from .retrybudget import ExtraRequest, RetryBudget
from .shardcall import Attempt, Cancellable, ShardCall
from .shardrouting import ShardRoute
from .topk import TOPK_PROBABILITY, hits_asked, inexact_shards

__all__ = ["Query", "QueryContext", "Timer"]

log = logging.getLogger(__name__)

_Ts = TypeVarTuple("_Ts")

# A data server's answers that say it is overloaded rather than broken: full (429), not
# taking requests now (503), or its budget spent before the search could start (504: the
# request waited in its queue that long). A refusal, not a failure: never a step towards
# ejection (see Query._on_answer).
_OVERLOAD_STATUSES = frozenset({429, 503, 504})


class Timer(Protocol):
    """The clock and alarms a query's deadline, hedges and waits run on: an event
    loop's ``time`` and ``call_at`` (any :class:`asyncio.AbstractEventLoop` is one)."""

    def time(self) -> float: ...

    def call_at(
        self, when: float, callback: Callable[[Unpack[_Ts]], object], *args: *_Ts
    ) -> Cancellable: ...


@dataclass(frozen=True, slots=True)
class QueryContext:
    """The long-lived parts of a fan-out that each of its queries uses.

    ``clock`` times ejections, backoffs and the shedding pause (the fan-out's);
    ``timer`` the queries' deadlines and hedges (None: the running loop); ``demotion``
    learns each query's sub-request times (None: demotion is off, nothing is kept).
    """

    client: SubrequestClient
    candidates: Candidates
    health: ReplicaHealth
    blame: TimeoutBlame
    own: OwnLoad
    hedging: HedgePolicy
    retry_budget: RetryBudget
    metrics: FanOutMetrics
    clock: Callable[[], float]
    timer: Timer | None = None
    demotion: LatencyDemotion | None = None


class Query:
    """One query in flight, from its first requests to its merged answer.

    ``picker`` chooses each request's replica among the candidates. The deadline is
    ``timeout_ms`` after the query is made (by its timer). Each shard is asked for the
    fewest hits that keep the merged top ``k`` exact with ``topk_probability``
    (:func:`~search_server.topk.hits_asked`; 1: ``k`` of every shard). :meth:`run`
    sends, waits for the answers or the deadline (or, with a ``coverage`` policy that is
    active, until it stops waiting for the rest), abandons what is still out and
    merges; with ``topk_second_round``, it then asks the shards whose answers may have
    left a hit out of the top ``k`` again, for ``k``, while the deadline allows
    (:meth:`_second_round`). It never raises for a shard's failure, only when the
    query itself is cancelled.
    """

    def __init__(
        self,
        context: QueryContext,
        picker: ReplicaPicker,
        *,
        query: str,
        k: int,
        timeout_ms: int,
        coverage: CoveragePolicy | None = None,
        topk_probability: float = TOPK_PROBABILITY,
        topk_second_round: bool = True,
    ) -> None:
        loop = asyncio.get_running_loop()
        self._ctx = context
        self._picker = picker
        self._timer: Timer = context.timer if context.timer is not None else loop
        self.started = self._timer.time()
        self.deadline = self.started + timeout_ms / 1000
        # Encoded once; each distinct k' asked completes a target (see _ask), to which
        # each attempt appends what is left of the deadline when it is sent.
        self._query_target = ("/search?" + urlencode({"q": query}) + "&k=").encode("ascii")
        self._k = k
        self._topk_probability = topk_probability
        self._topk_second_round = topk_second_round
        # In the second round (see _second_round): no retry, and no search time taken
        # as the query's own (the whole round is).
        self._asking_again = False
        # Per k' asked: the request target, and the most an answer of k' hits may weigh
        # (a body over it is refused unparsed).
        self._targets: dict[int, tuple[bytes, int]] = {}
        self._calls: list[ShardCall] = []
        self._open_calls = 0
        self._total = 0
        # Calls whose hedge came due while most shards were still out (see _hedge).
        self._deferred: list[ShardCall] = []
        # When each shard that answered did, since the query started (first round), in
        # the order they answered: sorted, so its median is its middle element.
        self._answered_at: list[float] = []
        self._waiter: asyncio.Future[None] = loop.create_future()
        # The longest search time a data server reported for this query (at most the
        # time its answer took): what of the query's latency was work, not queueing.
        self.service = 0.0
        # Answers counted into the metrics at the end: a prometheus counter increment
        # takes a lock, once per query is plenty.
        self._ok = 0
        self._coverage = coverage if coverage is not None else CoveragePolicy()
        # The coverage policy's view of this query, once its shards are known (None:
        # the policy is off, every shard is waited for until the deadline).
        self._wait: CoverageWait | None = None
        self._early_timer: Cancellable | None = None
        # The rule that ended the query before its deadline, if one did.
        self._ended_by: EndRule | None = None
        # How long the query waited, once its coverage was reached, for shards it then
        # let go: the policy's choice, not the load's (see FanOut._latency).
        self.lingered = 0.0
        # How long its second round of the top k took: the query's own cost, like a data
        # server's search time, not queueing (see FanOut._latency).
        self.asked_again = 0.0
        # Its sub-requests' times, for latency outlier demotion (None: it is off).
        self._timings: list[Timing] | None = [] if context.demotion is not None else None

    async def run(
        self,
        routes: Sequence[ShardRoute],
        missing: Sequence[tuple[int, int]],
        *,
        docs_cap: int | None = None,
        group: Group | None = None,
    ) -> FanOutResult:
        """Fan out to the shards of ``routes`` and merge their answers (``missing``:
        the shards with no replica, and their documents; ``docs_cap``: the most one
        shard's documents count for in the coverage; ``group``: the replica group the
        first requests go to). Returns by the deadline (plus a loop iteration)."""
        ctx = self._ctx
        calls = self._calls = [ShardCall(route, docs_cap, group) for route in routes]
        self._ask(calls)
        ctx.hedging.budget.deposit(len(calls))
        ctx.retry_budget.deposit(len(calls))
        self._open_calls = self._total = len(calls)
        self._wait = self._coverage_wait(calls, missing)
        for call in calls:
            if not self._next_attempt(call):
                call.reason = "no_replica"
                self._finish(call)  # every replica ejected: failed at once
        await self._gather(calls)
        took_ms = (self._timer.time() - self.started) * 1000
        # Every missing shard counted, the first of them listed.
        result = list_missing_capped(
            merge(calls, self._k, took_ms, missing, timed_out_reason=self._ended_by or "deadline")
        )
        flagged = self._flagged(calls, result)
        if flagged and self._may_ask_again():
            result, flagged = await self._second_round(flagged, result, missing)
        if flagged:
            self._maybe_inexact(flagged)
        self._count(result)
        return result

    async def _gather(self, calls: Sequence[ShardCall]) -> None:
        """Wait until ``calls`` have all ended, the deadline passes or the coverage
        policy stops waiting; then abandon what is still out."""
        deadline_timer = self._timer.call_at(self.deadline, _wake, self._waiter)
        try:
            if self._open_calls > 0:
                await self._waiter
        finally:
            deadline_timer.cancel()
            # At the deadline (or when the query itself is cancelled, the client gone):
            # abandon what is still in flight; when the coverage policy ended the query,
            # let it go first.
            now = self._timer.time()
            self._settle_coverage(now)
            timed_out = self._ended_by is None and now >= self.deadline
            blame = self._blame(calls, now) if timed_out else Blame.NONE
            for call in calls:
                if not call.done:
                    self._abandon(call, timed_out, blame=blame)
                elif call.copies:
                    self._drop_copies(call, now)
            if self._ok:
                self._ctx.metrics.shard_requests.labels(result="ok").inc(self._ok)
                self._ok = 0
            timings = self._timings
            if timings and self._ctx.demotion is not None:
                # Each time compared with the same round's other shards' (a second
                # round's asked for as many hits as each other): known now.
                self._ctx.demotion.observe(timings)
                timings.clear()

    # -- sending ----------------------------------------------------------------------

    def _next_attempt(self, call: ShardCall, *, retry: bool = False) -> bool:
        """Send the shard's first request or a ``retry``; False if no replica is left,
        or, for a retry, the retry budget is spent (or, after an overload refusal, every
        replica left has refused too: a retry would only add to the overload)."""
        ctx = self._ctx
        health = ctx.health
        clock_now = ctx.clock()
        if not call.tried:
            call.panic = health.panicking(call.shard, call.routable, clock_now)
        candidates = ctx.candidates.of(call, clock_now)
        # A demoted replica due its probe, set by a first request's candidates.
        copy, call.probe_copy = call.probe_copy, None
        if candidates and retry and call.reason == "overload" and health.any_overloaded:
            candidates = health.not_overloaded(candidates, clock_now)
            if not candidates:
                return False
        if not candidates:
            probe = health.probe(call.replicas, call.tried, clock_now)
            if probe is None or (retry and not self._spend("retry")):
                return False
            self._send(call, probe, hedge=False, probe=True)
            return True
        if retry and not self._spend("retry"):
            return False
        now = self._timer.time()
        primary = self._picker.pick(candidates)
        if ctx.candidates.last_resort(call, primary):
            ctx.metrics.last_resort.inc()
        # In panic, a request to an ejected replica is also its probe: an answer ends
        # its ejection.
        self._send(call, primary, hedge=False, probe=call.panic and primary.is_ejected(clock_now))
        if copy is not None and copy is not primary:
            # Its probe races the request (see search_server.demotion): the query takes
            # whichever answers first, and never waits on a replica known to be slow.
            self._send(call, copy, hedge=False, copy=True)
        hedging = ctx.hedging
        if hedging.enabled and call.hedge_timer is None and ctx.candidates.may_hedge(call):
            self._hedge_in(call, now, hedging.delay(call.replicas, primary))
        return True

    def _spend(self, kind: ExtraRequest) -> bool:
        """Take an extra request from the retry budget; count it if refused."""
        if self._ctx.retry_budget.withdraw(kind):
            return True
        self._ctx.metrics.budget_refused.labels(kind=kind).inc()
        return False

    def _send(
        self,
        call: ShardCall,
        replica: Replica,
        *,
        hedge: bool,
        probe: bool = False,
        copy: bool = False,
    ) -> None:
        now = self._timer.time()
        # The budget left, in whole milliseconds (rounded down, so the data server's
        # deadline never falls after ours); at least 1, the least timeout_ms there is.
        budget_ms = max(1, int((self.deadline - now) * 1000))
        # The client never raises: a request that cannot be sent fails its future.
        target, max_body = self._targets[call.asked]
        future = self._ctx.client.get(replica.endpoint, b"%b%d" % (target, budget_ms), max_body)
        attempt = Attempt(
            replica,
            future,
            now,
            hedge,
            probe,
            demoted=replica.demoted_at is not None,
            share=replica.outstanding + 1,
            copy=copy,
        )
        call.sent(attempt)
        future.add_done_callback(lambda f: self._on_answer(call, attempt))

    # -- hedging ----------------------------------------------------------------------

    def _hedge_in(self, call: ShardCall, now: float, delay: float | None) -> None:
        """Offer the shard a hedge ``delay`` after ``now``, if that is before the deadline
        (never when no latency window tells a ``delay``)."""
        if delay is not None and now + delay < self.deadline:
            call.hedge_timer = self._timer.call_at(now + delay, self._hedge, call)

    def _hedge(self, call: ShardCall) -> None:
        """The shard's request is out longer than another replica's recent p95: one more
        request, to a replica that would usually have answered by now, if the budget
        allows.

        Not while fewer than half of the query's shards have answered: then the whole
        query is late (a stall here, a busy machine), not this shard, and hedges would
        spend the budget without gaining anything; nor, after, while more of them are
        still out than outliers make (more than two and a tenth): the slowness is
        everyone's, and hedges would add to it. The hedge is offered again the
        fastest other replica's usual spread (p95 - p50) after half have answered, if
        the shard is still out then. Nor before it has been out
        :data:`~search_server.hedging.SIBLING_RATIO` times the median time of the
        query's shards that answered: until then its lateness is the query's cost, not
        its replica's (offered again at that time). One refused for the budget is
        offered again a p95 later, then two, four... until the deadline: the longer a
        shard is out, the likelier it is a straggler rather than the usual tail.
        """
        call.hedge_timer = None
        if call.done or not call.attempts:
            return
        total, open_calls = self._total, self._open_calls
        if total >= 4 and 2 * (total - open_calls) < total:
            self._deferred.append(call)
            return
        ctx = self._ctx
        hedges = ctx.metrics.hedges
        if open_calls > max(OUTLIERS, total // 10):
            # More shards out than outliers make (the rule that blames no replica for a
            # timeout): the data servers are slow together, a busy machine or a cluster
            # at its knee, and a hedge is one more request to one of them. Sent anyway,
            # a burst of them was where the overload benchmark's stalls at the knee began.
            hedges.labels(result="systemic").inc()
            return
        started = call.attempts[0].started
        now = self._timer.time()
        answered_at = self._answered_at
        if answered_at:
            # Not yet a straggler against the query's shards that answered: the query's
            # own cost (see SIBLING_RATIO). Offered again once it is.
            due = started + SIBLING_RATIO * answered_at[(len(answered_at) - 1) // 2]
            if now < due:
                hedges.labels(result="in_step").inc()
                self._hedge_in(call, now, due - now)
                return
        if ctx.own.since_shed() < SHED_HEDGE_PAUSE:
            # This search server is refusing queries for want of capacity: a hedge
            # would take it from the queries it admitted.
            hedges.labels(result="shedding").inc()
            return
        if ctx.own.lagged_since(started):
            # Our own loop fell behind while the request was out: its answer may be
            # waiting in the socket, and a hedge would add load to a machine that has
            # none to spare.
            hedges.labels(result="own_lag").inc()
            return
        clock_now = ctx.clock()
        candidates = ctx.candidates.for_hedge(call, now - started, clock_now)
        if not candidates:
            return
        hedging = ctx.hedging
        if not (hedging.budget.available and self._spend("hedge")):
            hedges.labels(result="over_budget").inc()
            backoff = hedging.backoff(call.replicas, call.attempts[0].replica, call.hedge_backoff)
            if backoff is not None:
                call.hedge_backoff = backoff
                self._hedge_in(call, now, backoff)
            return
        hedging.budget.withdraw()
        hedge = self._picker.pick(candidates)
        if ctx.candidates.last_resort(call, hedge):
            ctx.metrics.last_resort.inc()
        self._send(call, hedge, hedge=True, probe=call.panic and hedge.is_ejected(clock_now))
        hedges.labels(result="sent").inc()

    # -- hits asked -------------------------------------------------------------------

    def _ask(self, calls: Sequence[ShardCall]) -> None:
        """Set the hits each shard is asked for, and make the target of each distinct
        number once (a query of equal shards makes one)."""
        k = self._k
        asked = hits_asked(k, [call.shard_docs for call in calls], self._topk_probability)
        for call, hits in zip(calls, asked, strict=True):
            call.asked = hits
            self._target(hits)
        metrics = self._ctx.metrics
        metrics.topk_hits_asked.inc(sum(asked))
        metrics.topk_hits_k.inc(k * len(calls))

    def _target(self, hits: int) -> None:
        """Make the request target of ``hits`` and its answer's cap, once per query."""
        if hits not in self._targets:
            self._targets[hits] = (
                b"%b%d&timeout_ms=" % (self._query_target, hits),
                answer_bytes(hits),
            )

    def _flagged(self, answers: Sequence[ShardCall], result: FanOutResult) -> list[ShardCall]:
        """The calls of ``answers`` (those ``result`` merged) whose shard, asked for fewer
        than k hits, may have left one out of the merged top k (see
        :func:`~search_server.topk.inexact_shards`, which reads the top k the merge
        made: no second merge). None when every shard was asked for k."""
        k = self._k
        if all(call.asked >= k for call in answers):
            return []
        shards = inexact_shards(
            ((call.shard, len(call.hits), call.asked) for call in answers if call.hits is not None),
            k,
            result.hits,
        )
        if not shards:
            return []
        flagged = set(shards)
        return [call for call in answers if call.shard in flagged]

    def _maybe_inexact(self, flagged: Sequence[ShardCall]) -> None:
        """Count the query as maybe inexact: ``flagged`` shards' answers (their first,
        asked for fewer than k) may have left a hit out of its merged top k; no second
        round asked them again, or it did not complete."""
        self._ctx.metrics.topk_maybe_inexact.inc()
        k = self._k
        log.debug(
            "top %d may be inexact: shards %s returned all the hits they were asked for, "
            "every one of them in the merged top %d",
            k,
            [call.shard for call in flagged[:10]],
            k,
        )

    # -- the second round of the top k -------------------------------------------------

    def _may_ask_again(self) -> bool:
        """A second round is on, and the query's first one ended by itself before its
        deadline: every shard's call ended (answered or failed) with time left, none was
        let go at the deadline or by the coverage policy (the query was not cancelled
        either: :meth:`run` would not be here)."""
        return (
            self._topk_second_round
            and self._open_calls == 0
            and self._ended_by is None
            and self._timer.time() < self.deadline
        )

    async def _second_round(
        self,
        flagged: Sequence[ShardCall],
        first: FanOutResult,
        missing: Sequence[tuple[int, int]],
    ) -> tuple[FanOutResult, list[ShardCall]]:
        """Ask each ``flagged`` shard again, for ``k`` hits, with what is left of the
        deadline as its budget; wait for the answers or the deadline; merge again. The
        result, and the calls whose answers still may have left a hit out of its top k
        (empty when it is exact).

        **Why one round is enough.** A shard not flagged either returned fewer hits
        than it was asked for (it has no more) or had its last hit outside the first
        merge's top ``k``: every hit it did not return ranks below that merge's ``k``-th.
        The second answers hold the first ones (a shard's top ``k'`` is the head of its
        top ``k``), so the second merge's ``k``-th ranks no lower than the first's, and
        those hits stay out. A flagged shard now gave its top ``k``: a hit it did not
        return ranks below ``k`` of its own. So the merge of the second answers with the
        other first ones is the merge of every shard's top ``k``: exact. The flags are
        still checked again on it (:meth:`_flagged`, ``k`` hits read): a replica that
        ranks a shard otherwise than the one that answered first, or a second request
        that failed, is counted, never assumed.

        **What a second request is.** Preferably to the replica that answered the shard
        (its answer was fresh), else to one of the shard's candidates
        (:meth:`Candidates.again <search_server.candidates.Candidates.again>`); none: the
        shard is not asked. Its answer goes through the same checks and records as any
        (a failure, a bad answer or a refusal for overload is charged as it would be to a
        first request; one still out at the deadline is judged as any timeout), but it
        is neither retried nor hedged: second rounds are rare (under 1 % of the
        benchmark's queries at the default probability), and a shard whose second
        request fails keeps its first answer, which is still a valid top ``k'`` (the
        shard still counts as answered: no more partial for it, only maybe inexact). A
        ``cut`` answer keeps the first one too (a cut search is not a whole top ``k``). The
        coverage never changes: those shards had answered. The round's time is counted
        in :attr:`asked_again`, the query's own cost, not queueing (see
        :meth:`FanOut._latency <search_server.fanout.FanOut._latency>`).
        """
        ctx = self._ctx
        k = self._k
        timer = self._timer
        started = timer.time()
        self._target(k)
        self._asking_again = True
        # The first round's state that answers in the second would otherwise touch.
        self._wait = None
        self._deferred = []
        self._waiter = asyncio.get_running_loop().create_future()
        clock_now = ctx.clock()
        again: list[ShardCall] = []
        for call in flagged:
            second = call.again(k)
            candidates = ctx.candidates.again(second, call.answered_by, clock_now)
            # A demoted replica due its probe (when the candidates were the shard's).
            copy, second.probe_copy = second.probe_copy, None
            if candidates:
                primary = self._picker.pick(candidates)
                self._send(second, primary, hedge=False)
                if copy is not None and copy is not primary:
                    self._send(second, copy, hedge=False, copy=True)
                again.append(second)
        self._open_calls = len(again)
        await self._gather(again)
        self.asked_again = timer.time() - started
        # A second answer replaces its shard's first; a cut one does not.
        replaced = {call.shard: call for call in again if call.hits is not None and not call.cut}
        took_ms = (timer.time() - self.started) * 1000
        if replaced:
            answers = [replaced.get(call.shard, call) for call in self._calls]
            result = list_missing_capped(merge(answers, k, took_ms, missing))
            still = self._flagged(answers, result)
        else:
            result = dataclasses.replace(first, took_ms=round(took_ms, 3))
            still = list(flagged)
        metrics = ctx.metrics
        metrics.topk_second_round_shards.inc(len(again))
        metrics.topk_second_rounds.labels(
            result="ok" if len(replaced) == len(flagged) else "incomplete"
        ).inc()
        return result, still

    # -- answers ----------------------------------------------------------------------

    def _on_answer(self, call: ShardCall, attempt: Attempt) -> None:
        future = attempt.future
        # A probe's copy answering after its shard's answer (still in call.copies until
        # the query ends): news of its replica, nothing more for the query.
        late = call.done and attempt.copy and attempt in call.copies
        if future.cancelled() or (call.done and not late):
            return  # abandoned by us; accounted for where it was abandoned
        call.returned(attempt)
        ctx = self._ctx
        replica = attempt.replica
        elapsed = self._timer.time() - attempt.started
        exc = future.exception()
        overloaded = False
        try:
            if exc is not None:
                raise exc
            status, body = future.result()
            if status != 200:
                overloaded = status in _OVERLOAD_STATUSES
                raise BadAnswer(f"HTTP {status}", "status")
            decoded = orjson.loads(body)
            # More hits than this shard was asked for is no answer to its request.
            hits = ranked_hits(decoded, call.shard, call.asked)
        except (SubrequestError, ValueError) as error:
            # ValueError: a BadAnswer or undecodable JSON (orjson.JSONDecodeError). A body
            # over its cap is a SubrequestError (AnswerTooLarge): refused unparsed.
            if overloaded:
                # A refusal, not a failure: the replica said at once that it is full.
                # No step towards ejection and no latency penalty (a busy minute must
                # cost capacity, never replicas); it gets no first request for a moment
                # while its shard has another.
                ctx.health.record_refusal(replica)
            else:
                replica.penalize(elapsed)
                ctx.health.record_failure(replica, "error", _describe(error))
                ctx.metrics.refused_answer(error)
            if late:
                return
            call.outcome = "failed"
            call.reason = "overload" if overloaded else "error"
            if call.attempts:
                return  # a hedge is still out; its answer decides
            if (
                not self._asking_again  # the first answer stands (see _second_round)
                and self._timer.time() < self.deadline
                and self._next_attempt(call, retry=True)
            ):
                ctx.metrics.retries.inc()
                return
            self._finish(call)
            return
        except Exception as error:  # a client bug must not hang the query
            log.error("sub-request to %s failed", replica.instance.id, exc_info=error)
            if late:
                return
            call.outcome = "failed"
            if not call.attempts:
                self._finish(call)
            return
        service, queue = feedback(decoded)
        replica.observe(elapsed, service, queue)
        load = load_report(decoded)
        if load is not None:
            replica.report_load(*load, ctx.clock())
        if service is not None and service > self.service and not (self._asking_again or late):
            # (A second round's whole time is the query's own: asked_again.)
            self.service = min(service, elapsed)
        window = replica.window
        if window is None:
            window = replica.window = LatencyWindow()
        window.add(elapsed)
        ctx.hedging.observe(elapsed)
        self._ok += 1
        ctx.health.record_success(replica, probe=attempt.probe)
        if attempt.hedge:
            ctx.metrics.hedges.labels(result="won").inc()
        now = self._timer.time()
        timings = self._timings
        if timings is not None:
            timings.append((replica, elapsed / attempt.share, False, attempt.demoted))
        if late:
            return
        if not self._asking_again:
            self._answered_at.append(now - self.started)
        if timings is not None:
            for loser in call.attempts:
                if not loser.copy:  # (a probe's copy is left to answer: see _drop_copies)
                    timings.append(
                        (loser.replica, (now - loser.started) / loser.share, True, False)
                    )
        # The slower of a hedged pair, if any: no answer after all the time it has had.
        call.answered(replica, hits, replica.instance.payload.docs, decoded.get("cut") is True, now)
        self._finish(call)

    def _finish(self, call: ShardCall) -> None:
        call.end()
        self._open_calls -= 1
        wait = self._wait
        if wait is not None and call.hits is not None and self._open_calls > 0:
            self._covered(wait, call)
        if self._open_calls == 0:
            _wake(self._waiter)
        elif self._deferred and 2 * (self._total - self._open_calls) >= self._total:
            # Half have answered: the query's median is now. A deferred shard is a
            # straggler if it is still out its usual spread (p95 - p50) later.
            deferred, self._deferred = self._deferred, []
            now = self._timer.time()
            for late in deferred:
                if late.done or not late.attempts:
                    continue
                spread = self._ctx.hedging.spread(late.replicas, late.attempts[0].replica)
                self._hedge_in(late, now, spread)

    # -- the coverage policy ----------------------------------------------------------

    def _coverage_wait(
        self, calls: Sequence[ShardCall], missing: Sequence[tuple[int, int]]
    ) -> CoverageWait | None:
        """The coverage policy's view of this query (None when the policy is off): the
        documents of every shard as the answer's coverage counts them."""
        if not self._coverage.active:
            return None
        return CoverageWait(
            self._coverage,
            started=self.started,
            deadline=self.deadline,
            docs_total=sum(call.shard_docs for call in calls) + sum(d for _, d in missing),
            shards_total=len(calls) + len(missing),
        )

    def _covered(self, wait: CoverageWait, call: ShardCall) -> None:
        """Count the shard's answer into the coverage; when it is the one that reaches
        the policy's minimum, end the query when the first rule says (at once if that
        time has come; by a timer otherwise, as no answer may come to wake it)."""
        now = self._timer.time()
        end = wait.answered(call.docs, call.shard_docs, now)
        if end is None:
            return
        if end.at <= now:
            self._end_early(end.rule)
        else:
            self._early_timer = self._timer.call_at(end.at, self._end_early, end.rule)

    def _end_early(self, rule: EndRule) -> None:
        """The coverage policy stops waiting, by ``rule``: wake :meth:`run` (unless the
        query already ended, at its deadline or with every shard in)."""
        if not self._waiter.done():
            self._ended_by = rule
            self._waiter.set_result(None)

    def _settle_coverage(self, now: float) -> None:
        """At the query's end: cancel the policy's timer and, if the policy ended the
        query, let the shards still out go.

        Their requests are cancelled and the shards reported ``timed_out``, as at the
        deadline, but their replicas are never charged a failure (no step towards
        ejection: they were not late against the deadline, the policy chose not to wait
        for them), only the time they had in their latency, as the loser of a hedge is,
        so that the picker learns they are slower than their peers."""
        if self._early_timer is not None:
            self._early_timer.cancel()
            self._early_timer = None
        rule, wait = self._ended_by, self._wait
        if rule is None or wait is None or wait.reached_at is None:
            return
        let_go = 0
        timings = self._timings
        for call in self._calls:
            if call.done:
                continue
            call.end()
            call.outcome = "timed_out"
            for attempt in call.drop():
                attempt.replica.penalize(now - attempt.started)
                if timings is not None:
                    timings.append(
                        (attempt.replica, (now - attempt.started) / attempt.share, True, False)
                    )
            let_go += 1
        if let_go:
            self.lingered = now - wait.reached_at
            self._ctx.metrics.ended_early.labels(rule=rule).inc()

    # -- the deadline -----------------------------------------------------------------

    def _blame(self, calls: Sequence[ShardCall], now: float) -> Blame:
        """What the requests of ``calls`` still out at the deadline are charged with (see
        :meth:`TimeoutBlame.judge <search_server.blame.TimeoutBlame.judge>`; a second
        round's among the query's shards)."""
        late = (a.replica for call in calls if not call.done for a in call.attempts)
        return self._ctx.blame.judge(
            late,
            started=self.started,
            deadline=self.deadline,
            now=now,
            open_calls=self._open_calls,
            total=self._total,
        )

    def _drop_copies(self, call: ShardCall, now: float) -> None:
        """The query is over: the probes' copies still out after their shard's answer
        are cancelled, each charged the time it had as a lower bound (in its latency and
        its relative slowness), never as a failure: the replica was demoted already,
        and the query did not wait for it."""
        timings = self._timings
        for attempt in call.drop_copies():
            attempt.replica.penalize(now - attempt.started)
            if timings is not None:
                timings.append(
                    (attempt.replica, (now - attempt.started) / attempt.share, True, False)
                )

    def _abandon(self, call: ShardCall, timed_out: bool, *, blame: Blame) -> None:
        """End a call still open at the deadline (``timed_out``) or at a cancellation.

        A timeout counts against its replicas as ``blame`` says (see :meth:`_blame`):
        their latency, and with it their run of failures towards ejection, or
        nothing (when the query woke up too late to tell their lateness from its own).
        A request sent before its replica was demoted as a latency outlier is charged
        its latency only: its lateness is what demoted the replica."""
        call.end()
        if timed_out:
            call.outcome = "timed_out"
        now = self._timer.time()
        for attempt in call.drop():
            if not timed_out:
                continue
            replica = attempt.replica
            if blame is not Blame.NONE:
                replica.penalize(now - attempt.started)
                if self._timings is not None:
                    self._timings.append(
                        (replica, (now - attempt.started) / attempt.share, True, False)
                    )
            if blame is Blame.FULL and not (replica.demoted_at is not None and not attempt.demoted):
                self._ctx.health.record_failure(
                    replica, "timeout", "no answer by the query deadline"
                )
            else:
                # (Nor when it was sent before its replica was demoted: an ejection
                # would keep the replica out for its cool-down after it recovered,
                # where demotion takes it back at a probe. A demoted replica's probes
                # and retries are charged in full: one that hangs is still ejected.)
                self._ctx.metrics.shard_requests.labels(result="timeout").inc()

    def _count(self, result: FanOutResult) -> None:
        metrics = self._ctx.metrics
        metrics.queries.labels(outcome="partial" if result.partial else "complete").inc()
        metrics.query_seconds.observe(result.took_ms / 1000)
        coverage = result.coverage
        if coverage is not None:
            metrics.coverage.observe(coverage.ratio)
            for reason in coverage.degraded:
                metrics.degraded.labels(reason=reason).inc()
        if result.partial:
            shards = result.shards
            log.debug(
                "partial answer: %d of %d shards failed, %d timed out, %d cut",
                shards["failed"],
                shards["total"],
                shards["timed_out"],
                shards["cut"],
            )


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
