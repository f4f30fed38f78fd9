"""Scale: per-change cost of the live list at 500, 5,000 and 50,000 data servers,
Redis layout 2 against layout 1 (the baseline) in the same run.

Runs a real local ZooKeeper and Redis (``DevCluster``). For each N in ``--sizes``, and
for each layout of ``--layouts`` on the same registrations:

1. registers N lightweight data servers: EPHEMERAL ServiceInstance nodes under
   ``/data_servers``, created by a few ZooKeeper sessions in pipelined batches;
2. starts ``--readers`` followers of the layout (each with its own Redis client), then
   one search server's real :class:`~discovery.zk.election.LeaderElection` with
   :class:`~discovery.leader.LeaderDuty`, and times the initial publish: from joining
   the election until every reader holds all N servers (``initial_total_s``, which
   includes the leader reading N nodes from ZooKeeper), and from the full write's
   ``published_at`` stamp to the last reader holding it (``initial_publish_s``);
3. makes ``--changes`` single changes (delete one node, then re-create it, ...) and for
   each measures the time from the ZooKeeper write returning to every reader's
   ``current`` reflecting it, Redis ``total_net_input_bytes`` /
   ``total_net_output_bytes`` deltas, the bytes of the leader's own write (the
   publisher's metric), and the leader's ZooKeeper operations (counted client side);
4. measures the memory of one more reader holding N servers (tracemalloc, and RSS).

Prints a table and writes ``bench/results/scale.json``.

    .venv/bin/python bench/bench_scale.py [--sizes 500 5000 50000] [--changes 40] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import statistics
import sys
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from common import write_results
from layout_v1 import LiveListReaderV1, RedisLiveStoreV1
from prometheus_client import CollectorRegistry

from discovery.config import ClusterConfig, ZkConfig
from discovery.instance import InstancePayload, ServiceInstance
from discovery.leader import LeaderDuty
from discovery.livelist.redis.follower import LiveListReader
from discovery.livelist.redis.store import RedisLiveStore
from discovery.testing import DevCluster
from discovery.zk.election import LeaderElection
from discovery.zk.paths import DATA_SERVERS_PATH, SEARCH_ELECTION_PATH
from discovery.zk.session import ZkSession

log = logging.getLogger("bench_scale")
RESULTS = Path(__file__).resolve().parent / "results" / "scale.json"
SESSION_TIMEOUT = 30.0
APPLY_TIMEOUT = 60.0


class CountingSession(ZkSession):
    """A ZkSession that counts the ZooKeeper operations it issues."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ops: Counter[str] = Counter()

    async def call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        self.ops[method.__name__.removesuffix("_async")] += 1
        return await super().call(method, *args, **kwargs)


def _instance(index: int) -> ServiceInstance:
    payload = InstancePayload.from_dict(
        {
            "shard": index % 100,
            "replica": index // 100,
            "docs": 1000,
            "version": "bench",
            "state": "serving",
        }
    )
    return ServiceInstance.create(
        "data_servers", f"ds-{index:05d}", f"10.0.{index // 250}.{index % 250}", 9001, payload
    )


def _publish_seconds(registry: CollectorRegistry, kind: str) -> tuple[float, float]:
    """(total seconds, count) of the leader's change writes to Redis so far."""
    labels = {"kind": kind}
    total = registry.get_sample_value("discovery_publisher_publish_seconds_sum", labels)
    count = registry.get_sample_value("discovery_publisher_publish_seconds_count", labels)
    return total or 0.0, count or 0.0


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _redis_net(redis: aioredis.Redis) -> tuple[int, int]:
    stats = await redis.info("stats")
    return int(stats["total_net_input_bytes"]), int(stats["total_net_output_bytes"])


async def _register(hosts: str, count: int, sessions: int, batch: int) -> list[ZkSession]:
    registrars = [
        ZkSession.from_config(ZkConfig(hosts=hosts, session_timeout=SESSION_TIMEOUT))
        for _ in range(sessions)
    ]
    await asyncio.gather(*(r.start() for r in registrars))
    await registrars[0].ensure_path(DATA_SERVERS_PATH)
    await registrars[0].ensure_path(SEARCH_ELECTION_PATH)
    for start in range(0, count, batch):
        await asyncio.gather(
            *(
                registrars[i % sessions].create(
                    f"{DATA_SERVERS_PATH}/{_instance(i).id}", _instance(i).to_json(), ephemeral=True
                )
                for i in range(start, min(count, start + batch))
            )
        )
    return registrars


