"""Convergence: from an event on a data server to every search server's in-memory list.

Starts a real local ZooKeeper (one node) and Redis (``DevCluster``), three real
``search-server`` processes (one of them leads) and ``--servers`` data servers (default
100: a ``data-server fleet`` over two processes plus ``--singles`` ``data-server``
processes of their own, so that they can be SIGKILLed). Shards have two replicas
each, so one server leaving never makes a query partial. Then runs ``--trials`` trials
of each kind, one event at a time:

* ``probe_offline``: ``POST /admin/fault {"mode":"error","rate":1}`` on a fleet server;
  its agent's probes fail ``--fall`` times and it deregisters. The fault is cleared
  and the server re-admitted (a different server each time, so flap damping never
  holds one back).
* ``crash``: SIGKILL of a single data-server process; ZooKeeper removes its node when
  the session times out (``--session-timeout``). The process is restarted.
* ``drain``: ``POST /admin/drain`` on a fleet server (``--drain-grace``), under
  open-loop query load (``--rate`` per second, ``--deadline-ms``) through the three
  search servers; the same load runs for 20 s without drains first, as a control.
  The drained server is polled every 5 ms until it refuses connections.

For every trial, with t0 = the event (the admin call, or the kill) and all times on
the one wall clock of this host:

* (a) **znode**: a data watch of this script's own ZooKeeper session on the server's
  node fires (``deleted``; for a drain, ``changed`` to ``draining``);
* (b) **publish**: the ``P:events`` message carrying the change arrives on this
  script's pub/sub subscription;
* (c) **last search server**: the latest of the three search servers' ``applied_at_ms``
  (``GET /cluster``: when that server installed the list version) for the first
  version without the server (for a drain: with it draining). ``/cluster`` is polled,
  but the time is the server's own, so polling adds nothing to it. A trial whose
  polled version had moved past the published one is marked ``exact: false``.

Each trial also records the machine's CPU steal share over it (``/proc/stat``): this
VM's hypervisor throttles it under sustained load, and a stall then hits every process
at once; figures over the trials with under 2 % steal are reported beside all trials.
A server that is not serving everywhere when its turn comes (such a stall can take it
offline) is skipped and listed.

Targets (issue): probe_offline (c) - (a) p99 < 50 ms; drain: every server out of every
list before it stops serving (c < the last answer it gave) and no failed query during
the drains (an error, or a shard that failed rather than timed out); crash:
(c) - t0 p99 <= session timeout + 100 ms. p99 is nearest-rank: of 20, the largest.

Prints a table and writes ``bench/results/convergence.json``.

    .venv/bin/python bench/bench_convergence.py [--trials 20] [--quick]
        [--kinds probe_offline,crash,drain]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio as aioredis
from common import CpuMeter, EventLog, free_port_block, machine, spawn_python, summary_ms

from data_server.corpus import sample_queries
from discovery.adminauth import admin_headers
from discovery.config import ZkConfig
from discovery.testing import DevCluster
from discovery.testing.process import terminate_all
from discovery.zk.paths import DATA_SERVERS_PATH
from discovery.zk.session import WatchEvent, ZkSession

SCRIPT = Path(__file__).resolve()
ROOT = SCRIPT.parent.parent
RESULTS = ROOT / "bench" / "results" / "convergence.json"
SEARCH_SERVERS = 3
WAIT = 60.0
PROBE_TARGET_MS = 50.0
CRASH_SLACK_MS = 100.0
STOP_POLL = 0.005
# /cluster encodes the whole list: polling it often is load on the search servers, so
# poll slowly while waiting and faster only while a trial's (c) is due; (c) itself is
# the servers' own applied_at, so the polling interval does not enter the figures.
CLUSTER_POLL = 0.05
WAIT_POLL = 0.25
KINDS = ("probe_offline", "crash", "drain")
QUIET_STEAL = 0.02  # a trial during which the hypervisor stole less CPU than this
CONTROL_SECONDS = 20.0  # the same query load without drains, for comparison


def _now() -> float:
    return time.time()


# ------------------------------------------------------------------ the cluster


@dataclass
class Cluster:
    """The processes under test and how to reach them."""

    args: argparse.Namespace
    zk: str
    redis_url: str
    procs: list[asyncio.subprocess.Process] = field(default_factory=list)
    search_ports: list[int] = field(default_factory=list)
    fleet_base: int = 0
    singles_base: int = 0
    singles: dict[str, asyncio.subprocess.Process] = field(default_factory=dict)

    @property
    def fleet_count(self) -> int:
        return self.args.servers - self.args.singles

    @property
    def shards(self) -> int:
        return self.args.servers // 2

    def common(self) -> list[str]:
        return [
            *("--zk", self.zk, "--redis", self.redis_url),
            *("--session-timeout", str(self.args.session_timeout)),
            *("--log-level", os.environ.get("BENCH_LOG", "ERROR")),
        ]

    def agent(self) -> list[str]:
        return [
            *("--docs", str(self.args.docs), "--probe-interval", str(self.args.probe_interval)),
            *("--fall", str(self.args.fall), "--rise", "2"),
            *("--drain-grace", str(self.args.drain_grace)),
        ]

    async def spawn(self, *argv: str) -> asyncio.subprocess.Process:
        return await spawn_python(self.procs, *argv)

    def single_id(self, j: int) -> str:
        return f"ds-{self.fleet_count + j:04d}"

    def port_of(self, server_id: str) -> int:
        number = int(server_id.removeprefix("ds-"))
        if number < self.fleet_count:
            return self.fleet_base + number
        return self.singles_base + number - self.fleet_count

    async def start_single(self, server_id: str) -> None:
        number = int(server_id.removeprefix("ds-"))
        self.singles[server_id] = await self.spawn(
            *("-m", "data_server.cli", *self.common(), *self.agent()),
            *("--id", server_id, "--port", str(self.port_of(server_id))),
            *("--shard", str(number % self.shards), "--replica", str(number // self.shards)),
        )

    def probe_pool(self) -> list[str]:
        """Fleet servers for probe trials (each is restored after its trial): replica 0
        of the first half of the shards, then replica 1 of the second half."""
        half = self.shards // 2
        numbers = [*range(half), *range(self.shards + half, self.fleet_count)]
        return [f"ds-{n:04d}" for n in numbers]

    def drain_pool(self) -> list[str]:
        """Fleet servers for drains (they do not come back): replica 0 of the second
        half of the shards, then replica 1 of the first half; at most one replica of a
        shard, so that each shard keeps one."""
        half = self.shards // 2
        numbers = [*range(half, self.shards), *range(self.shards, self.shards + half)]
        return [f"ds-{n:04d}" for n in numbers]

    async def start(self) -> None:
        taken: set[int] = set()
        self.search_ports = [free_port_block(1, taken) for _ in range(SEARCH_SERVERS)]
        self.fleet_base = free_port_block(self.fleet_count, taken)
        self.singles_base = free_port_block(self.args.singles, taken)
        for n, port in enumerate(self.search_ports):
            await self.spawn(
                *("-m", "search_server.cli", *self.common(), "--id", f"search-{n}"),
                *("--port", str(port), "--timeout-ms", str(self.args.deadline_ms)),
                *("--heartbeat-interval", "0.5", "--heartbeat-ttl", "3"),
                *("--reconcile-interval", "5"),
            )
        await self.spawn(
            *("-m", "data_server.cli", "fleet", *self.common(), *self.agent()),
            *("--count", str(self.fleet_count), "--procs", "2"),
            *("--shards", str(self.shards), "--base-port", str(self.fleet_base)),
        )

    async def start_singles(self) -> None:
        for j in range(self.args.singles):
            await self.start_single(self.single_id(j))

    def fleet_ids(self) -> set[str]:
        return {f"ds-{i:04d}" for i in range(self.fleet_count)}

    def all_ids(self) -> set[str]:
        return {f"ds-{i:04d}" for i in range(self.args.servers)}

    async def stop_all(self) -> None:
        await terminate_all(self.procs, timeout=20)


# ----------------------------------------------------------------- observation


async def _get_json(http: aiohttp.ClientSession, url: str) -> dict[str, Any] | None:
    try:
        async with http.get(url) as response:
            if response.status != 200:
                return None
            body: dict[str, Any] = await response.json()
            return body
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


async def views(http: aiohttp.ClientSession, cluster: Cluster) -> list[dict[str, Any] | None]:
    """Every search server's ``GET /cluster``."""
    return await asyncio.gather(
        *(_get_json(http, f"http://127.0.0.1:{p}/cluster") for p in cluster.search_ports)
    )


