"""The invariants of one hostile fault, judged from every answer and every snapshot.

Each broken invariant is reported once per subject and fault. Pure bookkeeping, no I/O: the
callers read ``/proc`` and HTTP.

Development: docs/development.md, "The chaos run" (invariants 6 to 9).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .memory import Memory
from .observer import Snapshot

__all__ = [
    "CRASH",
    "FRESH",
    "HITS",
    "LISTS",
    "MEMORY",
    "MIB",
    "OFFLINE",
    "RSS_BOUND",
    "SHARDS",
    "SKIPPED",
    "STORM",
    "STORM_MIN_COMPLETE",
    "Answer",
    "HostileFigures",
    "HostileWatch",
    "missing_shards",
    "nearest_rank",
]

MIB = 1024 * 1024

#: How far a search server's resident memory may rise during a hostile fault. The
#: sub-request client reads at most 8 MiB of one answer (``--max-answer-bytes``), and
#: a replica still in its warm-up gets one request at a time; 48 MiB leaves room for
#: that body, its copies while it is parsed and refused, and what the allocator keeps
#: after freeing them. Without the cap one search server grew by 518 MB within 60
#: queries to a replica that sent an endless body (issue 21).
RSS_BOUND = 48 * MIB
#: The share of the normal load that must stay complete while a query storm runs.
STORM_MIN_COMPLETE = 0.9

SHARDS = "a bad participant costs at most its own shards"
MEMORY = "search server memory within its bound"
OFFLINE = "no healthy data server goes offline"
LISTS = "hostile entries never reach the lists"
STORM = "normal queries at least 90 % complete under a query storm"
SKIPPED = "hostile registrations skipped and counted"
CRASH = "no server process crashes"
HITS = "a hostile answer's hits never reach a result"
FRESH = "a new client is answered through an idle-connection flood"


@dataclass(frozen=True)
class Answer:
    """One answer of the normal load during the fault.

    ``missing`` is ``failed + timed_out + cut`` of a search result, None when the
    answer was not one (``status`` other than 200, or no HTTP answer at all).
    """

    at: float
    member: str
    outcome: str  # complete | partial | failed
    missing: int | None
    elapsed_ms: float
    status: int | None = None
    detail: str = ""
    #: The ids of the answer's hits (strings only).
    hit_ids: tuple[str, ...] = ()


def missing_shards(shards: Mapping[str, Any]) -> int:
    """Shards a search result lacks: those that failed, timed out or were cut, and
    those with no replica to ask (``missing``)."""
    total = 0
    for key in ("failed", "timed_out", "cut", "missing"):
        value = shards.get(key, 0)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            total += value
    return total


@dataclass
class HostileFigures:
    """What one hostile fault did, for the report's hostile table."""

    kind: str
    complete: int = 0
    partial: int = 0
    failed: int = 0
    p99_ms: float = 0.0
    max_ms: float = 0.0
    #: The most shards one answer missed.
    max_missing: int = 0
    #: The largest rise of one search server's resident memory over its value when the
    #: fault began, in bytes (None: no search server's memory could be read).
    rss_peak_delta: int | None = None
    #: Healthy data servers seen missing from a view during the fault.
    servers_lost: list[str] = field(default_factory=list)
    #: Kind-specific figures (the storm's own outcomes, the sub-requests a hostile
    #: peer answered, the skip counter's rise...).
    notes: dict[str, Any] = field(default_factory=dict)
    #: Every answer's latency, for percentiles over several faults of a kind.
    latencies_ms: list[float] = field(default_factory=list, repr=False)


