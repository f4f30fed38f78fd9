"""The coverage policy: when a query may stop waiting for its slowest shards.

:class:`CoveragePolicy` is the setting (the search server's ``--min-coverage``,
``--soft-timeout`` and ``--adaptive-wait``, or a query's own parameters, read by
:func:`parse_coverage`); :class:`CoverageWait` is one query's decision, pure (times are
passed in), O(1) per answer; the query (:class:`~search_server.query.Query`) acts on it.
Not thread-safe (the query's loop).

Design: docs/design/search-server.md, "The coverage policy".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal, NamedTuple

from discovery.errors import BadRequestError
from discovery.http import parse_float

from .merging import FanOutResult

__all__ = [
    "EARLY_END_RULES",
    "MAX_ADAPTIVE_WAIT",
    "CoveragePolicy",
    "CoverageWait",
    "EarlyEnd",
    "EndRule",
    "late_shards",
    "parse_coverage",
]

#: A rule of the policy that may end a query before its deadline: ``soft_timeout`` (the
#: share of its budget has passed) or ``adaptive_wait`` (the stragglers had their wait).
EndRule = Literal["soft_timeout", "adaptive_wait"]
#: The rules, as an answer's ``coverage.degraded`` names them when one ended it (the
#: last of :data:`~search_server.merging.DEGRADED_REASONS`, in this order).
EARLY_END_RULES: Final[tuple[EndRule, ...]] = ("soft_timeout", "adaptive_wait")
#: The largest ``adaptive_wait``: a thousand times the time the coverage took is past
#: any deadline unless that time was under a thousandth of the budget, so a larger
#: factor would only mean "wait for the deadline", which the deadline already does.
MAX_ADAPTIVE_WAIT: Final = 1000.0
# A share given in percent (95 % of 20 shards of equal size is 19 of them) must not be
# missed by a rounding of the last bit: 19/20 and 95/100 are not the same double
# everywhere such shares are computed.
_EPSILON: Final = 1e-9


@dataclass(frozen=True, slots=True)
class CoveragePolicy:
    """How much of the corpus a query accepts, and how long it waits for the rest
    (docs/design/search-server.md, "The coverage policy"; after Vespa's dispatcher).

    ``min_coverage`` (0 < share <= 1) is the share of the corpus's documents (as an
    answer's :attr:`Coverage.ratio <search_server.merging.Coverage.ratio>` counts them)
    the query accepts; at 1, the default, the policy is off: the query waits for every
    shard until its deadline. Once that share has answered, the query stops waiting for
    the rest when either rule fires: ``soft_timeout`` (0..1 of the query's budget, 0:
    off) has passed since it started, or the rest have had ``adaptive_wait`` (0..
    :data:`MAX_ADAPTIVE_WAIT`, 0: off) times the time the coverage took. The deadline
    still holds. Raises ``ValueError`` naming the field of a value out of range.
    """

    min_coverage: float = 1.0
    soft_timeout: float = 0.0
    adaptive_wait: float = 1.0

    def __post_init__(self) -> None:
        if not 0 < self.min_coverage <= 1:
            raise ValueError(f"min_coverage must be > 0 and <= 1, got {self.min_coverage}")
        if not 0 <= self.soft_timeout <= 1:
            raise ValueError(f"soft_timeout must be in 0..1, got {self.soft_timeout}")
        if not 0 <= self.adaptive_wait <= MAX_ADAPTIVE_WAIT:
            raise ValueError(
                f"adaptive_wait must be in 0..{MAX_ADAPTIVE_WAIT:g}, got {self.adaptive_wait}"
            )

    @property
    def active(self) -> bool:
        """Whether the policy can end a query before its deadline: a coverage below the
        whole corpus accepted, and a rule to stop waiting by."""
        return self.min_coverage < 1 and (self.soft_timeout > 0 or self.adaptive_wait > 0)


class EarlyEnd(NamedTuple):
    """When a query should stop waiting for its shards still out (``at``, on its timer),
    and by which ``rule``."""

    at: float
    rule: EndRule


class CoverageWait:
    """One query's coverage as its shards answer, and when it may stop waiting.

    ``started`` and ``deadline`` are the query's (its timer's times); ``docs_total`` is
    what every shard of the cluster holds as the answer's coverage will count it (the
    shards asked, by what each counts for, and the missing ones), ``shards_total`` how
    many there are (coverage goes by shards when no shard holds a document).
    :meth:`answered` is O(1): a query of 500 shards never scans them per answer.
    """

    __slots__ = (
        "_docs",
        "_docs_total",
        "_shards",
        "_shards_total",
        "deadline",
        "end",
        "policy",
        "reached_at",
        "started",
    )

    def __init__(
        self,
        policy: CoveragePolicy,
        *,
        started: float,
        deadline: float,
        docs_total: int,
        shards_total: int,
    ) -> None:
        self.policy = policy
        self.started = started
        self.deadline = deadline
        self._docs = 0
        self._docs_total = docs_total
        self._shards = 0
        self._shards_total = shards_total
        #: When the coverage first reached ``min_coverage`` (None: not yet).
        self.reached_at: float | None = None
        #: When and why the query should stop waiting, once known; None while the
        #: coverage is short, or when no rule fires before the deadline.
        self.end: EarlyEnd | None = None

    @property
    def ratio(self) -> float:
        """The share of the corpus answered so far, as ``Coverage.ratio`` counts it."""
        if self._docs_total > 0:
            return self._docs / self._docs_total
        return self._shards / self._shards_total if self._shards_total else 1.0

    def answered(self, docs: int, shard_docs: int, now: float) -> EarlyEnd | None:
        """A shard answered at ``now`` from a replica holding ``docs`` (capped as the
        coverage caps it), where the total counted ``shard_docs`` for it.

        Returns when and why the query should stop waiting if this answer is the one
        that brings the coverage to ``min_coverage`` and a rule fires before the
        deadline; None otherwise (later answers change nothing: the end is set once).
        The total grows when a replica holds more than its shard was counted for, as
        the answer's coverage counts it; the ratio never falls by an answer.
        """
        self._docs += docs
        if docs > shard_docs:
            self._docs_total += docs - shard_docs
        self._shards += 1
        if self.reached_at is not None or self.ratio + _EPSILON < self.policy.min_coverage:
            return None
        self.reached_at = now
        self.end = self._end(now)
        return self.end

    def _end(self, reached: float) -> EarlyEnd | None:
        """The earlier rule's end for a coverage reached at ``reached`` (the soft
        timeout's on a tie), if before the deadline."""
        policy = self.policy
        ends: list[EarlyEnd] = []
        if policy.soft_timeout > 0:
            soft = self.started + policy.soft_timeout * (self.deadline - self.started)
            ends.append(EarlyEnd(max(reached, soft), "soft_timeout"))
        if policy.adaptive_wait > 0:
            waited = reached - self.started
            ends.append(EarlyEnd(reached + policy.adaptive_wait * waited, "adaptive_wait"))
        if not ends:
            return None
        first = min(ends, key=lambda end: end.at)  # the first listed on a tie
        return first if first.at < self.deadline else None


