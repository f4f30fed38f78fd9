"""ZooKeeper load per membership change: one leader watching vs every search server watching.

Runs a real local ZooKeeper and Redis (``DevCluster``), registers ``--servers`` data
servers (EPHEMERAL ServiceInstance nodes under ``/data_servers``, from a few sessions),
then for each S in ``--search`` runs two designs, one after the other, on the same
ZooKeeper:

* **ours**: S search-server sessions, all in :class:`~discovery.zk.election.LeaderElection`
  with the real :class:`~discovery.leader.LeaderDuty` (so only the leader runs a
  :class:`~discovery.zk.membership.MembershipWatcher` and publishes to Redis); a change
  counts as applied when a :class:`~discovery.livelist.redis.LiveListReader` shows it;
* **naive** (baseline): S sessions each running its own ``MembershipWatcher`` on
  ``/data_servers``; a change counts as applied when all S watchers show it.

Each design then sees ``--changes`` membership changes, one at a time (delete a node,
re-create it, ...), each waited for before the next. Measured per change:

* ZooKeeper packets received + sent, from ZooKeeper's own ``mntr`` counters
  (``zk_packets_received``, ``zk_packets_sent``), minus the idle rate (session pings)
  measured just before; they include the 2 packets of the change itself (request and
  reply of the create/delete), the same in both designs;
* client side, over all S sessions: ZooKeeper operations issued and watch
  notifications delivered (counted in a ``ZkSession`` subclass);
* standing watches (``zk_watch_count``) and connections (``zk_num_alive_connections``).

Prints a table and writes ``bench/results/zk_load.json``.

    .venv/bin/python bench/bench_zk_load.py [--search 3 10 30] [--changes 50] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from common import write_results

from discovery.config import ZkConfig
from discovery.instance import InstancePayload, ServiceInstance
from discovery.leader import LeaderDuty
from discovery.livelist.redis.follower import LiveListReader
from discovery.livelist.redis.store import RedisLiveStore
from discovery.testing import DevCluster
from discovery.testing.zookeeper import four_letter_word
from discovery.zk.election import LeaderElection
from discovery.zk.membership import MembershipWatcher
from discovery.zk.paths import DATA_SERVERS_PATH, SEARCH_ELECTION_PATH
from discovery.zk.session import WatchEvent, ZkSession

log = logging.getLogger("bench_zk_load")
RESULTS = Path(__file__).resolve().parent / "results" / "zk_load.json"
SESSION_TIMEOUT = 60.0  # the longest the dev ZooKeeper allows: fewest pings
APPLY_TIMEOUT = 30.0


class CountingSession(ZkSession):
    """A ZkSession that counts its ZooKeeper operations and delivered watch events."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ops: Counter[str] = Counter()
        self.watch_events = 0
        self._wrapped: dict[Callable[[WatchEvent], None], Callable[[WatchEvent], None]] = {}

    async def call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        self.ops[method.__name__.removesuffix("_async")] += 1
        return await super().call(method, *args, **kwargs)

    def watcher(self, watch: Callable[[WatchEvent], None] | None) -> Any:
        if watch is None:
            return None
        # One wrapper per callback, so kazoo's per-path watcher set still de-duplicates.
        wrapper = self._wrapped.get(watch)
        if wrapper is None:

            def wrapper(event: WatchEvent, _watch: Callable[[WatchEvent], None] = watch) -> None:
                self.watch_events += 1
                _watch(event)

            self._wrapped[watch] = wrapper
        return super().watcher(wrapper)


def _session(hosts: str) -> CountingSession:
    plain = ZkSession.from_config(ZkConfig(hosts=hosts, session_timeout=SESSION_TIMEOUT))
    return CountingSession(plain.client, operation_timeout=SESSION_TIMEOUT)


def _instance(index: int) -> ServiceInstance:
    payload = InstancePayload.from_dict(
        {"shard": index, "replica": 0, "docs": 1000, "version": "bench", "state": "serving"}
    )
    return ServiceInstance.create(
        "data_servers", f"ds-{index:05d}", "127.0.0.1", 20000 + index, payload
    )


