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

Prints the tables and writes JSON to ``bench/results/topk.json`` (``--quick``:
``topk-quick.json``).

Usage: ``.venv/bin/python bench/bench_topk.py [--quick] [--shards 50] [--docs 2000]
[--queries 3000] [--cost-queries 100] [--probability 0.9999]``
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter
from collections.abc import Sequence
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


def body(hits: Sequence[Hit], shard: int) -> bytes:
    """A data server's answer, as ``data_server/handlers.py`` encodes it."""
    return orjson.dumps(
        {
            "hits": [{"id": hit.id, "score": hit.score, "title": hit.title} for hit in hits],
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


def measure_exactness(
    indexes: list[InvertedIndex], queries: list[str], docs: int, probabilities: Sequence[float]
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
    for query in queries:
        tops: list[list[Ranked]] = []
        for shard, index in enumerate(indexes):
            tops.append(
                [
                    (-hit.score, hit.id, shard, {"id": hit.id, "score": hit.score})
                    for hit in index.search(query, deepest)
                ]
            )
        for k in KS:
            exact = merge([Answer(top[:k], docs, docs) for top in tops], k, 0.0).hits
            exact_ids = [(hit["id"], hit["shard"]) for hit in exact]
            if len(exact) == k:
                counts = [0] * shards
                for hit in exact:
                    counts[hit["shard"]] += 1
                binomial = k * (1 / shards) * (1 - 1 / shards)
                spread[k].append(statistics.pvariance(counts) / binomial)
            for p in probabilities:
                row = rows[(k, p)]
                asked = row.asked
                row.queries += 1
                row.reduced += any(len(top) > asked for top in tops)
                merged = merge([Answer(top[:asked], docs, docs) for top in tops], k, 0.0).hits
                ok = [(hit["id"], hit["shard"]) for hit in merged] == exact_ids
                flagged = bool(
                    inexact_shards(
                        ((shard, len(top[:asked]), asked) for shard, top in enumerate(tops)),
                        k,
                        merged,
                    )
                )
                row.exact += ok
                if not ok:
                    terms = len(query.split())
                    row.misses_by_terms[terms] = row.misses_by_terms.get(terms, 0) + 1
                row.flagged += flagged
                row.flagged_misses += flagged and not ok
    results = []
    for row in rows.values():
        misses = row.queries - row.exact
        results.append(
            {
                "k": row.k,
                "probability": row.probability,
                "asked": row.asked,
                "queries": row.queries,
                "queries_reduced": row.reduced,
                "exact": row.exact,
                "exact_share": round(row.exact / row.queries, 5),
                "promise_held": row.exact / row.queries >= row.probability,
                "misses": misses,
                "misses_flagged": row.flagged_misses,
                "misses_unflagged": misses - row.flagged_misses,
                "flagged": row.flagged,
                "false_alarms": row.flagged - row.flagged_misses,
                "misses_by_terms": dict(sorted(row.misses_by_terms.items())),
            }
        )
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
    parser.add_argument("--probability", type=float, default=0.9999, help="the promise [0.9999]")
    args = parser.parse_args()
    quick_defaults(
        args,
        args.quick,
        docs=(2000, 500),
        queries=(3000, 400),
        cost_queries=(100, 15),
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