def _reader(layout: str, client: aioredis.Redis, prefix: str) -> Any:
    if layout == "v1":
        return LiveListReaderV1(client, prefix)
    return LiveListReader(client, prefix)


async def _reader_memory(layout: str, redis_url: str, prefix: str, size: int) -> dict[str, Any]:
    """Memory held by one more reader once it has loaded ``size`` servers."""
    redis = aioredis.Redis.from_url(redis_url)
    try:
        gc.collect()
        rss_before = _rss_kib()
        tracemalloc.start()
        traced_before, _ = tracemalloc.get_traced_memory()
        reader = _reader(layout, redis, prefix)
        await reader.start()
        try:
            await reader.wait_until(lambda live: len(live.servers) == size, APPLY_TIMEOUT)
            gc.collect()
            traced_after, traced_peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            rss_after = _rss_kib()
        finally:
            await reader.aclose()
    finally:
        if tracemalloc.is_tracing():
            tracemalloc.stop()
        await redis.aclose()
    held = traced_after - traced_before
    return {
        "reader_traced_bytes": held,
        "reader_traced_bytes_per_server": round(held / size, 1),
        "reader_traced_peak_bytes": traced_peak - traced_before,
        "reader_rss_delta_kib": rss_after - rss_before,
    }


async def _run_size(
    hosts: str, redis_url: str, size: int, args: argparse.Namespace
) -> list[dict[str, Any]]:
    registrars = await _register_timed(hosts, size, args)
    try:
        rows = []
        for layout in args.layouts:
            rows.append(await _run_layout(hosts, redis_url, size, layout, registrars, args))
        return rows
    finally:
        for registrar in registrars:
            await registrar.aclose()


async def _register_timed(hosts: str, size: int, args: argparse.Namespace) -> list[ZkSession]:
    started = time.monotonic()
    registrars = await _register(hosts, size, args.registrars, args.batch)
    print(f"  N={size}: registered in {time.monotonic() - started:.1f} s", flush=True)
    return registrars