class Mntr:
    def __init__(self, port: int) -> None:
        self.port = port

    def read(self) -> dict[str, float]:
        figures: dict[str, float] = {}
        for line in four_letter_word(self.port, "mntr").splitlines():
            key, _, value = line.partition("\t")
            with contextlib.suppress(ValueError):
                figures[key] = float(value)
        return figures

    def packets(self) -> float:
        figures = self.read()
        return figures["zk_packets_received"] + figures["zk_packets_sent"]


async def _mntr(mntr: Mntr) -> dict[str, float]:
    return await asyncio.to_thread(mntr.read)


async def _idle_rate(mntr: Mntr, window: float) -> float:
    """Packets per second while nothing happens (pings of all open sessions)."""
    before = await asyncio.to_thread(mntr.packets)
    started = time.monotonic()
    await asyncio.sleep(window)
    after = await asyncio.to_thread(mntr.packets)
    return (after - before) / (time.monotonic() - started)


async def _changes(
    registrar: ZkSession,
    ids: list[str],
    count: int,
    applied: Callable[[str, bool], Any],
) -> list[float]:
    """Delete and re-create nodes one change at a time; returns each change's latency."""
    latencies: list[float] = []
    for n in range(count):
        index = int(ids[(n // 2) % len(ids)].rsplit("-", 1)[1])
        instance = _instance(index)
        path = f"{DATA_SERVERS_PATH}/{instance.id}"
        present = n % 2 == 1  # even: delete; odd: re-create
        started = time.monotonic()
        if present:
            await registrar.create(path, instance.to_json(), ephemeral=True)
        else:
            await registrar.delete(path)
        await applied(instance.id, present)
        latencies.append(time.monotonic() - started)
    return latencies


def _client_counts(sessions: list[CountingSession]) -> tuple[int, int]:
    return (
        sum(sum(s.ops.values()) for s in sessions),
        sum(s.watch_events for s in sessions),
    )


async def _measure(
    design: str,
    search: int,
    sessions: list[CountingSession],
    mntr: Mntr,
    registrar: ZkSession,
    ids: list[str],
    args: argparse.Namespace,
    applied: Callable[[str, bool], Any],
) -> dict[str, Any]:
    await asyncio.sleep(0.5)  # let start-up reads settle
    figures = await _mntr(mntr)
    idle = await _idle_rate(mntr, args.idle_window)
    ops0, events0 = _client_counts(sessions)
    before = await asyncio.to_thread(mntr.packets)
    started = time.monotonic()
    latencies = await _changes(registrar, ids, args.changes, applied)
    elapsed = time.monotonic() - started
    after = await asyncio.to_thread(mntr.packets)
    ops1, events1 = _client_counts(sessions)
    raw = (after - before) / args.changes
    corrected = max(0.0, (after - before - idle * elapsed) / args.changes)
    result = {
        "design": design,
        "search_servers": search,
        "packets_per_change": round(corrected, 2),
        # Without the change's own request and reply: what the watching design costs.
        "watch_side_packets_per_change": round(max(0.0, corrected - 2), 2),
        "packets_per_change_raw": round(raw, 2),
        "idle_packets_per_s": round(idle, 2),
        "client_ops_per_change": round((ops1 - ops0) / args.changes, 2),
        "client_watch_events_per_change": round((events1 - events0) / args.changes, 2),
        "zk_watch_count": int(figures.get("zk_watch_count", -1)),
        "zk_alive_connections": int(figures.get("zk_num_alive_connections", -1)),
        "apply_latency_ms_p50": round(statistics.median(latencies) * 1000, 1),
        "apply_latency_ms_max": round(max(latencies) * 1000, 1),
        "threads_in_process": threading.active_count(),
    }
    print(
        f"  {design:>5} S={search:>2}: {result['packets_per_change']:7.1f} packets/change "
        f"(raw {raw:.1f}), {result['client_ops_per_change']:6.1f} ops/change, "
        f"{result['client_watch_events_per_change']:6.1f} watch events/change, "
        f"{result['zk_watch_count']:5d} watches, p50 {result['apply_latency_ms_p50']} ms",
        flush=True,
    )
    return result


async def _start_sessions(hosts: str, count: int) -> list[CountingSession]:
    sessions = [_session(hosts) for _ in range(count)]
    await asyncio.gather(*(s.start() for s in sessions))
    return sessions


async def _close_all(closers: list[Callable[[], Any]]) -> None:
    for close in reversed(closers):
        try:
            await close()
        except Exception as exc:  # keep closing the rest
            log.warning("cleanup step failed: %s", exc)


async def _ours(
    hosts: str,
    redis_url: str,
    search: int,
    mntr: Mntr,
    registrar: ZkSession,
    ids: list[str],
    args: argparse.Namespace,
) -> dict[str, Any]:
    prefix = "discovery:{bench-zk-load-" + str(search) + "}"
    closers: list[Callable[[], Any]] = []
    try:
        sessions = await _start_sessions(hosts, search)
        closers += [s.aclose for s in sessions]
        redis = aioredis.Redis.from_url(redis_url)
        closers.append(redis.aclose)
        elections = []
        for n, session in enumerate(sessions):
            duty = LeaderDuty(session, RedisLiveStore(redis, prefix), f"search-{n}")
            election = LeaderElection(session, SEARCH_ELECTION_PATH, f"search-{n}", duty)
            await election.start()
            closers.append(election.aclose)
            elections.append(election)
        reader = LiveListReader(redis, prefix)
        await reader.start()
        closers.append(reader.aclose)
        await reader.wait_until(lambda live: len(live.servers) == args.servers, APPLY_TIMEOUT)
        leaders = [e.identifier for e in elections if e.is_leader]

        async def applied(instance_id: str, present: bool) -> None:
            await reader.wait_until(
                lambda live: (instance_id in live.servers) == present, APPLY_TIMEOUT
            )

        result = await _measure("ours", search, sessions, mntr, registrar, ids, args, applied)
        result["leaders"] = leaders
        return result
    finally:
        await _close_all(closers)


async def _naive(
    hosts: str,
    search: int,
    mntr: Mntr,
    registrar: ZkSession,
    ids: list[str],
    args: argparse.Namespace,
) -> dict[str, Any]:
    closers: list[Callable[[], Any]] = []
    try:
        sessions = await _start_sessions(hosts, search)
        closers += [s.aclose for s in sessions]
        watchers = []
        for session in sessions:
            watcher = MembershipWatcher(session)
            await watcher.start()
            closers.append(watcher.aclose)
            watchers.append(watcher)
        await asyncio.gather(
            *(w.wait_until(lambda m: len(m) == args.servers, APPLY_TIMEOUT) for w in watchers)
        )

        async def applied(instance_id: str, present: bool) -> None:
            await asyncio.gather(
                *(
                    w.wait_until(lambda m: (instance_id in m) == present, APPLY_TIMEOUT)
                    for w in watchers
                )
            )

        return await _measure("naive", search, sessions, mntr, registrar, ids, args, applied)
    finally:
        await _close_all(closers)


async def _register(hosts: str, count: int, sessions: int) -> tuple[list[ZkSession], list[str]]:
    registrars = [
        ZkSession.from_config(ZkConfig(hosts=hosts, session_timeout=SESSION_TIMEOUT))
        for _ in range(sessions)
    ]
    await asyncio.gather(*(r.start() for r in registrars))
    await registrars[0].ensure_path(DATA_SERVERS_PATH)
    await registrars[0].ensure_path(SEARCH_ELECTION_PATH)
    instances = [_instance(i) for i in range(count)]
    await asyncio.gather(
        *(
            registrars[i % sessions].create(
                f"{DATA_SERVERS_PATH}/{inst.id}", inst.to_json(), ephemeral=True
            )
            for i, inst in enumerate(instances)
        )
    )
    return registrars, [inst.id for inst in instances]


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    with DevCluster(tick_time_ms=500) as cluster:
        info = cluster.info()
        hosts = info["zk"]
        mntr = Mntr(cluster.zk.servers[0].client_port)
        registrars, ids = await _register(hosts, args.servers, args.registrars)
        # Changes go through the first registrar only: it owns the ids it re-creates.
        changer = registrars[0]
        mine = ids[:: args.registrars]
        rows: list[dict[str, Any]] = []
        try:
            for search in args.search:
                print(f"S = {search}", flush=True)
                ours = await _ours(hosts, info["redis"], search, mntr, changer, mine, args)
                await asyncio.sleep(1.0)  # let closed sessions' ephemeral nodes go
                naive = await _naive(hosts, search, mntr, changer, mine, args)
                ratio = naive["packets_per_change"] / max(ours["packets_per_change"], 1e-9)
                ops_ratio = naive["client_ops_per_change"] / max(
                    ours["client_ops_per_change"], 1e-9
                )
                rows.append(
                    {
                        "search_servers": search,
                        "ours": ours,
                        "naive": naive,
                        "packets_ratio_naive_over_ours": round(ratio, 2),
                        "watch_side_packets_ratio_naive_over_ours": round(
                            naive["watch_side_packets_per_change"]
                            / max(ours["watch_side_packets_per_change"], 1e-9),
                            2,
                        ),
                        "client_ops_ratio_naive_over_ours": round(ops_ratio, 2),
                        "watch_ratio_naive_over_ours": round(
                            naive["zk_watch_count"] / max(ours["zk_watch_count"], 1), 2
                        ),
                    }
                )
                await asyncio.sleep(1.0)
        finally:
            for registrar in registrars:
                await registrar.aclose()
    return {"rows": rows, "data_servers": args.servers}


def _table(rows: list[dict[str, Any]]) -> None:
    header = (
        f"{'S':>3} | {'pkts/chg ours':>13} {'naive':>7} {'ratio':>6} {'w/o write':>9} | "
        f"{'ops/chg ours':>12} {'naive':>6} | {'watch ev/chg ours':>17} {'naive':>6} | "
        f"{'watches ours':>12} {'naive':>6} | {'p50 ms ours':>11} {'naive':>6}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        o, n = row["ours"], row["naive"]
        print(
            f"{row['search_servers']:>3} | {o['packets_per_change']:>13.1f} "
            f"{n['packets_per_change']:>7.1f} {row['packets_ratio_naive_over_ours']:>6.1f} "
            f"{row['watch_side_packets_ratio_naive_over_ours']:>9.1f} | "
            f"{o['client_ops_per_change']:>12.1f} {n['client_ops_per_change']:>6.1f} | "
            f"{o['client_watch_events_per_change']:>17.1f} "
            f"{n['client_watch_events_per_change']:>6.1f} | "
            f"{o['zk_watch_count']:>12d} {n['zk_watch_count']:>6d} | "
            f"{o['apply_latency_ms_p50']:>11.1f} {n['apply_latency_ms_p50']:>6.1f}"
        )


def _growth(rows: list[dict[str, Any]], design: str) -> float:
    first, last = rows[0][design]["packets_per_change"], rows[-1][design]["packets_per_change"]
    return round(last / max(first, 1e-9), 2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--search", type=int, nargs="+", default=None, help="values of S")
    parser.add_argument("--servers", type=int, default=100, help="registered data servers")
    parser.add_argument("--changes", type=int, default=None, help="membership changes per run")
    parser.add_argument("--registrars", type=int, default=4, help="sessions registering")
    parser.add_argument("--idle-window", type=float, default=None, help="seconds of idle rate")
    parser.add_argument("--quick", action="store_true", help="S = 3 10, fewer changes")
    args = parser.parse_args()
    if args.search is None:
        args.search = [3, 10] if args.quick else [3, 10, 30]
    if args.changes is None:
        args.changes = 20 if args.quick else 50
    if args.idle_window is None:
        args.idle_window = 2.0 if args.quick else 5.0
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    started = time.monotonic()
    outcome = asyncio.run(_run(args))
    rows = outcome["rows"]
    print()
    _table(rows)
    growth = {"ours": _growth(rows, "ours"), "naive": _growth(rows, "naive")}
    print(
        f"packets per change from S={rows[0]['search_servers']} to S={rows[-1]['search_servers']}:"
        f" ours x{growth['ours']}, naive x{growth['naive']}",
        flush=True,
    )
    write_results(
        RESULTS,
        "zk_load",
        vars(args),
        notes=(
            "packets_per_change: ZooKeeper mntr zk_packets_received+zk_packets_sent "
            "delta per change minus the idle (ping) rate measured just before; includes "
            "the 2 packets of the create/delete itself. client_* figures are summed over "
            "the S search-server sessions (not the registrar). zk_watch_count is the "
            "server's standing watch count (ours: the leader's child + data watches "
            "plus one election predecessor watch per non-leader)."
        ),
        rows=rows,
        wall_s=round(time.monotonic() - started, 1),
        **{"growth_first_to_last_S": growth},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
