"""Worst-case queries on a data server: pruned and sliced search against the old way.

The query of death of issue 21 is a shard's 150 most frequent terms (by document
frequency): it reads some 36 postings per document of the shard. Two parts, each with
its baseline in the same run:

* **Index.** On one generated shard (``--docs``, default 10,000), the pruned search
  (MaxScore, :meth:`InvertedIndex.search`) against the exhaustive one
  (:meth:`InvertedIndex.search_exhaustive`, what the data server ran before), for the
  worst-case query (k = 10 and k = 100), for ``--queries`` ordinary queries
  (``sample_queries``) and for ordinary queries followed by the 30 most frequent terms
  ("with stop words"): latency, the ratio, the postings the pruned search read or
  looked up against those the exhaustive one reads, and whether both return the same
  ids in the same order.
* **Event loop.** On one asyncio loop, ``--clients`` (default 4) clients send the
  worst-case query back to back for ``--seconds`` while a ticker measures how late the
  loop wakes it (a 1 ms sleep), another thread measures how late *it* wakes (what the
  agent's probe thread suffers while the loop's thread holds the GIL), and one client
  has an ordinary query due every 10 ms and times it from when it was due. Baseline:
  each search run in one piece on the loop (the data server before). Sliced:
  :func:`data_server.searching.run_search` with the data server's slice and its default
  budget (1 s), as the data server runs it now; "sliced, GIL kept" leaves out its
  release of the GIL between slices, to show what that is for.
  Printed: the loop's longest stall, the longest slice, the other thread's lateness,
  ordinary query latency, and worst-case searches answered (complete or cut).

Prints a table and writes ``bench/results/worst_case.json``.

Usage: ``.venv/bin/python bench/bench_worst_case.py [--docs 10000] [--seconds 5] [--quick]``
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import nearest_rank, quick_defaults, write_results

from data_server.config import DEFAULT_SEARCH_TIMEOUT_MS
from data_server.corpus import generate_documents, sample_queries
from data_server.index import Hit, InvertedIndex
from data_server.searching import SLICE_WORK, run_search, work_deadline

RESULTS = Path(__file__).resolve().parent / "results" / "worst_case.json"


def frequent_terms(index: InvertedIndex, count: int) -> list[str]:
    """The shard's ``count`` most frequent terms by document frequency, most frequent first."""
    terms = sorted(index._terms, key=lambda term: (-index.document_frequency(term), term))
    return terms[:count]


def timed(run: Callable[[], object], repeat: int) -> list[float]:
    """Milliseconds of ``repeat`` runs of ``run``."""
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def stats_ms(samples: list[float]) -> dict[str, float]:
    return {
        "mean_ms": round(statistics.fmean(samples), 3),
        "p50_ms": round(statistics.median(samples), 3),
        "p99_ms": round(nearest_rank(samples, 0.99), 3),
        "max_ms": round(max(samples), 3),
    }


def same(a: list[Hit], b: list[Hit]) -> bool:
    return [h.id for h in a] == [h.id for h in b] and all(
        abs(x.score - y.score) <= 1e-9 * max(1.0, abs(y.score)) for x, y in zip(a, b, strict=True)
    )


def compare(index: InvertedIndex, queries: list[str], k: int, repeat: int) -> dict[str, Any]:
    """Exhaustive against pruned on ``queries`` (each run ``repeat`` times, interleaved)."""
    exhaustive: list[float] = []
    pruned: list[float] = []
    read = volume = 0
    agree = 0
    for query in queries:
        # Interleaved, so that a stall of the machine hits both alike.
        for _ in range(repeat):
            exhaustive += timed(lambda q=query: index.search_exhaustive(q, k), 1)
            pruned += timed(lambda q=query: index.search(q, k), 1)
        search = index.start_search(query, k)
        while not search.step(1 << 40):
            pass
        read += search.postings_read + search.lookups
        volume += search.posting_volume
        agree += same(search.hits(), index.search_exhaustive(query, k))
    e, p = stats_ms(exhaustive), stats_ms(pruned)
    return {
        "queries": len(queries),
        "k": k,
        "exhaustive": e,
        "pruned": p,
        "speedup_mean": round(e["mean_ms"] / p["mean_ms"], 2),
        "speedup_p50": round(e["p50_ms"] / p["p50_ms"], 2),
        "postings_of_the_terms": volume,
        "postings_read_or_looked_up": read,
        "read_share": round(read / volume, 3) if volume else None,
        "identical_results": f"{agree}/{len(queries)}",
    }


