"""Benchmark asking each shard for fewer hits than ``k`` (``search_server/topk.py``)
against asking every shard for ``k``, in the same run, on a real corpus and its index.

``--shards`` (50) shards of ``--docs`` documents each are generated and indexed as the
data servers do it (``generate_documents(docs, shard=s)``, one ``InvertedIndex`` each),
and queried with the project's query generator (``sample_queries``).

* **cost** (for ``k`` = 10, 100, 1000 over 50 and 500 shards): ``k'`` from
  :func:`~search_server.topk.hits_asked` (``--probability``, equal shards), then per
  query, for ``k'`` and for ``k``: the bytes of every shard's answer body, built as
  ``data_server/handlers.py`` builds it (orjson of the hits' id, score, title, and
  shard, took_ms, queue, cut); the search server's CPU to decode (orjson), validate
  (``ranked_hits``) and merge (``merge``) them all; the data servers' CPU to search the
  real index for the top ``k'`` or ``k`` and encode the answer, summed over the shards.
  500 shards are the 50 real ones each standing for ten (shard ``j`` answers from index
  ``j % 50``, as its own shard ``j``): the search is timed once per real shard and
  counted ten times, the bodies are encoded, decoded, validated and merged for all 500.
* **exactness** (the 50 real shards, ``--queries`` queries): each shard's top 1000 is
  searched once (the index ranks by score, then id: its top ``k'`` is the prefix of
  its top 1000); the merged top ``k`` of the shards' top ``k'`` (``merge``) is compared
  with the merged top ``k`` of their top ``k`` (exact), for each ``k`` and for
  probabilities 0.5, 0.9, 0.99 and ``--probability``. Reported: the share of queries
  exact against the promise, the misses, and what the query's ``maybe_inexact`` rule
  (:func:`~search_server.topk.inexact_shards`) said of them: every miss must be
  flagged; a flag without a miss is a false alarm. The spread of the exact top ``k``
  over the shards is reported beside it (its variance against the binomial's: the
  promise assumes documents spread at random).
* **the second round** (the same queries, as ``Query._second_round`` does it): the
  flagged shards' top ``k`` replaces their top ``k'`` and the answers are merged again.
  Reported per ``k`` and probability: the share of queries that needed one, the share
  exact after it (it must be all of them), and what the two rounds cost against every
  shard asked for ``k``: hits and bytes of the answers (every query; each answer's
  size from its hits' encoded sizes, checked against the bodies where those are
  built), and, on every ``--cpu-every``-th query, the search server's CPU to decode,
  validate, merge and check the flags (both rounds) and the data servers' CPU to search
  the real index for ``k'`` (all shards) and ``k`` (the flagged ones) and encode.

Prints the tables and writes JSON to ``bench/results/topk.json`` (``--quick``:
``topk-quick.json``).

Usage: ``.venv/bin/python bench/bench_topk.py [--quick] [--shards 50] [--docs 2000]
[--queries 3000] [--cost-queries 100] [--cpu-every 10] [--probability 0.9999]``
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from common import quick_defaults, write_results

from data_server.corpus import generate_documents, sample_queries
from data_server.index import Hit, InvertedIndex
from search_server.merging import FailureReason, Ranked, ShardOutcome, merge, ranked_hits
from search_server.topk import hits_asked, inexact_shards

RESULTS = Path(__file__).resolve().parent / "results"
KS = (10, 100, 1000)
COST_SHARDS = (50, 500)
WEAK_PROBABILITIES = (0.5, 0.9, 0.99)
# The exactness queries are another set than the cost queries' (variant 0).
EXACTNESS_VARIANT = 17


@dataclass(frozen=True, slots=True)
class Answer:
    """One shard's answer as :func:`merge` reads it (its ``ShardAnswer``)."""

    hits: list[Ranked] | None
    docs: int
    shard_docs: int
    outcome: ShardOutcome = "ok"
    reason: FailureReason = "error"
    cut: bool = False


def build(shards: int, docs: int) -> tuple[list[InvertedIndex], float]:
    """The shards' indexes, as the data servers build them, and the seconds it took."""
    started = time.perf_counter()
    indexes = [InvertedIndex(generate_documents(docs, shard=s)) for s in range(shards)]
    return indexes, time.perf_counter() - started


