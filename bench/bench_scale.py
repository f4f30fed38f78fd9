"""Scale: per-change cost with 1,000 and 5,000 registered data servers.

Runs a real local ZooKeeper and Redis (``DevCluster``). For each N in ``--sizes``:

1. registers N lightweight data servers: EPHEMERAL ServiceInstance nodes under
   ``/data_servers``, created by a few ZooKeeper sessions in pipelined batches;
2. starts ``--readers`` :class:`~discovery.livelist.LiveListReader` (each with its own
   Redis client), then one search server's real :class:`~discovery.election.LeaderElection`
   with :class:`~discovery.leader.LeaderDuty`, and times the initial full publish: from
   joining the election until every reader holds all N servers;
3. makes ``--changes`` single changes (delete one node, then re-create it, ...) and for
   each measures the time from the ZooKeeper write returning to every reader's
   ``current`` reflecting it, the bytes published (the event message, captured on the
   events channel, and the snapshot written to ``<prefix>:live``), Redis
   ``total_net_input_bytes`` / ``total_net_output_bytes`` deltas, and the leader's
   ZooKeeper operations (counted client side);
4. measures the memory of one more reader holding N servers (tracemalloc, and RSS).

Prints a table and writes ``bench/results/scale.json``.

    .venv/bin/python bench/bench_scale.py [--sizes 1000 5000] [--changes 40] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
from prometheus_client import CollectorRegistry

from discovery.config import ZkConfig
from discovery.election import LeaderElection
from discovery.instance import InstancePayload, ServiceInstance
from discovery.layout import DATA_SERVERS_PATH, SEARCH_ELECTION_PATH
from discovery.leader import LeaderDuty
from discovery.livelist import LiveListReader
from discovery.redislayout import RedisKeys
from discovery.redisstore import RedisLiveStore
from discovery.testing import DevCluster
from discovery.zk import ZkSession

log = logging.getLogger("bench_scale")
RESULTS = Path(__file__).resolve().parent / "results" / "scale.json"
SESSION_TIMEOUT = 30.0
APPLY_TIMEOUT = 60.0


class CountingSession(ZkSession):
    """A ZkSession that counts the ZooKeeper operations it issues."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ops: Counter[str] = Counter()

    async def _call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        self.ops[method.__name__.removesuffix("_async")] += 1
        return await super()._call(method, *args, **kwargs)


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


def _publish_seconds(registry: CollectorRegistry) -> tuple[float, float]:
    """(total seconds, count) of the leader's diff writes to Redis so far."""
    labels = {"kind": "diff"}
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