def _state(view: dict[str, Any], server_id: str) -> str | None:
    """The server's state in a search server's view, None when it is not listed."""
    for server in view["servers"]:
        if server["id"] == server_id:
            return str(server["state"])
    return None


async def wait_views(
    http: aiohttp.ClientSession,
    cluster: Cluster,
    done: Callable[[dict[str, Any]], bool],
    label: str,
    timeout: float = WAIT,
    poll: float = WAIT_POLL,
) -> list[dict[str, Any]]:
    """Poll until ``done(view)`` holds on every search server; their views."""
    deadline = time.monotonic() + timeout
    while True:
        got = await views(http, cluster)
        if all(v is not None and done(v) for v in got):
            return [v for v in got if v is not None]
        if time.monotonic() > deadline:
            raise TimeoutError(f"{label}: not every search server got there in {timeout:g} s")
        await asyncio.sleep(poll)


class NodeWatch:
    """When our own ZooKeeper session first sees the node change (a one-shot data watch)."""

    def __init__(self, zk: ZkSession, server_id: str) -> None:
        self._zk = zk
        self.path = f"{DATA_SERVERS_PATH}/{server_id}"
        self.fired: dict[str, float] = {}
        self._event = asyncio.Event()

    async def arm(self) -> None:
        self._event.clear()
        if await self._zk.exists(self.path, watch=self._on_event) is None:
            raise NotReady(self.path)

    def _on_event(self, event: WatchEvent) -> None:
        self.fired.setdefault(event.kind, _now())
        self._event.set()

    async def wait(self, kind: str) -> float:
        async with asyncio.timeout(WAIT):
            while kind not in self.fired:
                if "deleted" in self.fired:
                    # Gone before the change we wait for: its session expired in a stall.
                    raise NotReady(f"{self.path} vanished before it changed")
                await self._event.wait()
                self._event.clear()
        return self.fired[kind]


