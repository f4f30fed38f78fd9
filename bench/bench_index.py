"""Benchmark the data server's inverted index against a linear scan, in the same run.

For one generated shard (default 10k documents) it measures index build time, the
memory the built index holds (tracemalloc retained and peak, and the process RSS delta
from /proc/self/statm in a forked child so earlier allocations do not hide it), and
query latency and throughput for ``sample_queries``. The baseline scores the same
queries by tokenizing and counting every document at query time (the same BM25, no
index); its top-k is checked against the index's. Prints a table and writes JSON to
``bench/results/index.json``.

Usage: ``.venv/bin/python bench/bench_index.py [--docs 10000] [--queries 500]``
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import multiprocessing
import os
import platform
import statistics
import sys
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, TypeVar

from data_server.corpus import Document, generate_documents, sample_queries, vocabulary
from data_server.index import BM25_B, BM25_K1, InvertedIndex, tokenize

RESULTS = Path(__file__).resolve().parent / "results" / "index.json"
BUILD_REPEATS = 3

T = TypeVar("T")


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def traced(build: Callable[[], object]) -> tuple[object, int, int]:
    """Run ``build`` under tracemalloc: (result, bytes still held, peak bytes)."""
    gc.collect()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        result = build()
        gc.collect()
        after, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, after - before, peak - before


def referenced_strings_bytes(documents: list[Document]) -> int:
    """Size of the id and title strings an index shares with its documents."""
    return sum(sys.getsizeof(d.id) + sys.getsizeof(d.title) for d in documents)


def _rss_child(documents: list[Document], conn: Connection) -> None:
    gc.collect()
    before = rss_bytes()
    start = time.perf_counter()
    index = InvertedIndex(documents)
    elapsed = time.perf_counter() - start
    gc.collect()
    conn.send((rss_bytes() - before, elapsed, index.document_count))
    conn.close()


def rss_delta_of_build(documents: list[Document]) -> tuple[int, float] | None:
    """Build in a forked child (a fresh heap state) and return (RSS delta, seconds)."""
    if (
        not Path("/proc/self/statm").exists()
        or "fork" not in multiprocessing.get_all_start_methods()
    ):
        return None
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=_rss_child, args=(documents, sender))
    child.start()
    sender.close()
    delta, elapsed, _ = receiver.recv()
    child.join()
    return delta, elapsed


class LinearScan:
    """The baseline: BM25 computed from the raw documents at query time, no index."""

    def __init__(self, documents: list[Document]) -> None:
        self.documents = documents

    def search(self, query: str, k: int) -> list[tuple[str, float]]:
        terms = list(dict.fromkeys(tokenize(query)))
        if not terms or k <= 0:
            return []
        counts: list[Counter[str]] = []
        lengths: list[int] = []
        for document in self.documents:
            tokens = tokenize(f"{document.title}\n{document.text}")
            lengths.append(len(tokens))
            counts.append(Counter(tokens))
        n = len(self.documents)
        avgdl = sum(lengths) / n
        weights = {}
        for term in terms:
            df = sum(1 for c in counts if term in c)
            weights[term] = math.log(1.0 + (n - df + 0.5) / (df + 0.5)) * (BM25_K1 + 1.0)
        scored: list[tuple[float, str]] = []
        for document, tf_of, length in zip(self.documents, counts, lengths, strict=True):
            norm = BM25_K1 * (1.0 - BM25_B + BM25_B * length / avgdl)
            score = 0.0
            for term in terms:
                tf = tf_of.get(term, 0)
                if tf:
                    score += weights[term] * tf / (tf + norm)
            if score:
                scored.append((-score, document.id))
        scored.sort()
        return [(doc_id, -negative) for negative, doc_id in scored[:k]]


def latencies(
    run: Callable[[str], T], queries: list[str], results: list[T] | None = None
) -> dict[str, float]:
    """Time ``run`` on each query; append its results to ``results`` if given."""
    samples: list[float] = []
    start = time.perf_counter()
    for query in queries:
        t0 = time.perf_counter_ns()
        result = run(query)
        samples.append((time.perf_counter_ns() - t0) / 1e6)
        if results is not None:
            results.append(result)
    total = time.perf_counter() - start
    cuts = statistics.quantiles(samples, n=100, method="inclusive") if len(samples) > 1 else []
    return {
        "queries": len(samples),
        "mean_ms": statistics.fmean(samples) if samples else 0.0,
        "p50_ms": cuts[49] if cuts else (samples[0] if samples else 0.0),
        "p99_ms": cuts[98] if cuts else (samples[0] if samples else 0.0),
        "max_ms": max(samples, default=0.0),
        "throughput_qps": len(samples) / total if total else 0.0,
    }


def machine() -> dict[str, Any]:
    return {
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "loadavg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }


def mib(value: float) -> str:
    return f"{value / 2**20:.1f} MiB"


def run(args: argparse.Namespace) -> dict[str, Any]:
    per_10k = 10_000 / args.docs

    start = time.perf_counter()
    vocabulary(args.seed)
    generate_documents(1, shard=args.shard, seed=args.seed)  # builds the cached tables
    setup_s = time.perf_counter() - start

    start = time.perf_counter()
    documents = generate_documents(args.docs, shard=args.shard, seed=args.seed)
    generate_s = time.perf_counter() - start
    # Documents are flat objects, so getsizeof is exact for them and much cheaper than
    # tracing the generation.
    documents_bytes = sys.getsizeof(documents) + sum(
        sys.getsizeof(d) + sys.getsizeof(d.id) + sys.getsizeof(d.title) + sys.getsizeof(d.text)
        for d in documents
    )
    text_bytes = sum(len(d.text.encode()) + len(d.title.encode()) for d in documents)
    queries = sample_queries(args.queries, seed=args.seed)
    baseline_queries = queries[: args.baseline_queries]

    # RSS first, in a forked child, before this process has built (and freed) anything.
    rss = rss_delta_of_build(documents)

    # The index keeps references to the documents' id and title strings, allocated
    # before tracing started: they are added, since they outlive the documents. The
    # first traced build also allocates the interned term strings; a second shard built
    # afterwards shares them, which is what one more server in a fleet costs.
    index_object, retained, peak = traced(partial(InvertedIndex, documents))
    assert isinstance(index_object, InvertedIndex)
    index = index_object
    retained += referenced_strings_bytes(documents)
    second_documents = generate_documents(args.docs, shard=args.shard + 1, seed=args.seed)
    _, second_retained, _ = traced(partial(InvertedIndex, second_documents))
    second_retained += referenced_strings_bytes(second_documents)
    del second_documents

    builds = []
    for _ in range(BUILD_REPEATS):
        gc.collect()
        start = time.perf_counter()
        InvertedIndex(documents)
        builds.append(time.perf_counter() - start)

    for query in queries[:20]:  # warm-up
        index.search(query, args.k)
    indexed = latencies(lambda q: index.search(q, args.k), queries)
    indexed_same = latencies(lambda q: index.search(q, args.k), baseline_queries)

    scan = LinearScan(documents)
    scanned: list[list[tuple[str, float]]] = []
    baseline = latencies(lambda q: scan.search(q, args.k), baseline_queries, scanned)
    agree = 0
    for query, expected in zip(baseline_queries, scanned, strict=True):
        hits = index.search(query, args.k)
        if [h.id for h in hits] == [i for i, _ in expected] and all(
            abs(h.score - s) <= 1e-9 for h, (_, s) in zip(hits, expected, strict=True)
        ):
            agree += 1

    match_shares = [index.match_count(q) / index.document_count for q in queries]
    best_build = min(builds)
    return {
        "benchmark": "index",
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "parameters": {
            "docs": args.docs,
            "queries": len(queries),
            "baseline_queries": len(baseline_queries),
            "k": args.k,
            "shard": args.shard,
            "seed": args.seed,
            "build_repeats": BUILD_REPEATS,
        },
        "corpus": {
            "setup_s": setup_s,
            "generate_s": generate_s,
            "documents_bytes": documents_bytes,
            "text_bytes": text_bytes,
            "terms": index.term_count,
            "postings": index.posting_count,
            "average_length_tokens": index.average_length,
            "query_match_share_median": statistics.median(match_shares),
            "query_match_share_max": max(match_shares),
            "queries_without_hits": sum(1 for s in match_shares if s == 0),
        },
        "build": {
            "first_s": rss[1] if rss else None,
            "best_s": best_build,
            "median_s": statistics.median(builds),
            "best_s_per_10k_docs": best_build * per_10k,
        },
        "memory": {
            "tracemalloc_retained_bytes": retained,
            "tracemalloc_peak_bytes": peak,
            "rss_delta_bytes": rss[0] if rss else None,
            "retained_bytes_per_doc": retained / args.docs,
            "retained_bytes_per_10k_docs": retained * per_10k,
            "second_shard_retained_bytes": second_retained,
        },
        "queries": {
            "index": indexed,
            "index_on_baseline_queries": indexed_same,
            "baseline_linear_scan": baseline,
            "speedup_mean": baseline["mean_ms"] / indexed_same["mean_ms"],
            "speedup_p50": baseline["p50_ms"] / indexed_same["p50_ms"],
            "baseline_results_agree": f"{agree}/{len(baseline_queries)}",
        },
    }


def report(result: dict[str, Any]) -> str:
    p, c, b, m, q = (result[key] for key in ("parameters", "corpus", "build", "memory", "queries"))
    ix, base = q["index_on_baseline_queries"], q["baseline_linear_scan"]
    rows = [
        ("documents / queries", f"{p['docs']} / {p['queries']} (baseline {p['baseline_queries']})"),
        ("terms / postings", f"{c['terms']} / {c['postings']}"),
        ("generate documents", f"{c['generate_s']:.2f} s (+{c['setup_s']:.2f} s once per process)"),
        (
            "build index",
            f"best {b['best_s']:.3f} s, median {b['median_s']:.3f} s"
            f" ({b['best_s_per_10k_docs']:.3f} s per 10k docs)",
        ),
        (
            "index memory (tracemalloc)",
            f"retained {mib(m['tracemalloc_retained_bytes'])}"
            f" ({m['retained_bytes_per_doc']:.0f} B/doc), build peak"
            f" {mib(m['tracemalloc_peak_bytes'])}",
        ),
        ("  per 10k docs", mib(m["retained_bytes_per_10k_docs"])),
        ("  another shard, same process", mib(m["second_shard_retained_bytes"])),
        (
            "  process RSS delta",
            "n/a" if m["rss_delta_bytes"] is None else mib(m["rss_delta_bytes"]),
        ),
        (
            "documents themselves",
            f"{mib(c['documents_bytes'])} ({mib(c['text_bytes'])} of text)",
        ),
        (
            "query hit share",
            f"median {c['query_match_share_median']:.1%}, max {c['query_match_share_max']:.1%},"
            f" {c['queries_without_hits']} without hits",
        ),
    ]
    width = max(len(label) for label, _ in rows)
    lines = [f"{label:<{width}}  {value}" for label, value in rows]
    lines.append("")
    lines.append(f"{'queries (k=' + str(p['k']) + ')':<26}{'p50 ms':>10}{'p99 ms':>10}{'q/s':>10}")
    for label, stats in (
        (f"index, {q['index']['queries']} queries", q["index"]),
        (f"index, {ix['queries']} queries", ix),
        (f"linear scan, {base['queries']} queries", base),
    ):
        lines.append(
            f"{label:<26}{stats['p50_ms']:>10.3f}{stats['p99_ms']:>10.3f}"
            f"{stats['throughput_qps']:>10.1f}"
        )
    lines.append(
        f"speed-up of the index: {q['speedup_mean']:.0f}x mean latency,"
        f" {q['speedup_p50']:.0f}x p50; top-{p['k']} agree on"
        f" {q['baseline_results_agree']} baseline queries"
    )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=10_000, help="documents in the shard")
    parser.add_argument("--queries", type=int, default=500, help="queries against the index")
    parser.add_argument(
        "--baseline-queries", type=int, default=50, help="queries for the linear scan (slow)"
    )
    parser.add_argument("-k", type=int, default=10, help="hits per query")
    parser.add_argument("--shard", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=RESULTS, help="JSON results file")
    args = parser.parse_args()
    if args.docs < 1 or args.queries < 2 or not 2 <= args.baseline_queries <= args.queries:
        parser.error("need --docs >= 1 and 2 <= --baseline-queries <= --queries")
    if args.k < 1:
        parser.error("-k must be >= 1")
    result = run(args)
    print(report(result))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