async def _reader_memory(redis_url: str, prefix: str, size: int) -> dict[str, Any]:
    """Memory held by one more reader once it has loaded ``size`` servers."""
    redis = aioredis.Redis.from_url(redis_url)
    try:
        gc.collect()
        rss_before = _rss_kib()
        tracemalloc.start()
        traced_before, _ = tracemalloc.get_traced_memory()
        reader = LiveListReader(redis, prefix)
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
) -> dict[str, Any]:
    prefix = f"discovery:bench-scale-{size}"
    keys = RedisKeys(prefix)
    closers: list[Callable[[], Any]] = []
    result: dict[str, Any] = {"servers": size}
    try:
        started = time.monotonic()
        registrars = await _register(hosts, size, args.registrars, args.batch)
        closers += [r.aclose for r in registrars]
        result["register_s"] = round(time.monotonic() - started, 2)

        control = aioredis.Redis.from_url(redis_url)
        closers.append(control.aclose)
        reader_clients = [aioredis.Redis.from_url(redis_url) for _ in range(args.readers)]
        closers += [c.aclose for c in reader_clients]
        readers = []
        for client in reader_clients:
            reader = LiveListReader(client, prefix)
            await reader.start()
            closers.append(reader.aclose)
            readers.append(reader)

        # Capture every event message the leader publishes.
        events: list[tuple[float, int]] = []
        pubsub = control.pubsub()
        await pubsub.subscribe(keys.events)
        closers.append(pubsub.aclose)

        async def collect() -> None:
            async for message in pubsub.listen():
                if message.get("type") == "message":
                    events.append((time.monotonic(), len(message["data"])))

        collector = asyncio.create_task(collect())

        async def stop_collector() -> None:
            collector.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await collector

        closers.append(stop_collector)

        plain = ZkSession.from_config(ZkConfig(hosts=hosts, session_timeout=SESSION_TIMEOUT))
        leader_session = CountingSession(plain.client, operation_timeout=SESSION_TIMEOUT)
        await leader_session.start()
        closers.append(leader_session.aclose)
        leader_redis = aioredis.Redis.from_url(redis_url)
        closers.append(leader_redis.aclose)
        registry = CollectorRegistry()
        store = RedisLiveStore(leader_redis, prefix, registry=registry)
        duty = LeaderDuty(leader_session, store, "bench-leader", registry=registry)
        election = LeaderElection(leader_session, SEARCH_ELECTION_PATH, "bench-leader", duty)
        started = time.monotonic()
        await election.start()
        closers.append(election.aclose)
        await asyncio.gather(
            *(r.wait_until(lambda live: len(live.servers) == size, APPLY_TIMEOUT) for r in readers)
        )
        result["initial_publish_s"] = round(time.monotonic() - started, 3)
        result["initial_snapshot_bytes"] = int(await control.strlen(keys.live))
        result["initial_leader_zk_ops"] = sum(leader_session.ops.values())
        await asyncio.sleep(0.3)

        changer = registrars[0]
        latencies: list[float] = []
        to_event: list[float] = []
        snapshot_sizes: list[int] = []
        events.clear()
        ops_before = sum(leader_session.ops.values())
        write0 = _publish_seconds(registry)
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
            seen = [t for t, _ in events if t >= written]
            if seen:
                to_event.append(seen[0] - written)
            snapshot_sizes.append(int(await control.strlen(keys.live)))
        wall = time.monotonic() - wall0
        await asyncio.sleep(0.2)  # the last event reaches our collector
        net_in1, net_out1 = await _redis_net(control)
        write1 = _publish_seconds(registry)
        writes = max(1.0, write1[1] - write0[1])
        k = args.changes
        result.update(
            {
                "changes": k,
                "apply_ms_p50": round(statistics.median(latencies) * 1000, 1),
                "apply_ms_p99": round(_pct(latencies, 0.99) * 1000, 1),
                "apply_ms_max": round(max(latencies) * 1000, 1),
                "leader_event_ms_p50": round(statistics.median(to_event) * 1000, 1)
                if to_event
                else None,
                "leader_event_ms_p99": round(_pct(to_event, 0.99) * 1000, 1) if to_event else None,
                "leader_redis_write_ms_mean": round((write1[0] - write0[0]) / writes * 1000, 1),
                "event_bytes_mean": round(statistics.mean(b for _, b in events), 1)
                if events
                else None,
                "events_seen": len(events),
                "snapshot_bytes_per_change": round(statistics.mean(snapshot_sizes)),
                "redis_net_in_bytes_per_change": round((net_in1 - net_in0) / k),
                "redis_net_out_bytes_per_change": round((net_out1 - net_out0) / k),
                "leader_zk_ops_per_change": round(
                    (sum(leader_session.ops.values()) - ops_before) / k, 2
                ),
                "changes_wall_s": round(wall, 2),
            }
        )
        result.update(await _reader_memory(redis_url, prefix, size))
        print(
            f"  N={size}: initial publish {result['initial_publish_s']} s, apply p50 "
            f"{result['apply_ms_p50']} ms p99 {result['apply_ms_p99']} ms, event "
            f"{result['event_bytes_mean']} B, snapshot {result['snapshot_bytes_per_change']} B, "
            f"redis in {result['redis_net_in_bytes_per_change']} B/change, leader zk ops "
            f"{result['leader_zk_ops_per_change']}/change, reader "
            f"{result['reader_traced_bytes'] / 1024:.0f} KiB",
            flush=True,
        )
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
            rows.append(await _run_size(info["zk"], info["redis"], size, args))
            await asyncio.sleep(1.0)  # the closed sessions' nodes go before the next size
    return rows


