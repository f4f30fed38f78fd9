"""Turn the shards' answers to one query into its ranked, bounded result.

:func:`ranked_hits` validates an answer before anything of it is used; :func:`merge`
copies only the merged top ``k``. Pure functions: no I/O, no clock, no metrics.

Design: docs/design/search-server.md, "Answers are flat, bounded records".
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

__all__ = [
    "ANSWER_ENVELOPE_BYTES",
    "BAD_ANSWER_REASONS",
    "DEGRADED_REASONS",
    "HIT_BYTES",
    "MAX_HIT_FIELDS",
    "MAX_HIT_ID",
    "MAX_HIT_TEXT",
    "MAX_REPORTED_RATE",
    "MAX_REPORTED_UTILIZATION",
    "MAX_SCORE",
    "BadAnswer",
    "BadAnswerReason",
    "Coverage",
    "FailureReason",
    "FanOutResult",
    "Ranked",
    "ShardAnswer",
    "ShardOutcome",
    "answer_bytes",
    "feedback",
    "load_report",
    "merge",
    "ranked_hits",
]

#: Most fields one hit may carry (``id``, ``score``, ``title``... are a handful).
MAX_HIT_FIELDS = 32
#: Longest hit ``id`` and longest text field of a hit, in characters.
MAX_HIT_ID = 1024
MAX_HIT_TEXT = 8192
_MAX_FIELD_NAME = 64
#: Largest magnitude of a hit's ``score``: a score is a finite number in
#: ``[-MAX_SCORE, MAX_SCORE]``. Relevance scores are modest numbers: our data server's
#: BM25 stays under 2e4 for any query it accepts (``data_server.handlers.MAX_SCORE``), and
#: Lucene-style scores with boosts live in the same range. 1e9 leaves five orders of
#: magnitude above that, yet refuses the 1e308 that topped every list (and that a
#: client summing scores or reading them as float32 would turn into infinity).
MAX_SCORE = 1e9

#: Largest ``utilization`` a data server's load report may carry (searches in progress on
#: average: our data server's stays under its ``--max-concurrent-searches`` and probes),
#: and largest ``qps`` or ``eps`` (a second's answers or errors): a report beyond either
#: is not believed, and left out.
MAX_REPORTED_UTILIZATION = 1000.0
MAX_REPORTED_RATE = 1e7

# The bytes of JSON around one field (its name's quotes, the colon, a comma) and the
# most characters a number takes as data servers write one ("-1.2345678901234567e-308").
_FIELD_PUNCTUATION = 4
_NUMBER_CHARS = 24
#: Bytes one hit may take in an answer's body, on average over its hits: its id and one
#: text field at their limits, every other field a longest name and a number (or a
#: string as long), quoted, with JSON's punctuation; characters counted one byte each.
#: A hit with more text (several long fields, or text that is not ASCII) draws on the
#: room its shorter neighbours leave.
HIT_BYTES = (
    2
    + MAX_HIT_ID
    + MAX_HIT_TEXT
    + MAX_HIT_FIELDS * (_MAX_FIELD_NAME + _NUMBER_CHARS + _FIELD_PUNCTUATION + 2)
)
#: Bytes of an answer's body besides its hits' allowance: ``{"hits":[...]}``,
#: ``shard``, ``took_ms``, ``queue``, ``cut``, the load report (``utilization``, ``qps``,
#: ``eps``), whitespace, and room for a few more fields.
ANSWER_ENVELOPE_BYTES = 16 * 1024
# What an error message or log line shows of what a data server sent.
_EXCERPT = 80

#: How a shard's part of a query ended.
ShardOutcome = Literal["ok", "failed", "timed_out"]

#: Why an answer searched less than the whole corpus, as :attr:`Coverage.degraded`
#: names it: a shard with no replica to send to (``no_replica``: none listed, or every
#: one ejected), one that answered nothing by the deadline (``deadline``), one whose
#: data servers refused for overload (``overload``, HTTP 429 or 503) or failed
#: otherwise (``error``), and one whose data server stopped its search at the
#: request's budget and sent what it had (``cut``); then, after these faults, the
#: coverage policy's choices: shards still out when it stopped waiting for them, its
#: coverage reached, because the share of the budget had passed (``soft_timeout``) or
#: the stragglers had had their wait (``adaptive_wait``; see
#: :mod:`search_server.coverage`).
DEGRADED_REASONS = (
    "no_replica",
    "deadline",
    "overload",
    "error",
    "cut",
    "soft_timeout",
    "adaptive_wait",
)
#: Why one shard's part of a query failed (the reasons of :data:`DEGRADED_REASONS`
#: that a failed shard can have).
FailureReason = Literal["no_replica", "overload", "error"]

#: A hit as the merge ranks it: (-score, id, shard, the data server's hit object).
Ranked = tuple[float, str, int, dict[str, Any]]

#: Why a data server's answer was refused (``search_server_fanout_bad_answers_total``'s
#: ``why``): an HTTP error other than an overload refusal (``status``), not the
#: contract's JSON (``malformed``; a document answered twice is one), more than ``k``
#: hits (``too_many_hits``), a score out of ``[-MAX_SCORE, MAX_SCORE]`` (``score``), a
#: body over :func:`answer_bytes` (``too_large``, refused by the client before any of
#: it is parsed).
BAD_ANSWER_REASONS = ("status", "malformed", "too_many_hits", "score", "too_large")
BadAnswerReason = Literal["status", "malformed", "too_many_hits", "score", "too_large"]


class BadAnswer(ValueError):
    """A data server answered, but not with a usable search result; ``why`` says how
    (one of :data:`BAD_ANSWER_REASONS`)."""

    def __init__(self, message: str, why: BadAnswerReason = "malformed") -> None:
        super().__init__(message)
        self.why: BadAnswerReason = why


def answer_bytes(k: int) -> int:
    """The most bytes a data server's answer of ``k`` hits may take: the envelope's
    allowance and ``k`` hits' (:data:`HIT_BYTES`). A larger body is a bad answer."""
    return ANSWER_ENVELOPE_BYTES + k * HIT_BYTES