def _removes(server_id: str) -> Callable[[dict[str, Any]], bool]:
    return lambda e: any(r["id"] == server_id for r in e["removed"])


def _drains(server_id: str) -> Callable[[dict[str, Any]], bool]:
    return lambda e: any(
        c["id"] == server_id and c["payload"]["state"] == "draining" for c in e["changed"]
    )


async def last_applied(
    http: aiohttp.ClientSession,
    cluster: Cluster,
    done: Callable[[dict[str, Any]], bool],
    version: int,
    label: str,
) -> tuple[float, bool]:
    """(c): the latest ``applied_at`` over the search servers once each shows the change.

    Exact when every view's version is the published one (no later change was applied
    on top, which would make ``applied_at`` later than the change's arrival).
    """
    got = await wait_views(http, cluster, done, label, poll=CLUSTER_POLL)
    exact = all(v["version"] == version for v in got)
    return max(v["applied_at_ms"] for v in got) / 1000, exact


# ---------------------------------------------------------------------- trials


@dataclass
class Trial:
    kind: str
    server: str
    t0: float
    a: float
    b: float
    c: float
    exact: bool
    extra: dict[str, Any] = field(default_factory=dict)

    def figures(self) -> dict[str, Any]:
        def ms(seconds: float) -> float:
            return round(seconds * 1000, 1)

        return {
            "server": self.server,
            "event_to_znode_ms": ms(self.a - self.t0),
            "event_to_publish_ms": ms(self.b - self.t0),
            "event_to_last_list_ms": ms(self.c - self.t0),
            "znode_to_publish_ms": ms(self.b - self.a),
            "publish_to_last_list_ms": ms(self.c - self.b),
            "znode_to_last_list_ms": ms(self.c - self.a),
            "exact": self.exact,
            **self.extra,
        }


@dataclass
class Context:
    args: argparse.Namespace
    cluster: Cluster
    http: aiohttp.ClientSession
    zk: ZkSession
    events: EventLog