def body(hits: Iterable[Hit], shard: int) -> bytes:
    """A data server's answer, as ``data_server/handlers.py`` encodes it."""
    return orjson.dumps(
        {
            "hits": [_hit_object(hit) for hit in hits],
            "shard": shard,
            "took_ms": 0.123,
            "queue": 0,
            "cut": False,
        }
    )


def search_server_cpu(bodies: Sequence[bytes], asked: int, k: int, docs: int) -> float:
    """Seconds to decode, validate and merge one query's answers, as a query does."""
    started = time.perf_counter()
    answers = []
    for shard, raw in enumerate(bodies):
        decoded = orjson.loads(raw)
        answers.append(Answer(ranked_hits(decoded, shard, asked), docs, docs))
    merge(answers, k, 0.0)
    return time.perf_counter() - started


@dataclass
class CostRow:
    """Per query totals over the run, for ``k'`` (``asked``) and ``k``."""

    shards: int
    k: int
    asked: int
    queries: int = 0
    hits: dict[str, int] = field(default_factory=lambda: {"asked": 0, "k": 0})
    bytes: dict[str, int] = field(default_factory=lambda: {"asked": 0, "k": 0})
    search_cpu: dict[str, float] = field(default_factory=lambda: {"asked": 0.0, "k": 0.0})
    data_cpu: dict[str, float] = field(default_factory=lambda: {"asked": 0.0, "k": 0.0})


def measure_cost(
    indexes: list[InvertedIndex], queries: list[str], docs: int, probability: float
) -> list[dict[str, Any]]:
    real = len(indexes)
    rows = {
        (n, k): CostRow(n, k, hits_asked(k, [docs] * n, probability)[0])
        for n in COST_SHARDS
        for k in KS
    }
    for query in queries:
        for k in KS:
            wanted = {k} | {rows[(n, k)].asked for n in COST_SHARDS}
            # The data servers' side: each real shard searched (and timed) once per
            # number of hits; the answer encoded per shard of the cluster.
            searched: dict[int, list[tuple[list[Hit], float]]] = {}
            for hits_wanted in sorted(wanted):
                per_shard = []
                for index in indexes:
                    started = time.perf_counter()
                    hits = index.search(query, hits_wanted)
                    per_shard.append((hits, time.perf_counter() - started))
                searched[hits_wanted] = per_shard
            for n in COST_SHARDS:
                row = rows[(n, k)]
                row.queries += 1
                for side, hits_wanted in (("asked", row.asked), ("k", k)):
                    per_shard = searched[hits_wanted]
                    bodies = []
                    encode = 0.0
                    for shard in range(n):
                        hits, search_seconds = per_shard[shard % real]
                        started = time.perf_counter()
                        bodies.append(body(hits, shard))
                        encode += time.perf_counter() - started + search_seconds
                        row.hits[side] += len(hits)
                    row.bytes[side] += sum(len(b) for b in bodies)
                    row.data_cpu[side] += encode
                    row.search_cpu[side] += search_server_cpu(bodies, hits_wanted, k, docs)
    return [_cost_summary(row) for row in rows.values()]


def _cost_summary(row: CostRow) -> dict[str, Any]:
    q = row.queries

    def ratio(figures: dict[str, float] | dict[str, int]) -> float:
        return round(figures["asked"] / figures["k"], 3) if figures["k"] else 1.0

    return {
        "shards": row.shards,
        "k": row.k,
        "asked": row.asked,
        "queries": q,
        "hits_per_answer": {
            side: round(row.hits[side] / (q * row.shards), 1) for side in ("asked", "k")
        },
        "bytes_per_query": {side: round(row.bytes[side] / q) for side in ("asked", "k")},
        "bytes_ratio": ratio(row.bytes),
        "search_server_ms_per_query": {
            side: round(1000 * row.search_cpu[side] / q, 3) for side in ("asked", "k")
        },
        "search_server_cpu_ratio": ratio(row.search_cpu),
        "data_servers_ms_per_query": {
            side: round(1000 * row.data_cpu[side] / q, 3) for side in ("asked", "k")
        },
        "data_servers_cpu_ratio": ratio(row.data_cpu),
    }


#: The rounds of the second round's cost: the first (every shard asked for ``k'``), the
#: second (the flagged shards asked again for ``k``), and every shard asked for ``k``.
ROUNDS = ("first", "second", "k")