def nearest_rank(values: list[float], q: float) -> float:
    """The nearest-rank percentile ``q`` of ``values`` (0 for none)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


class HostileWatch:
    """The verdicts of one hostile fault (see the module docstring).

    ``healthy`` are the data servers that were registered and serving when the fault
    began; ``allowed_missing`` the shards one answer may miss (None: a storm, judged
    by :meth:`completion`); ``lists_equal_model``: every view must equal the model
    all along; ``redis_garbage``: the fault writes malformed Redis contents, so the
    observer does not report them as a broken published list.
    """

    def __init__(
        self,
        kind: str,
        *,
        healthy: frozenset[str],
        allowed_missing: int | None,
        lists_equal_model: bool = False,
        redis_garbage: bool = False,
        rss_bound: int = RSS_BOUND,
        forbidden_hits: str | None = None,
    ) -> None:
        self.kind = kind
        self.healthy = healthy
        self.allowed_missing = allowed_missing
        self.lists_equal_model = lists_equal_model
        self.redis_garbage = redis_garbage
        self.rss_bound = rss_bound
        self.forbidden_hits = forbidden_hits
        self.answers: list[Answer] = []
        self.notes: dict[str, Any] = {}
        self._reported: set[tuple[str, str]] = set()
        self._lost: set[str] = set()
        # Per search server: (pid, resident bytes when the fault began, peak since).
        self._memory: dict[str, tuple[int, int, int]] = {}

    # -- (a) answers -----------------------------------------------------------------

    def answer(self, answer: Answer) -> list[tuple[str, str]]:
        """Record one answer of the normal load; the violations it shows."""
        self.answers.append(answer)
        prefix = self.forbidden_hits
        if prefix is not None and any(hit.startswith(prefix) for hit in answer.hit_ids):
            return [
                (
                    HITS,
                    f"{self.kind}: a query to {answer.member} returned the hostile replica's "
                    f"hits ({', '.join(h for h in answer.hit_ids if h.startswith(prefix))[:200]})",
                )
            ]
        if self.allowed_missing is None:
            if answer.status == 422:
                return [
                    (
                        SHARDS,
                        f"{self.kind}: a normal query to {answer.member} was refused as a "
                        f"query of death: {answer.detail}",
                    )
                ]
            return []
        if answer.missing is None:
            status = "no answer" if answer.status is None else f"status {answer.status}"
            return [
                (
                    SHARDS,
                    f"{self.kind}: a query to {answer.member} got {status} instead of a "
                    f"search result ({answer.elapsed_ms:.0f} ms): {answer.detail}",
                )
            ]
        if answer.missing > self.allowed_missing:
            return [
                (
                    SHARDS,
                    f"{self.kind}: a query to {answer.member} missed {answer.missing} shards "
                    f"({answer.detail}); the bad participant serves {self.allowed_missing}",
                )
            ]
        return []

    def completion(self, member: str | None, since: float, until: float) -> tuple[int, int]:
        """(complete, all) answers of the normal load sent in ``[since, until]``, through
        ``member`` (None: through any search server)."""
        chosen = [
            a
            for a in self.answers
            if since <= a.at <= until and (member is None or a.member == member)
        ]
        return sum(1 for a in chosen if a.outcome == "complete"), len(chosen)

    def shortfall(self, member: str | None, since: float, until: float) -> dict[str, int]:
        """What the answers of :meth:`completion` that were not complete were: ``partial``,
        ``status 503`` (or another status), ``no answer``; counted, for the report."""
        counts: dict[str, int] = {}
        for a in self.answers:
            if not since <= a.at <= until or (member is not None and a.member != member):
                continue
            if a.outcome == "complete":
                continue
            if a.outcome == "partial":
                key = "partial"
            else:
                key = "no answer" if a.status is None else f"status {a.status}"
            counts[key] = counts.get(key, 0) + 1
        return dict(sorted(counts.items()))

    # -- (c) and the lists: snapshots ----------------------------------------------

    def snapshot(self, snapshot: Snapshot) -> list[tuple[str, str]]:
        """Judge one snapshot; the violations not reported before in this fault."""
        found: list[tuple[str, str]] = []
        views: list[tuple[str, frozenset[str] | None]] = [
            ("zookeeper", snapshot.zk),
            ("redis", snapshot.redis),
            *sorted(snapshot.search.items()),
        ]
        for where, view in views:
            if view is None:
                continue  # unreadable (Redis restarting, our session reconnecting)
            for server in sorted(self.healthy - view):
                self._lost.add(server)
                if self._first(OFFLINE, f"{server}@{where}"):
                    found.append(
                        (
                            OFFLINE,
                            f"{self.kind}: healthy data server {server} missing from "
                            f"{where} at t={snapshot.at:.1f}s",
                        )
                    )
            if self.lists_equal_model and view != snapshot.model:
                extra = sorted(view - snapshot.model)
                if extra and self._first(LISTS, f"{where}:{','.join(extra)}"):
                    found.append(
                        (
                            LISTS,
                            f"{self.kind}: {where} lists {extra}, which the model does not "
                            f"hold, at t={snapshot.at:.1f}s",
                        )
                    )
        return found

    # -- (b) memory ----------------------------------------------------------------

    def memory_before(self, member: str, pid: int, memory: Memory) -> None:
        """The search server's memory when the fault begins (after its peak was reset)."""
        self._memory[member] = (pid, memory.rss, memory.rss)

    def memory(self, member: str, pid: int, memory: Memory, *, peak_reset: bool) -> None:
        """A reading during or at the end of the fault. ``peak_reset``: the process's
        ``VmHWM`` was reset when the fault began, so it is the fault's peak."""
        known = self._memory.get(member)
        if known is None or known[0] != pid:
            return  # started during the fault: nothing to compare with
        pid_, before, peak = known
        peak = max(peak, memory.rss, memory.peak if peak_reset else 0)
        self._memory[member] = (pid_, before, peak)

    def memory_verdicts(self) -> list[tuple[str, str]]:
        found = []
        for member, (_pid, before, peak) in sorted(self._memory.items()):
            if peak - before > self.rss_bound:
                found.append(
                    (
                        MEMORY,
                        f"{self.kind}: {member} grew from {before / MIB:.1f} MiB to "
                        f"{peak / MIB:.1f} MiB (bound: +{self.rss_bound / MIB:.0f} MiB)",
                    )
                )
        return found

    # -- the figures ---------------------------------------------------------------

    def figures(self) -> HostileFigures:
        elapsed = [a.elapsed_ms for a in self.answers]
        deltas = [peak - before for _pid, before, peak in self._memory.values()]
        return HostileFigures(
            kind=self.kind,
            complete=sum(1 for a in self.answers if a.outcome == "complete"),
            partial=sum(1 for a in self.answers if a.outcome == "partial"),
            failed=sum(1 for a in self.answers if a.outcome == "failed"),
            p99_ms=round(nearest_rank(elapsed, 0.99), 1),
            max_ms=round(max(elapsed, default=0.0), 1),
            max_missing=max((a.missing or 0 for a in self.answers), default=0),
            rss_peak_delta=max(deltas) if deltas else None,
            servers_lost=sorted(self._lost),
            notes=dict(self.notes),
            latencies_ms=elapsed,
        )

    def _first(self, invariant: str, subject: str) -> bool:
        key = (invariant, subject)
        if key in self._reported:
            return False
        self._reported.add(key)
        return True