def _table(rows: list[dict[str, Any]]) -> None:
    header = (
        f"{'N':>6} | {'initial s':>9} | {'apply p50 ms':>12} {'p99 ms':>7} | {'event p50':>9} | "
        f"{'write ms':>8} | {'event B':>8} | {'snapshot B':>10} | {'redis in B/chg':>14} | "
        f"{'zk ops/chg':>10} | {'reader KiB':>10} {'B/server':>8}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['servers']:>6} | {r['initial_publish_s']:>9.2f} | {r['apply_ms_p50']:>12.1f} "
            f"{r['apply_ms_p99']:>7.1f} | {r['leader_event_ms_p50'] or 0:>9.1f} | "
            f"{r['leader_redis_write_ms_mean']:>8.1f} | {r['event_bytes_mean'] or 0:>8.0f} | "
            f"{r['snapshot_bytes_per_change']:>10d} | {r['redis_net_in_bytes_per_change']:>14d} | "
            f"{r['leader_zk_ops_per_change']:>10.2f} | {r['reader_traced_bytes'] / 1024:>10.0f} "
            f"{r['reader_traced_bytes_per_server']:>8.0f}"
        )


def _growth(rows: list[dict[str, Any]]) -> dict[str, Any]:
    first, last = rows[0], rows[-1]
    scale = last["servers"] / first["servers"]

    def ratio(key: str) -> float | None:
        a, b = first.get(key), last.get(key)
        if not a or b is None:
            return None
        return round(b / a, 2)

    return {
        "size_ratio": round(scale, 2),
        "apply_ms_p50": ratio("apply_ms_p50"),
        "apply_ms_p99": ratio("apply_ms_p99"),
        "leader_event_ms_p50": ratio("leader_event_ms_p50"),
        "leader_redis_write_ms_mean": ratio("leader_redis_write_ms_mean"),
        "event_bytes_mean": ratio("event_bytes_mean"),
        "snapshot_bytes_per_change": ratio("snapshot_bytes_per_change"),
        "redis_net_in_bytes_per_change": ratio("redis_net_in_bytes_per_change"),
        "leader_zk_ops_per_change": ratio("leader_zk_ops_per_change"),
        "reader_traced_bytes": ratio("reader_traced_bytes"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=None, help="values of N")
    parser.add_argument("--changes", type=int, default=None, help="single changes per size")
    parser.add_argument("--readers", type=int, default=3, help="live-list readers")
    parser.add_argument("--registrars", type=int, default=4, help="sessions registering")
    parser.add_argument("--batch", type=int, default=250, help="creates in flight at once")
    parser.add_argument("--quick", action="store_true", help="N = 200 1000, fewer changes")
    args = parser.parse_args()
    if args.sizes is None:
        args.sizes = [200, 1000] if args.quick else [1000, 5000]
    if args.changes is None:
        args.changes = 20 if args.quick else 40
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    started = time.monotonic()
    rows = asyncio.run(_run(args))
    print()
    _table(rows)
    growth = _growth(rows)
    print(
        f"from N={rows[0]['servers']} to N={rows[-1]['servers']} (x{growth['size_ratio']}): "
        f"apply p50 x{growth['apply_ms_p50']}, event bytes x{growth['event_bytes_mean']}, "
        f"snapshot bytes x{growth['snapshot_bytes_per_change']}, redis input "
        f"x{growth['redis_net_in_bytes_per_change']}, leader zk ops "
        f"x{growth['leader_zk_ops_per_change']}, reader memory x{growth['reader_traced_bytes']}",
        flush=True,
    )
    write_results(
        RESULTS,
        "scale",
        vars(args),
        notes=(
            "apply_ms: from the ZooKeeper create/delete returning to all readers' "
            "current reflecting it; leader_event_ms: from the same point to the event "
            "message arriving on the channel (ZooKeeper watch, the watcher's 50 ms "
            "coalescing window, snapshot encoding and the fenced write). "
            "leader_redis_write_ms_mean: the fenced Lua write of one diff publish "
            "(publisher's own histogram; the snapshot is sent whole each time). "
            "event_bytes: the pub/sub message (a delta). "
            "snapshot_bytes: the whole <prefix>:live document, rewritten on every "
            "change. redis_net_in/out: Redis INFO deltas per change, all clients "
            "(includes the leader's 1/s heartbeat and our own STRLEN polls). "
            "reader_traced_bytes: tracemalloc delta for one extra reader after it "
            "loaded N servers."
        ),
        rows=rows,
        growth_first_to_last=growth,
        wall_s=round(time.monotonic() - started, 1),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