async def _observe(
    ctx: Context,
    kind: str,
    server_id: str,
    act: Callable[[], Awaitable[None]],
    *,
    znode_kind: str,
    event_match: Callable[[dict[str, Any]], bool],
    view_done: Callable[[dict[str, Any]], bool],
) -> Trial:
    watch = NodeWatch(ctx.zk, server_id)
    await watch.arm()
    meter = CpuMeter()
    start = len(ctx.events.events)
    publish = asyncio.create_task(ctx.events.wait_for(event_match, start, timeout=WAIT))
    t0 = _now()
    try:
        await act()
        a = await watch.wait(znode_kind)
    except BaseException:
        publish.cancel()
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await publish
        raise
    b, event = await publish
    c, exact = await last_applied(ctx.http, ctx.cluster, view_done, event["version"], kind)
    trial = Trial(kind, server_id, t0, a, b, c, exact)
    # The leader's own clock at the publish: splits (a)->(b) into the leader's part
    # (notification, re-read, encode, write) and Redis' delivery to us.
    trial.extra["znode_to_leader_publish_ms"] = round(event["published_at"] - a * 1000, 1)
    trial.extra["cpu_steal_share"] = meter.steal_share()
    return trial


def _print(trial: Trial, n: int, total: int) -> None:
    f = trial.figures()
    print(
        f"  {trial.kind:<13} {n:>2}/{total}: {trial.server}  znode {f['event_to_znode_ms']:7.1f}"
        f"  publish +{f['znode_to_publish_ms']:6.1f}"
        f"  last list +{f['publish_to_last_list_ms']:6.1f}"
        f"  (c)-(a) {f['znode_to_last_list_ms']:6.1f} ms{'' if trial.exact else '  (inexact)'}"
        f"{f'  steal {steal:.0%}' if (steal := f['cpu_steal_share']) >= 0.01 else ''}",
        flush=True,
    )


class NotReady(Exception):
    """The chosen server is not registered and serving everywhere: choose another."""


async def ready(ctx: Context, server_id: str, timeout: float = 30.0) -> bool:
    """Wait until ``server_id`` is serving in every search server's list."""
    try:
        await wait_views(
            ctx.http,
            ctx.cluster,
            lambda v: _state(v, server_id) == "serving",
            f"{server_id} serving",
            timeout=timeout,
        )
    except TimeoutError:
        return False
    return True


async def _trials(
    ctx: Context,
    kind: str,
    candidates: list[str],
    one: Callable[[str], Awaitable[Trial]],
) -> tuple[list[Trial], list[str]]:
    """Run ``one(server)`` on candidates in turn until ``--trials`` trials are done.

    A candidate that is not serving everywhere (on this shared 2-core machine a stall
    can take a server offline through its probes, or expire its session) is skipped
    and recorded, rather than waited for.
    """
    trials: list[Trial] = []
    skipped: list[str] = []
    pool = list(candidates)
    while len(trials) < ctx.args.trials:
        if not pool:
            raise RuntimeError(f"{kind}: ran out of servers ({len(skipped)} skipped)")
        server_id = pool.pop(0)
        if not await ready(ctx, server_id):
            skipped.append(server_id)
            continue
        try:
            trial = await one(server_id)
        except NotReady:
            skipped.append(server_id)
            continue
        trials.append(trial)
        _print(trial, len(trials), ctx.args.trials)
    if skipped:
        print(f"  {kind}: skipped (not serving when their turn came): {skipped}", flush=True)
    return trials, skipped


async def probe_offline(ctx: Context) -> tuple[list[Trial], list[str]]:
    async def one(server_id: str) -> Trial:
        url = f"http://127.0.0.1:{ctx.cluster.port_of(server_id)}/admin/fault"

        async def act() -> None:
            body = {"mode": "error", "rate": 1}
            async with ctx.http.post(url, json=body, headers=admin_headers()) as response:
                response.raise_for_status()

        try:
            return await _observe(
                ctx,
                "probe_offline",
                server_id,
                act,
                # The agent announces the departure (state draining, reason "offline:
                # ...") before it deletes the node; routing stops at that first write.
                znode_kind="changed",
                event_match=lambda e: _drains(server_id)(e) or _removes(server_id)(e),
                view_done=lambda v: _state(v, server_id) in (None, "draining"),
            )
        finally:
            async with ctx.http.post(url, json={"mode": "none"}) as response:
                response.raise_for_status()
            # One event at a time: its re-admission (after `rise` good probes) must not
            # land in the leader's coalescing window of the next trial's departure.
            await ready(ctx, server_id, timeout=15.0)

    # A different server each time, so that flap damping never holds one back.
    return await _trials(ctx, "probe_offline", ctx.cluster.probe_pool(), one)


