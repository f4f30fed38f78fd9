"""Leader failover: how long until a new leader's first publish, after a resign or a crash.

Runs a real local ZooKeeper (one node, short tick) and Redis (``DevCluster``), registers
``--servers`` data servers (EPHEMERAL ServiceInstance nodes under ``/data_servers``) so
the leader has something to publish, and subscribes to ``P:events`` (redis.asyncio
pub/sub) to timestamp every publish. A ``full`` event with a higher epoch than the
previous leader's is the new leader's first publish.

Three search-server equivalents contend, each with its own ``ZkSession`` (session
timeout ``--session-timeout``), a :class:`~discovery.zk.election.LeaderElection` and the real
:class:`~discovery.leader.LeaderDuty` publishing under one prefix:

* **graceful** (``--trials`` times): the three contenders run in this process. t0 = the
  current leader starts resigning (``aclose()`` on its ``LeaderElection``, which releases
  its election node); t1 = arrival of the first event with a higher epoch. The contender
  then rejoins (a new ``LeaderElection`` on the same session) before the next trial.
* **crash** (``--trials`` times): each contender is a subprocess of this script
  (``--contender``). t0 = SIGKILL of the leader's process: its session is never closed,
  so ZooKeeper removes its election node only when the session expires; t1 = arrival of
  the first event with a higher epoch. A replacement process is then started.

Targets (issue): graceful p99 < 500 ms; crash p99 <= session timeout + 500 ms. p99 is
the nearest-rank percentile (with 20 trials: the largest value).

Prints a table and writes ``bench/results/failover.json``.

    .venv/bin/python bench/bench_failover.py [--trials 20] [--session-timeout 2] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from common import EventLog, machine, summary_ms

from discovery.config import ZkConfig
from discovery.instance import InstancePayload, ServiceInstance
from discovery.leader import LeaderDuty
from discovery.livelist.redis.store import RedisLiveStore
from discovery.testing import DevCluster
from discovery.zk.election import LeaderElection
from discovery.zk.paths import DATA_SERVERS_PATH, SEARCH_ELECTION_PATH
from discovery.zk.session import ZkSession

log = logging.getLogger("bench_failover")
RESULTS = Path(__file__).resolve().parent / "results" / "failover.json"
PREFIX = "discovery:{bench-failover}"
REGISTRAR_TIMEOUT = 30.0  # the registrar's session: it must outlive every trial
WAIT_TIMEOUT = 30.0
GRACEFUL_TARGET_MS = 500.0
CRASH_SLACK_MS = 500.0


def _instance(index: int) -> ServiceInstance:
    payload = InstancePayload.from_dict(
        {"shard": index, "replica": 0, "docs": 1000, "version": "bench", "state": "serving"}
    )
    return ServiceInstance.create(
        "data_servers", f"ds-{index:05d}", "127.0.0.1", 20000 + index, payload
    )


# -- contenders --------------------------------------------------------------------


def _zk_config(hosts: str, session_timeout: float) -> ZkConfig:
    return ZkConfig(hosts=hosts, session_timeout=session_timeout)


class InProcessContender:
    """One search-server equivalent in this process: session, election, duty."""

    def __init__(self, identifier: str, hosts: str, redis_url: str, timeout: float) -> None:
        self.identifier = identifier
        self.session = ZkSession.from_config(_zk_config(hosts, timeout))
        self.redis = aioredis.Redis.from_url(redis_url)
        self.duty = LeaderDuty(self.session, RedisLiveStore(self.redis, PREFIX), identifier)
        self.election: LeaderElection | None = None

    async def start(self) -> None:
        await self.session.start()
        await self.join()

    async def join(self) -> None:
        self.election = LeaderElection(
            self.session, SEARCH_ELECTION_PATH, self.identifier, self.duty
        )
        await self.election.start()

    async def resign(self) -> None:
        if self.election is not None:
            await self.election.aclose()
            self.election = None

    async def aclose(self) -> None:
        await self.resign()
        await self.session.aclose()
        await self.redis.aclose()


def _trial(
    kind: str,
    trial: int,
    trials: int,
    leader_id: str,
    epoch: int,
    event: dict[str, Any],
    ms: float,
    **extra: Any,
) -> dict[str, Any]:
    """One failover trial's record (printed as it is made)."""
    print(
        f"  {kind:<8} {trial + 1:>2}/{trials}: {leader_id} -> {event['leader']} in {ms:6.1f} ms",
        flush=True,
    )
    record = {
        "trial": trial,
        "old_leader": leader_id,
        "old_epoch": epoch,
        "new_leader": event["leader"],
        "new_epoch": event["epoch"],
        "first_event_full": event["full"],
        **extra,
        "failover_ms": round(ms, 1),
    }
    return record