async def _run_layout(
    hosts: str,
    redis_url: str,
    size: int,
    layout: str,
    registrars: list[ZkSession],
    args: argparse.Namespace,
) -> dict[str, Any]:
    cluster = ClusterConfig(cluster=f"bench-scale-{size}")
    # Layout 1's prefix had no hash tag; it lives only here, as the baseline.
    prefix = f"discovery:{cluster.cluster}" if layout == "v1" else cluster.redis_prefix
    closers: list[Callable[[], Any]] = []
    result: dict[str, Any] = {"servers": size, "layout": layout}
    try:
        control = aioredis.Redis.from_url(redis_url)
        closers.append(control.aclose)
        reader_clients = [
            aioredis.Redis.from_url(redis_url, socket_timeout=APPLY_TIMEOUT)
            for _ in range(args.readers)
        ]
        closers += [c.aclose for c in reader_clients]
        readers = []
        for client in reader_clients:
            reader = _reader(layout, client, prefix)
            await reader.start()
            closers.append(reader.aclose)
            readers.append(reader)

        plain = ZkSession.from_config(ZkConfig(hosts=hosts, session_timeout=SESSION_TIMEOUT))
        leader_session = CountingSession(plain.client, operation_timeout=SESSION_TIMEOUT)
        await leader_session.start()
        closers.append(leader_session.aclose)
        leader_redis = aioredis.Redis.from_url(redis_url, socket_timeout=APPLY_TIMEOUT)
        closers.append(leader_redis.aclose)
        registry = CollectorRegistry()
        store_class = RedisLiveStoreV1 if layout == "v1" else RedisLiveStore
        store = store_class(leader_redis, prefix, registry=registry)
        duty = LeaderDuty(
            leader_session, store, "bench-leader", registry=registry, heartbeat_interval=1.0
        )
        election = LeaderElection(leader_session, SEARCH_ELECTION_PATH, "bench-leader", duty)
        started = time.monotonic()
        await election.start()
        closers.append(election.aclose)
        await asyncio.gather(
            *(r.wait_until(lambda live: len(live.servers) == size, APPLY_TIMEOUT) for r in readers)
        )
        result["initial_total_s"] = round(time.monotonic() - started, 3)
        published_at = readers[0].current.published_at / 1000
        result["initial_publish_s"] = round(
            max(r.applied_at or 0.0 for r in readers) - published_at, 3
        )
        result["initial_write_bytes"] = int(
            registry.get_sample_value("discovery_publisher_snapshot_bytes") or 0
        )
        result["initial_leader_zk_ops"] = sum(leader_session.ops.values())
        await asyncio.sleep(0.3)  # ok-sleep: let the first heartbeat pass before counting

        changer = registrars[0]
        latencies: list[float] = []
        write_bytes: list[float] = []
        ops_before = sum(leader_session.ops.values())
        change_kind = "diff" if layout == "v1" else "delta"
        write0 = _publish_seconds(registry, change_kind)
        net_in0, net_out0 = await _redis_net(control)
        wall0 = time.monotonic()
        for n in range(args.changes):
            instance = _instance((n // 2) * args.registrars)  # created by registrars[0]
            path = f"{DATA_SERVERS_PATH}/{instance.id}"
            present = n % 2 == 1
            if present:
                await changer.create(path, instance.to_json(), ephemeral=True)
            else:
                await changer.delete(path)
            written = time.monotonic()
            await asyncio.gather(
                *(
                    r.wait_until(
                        lambda live, i=instance.id, p=present: (i in live.servers) == p,
                        APPLY_TIMEOUT,
                    )
                    for r in readers
                )
            )
            latencies.append(time.monotonic() - written)
            # Spaced beyond the leader's 50 ms coalescing window: each change is then
            # read at once (leading edge), as a lone change in a real cluster is; changes
            # within the window are batched by design and would measure the window.
            await asyncio.sleep(args.spacing)  # ok-sleep: pacing the load, not waiting
            write_bytes.append(
                registry.get_sample_value("discovery_publisher_snapshot_bytes") or 0.0
            )
        wall = time.monotonic() - wall0 - args.spacing * args.changes
        net_in1, net_out1 = await _redis_net(control)
        write1 = _publish_seconds(registry, change_kind)
        writes = max(1.0, write1[1] - write0[1])
        k = args.changes
        result.update(
            {
                "changes": k,
                "apply_ms_p50": round(statistics.median(latencies) * 1000, 1),
                "apply_ms_p99": round(_pct(latencies, 0.99) * 1000, 1),
                "apply_ms_max": round(max(latencies) * 1000, 1),
                "leader_redis_write_ms_mean": round((write1[0] - write0[0]) / writes * 1000, 2),
                "leader_write_bytes_per_change": round(statistics.mean(write_bytes)),
                "redis_net_in_bytes_per_change": round((net_in1 - net_in0) / k),
                "redis_net_out_bytes_per_change": round((net_out1 - net_out0) / k),
                "leader_zk_ops_per_change": round(
                    (sum(leader_session.ops.values()) - ops_before) / k, 2
                ),
                "changes_wall_s": round(wall, 2),
            }
        )
        result.update(await _reader_memory(layout, redis_url, prefix, size))
        print(
            f"  N={size} {layout}: initial {result['initial_total_s']} s (publish "
            f"{result['initial_publish_s']} s), apply p50 {result['apply_ms_p50']} ms p99 "
            f"{result['apply_ms_p99']} ms, leader write {result['leader_write_bytes_per_change']}"
            f" B/change, redis in {result['redis_net_in_bytes_per_change']} B/change, reader "
            f"{result['reader_traced_bytes_per_server']:.0f} B/server",
            flush=True,
        )
        await control.delete(*(await control.keys(prefix.replace("{", "\\{") + ":*")))
        return result
    finally:
        for close in reversed(closers):
            try:
                await close()
            except Exception as exc:  # keep closing the rest
                log.warning("cleanup step failed: %s", exc)


async def _run(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    with DevCluster(tick_time_ms=500) as cluster:
        info = cluster.info()
        for size in args.sizes:
            rows += await _run_size(info["zk"], info["redis"], size, args)
            await asyncio.sleep(1.0)  # the closed sessions' nodes go before the next size
    return rows


def _table(rows: list[dict[str, Any]]) -> None:
    header = (
        f"{'N':>6} {'layout':>6} | {'initial s':>9} {'publish s':>9} | {'apply p50 ms':>12} "
        f"{'p99 ms':>7} | {'write ms':>8} | {'leader B/chg':>12} | {'redis in B/chg':>14} | "
        f"{'zk ops/chg':>10} | {'reader B/server':>15}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['servers']:>6} {r['layout']:>6} | {r['initial_total_s']:>9.2f} "
            f"{r['initial_publish_s']:>9.2f} | {r['apply_ms_p50']:>12.1f} "
            f"{r['apply_ms_p99']:>7.1f} | {r['leader_redis_write_ms_mean']:>8.2f} | "
            f"{r['leader_write_bytes_per_change']:>12d} | "
            f"{r['redis_net_in_bytes_per_change']:>14d} | "
            f"{r['leader_zk_ops_per_change']:>10.2f} | "
            f"{r['reader_traced_bytes_per_server']:>15.0f}"
        )


_COMPARED = (
    "apply_ms_p50",
    "apply_ms_p99",
    "leader_redis_write_ms_mean",
    "leader_write_bytes_per_change",
    "redis_net_in_bytes_per_change",
    "reader_traced_bytes_per_server",
)


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if not a or b is None else round(b / a, 3)


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Growth from the smallest to the largest N per layout, and v2 / v1 at each N."""
    out: dict[str, Any] = {"growth": {}, "v2_over_v1": {}}
    for layout in sorted({r["layout"] for r in rows}):
        mine = [r for r in rows if r["layout"] == layout]
        first, last = mine[0], mine[-1]
        out["growth"][layout] = {
            "size_ratio": round(last["servers"] / first["servers"], 2),
            **{key: _ratio(first.get(key), last.get(key)) for key in _COMPARED},
        }
    for size in sorted({r["servers"] for r in rows}):
        by = {r["layout"]: r for r in rows if r["servers"] == size}
        if "v1" in by and "v2" in by:
            out["v2_over_v1"][str(size)] = {
                key: _ratio(by["v1"].get(key), by["v2"].get(key)) for key in _COMPARED
            }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=None, help="values of N")
    parser.add_argument("--changes", type=int, default=None, help="single changes per size")
    parser.add_argument("--readers", type=int, default=3, help="live-list readers")
    parser.add_argument("--registrars", type=int, default=4, help="sessions registering")
    parser.add_argument("--batch", type=int, default=250, help="creates in flight at once")
    parser.add_argument(
        "--spacing", type=float, default=0.1, help="seconds between one change and the next"
    )
    parser.add_argument(
        "--layouts", nargs="+", default=["v1", "v2"], choices=["v1", "v2"], help="Redis layouts"
    )
    parser.add_argument("--quick", action="store_true", help="N = 500 5000, fewer changes")
    args = parser.parse_args()
    if args.sizes is None:
        args.sizes = [500, 5000] if args.quick else [500, 5000, 50000]
    if args.changes is None:
        args.changes = 20 if args.quick else 40
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    started = time.monotonic()
    rows = asyncio.run(_run(args))
    print()
    _table(rows)
    summary = _summary(rows)
    for layout, growth in summary["growth"].items():
        print(
            f"{layout}: from N={rows[0]['servers']} to N={rows[-1]['servers']} "
            f"(x{growth['size_ratio']}): leader bytes/change "
            f"x{growth['leader_write_bytes_per_change']}, redis input "
            f"x{growth['redis_net_in_bytes_per_change']}, apply p99 x{growth['apply_ms_p99']}",
            flush=True,
        )
    for size, ratios in summary["v2_over_v1"].items():
        print(
            f"N={size}: v2/v1 leader bytes/change x{ratios['leader_write_bytes_per_change']}, "
            f"redis input x{ratios['redis_net_in_bytes_per_change']}, apply p99 "
            f"x{ratios['apply_ms_p99']}, reader memory x{ratios['reader_traced_bytes_per_server']}",
            flush=True,
        )
    write_results(
        RESULTS,
        "scale",
        vars(args),
        notes=(
            "apply_ms: from the ZooKeeper create/delete returning to all readers' "
            "current reflecting it (ZooKeeper watch, the leader's re-list and 50 ms "
            "coalescing window, encoding, the fenced write, the readers' follow). "
            "initial_total_s: from joining the election to every reader holding N "
            "servers (includes the leader's N ZooKeeper reads); initial_publish_s: from "
            "the full write's published_at stamp to the last reader holding it. "
            "leader_write_bytes_per_change: the arguments of the leader's fenced write "
            "(v1: the whole snapshot, the pub/sub event on top; v2: the changed instances only). "
            "redis_net_in/out: Redis INFO deltas per change, all clients (includes the "
            "leader's 1/s heartbeat and, for v2, the readers' XREAD commands). "
            "reader_traced_bytes: tracemalloc delta for one extra reader after it "
            "loaded N servers."
        ),
        rows=rows,
        summary=summary,
        wall_s=round(time.monotonic() - started, 1),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