@dataclass(frozen=True, slots=True)
class Coverage:
    """How much of the corpus one answer searched (Vespa's ``coverage``).

    ``docs`` is the documents held by the shards that answered (by the replica that
    answered, as its registration says), ``docs_total`` those of every shard the
    cluster has: the shards queried, by their replicas' registrations, and the
    ``missing`` ones (no replica to send to), by the last count this search server saw
    of each, or an average shard's if it never saw one. ``shards`` answered of
    ``shards_total``. ``degraded`` lists the reasons (of :data:`DEGRADED_REASONS`, in
    that order) why the answer is not complete; empty for a complete one.
    """

    docs: int
    docs_total: int
    shards: int
    shards_total: int
    missing: tuple[int, ...] = ()
    degraded: tuple[str, ...] = ()

    @property
    def ratio(self) -> float:
        """``docs / docs_total`` (by shards when no shard holds a document)."""
        if self.docs_total > 0:
            return self.docs / self.docs_total
        return self.shards / self.shards_total if self.shards_total else 1.0

    @property
    def full(self) -> bool:
        """Every shard answered in full."""
        return not self.degraded

    def to_dict(self) -> dict[str, Any]:
        return {
            "percent": round(100 * self.ratio, 2),
            "docs": self.docs,
            "docs_total": self.docs_total,
            "shards": self.shards,
            "shards_total": self.shards_total,
            "full": self.full,
            "missing": list(self.missing),
            "degraded": list(self.degraded),
        }


@dataclass(frozen=True, slots=True)
class FanOutResult:
    """The merged answer of one query, in the shape of the search server's ``/search``.

    ``shards`` has the integer keys ``total``, ``ok``, ``failed``, ``timed_out``,
    ``cut`` and ``missing``: ``total`` counts every shard the cluster has, ``missing``
    those with no replica to send to (never asked; so ``ok + failed + timed_out +
    missing == total``), ``ok`` the shards that answered, ``cut`` those of them whose
    data server stopped its search at the request's budget and sent the best hits it
    had found (so ``cut <= ok``). ``partial`` is true when any shard is missing,
    failed, timed out or was cut, i.e. ``hits`` may miss documents of those shards;
    ``coverage`` says how much was searched and why not all. ``took_ms`` is the
    fan-out's wall time.
    """

    hits: list[dict[str, Any]]
    shards: dict[str, int]
    partial: bool
    took_ms: float
    coverage: Coverage | None = None

    def to_dict(self) -> dict[str, Any]:
        """The brief's response body, as fresh JSON-ready objects."""
        body: dict[str, Any] = {
            "hits": [dict(hit) for hit in self.hits],
            "shards": dict(self.shards),
            "partial": self.partial,
            "took_ms": self.took_ms,
        }
        if self.coverage is not None:
            body["coverage"] = self.coverage.to_dict()
        return body


class ShardAnswer(Protocol):
    """What :func:`merge` reads of one shard's part of a query, once it has ended.

    ``hits`` is the shard's answer as :func:`ranked_hits` returned it, ``None`` if it
    gave none; ``outcome`` tells a timeout from a failure then, and ``reason`` why it
    failed; ``cut`` says the data server stopped its search at the request's budget.
    ``docs`` is what the replica that answered holds (0 if none did), ``shard_docs``
    what the shard holds as far as the search server knows.
    """

    @property
    def hits(self) -> list[Ranked] | None: ...

    @property
    def outcome(self) -> ShardOutcome: ...

    @property
    def reason(self) -> FailureReason: ...

    @property
    def cut(self) -> bool: ...

    @property
    def docs(self) -> int: ...

    @property
    def shard_docs(self) -> int: ...