async def _contender_main(args: argparse.Namespace) -> None:
    """``--contender``: one search-server equivalent until stdin closes (or SIGKILL)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def wait_stdin() -> None:
        sys.stdin.read()  # returns at EOF: the parent closed our stdin (or died)
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(stop.set)

    threading.Thread(target=wait_stdin, name="stdin", daemon=True).start()
    contender = InProcessContender(args.id, args.zk, args.redis, args.session_timeout)
    await contender.start()
    print("ready", flush=True)
    try:
        await stop.wait()
    finally:
        await contender.aclose()


class ContenderProcess:
    """A ``--contender`` subprocess of this script."""

    def __init__(self, identifier: str, command: list[str]) -> None:
        self.identifier = identifier
        self._command = command
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            *self._command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        assert self.proc.stdout is not None
        async with asyncio.timeout(WAIT_TIMEOUT):
            line = await self.proc.stdout.readline()
        if line.strip() != b"ready":
            raise RuntimeError(f"contender {self.identifier} did not start: {line!r}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)

    async def stop(self) -> None:
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            async with asyncio.timeout(10):
                await proc.wait()
        except TimeoutError:
            proc.kill()
            await proc.wait()


# -- trials ------------------------------------------------------------------------


async def _register(hosts: str, count: int) -> ZkSession:
    registrar = ZkSession.from_config(_zk_config(hosts, REGISTRAR_TIMEOUT))
    await registrar.start()
    await registrar.ensure_path(DATA_SERVERS_PATH)
    await registrar.ensure_path(SEARCH_ELECTION_PATH)
    instances = [_instance(i) for i in range(count)]
    await asyncio.gather(
        *(
            registrar.create(f"{DATA_SERVERS_PATH}/{inst.id}", inst.to_json(), ephemeral=True)
            for inst in instances
        )
    )
    return registrar


async def _wait_contenders(registrar: ZkSession, count: int) -> None:
    """Until exactly ``count`` election nodes exist (dead sessions' nodes gone)."""
    async with asyncio.timeout(WAIT_TIMEOUT):
        while True:
            if len(await registrar.get_children(SEARCH_ELECTION_PATH)) == count:
                return
            await asyncio.sleep(0.05)


async def _current_leader(events: EventLog) -> tuple[int, str, int]:
    """(epoch, leader id, event index) of the newest epoch's first full publish."""
    await events.wait_for(lambda e: e["full"])
    epoch = events.max_epoch()
    _, event = await events.wait_for(lambda e: e["epoch"] == epoch and e["full"])
    index = next(i for i, (_, e) in enumerate(events.events) if e["epoch"] == epoch)
    return epoch, event["leader"], index


async def _graceful(
    hosts: str, redis_url: str, registrar: ZkSession, events: EventLog, args: argparse.Namespace
) -> list[dict[str, Any]]:
    contenders = [
        InProcessContender(f"search-{n}", hosts, redis_url, args.session_timeout)
        for n in range(args.contenders)
    ]
    trials: list[dict[str, Any]] = []
    try:
        for contender in contenders:
            await contender.start()
        await _wait_contenders(registrar, args.contenders)
        for trial in range(args.trials):
            epoch, leader_id, _ = await _current_leader(events)
            await asyncio.sleep(args.settle)
            leader = next(c for c in contenders if c.identifier == leader_id)
            if leader.election is None or not leader.election.is_leader:
                raise RuntimeError(f"{leader_id} published last but does not lead")
            start = len(events.events)
            waiter = asyncio.create_task(
                events.wait_for(lambda e, old=epoch: e["epoch"] > old, start)
            )
            t0 = time.monotonic()
            await leader.resign()
            resigned = time.monotonic()
            t1, event = await waiter
            ms = (t1 - t0) * 1000
            trials.append(
                _trial(
                    "graceful",
                    trial,
                    args.trials,
                    leader_id,
                    epoch,
                    event,
                    ms,
                    resign_call_ms=round((resigned - t0) * 1000, 1),
                )
            )
            await leader.join()  # rejoin the election (behind the others)
            await _wait_contenders(registrar, args.contenders)
    finally:
        for contender in contenders:
            try:
                await contender.aclose()
            except Exception as exc:
                log.warning("closing %s failed: %s", contender.identifier, exc)
    return trials


async def _crash(
    hosts: str, redis_url: str, registrar: ZkSession, events: EventLog, args: argparse.Namespace
) -> list[dict[str, Any]]:
    def command(identifier: str) -> list[str]:
        return [
            sys.executable,
            str(Path(__file__).resolve()),
            "--contender",
            "--id",
            identifier,
            "--zk",
            hosts,
            "--redis",
            redis_url,
            "--session-timeout",
            str(args.session_timeout),
        ]

    processes: dict[str, ContenderProcess] = {}
    spawned = 0
    trials: list[dict[str, Any]] = []

    async def spawn() -> None:
        nonlocal spawned
        identifier = f"proc-{spawned}"
        spawned += 1
        process = ContenderProcess(identifier, command(identifier))
        processes[identifier] = process
        await process.start()

    try:
        for _ in range(args.contenders):
            await spawn()
        await _wait_contenders(registrar, args.contenders)
        for trial in range(args.trials):
            # The leader must be one of the processes (not a leftover of the graceful phase).
            async with asyncio.timeout(WAIT_TIMEOUT):
                while True:
                    epoch, leader_id, _ = await _current_leader(events)
                    if leader_id in processes:
                        break
                    await asyncio.sleep(0.05)
            await asyncio.sleep(args.settle)
            leader = processes.pop(leader_id)
            start = len(events.events)
            waiter = asyncio.create_task(
                events.wait_for(lambda e, old=epoch: e["epoch"] > old, start)
            )
            t0 = time.monotonic()
            leader.kill()
            t1, event = await waiter
            assert leader.proc is not None
            await leader.proc.wait()
            ms = (t1 - t0) * 1000
            trials.append(_trial("crash", trial, args.trials, leader_id, epoch, event, ms))
            await spawn()  # the replacement process
            await _wait_contenders(registrar, args.contenders)
    finally:
        for process in processes.values():
            try:
                await process.stop()
            except Exception as exc:
                log.warning("stopping %s failed: %s", process.identifier, exc)
    return trials


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    with DevCluster(tick_time_ms=args.tick_ms) as cluster:
        info = cluster.info()
        hosts, redis_url = info["zk"], info["redis"]
        registrar = await _register(hosts, args.servers)
        redis = aioredis.Redis.from_url(redis_url)
        events = EventLog(redis, PREFIX)
        await events.start()
        try:
            print(f"graceful resign, {args.trials} trials", flush=True)
            graceful = await _graceful(hosts, redis_url, registrar, events, args)
            await _wait_contenders(registrar, 0)
            print(f"crash (SIGKILL), {args.trials} trials", flush=True)
            crash = await _crash(hosts, redis_url, registrar, events, args)
        finally:
            await events.aclose()
            await redis.aclose()
            await registrar.aclose()
    return {"graceful": graceful, "crash": crash, "zk_tick_ms": info["tick_time_ms"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=None, help="trials per scenario (20)")
    parser.add_argument(
        "--session-timeout", type=float, default=2.0, help="contenders' ZooKeeper session (s)"
    )
    parser.add_argument("--tick-ms", type=int, default=200, help="ZooKeeper tickTime (ms)")
    parser.add_argument("--contenders", type=int, default=3, help="search-server equivalents")
    parser.add_argument("--servers", type=int, default=20, help="registered data servers")
    parser.add_argument(
        "--settle", type=float, default=0.3, help="pause after a new leader's first publish (s)"
    )
    parser.add_argument("--quick", action="store_true", help="5 trials per scenario")
    # Internal: run one contender (used by the crash scenario).
    parser.add_argument("--contender", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--id", help=argparse.SUPPRESS)
    parser.add_argument("--zk", help=argparse.SUPPRESS)
    parser.add_argument("--redis", help=argparse.SUPPRESS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.contender:
        asyncio.run(_contender_main(args))
        return 0
    if args.trials is None:
        args.trials = 5 if args.quick else 20

    started = time.monotonic()
    outcome = asyncio.run(_run(args))
    timeout_ms = args.session_timeout * 1000
    crash_target = timeout_ms + CRASH_SLACK_MS
    graceful = summary_ms([t["failover_ms"] for t in outcome["graceful"]])
    crash = summary_ms([t["failover_ms"] for t in outcome["crash"]])
    graceful_met = graceful["p99_ms"] < GRACEFUL_TARGET_MS
    crash_met = crash["p99_ms"] <= crash_target
    print()
    header = (
        f"{'scenario':<9} | {'trials':>6} | {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} | "
        f"{'target':>16} | met"
    )
    print(header)
    print("-" * len(header))
    for name, figures, target, met in (
        ("graceful", graceful, f"p99 < {GRACEFUL_TARGET_MS:.0f} ms", graceful_met),
        ("crash", crash, f"p99 <= {crash_target:.0f} ms", crash_met),
    ):
        print(
            f"{name:<9} | {len(outcome[name]):>6} | {figures['p50_ms']:>8.1f} "
            f"{figures['p99_ms']:>8.1f} {figures['max_ms']:>8.1f} | {target:>16} | "
            f"{'yes' if met else 'NO'}"
        )
    print(
        f"session timeout {args.session_timeout:g} s, ZooKeeper tick {outcome['zk_tick_ms']} ms, "
        f"{args.contenders} contenders, {args.servers} data servers",
        flush=True,
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "benchmark": "failover",
                "command": " ".join([Path(sys.executable).name, *sys.argv]),
                "parameters": {k: v for k, v in vars(args).items() if k not in _INTERNAL},
                "machine": machine(),
                "session_timeout_s": args.session_timeout,
                "zk_tick_ms": outcome["zk_tick_ms"],
                "notes": (
                    "failover_ms: from t0 (graceful: the leader's LeaderElection.aclose() is "
                    "called; crash: SIGKILL of the leader's contender process, whose session "
                    "is never closed) to the arrival on a P:events pub/sub subscriber of the "
                    "first event with a higher epoch (the new leader's first, full, publish). "
                    "Graceful contenders run in the benchmark process; crash contenders are "
                    "subprocesses (bench_failover.py --contender). p99 is nearest-rank."
                ),
                "targets": {
                    "graceful_p99_ms_below": GRACEFUL_TARGET_MS,
                    "crash_p99_ms_at_most": crash_target,
                    "graceful_met": graceful_met,
                    "crash_met": crash_met,
                },
                "graceful": {**graceful, "trials": outcome["graceful"]},
                "crash": {**crash, "trials": outcome["crash"]},
                "wall_s": round(time.monotonic() - started, 1),
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {RESULTS}")
    return 0


_INTERNAL = {"contender", "id", "zk", "redis"}


if __name__ == "__main__":
    sys.exit(main())
