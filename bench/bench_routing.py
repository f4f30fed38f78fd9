"""Routing table: what one live-list change costs a search server's event loop, at 500,
5,000 and 50,000 data servers, following the change against rebuilding the table (the
baseline: what the fan-out did for every version before) in the same run.

In process, no ZooKeeper or Redis: the cost measured is the fan-out's alone (the
follower's, from Redis to ``current``, is ``bench_scale.py``'s). For each N in
``--sizes``: N data servers, ``--replicas`` per shard, in a live list; then
``--changes`` single changes made the way a follower reports them (``LiveList.apply``
and the change feed's delta), cycling through: one server removed, added back,
its weight changed, set draining, set serving again. Each change is applied to one
:class:`~search_server.routing.RoutingTable` with ``follow`` (ours) and to another with
``load`` of the new list (the baseline); both are timed with ``perf_counter`` around the
call only, garbage collector on, as on a running server. The two tables are checked to
agree after every change. While a table is updated the event loop runs nothing else:
these times are how long every query in flight on that search server waits.

Prints a table and writes ``bench/results/routing.json``.

    .venv/bin/python bench/bench_routing.py [--sizes 500 5000 50000] [--changes 200]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from pathlib import Path
from typing import Any

from common import write_results

from discovery.instance import InstancePayload, InstanceState, ServiceInstance
from discovery.livelist.feed import ChangeFeed
from discovery.livelist.model import LiveList, LiveListChange
from search_server.routing import RoutingTable

RESULTS = Path(__file__).resolve().parent / "results" / "routing.json"


def instance(n: int, shards: int, **payload: Any) -> ServiceInstance:
    fields: dict[str, Any] = {
        "shard": n % shards,
        "replica": n // shards,
        "docs": 1000,
        "version": "bench",
        "state": "serving",
        **payload,
    }
    return ServiceInstance.create(
        "data_servers",
        f"ds-{n}",
        f"10.{n // 65536}.{n // 256 % 256}.{n % 256}",
        9000,
        InstancePayload.from_dict(fields),
        clock=lambda: 1_700_000_000.0,
    )


class Changes:
    """Single changes of a list, made as a follower reports them."""

    def __init__(self, servers: int, shards: int) -> None:
        self.shards = shards
        self.list = LiveList(1, 1, "ss-1", 0, {i.id: i for i in map(self.make, range(servers))})
        self._feed = ChangeFeed()
        self._changes = self._feed.subscribe(self.list)
        self._queue = self._changes.queue  # type: ignore[attr-defined]
        self._queue.get_nowait()
        self._removed: ServiceInstance | None = None
        self._step = 0

    def make(self, n: int, **payload: Any) -> ServiceInstance:
        return instance(n, self.shards, **payload)

    def next(self) -> LiveListChange:
        kind = self._step % 5
        n = (self._step // 5 * 7919) % len(self.list.servers)  # spread over the shards
        self._step += 1
        target = self.list.servers.get(f"ds-{n}")
        upserts: tuple[ServiceInstance, ...] = ()
        removes: dict[str, str] = {}
        if kind == 0 or target is None:
            victim = target or next(iter(self.list.servers.values()))
            removes = {victim.id: "gone"}
            self._removed = victim
        elif kind == 1 and self._removed is not None:
            upserts = (self._removed,)
        else:
            payload = dataclasses.replace(
                target.payload,
                weight=200 if kind == 2 else target.payload.weight,
                state=InstanceState.DRAINING if kind == 3 else InstanceState.SERVING,
            )
            upserts = (dataclasses.replace(target, payload=payload),)
        current = self.list.apply(
            epoch=1,
            version=self.list.version + 1,
            leader="ss-1",
            published_at=0,
            upserts=upserts,
            removes=removes,
        )
        self._feed.delta(self.list, current, upserts, removes)
        self.list = current
        change: LiveListChange = self._queue.get_nowait()
        return change


def shape(table: RoutingTable) -> list[tuple[int, list[str]]]:
    return [(shard, sorted(r.key for r in group)) for shard, group in table.table]


def summary(seconds: list[float]) -> dict[str, float]:
    micro = sorted(s * 1e6 for s in seconds)
    return {
        "p50_us": round(statistics.median(micro), 1),
        "p99_us": round(micro[min(len(micro) - 1, int(len(micro) * 0.99))], 1),
        "max_us": round(micro[-1], 1),
    }


def run(servers: int, replicas: int, changes: int) -> dict[str, Any]:
    shards = max(1, servers // replicas)
    source = Changes(servers, shards)
    clock = time.monotonic
    ours, baseline = RoutingTable(clock), RoutingTable(clock)
    ours.load(source.list.servers)
    baseline.load(source.list.servers)
    followed: list[float] = []
    rebuilt: list[float] = []
    for _ in range(changes):
        change = source.next()
        started = time.perf_counter()
        ours.follow(change)
        followed.append(time.perf_counter() - started)
        started = time.perf_counter()
        baseline.load(change.current.servers)
        rebuilt.append(time.perf_counter() - started)
        if len(followed) % 50 == 0 or len(followed) == changes:
            assert shape(ours) == shape(baseline), "the followed table differs from a rebuild"
    ours_s, base_s = summary(followed), summary(rebuilt)
    return {
        "servers": servers,
        "shards": shards,
        "changes": changes,
        "follow": ours_s,
        "rebuild_baseline": base_s,
        "p50_ratio": round(ours_s["p50_us"] / base_s["p50_us"], 5),
        "max_ratio": round(ours_s["max_us"] / base_s["max_us"], 5),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[500, 5000, 50000])
    parser.add_argument("--replicas", type=int, default=2, help="replicas per shard")
    parser.add_argument("--changes", type=int, default=200)
    args = parser.parse_args()
    if args.replicas < 1 or args.changes < 1 or min(args.sizes) < 2:
        parser.error("--replicas and --changes must be >= 1, --sizes >= 2")
    rows = []
    print(
        f"{'servers':>8} {'shards':>7}  {'follow p50/p99/max µs':>24}  "
        f"{'rebuild p50/p99/max µs':>26}  {'p50 ratio':>9}"
    )
    for servers in args.sizes:
        row = run(servers, args.replicas, args.changes)
        rows.append(row)
        f, b = row["follow"], row["rebuild_baseline"]
        print(
            f"{servers:>8} {row['shards']:>7}  "
            f"{f['p50_us']:>8} {f['p99_us']:>7} {f['max_us']:>7}  "
            f"{b['p50_us']:>9} {b['p99_us']:>8} {b['max_us']:>8}  {row['p50_ratio']:>9}",
            flush=True,
        )
    write_results(
        RESULTS,
        "routing",
        vars(args),
        notes=(
            "Per live-list change, the time the search server's event loop spends moving "
            "its routing table: follow (the change's delta) against a rebuild of the "
            "table for the new list (the baseline, the fan-out's behaviour before). "
            "Nothing else runs on the loop meanwhile: every query in flight waits this "
            "long. In process; the follower's own cost is bench_scale.py's."
        ),
        rows=rows,
    )


if __name__ == "__main__":
    main()