def _excerpt(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _EXCERPT else text[: _EXCERPT - 3] + "..."


def _flat_field(key: object, value: object) -> str | None:
    """Why a hit's field is not a flat, bounded JSON scalar, or None if it is."""
    if type(key) is not str or len(key) > _MAX_FIELD_NAME:
        return f"a hit has a field name that is not a short string: {_excerpt(key)}"
    kind = type(value)
    if kind is str:
        if len(value) > MAX_HIT_TEXT:  # type: ignore[arg-type]
            return f"a hit's {_excerpt(key)} is longer than {MAX_HIT_TEXT} characters"
        return None
    if kind is float:
        return None if math.isfinite(value) else f"a hit's {_excerpt(key)} is not finite"  # type: ignore[arg-type]
    if kind is int or kind is bool or value is None:
        return None
    return f"a hit's {_excerpt(key)} is not a flat JSON value: {_excerpt(value)}"


def ranked_hits(body: Any, shard: int, k: int) -> list[Ranked]:
    """Validate a data server's answer of at most ``k`` hits; its hits, ready for the merge.

    A hit is a flat record: a string ``id`` (at most :data:`MAX_HIT_ID` characters), a
    number ``score`` in ``[-MAX_SCORE, MAX_SCORE]`` and at most :data:`MAX_HIT_FIELDS`
    fields in all, each a string (at most :data:`MAX_HIT_TEXT` characters), a finite
    number, a boolean or null. So no answer can make the search server's own response
    fail to encode (a nested hit a thousand levels deep did) or grow past what ``k``
    hits should weigh. More than ``k`` hits is no answer to the request, and the sign
    of a data server that ignores what it was asked: refused whole, not cut to ``k``.
    A shard answers each document once: an ``id`` twice in one answer is refused
    (``malformed``; two hits of one id and one score from one shard made :func:`merge`
    compare the hit objects themselves, and fail the whole query). The hit objects are
    the decoded ones, not copied: only the merged top ``k`` are.

    Raises:
        BadAnswer: not the data server's ``{"hits":[{"id","score",…}],"shard":n}``
            with at most ``k`` hits of distinct ids; the message quotes at most a short
            excerpt of what was sent, ``why`` says which rule it broke.
    """
    if type(body) is not dict:
        raise BadAnswer(f"answer is not a JSON object: {_excerpt(body)}")
    raw_hits = body.get("hits")
    if type(raw_hits) is not list:
        raise BadAnswer(f"answer has no 'hits' list: {_excerpt(raw_hits)}")
    answered_shard = body.get("shard", shard)
    if answered_shard != shard:
        # A stale registration whose port now belongs to a server of another shard:
        # merging its hits would return another shard's documents twice.
        raise BadAnswer(
            f"answered for shard {_excerpt(answered_shard)}, registered for shard {shard}"
        )
    if len(raw_hits) > k:
        raise BadAnswer(f"answered {len(raw_hits)} hits, more than k={k}", "too_many_hits")
    ranked: list[Ranked] = []
    # The ids seen: a set lookup per hit, about what one field's check costs.
    seen: set[str] = set()
    isfinite = math.isfinite
    for hit in raw_hits:
        if type(hit) is not dict:
            raise BadAnswer(f"a hit is not a JSON object: {_excerpt(hit)}")
        hit_id, score = hit.get("id"), hit.get("score")
        if type(hit_id) is not str or len(hit_id) > MAX_HIT_ID:
            raise BadAnswer(
                f"a hit's 'id' is not a string of at most {MAX_HIT_ID}: {_excerpt(hit_id)}"
            )
        if hit_id in seen:
            raise BadAnswer(f"hit {_excerpt(hit_id)} is in the answer twice")
        seen.add(hit_id)
        if type(score) is not float and type(score) is not int:
            raise BadAnswer(f"hit {_excerpt(hit_id)} has no number 'score': {_excerpt(score)}")
        if not -MAX_SCORE <= score <= MAX_SCORE:  # NaN too: it compares false
            raise BadAnswer(
                f"hit {_excerpt(hit_id)} has a 'score' out of [-{MAX_SCORE:g}, {MAX_SCORE:g}]: "
                f"{_excerpt(score)}",
                "score",
            )
        if len(hit) > MAX_HIT_FIELDS:
            raise BadAnswer(
                f"hit {_excerpt(hit_id)} has {len(hit)} fields, more than {MAX_HIT_FIELDS}"
            )
        for key, value in hit.items():
            # Inline for the common fields (this runs for every hit of every answer);
            # _flat_field says what is wrong with one that is not fine.
            kind = type(value)
            if (
                (kind is str and len(value) <= MAX_HIT_TEXT)
                or (kind is float and isfinite(value))
                or kind is int
                or kind is bool
                or value is None
            ) and len(key) <= _MAX_FIELD_NAME:
                continue
            raise BadAnswer(_flat_field(key, value) or "a hit has an unusable field")
        ranked.append((-score, hit_id, shard, hit))
    return ranked


def feedback(body: dict[str, Any]) -> tuple[float | None, float | None]:
    """The data server's reported search time (seconds) and requests in flight, if sane.

    Either is ``None`` when missing, of another type or out of range: the answer's hits
    may still be used, only the picker's feedback is left out.
    """
    took, queue = body.get("took_ms"), body.get("queue")
    service = None
    if (type(took) is float or type(took) is int) and 0 <= took < 3.6e6:
        service = took / 1000
    reported = float(queue) if type(queue) is int and 0 <= queue < 1_000_000 else None
    return service, reported


def load_report(body: dict[str, Any]) -> tuple[float, float, float] | None:
    """The load the data server reported with its answer, ``(utilization, qps, eps)``,
    if all three are sane: numbers, finite, ``utilization`` in
    ``[0, MAX_REPORTED_UTILIZATION]``, ``qps`` and ``eps`` in ``[0, MAX_REPORTED_RATE]``.

    ``None`` otherwise, when any is missing (a data server that does not report its load)
    or bad: the answer's hits may still be used, only the report is left out (one field
    of three alone would be no report to weight a replica by).
    """
    utilization, qps, eps = body.get("utilization"), body.get("qps"), body.get("eps")
    # NaN compares false and infinity is out of range: both fail the range checks.
    if (
        (type(utilization) is float or type(utilization) is int)
        and 0 <= utilization <= MAX_REPORTED_UTILIZATION
        and (type(qps) is float or type(qps) is int)
        and 0 <= qps <= MAX_REPORTED_RATE
        and (type(eps) is float or type(eps) is int)
        and 0 <= eps <= MAX_REPORTED_RATE
    ):
        return float(utilization), float(qps), float(eps)
    return None


def merge(
    shards: Sequence[ShardAnswer],
    k: int,
    took_ms: float,
    missing: Sequence[tuple[int, int]] = (),
    *,
    timed_out_reason: Literal["deadline", "soft_timeout", "adaptive_wait"] = "deadline",
) -> FanOutResult:
    """The top ``k`` hits of the shards that answered, each marked with its shard, the
    count of shards by outcome, and the answer's coverage.

    ``shards`` are the shards queried; ``missing`` the cluster's shards that were not
    (no replica to send to), as ``(shard, docs)``. A shard without hits counts as
    ``timed_out`` or ``failed`` by its ``outcome``; one that answered ``cut`` counts as
    ``ok`` and in ``cut``. ``timed_out_reason`` is why the query stopped waiting for
    its ``timed_out`` shards, as ``degraded`` names it: its ``deadline``, or the rule
    of the coverage policy that ended it first. Hits of equal score and id (of two
    shards: :func:`ranked_hits` refuses an id twice in one answer) rank by shard, so the
    hit objects are never compared. Never raises for answers :func:`ranked_hits` returned.
    """
    answered = 0
    timed_out = 0
    cut = 0
    docs = 0
    docs_total = 0
    reasons: set[str] = set()
    candidates: list[Ranked] = []
    for answer in shards:
        hits = answer.hits
        if hits is None:
            docs_total += answer.shard_docs
            if answer.outcome == "timed_out":
                timed_out += 1
                reasons.add(timed_out_reason)
            else:
                reasons.add(answer.reason)
            continue
        answered += 1
        if answer.cut:
            cut += 1
            reasons.add("cut")
        searched = answer.docs
        docs += searched
        docs_total += max(searched, answer.shard_docs)
        candidates.extend(hits)
    failed = len(shards) - answered - timed_out
    if missing:
        reasons.add("no_replica")
        docs_total += sum(shard_docs for _, shard_docs in missing)
    # Each shard's hits are already its top k: the top k overall are among them.
    # Ties of score and id are broken by shard, so the hit objects are never compared.
    top = heapq.nsmallest(k, candidates)
    total = len(shards) + len(missing)
    return FanOutResult(
        hits=[{**hit, "shard": shard} for _, _, shard, hit in top],
        shards={
            "total": total,
            "ok": answered,
            "failed": failed,
            "timed_out": timed_out,
            "cut": cut,
            "missing": len(missing),
        },
        partial=failed + timed_out + cut + len(missing) > 0,
        took_ms=round(took_ms, 3),
        coverage=Coverage(
            docs=docs,
            docs_total=docs_total,
            shards=answered,
            shards_total=total,
            missing=tuple(sorted(shard for shard, _ in missing)),
            degraded=tuple(reason for reason in DEGRADED_REASONS if reason in reasons),
        ),
    )
