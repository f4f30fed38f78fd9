"""Prometheus metrics of the search server's fan-out (:class:`FanOutMetrics`).

On the :class:`~prometheus_client.CollectorRegistry` given, never the global one.

Design: docs/ARCHITECTURE.md, "Metrics".
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from .coverage import EARLY_END_RULES
from .httpclient import AnswerTooLarge
from .merging import BAD_ANSWER_REASONS, DEGRADED_REASONS, MAX_SCORE, BadAnswer

__all__ = [
    "DEMOTION_EVENTS",
    "HEDGE_RESULTS",
    "PANIC_SCOPES",
    "QUERY_OUTCOMES",
    "SHARD_RESULTS",
    "TOPK_SECOND_ROUND_RESULTS",
    "UNBLAMED_REASONS",
    "FanOutMetrics",
    "QueryOfDeathMetrics",
]

#: Label values of ``search_server_fanout_queries_total{outcome}``.
QUERY_OUTCOMES = ("complete", "partial", "overloaded")
#: Label values of ``search_server_fanout_shard_requests_total{result}``.
SHARD_RESULTS = ("ok", "error", "timeout", "overload")
#: Label values of ``search_server_fanout_hedges_total{result}``.
HEDGE_RESULTS = ("sent", "won", "over_budget", "own_lag", "shedding", "systemic", "in_step")
#: Label values of ``search_server_fanout_demotions_total{event}``.
DEMOTION_EVENTS = ("demoted", "probe", "restored")
#: Label values of ``search_server_fanout_panic_total{scope}``.
PANIC_SCOPES = ("shard", "cluster")
#: Label values of ``search_server_fanout_topk_second_rounds_total{result}``: every
#: shard re-asked answered in full (ok), or some did not (incomplete: failed, timed out,
#: refused, cut, or had no replica to ask).
TOPK_SECOND_ROUND_RESULTS = ("ok", "incomplete")
#: Label values of ``search_server_fanout_unblamed_timeouts_total{why}``.
UNBLAMED_REASONS = ("stall", "lag", "shedding", "systemic", "widespread")


class FanOutMetrics:
    """Counters, histogram and gauge of one :class:`~search_server.fanout.FanOut`.

    Raises ``ValueError`` (from prometheus_client) if ``registry`` already holds these
    names, i.e. when two fan-outs are given the same registry.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.queries = Counter(
            "search_server_fanout_queries",
            "Queries fanned out, by outcome (complete, partial, overloaded = refused).",
            ["outcome"],
            registry=registry,
        )
        self.query_seconds = Histogram(
            "search_server_fanout_query_seconds",
            "Wall time of an admitted query's fan-out and merge (bounded by its deadline).",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
            registry=registry,
        )
        self.coverage = Histogram(
            "search_server_fanout_coverage_ratio",
            "Share of the corpus's documents an answer searched: the documents of the "
            "shards that answered over those of every shard the cluster has.",
            buckets=(0.5, 0.8, 0.9, 0.95, 0.98, 0.99, 0.999, 1.0),
            registry=registry,
        )
        self.degraded = Counter(
            "search_server_fanout_degraded",
            "Answers that searched less than the whole corpus, by reason (no_replica, "
            "deadline, overload, error, cut, and soft_timeout or adaptive_wait when the "
            "coverage policy stopped waiting for the rest; an answer may count under "
            "several).",
            ["reason"],
            registry=registry,
        )
        self.ended_early = Counter(
            "search_server_fanout_queries_ended_early",
            "Queries the coverage policy ended before their deadline, by the rule that "
            "fired (soft_timeout, adaptive_wait): their coverage had reached the minimum, "
            "and the shards still out were let go (answered partial, counted timed_out; "
            "their replicas charged the time they had, never a step towards ejection).",
            ["rule"],
            registry=registry,
        )
        self.shard_requests = Counter(
            "search_server_fanout_shard_requests",
            "Requests to data servers, by result (ok, error, timeout, overload = the data "
            "server refused at once with 429, 503 or 504: not a failure, never a step "
            "towards ejection).",
            ["result"],
            registry=registry,
        )
        self.bad_answers = Counter(
            "search_server_fanout_bad_answers",
            "Data servers' answers refused as unusable (each also a failed request, "
            "result error, a step towards ejection), by why: status (an HTTP error other "
            "than an overload refusal), malformed (not the contract's JSON), "
            "too_many_hits (more hits than the k asked for), score (a score not a finite "
            f"number within +-{MAX_SCORE:g}), too_large (a body over what k hits may "
            "weigh, refused before any of it was parsed).",
            ["why"],
            registry=registry,
        )
        self.retries = Counter(
            "search_server_fanout_retries",
            "Requests sent to another replica of a shard after one failed.",
            registry=registry,
        )
        self.budget_refused = Counter(
            "search_server_fanout_retry_budget_refused",
            "Extra requests not sent because the retry budget (retries and hedges "
            "together: a share of first requests plus a steady rate) was spent, by kind "
            "(retry, hedge).",
            ["kind"],
            registry=registry,
        )
        self.hedges = Counter(
            "search_server_fanout_hedges",
            "Hedged sub-requests: sent (a shard's answer was later than its recent p95), "
            "won (the hedge answered first), over_budget (not sent: the budget was spent), "
            "own_lag (not sent: this search server's event loop lagged while the request "
            "was out, so the lateness may be its own), shedding (not sent: this search "
            "server refused a query for its in-flight limit within the last second), "
            "systemic (not sent: more of the query's shards were still out than outliers "
            "make, more than two and a tenth: everyone is slow), in_step (put off: the "
            "shard was not yet out three times the median time of the query's shards "
            "that answered, the query's own cost rather than a straggler; offered again then).",
            ["result"],
            registry=registry,
        )
        self.last_resort = Counter(
            "search_server_fanout_last_resort",
            "Hedges and retries sent to a draining replica, its shard's every routable "
            "replica tried (it still answers during its grace).",
            registry=registry,
        )
        self.demotions = Counter(
            "search_server_fanout_demotions",
            "Latency outlier demotion, by event: demoted (a data server's relative "
            "slowness, its response times over the same queries' other shards', was found "
            "above --demote-ratio times its shard's typical replica's: no request while "
            "its peers serve; no failure, no ejection), probe (a copy of a query's first "
            "request sent to a demoted data server beside the request to a peer, one per "
            "--demote-probe-interval, whose answer says what it has become) or restored "
            "(it is no longer an outlier and gets requests again).",
            ["event"],
            registry=registry,
        )
        self.ejections = Counter(
            "search_server_fanout_ejections",
            "Times a data server was ejected for consecutive failures or timeouts.",
            registry=registry,
        )
        self.panic = Counter(
            "search_server_fanout_panic",
            "Routing decisions made in panic, by scope: shard (a query's shard had fewer "
            "than the panic threshold of its replicas un-ejected, and was routed to all of "
            "them) or cluster (an ejection refused because the cap of ejected servers was "
            "reached).",
            ["scope"],
            registry=registry,
        )
        self.unblamed = Counter(
            "search_server_fanout_unblamed_timeouts",
            "Shards still out at a query's deadline whose replicas were not charged with "
            "the timeout, by why: stall (woken late past the deadline), lag (this search "
            "server's loop lagged during the query), shedding (it refused queries for its "
            "in-flight limit meanwhile), systemic (more of the query's shards were late "
            "than outliers make) or widespread (more data servers than outliers make "
            "timed out within the last second, over all queries: counted in the "
            "replica's latency, not towards its ejection).",
            ["why"],
            registry=registry,
        )
        self.routing_updates = Counter(
            "search_server_fanout_routing_updates",
            "Moves of the routing table: change (along one live-list change, O(shards "
            "touched)) or full (built for a whole list: the first, a list not followed, "
            "the ZooKeeper fallback's view).",
            ["kind"],
            registry=registry,
        )
        self.unroutable = Counter(
            "search_server_fanout_unroutable",
            "Listed data servers left out of the routing table: not_allowed (an IP address "
            "outside --allowed-networks), shard_out_of_range (a shard outside --shards) or "
            "error (its replica could not be made).",
            ["why"],
            registry=registry,
        )
        self.shards_forgotten = Counter(
            "search_server_fanout_shards_forgotten",
            "Shards no longer expected in answers: above --shards and without a replica "
            "for --forget-missing-shard-after seconds.",
            registry=registry,
        )
        self.slow_start = Gauge(
            "search_server_fanout_slow_start_replicas",
            "Replicas whose weight is ramping up (slow start: new to this search server "
            "within --slow-start-window).",
            registry=registry,
        )
        self.admission_limit = Gauge(
            "search_server_admission_limit",
            "Queries this search server admits at once now (adaptive: it follows the "
            "latency; beyond it a query is refused at once with 503).",
            registry=registry,
        )
        self.shed_share = Counter(
            "search_server_admission_share_refused",
            "Queries refused (503) because the same query (by its normalised terms) already "
            "held its share of the in-flight limit while other queries were asking; also "
            "counted as outcome overloaded.",
            registry=registry,
        )
        self.group_queries = Counter(
            "search_server_fanout_group_queries",
            "Queries whose first requests went to a replica group, by group (at most 64 "
            "groups have a series of their own; the queries of any further group count "
            'under group="(other)").',
            ["group"],
            registry=registry,
        )
        self.group_fills = Counter(
            "search_server_fanout_group_fills",
            "First requests of a shard sent outside its query's replica group: the group "
            "had no usable replica of the shard (none, ejected, overloaded or demoted as "
            "a latency outlier).",
            registry=registry,
        )
        self.group_coverage = Gauge(
            "search_server_fanout_group_coverage_ratio",
            "Share of the corpus's documents a replica group covers: held by shards with "
            "a routable, not ejected replica in the group (at most 64 groups; a group "
            "with no routable replica left has no series).",
            ["group"],
            registry=registry,
        )
        self.group_in_rotation = Gauge(
            "search_server_fanout_group_in_rotation",
            "1 while a replica group gets queries (its coverage is at least "
            "--min-group-coverage, or no group's is and it covers the most), else 0 (at "
            "most 64 groups).",
            ["group"],
            registry=registry,
        )
        self.topk_maybe_inexact = Counter(
            "search_server_fanout_topk_maybe_inexact",
            "Queries whose merged top k may be inexact: a shard asked for fewer than k "
            "hits (--topk-probability) returned all it was asked for and every one of "
            "them made the merged top k, so its next hit might have belonged there too, "
            "and no second round asked it again for k (off, no time left, the query "
            "ended by its deadline or the coverage policy, or the second request did not "
            "answer). An upper bound of the real misses.",
            registry=registry,
        )
        self.topk_second_rounds = Counter(
            "search_server_fanout_topk_second_rounds",
            "Queries whose flagged shards (see topk_maybe_inexact) were asked again for k "
            "hits (--topk-second-round), by result: ok (every one answered: the merged top "
            "k is exact) or incomplete (some kept their first answer). Over queries_total, "
            "the measured rate of the top-k promise.",
            ["result"],
            registry=registry,
        )
        self.topk_second_round_shards = Counter(
            "search_server_fanout_topk_second_round_shards",
            "Shards asked again for k hits in second rounds (each one request, neither "
            "retried nor hedged).",
            registry=registry,
        )
        self.topk_hits_asked = Counter(
            "search_server_fanout_topk_hits_asked",
            "Hits asked of the shards, over the queries' first requests (each shard's k', "
            "at most k): against search_server_fanout_topk_hits_k_total, what asking "
            "fewer saved.",
            registry=registry,
        )
        self.topk_hits_k = Counter(
            "search_server_fanout_topk_hits_k",
            "Hits that asking every shard for k would have asked (k times the shards "
            "asked, per query).",
            registry=registry,
        )
        self.in_flight = Gauge(
            "search_server_fanout_in_flight",
            "Queries currently in the fan-out (admission control refuses beyond the limit).",
            registry=registry,
        )
        # Export every label value from the start, so that rates and alerts see zeros
        # rather than missing series before the first partial or overloaded query.
        for outcome in QUERY_OUTCOMES:
            self.queries.labels(outcome=outcome)
        for result in SHARD_RESULTS:
            self.shard_requests.labels(result=result)
        for result in HEDGE_RESULTS:
            self.hedges.labels(result=result)
        for kind in ("change", "full"):
            self.routing_updates.labels(kind=kind)
        for kind in ("retry", "hedge"):
            self.budget_refused.labels(kind=kind)
        for event in DEMOTION_EVENTS:
            self.demotions.labels(event=event)
        for scope in PANIC_SCOPES:
            self.panic.labels(scope=scope)
        for why in UNBLAMED_REASONS:
            self.unblamed.labels(why=why)
        for reason in DEGRADED_REASONS:
            self.degraded.labels(reason=reason)
        for rule in EARLY_END_RULES:
            self.ended_early.labels(rule=rule)
        for why in BAD_ANSWER_REASONS:
            self.bad_answers.labels(why=why)
        for result in TOPK_SECOND_ROUND_RESULTS:
            self.topk_second_rounds.labels(result=result)

    def refused_answer(self, error: Exception) -> None:
        """Count a failed sub-request in ``bad_answers`` if it was an answer refused (a
        :class:`BadAnswer`, undecodable JSON, a body over its cap); a request that got
        no answer at all (refused, reset, not HTTP) is not one."""
        if isinstance(error, BadAnswer):
            self.bad_answers.labels(why=error.why).inc()
        elif isinstance(error, AnswerTooLarge):
            self.bad_answers.labels(why="too_large").inc()
        elif isinstance(error, ValueError):  # orjson.JSONDecodeError
            self.bad_answers.labels(why="malformed").inc()


class QueryOfDeathMetrics:
    """The query-of-death guard's figures (:mod:`search_server.querydeath`)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.refused = Counter(
            "search_server_query_of_death_refused",
            "Queries answered at once with 422, without a fan-out: their normalised text "
            "failed, timed out or was cut on many shards in recent fan-outs.",
            registry=registry,
        )
        self.quarantines = Counter(
            "search_server_query_of_death_quarantines",
            "Times a query was quarantined (first offences and repeats on probation).",
            registry=registry,
        )
        self.quarantined = Gauge(
            "search_server_query_of_death_quarantined",
            "Queries refused right now.",
            registry=registry,
        )