@dataclass
class ExactRow:
    k: int
    probability: float
    asked: int
    queries: int = 0
    exact: int = 0
    flagged: int = 0
    flagged_misses: int = 0
    # Queries where some shard matched more documents than it was asked for: the only
    # ones where asking fewer could change anything.
    reduced: int = 0
    # Misses by the query's number of terms (1 to 3).
    misses_by_terms: dict[int, int] = field(default_factory=dict)
    # The second round: shards asked again (over the flagged queries), queries exact
    # after it, and the cost per round (ROUNDS) of every query (hits, bytes) and of the
    # queries timed (seconds; cpu_queries of them).
    second_shards: int = 0
    exact_after: int = 0
    hits: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ROUNDS, 0))
    bytes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ROUNDS, 0))
    cpu_queries: int = 0
    search_cpu: dict[str, float] = field(default_factory=lambda: dict.fromkeys(ROUNDS, 0.0))
    data_cpu: dict[str, float] = field(default_factory=lambda: dict.fromkeys(ROUNDS, 0.0))


class QueryAnswers:
    """One query's answers from the real shards, at any depth: each shard's top
    ``deepest`` searched once (the index ranks by score, then id, so its top ``n`` is
    the head of it), ranked for the merge; the size of each shard's answer body of ``n``
    hits (its envelope and its hits' encoded sizes, summed ahead); and, on demand, an
    answer as a data server serves it (the index searched for ``n`` and the body
    encoded, timed: :meth:`served`)."""

    def __init__(self, indexes: Sequence[InvertedIndex], query: str, deepest: int) -> None:
        self.indexes = indexes
        self.query = query
        self.tops = [index.search(query, deepest) for index in indexes]
        self.ranked: list[list[Ranked]] = [
            [(-hit.score, hit.id, shard, {"id": hit.id, "score": hit.score}) for hit in top]
            for shard, top in enumerate(self.tops)
        ]
        self._envelope = [len(body((), shard)) for shard in range(len(indexes))]
        self._sizes: list[list[int]] = []
        for top in self.tops:
            sums = [0]
            for hit in top:
                sums.append(sums[-1] + len(orjson.dumps(_hit_object(hit))))
            self._sizes.append(sums)
        self._served: dict[tuple[int, int], tuple[bytes, float]] = {}

    def size(self, shard: int, n: int) -> int:
        """The bytes of the shard's answer of its top ``n``: the envelope, the hits and
        the commas between them."""
        count = min(n, len(self.tops[shard]))
        return self._envelope[shard] + self._sizes[shard][count] + max(0, count - 1)

    def served(self, shard: int, n: int) -> tuple[bytes, float]:
        """The shard's answer for ``n`` hits as a data server serves it, and the seconds
        its search and encoding took (once per shard and ``n``)."""
        key = (shard, n)
        if key not in self._served:
            started = time.perf_counter()
            hits = self.indexes[shard].search(self.query, n)
            raw = body(hits, shard)
            self._served[key] = (raw, time.perf_counter() - started)
            assert len(raw) == self.size(shard, n), "answer sizes drifted from the bodies"
        return self._served[key]


def _hit_object(hit: Hit) -> dict[str, Any]:
    return {"id": hit.id, "score": hit.score, "title": hit.title}


def timed_rounds(
    answers: QueryAnswers, asked: int, k: int, again: Sequence[int], docs: int
) -> tuple[float, float]:
    """The search server's seconds for a query's first round (decode, validate and
    merge every shard's top ``asked``, check the flags) and its second (the same for
    the shards ``again`` asked for ``k``, merged again with the others' first answers,
    flags checked again; 0 without one). The bodies are served before the clock starts:
    the data servers' time is not the search server's."""
    shards = len(answers.indexes)
    first_bodies = [answers.served(shard, asked)[0] for shard in range(shards)]
    second_bodies = [(shard, answers.served(shard, k)[0]) for shard in again]
    started = time.perf_counter()
    merged: list[Answer] = []
    for shard, raw in enumerate(first_bodies):
        merged.append(Answer(ranked_hits(orjson.loads(raw), shard, asked), docs, docs))
    hits = merge(merged, k, 0.0).hits
    if asked < k:  # as a query does: no flags when every shard was asked for k
        inexact_shards(((s, len(a.hits or ()), asked) for s, a in enumerate(merged)), k, hits)
    first = time.perf_counter() - started
    if not again:
        return first, 0.0
    started = time.perf_counter()
    for shard, raw in second_bodies:
        merged[shard] = Answer(ranked_hits(orjson.loads(raw), shard, k), docs, docs)
    hits = merge(merged, k, 0.0).hits
    redone = set(again)
    inexact_shards(
        ((s, len(a.hits or ()), k if s in redone else asked) for s, a in enumerate(merged)),
        k,
        hits,
    )
    return first, time.perf_counter() - started