async def crash(ctx: Context) -> tuple[list[Trial], list[str]]:
    cluster = ctx.cluster

    async def one(server_id: str) -> Trial:
        process = cluster.singles[server_id]

        async def act() -> None:
            process.send_signal(signal.SIGKILL)

        try:
            return await _observe(
                ctx,
                "crash",
                server_id,
                act,
                znode_kind="deleted",
                event_match=_removes(server_id),
                view_done=lambda v: _state(v, server_id) is None,
            )
        finally:
            if process.returncode is None:  # not killed: the trial did not start
                process.send_signal(signal.SIGKILL)
            await process.wait()
            await cluster.start_single(server_id)

    singles = [cluster.single_id(j) for j in range(ctx.args.singles)]
    rounds = -(-ctx.args.trials // len(singles)) + 2  # spare rounds for skipped turns
    result = await _trials(ctx, "crash", singles * rounds, one)
    for server_id in singles:
        await ready(ctx, server_id, timeout=WAIT)
    return result


@dataclass
class Load:
    """Open-loop queries at ``--rate`` per second through the search servers, in turn.

    A query fails when the search server answers an error or a shard *failed* (a
    replica refused or errored, as a stopped or draining server would); a shard that
    only *timed out* at the deadline is counted apart, as that is what a CPU stall of
    this shared machine produces, drain or not.
    """

    ctx: Context
    ok: int = 0
    failed: int = 0
    timed_out_only: int = 0
    over_deadline: int = 0
    failures: list[dict[str, Any]] = field(default_factory=list)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def run(self, stop: asyncio.Event) -> None:
        queries = sample_queries(500, variant=3)
        ports = self.ctx.cluster.search_ports
        interval = 1.0 / self.ctx.args.rate
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        i = 0
        while not stop.is_set():
            port = ports[i % len(ports)]
            task = asyncio.create_task(self._one(port, queries[i % len(queries)]))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            i += 1
            next_at += interval
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, next_at - loop.time()))
        if self._tasks:
            await asyncio.wait(self._tasks)

    async def _one(self, port: int, query: str) -> None:
        url = f"http://127.0.0.1:{port}/search"
        started = time.monotonic()
        outcome, detail = "failed", ""
        try:
            async with self.ctx.http.get(url, params={"q": query, "k": "10"}) as response:
                body = await response.json(content_type=None)
                shards = body.get("shards") or {}
                if response.status != 200:
                    detail = f"HTTP {response.status}: {body.get('error')}"
                elif shards.get("failed"):
                    detail = json.dumps(shards)
                elif body.get("partial"):
                    outcome, detail = "timed_out_only", json.dumps(shards)
                else:
                    outcome = "ok"
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            detail = repr(exc)
        ms = (time.monotonic() - started) * 1000
        self.over_deadline += ms > self.ctx.args.deadline_ms + 50
        if outcome == "ok":
            self.ok += 1
            return
        if outcome == "failed":
            self.failed += 1
        else:
            self.timed_out_only += 1
        if sum(f["kind"] == outcome for f in self.failures) < 15:  # samples of each kind
            self.failures.append({"at": _now(), "kind": outcome, "port": port, "detail": detail})


async def _stops_serving(http: aiohttp.ClientSession, port: int) -> tuple[float, float]:
    """Poll the server until it refuses connections: (last answer, first refusal).

    Any HTTP answer counts as serving; a timeout (a stalled machine) proves nothing
    either way and is polled again.
    """
    url = f"http://127.0.0.1:{port}/healthz"
    last_ok = _now()
    timeout = aiohttp.ClientTimeout(total=2)
    while True:
        sent = _now()
        try:
            async with http.get(url, timeout=timeout) as response:
                await response.read()
            last_ok = sent
        except aiohttp.ClientConnectorError:
            return last_ok, sent
        except (aiohttp.ClientError, TimeoutError):
            pass
        await asyncio.sleep(STOP_POLL)


