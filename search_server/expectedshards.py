"""The shards a fan-out expects in every answer, what each counts for in its coverage,
when one that has had no replica for long is no longer expected, and how many of those
missing an answer lists (:func:`list_missing_capped`).

Pure bookkeeping on the fan-out's clock (no I/O); not thread-safe, as the routing it
serves. Never raises for what the live list holds.

Design: docs/design/search-server.md, "Coverage in every answer".
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Collection, Sequence
from typing import Final

from .merging import FanOutResult

__all__ = [
    "DOCS_CAP_MULTIPLE",
    "FORGET_MISSING_SHARD_AFTER",
    "MISSING_LISTED",
    "ExpectedShards",
    "list_missing_capped",
]

#: The most one shard's documents count for in an answer's coverage: this many times
#: the median shard's (the lower median of every expected shard's last count).
#:
#: A shard's documents are what its replicas' registrations say (the most any says),
#: so one replica claiming 10**12 documents made its shard nearly the whole corpus:
#: every answer without that shard read 0 % covered, and every answer with it 100 %
#: whatever else failed. The median is what one claim cannot move far: one shard's
#: count, however large, moves it by at most one place in the order. Shards of a
#: hash-partitioned corpus hold within a few percent of each other; time- or
#: tenant-partitioned ones, or a cluster part-way through a rebalance, a few times the
#: median at most. Past four times, a count is far likelier a wrong claim than data,
#: and counting it as four medians bounds what it can do: of ``S`` shards, one weighs
#: at most ``4 / (S + 3)`` of the total. A genuinely larger shard is under-counted
#: (its absence costs less coverage than it should); ``partial``, ``missing`` and
#: ``degraded`` stay exact either way. When more than half the shards say 0
#: documents, the cap is 0 and coverage goes by shards, as it does when no shard
#: holds a document.
DOCS_CAP_MULTIPLE: Final = 4

#: The default of ``FanOutConfig.forget_missing_shard_after`` (``--forget-missing-
#: shard-after``): seconds a shard not named by ``--shards`` stays expected after its
#: last replica left. Ten minutes outlasts a rolling restart of a shard's replicas and
#: most maintenance of its last one, during which its absence is reported; a shard
#: gone for longer is meant to be gone, or must be named by ``--shards`` to stay
#: reported.
FORGET_MISSING_SHARD_AFTER: Final = 600.0

#: The most missing shards an answer's ``coverage.missing`` lists (the lowest numbers);
#: ``shards.missing`` counts them all. Every answer carried every missing shard's
#: number: with ``--shards 20000`` and half of them gone, ten thousand in each answer.
#: The dashboard lists as many (``missing_shards``, with ``missing_count``).
MISSING_LISTED: Final = 100

#: What :meth:`ExpectedShards.observe` reads of a routing table: ``(shard, replicas)``.
Rows = Sequence[tuple[int, object]]


class ExpectedShards:
    """The shards expected in every answer: the ``named`` ones (``--shards``: 0 to
    ``named - 1``) and every shard routed to since, each with the last count of
    documents seen of it (None: never seen).

    A shard above the named ones that has had no replica for ``forget_after`` seconds
    (0: never) is no longer expected: a node registered for a moment under a shard
    number nobody uses made every later answer partial until the search server
    restarted. The time runs from when it was first found without a replica (a change
    of the table, else the first query after), on the fan-out's clock; a shard back in
    the table before then is expected as before. ``on_forget(shard, absent_for)``
    hears of each shard forgotten.

    Raises:
        ValueError: ``named`` or ``forget_after`` is negative.
    """

    def __init__(
        self,
        named: int = 0,
        *,
        forget_after: float = FORGET_MISSING_SHARD_AFTER,
        on_forget: Callable[[int, float], None] | None = None,
    ) -> None:
        if named < 0:
            raise ValueError(f"named must be >= 0, got {named}")
        if not forget_after >= 0:
            raise ValueError(f"forget_after must be >= 0 seconds, got {forget_after!r}")
        self._named = named
        self._forget_after = forget_after
        self._on_forget = on_forget
        # Each expected shard's last count of documents (None: never seen).
        self._docs: dict[int, int | None] = dict.fromkeys(range(named))
        # The expected shards not in the table when last observed: since when.
        self._absent: dict[int, float] = {}
        # The lower median of the known counts, made again only after a count changed.
        self._median: int | None = None
        self._median_stale = True

    @property
    def shards(self) -> Collection[int]:
        """Every shard expected now."""
        return self._docs.keys()

    def routed(self, shard: int, docs: int) -> None:
        """``shard`` is routed to, its replicas holding ``docs`` at most: expected."""
        if self._docs.get(shard, -1) != docs:
            self._docs[shard] = docs
            self._median_stale = True

    def observe(self, table: Rows, now: float) -> None:
        """Note which expected shards ``table`` lacks, and since when, and forget those
        absent for ``forget_after``. O(1) while the table holds every expected shard
        and none other (judged by count), else O(shards)."""
        absent = self._absent
        docs = self._docs
        if not absent and len(docs) == len(table):
            return  # the usual case: every expected shard has a replica
        present = {shard for shard, _ in table}
        for shard in [s for s in absent if s in present]:
            del absent[shard]
        for shard in docs:
            if shard not in present and shard not in absent:
                absent[shard] = now
        if self._forget_after > 0:
            self._forget(now)

    def missing(self, table: Rows, now: float) -> list[tuple[int, int]]:
        """The expected shards ``table`` lacks (no replica to send to), with the
        documents each counts for: its last count seen, or the median shard's if never
        seen, at most :meth:`docs_cap`. O(1) while every expected shard is in it."""
        self.observe(table, now)
        if not self._absent:
            return []
        median = self._median_docs()
        cap = self.docs_cap()
        counts = self._docs
        found: list[tuple[int, int]] = []
        for shard in self._absent:
            docs = counts[shard]
            if docs is None:
                docs = median if median is not None else 0
            found.append((shard, docs if cap is None else min(docs, cap)))
        return found

    def docs_cap(self) -> int | None:
        """The most one shard's documents count for in coverage (see
        :data:`DOCS_CAP_MULTIPLE`); None while no shard's count is known."""
        median = self._median_docs()
        return None if median is None else DOCS_CAP_MULTIPLE * median

    # -- internals ----------------------------------------------------------------------

    def _median_docs(self) -> int | None:
        if self._median_stale:
            known = [docs for docs in self._docs.values() if docs is not None]
            self._median = statistics.median_low(known) if known else None
            self._median_stale = False
        return self._median

    def _forget(self, now: float) -> None:
        """Stop expecting the shards above the named ones absent for ``forget_after``."""
        named, after = self._named, self._forget_after
        due = [
            (shard, now - since)
            for shard, since in self._absent.items()
            if shard >= named and now - since >= after
        ]
        for shard, absent_for in due:
            del self._absent[shard]
            del self._docs[shard]
            self._median_stale = True
            if self._on_forget is not None:
                self._on_forget(shard, absent_for)


def list_missing_capped(result: FanOutResult) -> FanOutResult:
    """``result`` with at most :data:`MISSING_LISTED` shards in ``coverage.missing``
    (the lowest; it is sorted); its counts, ``shards.missing`` among them, unchanged.
    ``result`` itself when it lists no more."""
    coverage = result.coverage
    if coverage is None or len(coverage.missing) <= MISSING_LISTED:
        return result
    listed = dataclasses.replace(coverage, missing=coverage.missing[:MISSING_LISTED])
    return dataclasses.replace(result, coverage=listed)