def measure_exactness(
    indexes: list[InvertedIndex],
    queries: list[str],
    docs: int,
    probabilities: Sequence[float],
    cpu_every: int,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    shards = len(indexes)
    rows = {
        (k, p): ExactRow(k, p, hits_asked(k, [docs] * shards, p)[0])
        for k in KS
        for p in probabilities
    }
    # The exact top k's spread over the shards: per k, each full query's per-shard
    # counts' variance, against Binomial(k, 1/shards)'s.
    spread: dict[int, list[float]] = {k: [] for k in KS}
    deepest = max(KS)
    for number, query in enumerate(queries):
        answers = QueryAnswers(indexes, query, deepest)
        tops = answers.ranked
        timed = number % cpu_every == 0
        for k in KS:
            exact = merge([Answer(top[:k], docs, docs) for top in tops], k, 0.0).hits
            exact_ids = [(hit["id"], hit["shard"]) for hit in exact]
            if len(exact) == k:
                counts = [0] * shards
                for hit in exact:
                    counts[hit["shard"]] += 1
                binomial = k * (1 / shards) * (1 - 1 / shards)
                spread[k].append(statistics.pvariance(counts) / binomial)
            every_k_hits = sum(min(k, len(top)) for top in tops)
            every_k_cpu = every_k_data = 0.0
            every_k_bytes = sum(answers.size(shard, k) for shard in range(shards))
            if timed:
                every_k_cpu = timed_rounds(answers, k, k, (), docs)[0]
                every_k_data = sum(answers.served(shard, k)[1] for shard in range(shards))
            for p in probabilities:
                row = rows[(k, p)]
                asked = row.asked
                row.queries += 1
                row.reduced += any(len(top) > asked for top in tops)
                merged = merge([Answer(top[:asked], docs, docs) for top in tops], k, 0.0).hits
                ok = [(hit["id"], hit["shard"]) for hit in merged] == exact_ids
                again = inexact_shards(
                    ((shard, len(top[:asked]), asked) for shard, top in enumerate(tops)),
                    k,
                    merged,
                )
                flagged = bool(again)
                row.exact += ok
                if not ok:
                    terms = len(query.split())
                    row.misses_by_terms[terms] = row.misses_by_terms.get(terms, 0) + 1
                row.flagged += flagged
                row.flagged_misses += flagged and not ok
                # The second round: the flagged shards' top k in place of their top k'.
                exact_after = ok
                if again:
                    redone = set(again)
                    second = [
                        Answer(top[: k if shard in redone else asked], docs, docs)
                        for shard, top in enumerate(tops)
                    ]
                    remerged = merge(second, k, 0.0).hits
                    exact_after = [(hit["id"], hit["shard"]) for hit in remerged] == exact_ids
                    row.second_shards += len(again)
                row.exact_after += exact_after
                row.hits["first"] += sum(min(asked, len(top)) for top in tops)
                row.hits["second"] += sum(min(k, len(tops[shard])) for shard in again)
                row.hits["k"] += every_k_hits
                row.bytes["first"] += sum(answers.size(shard, asked) for shard in range(shards))
                row.bytes["second"] += sum(answers.size(shard, k) for shard in again)
                row.bytes["k"] += every_k_bytes
                if timed:
                    row.cpu_queries += 1
                    first_cpu, second_cpu = timed_rounds(answers, asked, k, again, docs)
                    row.search_cpu["first"] += first_cpu
                    row.search_cpu["second"] += second_cpu
                    row.search_cpu["k"] += every_k_cpu
                    row.data_cpu["first"] += sum(
                        answers.served(shard, asked)[1] for shard in range(shards)
                    )
                    row.data_cpu["second"] += sum(answers.served(shard, k)[1] for shard in again)
                    row.data_cpu["k"] += every_k_data
    results = [_exact_summary(row) for row in rows.values()]
    by_terms = dict(sorted(Counter(len(q.split()) for q in queries).items()))
    dispersion = [
        {
            "k": k,
            "full_queries": len(values),
            "variance_over_binomial_mean": round(statistics.fmean(values), 2) if values else None,
            "variance_over_binomial_p50": round(statistics.median(values), 2) if values else None,
            "queries_by_terms": by_terms,
        }
        for k, values in spread.items()
    ]
    return results, dispersion


def _exact_summary(row: ExactRow) -> dict[str, Any]:
    misses = row.queries - row.exact
    q, timed = row.queries, row.cpu_queries

    def both(figures: dict[str, int] | dict[str, float]) -> float:
        return figures["first"] + figures["second"]

    def ratio(figures: dict[str, int] | dict[str, float]) -> float:
        return round(both(figures) / figures["k"], 3) if figures["k"] else 1.0

    def per_query(figures: dict[str, float], count: int, scale: float = 1.0) -> dict[str, float]:
        return {side: round(scale * figures[side] / count, 3) if count else 0.0 for side in ROUNDS}

    return {
        "k": row.k,
        "probability": row.probability,
        "asked": row.asked,
        "queries": q,
        "queries_reduced": row.reduced,
        "exact": row.exact,
        "exact_share": round(row.exact / q, 5),
        "promise_held": row.exact / q >= row.probability,
        "misses": misses,
        "misses_flagged": row.flagged_misses,
        "misses_unflagged": misses - row.flagged_misses,
        "flagged": row.flagged,
        "false_alarms": row.flagged - row.flagged_misses,
        "misses_by_terms": dict(sorted(row.misses_by_terms.items())),
        "second_round": {
            "queries": row.flagged,
            "share": round(row.flagged / q, 5),
            "shards_per_round": round(row.second_shards / row.flagged, 2) if row.flagged else 0,
            "exact_after": row.exact_after,
            "exact_after_share": round(row.exact_after / q, 5),
            "hits_per_query": per_query({s: float(v) for s, v in row.hits.items()}, q),
            "hits_ratio": ratio(row.hits),
            "bytes_per_query": {side: round(row.bytes[side] / q) for side in ROUNDS},
            "bytes_ratio": ratio(row.bytes),
            "cpu_queries": timed,
            "search_server_ms_per_query": per_query(row.search_cpu, timed, 1000),
            "search_server_cpu_ratio": ratio(row.search_cpu),
            "data_servers_ms_per_query": per_query(row.data_cpu, timed, 1000),
            "data_servers_cpu_ratio": ratio(row.data_cpu),
        },
    }


def print_cost(rows: list[dict[str, Any]]) -> None:
    print("\ncost per query: each shard asked for k' against k (ratio: with k' / with k)")
    print(
        f"{'shards':>6} {'k':>5} {'k_':>4} {'hits/answer':>13} {'bytes/query':>21} "
        f"{'ratio':>6} {'search srv ms':>15} {'ratio':>6} {'data srvs ms':>15} {'ratio':>6}"
    )
    for r in rows:
        hits, size = r["hits_per_answer"], r["bytes_per_query"]
        ss, ds = r["search_server_ms_per_query"], r["data_servers_ms_per_query"]
        print(
            f"{r['shards']:>6} {r['k']:>5} {r['asked']:>4} "
            f"{hits['asked']:>6}/{hits['k']:<6} {size['asked']:>10}/{size['k']:<10} "
            f"{r['bytes_ratio']:>6} {ss['asked']:>7}/{ss['k']:<7} "
            f"{r['search_server_cpu_ratio']:>6} "
            f"{ds['asked']:>7}/{ds['k']:<7} {r['data_servers_cpu_ratio']:>6}"
        )


def print_exactness(rows: list[dict[str, Any]], dispersion: list[dict[str, Any]]) -> None:
    print("\nexactness: merged top k of the shards' top k' against the exact top k")
    print(
        f"{'k':>5} {'p':>7} {'k_':>4} {'queries':>7} {'reduced':>7} {'exact':>8} "
        f"{'held':>5} {'misses':>6} {'flagged':>7} {'unflagged':>9} {'false alarms':>12}"
    )
    for r in rows:
        print(
            f"{r['k']:>5} {r['probability']:>7} {r['asked']:>4} {r['queries']:>7} "
            f"{r['queries_reduced']:>7} {r['exact_share']:>8.4f} "
            f"{'yes' if r['promise_held'] else 'NO':>5} "
            f"{r['misses']:>6} {r['misses_flagged']:>7} {r['misses_unflagged']:>9} "
            f"{r['false_alarms']:>12}  by terms {r['misses_by_terms']}"
        )
    print(
        "\nsecond round: the flagged shards asked again for k and merged again; cost of "
        "both rounds against every shard asked for k (first + second / k)"
    )
    print(
        f"{'k':>5} {'p':>7} {'k_':>4} {'rounds':>7} {'shards':>6} {'exact after':>11} "
        f"{'bytes/query':>26} {'ratio':>6} {'search srv ms':>20} {'ratio':>6} "
        f"{'data srvs ms':>22} {'ratio':>6}"
    )
    for r in rows:
        second = r["second_round"]
        size = second["bytes_per_query"]
        ss, ds = second["search_server_ms_per_query"], second["data_servers_ms_per_query"]
        print(
            f"{r['k']:>5} {r['probability']:>7} {r['asked']:>4} {second['share']:>7.2%} "
            f"{second['shards_per_round']:>6} {second['exact_after_share']:>11.2%} "
            f"{size['first']:>8}+{size['second']:<7}/{size['k']:<9} {second['bytes_ratio']:>6} "
            f"{ss['first']:>6}+{ss['second']:<6}/{ss['k']:<6} "
            f"{second['search_server_cpu_ratio']:>6} "
            f"{ds['first']:>7}+{ds['second']:<6}/{ds['k']:<7} {second['data_servers_cpu_ratio']:>6}"
        )
    print("\nspread of the exact top k over the shards (variance / binomial variance)")
    for d in dispersion:
        print(
            f"k={d['k']:>5}: {d['full_queries']} queries with k hits, mean "
            f"{d['variance_over_binomial_mean']}, median {d['variance_over_binomial_p50']}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run (under a minute)")
    parser.add_argument("--shards", type=int, default=50, help="real shards [50]")
    parser.add_argument("--docs", type=int, help="documents per shard [2000; quick 500]")
    parser.add_argument("--queries", type=int, help="exactness queries [3000; quick 400]")
    parser.add_argument("--cost-queries", type=int, help="cost queries [100; quick 15]")
    parser.add_argument(
        "--cpu-every",
        type=int,
        help="time the second round's CPU on every n-th exactness query [10; quick 4]",
    )
    parser.add_argument("--probability", type=float, default=0.9999, help="the promise [0.9999]")
    args = parser.parse_args()
    quick_defaults(
        args,
        args.quick,
        docs=(2000, 500),
        queries=(3000, 400),
        cost_queries=(100, 15),
        cpu_every=(10, 4),
    )
    started = time.perf_counter()
    indexes, build_seconds = build(args.shards, args.docs)
    print(f"{args.shards} shards of {args.docs} documents indexed in {build_seconds:.1f} s")

    cost_started = time.perf_counter()
    cost = measure_cost(indexes, sample_queries(args.cost_queries), args.docs, args.probability)
    cost_seconds = time.perf_counter() - cost_started
    print_cost(cost)

    exact_started = time.perf_counter()
    probabilities = sorted({*WEAK_PROBABILITIES, args.probability})
    exactness, dispersion = measure_exactness(
        indexes,
        sample_queries(args.queries, variant=EXACTNESS_VARIANT),
        args.docs,
        probabilities,
        args.cpu_every,
    )
    exact_seconds = time.perf_counter() - exact_started
    print_exactness(exactness, dispersion)

    total = time.perf_counter() - started
    print(
        f"\nbuild {build_seconds:.1f} s, cost {cost_seconds:.1f} s, exactness "
        f"{exact_seconds:.1f} s; {total:.1f} s in all"
    )
    write_results(
        RESULTS / ("topk-quick.json" if args.quick else "topk.json"),
        "topk",
        {
            "shards": args.shards,
            "docs_per_shard": args.docs,
            "queries": args.queries,
            "cost_queries": args.cost_queries,
            "cpu_every": args.cpu_every,
            "probability": args.probability,
            "quick": args.quick,
        },
        seconds={
            "build": round(build_seconds, 1),
            "cost": round(cost_seconds, 1),
            "exactness": round(exact_seconds, 1),
        },
        cost=cost,
        exactness=exactness,
        spread=dispersion,
    )


if __name__ == "__main__":
    main()