async def drain(ctx: Context) -> tuple[list[Trial], list[str], dict[str, Any]]:
    load = Load(ctx)

    async def one(server_id: str) -> Trial:
        port = ctx.cluster.port_of(server_id)
        stopper: asyncio.Task[tuple[float, float]] | None = None

        async def act() -> None:
            nonlocal stopper
            url = f"http://127.0.0.1:{port}/admin/drain"
            async with ctx.http.post(url, headers=admin_headers()) as response:
                response.raise_for_status()
            stopper = asyncio.create_task(_stops_serving(ctx.http, port))

        trial = await _observe(
            ctx,
            "drain",
            server_id,
            act,
            znode_kind="changed",
            event_match=_drains(server_id),
            view_done=lambda v: _state(v, server_id) in (None, "draining"),
        )
        assert stopper is not None
        last_ok, first_fail = await stopper
        trial.extra |= {
            "last_answer_ms": round((last_ok - trial.t0) * 1000, 1),
            "stopped_ms": round((first_fail - trial.t0) * 1000, 1),
            "margin_ms": round((last_ok - trial.c) * 1000, 1),
            "out_before_stop": trial.c < last_ok,
        }
        print(
            f"{'':>20}out of every list {trial.extra['margin_ms']:.0f} ms before its last "
            f"answer (stopped serving at +{trial.extra['stopped_ms']:.0f} ms)",
            flush=True,
        )
        await wait_views(
            ctx.http, ctx.cluster, lambda v: _state(v, server_id) is None, f"{server_id} gone"
        )
        return trial

    control = Load(ctx)
    stop = asyncio.Event()
    generator = asyncio.create_task(control.run(stop), name="control-load")
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(generator), CONTROL_SECONDS)
    stop.set()
    await generator
    stop = asyncio.Event()
    generator = asyncio.create_task(load.run(stop), name="load")
    started = time.monotonic()
    try:
        trials, skipped = await _trials(ctx, "drain", ctx.cluster.drain_pool(), one)
    finally:
        stop.set()
        await generator
    seconds = time.monotonic() - started
    queries = load.ok + load.failed + load.timed_out_only
    return (
        trials,
        skipped,
        {
            "queries": queries,
            "seconds": round(seconds, 1),
            "rate_qps": round(queries / seconds, 1),
            "ok": load.ok,
            "failed": load.failed,
            "timed_out_only": load.timed_out_only,
            "over_deadline_plus_50ms": load.over_deadline,
            "failures": load.failures,
            "control": {
                "seconds": CONTROL_SECONDS,
                "queries": control.ok + control.failed + control.timed_out_only,
                "failed": control.failed,
                "timed_out_only": control.timed_out_only,
                "over_deadline_plus_50ms": control.over_deadline,
            },
        },
    )


# ----------------------------------------------------------------------- main


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with DevCluster(tick_time_ms=args.tick_ms) as dev:
        info = dev.info()
        cluster = Cluster(args, info["zk"], info["redis"])
        zk = ZkSession.from_config(ZkConfig(hosts=info["zk"], session_timeout=30.0))
        redis = aioredis.Redis.from_url(info["redis"])
        events = EventLog(redis, "discovery:{default}", clock=_now, timeout=WAIT)
        connector = aiohttp.TCPConnector(limit=0)
        http = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=10))
        outcome: dict[str, list[Trial]] = {kind: [] for kind in KINDS}
        skipped: dict[str, list[str]] = {}
        load: dict[str, Any] = {}
        try:
            await zk.start()
            await events.start()
            started = time.monotonic()
            print(
                f"starting {args.servers} data servers and {SEARCH_SERVERS} search servers",
                flush=True,
            )
            # The fleet first, the single processes once it serves: indexing is CPU-bound,
            # and live servers starved of CPU by it fail their probes and flap.
            await cluster.start()
            for ids in (cluster.fleet_ids(), cluster.all_ids()):
                await wait_views(
                    http,
                    cluster,
                    lambda v, ids=ids: (
                        {s["id"] for s in v["servers"] if s["state"] == "serving"} == ids
                    ),
                    "all registered",
                    timeout=300,
                    poll=1.0,
                )
                if ids != cluster.all_ids():
                    await cluster.start_singles()
            print(f"all in every list after {time.monotonic() - started:.1f} s", flush=True)
            ctx = Context(args, cluster, http, zk, events)
            if "probe_offline" in args.kinds:
                print(f"forced offline by a probe, {args.trials} trials", flush=True)
                outcome["probe_offline"], skipped["probe_offline"] = await probe_offline(ctx)
            if "crash" in args.kinds:
                print(f"crash (SIGKILL), {args.trials} trials", flush=True)
                outcome["crash"], skipped["crash"] = await crash(ctx)
            if "drain" in args.kinds:
                print(f"graceful drain under load, {args.trials} trials", flush=True)
                outcome["drain"], skipped["drain"], load = await drain(ctx)
        finally:
            await cluster.stop_all()
            await http.close()
            await events.aclose()
            await redis.aclose()
            await zk.aclose()
    return {**outcome, "load": load, "skipped": skipped}