def late_shards(result: FanOutResult) -> int:
    """The shards of ``result`` that had no answer by its deadline: its ``timed_out``,
    unless the coverage policy ended it (then those shards were let go, not late)."""
    coverage = result.coverage
    if coverage is not None and any(rule in coverage.degraded for rule in EARLY_END_RULES):
        # A query ends once: by a rule of the policy, or at its deadline, never both.
        return 0
    return result.shards["timed_out"]


def parse_coverage(params: Mapping[str, str], default: CoveragePolicy) -> CoveragePolicy:
    """A query's own coverage policy: ``default`` with what ``params`` (the request's
    query) give of ``min_coverage`` (percent, 0 < x <= 100), ``soft_timeout`` (0..1)
    and ``adaptive_wait`` (0..1000). Checked in that order; the first problem is
    reported.

    Raises:
        BadRequestError: naming the parameter (``not_number``, ``out_of_range``).
    """
    raw_min, raw_soft, raw_wait = (
        params.get("min_coverage"),
        params.get("soft_timeout"),
        params.get("adaptive_wait"),
    )
    if raw_min is None and raw_soft is None and raw_wait is None:
        return default
    min_coverage = default.min_coverage
    if raw_min is not None:
        percent = parse_float("min_coverage", raw_min, 100.0, 0.0, 100.0)
        if not percent > 0:
            raise BadRequestError(
                "min_coverage",
                "out_of_range",
                f"'min_coverage' must be above 0 and at most 100 (percent), got {percent:g}",
            )
        min_coverage = percent / 100
    soft_timeout = parse_float("soft_timeout", raw_soft, default.soft_timeout, 0.0, 1.0)
    adaptive_wait = parse_float(
        "adaptive_wait", raw_wait, default.adaptive_wait, 0.0, MAX_ADAPTIVE_WAIT
    )
    return CoveragePolicy(min_coverage, soft_timeout, adaptive_wait)