# -- the event loop ------------------------------------------------------------------------


class OtherThread:
    """A thread that sleeps 1 ms at a time and records how late it wakes, in ms."""

    def __init__(self) -> None:
        self.late: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench:other", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            time.sleep(0.001)
            self.late.append((time.perf_counter() - started - 0.001) * 1000)

    def __enter__(self) -> OtherThread:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


async def loop_run(
    index: InvertedIndex,
    worst: str,
    normal: list[str],
    clients: int,
    seconds: float,
    mode: str,
) -> dict[str, Any]:
    sliced = mode != "one piece (before)"
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    answered = {"complete": 0, "cut": 0}
    longest_slice = [0.0]
    lag: list[float] = []
    normal_ms: list[float] = []

    async def search(query: str) -> bool:
        """Search as the data server does in this mode; True if the search was cut."""
        if not sliced:
            index.search_exhaustive(query, 10)  # the old data server: in one piece
            return False
        deadline = work_deadline(time.monotonic(), DEFAULT_SEARCH_TIMEOUT_MS)
        outcome = await run_search(
            index.start_search(query, 10), deadline, hand_over_gil=mode == "sliced"
        )
        longest_slice[0] = max(longest_slice[0], outcome.longest_slice)
        return outcome.cut

    async def worst_client() -> None:
        while not stop.is_set():
            cut = await search(worst)
            answered["cut" if cut else "complete"] += 1
            await asyncio.sleep(0)  # the next request arrives over the network

    async def ticker() -> None:
        while not stop.is_set():
            started = loop.time()
            await asyncio.sleep(0.001)
            lag.append((loop.time() - started - 0.001) * 1000)

    async def normal_client() -> None:
        # One ordinary query due every 10 ms; its latency counts from when it was due,
        # so that the wait for a loop held by another search is in it.
        due = loop.time()
        for query in normal * 1000:
            due += 0.01
            await asyncio.sleep(max(0.0, due - loop.time()))
            if stop.is_set():
                return
            await search(query)
            normal_ms.append((loop.time() - due) * 1000)
            due = max(due, loop.time())

    with OtherThread() as other:
        tasks = [asyncio.create_task(worst_client()) for _ in range(clients)]
        tasks += [asyncio.create_task(ticker()), asyncio.create_task(normal_client())]
        await asyncio.sleep(seconds)
        stop.set()
        await asyncio.gather(*tasks)
    answered_normal = len(normal_ms)
    return {
        "mode": mode,
        "worst_case_answered": answered["complete"] + answered["cut"],
        "worst_case_cut": answered["cut"],
        "loop_lag": {**stats_ms(lag), "samples": len(lag)},
        "longest_slice_ms": round(longest_slice[0] * 1000, 3) if sliced else None,
        "other_thread_late": {**stats_ms(other.late), "samples": len(other.late)},
        "normal_queries": {**stats_ms(normal_ms), "answered": answered_normal}
        if normal_ms
        else {"answered": 0},
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    index = InvertedIndex(generate_documents(args.docs, shard=args.shard))
    build_s = time.perf_counter() - started
    terms = frequent_terms(index, 150)
    worst = " ".join(terms)
    normal = sample_queries(args.queries, seed=0)
    stop_words = " ".join(terms[:30])
    index_rows = {
        "worst_case_k10": compare(index, [worst], 10, args.repeat),
        "worst_case_k100": compare(index, [worst], 100, args.repeat),
        "normal": compare(index, normal, 10, 1),
        "normal_with_stop_words": compare(
            index, [f"{q} {stop_words}" for q in normal[: args.queries // 5]], 10, 1
        ),
    }
    loops = [
        asyncio.run(loop_run(index, worst, normal, args.clients, args.seconds, mode))
        for mode in ("one piece (before)", "sliced, GIL kept", "sliced")
    ]
    return {
        "corpus": {
            "docs": args.docs,
            "postings": index.posting_count,
            "build_s": round(build_s, 2),
            "worst_case_terms": len(terms),
        },
        "index": index_rows,
        "event_loop": {"slice_work": SLICE_WORK, "clients": args.clients, "runs": loops},
    }


def report(result: dict[str, Any]) -> str:
    corpus = result["corpus"]
    lines = [
        f"shard: {corpus['docs']} documents, {corpus['postings']} postings "
        f"(built in {corpus['build_s']} s)",
        "",
        f"{'queries':<28}{'exhaustive p50':>15}{'pruned p50':>12}{'ratio':>7}"
        f"{'ratio mean':>11}{'read':>7}{'same':>9}",
    ]
    for name, row in result["index"].items():
        lines.append(
            f"{name + ' (' + str(row['queries']) + ')':<28}"
            f"{row['exhaustive']['p50_ms']:>12.2f} ms{row['pruned']['p50_ms']:>9.2f} ms"
            f"{row['speedup_p50']:>6.2f}x{row['speedup_mean']:>10.2f}x"
            f"{row['read_share']:>7.0%}{row['identical_results']:>9}"
        )
    loop = result["event_loop"]
    lines += [
        "",
        f"event loop, {loop['clients']} clients of the worst case back to back "
        f"(slice {loop['slice_work']} units):",
        f"{'mode':<22}{'loop stall max':>15}{'p99':>8}{'slice max':>11}{'thread late max':>17}"
        f"{'normal p50':>12}{'p99':>8}{'worst done/cut':>16}",
    ]
    for run_row in loop["runs"]:
        normal = run_row["normal_queries"]
        slice_ms = run_row["longest_slice_ms"]
        lines.append(
            f"{run_row['mode']:<22}{run_row['loop_lag']['max_ms']:>12.1f} ms"
            f"{run_row['loop_lag']['p99_ms']:>8.1f}"
            f"{'-' if slice_ms is None else f'{slice_ms:.1f}':>11}"
            f"{run_row['other_thread_late']['max_ms']:>14.1f} ms"
            f"{normal.get('p50_ms', float('nan')):>12.2f}{normal.get('p99_ms', float('nan')):>8.2f}"
            f"{str(run_row['worst_case_answered']) + '/' + str(run_row['worst_case_cut']):>16}"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, help="documents in the shard (10000; quick 2000)")
    parser.add_argument("--queries", type=int, help="ordinary queries (300; quick 50)")
    parser.add_argument("--repeat", type=int, help="runs of each worst-case query (10; quick 3)")
    parser.add_argument("--seconds", type=float, help="length of each loop run (5; quick 1)")
    parser.add_argument("--clients", type=int, default=4, help="worst-case clients")
    parser.add_argument("--shard", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="small and short (CI)")
    parser.add_argument("--output", type=Path, default=RESULTS, help="JSON results file")
    args = parser.parse_args()
    quick_defaults(
        args,
        args.quick,
        docs=(10_000, 2000),
        queries=(300, 50),
        repeat=(10, 3),
        seconds=(5.0, 1.0),
    )
    if args.docs < 200 or args.queries < 5 or args.repeat < 1 or args.clients < 1:
        parser.error("need --docs >= 200, --queries >= 5, --repeat >= 1, --clients >= 1")
    result = run(args)
    print(report(result))
    parameters = {k: getattr(args, k) for k in ("docs", "queries", "repeat", "seconds", "clients")}
    write_results(args.output, "worst_case", parameters, **result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
