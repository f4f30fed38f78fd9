"""Redis failover behind Sentinel: how long until every reader holds the right list again.

Runs a real ZooKeeper and a Redis primary with two replicas and three sentinels
(``DevCluster(sentinels=3, redis_replicas=2)``, ``down-after-milliseconds`` =
``--down-after-ms``). ``--servers`` lightweight data servers are registered; one
search server's real :class:`~discovery.zk.election.LeaderElection` with
:class:`~discovery.leader.LeaderDuty` publishes through a ``redis+sentinel://`` store,
and ``--readers`` followers read through their own Sentinel clients, exactly as search
servers do.

Each of ``--failovers`` rounds: SIGKILL the primary (the realistic failure: no
goodbye, replication cut at whatever point it had reached), then change one
registration in ZooKeeper, and measure

* ``promoted_s``: from the kill until the sentinels name a new primary;
* ``consistent_s``: from the kill until every reader holds a list equal to the
  registrations (the change included) — the figure the target bounds: within
  ``down-after`` + 3 s (the baseline this benchmark reports its figures against);
* whether any reader ever applied an older (epoch, version) than one it had applied
  (from its change iterator): it must never happen.

The killed server is restarted as a replica before the next round. Prints a table and
writes ``bench/results/redis_failover.json``.

    .venv/bin/python bench/bench_redis_failover.py [--failovers 10] [--down-after-ms 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from common import write_results
from prometheus_client import CollectorRegistry

from discovery.config import ClusterConfig, ZkConfig
from discovery.instance import InstancePayload, ServiceInstance
from discovery.leader import LeaderDuty
from discovery.livelist.model import LiveListFollower
from discovery.livelist.redis.store import RedisLiveStore
from discovery.testing import DevCluster
from discovery.testing.sentinel import DEFAULT_DOWN_AFTER_MS
from discovery.zk.election import LeaderElection
from discovery.zk.paths import DATA_SERVERS_PATH, SEARCH_ELECTION_PATH
from discovery.zk.session import ZkSession

log = logging.getLogger("bench_redis_failover")
RESULTS = Path(__file__).resolve().parent / "results" / "redis_failover.json"
WAIT = 60.0


def _instance(index: int) -> ServiceInstance:
    payload = InstancePayload.from_dict(
        {
            "shard": index % 10,
            "replica": index // 10,
            "docs": 10,
            "version": "b",
            "state": "serving",
        }
    )
    return ServiceInstance.create("data_servers", f"ds-{index:04d}", "10.0.0.1", 9001, payload)


async def _watch_order(follower: LiveListFollower, backwards: list[str]) -> None:
    """Record any step of ``follower`` that moves its list backwards."""
    last = (0, 0)
    async for change in follower.changes():
        position = change.current.position
        if position < last:
            backwards.append(f"{last} -> {position}")
        last = max(last, position)


async def _round(
    cluster: DevCluster,
    registrar: ZkSession,
    followers: list[LiveListFollower],
    expected: set[str],
    index: int,
) -> dict[str, Any]:
    group = cluster.redis_group
    # Every sentinel agrees on the primary and every replica follows it: the previous
    # round's restarted server is a replica again, not a primary that was never demoted.
    await asyncio.to_thread(group.wait_replicated, WAIT)
    old = group.primary_address()
    killed_at = time.monotonic()
    killed = await asyncio.to_thread(group.kill_primary)
    # The change lands while Redis has no primary: the leader must publish it after.
    instance = _instance(index)
    path = f"{DATA_SERVERS_PATH}/{instance.id}"
    if instance.id in expected:
        await registrar.delete(path)
        expected.discard(instance.id)
    else:
        await registrar.create(path, instance.to_json(), ephemeral=True)
        expected.add(instance.id)
    want = frozenset(expected)

    async def all_consistent() -> float:
        await asyncio.gather(
            *(f.wait_until(lambda live: frozenset(live.servers) == want, WAIT) for f in followers)
        )
        return time.monotonic() - killed_at

    # Measured side by side: the readers may be right before every sentinel agrees.
    readers = asyncio.create_task(all_consistent())
    new = await asyncio.to_thread(group.wait_for_new_primary, old, WAIT)
    promoted = time.monotonic() - killed_at
    consistent = await readers
    await asyncio.to_thread(group.restart, killed, WAIT)
    return {
        "old_primary": f"{old[0]}:{old[1]}",
        "new_primary": f"{new[0]}:{new[1]}",
        "promoted_s": round(promoted, 3),
        "consistent_s": round(consistent, 3),
        "after_promotion_s": round(consistent - promoted, 3),
    }


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    with DevCluster(
        tick_time_ms=500, sentinels=3, redis_replicas=2, sentinel_down_after_ms=args.down_after_ms
    ) as cluster:
        zk = ZkConfig(hosts=cluster.zk.hosts, session_timeout=30.0)
        config = ClusterConfig(cluster="bench-failover", redis_url=cluster.redis_url)
        registrar = ZkSession.from_config(zk)
        await registrar.start()
        expected: set[str] = set()
        await registrar.ensure_path(DATA_SERVERS_PATH)
        await registrar.ensure_path(SEARCH_ELECTION_PATH)
        for i in range(args.servers):
            await registrar.create(
                f"{DATA_SERVERS_PATH}/{_instance(i).id}", _instance(i).to_json(), ephemeral=True
            )
            expected.add(_instance(i).id)
        leader_session = ZkSession.from_config(zk)
        await leader_session.start()
        registry = CollectorRegistry()
        store = RedisLiveStore.from_config(config, registry=registry)
        duty = LeaderDuty(leader_session, store, "bench-leader", registry=registry)
        election = LeaderElection(leader_session, SEARCH_ELECTION_PATH, "bench-leader", duty)
        readers = [
            RedisLiveStore.from_config(config, read_only=True, registry=CollectorRegistry())
            for _ in range(args.readers)
        ]
        followers = [r.follower() for r in readers]
        backwards: list[str] = []
        watchers: list[asyncio.Task[None]] = []
        try:
            await election.start()
            for follower in followers:
                await follower.start()
                watchers.append(asyncio.create_task(_watch_order(follower, backwards)))
            want = frozenset(expected)
            await asyncio.gather(
                *(
                    f.wait_until(lambda live: frozenset(live.servers) == want, WAIT)
                    for f in followers
                )
            )
            rounds = []
            for n in range(args.failovers):
                row = await _round(cluster, registrar, followers, expected, args.servers + n)
                rounds.append(row)
                print(
                    f"  failover {n + 1}: new primary after {row['promoted_s']:.2f} s, readers "
                    f"consistent after {row['consistent_s']:.2f} s",
                    flush=True,
                )
        finally:
            for follower in followers:
                await follower.aclose()
            for task in watchers:
                task.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)
            await election.aclose()
            for reader in readers:
                await reader.aclose()
            await store.aclose()
            await leader_session.aclose()
            await registrar.aclose()
    return {"rounds": rounds, "backwards": backwards}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--failovers", type=int, default=10)
    parser.add_argument("--down-after-ms", type=int, default=DEFAULT_DOWN_AFTER_MS)
    parser.add_argument("--servers", type=int, default=200, help="registered data servers")
    parser.add_argument("--readers", type=int, default=3)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    started = time.monotonic()
    outcome = asyncio.run(_run(args))
    rounds = outcome["rounds"]
    bound = args.down_after_ms / 1000 + 3.0
    consistent = [r["consistent_s"] for r in rounds]
    promoted = [r["promoted_s"] for r in rounds]
    after = [r["after_promotion_s"] for r in rounds]
    summary = {
        "failovers": len(rounds),
        "bound_s": bound,
        "consistent_s_p50": round(statistics.median(consistent), 3),
        "consistent_s_max": round(max(consistent), 3),
        "consistent_over_bound_max": round(max(consistent) / bound, 3),
        "within_bound": sum(c <= bound for c in consistent),
        "promoted_s_p50": round(statistics.median(promoted), 3),
        "promoted_s_max": round(max(promoted), 3),
        "after_promotion_s_p50": round(statistics.median(after), 3),
        "after_promotion_s_max": round(max(after), 3),
        "reader_moved_backwards": len(outcome["backwards"]),
    }
    print()
    print(f"{'#':>3} | {'promoted s':>10} | {'consistent s':>12} | {'after promotion s':>17}")
    for n, r in enumerate(rounds, 1):
        print(
            f"{n:>3} | {r['promoted_s']:>10.2f} | {r['consistent_s']:>12.2f} | "
            f"{r['after_promotion_s']:>17.2f}"
        )
    print(
        f"readers consistent: p50 {summary['consistent_s_p50']} s, max "
        f"{summary['consistent_s_max']} s against the bound down-after + 3 s = {bound:g} s "
        f"(x{summary['consistent_over_bound_max']}); {summary['within_bound']}/{len(rounds)} "
        f"within; a reader moved backwards {summary['reader_moved_backwards']} times",
        flush=True,
    )
    write_results(
        RESULTS,
        "redis_failover",
        vars(args),
        notes=(
            "promoted_s: SIGKILL of the primary to the sentinels naming a new one; "
            "consistent_s: SIGKILL to every reader holding the registrations, a change "
            "made during the outage included; the bound is down-after + 3 s."
        ),
        summary=summary,
        rounds=rounds,
        backwards=outcome["backwards"],
        wall_s=round(time.monotonic() - started, 1),
    )
    return 0 if summary["reader_moved_backwards"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