def _kind_summary(trials: list[Trial]) -> dict[str, Any]:
    figures = [t.figures() for t in trials]
    out: dict[str, Any] = {}
    for key in (
        "event_to_znode_ms",
        "event_to_publish_ms",
        "event_to_last_list_ms",
        "znode_to_publish_ms",
        "publish_to_last_list_ms",
        "znode_to_last_list_ms",
    ):
        out[key] = summary_ms([f[key] for f in figures])
    out["znode_to_leader_publish_ms"] = summary_ms(
        [f["znode_to_leader_publish_ms"] for f in figures]
    )
    out["inexact_trials"] = sum(not t.exact for t in trials)
    # The same figures over the trials the VM's CPU steal left alone (see CpuMeter).
    quiet = [f for f in figures if f["cpu_steal_share"] < QUIET_STEAL]
    out["quiet_trials"] = len(quiet)
    if quiet:
        out["quiet"] = {
            key: summary_ms([f[key] for f in quiet])
            for key in ("znode_to_last_list_ms", "event_to_last_list_ms")
        }
    out["trials"] = figures
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=None, help="trials per kind (20)")
    parser.add_argument("--servers", type=int, default=100, help="data servers (even)")
    parser.add_argument("--singles", type=int, default=5, help="data servers run alone")
    parser.add_argument("--docs", type=int, default=1000, help="documents per data server")
    parser.add_argument("--session-timeout", type=float, default=4.0, help="seconds")
    # ZooKeeper expires sessions in tickTime buckets, up to one tick after the timeout:
    # the crash bound is session timeout + tick + propagation, so the tick is short.
    parser.add_argument("--tick-ms", type=int, default=50, help="ZooKeeper tickTime (ms)")
    parser.add_argument("--probe-interval", type=float, default=1.0, help="agents' (s)")
    parser.add_argument("--fall", type=int, default=2, help="agents' failed probes to go")
    parser.add_argument("--drain-grace", type=float, default=1.0, help="seconds")
    parser.add_argument("--deadline-ms", type=int, default=500, help="query deadline")
    parser.add_argument("--rate", type=float, default=10.0, help="queries/s during drains")
    parser.add_argument("--quick", action="store_true", help="5 trials per kind")
    parser.add_argument(
        "--kinds",
        type=lambda v: v.split(","),
        default=list(KINDS),
        help=f"comma-separated subset of {','.join(KINDS)}",
    )
    args = parser.parse_args()
    if args.trials is None:
        args.trials = 5 if args.quick else 20
    if args.servers % 2 or args.trials > args.servers // 4 or args.singles < 1:
        parser.error("need an even --servers >= 4 x --trials and --singles >= 1")
    if unknown := set(args.kinds) - set(KINDS):
        parser.error(f"--kinds: unknown {sorted(unknown)}")

    started = time.monotonic()
    meter = CpuMeter()
    outcome = asyncio.run(run(args))
    crash_target = args.session_timeout * 1000 + CRASH_SLACK_MS
    summaries = {k: _kind_summary(outcome[k]) for k in KINDS if outcome[k]}
    load = outcome["load"]
    verdicts: dict[str, tuple[bool, str]] = {}
    if "probe_offline" in summaries:
        p99 = summaries["probe_offline"]["znode_to_last_list_ms"]["p99_ms"]
        verdicts["probe_offline"] = (
            p99 < PROBE_TARGET_MS,
            f"(c)-(a) p99 {p99:.1f} ms, target < {PROBE_TARGET_MS:.0f} ms",
        )
    if "crash" in summaries:
        p99 = summaries["crash"]["event_to_last_list_ms"]["p99_ms"]
        verdicts["crash"] = (
            p99 <= crash_target,
            f"event -> last list p99 {p99:.1f} ms, target <= {crash_target:.0f} ms",
        )
    if "drain" in summaries:
        first = sum(t.extra["out_before_stop"] for t in outcome["drain"])
        summaries["drain"]["out_before_stop"] = first
        summaries["drain"]["load"] = load
        control = load["control"]
        verdicts["drain"] = (
            first == len(outcome["drain"]) and load["failed"] == 0,
            f"{first}/{len(outcome['drain'])} out of every list before they stopped serving; "
            f"{load['queries']} queries under load: {load['failed']} failed, "
            f"{load['timed_out_only']} partial by a deadline timeout only "
            f"(control, no drains: {control['failed']} failed, "
            f"{control['timed_out_only']}/{control['queries']} timed out)",
        )
    for name in ("probe_offline", "crash"):
        if name in summaries and "quiet" in summaries[name]:
            key = "znode_to_last_list_ms" if name == "probe_offline" else "event_to_last_list_ms"
            q = summaries[name]["quiet"][key]
            print(
                f"{name}: over the {summaries[name]['quiet_trials']} trials with CPU steal "
                f"< {QUIET_STEAL:.0%}: {key} p50 {q['p50_ms']:.1f} / p99 {q['p99_ms']:.1f} ms"
            )

    print()
    columns = (
        ("event->znode", "event_to_znode_ms"),
        ("znode->publish", "znode_to_publish_ms"),
        ("publish->last", "publish_to_last_list_ms"),
        ("(c)-(a)", "znode_to_last_list_ms"),
        ("event->last", "event_to_last_list_ms"),
    )
    header = f"{'kind':<13} | " + " | ".join(f"{title:>15}" for title, _ in columns)
    print(header + "\n" + " " * 14 + "|" + "   p50 / p99 ms  |" * len(columns))
    print("-" * len(header))
    for name, figures in summaries.items():
        cells = [f"{figures[k]['p50_ms']:>6.1f} /{figures[k]['p99_ms']:>7.1f}" for _, k in columns]
        print(f"{name:<13} | " + " | ".join(f"{c:>15}" for c in cells))
    print()
    for name, (met, text) in verdicts.items():
        print(f"{name}: {text}: {'met' if met else 'NOT MET'}")
    print(f"CPU steal over the run: {meter.steal_share():.1%}", flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "benchmark": "convergence",
                "command": " ".join([Path(sys.executable).name, *sys.argv]),
                "parameters": vars(args),
                "machine": machine(),
                "cpu_steal_share": meter.steal_share(),
                "notes": (
                    "All times on this host's wall clock. (a): this script's ZooKeeper "
                    "data watch on the node fires; (b): the P:events message carrying the "
                    "change arrives on this script's subscription; (c): the latest "
                    "applied_at_ms over the 3 search servers' GET /cluster for the first "
                    "version without the server (drain: with it draining). "
                    "znode_to_leader_publish_ms: (a) to the event's published_at (the "
                    "leader's clock when it built the publish). p99 is nearest-rank. "
                    "Query load only during the drains."
                ),
                "targets": {
                    "probe_offline_c_minus_a_p99_ms_below": PROBE_TARGET_MS,
                    "crash_event_to_last_list_p99_ms_at_most": crash_target,
                    "drain_out_before_stop_and_zero_failed_queries": True,
                    "met": {name: met for name, (met, _) in verdicts.items()},
                },
                "skipped_servers": outcome["skipped"],
                **summaries,
                "wall_s": round(time.monotonic() - started, 1),
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {RESULTS}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
